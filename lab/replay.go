package lab

import (
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/softuvm/softuvm/internal/core"
	"github.com/softuvm/softuvm/internal/workingset"
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
}

// sim is a replay in progress.
type sim struct {
	hdr          trace.Header
	prefetch     policy.PrefetchPolicy
	eviction     policy.Eviction
	pageEviction policy.PageEviction
	thrashing    policy.Thrashing
	hostBudget   int64 // bytes; 0: none
	capacity     int64 // pages of each device
	devices      int
	largeFolios  bool
	hostMinor    bool // the host view registers MINOR faults
	deviceMinor  bool // device views register MINOR faults over their own files

	ranges    []*simRange // by start
	byID      map[uint64]*simRange
	lastRange *simRange
	used      [maxLocs]int64 // pages resident per location

	now         policy.Clock
	prefetchCtx policy.PrefetchContext
	future      *future   // for the oracles; nil otherwise
	ref         int       // the index of the reference being served
	serving     *simBlock // the block whose move is evicting: never its own victim,
	// except under the oracle (evictsOwn), which spares only the pages
	// the move brings (keep): the server skips the block whose lock it
	// holds, Belady's MIN knows no blocks.
	evictsOwn bool
	keep      core.PageMask
	observer  AccessObserver
	// refaulting is the thrashing policy where it answers refaults, and
	// ws the processors' refault stamps and resident cores
	// (workingset.go).
	refaulting policy.Refaulting
	ws         *workingset.Set[*simBlock]
	res        *Result
	measured   costSamples
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
// with header h.
func newSim(h trace.Header, cfg Config, fut *future) (*sim, error) {
	s := &sim{hdr: h, byID: map[uint64]*simRange{}, future: fut}
	pick := func(asked, kind string) string {
		if asked != "" {
			return asked
		}
		return h.Policies[kind]
	}
	var err error
	// Prefetch.
	switch spec := pick(cfg.Prefetch, "prefetch"); spec {
	case OraclePrefetch:
		s.prefetch = &oraclePrefetch{s: s}
	default:
		ps, perr := policy.ParsePrefetchSpec(spec)
		if perr != nil {
			return nil, fmt.Errorf("%w (or %q, the replay's bound)", perr, OraclePrefetch)
		}
		if s.prefetch, err = policy.NewPrefetchPolicy(ps); err != nil {
			return nil, err
		}
	}
	// Eviction.
	switch spec := pick(cfg.Eviction, "eviction"); spec {
	case OracleEviction:
		s.eviction = newOPT(s)
		s.evictsOwn = true
	default:
		if s.eviction, err = policy.NewEviction(spec); err != nil {
			return nil, fmt.Errorf("%w (or %q, the replay's bound)", err, OracleEviction)
		}
	}
	s.pageEviction, _ = s.eviction.(policy.PageEviction)
	s.observer, _ = s.eviction.(AccessObserver)
	if o, ok := s.eviction.(policy.Observing); ok {
		o.Observe(hintFaults{s})
	}
	// Thrashing: the header records the spec as ThrashingSpec.String
	// writes it, which ParseThrashingSpec reads back. A recorded spec
	// that says nothing of refaults was written by a server that had no
	// answer to them: its replay has none either.
	thrashingSpec := pick(cfg.Thrashing, "thrashing")
	ts, err := policy.ParseThrashingSpec(thrashingSpec)
	if err != nil {
		return nil, err
	}
	if cfg.Thrashing == "" && thrashingSpec != "" && !strings.Contains(thrashingSpec, "refault") {
		ts.Refault = false
	}
	if ts.Enabled {
		if s.thrashing, err = policy.NewThrashing(ts); err != nil {
			return nil, err
		}
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
	// The host view registers MINOR faults where the host file takes
	// large folios, and a device's view over its own file where its
	// arena does, under the fault coherence model (server:
	// session.hostMinor, session.deviceMinor); replays assume that
	// model, and that the arenas take large folios where the host file
	// does.
	s.hostMinor = s.largeFolios
	s.deviceMinor = s.largeFolios
	s.res = &Result{Prefetch: s.prefetch.Name(), Eviction: s.eviction.Name(), Thrashing: "off",
		HostBudget: s.hostBudget, DeviceBytes: s.capacity * core.PageSize, Devices: s.devices, LargeFolios: s.largeFolios}
	if s.thrashing != nil {
		s.res.Thrashing = s.thrashing.Name()
	}
	s.setRefaultLimits()
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
		eachReference(e, s.reference)
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
	s.eachBlock(addr, pages, func(b *simBlock, want core.PageMask) {
		o := mover{s: s, b: b, cause: cause, via: true}
		o.moveTo(dst, want, core.PageMask{})
	})
}

// arm replays an arming of the access mode: the host's pages leave its
// page table (the next touch is a MINOR fault where the host view
// registers them); a device's are its own process's business.
func (s *sim) arm(p core.Device, addr uint64, pages uint32) {
	if p != core.CPU {
		return
	}
	s.eachBlock(addr, pages, func(b *simBlock, m core.PageMask) { b.hostMapped.AndNot(&m) })
}

// eachBlock calls fn for each block that pages [addr, addr+pages) cover,
// with the pages of it they cover, until one lies outside every range.
func (s *sim) eachBlock(addr uint64, pages uint32, fn func(b *simBlock, m core.PageMask)) {
	end := addr + uint64(pages)*core.PageSize
	for addr < end {
		r := s.lookup(addr)
		if r == nil {
			return
		}
		page := int((addr - r.start) / core.PageSize)
		b := s.block(r, page/core.PagesPerBlock)
		first := page % core.PagesPerBlock
		outer := min(b.pages, first+int((end-addr)/core.PageSize))
		var m core.PageMask
		m.FillRange(first, outer)
		fn(b, m)
		addr += uint64(outer-first) * core.PageSize
	}
}

// reference serves one touch of the page at addr by processor p. The
// references are numbered in the order they are served (sim.ref), as
// scanFuture numbers them for the oracles.
func (s *sim) reference(p core.Device, addr uint64, write bool) {
	s.res.References++
	defer func() { s.ref++ }()
	r := s.lookup(addr)
	if r == nil || (p != core.CPU && int(p) >= s.devices) {
		s.res.Unserved++ // a page no allocation of the trace holds, or a device the replay lacks
		return
	}
	page := int((addr - r.start) / core.PageSize)
	b := s.block(r, page/core.PagesPerBlock)
	x := page % core.PagesPerBlock
	s.fault(b, p, x, write)
	if s.observer != nil {
		s.observer.Touched(b.ref, p, x, write, s.now)
	}
}

// fault serves a touch of page x of block b by processor p: nothing
// where p has it mapped, a MINOR fault where the host's file has it but
// its page table does not, and else the server's decision (decideFault)
// for a page elsewhere or nowhere: thrashing, then the prefetch policy,
// then the move and what it evicts.
func (s *sim) fault(b *simBlock, p core.Device, x int, write bool) {
	slot := p.Slot()
	if b.resident[slot].Test(x) {
		if p != core.CPU && s.deviceMinor && b.unmapped[slot].Test(x) {
			// In the device's file, not in its page table: one
			// UFFDIO_CONTINUE maps the block's pages, writable.
			s.res.Faults[slot]++
			s.res.MinorFaults++
			b.wpMarked[slot].AndNot(&b.unmapped[slot])
			b.unmapped[slot] = core.PageMask{}
			return
		}
		if p != core.CPU && write && b.wpMarked[slot].Test(x) {
			// A device's first write to a page that came back to its
			// file without its own install.
			s.res.Faults[slot]++
			s.res.WriteProtectFaults++
			b.wpMarked[slot].Clear(x)
			return
		}
		if p != core.CPU || b.hostMapped.Test(x) {
			s.res.Hits++
			return
		}
		// In the host's file, not in its page table.
		if s.hostMinor {
			s.res.Faults[slot]++
			s.res.MinorFaults++
			mapped := b.resident[slot]
			if b.watchRegions {
				region := policy.RegionOf(x)
				mapped.And(&region)
			}
			b.hostMapped.Or(&mapped)
		} else {
			s.res.Hits++ // the kernel maps it without asking the server
			b.hostMapped.Set(x)
		}
		return
	}
	if p != core.CPU && s.pinned(b, x) && b.resident[core.CPU.Slot()].Test(x) {
		// Pinned in host memory: the device maps the host copy.
		s.res.Hits++
		s.res.RemoteTouches++
		return
	}
	s.res.Faults[slot]++
	src, populated := b.locationOfPage(x)
	var faulted core.PageMask
	faulted.Set(x)
	o := mover{s: s, b: b, cause: policy.CauseFault, fault: true, via: true, demand: faulted}
	if populated && src != p && s.thrashing != nil && b.thrash != nil {
		f := policy.ThrashFault{Processor: p, Page: x, HostPreferred: true, Now: s.now}
		switch s.thrashing.Check(b.thrash, f) {
		case policy.ThrashThrottle:
			// The processor waits a nap, then the fault is served
			// without asking again.
			s.res.Throttles++
			s.res.NapTime += s.thrashing.Nap()
		case policy.ThrashPin:
			s.res.Pins++
			fallthrough
		case policy.ThrashPinned:
			if p != core.CPU {
				// Bring the page to the host; the device maps it there.
				o.moveTo(core.CPU, faulted, core.PageMask{})
				s.res.RemoteTouches++
				return
			}
		}
	}
	extra := o.expand(p, faulted)
	if !o.moveTo(p, faulted, extra) {
		s.res.Refused++
	}
}

// pinned reports whether the thrashing policy has page x of b pinned in
// host memory now.
func (s *sim) pinned(b *simBlock, x int) bool {
	return s.thrashing != nil && b.thrash != nil && s.thrashing.Pinned(b.thrash, x, s.now)
}
