package lab

import (
	"github.com/softuvm/softuvm/internal/block"
	"github.com/softuvm/softuvm/internal/core"
	"github.com/softuvm/softuvm/policy"
)

// The simulated memory the block engine runs over in a replay
// (block.Memory): location files are the engine's own residency, and
// each processor's view a page table of masks per block, changed as the
// kernel changes a real one:
//
//   - a page installed through a view, or mapped into it (Continue), is
//     mapped there; one written into a file is mapped by no view;
//   - a page leaving a file (a punch) leaves every view that mapped it;
//     where the view had it write-protected, the protection stays, as
//     the kernel's marker does, until it is lifted or an install
//     replaces it;
//   - a touch of a page its view does not map, in the file the view
//     maps, is a MINOR fault where the view registers them (large folios
//     on: the server's views do) and else mapped by the kernel without
//     the server; a write to a protected page, mapped or marked, is a
//     write-protect fault.
//
// Every view exists from the start (the server's device views exist once
// the device's process runs: a trace does not say when), maps its own
// file (no remote mappings: but for pins, below), and holds nothing
// still: nothing runs beside the replay.

// maxLocs is how many locations a replay has room for: the host and
// core.MaxDevices devices.
const maxLocs = core.MaxDevices + 2

// pageTables is what the views of all processors map of one block.
type pageTables struct {
	mapped    [maxLocs]core.PageMask // present in the view's page table
	protected [maxLocs]core.PageMask // write-protected there, present or marked
}

// labView is a processor's view.
type labView core.Device

func (v labView) Processor() core.Device { return core.Device(v) }

// tables returns block b's page tables, made on first use.
func tables(b *block.Block) *pageTables {
	if t, ok := b.Memory.(*pageTables); ok {
		return t
	}
	t := &pageTables{}
	b.Memory = t
	return t
}

func span(first, outer int) core.PageMask {
	var m core.PageMask
	m.FillRange(first, outer)
	return m
}

// leave takes pages out of location l's file: every view that maps l's
// file (its own: l's) loses them, its protections kept as markers.
func leave(b *block.Block, l core.Device, pages core.PageMask) {
	tables(b).mapped[l.Slot()].AndNot(&pages)
}

// arrive puts pages into view v, mapped, writable unless wp.
func arrive(b *block.Block, v core.Device, pages core.PageMask, wp bool) {
	t := tables(b)
	t.mapped[v.Slot()].Or(&pages)
	if wp {
		t.protected[v.Slot()].Or(&pages)
	} else {
		t.protected[v.Slot()].AndNot(&pages)
	}
}

// space is the replay's Memory: one client's files and views.
type space struct{ s *sim }

var _ block.Memory = space{}

func (m space) View(l core.Device) block.View {
	if l != core.CPU && int(l) >= m.s.devices {
		return nil
	}
	return labView(l)
}

func (space) Release(block.View) {}

func (m space) LargeFile(core.Device) (bool, error) { return m.s.largeFolios, nil }

// Continues: the host view registers MINOR faults where the host file
// takes large folios, and a device's view over its own file where its
// arena does, under the fault coherence model (server: hostMinor,
// deviceMinor); replays assume that model, and that the arenas take
// large folios where the host file does.
func (m space) Continues(r *block.Range, v block.View) bool {
	if v.Processor() == core.CPU {
		return m.s.largeFolios && !r.TrackPrefetch
	}
	return m.s.largeFolios
}

func (m space) WillContinue(core.Device) bool { return m.s.largeFolios }

func (space) Protect(o *block.Mover, v block.View, first, outer int) error {
	p := span(first, outer)
	tables(o.B).protected[v.Processor().Slot()].Or(&p)
	return nil
}

func (space) Unprotect(o *block.Mover, v block.View, first, outer int) {
	p := span(first, outer)
	tables(o.B).protected[v.Processor().Slot()].AndNot(&p)
}

func (space) Wake(*block.Mover, block.View, int, int) {}

func (space) InstallZero(o *block.Mover, v block.View, first, outer int) (done, found core.PageMask, err error) {
	done = span(first, outer)
	arrive(o.B, v.Processor(), done, false)
	return done, found, nil
}

func (space) Allocate(*block.Mover, core.Device, int, int) error { return nil }

func (space) Transfer(o *block.Mover, t block.Target, mapped bool, first, outer int, from core.Device) (core.PageMask, error) {
	done := span(first, outer)
	leave(o.B, from, done)
	if mapped {
		arrive(o.B, t.Via.Processor(), done, false)
	}
	return done, nil
}

func (space) CopyWhole(o *block.Mover, from, _ core.Device, _ bool) error {
	leave(o.B, from, span(0, o.B.Pages))
	return nil
}

func (space) InstallWhole(o *block.Mover, from core.Device, v block.View) (core.PageMask, bool, error) {
	done := span(0, o.B.Pages)
	leave(o.B, from, done)
	arrive(o.B, v.Processor(), done, false)
	return done, true, nil
}

func (space) Duplicate(o *block.Mover, t block.Target, mapped bool, first, outer int, _ core.Device) (core.PageMask, error) {
	done := span(first, outer)
	if mapped {
		arrive(o.B, t.Via.Processor(), done, true)
	}
	return done, nil
}

func (space) Punch(o *block.Mover, l core.Device, first, outer int, _ bool) error {
	leave(o.B, l, span(first, outer))
	return nil
}

// Rebuild punches the whole block from l's file and writes the pages
// that stay back: no view maps them any more, and those with one copy
// are writable again.
func (space) Rebuild(o *block.Mover, l core.Device, first, outer int, _ []block.View) error {
	leave(o.B, l, span(0, o.B.Pages))
	others := span(0, o.B.Pages)
	gone := span(first, outer)
	others.AndNot(&gone)
	dup := o.B.Duplicated()
	others.AndNot(&dup)
	tables(o.B).protected[l.Slot()].AndNot(&others)
	return nil
}

// Continue maps the pages into v: the engine asks only for pages its
// file holds (a whole block just written there is not yet in the
// engine's residency, which the move updates once it is done).
func (space) Continue(o *block.Mover, v block.View, first, outer int, wp bool) {
	arrive(o.B, v.Processor(), span(first, outer), wp)
}

func (space) Unmapped(o *block.Mover, v block.View) (core.PageMask, bool) {
	m := span(0, o.B.Pages)
	m.AndNot(&tables(o.B).mapped[v.Processor().Slot()])
	return m, true
}

func (space) Mapped(o *block.Mover, mask core.PageMask) (core.PageMask, error) {
	mask.And(&tables(o.B).mapped[core.CPU.Slot()])
	return mask, nil
}

func (space) MapsDeviceMemory(*block.Range, core.Device) bool { return true }
func (space) LaunchModel() bool                               { return false }
func (space) LaunchLocked(*block.Range) bool                  { return false }
func (space) LaunchRefused(*block.Mover) bool                 { return false }
func (space) SettleHostWrites(*block.Mover, int, int) error   { return nil }

// hintFaults is the server's policy.Observer (internal/server/watch.go)
// over the simulated page table: Watch unmaps a block's host pages, a
// reference maps them again (a MINOR fault where the host view registers
// them: the block's pages, or the touched page's 64 KiB region where a
// policy watches by region), and Touched returns those mapped. It sees
// only the references the trace holds: a touch that neither faulted nor
// was sampled by the access mode does not show, so a watched block looks
// less used than it was.
type hintFaults struct{}

func (hintFaults) Watchable(p policy.Processor) bool { return p == core.CPU }

func (hintFaults) Watch(pb *policy.Block, p policy.Processor, regions bool) bool {
	v, ok := block.RefOf(pb)
	if !ok || p != core.CPU {
		return false
	}
	tables(v.B).mapped[core.CPU.Slot()] = core.PageMask{}
	v.B.WatchRegions.Store(regions)
	return true
}

func (hintFaults) Touched(pb *policy.Block, p policy.Processor) core.PageMask {
	v, ok := block.RefOf(pb)
	if !ok || p != core.CPU {
		return core.PageMask{}
	}
	m := tables(v.B).mapped[core.CPU.Slot()]
	m.And(&v.B.Resident[core.CPU.Slot()])
	return m
}

// counter is the replay's observer of the engine: what it did, counted
// into the Result, as the server's counters count it.
type counter struct{ res *Result }

func (c counter) Observe(e block.Event) {
	r := c.res
	switch e.Kind {
	case block.EvFault:
		r.Faults[e.Processor.Slot()]++
		switch e.FaultKind {
		case core.FaultMinor:
			r.MinorFaults++
		case core.FaultWP:
			r.WriteProtectFaults++
		}
	case block.EvArrived:
		n := e.Pages.Count()
		if !e.Populated {
			r.Populated[e.To.Slot()] += uint64(n)
		} else {
			r.addMoved(e.From, e.To, e.Cause, n)
		}
		r.Prefetched += uint64(e.Prefetched)
	case block.EvEvicted:
		r.Evicted[e.From.Slot()] += uint64(e.Pages.Count())
		r.Evictions++
	case block.EvWholeMove:
		r.WholeBlocks++
		if e.To == core.CPU {
			r.WholeToHost++
		} else {
			r.WholeToDevice++
		}
	case block.EvRebuilt:
		r.FoliosRebuilt++
	case block.EvThrottled:
		r.Throttles++
		r.NapTime += e.Duration
	case block.EvPinned:
		r.Pins++
	case block.EvRefaulted:
		r.Refaulted += uint64(e.N)
		r.RefaultedRecent += uint64(e.Recent)
	case block.EvProtected:
		r.Protected += uint64(e.Pages.Count())
	case block.EvDemoted:
		r.Demoted += uint64(e.N)
	case block.EvBadVictim:
		r.BadVictims++
	}
}
