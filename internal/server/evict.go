package server

import (
	"errors"
	"fmt"
	"time"

	"github.com/softuvm/softuvm/devmem"
	"github.com/softuvm/softuvm/internal/core"
	"github.com/softuvm/softuvm/policy"
	"github.com/softuvm/softuvm/trace"
)

// blockRef names a block of a range.
type blockRef struct {
	r *managedRange
	i int
	b *block
}

// evictWait bounds how long a reservation waits for busy blocks to be
// free to evict.
const evictWait = time.Second

// evictPages moves the block's pages of pages, resident at from, to their
// eviction destination, but for those protected there unless demote
// (workingset.go), and stamps those that left for their refaults. The
// block's lock is held.
func evictPages(v blockRef, from core.Device, pages core.PageMask, demote bool) int64 {
	srv := v.r.sess.srv
	pages.And(&v.b.resident[from.Slot()])
	if !demote {
		protected := srv.ws.Protected(&v.b.ws, from.Slot())
		pages.AndNot(&protected)
	}
	n := int64(pages.Count())
	if n == 0 || v.r.freed.Load() {
		return 0
	}
	first := pages.NextSet(0)
	if from == core.CPU && v.r.sess.launch != nil {
		if locked, _ := v.r.sess.launch.launchLocked(v.r); !locked {
			// Under the launch model the CPU's writes to its copies are
			// not seen until a launch reads them (wp-async does not
			// hold a writer while a page is copied away): host pages of
			// memory the CPU may touch leave only at a launch.
			return 0
		}
	}
	dst := core.CPU
	if from == core.CPU {
		var ok bool
		if dst, ok = srv.roomiestDevice(n); !ok {
			return 0
		}
	}
	op := mover{sess: v.r.sess, r: v.r, b: v.b, blockAddr: v.r.start + uintptr(v.i)*core.BlockSize, cause: policy.CauseEviction}
	held := v.b.resident[from.Slot()]
	before := held.Count()
	// Read-duplicated pages (advice, or clean eviction's copies:
	// clean.go) with a copy elsewhere just lose this one, each to its
	// first other holder: nothing is copied.
	dup := v.b.duplicated()
	dup.And(&pages)
	if !dup.Empty() {
		left := dup
		for l := range v.b.resident {
			keep := core.DeviceAtSlot(l)
			x := left
			x.And(&v.b.resident[l])
			if keep == from || x.Empty() {
				continue
			}
			op.collapseTo(keep, x)
			left.AndNot(&x)
		}
		pages.AndNot(&dup)
		if from == core.CPU {
			v.r.stats.EvictedClean.Add(uint64(dup.Count()))
		}
	}
	if err := op.moveToUnmapped(dst, pages); err != nil {
		srv.logger.Printf("evict %#x from %v: %v", op.blockAddr, from, err)
	}
	evicted := int64(before - v.b.resident[from.Slot()].Count())
	gone := held
	gone.AndNot(&v.b.resident[from.Slot()])
	srv.ws.Evicted(&v.b.ws, from.Slot(), srv.locations(), gone)
	v.r.stats.Evicted[from.Slot()].Add(uint64(evicted))
	if evicted > 0 && v.r.sess.tracing() {
		v.r.sess.tracePages(trace.KindEviction, v.r, op.pageAddr(first), int(evicted), from)
	}
	return evicted
}

// blockIndex is the mover's block's index in its range.
func (o *mover) blockIndex() int { return int((o.blockAddr - o.r.start) >> core.BlockShift) }

// reserve reserves capacity on device location dst for need pages,
// evicting other blocks' pages to the host if the arena is full, and
// then, where no other block gives room, the mover's own block's pages
// on dst other than those of keep (the pages this move brings or
// needs). Once the pages are accounted (the eviction policy told) or
// the unused part released, the caller calls settled(dst).
func (o *mover) reserve(dst core.Device, need int64, keep core.PageMask) error {
	err := o.reserveOrEvict(dst, need, keep)
	if err == nil {
		o.sess.srv.reserving[dst].Add(1)
	}
	return err
}

// settled ends what reserve(dst, ...) began: the reserved pages are
// resident and listed, or released.
func (o *mover) settled(dst core.Device) {
	o.sess.srv.reserving[dst].Add(-1)
}

// reserveOrEvict is reserve without the bookkeeping of moves in flight:
// device memory keeps what it reserves, unlisted, for its life.
func (o *mover) reserveOrEvict(dst core.Device, need int64, keep core.PageMask) error {
	arena := o.sess.srv.arenas[dst]
	err := arena.Reserve(need)
	if err == nil || !errors.Is(err, devmem.ErrArenaFull) {
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
		if !busy && moved == 0 && o.sess.srv.reserving[dst].Load() == 0 {
			return fmt.Errorf("%w: %v (every other block on the device is in use)", core.ErrMemoryAllocation, err)
		}
		if time.Since(started) > evictWait {
			return fmt.Errorf("%w: %v (other blocks stayed busy, or took the room evicted for this one, for %v)", core.ErrMemoryAllocation, err, evictWait)
		}
		time.Sleep(50 * time.Microsecond)
	}
}

// evictOwn evicts up to want of the mover's own block's pages on
// location from, other than those of keep, lowest first (evictPages:
// to the host from a device, to a device from the host), and returns
// how many left: where no other block gives room, for a device's
// reservation (reserveOrEvict) and for the host's budget (overBudget).
// Pages protected there go only with demote, and only where no other
// is left. The block's lock is held.
func (o *mover) evictOwn(from core.Device, want int64, keep core.PageMask, demote bool) int64 {
	if o.b == nil || o.r.kind == core.KindDevice || o.cause == policy.CauseEviction {
		// No block of its own (an allocation), device memory (no other
		// home), or an eviction's own move, whose pages at its
		// destination would only go back where it is emptying.
		return 0
	}
	pages := o.b.resident[from.Slot()]
	pages.AndNot(&keep)
	// The pages it does not protect first; the protected ones only
	// where nothing else is left (a working set inside one block larger
	// than the processor's core).
	protected := o.sess.srv.ws.Protected(&o.b.ws, from.Slot())
	unprotected := pages
	unprotected.AndNot(&protected)
	ws := o.sess.srv.ws
	victims := ws.OldestPages(&o.b.ws, from.Slot(), unprotected, int(want))
	if !unprotected.Empty() {
		demote = false
	} else if demote {
		victims = ws.OldestPages(&o.b.ws, from.Slot(), pages, int(want))
	}
	if victims.Empty() {
		return 0
	}
	n := evictPages(blockRef{r: o.r, i: o.blockIndex(), b: o.b}, from, victims, demote)
	if demote {
		o.r.stats.Demoted[from.Slot()].Add(uint64(n))
	}
	return n
}

// victims asks the eviction policy for victims on from worth want pages:
// pages where it chooses pages, else whole blocks.
func (s *Server) victims(from core.Device, want int64, out []policy.Victim) []policy.Victim {
	return policy.AskVictims(s.eviction, s.pageEviction, from, want, out)
}

// evict moves the pages the eviction policy names off location from (to
// the host for a device, to a device for the host) until want pages are
// free there, and returns the pages it moved and whether it skipped
// blocks other threads hold. Blocks whose lock is held (the mover's own,
// blocks other threads are serving) are skipped: waiting for them here
// could deadlock.
func (o *mover) evict(from core.Device, want int64) (moved int64, busy bool) {
	srv := o.sess.srv
	var buf [32]policy.Victim
	for round := 0; moved < want && round < 64; round++ {
		victims := srv.victims(from, want-moved, buf[:0])
		if len(victims) == 0 {
			break
		}
		progress, own := false, false
		for _, vic := range victims {
			v, ok := vic.Block.Owner().(blockRef)
			if !ok || v.b.ref != vic.Block {
				continue // not one of this server's blocks: a policy's mistake
			}
			if moved >= want {
				break
			}
			if v.b == o.b {
				own = true
				continue
			}
			if !v.b.mu.TryLock() {
				busy = true
				continue
			}
			pages := vic.Pages
			pages.And(&v.b.resident[from.Slot()])
			var n int64
			if freed := v.r.freed.Load(); freed || pages.Empty() {
				// Gone since the policy last heard: it forgets them.
				if srv.pageEviction != nil {
					srv.pageEviction.LeftPages(vic.Block, from, vic.Pages)
				}
				if freed {
					srv.eviction.Left(vic.Block, from)
				} else {
					srv.leftIfNoneEvictable(v.b, from)
				}
			} else {
				n = evictPages(v, from, pages, false)
			}
			v.b.mu.Unlock()
			if n > 0 {
				progress = true
				moved += n
			}
		}
		// A policy that chooses pages sends the mover's own regions,
		// offered first, to the back of its queues: the next round
		// offers others. One that chooses blocks offers the same again.
		if !progress && (!own || srv.pageEviction == nil) {
			break
		}
	}
	return moved, busy
}

// roomiestDevice picks the device with the most free capacity that can
// take n pages without evicting anything.
func (s *Server) roomiestDevice(n int64) (core.Device, bool) {
	best, room := core.Device(0), int64(0)
	for i, a := range s.arenas {
		if free := a.FreeBytes(); free >= n*core.PageSize && free > room {
			best, room = core.Device(i), free
		}
	}
	return best, room > 0
}

// devicesFull reports whether no device has room for a block (on an arena
// smaller than two blocks, for half of it) without evicting anything.
func (s *Server) devicesFull() bool {
	for _, a := range s.arenas {
		if a.FreeBytes() >= min(core.BlockSize, a.Capacity()/2) {
			return false
		}
	}
	return true
}

// overBudget moves host pages to devices while the host holds more than
// the host budget. It runs after pages arrived on the host, those of
// keep, which stay.
func (o *mover) overBudget(keep core.PageMask) {
	srv := o.sess.srv
	want := core.PagesOverBudget(srv.hostPages.Load(), srv.cfg.HostBudget)
	if want == 0 {
		return
	}
	o.releaseProtections(core.CPU)
	moved, _ := o.evict(core.CPU, want) // the budget is soft: busy blocks go next time
	if moved >= want {
		return
	}
	if srv.devicesFull() {
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
func (o *mover) lastResort(from core.Device, want int64, keep core.PageMask) int64 {
	moved := o.evictOwn(from, want, keep, false)
	if moved < want {
		moved += o.evictProtected(from, want-moved)
	}
	if moved < want {
		moved += o.evictOwn(from, want-moved, keep, true)
	}
	return moved
}
