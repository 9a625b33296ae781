package lab

import (
	"errors"
	"fmt"
	"io"
	"sort"
	"strings"
	"time"

	"github.com/softuvm/softuvm/internal/block"
	"github.com/softuvm/softuvm/internal/core"
	"github.com/softuvm/softuvm/policy"
	"github.com/softuvm/softuvm/trace"
)

// Config says what a replay runs: the policies (by the names the server
// takes) and the memory they run in. Zero fields take the trace's own:
// the policies and sizes its header records.
type Config struct {
	// Prefetch, Eviction and Thrashing are policy specs as `uvm serve`
	// takes them ("density:60", "lru", "threshold=4,nap=1ms", "off").
	// Eviction may also be "opt" (Belady's MIN, knowing the future) and
	// Prefetch "oracle" (bringing with each fault exactly the pages of
	// its block that will be touched there): the lab's bounds, which
	// only a replay can run.
	Prefetch  string
	Eviction  string
	Thrashing string
	// HostBudget and DeviceBytes are in bytes; 0 takes the trace's, and
	// a negative HostBudget means none.
	HostBudget  int64
	DeviceBytes int64
	// Devices is how many devices there are (0: the trace's, or one).
	Devices int
	// LargeFolios is "on", "off" or "" (the trace's).
	LargeFolios string
	// Costs prices what the replay counts (EstimatedTime); nil takes
	// what the trace measured, and defaults for the rest.
	Costs *Costs
	// Mechanism is the block engine's numbers (the zero value: the
	// server's defaults).
	Mechanism policy.Mechanism
}

// sim is a replay in progress: the block engine (internal/block), the
// server's own, run over simulated memory (memory.go).
type sim struct {
	hdr         trace.Header
	set         *policy.Set
	eng         *block.Engine
	hostBudget  int64 // bytes; 0: none
	capacity    int64 // pages of each device
	devices     int
	largeFolios bool
	arenas      []*block.CountedArena

	ranges    []*simRange // by start
	byID      map[uint64]*simRange
	lastRange *simRange

	now      policy.Clock
	scratch  block.Scratch
	mover    block.Mover // the fault's, reused: one of its own would be allocated each fault
	future   *future     // for the oracles; nil otherwise
	ref      int         // the index of the reference being served
	observer AccessObserver
	res      *Result
	measured costSamples
}

// simRange is one allocation of the trace.
type simRange struct {
	id    uint64
	start uint64
	pages int
	r     *block.Range // nil in a scan of the future
}

// AccessObserver is an optional interface of an eviction policy that
// wants to hear of touches, not only of arrivals: the replay tells it of
// every reference it serves (a fault, or a page the access mode saw
// touched), hit or miss. The server does not call it: it sees faults,
// not hits (see the lab's docs).
type AccessObserver interface {
	Touched(b *policy.Block, p policy.Processor, page int, write bool, now policy.Clock)
}

// ReplayFile replays the trace at path (plain or gzip-compressed).
func ReplayFile(path string, cfg Config) (*Result, error) {
	var fut *future
	if needsFuture(cfg) {
		r, err := trace.Open(path)
		if err != nil {
			return nil, err
		}
		fut, err = scanFuture(r)
		r.Close()
		if err != nil {
			return nil, err
		}
	}
	r, err := trace.Open(path)
	if err != nil {
		return nil, err
	}
	defer r.Close()
	res, err := replay(r, cfg, fut)
	if res != nil {
		res.Trace = path
	}
	return res, err
}

// Replay replays the events r reads. The oracles need the trace twice
// and are refused here: use ReplayFile or ReplayEvents.
func Replay(r *trace.Reader, cfg Config) (*Result, error) {
	if needsFuture(cfg) {
		return nil, fmt.Errorf("%w: the oracles read the trace twice: replay a file (ReplayFile) or events in memory (ReplayEvents)", core.ErrInvalidValue)
	}
	return replay(r, cfg, nil)
}

// ReplayEvents replays events held in memory, with header h.
func ReplayEvents(h trace.Header, events []trace.Event, cfg Config) (*Result, error) {
	return (&Loaded{Header: h, Events: events}).Replay(cfg)
}

// source is what a replay reads: trace.Reader, or events in memory.
type source interface {
	Header() trace.Header
	Next(e *trace.Event) error
}

type sliceSource struct {
	h      trace.Header
	events []trace.Event
	i      int
}

func (s *sliceSource) Header() trace.Header { return s.h }
func (s *sliceSource) Next(e *trace.Event) error {
	if s.i >= len(s.events) {
		return io.EOF
	}
	*e = s.events[s.i]
	s.i++
	return nil
}

func needsFuture(cfg Config) bool {
	return cfg.Eviction == OracleEviction || cfg.Prefetch == OraclePrefetch
}

// The oracles' names.
const (
	OracleEviction = "opt"
	OraclePrefetch = "oracle"
)

// newSim builds the policies and the memory cfg asks for over a trace
// with header h: the one policy set (policy.NewSet) the engine runs by.
func newSim(h trace.Header, cfg Config, fut *future) (*sim, error) {
	s := &sim{hdr: h, byID: map[uint64]*simRange{}, future: fut}
	pick := func(asked, kind string) string {
		if asked != "" {
			return asked
		}
		return h.Policies[kind]
	}
	var specs policy.Specs
	var err error
	prefetch := pick(cfg.Prefetch, "prefetch")
	if prefetch != OraclePrefetch {
		if specs.Prefetch, err = policy.ParsePrefetchSpec(prefetch); err != nil {
			return nil, fmt.Errorf("%w (or %q, the replay's bound)", err, OraclePrefetch)
		}
	}
	eviction := pick(cfg.Eviction, "eviction")
	if eviction != OracleEviction {
		specs.Eviction = eviction
	}
	// Thrashing: the header records the spec as ThrashingSpec.String
	// writes it, which ParseThrashingSpec reads back. A recorded spec
	// that says nothing of refaults was written by a server that had no
	// answer to them: its replay has none either.
	thrashingSpec := pick(cfg.Thrashing, "thrashing")
	if specs.Thrashing, err = policy.ParseThrashingSpec(thrashingSpec); err != nil {
		return nil, err
	}
	if cfg.Thrashing == "" && thrashingSpec != "" && !strings.Contains(thrashingSpec, "refault") {
		specs.Thrashing.Refault = false
	}
	specs.Mechanism = cfg.Mechanism
	if s.set, err = policy.NewSet(specs); err != nil {
		if eviction != OracleEviction && specs.Eviction != "" && policy.ValidateEviction(specs.Eviction) != nil {
			return nil, fmt.Errorf("%w (or %q, the replay's bound)", err, OracleEviction)
		}
		return nil, err
	}
	if prefetch == OraclePrefetch {
		s.set.Prefetch = &oraclePrefetch{s: s}
	}
	if eviction == OracleEviction {
		s.set.UseEviction(newOPT(s))
	}
	s.observer, _ = s.set.Eviction.(AccessObserver)
	if o, ok := s.set.Eviction.(policy.Observing); ok {
		o.Observe(hintFaults{})
	}
	// Memory.
	s.hostBudget = h.HostBudget
	switch {
	case cfg.HostBudget < 0:
		s.hostBudget = 0
	case cfg.HostBudget > 0:
		s.hostBudget = cfg.HostBudget
	}
	devBytes := h.DeviceBytes
	if cfg.DeviceBytes > 0 {
		devBytes = cfg.DeviceBytes
	}
	if devBytes <= 0 {
		devBytes = 1 << 40 // a trace that does not say: no limit
	}
	s.capacity = devBytes / core.PageSize
	s.devices = h.Devices
	if cfg.Devices > 0 {
		s.devices = cfg.Devices
	}
	if s.devices < 1 {
		s.devices = 1
	}
	if s.devices > core.MaxDevices {
		return nil, fmt.Errorf("%w: %d devices: want at most %d", core.ErrInvalidValue, s.devices, core.MaxDevices)
	}
	switch cfg.LargeFolios {
	case "":
		s.largeFolios = h.LargeFolios
	case "on":
		s.largeFolios = true
	case "off":
	default:
		return nil, fmt.Errorf("%w: large folios %q: want on or off", core.ErrInvalidValue, cfg.LargeFolios)
	}
	s.res = &Result{Prefetch: s.set.Prefetch.Name(), Eviction: s.set.Eviction.Name(), Thrashing: "off",
		HostBudget: s.hostBudget, DeviceBytes: s.capacity * core.PageSize, Devices: s.devices, LargeFolios: s.largeFolios}
	if s.set.Thrashing != nil {
		s.res.Thrashing = s.set.Thrashing.Name()
	}
	arenas := make([]block.Arena, s.devices)
	for d := range arenas {
		a := &block.CountedArena{Pages: s.capacity}
		s.arenas = append(s.arenas, a)
		arenas[d] = a
	}
	s.eng = block.New(block.Config{Policies: s.set, Arenas: arenas, HostBudget: s.hostBudget,
		Now:        func() int64 { return int64(s.now/policy.Clock(time.Microsecond)) + 1 },
		Background: func(f func()) { f() }, OwnVictims: eviction == OracleEviction,
		Observers: []block.Observer{counter{s.res}}})
	if cfg.Costs != nil {
		s.res.Costs = *cfg.Costs
		if s.res.Costs.Source == "" {
			s.res.Costs.Source = "given"
		}
	}
	return s, nil
}

// replay runs a whole trace.
func replay(src source, cfg Config, fut *future) (*Result, error) {
	started := time.Now()
	src = &reorder{src: src}
	s, err := newSim(src.Header(), cfg, fut)
	if err != nil {
		return nil, err
	}
	var e trace.Event
	for {
		err := src.Next(&e)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			if errors.Is(err, io.ErrUnexpectedEOF) {
				s.res.CutShort = true
				break
			}
			return nil, err
		}
		s.res.Events++
		s.event(&e)
	}
	s.res.Wall = time.Since(started)
	s.res.Recorded = s.measured.recorded
	if cfg.Costs == nil {
		s.res.Costs = s.measured.costs()
	}
	s.res.estimate()
	return s.res, nil
}

// event replays one event: references (faults, and pages the access
// mode saw touched) are served by the policies under test; the client's
// own operations (allocations, frees, prefetches, advice) are done
// again; what the recorded policies did (their migrations, evictions and
// prefetches) is left out, and only measured for the costs.
func (s *sim) event(e *trace.Event) {
	if e.Time > 0 {
		s.now = policy.Clock(e.Time)
	}
	if s.allocation(e) {
		return
	}
	switch e.Kind {
	case trace.KindFault:
		s.measured.fault(e)
		eachReference(e, s.reference)
	case trace.KindAccess:
		eachReference(e, s.lateReference)
	case trace.KindArm:
		s.arm(core.Device(e.Processor), e.Addr, e.Pages)
	case trace.KindDiscard:
		s.discard(e.Addr, e.Pages)
	case trace.KindMigration:
		s.measured.migration(e)
		switch trace.Cause(e.Cause) {
		case trace.CausePrefetch, trace.CauseAdvice, trace.CauseLaunch:
			// The client asked (a prefetch, advice, a launch under the
			// launch model): do it again.
			s.operation(core.Device(e.To), e.Addr, e.Pages, policy.Cause(e.Cause))
		}
	case trace.KindPopulate:
		switch trace.Cause(e.Cause) {
		case trace.CausePrefetch, trace.CauseAdvice, trace.CauseLaunch:
			s.operation(core.Device(e.To), e.Addr, e.Pages, policy.Cause(e.Cause))
		}
	case trace.KindLaunch:
		s.res.Launches++
	}
}

// allocation does what an allocation or a free of the trace asks, and
// reports whether e was one.
func (s *sim) allocation(e *trace.Event) bool {
	switch e.Kind {
	case trace.KindAlloc:
		s.addRange(e.Range, e.Addr, e.Bytes)
	case trace.KindFree:
		if r := s.byID[e.Range]; r != nil {
			s.freeRange(r)
		}
	default:
		return false
	}
	return true
}

// eachReference calls touch for each touch e records: a fault's page, or
// every page of an access mode's run. The replay serves references, and
// scanFuture numbers them for the oracles, through it, so that both
// count them alike.
func eachReference(e *trace.Event, touch func(p core.Device, addr uint64, write bool)) {
	switch e.Kind {
	case trace.KindFault:
		touch(core.Device(e.Processor), e.Addr, e.Write)
	case trace.KindAccess:
		for i := uint32(0); i < e.Pages; i++ {
			touch(core.Device(e.Processor), e.Addr+uint64(i)*core.PageSize, false)
		}
	}
}

// operation moves pages [addr, addr+pages) to dst for cause, as the
// client's prefetch (or advice, or launch) did in the recorded run.
func (s *sim) operation(dst core.Device, addr uint64, pages uint32, cause policy.Cause) {
	if int(dst) >= s.devices {
		return
	}
	s.eachBlock(addr, pages, func(o *block.Mover, want core.PageMask) {
		if cause == policy.CausePrefetch {
			_ = o.Prefetch(dst, want)
		} else {
			_ = o.MoveIn(dst, want, cause)
		}
	})
}

// arm replays an arming of the access mode: the host's pages leave its
// page table (the next touch is a MINOR fault where the host view
// registers them); a device's are its own process's business.
func (s *sim) arm(p core.Device, addr uint64, pages uint32) {
	if p != core.CPU {
		return
	}
	s.eachBlock(addr, pages, func(o *block.Mover, m core.PageMask) {
		tables(o.B).mapped[core.CPU.Slot()].AndNot(&m)
	})
}

// discard is the server's session.discard: every location's copies of
// pages [addr, addr+pages) go, and their next touch is a first touch.
func (s *sim) discard(addr uint64, pages uint32) {
	s.eachBlock(addr, pages, func(o *block.Mover, m core.PageMask) { o.Discard(m) })
}

// eachBlock calls fn for each block that pages [addr, addr+pages) cover,
// with the block locked and the pages of it they cover, until one lies
// outside every range.
func (s *sim) eachBlock(addr uint64, pages uint32, fn func(o *block.Mover, m core.PageMask)) {
	end := addr + uint64(pages)*core.PageSize
	for addr < end {
		sr := s.lookup(addr)
		if sr == nil {
			return
		}
		page := int((addr - sr.start) / core.PageSize)
		bi := page / core.PagesPerBlock
		b := sr.r.Block(bi)
		first := page % core.PagesPerBlock
		outer := min(b.Pages, first+int((end-addr)/core.PageSize))
		var m core.PageMask
		m.FillRange(first, outer)
		b.Lock()
		o := sr.r.NewMover(bi, b)
		o.Use(&s.scratch)
		fn(&o, m)
		b.Unlock()
		addr += uint64(outer-first) * core.PageSize
	}
}

// reference serves one touch of the page at addr by processor p. The
// references are numbered in the order they are served (sim.ref), as
// scanFuture numbers them for the oracles.
func (s *sim) reference(p core.Device, addr uint64, write bool) {
	s.serveReference(p, addr, write, false)
}

// lateReference serves a touch the access mode saw (trace.KindAccess):
// it happened some time in the window the event closes, not at the
// event's time, while the page was where the processor maps it (else it
// would have faulted, and the fault is in the trace). A page that is
// there now is a hit; one that has left since (the recorded run evicted
// it after the touch, and so does the replay) is not brought back for a
// touch already past: served as a fault at the window's end, it cost
// the fault and, the window's pages coming in address order, looked
// like a sweep to the prefetch policy (pointer_chase replayed 3% more
// bytes than it moved). The eviction policy hears of it either way.
func (s *sim) lateReference(p core.Device, addr uint64, write bool) {
	s.serveReference(p, addr, write, true)
}

func (s *sim) serveReference(p core.Device, addr uint64, write, late bool) {
	s.res.References++
	defer func() { s.ref++ }()
	sr := s.lookup(addr)
	if sr == nil || (p != core.CPU && int(p) >= s.devices) {
		s.res.Unserved++ // a page no allocation of the trace holds, or a device the replay lacks
		return
	}
	page := int((addr - sr.start) / core.PageSize)
	bi, x := page/core.PagesPerBlock, page%core.PagesPerBlock
	if late && !sr.r.Block(bi).Resident[p.Slot()].Test(x) {
		s.res.LateTouches++
	} else {
		s.touch(sr.r, bi, p, x, write)
	}
	if s.observer != nil {
		s.observer.Touched(sr.r.Block(bi).Ref, p, x, write, s.now)
	}
}

// touch is processor p's touch of page x of block bi of r, as the
// kernel takes it: nothing where p's view maps the page (but a write to
// a protected one), a MINOR fault where p's file holds it and its view
// registers them (else the kernel maps it), and else a fault the engine
// serves, as the server's handlers do.
func (s *sim) touch(r *block.Range, bi int, p core.Device, x int, write bool) {
	slot := p.Slot()
	b := r.Block(bi)
	t := tables(b)
	kind := core.FaultMissing
	switch {
	case t.mapped[slot].Test(x):
		if !write || !t.protected[slot].Test(x) {
			s.res.Hits++
			return
		}
		kind = core.FaultWP
	case b.Resident[slot].Test(x):
		// In p's file, not in its page table.
		if (space{s}).Continues(r, labView(p)) {
			kind = core.FaultMinor
			break
		}
		t.mapped[slot].Set(x) // the kernel maps it without the server
		if !write || !t.protected[slot].Test(x) {
			s.res.Hits++
			return
		}
		kind = core.FaultWP // mapped read-only over a marker
	case p != core.CPU && b.Pinned(s.eng, x) && b.Resident[core.CPU.Slot()].Test(x):
		// Pinned in host memory: the device maps the host copy.
		s.res.Hits++
		s.res.RemoteTouches++
		return
	}
	r.ReadAheadReached(p, bi)
	b.Lock()
	defer b.Unlock()
	o := &s.mover // reused: a mover of its own would be allocated each fault
	*o = r.NewMover(bi, b)
	o.FV = labView(p)
	o.Use(&s.scratch)
	f := block.Fault{Kind: kind, Write: write}
	for {
		plan, err := o.ServeFault(x, &f)
		switch {
		case errors.Is(err, block.ErrDeferred) && plan == block.PlanPinToHost:
			// The page is pinned in host memory now: the device maps
			// the host copy (the server's remapper), and reads it there.
			s.res.RemoteTouches++
		case errors.Is(err, block.ErrDeferred):
			// The processor waits a nap, then the fault is served
			// again, as the server's deferred faults are.
			f.Waits++
			f.NoNap = f.Waits > s.eng.Mechanism().PinWaits
			continue
		case err != nil:
			s.res.Refused++ // the server fails it: SIGBUS
		}
		o.Served(x, &f, plan, block.Event{Failed: err != nil})
		return
	}
}

// lookup finds the range holding addr.
func (s *sim) lookup(addr uint64) *simRange {
	if r := s.lastRange; r != nil && addr >= r.start && addr < r.start+uint64(r.pages)*core.PageSize {
		return r
	}
	i := sort.Search(len(s.ranges), func(i int) bool { return s.ranges[i].start > addr }) - 1
	if i < 0 {
		return nil
	}
	r := s.ranges[i]
	if addr >= r.start+uint64(r.pages)*core.PageSize {
		return nil
	}
	s.lastRange = r
	return r
}

// addRange adds an allocation; one at an address a live range covers
// replaces it (a trace whose free was lost). Its blocks are 2 MiB-aligned
// in the simulated files, as a server's managed ranges are.
func (s *sim) addRange(id, start, bytes uint64) {
	if old := s.lookup(start); old != nil {
		s.freeRange(old)
	}
	pages := int((bytes + core.PageSize - 1) / core.PageSize)
	r := &simRange{id: id, start: start, pages: pages}
	if s.eng != nil {
		r.r = s.eng.NewRange(space{s}, uintptr(start), uintptr(pages)*core.PageSize)
		r.r.FileOff, r.r.ID, r.r.Session, r.r.Kind, r.r.Prefetch = 0, id, 1, core.KindManaged, s.set.Prefetch
	}
	i := sort.Search(len(s.ranges), func(i int) bool { return s.ranges[i].start > start })
	s.ranges = append(s.ranges, nil)
	copy(s.ranges[i+1:], s.ranges[i:])
	s.ranges[i] = r
	s.byID[id] = r
}

// freeRange drops an allocation: its pages leave every location, as the
// server's free does.
func (s *sim) freeRange(sr *simRange) {
	if sr.r != nil {
		resident := sr.r.Free()
		for d, a := range s.arenas {
			a.Release(resident[d+1])
		}
	}
	i := sort.Search(len(s.ranges), func(i int) bool { return s.ranges[i].start >= sr.start })
	if i < len(s.ranges) && s.ranges[i] == sr {
		s.ranges = append(s.ranges[:i], s.ranges[i+1:]...)
	}
	delete(s.byID, sr.id)
	if s.lastRange == sr {
		s.lastRange = nil
	}
}
