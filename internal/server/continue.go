package server

import (
	"errors"

	"github.com/softuvm/softuvm/devmem"
	"github.com/softuvm/softuvm/internal/core"
	"github.com/softuvm/softuvm/policy"
	"github.com/softuvm/softuvm/uffd"
)

// MINOR faults on a view's own file.
//
// A view registered over its own file for MINOR faults faults to the
// server on a page its file holds but its page table does not map. One
// UFFDIO_CONTINUE then maps every such page of the block, so that a block
// written into the file as one folio (moveWhole: a prefetch, or a fault
// that brings the whole block) costs one round trip, where a view
// registered for write-protect faults would take 512 minor faults (the
// kernel does no fault-around there, about 1 us each here against 0.45
// us a page for UFFDIO_CONTINUE), and a move into it with UFFDIO_COPY
// 512 page allocations. The host view registers so where the host file
// takes large folios (hostViewMode); a device's view, over its own file,
// where its arena does (deviceMinor, sent in the layout when the device
// attaches).

// continuesInto reports whether pages written into t's destination file
// are mapped into its view with UFFDIO_CONTINUE: the view maps its own
// file there and registers MINOR faults over it (viewContinues).
func (o *mover) continuesInto(t target) bool {
	return t.via != nil && t.via.loc == t.dst && o.viewContinues(t.via)
}

// viewContinues reports whether view v registers MINOR faults over its
// own file in the mover's range.
func (o *mover) viewContinues(v *view) bool {
	if v.loc == core.CPU {
		return o.hostContinues()
	}
	return v.minorOwn
}

// hostContinues reports whether the host view maps what its file takes
// in the mover's range with UFFDIO_CONTINUE: it registers MINOR faults
// there (not in a range that tracks prefetch use, hostViewMode).
func (o *mover) hostContinues() bool {
	return !o.r.trackPrefetch && o.sess.hostMinor()
}

// hostMinor reports whether the host view registers MINOR faults: under
// the fault coherence model (the launch model's WP_ASYNC tracking is
// left as it is), where the host file takes large folios and the kernel
// grants MINOR faults on shared memory.
func (sess *session) hostMinor() bool {
	v := sess.client()
	return v != nil && sess.host != nil && sess.minorOver(sess.host, v.uffd)
}

// minorOver reports whether a view whose userfaultfd is u registers
// MINOR faults over its own file f: under the fault coherence model,
// where f takes large folios and u was granted MINOR faults on shared
// memory.
func (sess *session) minorOver(f *devmem.File, u *uffd.FD) bool {
	return sess.launch == nil && f.Large() && u.Features()&uffd.FeatureMinorShmem != 0
}

// deviceMinor reports whether device l's process, whose userfaultfd is
// u, registers its mappings of its own file for MINOR faults, as the
// host view does (minorOver). Every range is registered so (a device audits no prefetch use by its
// mappings). A server that adopts the process after a restart computes
// the same answer from the same files; were it to differ, nothing breaks:
// a MINOR fault is served as one whatever the view (decideFault), and
// UFFDIO_CONTINUE into a range registered without them fails page by
// page into a wake (continueRun), after which the kernel maps the page.
func (sess *session) deviceMinor(l core.Device, u *uffd.FD) bool {
	f, err := sess.file(l)
	return err == nil && sess.minorOver(f, u)
}

// hostViewMode is how the host view registers a new range. A range that
// tracks prefetch use is left without MINOR faults: its pages prefetched
// to the host are left unmapped for the kernel's minor fault to map, and
// a round trip to the server for each would cost what the prefetch saved.
func (sess *session) hostViewMode(trackPrefetch bool) uffd.RegisterMode {
	if !trackPrefetch && sess.hostMinor() {
		return core.HostViewMode | uffd.RegisterMinor
	}
	return core.HostViewMode
}

// serveContinue answers a MINOR fault of view o.fv on page p, resident
// in the view's own file: it maps p and every other page of the block
// the file holds for the view, or, on the host while an eviction policy
// watches the block's use by region (watch.go), those of p's 64 KiB
// region; of a block watched by a sample, only the pages the view does
// not map. (Pages prefetched lazily, whose first touch must show, are
// only in ranges registered without MINOR faults.)
func (o *mover) serveContinue(p int) error {
	pages := o.heldInOwnFile(o.fv.loc)
	if o.b.sampledOn(o.fv.loc) {
		// A sampled watch left most pages mapped, on each of which
		// UFFDIO_CONTINUE would fail (a call a page), and earlier
		// watches' samples, a page further on each, may still be
		// unmapped: map what the view's page table lacks. Mapping only
		// the sample left those to a MINOR fault each, and a block
		// watched again at every eviction (a working set inside one
		// block) faulted page by page: 16 times the faults and the
		// bytes moved (gzip in TestRunRealPrograms).
		if unmapped, ok := o.unmappedInView(); ok {
			unmapped.Set(p)
			pages.And(&unmapped)
		}
	}
	if o.fv.loc == core.CPU && o.b.watchRegions.Load() {
		region := policy.RegionOf(p)
		pages.And(&region)
	}
	o.continuePages(o.fv, pages, p)
	return nil
}

// unmappedInView returns the block's pages that the process of view
// o.fv does not map, from its page table (PAGEMAP_SCAN, as the use
// observer reads it), or false where it cannot be read.
func (o *mover) unmappedInView() (core.PageMask, bool) {
	var unmapped core.PageMask
	pid, w, ok := o.sess.watchOf(o.fv.loc)
	if !ok {
		return unmapped, false
	}
	_, pagemap, err := w.open(pid)
	if err != nil {
		return unmapped, false
	}
	mapped, err := mappedPages(pagemap, o.pageAddr(0), o.b.pages)
	if err != nil {
		return unmapped, false
	}
	unmapped.FillRange(0, o.b.pages)
	unmapped.AndNot(&mapped)
	return unmapped, true
}

// heldInOwnFile is the block's pages that view l maps its own file over
// and that file holds: those UFFDIO_CONTINUE may map there.
func (o *mover) heldInOwnFile(l core.Device) core.PageMask {
	pages := o.b.resident[l.Slot()]
	mapped := o.pagesMapping(l, l)
	pages.And(&mapped)
	return pages
}

// continuePages maps pages (held in the file view v maps over them) into
// v, the run holding lead first, and wakes their faulting threads. Pages
// with copies elsewhere (read duplication) are mapped write-protected. A
// page mapped already is skipped; a page the file lacks (it left, or was
// lost) is left unmapped: its thread is woken, faults as missing and is
// served that way.
func (o *mover) continuePages(v *view, pages core.PageMask, lead int) {
	protect := o.b.duplicated()
	protect.And(&pages)
	pages.AndNot(&protect)
	for _, set := range [...]struct {
		pages core.PageMask
		mode  uffd.ContinueMode
	}{{pages, 0}, {protect, uffd.ContinueWP}} {
		for _, leadRun := range [...]bool{true, false} {
			for p, q := set.pages.NextRun(0); p >= 0; p, q = set.pages.NextRun(q) {
				if (p <= lead && lead < q) == leadRun {
					o.continueRun(v, p, q, set.mode)
				}
			}
		}
	}
}

// continueRun maps pages [first, outer) into v with UFFDIO_CONTINUE.
func (o *mover) continueRun(v *view, first, outer int, mode uffd.ContinueMode) {
	for p := first; p < outer; {
		addr := o.pageAddr(p)
		o.ioctlBegins()
		n, err := v.uffd.Continue(addr, uintptr(outer-p)*core.PageSize, mode)
		o.ioctlEnds()
		p += int(max(n, 0) / core.PageSize)
		switch {
		case err == nil:
			if n <= 0 {
				return // no progress without an error: leave the rest to their faults
			}
		case errors.Is(err, uffd.ErrAgain) && n > 0:
			// Stopped at a mapped page: the retry skips it (EEXIST).
		default:
			// Mapped already (EEXIST), gone from the file (EFAULT), or
			// an mremap in flight (EAGAIN): wake whoever waits on this
			// page, which faults again if it must, and go on.
			_ = v.uffd.Wake(o.pageAddr(p), core.PageSize)
			p++
		}
	}
}
