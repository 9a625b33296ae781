package server

import (
	"errors"
	"fmt"
	"time"

	"github.com/softuvm/softuvm/devmem"
	"github.com/softuvm/softuvm/internal/core"
	"github.com/softuvm/softuvm/internal/engine"
	"github.com/softuvm/softuvm/policy"
	"github.com/softuvm/softuvm/uffd"
)

// mover performs the kernel operations that change where pages of one
// block live, with the block's lock held. Every location (the host, each
// device) has a file, and may have a view (the client, a running device
// process) that maps it. Every move is a real copy between distinct
// physical pages, or a fresh zero-filled page:
//
//	nowhere -> L   UFFDIO_ZEROPAGE into L's view (allocating in L's file),
//	               or fallocate in L's file when L has no view
//	S -> L         write-protect the pages in S's view, so that writers
//	               wait; pread S's file into a staging buffer and
//	               UFFDIO_COPY into L's view (or copy file to file when L
//	               has no view); punch S's file; wake S's view
//
// Punching a file frees its pages and zaps every page-table entry that
// maps them, in every process: that is how a page leaves a location. A
// writer held by the write protection retries after the wake, faults, and
// brings the page back.
type mover struct {
	sess      *session
	r         *managedRange
	b         *block
	blockAddr uintptr // address of the block's page 0
	// fv is the view whose fault is being served (its handler keeps it
	// alive), nil on the control path.
	fv *view
	// h is the handler thread serving the fault, for its scratch
	// buffers; nil on the control path and for deferred faults.
	h       *handler
	runBuf  []run   // reused for runs; nil allocates
	holdBuf []*view // reused by holders
	// cause is why this mover moves pages: the thrashing detector
	// counts only moves a fault causes, and the eviction policy is told.
	// Zero for movers that move nothing of their own (remaps, audits).
	cause policy.Cause
	// runStarted is when the run being moved began, while tracing; the
	// trace's migration events take their time and duration from it.
	runStarted time.Time
	// prefetched counts the pages this mover brought speculatively, for
	// its fault's trace event.
	prefetched int
	// readAhead is the direction (+1, -1) in which the prefetch policy
	// asked for the next block to be read ahead of this fault (0: not).
	readAhead int
	// demand is the pages the fault being served asked for (not those
	// prefetched with them): the evidence of a refault (workingset.go).
	demand core.PageMask
}

// retryAgain is how long an ioctl refused with EAGAIN (an mremap in
// flight in the view's process) is retried before the operation fails.
const retryAgain = 2 * time.Second

// installKind selects the resolving ioctl of install.
type installKind int

const (
	installZero installKind = iota // UFFDIO_ZEROPAGE: a fresh zero page
	installCopy                    // UFFDIO_COPY: a copy of the source bytes
)

func kindName(k installKind) string {
	if k == installZero {
		return "zeropage"
	}
	return "copy"
}

// stagingPages sizes the buffer that carries pages from a source file to
// UFFDIO_COPY on the direct path: a copy engine chunk, small enough to
// stay in the CPU's cache between the read that fills it and the copy
// that drains it.
const stagingPages = engine.ChunkBytes / core.PageSize

// run is a maximal stretch of pages with the same source and the same
// way in.
type run struct {
	first, outer int
	src          core.Device
	populated    bool // false: the pages exist nowhere yet
	speculative  bool // brought by prefetch, not demanded, and left unmapped
	mapped       bool // installed through the target's view
}

// target says where a move puts pages: location dst's file, through view
// via for the pages in mapped (via maps dst's file over them), straight
// into the file for the others.
type target struct {
	dst    core.Device
	via    *view
	mapped core.PageMask
}

// chunkSpan cuts pages [first, outer) into the copy engine's chunks.
type chunkSpan struct{ first, outer, per, chunks int }

// pageSink is where transfer puts pages: a view (installed, mapped) or a
// file (unmapped).
type pageSink interface {
	put(first, outer int, data []byte) (core.PageMask, error)
}

type viewTarget struct {
	o *mover
	v *view
}

type fileTarget struct {
	o *mover
	f *devmem.File
}

func (o *mover) pageAddr(p int) uintptr { return o.blockAddr + uintptr(p)*core.PageSize }

func (o *mover) fileOff(p int) int64 { return o.r.fileOff + int64(o.pageAddr(p)-o.r.start) }

// again waits a little before an ioctl on view v refused with EAGAIN is
// retried. The kernel refuses while an mremap in v's process (a device
// changing a remote mapping, or a client moving memory) waits for its
// event to be read, so the event is read here: the view's other handlers
// may all be parked or busy. Faults read meanwhile are served on their
// own goroutines.
func (o *mover) again(v *view, since time.Time) bool {
	if time.Since(since) > retryAgain {
		return false
	}
	o.sess.drainEvents(v)
	time.Sleep(20 * time.Microsecond)
	return true
}

// viewOf returns location l's view for use by this mover: the faulting
// view as it is (whoever serves the fault keeps it alive), any other with
// its use lock held; release with doneWith.
func (o *mover) viewOf(l core.Device) *view {
	if o.fv != nil && o.fv.loc == l {
		return o.fv
	}
	return o.sess.viewRef(l)
}

func (o *mover) doneWith(v *view) {
	if v != nil && v != o.fv {
		v.release()
	}
}

// install maps pages [first, outer) into view v: fresh zero pages, or
// copies of src (PageSize bytes per page), write-protected with wp. They
// land in whatever file v maps there. A zero page already present
// (another thread resolved it) is left and woken. A copy finding its
// page present writes over it (overwritePresent says why). It returns
// the pages now present, installed or found, and those of them found
// and left as they were.
func (o *mover) install(v *view, kind installKind, first, outer int, src []byte, wp bool) (done, found core.PageMask, err error) {
	u := v.uffd
	started := time.Now()
	var mode uffd.CopyMode
	if wp {
		mode = uffd.CopyWP
	}
	for p := first; p < outer; {
		addr, length := o.pageAddr(p), uintptr(outer-p)*core.PageSize
		var n int64
		o.ioctlBegins()
		if kind == installZero {
			n, err = u.ZeroPage(addr, length, false)
		} else {
			n, err = u.Copy(addr, src[(p-first)*core.PageSize:(outer-first)*core.PageSize], mode)
		}
		o.ioctlEnds()
		got := int(max(n, 0) / core.PageSize)
		done.FillRange(p, p+got)
		p += got
		switch {
		case err == nil:
			if got == 0 { // the kernel made no progress without an error
				return done, found, fmt.Errorf("%w: %s %#x+%d made no progress", core.ErrInternal, kindName(kind), addr, length)
			}
		case errors.Is(err, uffd.ErrExist):
			// A page is already present. A zero page is left as it is;
			// a copy's bytes go over it. Then wake whoever faulted on
			// it, since this ioctl did not.
			written := false
			if kind == installCopy {
				page := src[(p-first)*core.PageSize : (p-first+1)*core.PageSize]
				var werr error
				if written, werr = o.overwritePresent(v, p, page); werr != nil {
					return done, found, werr
				}
			}
			_ = u.Wake(o.pageAddr(p), core.PageSize)
			done.Set(p)
			if !written {
				found.Set(p)
			}
			p++
		case errors.Is(err, uffd.ErrAgain) && got > 0:
			// Partial progress: the kernel stopped at a page that
			// exists (reported as EAGAIN once some pages are done).
			// The retry from there sees EEXIST and skips it.
		case errors.Is(err, uffd.ErrAgain):
			if !o.again(v, started) {
				return done, found, err
			}
		default:
			return done, found, err
		}
	}
	return done, found, nil
}

// overwritePresent writes page p's bytes into the file view v maps over
// p, where a copy into v found a page already present. Every install of
// data runs under the block's lock, into a location the residency table
// says lacks the page, so a page present there is stray, not newer data:
// the zeroed remainder of a large folio that a partial punch could not
// split, or a 4 KiB write into a hole of a huge-page file (the
// cloud-hypervisor pitfall). Leaving it would show the faulting thread
// zeros in place of the bytes the move carries, which are now nowhere
// else: the source was punched first. Where the view's mapping of p is
// not known (a remap in flight), nothing is written (written is false):
// the caller sees the page as found and puts the source back.
func (o *mover) overwritePresent(v *view, p int, page []byte) (written bool, err error) {
	m, known := o.mapsAt(v.loc, p)
	if !known {
		return false, nil
	}
	f, err := o.sess.file(m)
	if err != nil {
		return false, err
	}
	if _, err := f.WriteAt(page, o.fileOff(p)); err != nil {
		return false, fmt.Errorf("write over the stray page at %#x in %s: %w", o.pageAddr(p), f.Name(), err)
	}
	o.sess.srv.strayPresent.Add(1)
	o.sess.srv.logger.Printf("pid %d: stray page %#x: present in location %d's file, which the residency table says lacks it; the move wrote over it", o.sess.pid, o.pageAddr(p), m)
	return true, nil
}

// installFromFile copies pages [first, outer) from f (at the same file
// offsets) into view v through the copy engine's staging buffers.
// Measured on this kind of VM, pread plus UFFDIO_COPY beats the
// alternatives: UFFDIO_COPY straight from a mapping of f takes a slow
// path for every page the server has not mapped (and leaves the server's
// mapping for the punch to zap), and copy_file_range into the destination
// file plus UFFDIO_CONTINUE serializes on that file's inode lock.
func (o *mover) installFromFile(v *view, first, outer int, f *devmem.File, wp bool) (done, found core.PageMask, err error) {
	span := o.chunkSpan(first, outer)
	direct, done1 := o.staging()
	defer done1()
	_, err = o.sess.srv.copyEngine(v.loc).Run(&engine.CopyJob{
		Chunks: span.chunks, Bytes: int64(outer-first) * core.PageSize, Staging: true, Direct: direct, Buffers: o.sess.srv.staging,
		Produce: func(i int, buf []byte) error {
			p, q := span.pages(i)
			_, err := f.ReadAt(buf[:(q-p)*core.PageSize], o.fileOff(p))
			return err
		},
		Install: func(i int, buf []byte) error {
			p, q := span.pages(i)
			got, seen, err := o.install(v, installCopy, p, q, buf[:(q-p)*core.PageSize], wp)
			done.Or(&got)
			found.Or(&seen)
			return err
		},
	})
	return done, found, err
}

// staging returns a staging buffer, a slot of the server's staging area,
// and what to call when done with it: a fault handler keeps one for its
// life, the control path borrows one.
func (o *mover) staging() ([]byte, func()) {
	area := o.sess.srv.staging
	if o.h == nil {
		buf := area.Get()
		return buf, func() { area.Put(buf) }
	}
	if o.h.staging == nil { // taken on first use: most sessions never need it
		o.h.staging = area.Get()
	}
	return o.h.staging, func() {}
}

// runs splits want into runs by source and by the way in: speculative
// pages brought to the host of a range that tracks prefetch use (lazy)
// are left unmapped, so that their first touch shows. The run holding
// page lead comes first: the faulting thread waits on it.
func (o *mover) runs(want, speculative core.PageMask, t target, lazy bool, lead int) []run {
	out := o.runBuf[:0]
	b := o.b
	mapped := func(p int) bool { return t.via != nil && t.mapped.Test(p) && !(lazy && speculative.Test(p)) }
	for p := want.NextSet(0); p >= 0; {
		first := p
		src, populated := b.locationOfPage(p)
		spec := lazy && speculative.Test(p)
		m := mapped(p)
		for p++; p < b.pages && want.Test(p); p++ {
			s, pop := b.locationOfPage(p)
			if s != src || pop != populated || (lazy && speculative.Test(p)) != spec || mapped(p) != m {
				break
			}
		}
		out = append(out, run{first: first, outer: p, src: src, populated: populated, speculative: spec, mapped: m})
		if p >= b.pages {
			break
		}
		p = want.NextSet(p)
	}
	for i, rn := range out {
		if rn.first <= lead && lead < rn.outer && i > 0 {
			copy(out[1:i+1], out[:i])
			out[0] = rn
			break
		}
	}
	o.runBuf = out
	return out
}

// arrivalCause is why pages this mover brings arrive, as the eviction
// policy is told: the mover's cause, or advice (read duplication, a pin)
// where it set none.
func (o *mover) arrivalCause() policy.Cause {
	if o.cause == 0 {
		return policy.CauseAdvice
	}
	return o.cause
}

// moveTo brings demand and speculative pages to t.dst. Capacity for a
// device is reserved first, so that a full arena fails before anything
// moved.
func (o *mover) moveTo(t target, demand, speculative core.PageMask, lead int) error {
	moved, err := o.move(t, demand, speculative, lead)
	if t.dst == core.CPU && moved > 0 {
		keep := demand
		keep.Or(&speculative)
		o.overBudget(keep)
	}
	return err
}

// moveToUnmapped moves pages into dst's file only: eviction does, so that
// the pages' next user maps them on touch.
func (o *mover) moveToUnmapped(dst core.Device, pages core.PageMask) error {
	var none core.PageMask
	_, err := o.move(target{dst: dst}, pages, none, -1)
	return err
}

// ownTarget is dst with its own view, if it runs, over the pages it maps
// its file on: how the control path moves pages. Release with
// doneWith(t.via).
func (o *mover) ownTarget(dst core.Device) target {
	t := target{dst: dst, via: o.viewOf(dst)}
	if t.via != nil {
		t.mapped = o.pagesMapping(dst, dst)
	}
	return t
}

func (o *mover) move(t target, demand, speculative core.PageMask, lead int) (int64, error) {
	b := o.b
	dst := t.dst
	// A page with copies in several places (read duplication) becomes a
	// single copy before it moves: demanded ones keep their first copy,
	// speculative ones stay where they are.
	if dup := b.duplicated(); !dup.Empty() {
		speculative.AndNot(&dup)
		dd := demand
		dd.And(&dup)
		if !dd.Empty() {
			o.collapseAll(dd)
		}
	}
	// Demanded pages already on dst may only want mapping: they stay, as
	// the others this move brings, if it must give up pages of its own
	// block for room there (reserve).
	keep := demand
	keep.Or(&speculative)
	want := keep
	want.AndNot(&b.resident[dst.Slot()])
	need := int64(want.Count())
	if need == 0 {
		return 0, nil
	}
	charged := o.r.kind != core.KindDevice // device memory reserved its capacity at allocation
	var arena *devmem.Arena
	if dst != core.CPU && charged {
		arena = o.sess.srv.arenas[dst]
		err := o.reserve(dst, need, keep)
		if err != nil && !speculative.Empty() {
			// The prefetched pages do not fit (a whole block, say, on a
			// full device whose other blocks are all in use): the
			// demanded ones alone may, and a fault must not fail for
			// want of room for pages nobody asked for.
			speculative = core.PageMask{}
			want = demand
			want.AndNot(&b.resident[dst.Slot()])
			if need = int64(want.Count()); need == 0 {
				return 0, nil
			}
			err = o.reserve(dst, need, demand)
		}
		if err != nil {
			return 0, err
		}
		defer o.settled(dst) // after the runs are accounted, below
	}
	dstFile, err := o.sess.file(dst)
	lazy := dst == core.CPU && o.r.trackPrefetch
	var moved int64
	if err == nil {
		for _, rn := range o.runs(want, speculative, t, lazy, lead) {
			var done core.PageMask
			if o.sess.tracing() {
				o.runStarted = time.Now()
			}
			done, err = o.moveRun(rn, t, dstFile)
			o.account(rn, done, dst, speculative)
			moved += int64(done.Count())
			if err != nil {
				break
			}
		}
	}
	if arena != nil && moved < need {
		arena.Release(need - moved)
	}
	return moved, err
}

// moveRun moves one run to t.dst, without touching the block's
// bookkeeping.
func (o *mover) moveRun(rn run, t target, dstFile *devmem.File) (core.PageMask, error) {
	var done core.PageMask
	if o.wholeRun(rn) {
		touching := o.touching(rn, t)
		switch {
		case !touching && dstFile.Large():
			return o.moveWhole(rn, t, dstFile)
		case touching && dstFile.Large() && (o.continuesInto(t) || o.faultsInFromOwnFile(t)):
			// One folio written, then mapped in one UFFDIO_CONTINUE
			// (the host, continue.go) or by the kernel's own minor
			// faults (a device's own file).
			return o.moveWhole(rn, t, dstFile)
		case touching && rn.populated && o.mayBeLarge(rn.src):
			return o.moveWholeInstalled(rn, t)
		}
	}
	off, length := o.fileOff(rn.first), int64(rn.outer-rn.first)*core.PageSize
	if !rn.populated {
		if rn.mapped {
			done, _, err := o.install(t.via, installZero, rn.first, rn.outer, nil, false)
			return done, err
		}
		if err := dstFile.Allocate(off, length); err != nil {
			return done, err
		}
		done.FillRange(rn.first, rn.outer)
		return done, nil
	}
	srcFile, err := o.sess.file(rn.src)
	if err != nil {
		return done, err
	}
	if o.mayBeLarge(rn.src) {
		// Part of the block leaves: its copy there goes into 4 KiB
		// folios first (punchPages says why).
		if err := o.breakLarge(rn.src, srcFile, 0, 0); err != nil {
			return done, err
		}
	}
	holders := o.holders(rn.src, rn.first, rn.outer)
	defer o.doneWithAll(holders)
	addr, span := o.pageAddr(rn.first), uintptr(length)
	for _, v := range holders {
		if err := o.writeProtect(v, addr, span); err != nil {
			return done, err
		}
	}
	if rn.src == core.CPU {
		var all core.PageMask
		all.FillRange(rn.first, rn.outer)
		o.auditLeaving(rn, all)
	}
	var sink pageSink = fileTarget{o, dstFile}
	if rn.mapped {
		sink = viewTarget{o, t.via}
	}
	done, err = o.transfer(sink, t.dst, rn.first, rn.outer, rn.src, srcFile)
	o.released(rn.src, done)
	// Writers held by the protection retry now and fault the pages
	// back; pages that did not move are writable again.
	o.release(holders, addr, span, done.CountRange(rn.first, rn.outer) < rn.outer-rn.first)
	return done, err
}

// transfer moves pages [first, outer) from file src to dst through the
// copy engine, a chunk at a time: read the pages into a staging buffer
// (the producers), punch them from src (the releaser), then put them in
// dst (the consumer, this goroutine). The source goes before the
// destination because once the pages are in dst a thread there may write
// them (the install wakes the faulting one): a reader of the source copy
// must not see the old bytes after that write; it faults instead, and
// waits for the block. Pages that fail to arrive are written back to src.
func (o *mover) transfer(dst pageSink, to core.Device, first, outer int, from core.Device, src *devmem.File) (core.PageMask, error) {
	var done core.PageMask
	span := o.chunkSpan(first, outer)
	area := o.sess.srv.staging
	writeBack := func(x, y, p int, buf []byte) {
		if _, err := src.WriteAt(buf[(x-p)*core.PageSize:(y-p)*core.PageSize], o.fileOff(x)); err != nil {
			o.sess.srv.logger.Printf("put back %#x+%d after a failed migration: %v (the data is lost)", o.pageAddr(x), (y-x)*core.PageSize, err)
		}
	}
	direct, doneWithDirect := o.staging()
	defer doneWithDirect()
	_, err := o.sess.srv.copyEngine(to).Run(&engine.CopyJob{
		Chunks: span.chunks, Bytes: int64(outer-first) * core.PageSize, Staging: true, Direct: direct, Buffers: area,
		Produce: func(i int, buf []byte) error {
			p, q := span.pages(i)
			_, err := src.ReadAt(buf[:(q-p)*core.PageSize], o.fileOff(p))
			return err
		},
		Release: func(i int, buf []byte) error {
			p, q := span.pages(i)
			// From the punch until the install the pages are only in
			// buf: say so where a new server will look (staging.go).
			area.mark(buf, o.sess.id, o.fileOff(p), (q-p)*core.PageSize)
			err := o.punchPages(from, src, p, q)
			if err != nil {
				area.clear(buf)
			}
			o.sess.srv.afterPunch()
			return err
		},
		Install: func(i int, buf []byte) error {
			defer area.clear(buf)
			p, q := span.pages(i)
			got, err := dst.put(p, q, buf[:(q-p)*core.PageSize])
			done.Or(&got)
			if err != nil {
				var failed core.PageMask
				failed.FillRange(p, q)
				failed.AndNot(&got)
				for x, y := failed.NextRun(0); x >= 0; x, y = failed.NextRun(y) {
					writeBack(x, y, p, buf)
				}
			}
			return err
		},
		Restore: func(i int, buf []byte) {
			defer area.clear(buf)
			p, q := span.pages(i)
			writeBack(p, q, p, buf)
		},
	})
	return done, err
}

func (o *mover) chunkSpan(first, outer int) chunkSpan {
	per := engine.ChunkBytes / core.PageSize
	return chunkSpan{first: first, outer: outer, per: per, chunks: (outer - first + per - 1) / per}
}

// pages returns chunk i's pages.
func (c chunkSpan) pages(i int) (int, int) {
	p := c.first + i*c.per
	return p, min(c.outer, p+c.per)
}

func (t viewTarget) put(first, outer int, data []byte) (core.PageMask, error) {
	done, _, err := t.o.install(t.v, installCopy, first, outer, data, false)
	return done, err
}

func (t fileTarget) put(first, outer int, data []byte) (core.PageMask, error) {
	var done core.PageMask
	n, err := t.f.WriteAt(data, t.o.fileOff(first))
	done.FillRange(first, first+n/core.PageSize)
	return done, err
}

// released accounts for location l's copies of pages that transfer
// already punched.
func (o *mover) released(l core.Device, pages core.PageMask) {
	if l != core.CPU && o.r.kind != core.KindDevice {
		o.sess.srv.arenas[l].Release(int64(pages.Count()))
	}
}

// drop frees location l's copies of pages (their data lives elsewhere
// now): punching l's file zaps every page-table entry that maps them, in
// every process.
func (o *mover) drop(l core.Device, pages core.PageMask) {
	f, err := o.sess.file(l)
	if err != nil {
		return
	}
	for p, q := pages.NextRun(0); p >= 0; p, q = pages.NextRun(q) {
		if perr := o.punchPages(l, f, p, q); perr != nil {
			o.sess.srv.logger.Printf("free %v pages %#x+%d: %v", l, o.fileOff(p), (q-p)*core.PageSize, perr)
		}
	}
	o.released(l, pages)
}

// dropCopies frees location l's copies of pages, which it holds, and
// forgets them there: in the residency, the host's page count and the
// eviction policies. Read duplication collapsing to one copy and a
// discard both come here.
func (o *mover) dropCopies(l core.Device, pages core.PageMask) {
	b := o.b
	srv := o.sess.srv
	o.drop(l, pages)
	b.resident[l.Slot()].AndNot(&pages)
	srv.departed(b, l, pages)
	if l == core.CPU {
		srv.hostPages.Add(-int64(pages.Count()))
	}
}

// releaseWhole lets go of holders once a whole move of the block is
// over; stayed says that some of its pages did not leave their file.
// Where they all left, the punch left a write-protect marker in each
// holder's page table where a protected page was, and a marker outlives
// the page. Were a page to come back into that file by a write
// (moveWhole) and be mapped by the kernel's minor fault, the holder's
// next write would take a write-protect fault for it, one round trip
// per page, so the markers are cleared (which wakes the writers, whose
// retry faults as missing) except where keepsMarkers.
func (o *mover) releaseWhole(holders []*view, addr, span uintptr, stayed bool) {
	for _, v := range holders {
		if stayed || !o.keepsMarkers(v) {
			_ = v.uffd.WriteProtect(addr, span, false, false)
		} else {
			_ = v.uffd.Wake(addr, span)
		}
	}
}

// keepsMarkers reports whether write-protect markers are left in view v
// (releaseWhole): where UFFDIO_CONTINUE maps what comes back into the
// view (it maps over a marker; clearing the host view's cost a
// whole-block prefetch to a device a tenth of its rate), and the host
// view's under the launch coherence model, where its protection is its
// dirty tracking.
func (o *mover) keepsMarkers(v *view) bool {
	return v.loc == core.CPU && o.sess.launch != nil || o.viewContinues(v)
}

// release lets the writers that holders held go: with unprotect (some
// pages stayed) their protection is lifted, else they are woken to fault
// again.
func (o *mover) release(holders []*view, addr, span uintptr, unprotect bool) {
	for _, v := range holders {
		if unprotect {
			_ = v.uffd.WriteProtect(addr, span, false, false)
		} else {
			_ = v.uffd.Wake(addr, span)
		}
	}
}

// writeProtect holds a view's writers still on [addr, addr+length) while
// the pages are copied away.
func (o *mover) writeProtect(v *view, addr, length uintptr) error {
	started := time.Now()
	for {
		err := v.uffd.WriteProtect(addr, length, true, true)
		if err == nil || errors.Is(err, uffd.ErrProcessGone) {
			return nil // a process that is gone writes nothing
		}
		if !errors.Is(err, uffd.ErrAgain) || !o.again(v, started) {
			return fmt.Errorf("write-protect %#x+%d in %v before migration: %w", addr, length, v.loc, err)
		}
	}
}

// account records that the pages done of run rn now live at dst.
func (o *mover) account(rn run, done core.PageMask, dst core.Device, speculative core.PageMask) {
	n := done.Count()
	if n == 0 {
		return
	}
	b := o.b
	srv := o.sess.srv
	for l := range b.resident {
		b.resident[l].AndNot(&done)
	}
	b.resident[dst.Slot()].Or(&done)
	if rn.populated {
		srv.departed(b, rn.src, done)
	}
	cause := o.arrivalCause()
	o.arrived(dst, done, cause)
	if dst == core.CPU {
		srv.hostGained(int64(n))
	} else if rn.populated && rn.src == core.CPU {
		srv.hostPages.Add(-int64(n))
	}
	if o.sess.tracing() {
		o.traceRun(rn, done, dst, cause)
	}
	if !rn.populated {
		o.r.stats.Populated[dst.Slot()].Add(uint64(n))
	} else {
		o.r.stats.AddMigrated(rn.src, dst, cause, n)
		if o.cause == policy.CauseFault {
			o.recordMigration(done, srv.nowMicros())
		}
	}
	spec := done
	spec.And(&speculative)
	if k := spec.Count(); k > 0 {
		o.r.stats.Prefetched.Add(uint64(k))
		o.prefetched += k
		if rn.speculative && dst == core.CPU {
			b.prefetchPending.Or(&spec)
		}
	}
	o.residencyChanged()
}

// residencyChanged asks the remapper to look at the block when device
// mappings there depend on where pages live.
func (o *mover) residencyChanged() {
	if o.b.remoteMappable(o.sess.srv.thrashing, o.sess.srv.nowMicros()) {
		o.sess.enqueueRemap(o.r, o.blockIndex())
	}
}

// remoteMappable reports whether a device may map another location's
// file over some page of the block: it does, or advice or a pin may make
// it. Blocks without are left alone by the remapper.
func (b *block) remoteMappable(th policy.Thrashing, now int64) bool {
	return b.maps != nil || (b.advice != nil && b.advice.remote) || (b.thrash != nil && th != nil && th.PinnedUntil(b.thrash) > clock(now))
}

// prefetch moves [addr, addr+length) to dst, as cuMemPrefetchAsync does,
// synchronously. Pages never touched are populated (zero-filled) at dst;
// read-mostly pages get a copy at dst and keep the others. Devices that
// map the pages follow them before it returns.
func (sess *session) prefetch(addr, length uintptr, dst core.Device) error {
	if err := sess.srv.checkDevice(dst, "prefetch"); err != nil {
		return err
	}
	r, err := sess.findRange(addr, length, "prefetch")
	if err != nil {
		return err
	}
	if r.kind != core.KindManaged {
		return fmt.Errorf("%w: prefetch %#x: prefetch applies to managed memory, and this is %s", core.ErrInvalidValue, addr, r.kind)
	}
	dl := core.Device(dst)
	// Blocks move in parallel, as many at once as the calibration found
	// worth it (each block's own move may use the engine's pipeline),
	// unless the destination must evict to take them: eviction takes
	// whole blocks whose locks it can get, and the other movers would
	// hold the very blocks it needs.
	movers := sess.srv.copyCalibration().BlockMovers
	if !sess.srv.roomFor(dl, int64(length)) {
		movers = 1
	}
	err = r.eachBlockParallel(addr, length, movers, sess.srv.nodeOf(dl), func(o *mover, pages core.PageMask) error {
		o.cause = policy.CausePrefetch
		for p := pages.NextSet(0); p >= 0; p = pages.NextSet(p + 1) {
			o.b.lastPrefetch[p] = core.PageProcessorOf(dl)
		}
		t := o.ownTarget(dl)
		defer o.doneWith(t.via)
		var err error
		if adv := o.b.advice; adv != nil {
			dup := pages
			dup.And(&adv.readMostly)
			dup.AndNot(&o.b.resident[dl.Slot()])
			var populated core.PageMask
			for l := range o.b.resident {
				populated.Or(&o.b.resident[l])
			}
			dup.And(&populated)
			if !dup.Empty() {
				err = o.duplicate(t, dup)
				pages.AndNot(&dup)
			}
		}
		if err == nil {
			var none core.PageMask
			err = o.moveTo(t, pages, none, -1)
		}
		if err != nil {
			return fmt.Errorf("prefetch %#x+%d to %v: %w", addr, length, dst, err)
		}
		return nil
	})
	if err != nil {
		return err
	}
	return sess.remapRange(r, addr, length)
}

// roomFor reports whether location l can take n more bytes without
// evicting anything: a device with that much free capacity, or the host
// with no budget or that much left under it.
func (s *Server) roomFor(l core.Device, n int64) bool {
	if l == core.CPU {
		return s.cfg.HostBudget <= 0 || s.hostPages.Load()*core.PageSize+n <= s.cfg.HostBudget
	}
	return s.arenas[l].FreeBytes() >= n
}

// checkDevice accepts CPU and the configured devices.
func (s *Server) checkDevice(d core.Device, what string) error {
	if d == core.CPU || (d >= 0 && int(d) < len(s.arenas)) {
		return nil
	}
	switch len(s.arenas) {
	case 0:
		return fmt.Errorf("%w: %s %v: this server has no devices, only the CPU (%d)", core.ErrInvalidDevice, what, d, core.CPU)
	case 1:
		return fmt.Errorf("%w: %s %v: this server has one device, 0 (or %d for the CPU)", core.ErrInvalidDevice, what, d, core.CPU)
	}
	return fmt.Errorf("%w: %s %v: this server has devices 0 to %d (or %d for the CPU)", core.ErrInvalidDevice, what, d, len(s.arenas)-1, core.CPU)
}
