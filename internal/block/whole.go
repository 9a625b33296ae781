package block

import (
	"github.com/softuvm/softuvm/devmem"
	"github.com/softuvm/softuvm/internal/core"
	"github.com/softuvm/softuvm/policy"
)

// Whole-block moves. Where location files take large folios, a block
// that moves whole, all of its pages from one location to another, goes
// into its destination's file as one 2 MiB folio (Memory.CopyWhole): one
// folio allocated and (where the source was one) one freed, instead of
// 512 of each. A block never touched that arrives whole is one write of
// zeros. Everything smaller keeps the 4 KiB path (mover.go), so one
// faulted page still moves 4 KiB, and residency, advice and statistics
// stay per page.
//
// The engine decides which way a whole block goes and keeps the record
// of which files may hold it in one folio (Block.large): a partial punch
// of a large folio zeroes the punched pages before the kernel tries to
// split it, and where the split fails the zeroed pages stay readable
// without a fault, so part of a block that may be one folio is never
// punched: the block is rebuilt in 4 KiB folios first (breakLarge).

// folioBlock reports whether the block is a whole, aligned 2 MiB of the
// location files: the only blocks a large folio can hold.
func (o *Mover) folioBlock() bool {
	return o.B.Pages == core.PagesPerBlock && o.FileOff(0)%devmem.LargeFolioSize == 0
}

// wholeRun reports whether run rn is all of a block that a large folio
// can hold.
func (o *Mover) wholeRun(rn Run) bool {
	return rn.First == 0 && rn.Outer == core.PagesPerBlock && o.folioBlock()
}

// mayBeLarge reports whether location l's file may hold the block in a
// large folio: l took it whole (or adopted it), and the block is a whole,
// aligned 2 MiB of the file, since a 2 MiB folio is made only by a
// block that moves whole (wholeRun).
func (o *Mover) mayBeLarge(l core.Device) bool {
	return o.B.MayBeLargeAt(l) && o.folioBlock()
}

func (b *Block) setLarge(l core.Device)   { b.large.Or(1 << l.Slot()) }
func (b *Block) clearLarge(l core.Device) { b.large.And(^uint64(1 << l.Slot())) }

func fullBlock() core.PageMask {
	var all core.PageMask
	all.FillRange(0, core.PagesPerBlock)
	return all
}

// moveWhole moves run rn, a whole block, to t.Dst's file as one large
// folio; through t.Via, the faulting threads of that view are woken
// (they fault the pages from the file), or the block is mapped into it
// (wakeTarget). It returns the pages moved: all or none.
func (o *Mover) moveWhole(rn Run, t Target) (core.PageMask, error) {
	var done core.PageMask
	mem := o.space()
	if !rn.Populated {
		if err := mem.Allocate(o, t.Dst, 0, core.PagesPerBlock); err != nil {
			return done, err
		}
		o.B.setLarge(t.Dst)
		done = fullBlock()
		o.wakeTarget(rn, t)
		return done, nil
	}
	srcLarge, err := mem.LargeFile(rn.Src)
	if err != nil {
		return done, err
	}
	holders, err := o.holdWhole(rn)
	if err != nil {
		return done, err
	}
	defer o.DoneWithAll(holders)
	err = mem.CopyWhole(o, rn.Src, t.Dst, o.destinationSealed(t.Dst))
	if err == nil {
		done = fullBlock()
		o.B.clearLarge(rn.Src)
		o.B.setLarge(t.Dst)
		o.emit(Event{Kind: EvWholeMove, From: rn.Src, To: t.Dst, Pages: done})
	} else if srcLarge {
		// The block went back in one folio: a later partial move must
		// rebuild it first (PunchPages).
		o.B.setLarge(rn.Src)
	}
	o.Released(rn.Src, done)
	o.releaseWhole(holders, done.Empty())
	if err == nil {
		o.wakeTarget(rn, t)
	}
	return done, err
}

// touching reports whether the view run rn moves into is touching the
// block now: a fault brings it, into the faulting view's mapping. Such
// pages are written into the file as one folio only where the view then
// maps them cheaply: the host's with one Continue (continuesInto), a
// device's own file with the kernel's minor faults
// (faultsInFromOwnFile); elsewhere they are installed. A page the file
// holds but the view does not map costs the view a minor fault at its
// first touch, one per page, since the kernel maps no neighbours
// (fault-around) in a range registered for write-protect faults.
func (o *Mover) touching(rn Run, t Target) bool {
	return o.Cause == policy.CauseFault && rn.Mapped && t.Via != nil
}

// moveWholeInstalled moves run rn, a whole block that a fault brings
// from a location that may hold it in a large folio, into the faulting
// view: staged, its source punched whole (one folio freed, nothing to
// rebuild), then installed 4 KiB page by page, mapped. Pages that fail
// to arrive go back to the source.
func (o *Mover) moveWholeInstalled(rn Run, t Target) (core.PageMask, error) {
	holders, err := o.holdWhole(rn)
	if err != nil {
		return core.PageMask{}, err
	}
	defer o.DoneWithAll(holders)
	done, punched, err := o.space().InstallWhole(o, rn.Src, t.Via)
	if punched {
		o.B.clearLarge(rn.Src)
	}
	o.Released(rn.Src, done)
	o.releaseWhole(holders, done.Count() < core.PagesPerBlock)
	return done, err
}

// holdWhole holds the writers of the whole block in every view that maps
// run rn's source still, for a move of all of it; the caller releases
// them (releaseWhole) and is done with the views (DoneWithAll).
func (o *Mover) holdWhole(rn Run) ([]View, error) {
	holders, err := o.hold(rn.Src, 0, core.PagesPerBlock)
	if err != nil {
		return nil, err
	}
	if rn.Src == core.CPU {
		o.auditBlock(fullBlock(), true)
	}
	return holders, nil
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
func (o *Mover) releaseWhole(holders []View, stayed bool) {
	for _, v := range holders {
		if stayed || !o.keepsMarkers(v) {
			o.space().Unprotect(o, v, 0, o.B.Pages)
		} else {
			o.space().Wake(o, v, 0, o.B.Pages)
		}
	}
}

// keepsMarkers reports whether write-protect markers are left in view v
// (releaseWhole): where Continue maps what comes back into the view (it
// maps over a marker; clearing the host view's cost a whole-block
// prefetch to a device a tenth of its rate), and the host view's under
// the launch coherence model, where its protection is its dirty
// tracking.
func (o *Mover) keepsMarkers(v View) bool {
	return v.Processor() == core.CPU && o.space().LaunchModel() || o.space().Continues(o.R, v)
}

// wakeTarget wakes the threads of the target's view that wait on the
// block: an install would have, and a write into the file does not.
func (o *Mover) wakeTarget(rn Run, t Target) {
	if !rn.Mapped || t.Via == nil {
		return
	}
	if o.continuesInto(t) {
		// Map the block now rather than let each page fault for it: a
		// fault's threads touch it at once, and after a prefetch to the
		// CPU the host reads without faults, as CUDA's does.
		var pages core.PageMask
		pages.FillRange(rn.First, rn.Outer)
		o.continuePages(t.Via, pages, rn.First)
		return
	}
	if !o.keepsMarkers(t.Via) {
		// Clear the write-protect markers that pages of the block left
		// in this view when they moved away page by page
		// (releaseWhole), which also wakes its threads: the view holds
		// none of the block's pages still, so none is protected for a
		// reason.
		o.space().Unprotect(o, t.Via, 0, o.B.Pages)
		return
	}
	o.space().Wake(o, t.Via, 0, o.B.Pages)
}

// faultsInFromOwnFile reports whether a whole block that a fault of
// t's view brings is written into the view's own file as one folio and
// left for the kernel to map, page by page, as the view's threads touch
// it: a device's view, which registers no MINOR faults, faulting on a
// block its own file takes. One folio is allocated and freed whole, and
// the block leaves the device as one folio, which the host takes at
// several times the rate. Not in ranges that audit prefetched pages by
// their mappings.
func (o *Mover) faultsInFromOwnFile(t Target) bool {
	return t.Via != nil && t.Dst != core.CPU && t.Via.Processor() == t.Dst && !o.R.TrackPrefetch
}

// continuesInto reports whether pages written into t's destination file
// are mapped into its view with Continue: the view maps its own file
// there and registers MINOR faults over it.
func (o *Mover) continuesInto(t Target) bool {
	return t.Via != nil && t.Via.Processor() == t.Dst && o.space().Continues(o.R, t.Via)
}

// destinationSealed reports whether no view can map location to's copy
// of the block without a fault served under the block's lock: no view
// maps to's file remotely over it, and to's own view registers MINOR
// faults over its file, or, a device with no process yet, will when it
// starts. A page written there before its source is punched is then
// unseen until the move is done. Where to's view maps present pages by
// itself, it is not.
func (o *Mover) destinationSealed(to core.Device) bool {
	for l := range o.B.Resident {
		if loc := core.DeviceAtSlot(l); loc != to && o.mayMap(loc, to, 0, o.B.Pages) {
			return false
		}
	}
	v := o.ViewOf(to)
	if v == nil {
		return to != core.CPU && o.space().WillContinue(to)
	}
	defer o.DoneWith(v)
	return o.space().Continues(o.R, v)
}

// PunchPages frees location l's copies of pages [first, outer). Where l
// may hold the block in a large folio, part of it is never punched: the
// kernel zeroes the punched part of a large folio before it tries to
// split it, and where the split fails (a passing reference: a fault
// mapping another page of it, a folio still in a per-CPU LRU batch) it
// keeps the zeroed pages, which any mapping of the file then reads as
// zeros without faulting until a retry succeeds. So the block is rebuilt
// in 4 KiB folios instead, which punches the whole 2 MiB, a whole folio
// that leaves whole.
func (o *Mover) PunchPages(l core.Device, first, outer int) error {
	if !o.mayBeLarge(l) {
		return o.space().Punch(o, l, first, outer, false)
	}
	if first == 0 && outer == o.B.Pages {
		err := o.space().Punch(o, l, first, outer, true)
		if err == nil {
			o.B.clearLarge(l)
		}
		return err
	}
	return o.breakLarge(l, first, outer)
}

// breakLarge rebuilds location l's copy of the block in 4 KiB folios,
// without pages [first, outer) (none where first == outer), which the
// caller holds and which leave l. Done before a partial move out of a
// block l may hold in a large folio (PunchPages says why).
func (o *Mover) breakLarge(l core.Device, first, outer int) error {
	o.emit(Event{Kind: EvRebuilt, From: l})
	// Its own slice: the caller (a move's punch) still holds the
	// mover's scratch set.
	holders := o.HoldersInto(nil, l, 0, o.B.Pages)
	defer o.DoneWithAll(holders)
	if err := o.space().Rebuild(o, l, first, outer, holders); err != nil {
		return err
	}
	o.B.clearLarge(l)
	return nil
}

// largeElsewhere reports whether the whole block lives at one location
// other than m that may hold it in a large folio, m's file takes large
// folios, and m can take the block (wholeFits): a move of the whole block
// to m would be one folio, where pieces of it would first rebuild the
// rest of the folio in 4 KiB folios, which costs more than the move.
func (o *Mover) largeElsewhere(m core.Device) bool {
	b := o.B
	if b.large.Load() == 0 || !o.folioBlock() || !o.wholeFits(m) {
		return false
	}
	if large, err := o.space().LargeFile(m); err != nil || !large {
		return false
	}
	holder, whole := b.Resident.SoleHolder(b.Pages)
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
func (o *Mover) wholeFits(m core.Device) bool {
	e := o.eng()
	if e.RoomFor(m, core.BlockSize) {
		return true
	}
	if m != core.CPU {
		return false
	}
	_, ok := e.roomiestDevice(core.PagesPerBlock)
	return ok
}
