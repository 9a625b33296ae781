package server

import (
	"fmt"

	"github.com/softuvm/softuvm/devmem"
	"github.com/softuvm/softuvm/internal/block"
	"github.com/softuvm/softuvm/internal/core"
)

// The kernel's side of whole-block moves (package block decides which
// way a whole block goes, and keeps the record of which files may hold
// it in one 2 MiB folio). Where location files take large folios
// (devmem.CreateLargeFolioFile), a block that moves whole is written to
// its destination with one pwrite: one 2 MiB folio allocated and (where
// the source was one) one freed, instead of 512 of each. Measured on
// this kind of VM the page allocator, not the copy, set the rate of
// 4 KiB moves (docs/benchmarks.md).
//
// The pitfall of large folios is that "present in the file" would stop
// meaning "resident here": a 4 KiB write into an empty 2 MiB of such a
// file allocates the whole folio, and the other 511 pages then read as
// zeros through every mapping instead of faulting. devmem's File keeps
// partial writes in 4 KiB folios; UFFDIO_COPY and UFFDIO_ZEROPAGE
// allocate 4 KiB folios anyway; and a partial punch of a large folio is
// never made (block.Mover.PunchPages): the block is rebuilt first
// (rebuildBlock).

// CopyWhole carries the block from location from's file to location
// to's file. Where nobody can map the destination's copy without asking
// the server (sealed), the destination is written straight from a
// mapping of the source, and the source punched after: one copy of
// 2 MiB, where carrying it through staging slots made two (Prefetch of
// 1 GiB: 12-18% faster each way). Elsewhere the source must go first,
// for the reason transfer gives, and the pages travel through staging
// slots (copyWholeStaged).
func (sess *session) CopyWhole(o *block.Mover, from, to core.Device, sealed bool) error {
	src, err := sess.file(from)
	if err != nil {
		return err
	}
	dst, err := sess.file(to)
	if err != nil {
		return err
	}
	off := o.FileOff(0)
	if !sealed {
		return sess.copyWholeStaged(o, src, dst, off)
	}
	srv := sess.srv
	slot := srv.staging.Get() // for its intent: no page goes through it
	if slot == nil {
		return fmt.Errorf("%w: staging area closed", core.ErrInternal)
	}
	defer srv.staging.Put(slot) // voids the intent
	// Every page of the block is there (a whole, populated run), so the
	// mapping may take a huge entry.
	m, err := src.MapBlockToCopy(off)
	if err != nil {
		return err
	}
	srv.staging.MarkMove(slot, sess.id, off, core.BlockSize, from, to)
	// Sealed: nobody sees the destination's pages before the move is
	// done, so several movers may write into one file at once.
	err = dst.WriteBlockUnseen(m.Bytes(), off)
	m.Unmap()
	if err == nil {
		srv.inMove("written", dst, off)
		srv.staging.MarkCopied(slot)
		srv.inMove("copied", dst, off)
		if err = src.Punch(off, core.BlockSize); err == nil {
			srv.afterPunch()
			return nil
		}
	}
	// The source still holds the block: the destination's copy, whole
	// or part, goes.
	if perr := dst.Punch(off, core.BlockSize); perr != nil {
		srv.logger.Printf("take back %#x+%d after a failed migration: %v", off, core.BlockSize, perr)
	}
	return err
}

// copyWholeStaged carries the block at off from src to dst through
// staging slots: read into them (they record the intent, staging.go,
// since between the punch and the write the pages are only there),
// punch the source, write the destination. On a failed write the
// destination is punched and the source written back.
func (sess *session) copyWholeStaged(o *block.Mover, src, dst *devmem.File, off int64) error {
	bufs, unstage, err := sess.stageBlock(src, off)
	if err != nil {
		return err
	}
	defer unstage()
	if err := src.Punch(off, core.BlockSize); err != nil {
		return err
	}
	sess.srv.afterPunch()
	iov := append([][]byte(nil), bufs...)
	if _, err := dst.WriteBlock(iov, off); err != nil {
		if perr := dst.Punch(off, core.BlockSize); perr != nil {
			sess.srv.logger.Printf("take back %#x+%d after a failed migration: %v", off, core.BlockSize, perr)
		}
		if _, werr := src.WriteBlock(append([][]byte(nil), bufs...), off); werr != nil {
			sess.srv.logger.Printf("put back %#x+%d after a failed migration: %v (the data is lost)", off, core.BlockSize, werr)
		}
		return err
	}
	return nil
}

// InstallWhole moves the whole block, which location from's file may
// hold in a large folio, into view v: staged, its source punched whole
// (one folio freed, nothing to rebuild), then installed 4 KiB page by
// page with UFFDIO_COPY, mapped. Pages that fail to arrive go back to
// the source.
func (sess *session) InstallWhole(o *block.Mover, from core.Device, v block.View) (done core.PageMask, punched bool, err error) {
	srcFile, err := sess.file(from)
	if err != nil {
		return done, false, err
	}
	off := o.FileOff(0)
	bufs, unstage, err := sess.stageBlock(srcFile, off)
	if err != nil {
		return done, false, err
	}
	defer unstage()
	if err := srcFile.Punch(off, core.BlockSize); err != nil {
		return done, false, err
	}
	sess.srv.afterPunch()
	for i, b := range bufs {
		got, _, ierr := sess.install(o, v.(*view), installCopy, i*block.StagingSlotPages, (i+1)*block.StagingSlotPages, b, false)
		done.Or(&got)
		if ierr != nil {
			err = ierr
			break
		}
	}
	if err != nil {
		var failed core.PageMask
		failed.FillRange(0, core.PagesPerBlock)
		failed.AndNot(&done)
		if werr := sess.writeFromSlots(o, srcFile, bufs, failed); werr != nil {
			sess.srv.logger.Printf("put back %#x after a failed migration: %v (the data is lost)", o.PageAddr(0), werr)
		}
	}
	return done, true, err
}

// writeFromSlots writes pages of the block from the staging slots that
// stageBlock filled into f.
func (sess *session) writeFromSlots(o *block.Mover, f *devmem.File, bufs [][]byte, pages core.PageMask) error {
	for p, q := pages.NextRun(0); p >= 0; p, q = pages.NextRun(q) {
		for x := p; x < q; {
			slot, y := x/block.StagingSlotPages, min(q, (x/block.StagingSlotPages+1)*block.StagingSlotPages)
			b := bufs[slot][(x-slot*block.StagingSlotPages)*core.PageSize : (y-slot*block.StagingSlotPages)*core.PageSize]
			if _, err := f.WriteAt(b, o.FileOff(x)); err != nil {
				return err
			}
			x = y
		}
	}
	return nil
}

// stageBlock reads the 2 MiB of f at off into staging slots and records
// in each the intent to punch its source (staging.go), so that a server
// that dies before the pages are back in a file loses none of them. A
// hole reads as zeros, and a new server writes back only pages that no
// location file holds. unstage voids the intents and returns the slots.
func (sess *session) stageBlock(f *devmem.File, off int64) (bufs [][]byte, unstage func(), err error) {
	area := sess.srv.staging
	const slots = core.BlockSize / block.StagingSlotBytes
	bufs = make([][]byte, 0, slots)
	unstage = func() {
		for _, b := range bufs {
			area.Clear(b)
			area.Put(b)
		}
	}
	for i := range slots {
		b := area.Get()
		if b == nil {
			unstage()
			return nil, nil, fmt.Errorf("%w: staging area closed", core.ErrInternal)
		}
		bufs = append(bufs, b)
		if _, err := f.ReadAt(b, off+int64(i)*block.StagingSlotBytes); err != nil {
			unstage()
			return nil, nil, err
		}
	}
	for i, b := range bufs {
		area.Mark(b, sess.id, off+int64(i)*block.StagingSlotBytes, block.StagingSlotBytes)
	}
	return bufs, unstage, nil
}

// Rebuild makes location l's copy of the block 4 KiB folios, without
// pages [first, outer), which leave l: with l's other pages held still
// in every view that maps them (holders), it reads them, punches the
// whole 2 MiB and writes them back, which puts them in 4 KiB folios
// (WriteAt fills them whole before they enter the file). Meanwhile
// readers of them fault, and wait for the block.
func (sess *session) Rebuild(o *block.Mover, l core.Device, first, outer int, holders []block.View) error {
	f, err := sess.file(l)
	if err != nil {
		return err
	}
	b := o.B
	keep := b.Resident[l.Slot()] // pages l holds; of those, the file's
	var gone core.PageMask
	gone.FillRange(first, outer)
	keep.AndNot(&gone)
	if present, err := f.Present(o.FileOff(0), int64(b.Pages)*core.PageSize); err == nil {
		var in core.PageMask
		for p, ok := range present {
			if ok {
				in.Set(p)
			}
		}
		keep.And(&in)
	}
	// Every page but [first, outer), which the caller holds; pages with
	// several copies stay protected after (read duplication).
	var others, stayProtected core.PageMask
	others.FillRange(0, b.Pages)
	others.AndNot(&gone)
	stayProtected = b.Duplicated()
	defer func() {
		writable := others
		writable.AndNot(&stayProtected)
		for _, hv := range holders {
			for p, q := writable.NextRun(0); p >= 0; p, q = writable.NextRun(q) {
				sess.Unprotect(o, hv, p, q) // a writer held must wake, whatever fails
			}
		}
	}()
	for _, hv := range holders {
		for p, q := others.NextRun(0); p >= 0; p, q = others.NextRun(q) {
			if err := sess.writeProtect(hv.(*view), o.PageAddr(p), uintptr(q-p)*core.PageSize); err != nil {
				return fmt.Errorf("rebuild %#x in 4 KiB folios: %w", o.PageAddr(0), err)
			}
		}
	}
	bufs, unstage, err := sess.stageBlock(f, o.FileOff(0))
	if err != nil {
		return err
	}
	defer unstage()
	if err := f.Punch(o.FileOff(0), core.BlockSize); err != nil {
		return fmt.Errorf("rebuild %#x in 4 KiB folios: %w", o.PageAddr(0), err)
	}
	if err := sess.writeFromSlots(o, f, bufs, keep); err != nil {
		sess.srv.logger.Printf("rebuild %#x in 4 KiB folios: %v (the data is lost)", o.PageAddr(0), err)
		return err
	}
	return nil
}
