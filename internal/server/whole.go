package server

import (
	"errors"
	"fmt"

	"github.com/softuvm/softuvm/devmem"
	"github.com/softuvm/softuvm/internal/core"
)

// Whole-block moves. Where location files take large folios
// (devmem.CreateLargeFolioFile), a block that moves whole, all of its
// pages from one location to another, is read from its source into
// staging buffers, punched from the source in one call and written to
// its destination with one pwritev: one 2 MiB folio allocated and (where
// the source was one) one freed, instead of 512 of each. Measured on
// this kind of VM the page allocator, not the copy, set the rate of
// 4 KiB moves (docs/benchmarks.md). A block never touched that arrives
// whole is one write of zeros. Everything smaller keeps the 4 KiB path
// (migrate.go), so one faulted page still moves 4 KiB, and residency,
// advice and statistics stay per page.
//
// The pitfall of large folios is that "present in the file" would stop
// meaning "resident here": a 4 KiB write into an empty 2 MiB of such a
// file allocates the whole folio, and the other 511 pages then read as
// zeros through every mapping instead of faulting. devmem's File keeps
// partial writes in 4 KiB folios; UFFDIO_COPY and UFFDIO_ZEROPAGE
// allocate 4 KiB folios anyway; and a partial punch of a large folio is
// checked (punchPages), since the kernel zeroes and keeps what it cannot
// split.

// wholeBlock reports whether run rn is a whole block that can move as
// one large folio.
func (o *mover) wholeBlock(rn run, dst *devmem.File) bool {
	return dst.Large() && rn.first == 0 && rn.outer == core.PagesPerBlock && o.b.pages == core.PagesPerBlock &&
		o.fileOff(0)%devmem.LargeFolioSize == 0
}

// moveWhole moves run rn, a whole block, to t.dst's file as one large
// folio; through t.via, the faulting threads of that view are woken
// (they fault the pages from the file). It returns the pages moved: all
// or none.
func (o *mover) moveWhole(rn run, t target, dstFile *devmem.File) (core.PageMask, error) {
	var done core.PageMask
	off := o.fileOff(0)
	addr, span := o.pageAddr(0), uintptr(core.BlockSize)
	if !rn.populated {
		if err := dstFile.Allocate(off, core.BlockSize); err != nil {
			return done, err
		}
		o.b.large |= 1 << t.dst.Slot()
		done.FillRange(0, core.PagesPerBlock)
		o.wakeTarget(rn, t, addr, span)
		return done, nil
	}
	srcFile, err := o.sess.file(rn.src)
	if err != nil {
		return done, err
	}
	holders := o.holders(rn.src, 0, core.PagesPerBlock)
	defer o.doneWithAll(holders)
	for _, v := range holders {
		if err := o.writeProtect(v, addr, span); err != nil {
			return done, err
		}
	}
	if rn.src == core.CPU {
		o.auditLeaving(rn, fullBlock())
	}
	err = o.copyWhole(srcFile, dstFile, off)
	if err == nil {
		done = fullBlock()
		o.b.large &^= 1 << rn.src.Slot()
		o.b.large |= 1 << t.dst.Slot()
	}
	o.released(rn.src, done)
	o.release(holders, addr, span, done.Empty())
	if err == nil {
		o.wakeTarget(rn, t, addr, span)
	}
	return done, err
}

func fullBlock() core.PageMask {
	var all core.PageMask
	all.FillRange(0, core.PagesPerBlock)
	return all
}

// wakeTarget wakes the threads of the target's view that wait on the
// block: UFFDIO_COPY would have, and a write into the file does not.
func (o *mover) wakeTarget(rn run, t target, addr, span uintptr) {
	if rn.mapped && t.via != nil {
		_ = t.via.uffd.Wake(addr, span)
	}
}

// copyWhole carries the block at off from src to dst: read into staging
// slots (which record the intent, staging.go, since between the punch
// and the write the pages are only there), punch the source, write the
// destination. The source goes first for the reason transfer gives. On
// a failed write the destination is punched and the source written back.
func (o *mover) copyWhole(src, dst *devmem.File, off int64) error {
	area := o.sess.srv.staging
	const slots = core.BlockSize / stagingSlotBytes
	bufs := make([][]byte, 0, slots)
	defer func() {
		for _, b := range bufs {
			area.clear(b)
			area.Put(b)
		}
	}()
	for i := range slots {
		b := area.Get()
		if b == nil {
			return fmt.Errorf("%w: staging area closed", core.ErrInternal)
		}
		bufs = append(bufs, b)
		if _, err := src.ReadAt(b, off+int64(i)*stagingSlotBytes); err != nil {
			return err
		}
	}
	for i, b := range bufs {
		area.mark(b, o.sess.id, off+int64(i)*stagingSlotBytes, stagingSlotBytes)
	}
	if err := src.Punch(off, core.BlockSize); err != nil {
		return err
	}
	o.sess.srv.afterPunch()
	iov := append([][]byte(nil), bufs...)
	if _, err := dst.WriteBlock(iov, off); err != nil {
		if perr := dst.Punch(off, core.BlockSize); perr != nil {
			o.sess.srv.logger.Printf("take back %#x+%d after a failed migration: %v", off, core.BlockSize, perr)
		}
		if _, werr := src.WriteBlock(append([][]byte(nil), bufs...), off); werr != nil {
			o.sess.srv.logger.Printf("put back %#x+%d after a failed migration: %v (the data is lost)", off, core.BlockSize, werr)
		}
		return err
	}
	return nil
}

// punchPages frees location l's copies of pages [first, outer) from its
// file f. Where l may hold the block in a large folio, the punch checks
// that the kernel split it; where it could not (a reference held the
// folio), the block is rebuilt in 4 KiB folios.
func (o *mover) punchPages(l core.Device, f *devmem.File, first, outer int) error {
	off, length := o.fileOff(first), int64(outer-first)*core.PageSize
	if o.b.large&(1<<l.Slot()) == 0 {
		return f.PunchSmallFolios(off, length)
	}
	err := f.Punch(off, length)
	if errors.Is(err, devmem.ErrFolioKept) {
		o.sess.srv.foliosRebuilt.Add(1)
		err = o.rebuildBlock(l, f, first, outer)
	}
	if err == nil && first == 0 && outer == o.b.pages {
		// Only a whole punch ends it: the kernel splits a large folio
		// into the fewest folios that free the punched part, and the
		// rest stay large (64 and 128 KiB ones, say).
		o.b.large &^= 1 << l.Slot()
	}
	return err
}

// rebuildBlock makes location l's copy of the block 4 KiB folios again,
// without pages [first, outer), after a punch of those left a large
// folio in place: with l's other pages held still in every view that
// maps them, it reads them, punches the whole 2 MiB (a whole folio is
// freed whole) and writes them back, which puts them in 4 KiB folios.
func (o *mover) rebuildBlock(l core.Device, f *devmem.File, first, outer int) error {
	keep := o.b.resident[l.Slot()] // pages l holds; of those, the file's
	var gone core.PageMask
	gone.FillRange(first, outer)
	keep.AndNot(&gone)
	if present, err := f.Present(o.fileOff(0), int64(o.b.pages)*core.PageSize); err == nil {
		var in core.PageMask
		for p, ok := range present {
			if ok {
				in.Set(p)
			}
		}
		keep.And(&in)
	}
	holders := o.holders(l, 0, o.b.pages)
	defer o.doneWithAll(holders)
	// Every page but [first, outer), which the caller holds.
	others := [][2]int{{0, first}, {outer, o.b.pages}}
	held := func(protect bool) {
		for _, v := range holders {
			for _, r := range others {
				if r[1] <= r[0] {
					continue
				}
				a, n := o.pageAddr(r[0]), uintptr(r[1]-r[0])*core.PageSize
				if protect {
					_ = o.writeProtect(v, a, n)
				} else {
					_ = v.uffd.WriteProtect(a, n, false, false)
				}
			}
		}
	}
	held(true)
	defer held(false)
	buf := make([]byte, core.BlockSize)
	for p, q := keep.NextRun(0); p >= 0; p, q = keep.NextRun(q) {
		if _, err := f.ReadAt(buf[p*core.PageSize:q*core.PageSize], o.fileOff(p)); err != nil {
			return err
		}
	}
	if err := f.Punch(o.fileOff(0), int64(o.b.pages)*core.PageSize); err != nil {
		return fmt.Errorf("rebuild %#x in 4 KiB folios: %w", o.pageAddr(0), err)
	}
	for p, q := keep.NextRun(0); p >= 0; p, q = keep.NextRun(q) {
		if _, err := f.WriteAt(buf[p*core.PageSize:q*core.PageSize], o.fileOff(p)); err != nil {
			o.sess.srv.logger.Printf("rebuild %#x+%d in 4 KiB folios: %v (the data is lost)", o.pageAddr(p), (q-p)*core.PageSize, err)
			return err
		}
	}
	return nil
}
