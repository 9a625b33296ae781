package uvm

import (
	"errors"
	"fmt"
	"time"

	"github.com/softuvm/softuvm/devmem"
	"github.com/softuvm/softuvm/uffd"
)

// mover performs the kernel operations that change where pages of one
// block live, with the block's lock held. Every move is a real copy
// between distinct physical pages, or a fresh zero-filled page:
//
//	nowhere -> host    UFFDIO_ZEROPAGE into the client (allocates in the host file)
//	device  -> host    UFFDIO_COPY from the server's mapping of the device file, then punch the device file
//	nowhere -> device  fallocate in the device file
//	host    -> device  write-protect the client's pages, copy file to file, punch the host file, wake
//	device  -> device  copy file to file, punch the source
//
// Punching a file frees its pages and zaps every page-table entry that
// maps them, in every process: that is how a page leaves a location.
type mover struct {
	sess      *session
	r         *managedRange
	b         *block
	blockAddr uintptr  // client address of the block's page 0
	h         *handler // the handler thread, nil on the control path
	runBuf    []run    // reused for runs; nil allocates
}

func (o *mover) pageAddr(p int) uintptr { return o.blockAddr + uintptr(p)*PageSize }

func (o *mover) fileOff(p int) int64 { return o.r.fileOff + int64(o.pageAddr(p)-o.r.start) }

// retryAgain is how long an ioctl refused with EAGAIN (an mremap in
// flight in the client) is retried before the operation fails.
const retryAgain = 2 * time.Second

// again waits a little before an ioctl refused with EAGAIN is retried.
// The event that causes it is read by another handler of the session; with
// a single handler thread nobody reads it and the retry times out.
func (o *mover) again(since time.Time) bool {
	if time.Since(since) > retryAgain {
		return false
	}
	time.Sleep(50 * time.Microsecond)
	return true
}

// installKind selects the resolving ioctl of install.
type installKind int

const (
	installZero installKind = iota // UFFDIO_ZEROPAGE: a fresh zero page
	installCopy                    // UFFDIO_COPY: a copy of the source bytes
)

// install maps pages [first, outer) into the client: fresh zero pages, or
// copies of src (PageSize bytes per page). Pages already mapped (another
// thread resolved them) are skipped and woken. It returns the pages now
// present, installed or found.
func (o *mover) install(kind installKind, first, outer int, src []byte) (PageMask, error) {
	var done PageMask
	u := o.sess.uffd
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

// serveHostFault resolves a host fault on page p, bringing prefetched
// pages along.
func (o *mover) serveHostFault(p int, kind faultKind) error {
	b := o.b
	if kind == faultWP {
		if b.resident[hostLoc].Test(p) {
			// A migration protected the page and did not take it:
			// give write access back (this also wakes the writer).
			if err := o.sess.uffd.WriteProtect(o.pageAddr(p), PageSize, false, false); err != nil {
				o.h.wake(o.pageAddr(p), PageSize)
			}
			return nil
		}
		// The page left while the writer waited; its retry faults as
		// missing and brings it back.
		o.h.wake(o.pageAddr(p), PageSize)
		return nil
	}
	if b.resident[hostLoc].Test(p) {
		// Believed on the host but the host file has no page: either a
		// race with another handler (the page exists now: just wake) or
		// the client punched it (MADV_REMOVE: it reads as zeros again).
		_, err := o.install(installZero, p, p+1, nil)
		return err
	}
	var faulted PageMask
	faulted.Set(p)
	ctx := &o.h.prefetchCtx
	*ctx = PrefetchContext{Pages: b.pages, Faulted: faulted, ResidentOnDest: b.resident[hostLoc], Populated: b.populated()}
	extra := o.r.prefetch.Expand(ctx)
	extra.TrimTo(b.pages)
	extra.AndNot(&b.resident[hostLoc])
	extra.Clear(p)
	return o.toHost(faulted, extra, p)
}

// failFault makes sure a thread whose fault could not be served does not
// wait forever: its page is poisoned, so the access raises SIGBUS.
func (o *mover) failFault(addr uintptr, err error) {
	if errors.Is(err, uffd.ErrProcessGone) || errors.Is(err, uffd.ErrNoEntry) {
		return // the process is exiting or unmapped the range: nobody waits
	}
	srv := o.sess.srv
	if _, perr := o.sess.uffd.Poison(addr, PageSize, false); perr == nil {
		srv.poisoned.Add(1)
		srv.logger.Printf("pid %d: fault at %#x could not be served (%v); page poisoned (SIGBUS)", o.sess.pid, addr, err)
		return
	}
	o.h.wake(addr, PageSize)
	srv.logger.Printf("pid %d: fault at %#x could not be served: %v", o.sess.pid, addr, err)
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

// toHost brings demand and speculative pages to the host. Demanded pages
// are mapped into the client at once; speculative ones too, unless the
// range tracks prefetch use, in which case they go into the host file
// unmapped and the client's first touch maps them (a minor fault the
// kernel serves), which the audit later observes.
func (o *mover) toHost(demand, speculative PageMask, lead int) error {
	want := demand
	want.Or(&speculative)
	want.AndNot(&o.b.resident[hostLoc])
	return o.execRuns(o.runs(want, speculative, o.r.trackPrefetch, lead), hostLoc, nil, speculative)
}

// execRuns moves runs to dst and records where the pages went.
func (o *mover) execRuns(runs []run, dst location, dstFile *devmem.File, speculative PageMask) error {
	for _, rn := range runs {
		if rn.populated && rn.src == dst {
			continue
		}
		done, err := o.moveRun(rn, dst, dstFile)
		o.account(rn, done, dst, speculative)
		if err != nil {
			return err
		}
	}
	return nil
}

// moveRun moves one run (or a piece of one) to dst, without touching the
// block's bookkeeping: pieces of a run may move on several threads at
// once. dstFile is dst's file for a device.
func (o *mover) moveRun(rn run, dst location, dstFile *devmem.File) (PageMask, error) {
	var done PageMask
	var err error
	off, length := o.fileOff(rn.first), int64(rn.outer-rn.first)*PageSize
	switch {
	case dst == hostLoc && !rn.populated && rn.speculative:
		if err = o.sess.host.Allocate(off, length); err == nil {
			done.FillRange(rn.first, rn.outer)
		}
	case dst == hostLoc && !rn.populated:
		done, err = o.install(installZero, rn.first, rn.outer, nil)
	case dst == hostLoc:
		done, err = o.deviceToHost(rn)
	case !rn.populated:
		if err = dstFile.Allocate(off, length); err == nil {
			done.FillRange(rn.first, rn.outer)
		}
	case rn.src == hostLoc:
		done, err = o.hostToDevice(rn, dstFile)
	default:
		done, err = o.deviceToDevice(rn, dstFile)
	}
	return done, err
}

// deviceToHost copies a run from a device file into the client's host
// view (or, for speculative pages left unmapped for tracking, into the
// host file), then frees it on the device.
func (o *mover) deviceToHost(rn run) (PageMask, error) {
	var done PageMask
	d := int(rn.src) - 1
	devFile, err := o.sess.deviceFile(d)
	if err != nil {
		return done, err
	}
	off, length := o.fileOff(rn.first), int64(rn.outer-rn.first)*PageSize
	if rn.speculative {
		if _, err = o.sess.host.CopyFrom(devFile, off, off, length); err == nil {
			done.FillRange(rn.first, rn.outer)
		}
	} else {
		done, err = o.installFromFile(rn.first, rn.outer, devFile)
	}
	o.releaseDevicePages(d, devFile, done)
	return done, err
}

// stagingPages sizes the buffer that carries pages from a device file to
// UFFDIO_COPY: small enough to stay in the CPU's cache between the read
// that fills it and the copy that drains it.
const stagingPages = 64

// installFromFile copies pages [first, outer) from f (at the same file
// offsets) into the client through a staging buffer. Measured on this
// kind of VM, pread plus UFFDIO_COPY beats the alternatives: UFFDIO_COPY
// straight from a mapping of f takes a slow path for every page the
// server has not mapped (and leaves the server's mapping for the punch to
// zap), and copy_file_range into the host file plus UFFDIO_CONTINUE
// serializes on the host file's inode lock.
func (o *mover) installFromFile(first, outer int, f *devmem.File) (PageMask, error) {
	var done PageMask
	buf := o.staging()
	for p := first; p < outer; {
		q := min(outer, p+stagingPages)
		n := (q - p) * PageSize
		if _, err := f.ReadAt(buf[:n], o.fileOff(p)); err != nil {
			return done, err
		}
		got, err := o.install(installCopy, p, q, buf[:n])
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

// releaseDevicePages punches pages that now live elsewhere out of a device
// file and returns their capacity to the arena.
func (o *mover) releaseDevicePages(d int, f *devmem.File, pages PageMask) {
	for p, q := pages.NextRun(0); p >= 0; p, q = pages.NextRun(q) {
		if err := f.Punch(o.fileOff(p), int64(q-p)*PageSize); err != nil {
			o.sess.srv.logger.Printf("release device %d pages %#x+%d: %v", d, o.fileOff(p), (q-p)*PageSize, err)
		}
	}
	o.sess.srv.arenas[d].Release(int64(pages.Count()))
}

// account records that the pages done of run rn now live at dst.
func (o *mover) account(rn run, done PageMask, dst location, speculative PageMask) {
	n := done.Count()
	if n == 0 {
		return
	}
	b := o.b
	for l := range b.resident {
		b.resident[l].AndNot(&done)
	}
	b.resident[dst].Or(&done)
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

// toDevice moves pages to device location dst, reserving arena capacity
// first so that a full arena fails before anything moved.
func (o *mover) toDevice(want PageMask, dst location) error {
	d := int(dst) - 1
	want.AndNot(&o.b.resident[dst])
	need := int64(want.Count())
	if need == 0 {
		return nil
	}
	arena := o.sess.srv.arenas[d]
	if err := arena.Reserve(need); err != nil {
		return fmt.Errorf("%w: %v", ErrMemoryAllocation, err)
	}
	dstFile, err := o.sess.deviceFile(d)
	if err != nil {
		arena.Release(need)
		return err
	}
	before := o.b.resident[dst].Count()
	var none PageMask
	err = o.execRuns(o.runs(want, none, false, -1), dst, dstFile, none)
	if moved := int64(o.b.resident[dst].Count() - before); moved < need {
		arena.Release(need - moved)
	}
	return err
}

// hostToDevice takes a run away from the host. The client's pages are
// write-protected first, so that a write racing with the copy waits (and
// then faults the page back) instead of being lost.
func (o *mover) hostToDevice(rn run, dstFile *devmem.File) (PageMask, error) {
	var done PageMask
	u := o.sess.uffd
	addr, length := o.pageAddr(rn.first), uintptr(rn.outer-rn.first)*PageSize
	off := o.fileOff(rn.first)
	o.auditLeaving(rn)
	started := time.Now()
	for {
		err := u.WriteProtect(addr, length, true, true)
		if err == nil {
			break
		}
		if !errors.Is(err, uffd.ErrAgain) || !o.again(started) {
			return done, fmt.Errorf("write-protect %#x+%d before migration: %w", addr, length, err)
		}
	}
	if _, err := dstFile.CopyFrom(o.sess.host, off, off, int64(length)); err != nil {
		_ = u.WriteProtect(addr, length, false, false)
		return done, err
	}
	if err := o.sess.host.Punch(off, int64(length)); err != nil {
		_ = u.WriteProtect(addr, length, false, false)
		return done, err
	}
	// Writers that hit the protection wait in the kernel; their retry now
	// faults as missing and brings the page back.
	_ = u.Wake(addr, length)
	done.FillRange(rn.first, rn.outer)
	return done, nil
}

func (o *mover) deviceToDevice(rn run, dstFile *devmem.File) (PageMask, error) {
	var done PageMask
	s := int(rn.src) - 1
	srcFile, err := o.sess.deviceFile(s)
	if err != nil {
		return done, err
	}
	off, length := o.fileOff(rn.first), int64(rn.outer-rn.first)*PageSize
	if _, err := dstFile.CopyFrom(srcFile, off, off, length); err != nil {
		return done, err
	}
	done.FillRange(rn.first, rn.outer)
	o.releaseDevicePages(s, srcFile, done)
	return done, nil
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
		want.AndNot(&b.resident[dl])
		if dl == hostLoc {
			var none PageMask
			err = op.toHost(want, none, -1)
		} else {
			err = op.toDevice(want, dl)
		}
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
		return fmt.Errorf("%w: %s to %v: this server has no devices, only the CPU (%d)", ErrInvalidDevice, what, d, CPU)
	case 1:
		return fmt.Errorf("%w: %s to %v: this server has one device, 0 (or %d for the CPU)", ErrInvalidDevice, what, d, CPU)
	}
	return fmt.Errorf("%w: %s to %v: this server has devices 0 to %d (or %d for the CPU)", ErrInvalidDevice, what, d, len(s.arenas)-1, CPU)
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
