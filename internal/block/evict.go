package block

import (
	"fmt"
	"time"

	"github.com/softuvm/softuvm/internal/core"
	"github.com/softuvm/softuvm/policy"
)

// evictPages moves the block's pages of pages, resident at from, to their
// eviction destination, but for those protected there unless demote
// (workingset.go), and stamps those that left for their refaults. The
// block's lock is held.
func evictPages(v Ref, from core.Device, pages core.PageMask, demote bool) int64 {
	e := v.R.eng
	pages.And(&v.B.Resident[from.Slot()])
	if !demote {
		protected := e.ws.Protected(&v.B.ws, from.Slot())
		pages.AndNot(&protected)
	}
	n := int64(pages.Count())
	if n == 0 || v.R.Freed.Load() {
		return 0
	}
	if from == core.CPU && v.R.Space.LaunchModel() && !v.R.Space.LaunchLocked(v.R) {
		// Under the launch model the CPU's writes to its copies are not
		// seen until a launch reads them (wp-async does not hold a
		// writer while a page is copied away): host pages of memory the
		// CPU may touch leave only at a launch.
		return 0
	}
	dst := core.CPU
	if from == core.CPU {
		var ok bool
		if dst, ok = e.roomiestDevice(n); !ok {
			return 0
		}
	}
	op := v.R.NewMover(v.I, v.B)
	op.Cause = policy.CauseEviction
	held := v.B.Resident[from.Slot()]
	before := held.Count()
	// Read-duplicated pages (advice, or clean eviction's copies:
	// clean.go) with a copy elsewhere just lose this one, each to its
	// first other holder: nothing is copied.
	dup := v.B.Duplicated()
	dup.And(&pages)
	if from == core.CPU && v.R.Space.LaunchModel() && !dup.Empty() {
		// Under the launch model the CPU writes its copies without a
		// fault: a write is found only when a launch hands the range
		// off (HandOff), and a launch that locked the range may evict
		// it before its hand-off reached it. A host copy is never older
		// than a device's (a device's write drops the others), so the
		// host's copy is the one kept, and it moves like any other.
		op.CollapseTo(core.CPU, dup)
		dup = core.PageMask{}
	}
	clean := 0
	if !dup.Empty() {
		left := dup
		for l := range v.B.Resident {
			keep := core.DeviceAtSlot(l)
			x := left
			x.And(&v.B.Resident[l])
			if keep == from || x.Empty() {
				continue
			}
			op.CollapseTo(keep, x)
			left.AndNot(&x)
		}
		pages.AndNot(&dup)
		clean = dup.Count()
	}
	if err := op.moveToUnmapped(dst, pages); err != nil {
		e.cfg.Logf("evict %#x from %v: %v", op.BlockAddr, from, err)
	}
	evicted := int64(before - v.B.Resident[from.Slot()].Count())
	gone := held
	gone.AndNot(&v.B.Resident[from.Slot()])
	e.ws.Evicted(&v.B.ws, from.Slot(), e.locs, gone)
	if evicted > 0 {
		op.emit(Event{Kind: EvEvicted, First: gone.NextSet(0), Pages: gone, From: from, To: dst, Clean: clean})
	}
	return evicted
}

// Reserve reserves capacity on device location dst for need pages,
// evicting other blocks' pages to the host if the arena is full, and
// then, where no other block gives room, the mover's own block's pages
// on dst other than those of keep (the pages this move brings or
// needs). Once the pages are accounted (the eviction policy told) or
// the unused part released, the caller calls Settled(dst).
func (o *Mover) Reserve(dst core.Device, need int64, keep core.PageMask) error {
	err := o.ReserveOrEvict(dst, need, keep)
	if err == nil {
		o.eng().reserving[dst].Add(1)
	}
	return err
}

// Settled ends what Reserve(dst, ...) began: the reserved pages are
// resident and listed, or released.
func (o *Mover) Settled(dst core.Device) {
	o.eng().reserving[dst].Add(-1)
}

// ReserveOrEvict is Reserve without the bookkeeping of moves in flight:
// device memory keeps what it reserves, unlisted, for its life. A mover
// with no block (an allocation of device memory) evicts others' pages
// only.
func (o *Mover) ReserveOrEvict(dst core.Device, need int64, keep core.PageMask) error {
	e := o.eng()
	arena := e.cfg.Arenas[dst]
	o.keep = keep
	err := arena.Reserve(need)
	if err == nil || !isFull(err) {
		return err
	}
	// Blocks that others hold (threads of a kernel faulting on several
	// blocks at once, a prefetch moving some) are busy only for as long
	// as their move, and the room an eviction makes can be taken by
	// another thread's reservation before this one's: while eviction
	// found blocks locked or freed some pages, wait a little and try
	// again rather than fail a fault that a moment later could have been
	// served. Only then, or with nothing left to evict and no other
	// reservation in flight, it fails.
	//
	// Waiting alone can deadlock: where every block holding pages on dst
	// is held by a mover that waits for room there (two kernel threads
	// and a prefetch, each on its own block, on a device that their
	// blocks fill), none of them ever finds a victim. A mover that
	// finds none gives up its own block's other pages on dst, as a
	// working set inside one block must anyway (as overBudget does for
	// the host).
	started := time.Now()
	wait, retry := time.Duration(e.mech.EvictWait), time.Duration(e.mech.EvictRetry)
	o.releaseProtections(dst)
	for {
		moved, busy := o.evict(dst, need)
		err := arena.Reserve(need)
		if err == nil {
			return nil
		}
		if moved == 0 {
			// Only where no other block gave anything: a round that
			// freed some but not all of need may have left enough
			// beside what was free, and the mover's own pages are the
			// ones its threads are using.
			moved = o.lastResort(dst, need, keep)
			if moved > 0 && arena.Reserve(need) == nil {
				return nil
			}
		}
		// With nothing evictable and no other move holding room it
		// has not yet accounted (a block arriving for the first time,
		// which no eviction list shows), the arena is full for good.
		if !busy && moved == 0 && e.reserving[dst].Load() == 0 {
			return fmt.Errorf("%w: %v (every other block on the device is in use)", core.ErrMemoryAllocation, err)
		}
		if time.Since(started) > wait {
			return fmt.Errorf("%w: %v (other blocks stayed busy, or took the room evicted for this one, for %v)", core.ErrMemoryAllocation, err, wait)
		}
		time.Sleep(retry)
	}
}

// evictOwn evicts up to want of the mover's own block's pages on
// location from, other than those of keep, oldest first (evictPages:
// to the host from a device, to a device from the host), and returns
// how many left: where no other block gives room, for a device's
// reservation (ReserveOrEvict) and for the host's budget (overBudget).
// Pages protected there go only with demote, and only where no other
// is left. The block's lock is held.
func (o *Mover) evictOwn(from core.Device, want int64, keep core.PageMask, demote bool) int64 {
	e := o.eng()
	if o.B == nil || o.R.Kind == core.KindDevice || o.Cause == policy.CauseEviction || e.cfg.OwnVictims {
		// No block of its own (an allocation), device memory (no other
		// home), an eviction's own move, whose pages at its destination
		// would only go back where it is emptying, or an oracle, which
		// takes what it likes through evict.
		return 0
	}
	pages := o.B.Resident[from.Slot()]
	pages.AndNot(&keep)
	// The pages it does not protect first; the protected ones only
	// where nothing else is left (a working set inside one block larger
	// than the processor's core).
	protected := e.ws.Protected(&o.B.ws, from.Slot())
	unprotected := pages
	unprotected.AndNot(&protected)
	victims := e.ws.OldestPages(&o.B.ws, from.Slot(), unprotected, int(want))
	if !unprotected.Empty() {
		demote = false
	} else if demote {
		victims = e.ws.OldestPages(&o.B.ws, from.Slot(), pages, int(want))
	}
	if victims.Empty() {
		return 0
	}
	n := evictPages(Ref{R: o.R, I: o.blockIndex(), B: o.B}, from, victims, demote)
	if demote && n > 0 {
		o.emit(Event{Kind: EvDemoted, Processor: from, N: int(n)})
	}
	return n
}

// evict moves the pages the eviction policy names off location from (to
// the host for a device, to a device for the host) until want pages are
// free there, and returns the pages it moved and whether it skipped
// blocks other threads hold. Blocks whose lock is held (the mover's own,
// blocks other threads are serving) are skipped: waiting for them here
// could deadlock.
func (o *Mover) evict(from core.Device, want int64) (moved int64, busy bool) {
	e := o.eng()
	if e.cfg.OwnVictims {
		saved, savedKeep := e.sparing, e.sparingKeep
		e.sparing, e.sparingKeep = o.B, o.keep
		defer func() { e.sparing, e.sparingKeep = saved, savedKeep }()
	}
	var buf [32]policy.Victim
	for round := 0; moved < want && round < e.mech.EvictRounds; round++ {
		victims := policy.AskVictims(e.pol.Eviction, e.pol.PageEviction, from, want-moved, buf[:0])
		if len(victims) == 0 {
			break
		}
		progress, own := false, false
		for _, vic := range victims {
			v, ok := RefOf(vic.Block)
			if !ok {
				e.Emit(Event{Kind: EvBadVictim})
				continue // not one of this engine's blocks: a policy's mistake
			}
			if moved >= want {
				break
			}
			pages := vic.Pages
			if v.B == o.B {
				if !e.cfg.OwnVictims {
					own = true
					continue
				}
				// The oracle may take the block being served, all but
				// the pages the move brings (o.keep).
				pages.AndNot(&o.keep)
			} else if !v.B.TryLock() {
				busy = true
				continue
			}
			pages.And(&v.B.Resident[from.Slot()])
			var n int64
			if freed := v.R.Freed.Load(); freed || pages.Empty() {
				// Gone since the policy last heard: it forgets them.
				ev := Event{Kind: EvDelisted, R: v.R, B: v.B, Block: v.I, Processor: from, Pages: vic.Pages, None: freed}
				if !freed {
					ev.None = v.B.noneEvictable(e, from)
				}
				if e.pol.PageEviction == nil {
					ev.Pages = core.PageMask{}
				}
				e.Emit(ev)
			} else {
				n = evictPages(v, from, pages, false)
			}
			if v.B != o.B {
				v.B.Unlock()
			}
			if n > 0 {
				progress = true
				moved += n
			}
		}
		// A policy that chooses pages sends the mover's own regions,
		// offered first, to the back of its queues: the next round
		// offers others. One that chooses blocks offers the same again.
		if !progress && (!own || e.pol.PageEviction == nil) {
			break
		}
	}
	return moved, busy
}

// overBudget moves host pages to devices while the host holds more than
// the host budget. It runs after pages arrived on the host, those of
// keep, which stay.
func (o *Mover) overBudget(keep core.PageMask) {
	e := o.eng()
	want := core.PagesOverBudget(e.hostPages.Load(), e.cfg.HostBudget)
	if want == 0 {
		return
	}
	o.keep = keep
	o.releaseProtections(core.CPU)
	moved, _ := o.evict(core.CPU, want) // the budget is soft: busy blocks go next time
	if moved >= want {
		return
	}
	if e.devicesFull() {
		// The victims had nowhere to go: the budget waits until a
		// block's worth of room appears. The block's own pages would
		// fit in the few pages that a move back to the host just freed,
		// but they are the pages the program is using: taking them, a
		// page each fault, made a program larger than the budget and
		// the arenas together fault on nearly every write
		// (TestHostBudgetBeyondTheArena).
		return
	}
	// No other block can give more: the budget is below what this block
	// holds on the host (a working set inside one block). Its other host
	// pages go, never those this move just brought.
	o.lastResort(core.CPU, want-moved, keep)
}

// lastResort frees up to want pages on from where the eviction policy
// offered too few: the mover's own block's pages there that it does not
// protect (never those of keep), then protected pages of other blocks,
// the oldest protections first, then its own protected pages. The core
// is kept below what the processor holds, so protections give way
// rarely: where a working set inside one block is larger than the
// processor, or the pages that could go are busy. It returns how many
// left.
func (o *Mover) lastResort(from core.Device, want int64, keep core.PageMask) int64 {
	moved := o.evictOwn(from, want, keep, false)
	if moved < want {
		moved += o.evictProtected(from, want-moved)
	}
	if moved < want {
		moved += o.evictOwn(from, want-moved, keep, true)
	}
	return moved
}

// Sparing returns, while an eviction that may take its own block's pages
// asks for victims (Config.OwnVictims: one thread), the block whose move
// evicts and the pages that move brings, which stay: the lab's oracle
// leaves them out of what it offers.
func (e *Engine) Sparing() (*Block, core.PageMask) { return e.sparing, e.sparingKeep }
