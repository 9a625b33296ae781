package uvm

import (
	"errors"
	"fmt"
	"time"

	"github.com/softuvm/softuvm/devmem"
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
	blockAddr uintptr  // address of the block's page 0
	h         *handler // the handler thread, nil on the control path
	runBuf    []run    // reused for runs; nil allocates
}

func (o *mover) pageAddr(p int) uintptr { return o.blockAddr + uintptr(p)*PageSize }

func (o *mover) fileOff(p int) int64 { return o.r.fileOff + int64(o.pageAddr(p)-o.r.start) }

// retryAgain is how long an ioctl refused with EAGAIN (an mremap in
// flight in the client) is retried before the operation fails.
const retryAgain = 2 * time.Second

// again waits a little before an ioctl refused with EAGAIN is retried.
// The event that causes it is read by another handler of the view; with a
// single handler thread nobody reads it and the retry times out.
func (o *mover) again(since time.Time) bool {
	if time.Since(since) > retryAgain {
		return false
	}
	time.Sleep(50 * time.Microsecond)
	return true
}

// viewOf returns location l's view for use by this mover: the handler's
// own view as it is (it lives while the handler runs), any other with its
// use lock held; release with doneWith.
func (o *mover) viewOf(l location) *view {
	if o.h != nil && o.h.view.loc == l {
		return o.h.view
	}
	return o.sess.viewRef(l)
}

func (o *mover) doneWith(v *view) {
	if v != nil && (o.h == nil || v != o.h.view) {
		v.release()
	}
}

// installKind selects the resolving ioctl of install.
type installKind int

const (
	installZero installKind = iota // UFFDIO_ZEROPAGE: a fresh zero page
	installCopy                    // UFFDIO_COPY: a copy of the source bytes
)

// install maps pages [first, outer) into view v: fresh zero pages, or
// copies of src (PageSize bytes per page). Pages already mapped (another
// thread resolved them) are skipped and woken. It returns the pages now
// present, installed or found.
func (o *mover) install(v *view, kind installKind, first, outer int, src []byte) (PageMask, error) {
	var done PageMask
	u := v.uffd
	started := time.Now()
	for p := first; p < outer; {
		addr, length := o.pageAddr(p), uintptr(outer-p)*PageSize
		var n int64
		var err error
		if kind == installZero {
			n, err = u.ZeroPage(addr, length, false)
		} else {
			n, err = u.Copy(addr, src[(p-first)*PageSize:(outer-first)*PageSize], 0)
		}
		got := int(max(n, 0) / PageSize)
		done.FillRange(p, p+got)
		p += got
		switch {
		case err == nil:
			if got == 0 { // the kernel made no progress without an error
				return done, fmt.Errorf("%w: %s %#x+%d made no progress", ErrInternal, kindName(kind), addr, length)
			}
		case errors.Is(err, uffd.ErrExist):
			// A page is already mapped: leave it, and wake whoever
			// faulted on it, since this ioctl did not.
			_ = u.Wake(o.pageAddr(p), PageSize)
			done.Set(p)
			p++
		case errors.Is(err, uffd.ErrAgain) && got > 0:
			// Partial progress: the kernel stopped at a page that
			// exists (reported as EAGAIN once some pages are done).
			// The retry from there sees EEXIST and skips it.
		case errors.Is(err, uffd.ErrAgain):
			if !o.again(started) {
				return done, err
			}
		default:
			return done, err
		}
	}
	return done, nil
}

func kindName(k installKind) string {
	if k == installZero {
		return "zeropage"
	}
	return "copy"
}

// stagingPages sizes the buffer that carries pages from a source file to
// UFFDIO_COPY: small enough to stay in the CPU's cache between the read
// that fills it and the copy that drains it.
const stagingPages = 64

// installFromFile copies pages [first, outer) from f (at the same file
// offsets) into view v through a staging buffer. Measured on this kind of
// VM, pread plus UFFDIO_COPY beats the alternatives: UFFDIO_COPY straight
// from a mapping of f takes a slow path for every page the server has not
// mapped (and leaves the server's mapping for the punch to zap), and
// copy_file_range into the destination file plus UFFDIO_CONTINUE
// serializes on that file's inode lock.
func (o *mover) installFromFile(v *view, first, outer int, f *devmem.File) (PageMask, error) {
	var done PageMask
	buf := o.staging()
	for p := first; p < outer; {
		q := min(outer, p+stagingPages)
		n := (q - p) * PageSize
		if _, err := f.ReadAt(buf[:n], o.fileOff(p)); err != nil {
			return done, err
		}
		got, err := o.install(v, installCopy, p, q, buf[:n])
		done.Or(&got)
		if err != nil {
			return done, err
		}
		p = q
	}
	return done, nil
}

// staging returns the calling thread's staging buffer.
func (o *mover) staging() []byte {
	if o.h == nil {
		return make([]byte, stagingPages*PageSize)
	}
	if o.h.staging == nil { // allocated on first use: most sessions never need it
		o.h.staging = make([]byte, stagingPages*PageSize)
	}
	return o.h.staging
}

// serveFault resolves a fault by location loc's view on page p, bringing
// prefetched pages along.
func (o *mover) serveFault(loc location, p int, kind faultKind) error {
	b := o.b
	v := o.h.view
	if kind == faultWP {
		if b.resident[loc].Test(p) {
			// A migration protected the page and did not take it:
			// give write access back (this also wakes the writer).
			if err := v.uffd.WriteProtect(o.pageAddr(p), PageSize, false, false); err != nil {
				o.h.wake(o.pageAddr(p), PageSize)
			}
			return nil
		}
		// The page left while the writer waited; its retry faults as
		// missing and brings it back.
		o.h.wake(o.pageAddr(p), PageSize)
		return nil
	}
	if b.resident[loc].Test(p) {
		// Believed here but the view's file has no page: either a race
		// with another handler (the page exists now: just wake) or the
		// process punched it (MADV_REMOVE: it reads as zeros again).
		_, err := o.install(v, installZero, p, p+1, nil)
		return err
	}
	var faulted PageMask
	faulted.Set(p)
	ctx := &o.h.prefetchCtx
	*ctx = PrefetchContext{Pages: b.pages, Faulted: faulted, ResidentOnDest: b.resident[loc], Populated: b.populated()}
	extra := o.r.prefetch.Expand(ctx)
	extra.TrimTo(b.pages)
	extra.AndNot(&b.resident[loc])
	extra.Clear(p)
	return o.moveTo(loc, faulted, extra, p)
}

// failFault makes sure a thread whose fault could not be served does not
// wait forever: its page is poisoned, so the access raises SIGBUS.
func (o *mover) failFault(addr uintptr, err error) {
	if errors.Is(err, uffd.ErrProcessGone) || errors.Is(err, uffd.ErrNoEntry) {
		return // the process is exiting or unmapped the range: nobody waits
	}
	v := o.h.view
	srv := o.sess.srv
	if _, perr := v.uffd.Poison(addr, PageSize, false); perr == nil {
		srv.poisoned.Add(1)
		srv.logger.Printf("pid %d: fault at %#x could not be served (%v); page poisoned (SIGBUS)", v.pid, addr, err)
		return
	}
	o.h.wake(addr, PageSize)
	srv.logger.Printf("pid %d: fault at %#x could not be served: %v", v.pid, addr, err)
}

// run is a maximal stretch of pages with the same source.
type run struct {
	first, outer int
	src          location
	populated    bool // false: the pages exist nowhere yet
	speculative  bool // brought by prefetch, not demanded
}

// runs splits want into runs by source, and by demand when lazy (tracking
// prefetch use) so that speculative pages can be installed unmapped. The
// run holding page lead comes first: the faulting thread waits on it.
func (o *mover) runs(want, speculative PageMask, lazy bool, lead int) []run {
	out := o.runBuf[:0]
	b := o.b
	for p := want.NextSet(0); p >= 0; {
		first := p
		src, populated := b.locationOfPage(p)
		spec := lazy && speculative.Test(p)
		for p++; p < b.pages && want.Test(p); p++ {
			s, pop := b.locationOfPage(p)
			if s != src || pop != populated || (lazy && speculative.Test(p)) != spec {
				break
			}
		}
		out = append(out, run{first: first, outer: p, src: src, populated: populated, speculative: spec})
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
	return out
}

// moveTo brings demand and speculative pages to location dst. They are
// mapped into dst's view if it has one; but speculative pages brought to
// the host of a range that tracks prefetch use go into the host file
// unmapped, so that the client's first touch (a minor fault the kernel
// serves) shows in its page table, which the audit reads. Capacity for a
// device is reserved first, so that a full arena fails before anything
// moved.
func (o *mover) moveTo(dst location, demand, speculative PageMask, lead int) error {
	moved, err := o.move(dst, demand, speculative, lead, true)
	if dst == hostLoc && moved > 0 {
		o.overBudget()
	}
	return err
}

// moveToUnmapped moves pages into dst's file only: eviction does, so that
// the pages' next user maps them on touch.
func (o *mover) moveToUnmapped(dst location, pages, speculative PageMask) error {
	_, err := o.move(dst, pages, speculative, -1, false)
	return err
}

func (o *mover) move(dst location, demand, speculative PageMask, lead int, mapDst bool) (int64, error) {
	want := demand
	want.Or(&speculative)
	want.AndNot(&o.b.resident[dst])
	need := int64(want.Count())
	if need == 0 {
		return 0, nil
	}
	var arena *devmem.Arena
	if dst != hostLoc {
		arena = o.sess.srv.arenas[dst-1]
		if err := o.reserve(dst, need); err != nil {
			return 0, err
		}
	}
	dstFile, err := o.sess.file(dst)
	var dstView *view
	if mapDst {
		dstView = o.viewOf(dst)
	}
	lazy := dst == hostLoc && o.r.trackPrefetch
	var moved int64
	if err == nil {
		for _, rn := range o.runs(want, speculative, lazy, lead) {
			var done PageMask
			done, err = o.moveRun(rn, dst, dstView, dstFile)
			o.account(rn, done, dst, speculative)
			moved += int64(done.Count())
			if err != nil {
				break
			}
		}
	}
	o.doneWith(dstView)
	if arena != nil && moved < need {
		arena.Release(need - moved)
	}
	return moved, err
}

// moveRun moves one run to dst, without touching the block's bookkeeping.
// dstView is nil when dst has no running view.
func (o *mover) moveRun(rn run, dst location, dstView *view, dstFile *devmem.File) (PageMask, error) {
	var done PageMask
	off, length := o.fileOff(rn.first), int64(rn.outer-rn.first)*PageSize
	mapIt := dstView != nil && !rn.speculative
	if !rn.populated {
		if mapIt {
			return o.install(dstView, installZero, rn.first, rn.outer, nil)
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
	srcView := o.viewOf(rn.src)
	defer o.doneWith(srcView)
	addr, span := o.pageAddr(rn.first), uintptr(length)
	if srcView != nil {
		if err := o.writeProtect(srcView, addr, span); err != nil {
			return done, err
		}
	}
	if mapIt {
		done, err = o.installFromFile(dstView, rn.first, rn.outer, srcFile)
	} else if _, err = dstFile.CopyFrom(srcFile, off, off, length); err == nil {
		done.FillRange(rn.first, rn.outer)
	}
	if rn.src == hostLoc {
		o.auditLeaving(rn, done)
	}
	for p, q := done.NextRun(0); p >= 0; p, q = done.NextRun(q) {
		if perr := srcFile.Punch(o.fileOff(p), int64(q-p)*PageSize); perr != nil {
			o.sess.srv.logger.Printf("free %v pages %#x+%d: %v", rn.src.device(), o.fileOff(p), (q-p)*PageSize, perr)
		}
	}
	if rn.src != hostLoc {
		o.sess.srv.arenas[rn.src-1].Release(int64(done.Count()))
	}
	if srcView != nil {
		// Writers held by the protection retry now and fault the pages
		// back; pages that did not move are writable again.
		if done.CountRange(rn.first, rn.outer) < rn.outer-rn.first {
			_ = srcView.uffd.WriteProtect(addr, span, false, false)
		} else {
			_ = srcView.uffd.Wake(addr, span)
		}
	}
	return done, err
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
		if !errors.Is(err, uffd.ErrAgain) || !o.again(started) {
			return fmt.Errorf("write-protect %#x+%d in %v before migration: %w", addr, length, v.loc.device(), err)
		}
	}
}

// account records that the pages done of run rn now live at dst.
func (o *mover) account(rn run, done PageMask, dst location, speculative PageMask) {
	n := done.Count()
	if n == 0 {
		return
	}
	b := o.b
	srv := o.sess.srv
	for l := range b.resident {
		b.resident[l].AndNot(&done)
	}
	b.resident[dst].Or(&done)
	if rn.populated && b.resident[rn.src].Empty() {
		srv.lrus[rn.src].remove(b)
	}
	srv.lrus[dst].touch(blockRef{r: o.r, i: o.blockIndex(), b: b})
	if dst == hostLoc {
		srv.hostPages.Add(int64(n))
	} else if rn.populated && rn.src == hostLoc {
		srv.hostPages.Add(-int64(n))
	}
	if !rn.populated {
		o.r.stats.populated[dst].Add(uint64(n))
		o.sess.srv.stats.populated[dst].Add(uint64(n))
	} else {
		o.r.stats.addMigrated(rn.src, dst, n)
		o.sess.srv.stats.addMigrated(rn.src, dst, n)
	}
	spec := done
	spec.And(&speculative)
	if k := spec.Count(); k > 0 {
		o.r.stats.prefetched.Add(uint64(k))
		o.sess.srv.stats.prefetched.Add(uint64(k))
		if rn.speculative && dst == hostLoc {
			b.prefetchPending.Or(&spec)
		}
	}
}

// prefetch moves [addr, addr+length) to dst, as cuMemPrefetchAsync does,
// synchronously. Pages never touched are populated (zero-filled) at dst.
func (sess *session) prefetch(addr, length uintptr, dst Device) error {
	if err := sess.srv.checkDevice(dst, "prefetch"); err != nil {
		return err
	}
	r, err := sess.findRange(addr, length, "prefetch")
	if err != nil {
		return err
	}
	dl := locationOf(dst)
	for va := addr; va < addr+length; {
		off := va - r.start
		blockAddr := r.start + off&^(BlockSize-1)
		end := min(addr+length, blockAddr+BlockSize)
		b := r.block(int(off >> blockShift))
		var want PageMask
		want.FillRange(int(va-blockAddr)/PageSize, int(end-blockAddr)/PageSize)
		b.mu.Lock()
		if r.freed.Load() {
			b.mu.Unlock()
			return fmt.Errorf("%w: prefetch %#x+%d: the allocation was freed meanwhile", ErrInvalidValue, addr, length)
		}
		op := mover{sess: sess, r: r, b: b, blockAddr: blockAddr}
		var none PageMask
		err = op.moveTo(dl, want, none, -1)
		for p := int(va-blockAddr) / PageSize; p < int(end-blockAddr)/PageSize; p++ {
			b.lastPrefetch[p] = uint8(dl) + 1
		}
		b.mu.Unlock()
		if err != nil {
			return fmt.Errorf("prefetch %#x+%d to %v: %w", addr, length, dst, err)
		}
		va = end
	}
	return nil
}

// checkDevice accepts CPU and the configured devices.
func (s *Server) checkDevice(d Device, what string) error {
	if d == CPU || (d >= 0 && int(d) < len(s.arenas)) {
		return nil
	}
	switch len(s.arenas) {
	case 0:
		return fmt.Errorf("%w: %s %v: this server has no devices, only the CPU (%d)", ErrInvalidDevice, what, d, CPU)
	case 1:
		return fmt.Errorf("%w: %s %v: this server has one device, 0 (or %d for the CPU)", ErrInvalidDevice, what, d, CPU)
	}
	return fmt.Errorf("%w: %s %v: this server has devices 0 to %d (or %d for the CPU)", ErrInvalidDevice, what, d, len(s.arenas)-1, CPU)
}

// rangeAttributes answers cuMemRangeGetAttribute's questions for a range.
func (sess *session) rangeAttributes(addr, length uintptr) (RangeAttributes, error) {
	r, err := sess.findRange(addr, length, "range attributes")
	if err != nil {
		return RangeAttributes{}, err
	}
	a := RangeAttributes{PreferredLocation: InvalidDevice, LastPrefetchLocation: InvalidDevice, AccessedBy: []Device{}}
	last := -1 // lastPrefetch code shared by every page so far; -2 when they differ
	for va := addr; va < addr+length; {
		off := va - r.start
		blockAddr := r.start + off&^(BlockSize-1)
		end := min(addr+length, blockAddr+BlockSize)
		b := r.block(int(off >> blockShift))
		b.mu.Lock()
		for p := int(va-blockAddr) / PageSize; p < int(end-blockAddr)/PageSize; p++ {
			code := int(b.lastPrefetch[p])
			switch {
			case last == -1:
				last = code
			case last != code:
				last = -2
			}
		}
		b.mu.Unlock()
		va = end
	}
	if last > 0 {
		a.LastPrefetchLocation = location(last - 1).device()
	}
	return a, nil
}
