package block

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/softuvm/softuvm/internal/core"
	"github.com/softuvm/softuvm/policy"
)

// memFiles is a Memory in memory, for the engine's own tests: the files
// are the engine's residency, the views map nothing, and every operation
// is recorded by name, with the pages it did.
type memFiles struct {
	large bool
	ops   []string
}

type memView core.Device

func (v memView) Processor() core.Device { return core.Device(v) }

func (m *memFiles) note(op string)         { m.ops = append(m.ops, op) }
func runOf(first, outer int) core.PageMask { var p core.PageMask; p.FillRange(first, outer); return p }

func (m *memFiles) View(l core.Device) View                      { return memView(l) }
func (m *memFiles) Release(View)                                 {}
func (m *memFiles) LargeFile(core.Device) (bool, error)          { return m.large, nil }
func (m *memFiles) Continues(*Range, View) bool                  { return m.large }
func (m *memFiles) WillContinue(core.Device) bool                { return m.large }
func (m *memFiles) Protect(*Mover, View, int, int) error         { return nil }
func (m *memFiles) Unprotect(*Mover, View, int, int)             {}
func (m *memFiles) Wake(*Mover, View, int, int)                  {}
func (m *memFiles) Allocate(*Mover, core.Device, int, int) error { m.note("allocate"); return nil }
func (m *memFiles) InstallZero(_ *Mover, _ View, first, outer int) (core.PageMask, core.PageMask, error) {
	m.note("zero")
	return runOf(first, outer), core.PageMask{}, nil
}
func (m *memFiles) Transfer(_ *Mover, _ Target, _ bool, first, outer int, _ core.Device) (core.PageMask, error) {
	m.note("transfer")
	return runOf(first, outer), nil
}
func (m *memFiles) CopyWhole(*Mover, core.Device, core.Device, bool) error {
	m.note("whole")
	return nil
}
func (m *memFiles) InstallWhole(o *Mover, _ core.Device, _ View) (core.PageMask, bool, error) {
	m.note("install whole")
	return runOf(0, o.B.Pages), true, nil
}
func (m *memFiles) Duplicate(_ *Mover, _ Target, _ bool, first, outer int, _ core.Device) (core.PageMask, error) {
	m.note("duplicate")
	return runOf(first, outer), nil
}
func (m *memFiles) Punch(*Mover, core.Device, int, int, bool) error { m.note("punch"); return nil }
func (m *memFiles) Rebuild(*Mover, core.Device, int, int, []View) error {
	m.note("rebuild")
	return nil
}
func (m *memFiles) Continue(*Mover, View, int, int, bool)               {}
func (m *memFiles) Unmapped(*Mover, View) (core.PageMask, bool)         { return core.PageMask{}, false }
func (m *memFiles) Mapped(*Mover, core.PageMask) (core.PageMask, error) { return core.PageMask{}, nil }
func (m *memFiles) MapsDeviceMemory(*Range, core.Device) bool           { return true }
func (m *memFiles) LaunchModel() bool                                   { return false }
func (m *memFiles) LaunchLocked(*Range) bool                            { return false }
func (m *memFiles) LaunchRefused(*Mover) bool                           { return false }
func (m *memFiles) SettleHostWrites(*Mover, int, int) error             { return nil }

// tally counts the events of each kind and the pages they carry.
type tally struct {
	n     map[EventKind]int
	pages map[EventKind]int
}

func (t *tally) Observe(e Event) {
	t.n[e.Kind]++
	t.pages[e.Kind] += e.Pages.Count()
}

// rig is an engine over memFiles: the host with a budget of hostBlocks
// blocks (0: none), one device of deviceBlocks blocks, lru eviction, the
// prefetch policy named, no thrashing.
type rig struct {
	e     *Engine
	mem   *memFiles
	arena *CountedArena
	t     *tally
	r     *Range
	now   int64
}

func newRig(t *testing.T, prefetch string, hostBlocks, deviceBlocks, rangeBlocks int, large bool) *rig {
	t.Helper()
	ps, err := policy.ParsePrefetchSpec(prefetch)
	require.NoError(t, err)
	set, err := policy.NewSet(policy.Specs{Prefetch: ps, Eviction: "lru"})
	require.NoError(t, err)
	g := &rig{mem: &memFiles{large: large}, arena: &CountedArena{Pages: int64(deviceBlocks) * core.PagesPerBlock},
		t: &tally{n: map[EventKind]int{}, pages: map[EventKind]int{}}, now: 1}
	g.e = New(Config{Policies: set, Arenas: []Arena{g.arena}, HostBudget: int64(hostBlocks) * core.BlockSize,
		Now: func() int64 { return g.now }, Background: func(f func()) { f() }, Observers: []Observer{Counters{}, g.t}})
	g.r = g.e.NewRange(g.mem, 0x7f0000000000, uintptr(rangeBlocks)*core.BlockSize)
	g.r.FileOff, g.r.Kind, g.r.Prefetch, g.r.Session, g.r.ID = 0, core.KindManaged, set.Prefetch, 1, 1
	return g
}

// fault serves a fault of processor p on page x of block bi.
func (g *rig) fault(t *testing.T, p core.Device, bi, x int) Plan {
	t.Helper()
	g.now += 1000
	b := g.r.Block(bi)
	b.Lock()
	defer b.Unlock()
	o := g.r.NewMover(bi, b)
	o.FV = memView(p)
	f := Fault{Kind: core.FaultMissing}
	plan, err := o.ServeFault(x, &f)
	require.NoError(t, err)
	o.Served(x, &f, plan, Event{})
	return plan
}

// TestFaultPopulatesAndMovesPages: a first touch zero-fills the faulted
// page where it faults (no prefetch), a device's touch then moves it
// there by a transfer, and each is reported once: one EvArrived per run,
// one EvFault per fault, counted once in the range's statistics.
func TestFaultPopulatesAndMovesPages(t *testing.T) {
	g := newRig(t, "none", 0, 4, 2, false)
	assert.Equal(t, PlanMigrate, g.fault(t, core.CPU, 0, 5))
	assert.Equal(t, []string{"zero"}, g.mem.ops)
	b := g.r.Block(0)
	assert.Equal(t, runOf(5, 6), b.Resident[core.CPU.Slot()])
	assert.Equal(t, int64(1), g.e.HostPages())

	assert.Equal(t, PlanMigrate, g.fault(t, 0, 0, 5))
	assert.Equal(t, []string{"zero", "transfer"}, g.mem.ops)
	assert.Equal(t, runOf(5, 6), b.Resident[core.Device(0).Slot()])
	assert.True(t, b.Resident[core.CPU.Slot()].Empty())
	assert.Equal(t, int64(0), g.e.HostPages())
	assert.Equal(t, int64(1), g.arena.Used)

	assert.Equal(t, 2, g.t.n[EvFault], "one event per fault")
	assert.Equal(t, 2, g.t.n[EvArrived], "one event per run")
	assert.Equal(t, 2, g.t.pages[EvArrived])
	st := g.r.Stats.Snapshot()
	assert.Equal(t, uint64(1), st.FaultsBy(core.CPU).Total())
	assert.Equal(t, uint64(1), st.FaultsBy(0).Total())
	assert.Equal(t, uint64(1), g.r.Stats.Populated[core.CPU.Slot()].Load())
	assert.Equal(t, uint64(1), st.MigratedPages(core.CPU, 0))
}

// TestWholeBlockMovesAsOneFolio: where files take large folios, a block
// a prefetch moves whole goes as one folio (CopyWhole), reported as one
// arrival of 512 pages and one whole move; a later fault of the host on
// its first page finds the device's copy in one folio, and brings the
// whole block back rather than rebuild it (SourceLarge).
func TestWholeBlockMovesAsOneFolio(t *testing.T) {
	g := newRig(t, "density", 0, 4, 1, true)
	b := g.r.Block(0)
	b.Lock()
	o := g.r.NewMover(0, b)
	require.NoError(t, o.Prefetch(core.CPU, runOf(0, core.PagesPerBlock)))
	b.Unlock()
	assert.Equal(t, []string{"allocate"}, g.mem.ops, "a block never touched arrives whole as zeros")
	assert.True(t, b.MayBeLargeAt(core.CPU))

	b.Lock()
	o = g.r.NewMover(0, b)
	require.NoError(t, o.Prefetch(0, runOf(0, core.PagesPerBlock)))
	b.Unlock()
	assert.Equal(t, []string{"allocate", "whole"}, g.mem.ops)
	assert.True(t, b.MayBeLargeAt(0))
	assert.False(t, b.MayBeLargeAt(core.CPU), "the host's folio left whole")
	assert.Equal(t, 1, g.t.n[EvWholeMove])
	assert.Equal(t, int64(core.PagesPerBlock), g.arena.Used)

	g.fault(t, core.CPU, 0, 0) // where a sweep enters the block
	assert.Equal(t, "whole", g.mem.ops[len(g.mem.ops)-1], "the whole block comes back as one folio")
	assert.Equal(t, core.PagesPerBlock, b.Resident[core.CPU.Slot()].Count())
	assert.Zero(t, g.t.n[EvRebuilt])
	assert.Equal(t, 2, g.t.n[EvWholeMove])
	assert.Equal(t, int64(0), g.arena.Used)
}

// TestEvictionMakesRoomOnAFullDevice: a device of two blocks holding two
// takes a third by evicting the least recently arrived block to the
// host, into its file (a transfer to no view), reported once as an
// eviction of its pages; the arena never holds more than it has.
func TestEvictionMakesRoomOnAFullDevice(t *testing.T) {
	g := newRig(t, "none", 0, 2, 3, false)
	for bi := 0; bi < 3; bi++ {
		for x := 0; x < core.PagesPerBlock; x += 64 {
			g.fault(t, 0, bi, x)
		}
	}
	// Each block holds 8 pages on the device: all fit.
	assert.Zero(t, g.t.n[EvEvicted])
	g2 := newRig(t, "none", 0, 2, 3, false)
	fill := func(bi int) {
		b := g2.r.Block(bi)
		b.Lock()
		o := g2.r.NewMover(bi, b)
		require.NoError(t, o.Prefetch(0, runOf(0, core.PagesPerBlock)))
		b.Unlock()
	}
	fill(0)
	fill(1)
	require.Equal(t, int64(2*core.PagesPerBlock), g2.arena.Used)
	fill(2)
	assert.Equal(t, int64(2*core.PagesPerBlock), g2.arena.Used, "the arena stays full, not over")
	assert.Equal(t, 1, g2.t.n[EvEvicted], "one victim")
	assert.Equal(t, core.PagesPerBlock, g2.t.pages[EvEvicted])
	assert.Equal(t, core.PagesPerBlock, g2.r.Block(0).Resident[core.CPU.Slot()].Count(), "the first block went to the host")
	assert.True(t, g2.r.Block(0).Resident[core.Device(0).Slot()].Empty())
	assert.Equal(t, core.PagesPerBlock, g2.r.Block(2).Resident[core.Device(0).Slot()].Count())
	assert.Equal(t, uint64(core.PagesPerBlock), g2.r.Stats.Evicted[core.Device(0).Slot()].Load(), "counted once")
}

// TestHostBudgetEvictsAfterTheMove: the host's budget is soft: a move
// to the host takes what it brings, and the pages over the budget leave
// for the device after (overBudget), never those just brought.
func TestHostBudgetEvictsAfterTheMove(t *testing.T) {
	g := newRig(t, "none", 1, 4, 3, false)
	for bi := 0; bi < 2; bi++ {
		b := g.r.Block(bi)
		b.Lock()
		o := g.r.NewMover(bi, b)
		require.NoError(t, o.Prefetch(core.CPU, runOf(0, core.PagesPerBlock)))
		b.Unlock()
	}
	assert.Equal(t, int64(core.PagesPerBlock), g.e.HostPages(), "one block over the budget left")
	assert.Equal(t, core.PagesPerBlock, g.r.Block(1).Resident[core.CPU.Slot()].Count(), "the block just brought stays")
	assert.Equal(t, core.PagesPerBlock, g.r.Block(0).Resident[core.Device(0).Slot()].Count(), "the other went to the device")
	assert.Equal(t, 1, g.t.n[EvEvicted])
}

// TestAdoptedViewMapsUnknownFiles: a device view a takeover adopted may
// map any location's file until it is mapped again (MappingsUnknown):
// its fault on a page the host holds is served through the view
// (PlanPending, every location a candidate), not migrated into its own
// file; a move from the host holds its writers still. A remap that
// settles makes a run known; one that fails leaves it unknown.
func TestAdoptedViewMapsUnknownFiles(t *testing.T) {
	g := newRig(t, "none", 0, 4, 1, false)
	dev := core.Device(0)
	g.fault(t, core.CPU, 0, 5)
	b := g.r.Block(0)
	b.Lock()
	b.MappingsUnknown(dev)
	o := g.r.NewMover(0, b)
	_, known := o.MapsAt(dev, 5)
	assert.False(t, known)
	assert.ElementsMatch(t, []core.Device{core.CPU, dev}, o.PendingFiles(dev, 5))
	assert.Contains(t, o.HoldersInto(nil, core.CPU, 5, 6), View(memView(dev)), "it may map the host's file: hold it still")
	b.Unlock()

	assert.Equal(t, PlanPending, g.fault(t, dev, 0, 5))
	assert.Equal(t, []string{"zero"}, g.mem.ops, "nothing moved into a file the view may not map")

	b.Lock()
	o = g.r.NewMover(0, b)
	b.SetMapping(dev, 0, 8, core.CPU, true)
	b.Settle(dev, 0, 4, true)
	b.Settle(dev, 4, 8, false)
	f, known := o.MapsAt(dev, 3)
	assert.True(t, known)
	assert.Equal(t, core.CPU, f)
	_, known = o.MapsAt(dev, 5)
	assert.False(t, known, "a remap that failed leaves the old mapping unknown")
	assert.NotContains(t, o.HoldersInto(nil, dev, 0, 4), View(memView(dev)), "known to map the host's file there")
	b.Unlock()
}
