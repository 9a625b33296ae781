package server

import (
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/softuvm/softuvm/internal/block"
	"github.com/softuvm/softuvm/internal/core"
	"github.com/softuvm/softuvm/internal/procinfo"
	"github.com/softuvm/softuvm/internal/wire"
)

// remapper follows, in the background, the mapping changes that faults
// and timers cause. Faults enqueue blocks and never wait.
type remapper struct {
	mu      sync.Mutex
	pending map[remapKey]struct{} // guarded by mu
	wake    chan struct{}         // capacity 1
	quit    chan struct{}
}

type remapKey struct {
	r  *block.Range
	bi int
	l  core.Device
}

func newRemapper() *remapper {
	return &remapper{pending: map[remapKey]struct{}{}, wake: make(chan struct{}, 1), quit: make(chan struct{})}
}

// A device process maps each remote run as a mapping of its own, and
// one between two runs of its own file splits that file's mapping: a
// run costs up to two of the process's mappings, which Linux bounds
// (vm.max_map_count, 65530 by default). Advice that alternates page by
// page wants more than that (a hundred thousand runs and more), so a
// view maps remote runs while it has mappings to spare, and its own file
// beyond: policy's wish to map a page remotely is a hint, and a page the
// device touches there migrates to it instead. The first view to run
// out says so in the log.

// mappingReserve is what a device process keeps for mappings of its
// own that come after its layout: its threads' stacks, its allocator's
// arenas, remote runs and peers' memory mapped later.
const mappingReserve = 4096

// remoteRunBudget is how many remote runs the process pid may map on
// top of what it maps now.
func remoteRunBudget(pid int) int { return procinfo.MappingsLeft(pid, mappingReserve) / 2 }

// mapsFull marks view v as out of mappings for remote runs (what found
// out names the occasion), and says so once per server.
func (sess *session) mapsFull(v *view, what string) {
	if v.mapsFull.Swap(true) || sess.srv.mapsFullLogged.Swap(true) {
		return
	}
	sess.srv.logger.Printf("pid %d device %d (pid %d): %s wants more remote mappings than the process may have (vm.max_map_count); "+
		"where advice or policy would map another location's memory it maps its own, and pages migrate on touch (raise vm.max_map_count to map them all)",
		sess.pid, v.loc, v.pid, what)
}

// remapBlock brings device view l's mapping of block bi in line with
// policy, run by run, asking the device process to map each. It waits
// for the device; it holds no block lock meanwhile, and v.reqMu keeps one
// remap of the view in flight at a time.
func (sess *session) remapBlock(r *block.Range, bi int, l core.Device) error {
	v := sess.views[l.Slot()].Load()
	if v == nil || v.conn == nil || r.Kind != core.KindManaged {
		return nil
	}
	v.reqMu.Lock()
	defer v.reqMu.Unlock()
	for range core.PagesPerBlock {
		b := r.BlockAt(bi)
		if b == nil {
			return nil
		}
		b.Lock()
		if r.Freed.Load() || sess.views[l.Slot()].Load() != v || !b.RemoteMappable(sess.srv.eng) {
			// Without remote advice, remote mappings or pins, every
			// device maps its own file: nothing to do.
			b.Unlock()
			return nil
		}
		o := r.NewMover(bi, b)
		first, outer, to, found := o.Mismatch(l, 0)
		for found && to != l && v.mapsFull.Load() {
			// Out of mappings: only runs back to its own file.
			first, outer, to, found = o.Mismatch(l, outer)
		}
		if !found {
			b.Unlock()
			return nil
		}
		b.SetMapping(l, first, outer, to, true)
		b.Unlock()

		err := v.mapRun(&o, first, outer, to)

		b.Lock()
		b.Settle(l, first, outer, err == nil)
		if err == nil && to != l {
			sess.srv.countRemote(r, l, o.PageAddr(first), outer-first)
		}
		if err == nil && to == l && !r.Freed.Load() {
			o.MapOwnResident(l, first, outer)
		}
		b.Unlock()
		if errors.Is(err, errDeviceGone) {
			return nil // its successor maps what the table says
		}
		if errors.Is(err, core.ErrMemoryAllocation) && to != l {
			sess.mapsFull(v, fmt.Sprintf("mapping %v's memory over %#x+%d", to, o.PageAddr(first), (outer-first)*core.PageSize))
			continue
		}
		if err != nil {
			return fmt.Errorf("map %v's file over %#x+%d in device %d: %w", to, o.PageAddr(first), (outer-first)*core.PageSize, l, err)
		}
	}
	return nil
}

// mapRun asks device view v's process to map location to's file over
// pages [first, outer) of the mover's block, and waits; v.reqMu is held.
// The new mapping starts write-protected everywhere: a page with several
// copies must never be writable, and one may get a second copy while the
// remap is in flight, protected by then only in the old mapping. A page
// with one copy costs a write-protect fault on its first write, which
// lifts the protection.
func (v *view) mapRun(o *block.Mover, first, outer int, to core.Device) error {
	var wp core.PageMask
	wp.FillRange(0, outer-first)
	return v.requestLocked(wire.EncodeDeviceMap(v.seq.Add(1), wire.DeviceMapRequest{
		Addr: uint64(o.PageAddr(first)), Length: uint64(outer-first) * core.PageSize, File: to, Wp: wp}), wire.MsgDeviceMap)
}

// remapRange brings every device view's mapping of [addr, addr+length)
// in line with policy and waits until it is.
func (sess *session) remapRange(r *managedRange, addr, length uintptr) error {
	var errs []error
	for l := 1; l < len(sess.views); l++ {
		for bi := int((addr - r.Start) >> core.BlockShift); bi <= int((addr+length-1-r.Start)>>core.BlockShift); bi++ {
			if err := sess.remapBlock(r.Range, bi, core.DeviceAtSlot(l)); err != nil {
				errs = append(errs, err)
				break
			}
		}
	}
	return core.JoinErrors(errs)
}

// enqueue asks for device view l's mapping of block bi to be reconciled.
func (q *remapper) enqueue(r *block.Range, bi int, l core.Device) {
	q.mu.Lock()
	q.pending[remapKey{r, bi, l}] = struct{}{}
	q.mu.Unlock()
	select {
	case q.wake <- struct{}{}:
	default:
	}
}

// enqueueRemap enqueues block bi for every device view.
func (sess *session) enqueueRemap(r *block.Range, bi int) {
	for l := 1; l < len(sess.views); l++ {
		if sess.views[l].Load() != nil {
			sess.remaps.enqueue(r, bi, core.DeviceAtSlot(l))
		}
	}
}

func (sess *session) remapLoop() {
	q := sess.remaps
	for {
		select {
		case <-q.quit:
			return
		case <-q.wake:
		}
		q.mu.Lock()
		work := make([]remapKey, 0, len(q.pending))
		for k := range q.pending {
			work = append(work, k)
		}
		clear(q.pending)
		q.mu.Unlock()
		for _, k := range work {
			if err := sess.remapBlock(k.r, k.bi, k.l); err != nil {
				sess.srv.logger.Printf("pid %d: %v", sess.pid, err)
			}
		}
	}
}

// scheduleRemap reconciles block bi for every device view after d: when
// a thrashing pin expires.
func (sess *session) scheduleRemap(r *block.Range, bi int, d time.Duration) {
	time.AfterFunc(d, func() {
		select {
		case <-sess.remaps.quit:
		default:
			sess.enqueueRemap(r, bi)
		}
	})
}

// countRemote reports that device view l came to map pages of r
// remotely, from addr on: counted and traced as every engine event is.
func (s *Server) countRemote(r *block.Range, l core.Device, addr uintptr, pages int) {
	off := addr - r.Start
	s.eng.Emit(block.Event{Kind: block.EvRemoteMapped, R: r, Block: int(off >> core.BlockShift),
		First: int(off>>core.PageShift) & (core.PagesPerBlock - 1), Processor: l, N: pages})
}
