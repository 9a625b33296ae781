package block

import (
	"time"

	"github.com/softuvm/softuvm/internal/core"
	"github.com/softuvm/softuvm/policy"
)

// EventKind says what happened.
type EventKind uint8

// What the engine reports. Each event is reported once, to every
// observer in turn, where it happens: with the block's lock held, so
// that an observer sees a block's events in their order, and a counter
// is updated before the block is unlocked (a statistics query takes
// each block lock once: it never misses what a client has seen done).
const (
	// EvFault: a fault of Processor on page First was served (or
	// failed: Failed), by Plan, in Duration since Started; it brought
	// Prefetched pages besides the faulted one. FaultKind, Write and
	// Thread describe the fault.
	EvFault EventKind = iota + 1
	// EvArrived: Pages arrived at To for Cause, from From, or created
	// there (zero pages) where !Populated; Prefetched of them a prefetch
	// brought. Started is when their run began (zero where nobody times
	// it).
	EvArrived
	// EvDuplicated: Pages were copied to To, the other copies kept
	// (read duplication).
	EvDuplicated
	// EvEvicted: Pages were evicted from From (to To); Clean of them had
	// a copy elsewhere and only lost this one.
	EvEvicted
	// EvListed: Pages of the block on Processor may be evicted now, for
	// Cause: the eviction policy hears of them. EvDelisted: Pages may
	// not any more; None says Processor holds nothing of the block the
	// policy may evict.
	EvListed
	EvDelisted
	// EvRefaulted: N pages arrived again at Processor after an eviction
	// from it, Recent of them soon after it (the refault distance).
	EvRefaulted
	// EvProtected, EvUnprotected, EvDemoted: Pages joined Processor's
	// resident core, left it as their generation ended, or were evicted
	// from it where nothing else was left.
	EvProtected
	EvUnprotected
	EvDemoted
	// EvThrottled: the thrashing policy made Processor's fault on page
	// First wait a nap. EvPinned: it pinned page First in host memory
	// for Until.
	EvThrottled
	EvPinned
	// EvMappings: device views' mappings of the block may have to follow
	// its residency (remote mappings, pins): the server's remapper.
	EvMappings
	// EvRemoteMapped: Processor came to map N pages from First remotely.
	EvRemoteMapped
	// EvReadAhead: Pages were read ahead to To.
	EvReadAhead
	// EvDiscarded: Pages lost every copy (a discard).
	EvDiscarded
	// EvPrefetchAudit: of the pages prefetched to the host, N were used
	// and Unused were not.
	EvPrefetchAudit
	// EvLaunch: a launch handed the block to To: N pages copied, Clean
	// host copies dropped.
	EvLaunch
	// EvWholeMove: the whole block moved from From to To in one 2 MiB
	// folio. EvRebuilt: From's copy of the block was rebuilt in 4 KiB
	// folios before part of it left.
	EvWholeMove
	EvRebuilt
	// EvLostPage: page First, resident by the table in the file
	// Processor's view maps, was missing there (a zero page took its
	// place). EvBadVictim: the eviction policy named a block not the
	// engine's.
	EvLostPage
	EvBadVictim
)

// Event is one thing the engine did, as observers hear of it. Which
// fields mean something depends on Kind (see each kind).
type Event struct {
	Kind EventKind
	// R and B are the range and block, Block the block's index in R
	// (B and R nil for EvBadVictim).
	R     *Range
	B     *Block
	Block int
	// First is the page of the block the event starts at (the first of
	// Pages where they are given); N a count.
	First     int
	N         int
	Pages     core.PageMask
	From, To  core.Device
	Processor core.Device
	Cause     policy.Cause
	Populated bool
	None      bool
	Clean     int
	Recent    int
	Unused    int
	// The fault's (EvFault).
	Plan       Plan
	FaultKind  core.FaultKind
	Write      bool
	Failed     bool
	Thread     int32
	Prefetched int
	Started    time.Time
	Duration   time.Duration
	Until      time.Duration
	// Ctx is the serving thread's context (Mover.Thread), for the
	// observers of the server that keep state per thread.
	Ctx any
}

// Addr is the address of the event's first page.
func (e *Event) Addr() uintptr {
	return e.R.Start + uintptr(e.Block)*core.BlockSize + uintptr(e.First)*core.PageSize
}

// Observer hears of every event. It is called with the block's lock
// held: it must not block, take a block lock, or call back into the
// engine.
type Observer interface {
	Observe(e Event)
}

// ObserverFunc is a function that observes.
type ObserverFunc func(e Event)

// Observe calls f.
func (f ObserverFunc) Observe(e Event) { f(e) }

// sink fans every event out to the engine's own observer (the
// policies) and then to those of its Config.
type sink struct {
	observers []Observer
	// timed: some observer wants runs timed (Started); the clock is
	// read only then.
	timed bool
}

func newSink(e *Engine, extra []Observer) sink {
	s := sink{observers: append([]Observer{policyObserver{e}}, extra...)}
	for _, o := range extra {
		if t, ok := o.(interface{ Timed() bool }); ok && t.Timed() {
			s.timed = true
		}
	}
	return s
}

// Emit reports e to every observer: the engine's own events, and those
// its users report about the engine's ranges (remote mappings a device
// came to have).
func (e *Engine) Emit(ev Event) {
	for _, o := range e.sink.observers {
		o.Observe(ev)
	}
}

// Timed reports whether some observer wants events timed.
func (e *Engine) Timed() bool { return e.sink.timed }

// emit reports an event of the mover's block.
func (o *Mover) emit(ev Event) {
	ev.R, ev.B, ev.Block = o.R, o.B, o.blockIndex()
	if ev.Ctx == nil {
		ev.Ctx = o.Thread
	}
	o.R.eng.Emit(ev)
}

// policyObserver tells the policies what they hear of: the eviction
// policy the pages it may evict (EvListed, EvDelisted), the thrashing
// policy the migrations faults cause.
type policyObserver struct{ e *Engine }

func (p policyObserver) Observe(ev Event) {
	pol := p.e.pol
	switch ev.Kind {
	case EvListed:
		if ev.Pages.Empty() {
			return
		}
		if pol.PageEviction != nil {
			pol.PageEviction.ArrivedPages(ev.B.Ref, ev.Processor, ev.Pages, ev.Cause)
			return
		}
		pol.Eviction.Arrived(ev.B.Ref, ev.Processor, ev.Pages.Count(), ev.Cause)
	case EvDelisted:
		if pol.PageEviction != nil && !ev.Pages.Empty() {
			pol.PageEviction.LeftPages(ev.B.Ref, ev.Processor, ev.Pages)
		}
		if ev.None {
			pol.Eviction.Left(ev.B.Ref, ev.Processor)
		}
	case EvArrived:
		if th := pol.Thrashing; th != nil && ev.Populated && ev.Cause == policy.CauseFault {
			if ev.B.thrash == nil {
				ev.B.thrash = th.NewState()
			}
			th.Migrated(ev.B.thrash, ev.Pages, p.e.Now())
		}
	}
}

// Counters counts each event in its range's statistics (Range.Stats):
// every event is counted once, in the counters of the allocation it
// belongs to. The server observes with it; a replay, which counts what
// it reports in a result of its own, does not.
type Counters struct{}

func (Counters) Observe(ev Event) {
	if ev.R == nil {
		return
	}
	st := ev.R.Stats
	switch ev.Kind {
	case EvFault:
		st.Faults[ev.Processor.Slot()][ev.FaultKind].Add(1)
		st.Service.Record(ev.Duration)
	case EvArrived:
		n := ev.Pages.Count()
		if !ev.Populated {
			st.Populated[ev.To.Slot()].Add(uint64(n))
		} else {
			st.AddMigrated(ev.From, ev.To, ev.Cause, n)
		}
		if ev.Prefetched > 0 {
			st.Prefetched.Add(uint64(ev.Prefetched))
		}
	case EvDuplicated:
		st.ReadDuplicated[ev.To.Slot()].Add(uint64(ev.Pages.Count()))
	case EvEvicted:
		st.Evicted[ev.From.Slot()].Add(uint64(ev.Pages.Count()))
		if ev.From == core.CPU && ev.Clean > 0 {
			st.EvictedClean.Add(uint64(ev.Clean))
		}
	case EvRefaulted:
		st.Refaulted[ev.Processor.Slot()].Add(uint64(ev.N))
		st.RefaultedRecent[ev.Processor.Slot()].Add(uint64(ev.Recent))
	case EvProtected:
		st.Protected[ev.Processor.Slot()].Add(uint64(ev.Pages.Count()))
	case EvUnprotected:
		st.Unprotected[ev.Processor.Slot()].Add(uint64(ev.Pages.Count()))
	case EvDemoted:
		st.Demoted[ev.Processor.Slot()].Add(uint64(ev.N))
	case EvThrottled:
		st.Throttles[ev.Processor.Slot()].Add(1)
	case EvPinned:
		st.Pins[ev.Processor.Slot()].Add(1)
	case EvRemoteMapped:
		st.RemoteMapped[ev.Processor.Slot()].Add(uint64(ev.N))
	case EvReadAhead:
		st.ReadAhead.Add(uint64(ev.N))
	case EvDiscarded:
		st.Discarded.Add(uint64(ev.Pages.Count()))
	case EvPrefetchAudit:
		st.Used.Add(uint64(ev.N))
		st.Unused.Add(uint64(ev.Unused))
	case EvLaunch:
		st.LaunchCopied.Add(uint64(ev.N))
		st.LaunchClean.Add(uint64(ev.Clean))
	}
}
