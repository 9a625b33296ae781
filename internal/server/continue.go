package server

import (
	"errors"

	"github.com/softuvm/softuvm/internal/core"
	"github.com/softuvm/softuvm/uffd"
)

// MINOR faults on a view's own file.
//
// A view registered over its own file for MINOR faults (the host view,
// where the host file takes large folios: hostViewMode) faults to the
// server on a page its file holds but its page table does not map. One
// UFFDIO_CONTINUE then maps every such page of the block, so that a block
// written into the file as one folio (moveWhole: a prefetch, or a fault
// that brings the whole block) costs one round trip, where a view
// registered for write-protect faults would take 512 minor faults (the
// kernel does no fault-around there), and a move into it with
// UFFDIO_COPY 512 page allocations.

// continuableView reports whether view v maps its own file and registers
// MINOR faults over it in the mover's range: pages written into that file
// are mapped with UFFDIO_CONTINUE.
func (o *mover) continuableView(v *view) bool {
	return v != nil && v.loc == core.CPU && !o.r.trackPrefetch && v.sess.hostMinor()
}

// hostMinor reports whether the host view registers MINOR faults: under
// the fault coherence model (the launch model's WP_ASYNC tracking is
// left as it is), where the host file takes large folios and the kernel
// grants MINOR faults on shared memory.
func (sess *session) hostMinor() bool {
	v := sess.client()
	return v != nil && sess.launch == nil && sess.host != nil && sess.host.Large() &&
		v.uffd.Features()&uffd.FeatureMinorShmem != 0
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
// the file holds for the view, but those prefetched lazily, whose first
// touch must show (pagemap.go).
func (o *mover) serveContinue(p int) error {
	l := o.fv.loc
	pages := o.b.resident[l.Slot()]
	mapped := o.pagesMapping(l, l)
	pages.And(&mapped)
	pages.AndNot(&o.b.prefetchPending)
	pages.Set(p)
	o.continuePages(o.fv, pages, p)
	return nil
}

// continuePages maps pages (held in the file view v maps over them) into
// v, the run holding lead first, and wakes their faulting threads. Pages
// with copies elsewhere (read duplication) are mapped write-protected. A
// page mapped already is skipped; a page the file lacks (it left, or was
// lost) is left unmapped: its thread is woken, faults as missing and is
// served that way.
func (o *mover) continuePages(v *view, pages core.PageMask, lead int) {
	dup := o.b.duplicated()
	var protect core.PageMask
	protect.Or(&pages)
	protect.And(&dup)
	pages.AndNot(&protect)
	first := func(set core.PageMask) (int, int) {
		if set.Test(lead) {
			p := lead
			for p > 0 && set.Test(p-1) {
				p--
			}
			q := lead + 1
			for q < o.b.pages && set.Test(q) {
				q++
			}
			return p, q
		}
		return -1, -1
	}
	for _, set := range []struct {
		pages core.PageMask
		mode  uffd.ContinueMode
	}{{pages, 0}, {protect, uffd.ContinueWP}} {
		todo := set.pages
		if p, q := first(todo); p >= 0 {
			o.continueRun(v, p, q, set.mode)
			var r core.PageMask
			r.FillRange(p, q)
			todo.AndNot(&r)
		}
		for p, q := todo.NextRun(0); p >= 0; p, q = todo.NextRun(q) {
			o.continueRun(v, p, q, set.mode)
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
