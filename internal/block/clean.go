package block

import (
	"github.com/softuvm/softuvm/internal/core"
	"github.com/softuvm/softuvm/policy"
)

// Clean eviction (policy.CleanCopying). A page evicted from the host and
// read back would otherwise cross twice per round: a copy to the device
// when it leaves, a copy back when it is read. When the host reads a page
// back that it never wrote, the engine duplicates it instead (read
// duplication's machinery, readdup.go): the device keeps its copy and
// every mapping of both is write-protected. The host's next eviction of
// it then drops the host's copy and copies nothing (evictPages), and the
// arena never stopped holding the page. A host write to it is a
// write-protect fault that keeps the host's copy only (serveWP) and marks
// the page written (Block.HostWrote): a page written once migrates from
// then on, so that a program that updates what it reads pays the extra
// fault once per page, not once per round.
//
// Only where nothing else decides a page's copies: no advice on its block
// (read-mostly, preferred location and accessed-by have their own
// rules), the fault coherence model (the launch model has its own clean
// copies), managed memory whose prefetches are not audited, and a host
// budget, without which host pages never leave.

// cleanCopies reports whether clean eviction applies to the host's
// faults on the mover's block at all.
func (o *Mover) cleanCopies() bool {
	e := o.eng()
	return e.pol.CleanCopies && e.cfg.HostBudget > 0 && o.FV != nil && o.FV.Processor() == core.CPU && o.B.Advice == nil &&
		!o.space().LaunchModel() && o.R.Kind == core.KindManaged && !o.R.TrackPrefetch
}

// cleanPages is the pages of pages that may come to the host as clean
// copies: on a device only (onDevices: the block's pages resident
// anywhere but the host), never written by the host.
func (o *Mover) cleanPages(pages, onDevices core.PageMask) core.PageMask {
	b := o.B
	pages.And(&onDevices)
	pages.AndNot(&b.HostWrote)
	pages.AndNot(&b.Resident[core.CPU.Slot()])
	return pages
}

// cleanCopy reports whether a host fault on page p that reads may be
// served by a clean copy. Its caller (decideFault) has checked that the
// fault is a read and the page is populated, so a page not on the host
// is on a device.
func (o *Mover) cleanCopy(p int) bool {
	b := o.B
	if !o.cleanCopies() || b.HostWrote.Test(p) || b.Resident[core.CPU.Slot()].Test(p) {
		return false
	}
	m, known := o.MapsAt(core.CPU, p)
	return known && m == core.CPU
}

// serveCleanCopies serves a host fault on page lead where clean eviction
// applies: the prefetched pages that qualify (cleanPages) are duplicated
// onto the host, the others migrate as they would have, and the faulted
// page is duplicated if dupFaulted (a read, cleanCopy), else migrated (a
// write). Then the host budget is held, as after any move to the host.
func (o *Mover) serveCleanCopies(t Target, faulted, extra core.PageMask, lead int, dupFaulted bool) error {
	o.Cause = policy.CauseFault
	onDevices := o.B.Resident.Elsewhere(core.CPU)
	dup := o.cleanPages(extra, onDevices)
	moving := faulted
	moving.Or(&extra)
	if (!dupFaulted && dup.Empty()) || o.eng().mech.WholeMove(o.B.Pages, onDevices, moving) {
		// Nothing to keep a copy of; or a sweep: the block moves whole
		// (one folio where the files take large folios), and a program
		// sweeping it likely writes what it reads, so copies kept would
		// cost a write-protect fault per page and break the folio.
		return o.MoveTo(t, faulted, extra, lead)
	}
	rest := extra
	rest.AndNot(&dup)
	var err error
	if dupFaulted {
		dup.Or(&faulted)
		if err = o.duplicate(t, dup); err == nil && !rest.Empty() {
			var none core.PageMask
			_, err = o.move(t, none, rest, -1)
		}
	} else if _, err = o.move(t, faulted, rest, lead); err == nil {
		err = o.duplicate(t, dup)
	}
	keep := faulted
	keep.Or(&extra)
	o.overBudget(keep)
	return err
}
