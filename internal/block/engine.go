package block

import (
	"errors"
	"sync/atomic"
	"time"

	"github.com/softuvm/softuvm/devmem"
	"github.com/softuvm/softuvm/internal/core"
	"github.com/softuvm/softuvm/internal/workingset"
	"github.com/softuvm/softuvm/policy"
)

// Arena is a device's capacity as the engine charges it, in pages: the
// server's devmem.Arena, or the lab's count. Reserve fails with
// devmem.ErrArenaFull when the pages do not fit.
type Arena interface {
	Reserve(pages int64) error
	Release(pages int64)
	FreeBytes() int64
	Capacity() int64
}

// CountedArena is an Arena that only counts: a capacity and the pages
// reserved (the lab's devices, and the engine's tests).
type CountedArena struct {
	Pages, Used int64
}

// Reserve takes n pages, or fails with devmem.ErrArenaFull.
func (a *CountedArena) Reserve(n int64) error {
	if a.Used+n > a.Pages {
		return devmem.ErrArenaFull
	}
	a.Used += n
	return nil
}

func (a *CountedArena) Release(n int64)  { a.Used -= n }
func (a *CountedArena) FreeBytes() int64 { return (a.Pages - a.Used) * core.PageSize }
func (a *CountedArena) Capacity() int64  { return a.Pages * core.PageSize }

// Config is what an engine runs by.
type Config struct {
	// Policies decide; Arenas are the devices' capacities, one per
	// device; HostBudget bounds the pages resident on the host, in bytes
	// (0: unbounded).
	Policies   *policy.Set
	Arenas     []Arena
	HostBudget int64
	// Now is the engine's clock in microseconds, never 0: the server's
	// time since it started, the lab's trace time.
	Now func() int64
	// Background runs a read-ahead: the server on a goroutine of its
	// own, the lab at once.
	Background func(func())
	// Logf reports what went wrong where nobody waits for an error (an
	// eviction, a read-ahead); nil discards.
	Logf func(format string, args ...any)
	// OwnVictims lets eviction take pages of the block whose move
	// evicts, all but those the move brings: the lab's oracle, which
	// knows the future and no blocks. The server skips the block whose
	// lock it holds.
	OwnVictims bool
	// Observers hear of every event (sink.go), after the engine's own
	// (the policies): the ranges' counters (Counters) among them where
	// the user reads them.
	Observers []Observer
}

// Engine moves the pages of every block of its spaces and decides how:
// residency, migration, whole-block moves, read duplication, remote
// mappings, eviction and the resident core, thrashing, read-ahead and
// the fault decision. See the package documentation.
type Engine struct {
	cfg  Config
	pol  *policy.Set
	mech policy.Mechanism
	locs int
	// hostPages counts the pages resident on the host, every space's,
	// and hostPeak is its high-water mark since the engine started (the
	// most pages resident on the host at once), raised by hostGained
	// only.
	hostPages atomic.Int64
	hostPeak  atomic.Int64
	// reserving[d] counts movers holding a reservation on device d's
	// arena for pages the eviction policy does not list yet (evict.go:
	// reserve), so that a full arena with nothing to evict is told from
	// one whose room is in flight.
	reserving []atomic.Int32
	// ws is every processor's refault stamps and resident core
	// (workingset.go).
	ws   *workingset.Set[Ref]
	sink sink
	// sparing and sparingKeep are what Sparing returns: set by evict
	// under Config.OwnVictims alone, whose replay runs on one thread.
	sparing     *Block
	sparingKeep core.PageMask
}

// New makes an engine.
func New(cfg Config) *Engine {
	e := &Engine{cfg: cfg, pol: cfg.Policies, mech: cfg.Policies.Mechanism, locs: 1 + len(cfg.Arenas), reserving: make([]atomic.Int32, len(cfg.Arenas))}
	if e.mech == (policy.Mechanism{}) {
		e.mech = policy.DefaultMechanism
	}
	if e.cfg.Background == nil {
		e.cfg.Background = func(f func()) { go f() }
	}
	if e.cfg.Logf == nil {
		e.cfg.Logf = func(string, ...any) {}
	}
	e.sink = newSink(e, cfg.Observers)
	e.setRefaultLimits()
	return e
}

// Policies is the engine's policy set.
func (e *Engine) Policies() *policy.Set { return e.pol }

// Locations is the number of places a page can live: the host and each
// device.
func (e *Engine) Locations() int { return e.locs }

// Arena is device d's capacity.
func (e *Engine) Arena(d core.Device) Arena { return e.cfg.Arenas[d] }

// HostPages is the pages resident on the host, in every space.
func (e *Engine) HostPages() int64 { return e.hostPages.Load() }

// HostPeak is the most pages resident on the host at once.
func (e *Engine) HostPeak() int64 { return e.hostPeak.Load() }

// AddHostPages adjusts the host's count where pages arrive or leave
// outside a move: a space's pages found in its files (a takeover), or
// freed with its range.
func (e *Engine) AddHostPages(n int64) {
	if n > 0 {
		e.hostGained(n)
		return
	}
	e.hostPages.Add(n)
}

// hostGained counts n pages that became resident on the host, and
// raises the host's high-water mark where it passes it. Every increase
// of hostPages comes through here (decreases do not touch the mark),
// so the mark costs a load on each arrival and a compare-and-swap only
// when it moves.
func (e *Engine) hostGained(n int64) {
	now := e.hostPages.Add(n)
	for peak := e.hostPeak.Load(); now > peak; peak = e.hostPeak.Load() {
		if e.hostPeak.CompareAndSwap(peak, now) {
			return
		}
	}
}

// nowMicros is the engine's clock.
func (e *Engine) nowMicros() int64 { return e.cfg.Now() }

// Now is the engine's clock as policies see it.
func (e *Engine) Now() policy.Clock { return clock(e.cfg.Now()) }

// clock is a time in microseconds as policies see it.
func clock(micros int64) policy.Clock { return policy.Clock(micros) * policy.Clock(time.Microsecond) }

// RoomFor reports whether location l can take n more bytes without
// evicting anything: a device with that much free capacity, or the host
// with no budget or that much left under it.
func (e *Engine) RoomFor(l core.Device, n int64) bool {
	if l == core.CPU {
		return e.cfg.HostBudget <= 0 || e.hostPages.Load()*core.PageSize+n <= e.cfg.HostBudget
	}
	return e.cfg.Arenas[l].FreeBytes() >= n
}

// roomiestDevice picks the device with the most free capacity that can
// take n pages without evicting anything.
func (e *Engine) roomiestDevice(n int64) (core.Device, bool) {
	best, room := core.Device(0), int64(0)
	for i, a := range e.cfg.Arenas {
		if free := a.FreeBytes(); free >= n*core.PageSize && free > room {
			best, room = core.Device(i), free
		}
	}
	return best, room > 0
}

// devicesFull reports whether no device has room for a block (on an arena
// smaller than two blocks, for half of it) without evicting anything.
func (e *Engine) devicesFull() bool {
	for _, a := range e.cfg.Arenas {
		if a.FreeBytes() >= min(core.BlockSize, a.Capacity()/2) {
			return false
		}
	}
	return true
}

// Nap is how long a throttled fault waits: the thrashing policy's nap.
func (e *Engine) Nap() time.Duration {
	if e.pol.Thrashing == nil {
		return 0
	}
	return e.pol.Thrashing.Nap()
}

// Mechanism is the numbers the engine runs by.
func (e *Engine) Mechanism() policy.Mechanism { return e.mech }

// isFull reports err is an arena's refusal for want of room.
func isFull(err error) bool { return errors.Is(err, devmem.ErrArenaFull) }

// Reserve takes need pages of device dst's capacity for device memory,
// evicting managed pages there if it must (ReserveOrEvict): device memory
// takes its capacity at allocation, as cudaMalloc does.
func (e *Engine) Reserve(dst core.Device, need int64) error {
	o := Mover{R: &Range{eng: e}}
	return o.ReserveOrEvict(dst, need, core.PageMask{})
}
