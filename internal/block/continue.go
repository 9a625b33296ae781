package block

import (
	"github.com/softuvm/softuvm/internal/core"
	"github.com/softuvm/softuvm/policy"
)

// MINOR faults on a view's own file. A view registered over its own file
// for MINOR faults faults on a page its file holds but its page table
// does not map. One Continue then maps every such page of the block, so
// that a block written into the file as one folio (a prefetch, or a
// fault that brings the whole block) costs one round trip, where a view
// registered for write-protect faults would take 512 minor faults, and a
// move into it with installs 512 page allocations.

// serveContinue answers a MINOR fault of view o.FV on page p, resident
// in the view's own file: it maps p and every other page of the block
// the file holds for the view, or, on the host while an eviction policy
// watches the block's use by region, those of p's 64 KiB region; of a
// block watched by a sample, only the pages the view does not map.
// (Pages prefetched lazily, whose first touch must show, are only in
// ranges registered without MINOR faults.)
func (o *Mover) serveContinue(p int) {
	l := o.FV.Processor()
	pages := o.heldInOwnFile(l)
	if o.B.SampledOn(l) {
		// A sampled watch left most pages mapped, on each of which
		// Continue would fail (a call a page), and earlier watches'
		// samples, a page further on each, may still be unmapped: map
		// what the view's page table lacks. Mapping only the sample left
		// those to a MINOR fault each, and a block watched again at
		// every eviction (a working set inside one block) faulted page
		// by page: 16 times the faults and the bytes moved.
		if unmapped, ok := o.space().Unmapped(o, o.FV); ok {
			unmapped.Set(p)
			pages.And(&unmapped)
		}
	}
	if l == core.CPU && o.B.WatchRegions.Load() {
		region := policy.RegionOf(p)
		pages.And(&region)
	}
	o.continuePages(o.FV, pages, p)
}

// heldInOwnFile is the block's pages that view l maps its own file over
// and that file holds: those Continue may map there.
func (o *Mover) heldInOwnFile(l core.Device) core.PageMask {
	pages := o.B.Resident[l.Slot()]
	mapped := o.PagesMapping(l, l)
	pages.And(&mapped)
	return pages
}

// continuePages maps pages (held in the file view v maps over them) into
// v, the run holding lead first, and wakes their faulting threads. Pages
// with copies elsewhere (read duplication) are mapped write-protected.
func (o *Mover) continuePages(v View, pages core.PageMask, lead int) {
	protect := o.B.Duplicated()
	protect.And(&pages)
	pages.AndNot(&protect)
	for _, set := range [...]struct {
		pages core.PageMask
		wp    bool
	}{{pages, false}, {protect, true}} {
		for _, leadRun := range [...]bool{true, false} {
			for p, q := set.pages.NextRun(0); p >= 0; p, q = set.pages.NextRun(q) {
				if (p <= lead && lead < q) == leadRun {
					o.space().Continue(o, v, p, q, set.wp)
				}
			}
		}
	}
}

// SampledOn reports whether the last Watch of the block on p unmapped a
// sample (the MINOR fault's question).
func (b *Block) SampledOn(p core.Device) bool {
	return b.WatchSample.Load()&(1<<p.Slot()) != 0
}

// EndSampledWatch forgets that the block's watch on p was sampled. It
// is called at every arrival, mostly of blocks not sampled there, which
// it then leaves unwritten.
func (b *Block) EndSampledWatch(p core.Device) {
	if bit := uint64(1) << p.Slot(); b.WatchSample.Load()&bit != 0 {
		b.WatchSample.And(^bit)
	}
}
