package server

import (
	"fmt"

	"github.com/softuvm/softuvm/devmem"
	"github.com/softuvm/softuvm/internal/core"
	"github.com/softuvm/softuvm/policy"
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

// folioBlock reports whether the block is a whole, aligned 2 MiB of the
// location files: the only blocks a large folio can hold.
func (o *mover) folioBlock() bool {
	return o.b.pages == core.PagesPerBlock && o.fileOff(0)%devmem.LargeFolioSize == 0
}

// wholeRun reports whether run rn is all of a block that a large folio
// can hold.
func (o *mover) wholeRun(rn run) bool {
	return rn.first == 0 && rn.outer == core.PagesPerBlock && o.folioBlock()
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
		o.b.large.Or(1 << t.dst.Slot())
		done.FillRange(0, core.PagesPerBlock)
		o.wakeTarget(rn, t, addr, span)
		return done, nil
	}
	srcFile, err := o.sess.file(rn.src)
	if err != nil {
		return done, err
	}
	holders, err := o.holdWhole(rn)
	if err != nil {
		return done, err
	}
	defer o.doneWithAll(holders)
	err = o.copyWhole(rn.src, srcFile, t.dst, dstFile, off)
	if err == nil {
		done = fullBlock()
		o.b.large.And(^uint64(1 << rn.src.Slot()))
		o.b.large.Or(1 << t.dst.Slot())
	} else if srcFile.Large() {
		// copyWhole put the block back in one folio: a later partial
		// move must rebuild it first (punchPages).
		o.b.large.Or(1 << rn.src.Slot())
	}
	o.released(rn.src, done)
	o.releaseWhole(holders, addr, span, done.Empty())
	if err == nil {
		o.wakeTarget(rn, t, addr, span)
	}
	return done, err
}

// touching reports whether the view run rn moves into is touching the
// block now: a fault brings it, into the faulting view's mapping. Such
// pages are written into the file as one folio only where the view then
// maps them cheaply: the host's with one UFFDIO_CONTINUE
// (continuesInto), a device's own file with the kernel's minor faults
// (faultsInFromOwnFile); elsewhere they are installed (UFFDIO_COPY). A
// page the file holds but the view does not map costs the view a minor
// fault at its first touch, one per page, since the kernel maps no
// neighbours (fault-around) in a range registered for write-protect
// faults: about 1 us here. (It was measured at 10-13 us while the
// write-protect markers that pages moving away left made each such
// fault a round trip to the server: releaseWhole.)
func (o *mover) touching(rn run, t target) bool {
	return o.cause == policy.CauseFault && rn.mapped && t.via != nil
}

// moveWholeInstalled moves run rn, a whole block that a fault brings
// from a location that may hold it in a large folio, into the faulting
// view: staged, its source punched whole (one folio freed, nothing to
// rebuild), then installed 4 KiB page by page with UFFDIO_COPY, mapped.
// Pages that fail to arrive go back to the source.
func (o *mover) moveWholeInstalled(rn run, t target) (core.PageMask, error) {
	var done core.PageMask
	srcFile, err := o.sess.file(rn.src)
	if err != nil {
		return done, err
	}
	off := o.fileOff(0)
	addr, span := o.pageAddr(0), uintptr(core.BlockSize)
	holders, err := o.holdWhole(rn)
	if err != nil {
		return done, err
	}
	defer o.doneWithAll(holders)
	bufs, unstage, err := o.stageBlock(srcFile, off)
	if err != nil {
		o.release(holders, addr, span, true)
		return done, err
	}
	defer unstage()
	if err := srcFile.Punch(off, core.BlockSize); err != nil {
		o.release(holders, addr, span, true)
		return done, err
	}
	o.sess.srv.afterPunch()
	o.b.large.And(^uint64(1 << rn.src.Slot()))
	for i, b := range bufs {
		got, _, ierr := o.install(t.via, installCopy, i*stagingSlotPages, (i+1)*stagingSlotPages, b, false)
		done.Or(&got)
		if ierr != nil {
			err = ierr
			break
		}
	}
	if err != nil {
		failed := fullBlock()
		failed.AndNot(&done)
		if werr := o.writeFromSlots(srcFile, bufs, failed); werr != nil {
			o.sess.srv.logger.Printf("put back %#x after a failed migration: %v (the data is lost)", addr, werr)
		}
	}
	o.released(rn.src, done)
	o.releaseWhole(holders, addr, span, done.Count() < core.PagesPerBlock)
	return done, err
}

// writeFromSlots writes pages of the block from the staging slots that
// stageBlock filled into f.
func (o *mover) writeFromSlots(f *devmem.File, bufs [][]byte, pages core.PageMask) error {
	for p, q := pages.NextRun(0); p >= 0; p, q = pages.NextRun(q) {
		for x := p; x < q; {
			slot, y := x/stagingSlotPages, min(q, (x/stagingSlotPages+1)*stagingSlotPages)
			b := bufs[slot][(x-slot*stagingSlotPages)*core.PageSize : (y-slot*stagingSlotPages)*core.PageSize]
			if _, err := f.WriteAt(b, o.fileOff(x)); err != nil {
				return err
			}
			x = y
		}
	}
	return nil
}

// holdWhole holds the writers of the whole block in every view that maps
// run rn's source still, for a move of all of it; the caller releases
// them (release) and is done with the views (doneWithAll).
func (o *mover) holdWhole(rn run) ([]*view, error) {
	addr, span := o.pageAddr(0), uintptr(core.BlockSize)
	holders := o.holders(rn.src, 0, core.PagesPerBlock)
	for _, v := range holders {
		if err := o.writeProtect(v, addr, span); err != nil {
			o.release(holders, addr, span, true)
			o.doneWithAll(holders)
			return nil, err
		}
	}
	if rn.src == core.CPU {
		o.auditLeaving(rn, fullBlock())
	}
	return holders, nil
}

func fullBlock() core.PageMask {
	var all core.PageMask
	all.FillRange(0, core.PagesPerBlock)
	return all
}

// wakeTarget wakes the threads of the target's view that wait on the
// block: UFFDIO_COPY would have, and a write into the file does not.
func (o *mover) wakeTarget(rn run, t target, addr, span uintptr) {
	if !rn.mapped || t.via == nil {
		return
	}
	if o.continuesInto(t) {
		// Map the block now rather than let each page fault for it: a
		// fault's threads touch it at once, and after a prefetch to the
		// CPU the host reads without faults, as CUDA's does. Mapping
		// costs a whole-block prefetch to the host about a third of its
		// rate here.
		var pages core.PageMask
		pages.FillRange(rn.first, rn.outer)
		o.continuePages(t.via, pages, rn.first)
		return
	}
	if !o.keepsMarkers(t.via) {
		// Clear the write-protect markers that pages of the block left
		// in this view when they moved away page by page
		// (releaseWhole), which also wakes its threads: the view holds
		// none of the block's pages still, so none is protected for a
		// reason.
		_ = t.via.uffd.WriteProtect(addr, span, false, false)
		return
	}
	_ = t.via.uffd.Wake(addr, span)
}

// faultsInFromOwnFile reports whether a whole block that a fault of
// t's view brings is written into the view's own file as one folio and
// left for the kernel to map, page by page, as the view's threads touch
// it: a device's view, which registers no MINOR faults, faulting on a
// block its own file takes. Each such minor fault costs about 1 us
// here, where installing the page with UFFDIO_COPY allocates it (1.4 us)
// and, when it leaves, frees it alone; one folio is allocated and freed
// whole, and the block leaves the device as one folio, which the host
// takes at several times the rate. Not in ranges that audit prefetched
// pages by their mappings.
func (o *mover) faultsInFromOwnFile(t target) bool {
	return t.via != nil && t.dst != core.CPU && t.via.loc == t.dst && !o.r.trackPrefetch
}

// copyWhole carries the block at off from location from's file src to
// location to's file dst. Where nobody can map the destination's copy
// without asking the server (destinationSealed), the destination is
// written straight from a mapping of the source, and the source punched
// after: one copy of 2 MiB, where carrying it through staging slots made
// two (Prefetch of 1 GiB: 12-18% faster each way). Elsewhere
// the source must go first, for the reason transfer gives, and the
// pages travel through staging slots (copyWholeStaged).
func (o *mover) copyWhole(from core.Device, src *devmem.File, to core.Device, dst *devmem.File, off int64) error {
	if !o.destinationSealed(to) {
		return o.copyWholeStaged(src, dst, off)
	}
	srv := o.sess.srv
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
	srv.staging.markMove(slot, o.sess.id, off, core.BlockSize, from, to)
	// Sealed: nobody sees the destination's pages before the move is
	// done, so several movers may write into one file at once.
	err = dst.WriteBlockUnseen(m.Bytes(), off)
	m.Unmap()
	if err == nil {
		srv.inMove("written", dst, off)
		srv.staging.markCopied(slot)
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

// destinationSealed reports whether no view can map location to's copy
// of the block without a fault the server serves under the block's
// lock: no view maps to's file remotely over it, and to's own view
// registers MINOR faults over its file (continue.go), or, a device with
// no process yet, will when it starts (its userfaultfd has the client's
// features). A page written there before its source is punched is then
// unseen until the move is done. Where to's view maps present pages by
// itself, it is not.
func (o *mover) destinationSealed(to core.Device) bool {
	for l := range o.b.resident {
		if loc := core.DeviceAtSlot(l); loc != to && o.mayMap(loc, to, 0, o.b.pages) {
			return false
		}
	}
	v := o.viewOf(to)
	if v == nil {
		c := o.sess.client()
		return to != core.CPU && c != nil && o.sess.deviceMinor(to, c.uffd)
	}
	defer o.doneWith(v)
	return o.viewContinues(v)
}

// copyWholeStaged carries the block at off from src to dst through
// staging slots: read into them (they record the intent, staging.go,
// since between the punch and the write the pages are only there),
// punch the source, write the destination. On a failed write the
// destination is punched and the source written back.
func (o *mover) copyWholeStaged(src, dst *devmem.File, off int64) error {
	bufs, unstage, err := o.stageBlock(src, off)
	if err != nil {
		return err
	}
	defer unstage()
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

// stageBlock reads the 2 MiB of f at off into staging slots and records
// in each the intent to punch its source (staging.go), so that a server
// that dies before the pages are back in a file loses none of them. A
// hole reads as zeros, and a new server writes back only pages that no
// location file holds. unstage voids the intents and returns the slots.
func (o *mover) stageBlock(f *devmem.File, off int64) (bufs [][]byte, unstage func(), err error) {
	area := o.sess.srv.staging
	const slots = core.BlockSize / stagingSlotBytes
	bufs = make([][]byte, 0, slots)
	unstage = func() {
		for _, b := range bufs {
			area.clear(b)
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
		if _, err := f.ReadAt(b, off+int64(i)*stagingSlotBytes); err != nil {
			unstage()
			return nil, nil, err
		}
	}
	for i, b := range bufs {
		area.mark(b, o.sess.id, off+int64(i)*stagingSlotBytes, stagingSlotBytes)
	}
	return bufs, unstage, nil
}

// punchPages frees location l's copies of pages [first, outer) from its
// file f. Where l may hold the block in a large folio, part of it is
// never punched: the kernel zeroes the punched part of a large folio
// before it tries to split it, and where the split fails (a passing
// reference: a fault mapping another page of it, a folio still in a
// per-CPU LRU batch) it keeps the zeroed pages, which any mapping of the
// file then reads as zeros without faulting until a retry succeeds. A
// reader of l's copy would read zeros where its data had just left (the
// fork stress test did). So the block is rebuilt in 4 KiB folios
// instead, which punches the whole 2 MiB, a whole folio that leaves
// whole.
func (o *mover) punchPages(l core.Device, f *devmem.File, first, outer int) error {
	off, length := o.fileOff(first), int64(outer-first)*core.PageSize
	if !o.mayBeLarge(l) {
		return f.PunchSmallFolios(off, length)
	}
	if first == 0 && outer == o.b.pages {
		err := f.Punch(off, length)
		if err == nil {
			o.b.large.And(^uint64(1 << l.Slot()))
		}
		return err
	}
	return o.breakLarge(l, f, first, outer)
}

// breakLarge rebuilds location l's copy of the block in 4 KiB folios,
// without pages [first, outer) (none where first == outer), which the
// caller holds and which leave l. Done before a partial move out of a
// block l may hold in a large folio (punchPages says why).
func (o *mover) breakLarge(l core.Device, f *devmem.File, first, outer int) error {
	o.sess.srv.foliosRebuilt.Add(1)
	if err := o.rebuildBlock(l, f, first, outer); err != nil {
		return err
	}
	o.b.large.And(^uint64(1 << l.Slot()))
	return nil
}

// largeElsewhere reports whether the whole block lives at one location
// other than m that may hold it in a large folio, m's file takes large
// folios, and m can take the block (wholeFits): a move of the whole block
// to m would be one folio, where pieces of it would first rebuild the
// rest of the folio in 4 KiB folios, which costs more than the move.
func (o *mover) largeElsewhere(m core.Device) bool {
	b := o.b
	if b.large.Load() == 0 || !o.folioBlock() || !o.wholeFits(m) {
		return false
	}
	if f, err := o.sess.file(m); err != nil || !f.Large() {
		return false
	}
	holder, whole := b.resident.SoleHolder(b.pages)
	return whole && holder != m && o.mayBeLarge(holder)
}

// wholeFits reports whether location m can take a whole block that a
// fault did not ask for all of. A device must have room without
// evicting: its capacity is hard, and evicting a whole block for pages
// nobody asked for can leave the fault itself without room; where it is
// full, the fault moves what it would have without large folios. The
// host's budget is soft: pages over it leave after the move (overBudget),
// to the device with the most room, so the host takes the block while a
// device can take what the budget then pushes out. Under
// oversubscription the host is always at its budget, and refusing there
// made every fault into a block that an eviction had moved whole rebuild
// it in 4 KiB folios (a third of the server's time in `uvm bench
// oversub`).
func (o *mover) wholeFits(m core.Device) bool {
	srv := o.sess.srv
	if srv.roomFor(m, core.BlockSize) {
		return true
	}
	if m != core.CPU {
		return false
	}
	_, ok := srv.roomiestDevice(core.PagesPerBlock)
	return ok
}

// mayBeLarge reports whether location l's file may hold the block in a
// large folio: l took it whole (or adopted it), and the block is a whole,
// aligned 2 MiB of the file, since a 2 MiB folio is made only by a
// block that moves whole (wholeRun).
func (o *mover) mayBeLarge(l core.Device) bool {
	return o.b.large.Load()&(1<<l.Slot()) != 0 && o.folioBlock()
}

// rebuildBlock makes location l's copy of the block 4 KiB folios,
// without pages [first, outer), which leave l: with l's other pages held
// still in every view that maps them, it reads them, punches the whole
// 2 MiB and writes them back, which puts them in 4 KiB folios (WriteAt
// fills them whole before they enter the file). Meanwhile readers of
// them fault, and wait for the block.
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
	// Its own slice: the caller (a move's punch) still holds the
	// mover's scratch set, which it releases after.
	holders := o.holdersInto(nil, l, 0, o.b.pages)
	defer o.doneWithAll(holders)
	// Every page but [first, outer), which the caller holds; pages with
	// several copies stay protected after (readdup.go).
	var others, stayProtected core.PageMask
	others.FillRange(0, o.b.pages)
	others.AndNot(&gone)
	stayProtected = o.b.duplicated()
	defer func() {
		writable := others
		writable.AndNot(&stayProtected)
		for _, v := range holders {
			for p, q := writable.NextRun(0); p >= 0; p, q = writable.NextRun(q) {
				_ = v.uffd.WriteProtect(o.pageAddr(p), uintptr(q-p)*core.PageSize, false, false)
			}
		}
	}()
	for _, v := range holders {
		for p, q := others.NextRun(0); p >= 0; p, q = others.NextRun(q) {
			if err := o.writeProtect(v, o.pageAddr(p), uintptr(q-p)*core.PageSize); err != nil {
				return fmt.Errorf("rebuild %#x in 4 KiB folios: %w", o.pageAddr(0), err)
			}
		}
	}
	bufs, unstage, err := o.stageBlock(f, o.fileOff(0))
	if err != nil {
		return err
	}
	defer unstage()
	if err := f.Punch(o.fileOff(0), core.BlockSize); err != nil {
		return fmt.Errorf("rebuild %#x in 4 KiB folios: %w", o.pageAddr(0), err)
	}
	if err := o.writeFromSlots(f, bufs, keep); err != nil {
		o.sess.srv.logger.Printf("rebuild %#x in 4 KiB folios: %v (the data is lost)", o.pageAddr(0), err)
		return err
	}
	return nil
}
