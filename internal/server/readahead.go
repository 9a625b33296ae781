package server

import (
	"sync/atomic"

	"github.com/softuvm/softuvm/internal/core"
	"github.com/softuvm/softuvm/policy"
)

// Read-ahead of the host's sweeps (policy.ReadAhead). A host thread that
// sweeps a range living on a device waits at each block for its move:
// the fault, then 2 MiB read from the device's file and written to the
// host's, then its own work on the block, one after the other. Where the
// prefetch policy asks, the block after the one a sweep's fault brought
// moves on another thread while the host works on this one, into the
// host's file but not its mapping; the host's first touch of that block
// is then a minor fault, which only maps it and starts the read-ahead
// of the one after. The copy still costs what it cost, but on another
// CPU, overlapped with the program's work.
//
// A read-ahead is a prefetch (policy.CausePrefetch, counted as
// prefetched pages and as read-ahead pages). It moves a block only
// where all of it lives at the location the sweep reads from (a block
// never touched is left to its first toucher, which places it, and one
// that lives elsewhere to the processor using it), nothing else decides
// its pages' copies (no advice, no launch coherence model, no
// thrashing), and the host has room to spare: it never evicts. It goes
// through the same move as a fault, under the block's lock, so a fault
// that arrives meanwhile waits for it and then finds the pages in place.
//
// Devices' sweeps are not read ahead. A kernel works on its part of a
// range, and the block past its part is another device's: six devices
// each adding to the next one's part pulled over the part after it too,
// which its own kernel then faulted back.

// maxReadAheads is how many read-aheads of one range may run at once:
// the block being read ahead when the host reaches it, and the next one,
// which starts then.
const maxReadAheads = 2

// readAheadState is what a range keeps about the host's read-ahead: the
// block last read ahead, plus one (0: none), the direction of the sweep,
// the location it reads from, and the read-aheads running.
type readAheadState struct {
	block   atomic.Int64
	dir     atomic.Int32
	from    atomic.Int32
	running atomic.Int32
}

// readAheadFrom starts reading block bi+dir ahead: the host's fault that
// brought block bi from location from continues a sweep in direction
// dir. Only blocks that live at from are read ahead: a block that lives
// elsewhere is another processor's.
func (r *managedRange) readAheadFrom(from core.Device, bi, dir int) {
	r.readAhead.from.Store(int32(from.Slot()))
	r.startReadAhead(bi+dir, dir)
}

// readAheadReached is called with each host fault on block bi, before
// its lock: the first fault on a block read ahead starts the next one.
func (r *managedRange) readAheadReached(bi int) {
	st := &r.readAhead
	if st.block.Load() == int64(bi)+1 && st.block.CompareAndSwap(int64(bi)+1, 0) {
		dir := int(st.dir.Load())
		r.startReadAhead(bi+dir, dir)
	}
}

func (r *managedRange) startReadAhead(bi, dir int) {
	if bi < 0 || bi >= len(r.blocks) {
		return
	}
	st := &r.readAhead
	if st.running.Add(1) > maxReadAheads {
		st.running.Add(-1)
		return
	}
	st.dir.Store(int32(dir))
	st.block.Store(int64(bi) + 1)
	from := core.DeviceAtSlot(int(st.from.Load()))
	go func() {
		defer st.running.Add(-1)
		r.readBlockAhead(from, bi)
	}()
}

// readBlockAhead moves block bi to the host's file where it qualifies
// (see above); otherwise it leaves it. A failure is only logged: nobody
// waits on a read-ahead, and the block's fault will move what it needs.
func (r *managedRange) readBlockAhead(from core.Device, bi int) {
	sess := r.sess
	addr := r.start + uintptr(bi)<<core.BlockShift
	length := min(uintptr(core.BlockSize), r.end()-addr)
	host := core.CPU.Slot()
	err := r.eachBlock(addr, length, true, func(o *mover, pages core.PageMask) error {
		if !o.mayReadAhead(from) {
			return nil
		}
		o.cause = policy.CausePrefetch
		// Into the file only, unmapped: the host's first touch of the
		// block is then a minor fault, which maps it and starts the
		// next read-ahead (readAheadReached). Mapped now, the block
		// would raise no fault, and the sweep would next fault, and
		// wait, on the block after it.
		before := o.b.resident[host].Count()
		var none core.PageMask
		err := o.moveTo(target{dst: core.CPU}, none, pages, -1)
		if n := o.b.resident[host].Count() - before; n > 0 {
			r.stats.ReadAhead.Add(uint64(n))
		}
		return err
	})
	if err != nil && !r.freed.Load() {
		sess.srv.logger.Printf("pid %d: read-ahead of %#x+%d to the host: %v", sess.pid, addr, length, err)
	}
}

// mayReadAhead reports whether the mover's block may be read ahead to
// the host by a sweep reading from location from: managed memory all of
// which lives at from, no advice, launch model or thrashing deciding its
// pages, and room on the host to spare (policy.FullRoomBlocks).
func (o *mover) mayReadAhead(from core.Device) bool {
	b, srv := o.b, o.sess.srv
	if o.r.kind != core.KindManaged || b.advice != nil || o.sess.launch != nil {
		return false
	}
	if !srv.roomFor(core.CPU, policy.FullRoomBlocks*core.BlockSize) {
		// A read-ahead never evicts: under a sweep larger than the
		// room, a block brought early pushed out one the eviction
		// policy kept (uvm bench oversub moved a fifth more).
		return false
	}
	if th := srv.thrashing; th != nil && b.thrash != nil {
		var avoid core.PageMask
		th.Avoid(b.thrash, b.pages, clock(srv.nowMicros()), &avoid)
		if !avoid.Empty() {
			return false
		}
	}
	// All at from, none elsewhere. A block nobody touched yet is left
	// to its first toucher, which places it: processors filling their
	// own parts of one range in turn would each have pulled the next
	// one's part to themselves.
	for x := range b.resident {
		want := 0
		if x == from.Slot() {
			want = b.pages
		}
		if b.resident[x].Count() != want {
			return false
		}
	}
	return true
}
