package server

import (
	"errors"
	"fmt"
	"time"

	"github.com/softuvm/softuvm/devmem"
	"github.com/softuvm/softuvm/internal/block"
	"github.com/softuvm/softuvm/internal/core"
	"github.com/softuvm/softuvm/internal/engine"
	"github.com/softuvm/softuvm/policy"
	"github.com/softuvm/softuvm/uffd"
)

// The kernel's side of a move (package block decides what moves where
// and keeps the books; these carry each step out with userfaultfd and
// the location files, with the block's lock held). Every move is a real
// copy between distinct physical pages, or a fresh zero-filled page:
//
//	nowhere -> L   UFFDIO_ZEROPAGE into L's view (allocating in L's file),
//	               or fallocate in L's file when L has no view
//	S -> L         write-protect the pages in S's view, so that writers
//	               wait; pread S's file into a staging buffer and
//	               UFFDIO_COPY into L's view (or copy file to file when L
//	               has no view); punch S's file; wake S's view

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

// chunkSpan cuts pages [first, outer) into the copy engine's chunks.
type chunkSpan struct{ first, outer, per, chunks int }

// pageSink is where transfer puts pages: a view (installed, mapped) or a
// file (unmapped).
type pageSink interface {
	put(first, outer int, data []byte) (core.PageMask, error)
}

type viewTarget struct {
	sess *session
	o    *block.Mover
	v    *view
}

type fileTarget struct {
	o *block.Mover
	f *devmem.File
}

// handlerOf is the handler thread serving the mover's fault, for its
// scratch buffers and its sample of the fault anatomy; nil on the
// control path and for deferred faults.
func handlerOf(o *block.Mover) *handler {
	h, _ := o.Thread.(*handler)
	return h
}

// again waits a little before an ioctl on view v refused with EAGAIN is
// retried. The kernel refuses while an mremap in v's process (a device
// changing a remote mapping, or a client moving memory) waits for its
// event to be read, so the event is read here: the view's other handlers
// may all be parked or busy. Faults read meanwhile are served on their
// own goroutines.
func (sess *session) again(v *view, since time.Time) bool {
	if time.Since(since) > retryAgain {
		return false
	}
	sess.drainEvents(v)
	time.Sleep(20 * time.Microsecond)
	return true
}

// install maps pages [first, outer) into view v: fresh zero pages, or
// copies of src (PageSize bytes per page), write-protected with wp. They
// land in whatever file v maps there. A zero page already present
// (another thread resolved it) is left and woken. A copy finding its
// page present writes over it (overwritePresent says why). It returns
// the pages now present, installed or found, and those of them found
// and left as they were.
func (sess *session) install(o *block.Mover, v *view, kind installKind, first, outer int, src []byte, wp bool) (done, found core.PageMask, err error) {
	u := v.uffd
	started := time.Now()
	var mode uffd.CopyMode
	if wp {
		mode = uffd.CopyWP
	}
	h := handlerOf(o)
	for p := first; p < outer; {
		addr, length := o.PageAddr(p), uintptr(outer-p)*core.PageSize
		var n int64
		h.ioctlBegins()
		if kind == installZero {
			n, err = u.ZeroPage(addr, length, false)
		} else {
			n, err = u.Copy(addr, src[(p-first)*core.PageSize:(outer-first)*core.PageSize], mode)
		}
		h.ioctlEnds()
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
				if written, werr = sess.overwritePresent(o, v, p, page); werr != nil {
					return done, found, werr
				}
			}
			_ = u.Wake(o.PageAddr(p), core.PageSize)
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
			if !sess.again(v, started) {
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
func (sess *session) overwritePresent(o *block.Mover, v *view, p int, page []byte) (written bool, err error) {
	m, known := o.MapsAt(v.loc, p)
	if !known {
		return false, nil
	}
	f, err := sess.file(m)
	if err != nil {
		return false, err
	}
	if _, err := f.WriteAt(page, o.FileOff(p)); err != nil {
		return false, fmt.Errorf("write over the stray page at %#x in %s: %w", o.PageAddr(p), f.Name(), err)
	}
	sess.srv.strayPresent.Add(1)
	sess.srv.logger.Printf("pid %d: stray page %#x: present in location %d's file, which the residency table says lacks it; the move wrote over it", sess.pid, o.PageAddr(p), m)
	return true, nil
}

// installFromFile copies pages [first, outer) from f (at the same file
// offsets) into view v through the copy engine's staging buffers.
// Measured on this kind of VM, pread plus UFFDIO_COPY beats the
// alternatives: UFFDIO_COPY straight from a mapping of f takes a slow
// path for every page the server has not mapped (and leaves the server's
// mapping for the punch to zap), and copy_file_range into the destination
// file plus UFFDIO_CONTINUE serializes on that file's inode lock.
func (sess *session) installFromFile(o *block.Mover, v *view, first, outer int, f *devmem.File, wp bool) (done, found core.PageMask, err error) {
	span := newChunkSpan(first, outer)
	direct, done1 := sess.stagingBuf(o)
	defer done1()
	_, err = sess.srv.copyEngine(v.loc).Run(&engine.CopyJob{
		Chunks: span.chunks, Bytes: int64(outer-first) * core.PageSize, Staging: true, Direct: direct, Buffers: sess.srv.staging,
		Produce: func(i int, buf []byte) error {
			p, q := span.pages(i)
			_, err := f.ReadAt(buf[:(q-p)*core.PageSize], o.FileOff(p))
			return err
		},
		Install: func(i int, buf []byte) error {
			p, q := span.pages(i)
			got, seen, err := sess.install(o, v, installCopy, p, q, buf[:(q-p)*core.PageSize], wp)
			done.Or(&got)
			found.Or(&seen)
			return err
		},
	})
	return done, found, err
}

// stagingBuf returns a staging buffer, a slot of the server's staging
// area, and what to call when done with it: a fault handler keeps one
// for its life, the control path borrows one.
func (sess *session) stagingBuf(o *block.Mover) ([]byte, func()) {
	area := sess.srv.staging
	h := handlerOf(o)
	if h == nil {
		buf := area.Get()
		return buf, func() { area.Put(buf) }
	}
	if h.staging == nil { // taken on first use: most sessions never need it
		h.staging = area.Get()
	}
	return h.staging, func() {}
}

// transfer moves pages [first, outer) from location from's file src to
// dst through the copy engine, a chunk at a time: read the pages into a
// staging buffer (the producers), punch them from src (the releaser),
// then put them in dst (the consumer, this goroutine). The source goes
// before the destination because once the pages are in dst a thread
// there may write them (the install wakes the faulting one): a reader of
// the source copy must not see the old bytes after that write; it faults
// instead, and waits for the block. Pages that fail to arrive are
// written back to src.
func (sess *session) transfer(o *block.Mover, dst pageSink, to core.Device, first, outer int, from core.Device, src *devmem.File) (core.PageMask, error) {
	var done core.PageMask
	span := newChunkSpan(first, outer)
	area := sess.srv.staging
	writeBack := func(x, y, p int, buf []byte) {
		if _, err := src.WriteAt(buf[(x-p)*core.PageSize:(y-p)*core.PageSize], o.FileOff(x)); err != nil {
			sess.srv.logger.Printf("put back %#x+%d after a failed migration: %v (the data is lost)", o.PageAddr(x), (y-x)*core.PageSize, err)
		}
	}
	direct, doneWithDirect := sess.stagingBuf(o)
	defer doneWithDirect()
	_, err := sess.srv.copyEngine(to).Run(&engine.CopyJob{
		Chunks: span.chunks, Bytes: int64(outer-first) * core.PageSize, Staging: true, Direct: direct, Buffers: area,
		Produce: func(i int, buf []byte) error {
			p, q := span.pages(i)
			_, err := src.ReadAt(buf[:(q-p)*core.PageSize], o.FileOff(p))
			return err
		},
		Release: func(i int, buf []byte) error {
			p, q := span.pages(i)
			// From the punch until the install the pages are only in
			// buf: say so where a new server will look (staging.go).
			area.Mark(buf, sess.id, o.FileOff(p), (q-p)*core.PageSize)
			err := o.PunchPages(from, p, q)
			if err != nil {
				area.Clear(buf)
			}
			sess.srv.afterPunch()
			return err
		},
		Install: func(i int, buf []byte) error {
			defer area.Clear(buf)
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
			defer area.Clear(buf)
			p, q := span.pages(i)
			writeBack(p, q, p, buf)
		},
	})
	return done, err
}

func newChunkSpan(first, outer int) chunkSpan {
	per := engine.ChunkBytes / core.PageSize
	return chunkSpan{first: first, outer: outer, per: per, chunks: (outer - first + per - 1) / per}
}

// pages returns chunk i's pages.
func (c chunkSpan) pages(i int) (int, int) {
	p := c.first + i*c.per
	return p, min(c.outer, p+c.per)
}

func (t viewTarget) put(first, outer int, data []byte) (core.PageMask, error) {
	done, _, err := t.sess.install(t.o, t.v, installCopy, first, outer, data, false)
	return done, err
}

func (t fileTarget) put(first, outer int, data []byte) (core.PageMask, error) {
	var done core.PageMask
	n, err := t.f.WriteAt(data, t.o.FileOff(first))
	done.FillRange(first, first+n/core.PageSize)
	return done, err
}

// writeProtect holds a view's writers still on [addr, addr+length) while
// the pages are copied away.
func (sess *session) writeProtect(v *view, addr, length uintptr) error {
	started := time.Now()
	for {
		err := v.uffd.WriteProtect(addr, length, true, true)
		if err == nil || errors.Is(err, uffd.ErrProcessGone) {
			return nil // a process that is gone writes nothing
		}
		if !errors.Is(err, uffd.ErrAgain) || !sess.again(v, started) {
			return fmt.Errorf("write-protect %#x+%d in %v before migration: %w", addr, length, v.loc, err)
		}
	}
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
	if r.Kind != core.KindManaged {
		return fmt.Errorf("%w: prefetch %#x: prefetch applies to managed memory, and this is %s", core.ErrInvalidValue, addr, r.Kind)
	}
	// Blocks move in parallel, as many at once as the calibration found
	// worth it (each block's own move may use the engine's pipeline),
	// unless the destination must evict to take them: eviction takes
	// whole blocks whose locks it can get, and the other movers would
	// hold the very blocks it needs.
	movers := sess.srv.copyCalibration().BlockMovers
	if !sess.srv.eng.RoomFor(dst, int64(length)) {
		movers = 1
	}
	err = r.eachBlockParallel(addr, length, movers, sess.srv.nodeOf(dst), func(o *block.Mover, pages core.PageMask) error {
		if err := o.Prefetch(dst, pages); err != nil {
			return fmt.Errorf("prefetch %#x+%d to %v: %w", addr, length, dst, err)
		}
		return nil
	})
	if err != nil {
		return err
	}
	return sess.remapRange(r, addr, length)
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

var _ = policy.CauseFault
