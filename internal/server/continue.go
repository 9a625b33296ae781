package server

import (
	"errors"

	"github.com/softuvm/softuvm/devmem"
	"github.com/softuvm/softuvm/internal/block"
	"github.com/softuvm/softuvm/internal/core"
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

// Unmapped returns the block's pages that the process of view v does
// not map, from its page table (PAGEMAP_SCAN, as the use observer reads
// it), or false where it cannot be read.
func (sess *session) Unmapped(o *block.Mover, v block.View) (core.PageMask, bool) {
	var unmapped core.PageMask
	pid, w, ok := sess.watchOf(v.Processor())
	if !ok {
		return unmapped, false
	}
	_, pagemap, err := w.open(pid)
	if err != nil {
		return unmapped, false
	}
	mapped, err := mappedPages(pagemap, o.PageAddr(0), o.B.Pages)
	if err != nil {
		return unmapped, false
	}
	unmapped.FillRange(0, o.B.Pages)
	unmapped.AndNot(&mapped)
	return unmapped, true
}

// Continue maps pages [first, outer) into v with UFFDIO_CONTINUE,
// write-protected with wp. A page mapped already, or gone from the file,
// is left, and whoever waits on it woken: it faults again if it must.
func (sess *session) Continue(o *block.Mover, bv block.View, first, outer int, wp bool) {
	v := bv.(*view)
	var mode uffd.ContinueMode
	if wp {
		mode = uffd.ContinueWP
	}
	h := handlerOf(o)
	for p := first; p < outer; {
		addr := o.PageAddr(p)
		h.ioctlBegins()
		n, err := v.uffd.Continue(addr, uintptr(outer-p)*core.PageSize, mode)
		h.ioctlEnds()
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
			_ = v.uffd.Wake(o.PageAddr(p), core.PageSize)
			p++
		}
	}
}
