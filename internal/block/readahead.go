package block

import (
	"fmt"
	"sync/atomic"

	"github.com/softuvm/softuvm/internal/core"
	"github.com/softuvm/softuvm/policy"
)

// Read-ahead of sweeps (policy.ReadAhead). A thread that sweeps a range
// living elsewhere waits at each block for its move: the fault, then
// 2 MiB read from the other location's file and written to its own, then
// its own work on the block, one after the other. Where the prefetch
// policy asks, the block after the one a sweep's fault brought moves in
// the background (Config.Background: on another thread in the server)
// while the processor works on this one, into its file but not its
// mapping; its first touch of that block is then a minor fault, which
// only maps it and starts the read-ahead of the one after. The copy still
// costs what it cost, but on another CPU, overlapped with the program's
// work. Which processors are read ahead for is the policy's decision
// (density: the host only), and how many blocks of one range at once the
// mechanism's (policy.Mechanism.ReadAheads).
//
// A read-ahead is a prefetch (policy.CausePrefetch, counted as
// prefetched pages and as read-ahead pages). It moves a block only
// where all of it lives at the location the sweep reads from (a block
// never touched is left to its first toucher, which places it, and one
// that lives elsewhere to the processor using it), nothing else decides
// its pages' copies (no advice, no launch coherence model, no
// thrashing), and the reader has room to spare: it never evicts. It goes
// through the same move as a fault, under the block's lock, so a fault
// that arrives meanwhile waits for it and then finds the pages in place.

// readAheadState is what a range keeps about its read-ahead: the block
// last read ahead, plus one (0: none), the direction of the sweep, the
// location it reads from and the one it reads for, and the read-aheads
// running.
type readAheadState struct {
	block   atomic.Int64
	dir     atomic.Int32
	from    atomic.Int32
	to      atomic.Int32
	running atomic.Int32
}

// readAheadFrom starts reading block bi+dir ahead to location to: to's
// fault that brought block bi from location from continues a sweep in
// direction dir. Only blocks that live at from are read ahead: a block
// that lives elsewhere is another processor's.
func (r *Range) readAheadFrom(to, from core.Device, bi, dir int) {
	r.ahead.from.Store(int32(from.Slot()))
	r.ahead.to.Store(int32(to.Slot()))
	r.startReadAhead(bi+dir, dir)
}

// ReadAheadReached is called with each fault of location l on block bi,
// before its lock: the first fault of the reader on a block read ahead
// starts the next one.
func (r *Range) ReadAheadReached(l core.Device, bi int) {
	st := &r.ahead
	if st.block.Load() == int64(bi)+1 && int(st.to.Load()) == l.Slot() && st.block.CompareAndSwap(int64(bi)+1, 0) {
		dir := int(st.dir.Load())
		r.startReadAhead(bi+dir, dir)
	}
}

func (r *Range) startReadAhead(bi, dir int) {
	if bi < 0 || bi >= len(r.blocks) {
		return
	}
	st := &r.ahead
	if st.running.Add(1) > int32(r.eng.mech.ReadAheads) {
		st.running.Add(-1)
		return
	}
	st.dir.Store(int32(dir))
	st.block.Store(int64(bi) + 1)
	from := core.DeviceAtSlot(int(st.from.Load()))
	to := core.DeviceAtSlot(int(st.to.Load()))
	r.eng.cfg.Background(func() {
		defer st.running.Add(-1)
		r.readBlockAhead(to, from, bi)
	})
}

// readBlockAhead moves block bi to location to's file where it qualifies
// (see above); otherwise it leaves it. A failure is only logged: nobody
// waits on a read-ahead, and the block's fault will move what it needs.
func (r *Range) readBlockAhead(to, from core.Device, bi int) {
	addr := r.Start + uintptr(bi)<<core.BlockShift
	length := min(uintptr(core.BlockSize), r.End()-addr)
	err := r.EachBlock(addr, length, true, func(o *Mover, pages core.PageMask) error {
		if !o.mayReadAhead(to, from) {
			return nil
		}
		o.Cause = policy.CausePrefetch
		// Into the file only, unmapped: the first touch of the block is
		// then a minor fault, which maps it and starts the next
		// read-ahead (ReadAheadReached). Mapped now, the block would
		// raise no fault, and the sweep would next fault, and wait, on
		// the block after it.
		before := o.B.Resident[to.Slot()]
		var none core.PageMask
		err := o.MoveTo(Target{Dst: to}, none, pages, -1)
		got := o.B.Resident[to.Slot()]
		got.AndNot(&before)
		if n := got.Count(); n > 0 {
			o.emit(Event{Kind: EvReadAhead, To: to, First: got.NextSet(0), Pages: got, N: n})
		}
		return err
	})
	if err != nil && !r.Freed.Load() {
		r.eng.cfg.Logf("read-ahead of %#x+%d to %v: %v", addr, length, to, err)
	}
}

// mayReadAhead reports whether the mover's block may be read ahead to
// location to by a sweep reading from location from: managed memory all
// of which lives at from, no advice, launch model or thrashing deciding
// its pages, and room at to to spare (policy.FullRoomBlocks).
func (o *Mover) mayReadAhead(to, from core.Device) bool {
	b, e := o.B, o.eng()
	if o.R.Kind != core.KindManaged || b.Advice != nil || o.space().LaunchModel() {
		return false
	}
	if !e.RoomFor(to, policy.FullRoomBlocks*core.BlockSize) {
		// A read-ahead never evicts: under a sweep larger than the
		// room, a block brought early pushed out one the eviction
		// policy kept (uvm bench oversub moved a fifth more).
		return false
	}
	if th := e.pol.Thrashing; th != nil && b.thrash != nil {
		var avoid core.PageMask
		th.Avoid(b.thrash, b.Pages, e.Now(), &avoid)
		if !avoid.Empty() {
			return false
		}
	}
	// All at from, none elsewhere. A block nobody touched yet is left
	// to its first toucher, which places it: processors filling their
	// own parts of one range in turn would each have pulled the next
	// one's part to themselves.
	for x := range b.Resident {
		want := 0
		if x == from.Slot() {
			want = b.Pages
		}
		if b.Resident[x].Count() != want {
			return false
		}
	}
	return true
}

// EachBlock calls fn for each block [addr, addr+length) meets, with the
// block locked and the pages of it in the range. Without create, a block
// never used is not created, and fn gets a nil mover for it.
func (r *Range) EachBlock(addr, length uintptr, create bool, fn func(o *Mover, pages core.PageMask) error) error {
	for va := addr; va < addr+length; {
		off := va - r.Start
		blockAddr := r.Start + off&^(core.BlockSize-1)
		end := min(addr+length, blockAddr+core.BlockSize)
		var pages core.PageMask
		pages.FillRange(int(va-blockAddr)/core.PageSize, int(end-blockAddr)/core.PageSize)
		i := int(off >> core.BlockShift)
		b := r.blocks[i].Load()
		if b == nil && !create {
			if err := fn(nil, pages); err != nil {
				return err
			}
			va = end
			continue
		}
		if b == nil {
			b = r.Block(i)
		}
		b.Lock()
		if r.Freed.Load() {
			b.Unlock()
			return fmt.Errorf("%w: %#x+%d: the allocation was freed meanwhile", core.ErrInvalidValue, addr, length)
		}
		o := r.NewMover(i, b)
		err := fn(&o, pages)
		b.Unlock()
		if err != nil {
			return err
		}
		va = end
	}
	return nil
}
