package export

import (
	"bufio"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
	"time"
	"unicode/utf8"

	"github.com/softuvm/softuvm/trace"
)

// Perfetto writes events (a whole trace, as trace.ReadFile returns it)
// as Chrome trace-event JSON; see the package comment for the layout.
func Perfetto(w io.Writer, h trace.Header, events []trace.Event) error {
	p := newPerfetto(w)
	for i := range events {
		p.add(&events[i])
	}
	return p.finish(h, 0)
}

// PerfettoFrom writes the events r has left as Perfetto does, reading
// them one at a time: what it keeps is a few words per fault and per
// fault-caused migration (to draw the flows between them once every
// candidate has been seen), per open allocation and session, and per
// 10 ms of migration bandwidth. It returns how many events it read.
// When reading fails, the JSON still closes, holding every event before
// the failure, and the error is returned: for a trace cut short (its
// writer killed) it wraps io.ErrUnexpectedEOF.
func PerfettoFrom(w io.Writer, r *trace.Reader) (int, error) {
	p := newPerfetto(w)
	var e trace.Event
	for {
		err := r.Next(&e)
		if errors.Is(err, io.EOF) {
			return p.events, p.finish(r.Header(), r.Dropped())
		}
		if err != nil {
			if ferr := p.finish(r.Header(), r.Dropped()); ferr != nil {
				return p.events, ferr
			}
			return p.events, err
		}
		p.add(&e)
	}
}

// The JSON pids. A processor p (CPU is -1) is pid p+2, so that "cpu" is
// 1 and "device 0" is 2 in every export; processor numbers no server
// makes get pids from firstOddPid on. Thread ids are unique across the
// whole file (from firstTid), because Perfetto's JSON importer keys a
// thread by its tid and gets confused when two processes share one.
const (
	maxPlainProcessor = 8000
	firstOddPid       = 8000
	pidAllocations    = 9998
	pidClients        = 9999
	firstTid          = 10000
)

// bandwidthBin is the width of the migration bandwidth counter's bins.
const bandwidthBin = 10 * time.Millisecond

// blockShift makes an address its 2 MiB block, the unit the server
// migrates in, for matching a migration to its fault.
const blockShift = 21

// trackKind is a row of a processor's process, in display order.
type trackKind uint8

const (
	trackFaults trackKind = iota
	trackMigrations
	trackEvictions
	trackPopulate
	trackRemoteMaps
	trackDuplicates
	trackLaunches
	trackSyncs
	trackArms
	trackAccesses
	trackSessions
	trackDiscards
	trackProtects
)

var trackNames = [...]string{
	trackFaults: "faults", trackMigrations: "migrations in", trackEvictions: "evictions", trackPopulate: "populate",
	trackRemoteMaps: "remote maps", trackDuplicates: "duplicates in", trackLaunches: "launches", trackSyncs: "syncs",
	trackArms: "armed (access mode)", trackAccesses: "accesses (access mode)", trackSessions: "sessions",
	trackDiscards: "discards", trackProtects: "protected (resident core)",
}

// trackKey names a track: a kind of row of one JSON process, and for
// faults the client thread (for sessions the client process).
type trackKey struct {
	pid    int
	kind   trackKind
	client int32
	thread int32
}

// A track is one or more thread rows ("lanes"). Complete ("X") slices
// on one thread must nest, and Perfetto's importer drops or mangles
// those that overlap partially, so a slice goes on the first lane whose
// slices all ended by its start, and a new lane is opened when none
// has. Faults get a track per client thread: a thread's faults follow
// one another (it is blocked in each until the server resolves it), so
// that track almost always has one lane, and each row reads like
// Nsight Systems' per-thread fault rows. Async slices ("b"/"e") would
// avoid lanes altogether, but Perfetto makes a track per async id and
// merges them back by name, which is slow with millions of faults and
// loses the per-thread reading. Events come nearly in time order, and
// the rule is safe in any order: a slice that comes late merely opens
// a lane more.
type track struct {
	name  string
	lanes []lane
}

type lane struct {
	tid int
	end int64 // the latest end of a slice on it, in ns
}

// flowKey is what a fault and the migrations it caused share.
type flowKey struct {
	pid       int32
	processor int32
	rng       uint64
	block     uint64
}

// faultRec is what is kept of a fault to start a flow from it: 24
// bytes, as there may be millions. Its process is its key's processor's.
type faultRec struct {
	at   int64
	key  uint32
	tid  int32
	took uint32 // ns; a fault or copy of over 4 s is cut, which only moves an arrow's end
}

// migRec is what is kept of a fault-caused migration to end a flow on.
type migRec faultRec

type openAlloc struct {
	at    int64
	pid   int32
	addr  uint64
	bytes uint64
}

type openSession struct {
	at   int64
	name string
}

type direction struct{ from, to int32 }

type perfetto struct {
	out    *bufio.Writer
	buf    []byte
	items  int // trace events written, for the commas
	inArgs bool
	nargs  int
	events int // trace.Events read
	err    error

	pids    map[int32]int
	oddPids int
	named   map[int]bool // JSON pids whose process_name is written
	tracks  map[trackKey]*track
	nextTid int
	rows    int // thread rows made, for their sort index

	keys   map[flowKey]uint32
	keyOf  []flowKey // by id
	faults []faultRec
	migs   []migRec

	allocs   map[uint64]openAlloc
	sessions map[int32][]openSession
	bins     map[direction]map[int64]uint64
	end      int64 // the latest time any event reaches, in ns
	seen     bool
}

func newPerfetto(w io.Writer) *perfetto {
	p := &perfetto{out: bufio.NewWriterSize(w, 1<<20), pids: map[int32]int{}, named: map[int]bool{},
		tracks: map[trackKey]*track{}, nextTid: firstTid, keys: map[flowKey]uint32{},
		allocs: map[uint64]openAlloc{}, sessions: map[int32][]openSession{}, bins: map[direction]map[int64]uint64{}}
	p.buf = append(p.buf, `{"traceEvents":[`...)
	return p
}

// pid is the JSON process of processor n, named on first use.
func (p *perfetto) pid(n int32) int {
	if pid, ok := p.pids[n]; ok {
		return pid
	}
	var pid int
	if n >= trace.CPU && n < maxPlainProcessor {
		pid = int(n) + 2
	} else {
		pid = firstOddPid + p.oddPids
		p.oddPids++
	}
	p.pids[n] = pid
	p.process(pid, trace.ProcessorName(n), int(n)+1)
	return pid
}

// process names JSON process pid, once.
func (p *perfetto) process(pid int, name string, sort int) {
	if p.named[pid] {
		return
	}
	p.named[pid] = true
	p.meta("process_name", pid, -1, "name", name)
	p.metaInt("process_sort_index", pid, -1, "sort_index", sort)
}

// row makes a thread row of process pid.
func (p *perfetto) row(pid int, name string, kind trackKind) int {
	tid := p.nextTid
	p.nextTid++
	p.rows++
	p.meta("thread_name", pid, tid, "name", name)
	p.metaInt("thread_sort_index", pid, tid, "sort_index", int(kind)<<24+p.rows)
	return tid
}

// lane is the thread row a slice from at to end goes on. An instant
// (instant true) always goes on the first: taking no time, it cannot
// overlap anything partially.
func (p *perfetto) lane(k trackKey, at, end int64, instant bool) int {
	t := p.tracks[k]
	if t == nil {
		t = &track{name: trackName(k)}
		p.tracks[k] = t
	}
	for i := range t.lanes {
		l := &t.lanes[i]
		if instant || l.end <= at {
			l.end = max(l.end, end)
			return l.tid
		}
	}
	name := t.name
	if n := len(t.lanes); n > 0 {
		name = fmt.Sprintf("%s (%d)", name, n+1)
	}
	t.lanes = append(t.lanes, lane{tid: p.row(k.pid, name, k.kind), end: end})
	return t.lanes[len(t.lanes)-1].tid
}

func trackName(k trackKey) string {
	switch {
	case k.kind == trackFaults && k.thread != 0:
		return fmt.Sprintf("faults, thread %d", k.thread)
	case k.kind == trackFaults:
		return fmt.Sprintf("faults, pid %d", k.client) // the kernel did not say which thread
	case k.kind == trackSessions:
		return fmt.Sprintf("pid %d", k.client)
	}
	return trackNames[k.kind]
}

func (p *perfetto) add(e *trace.Event) {
	p.events++
	at, took := int64(e.Time), int64(max(e.Duration, 0))
	if e.Kind == trace.KindAccess {
		took = 0 // its Duration is the window before Time
	}
	if !p.seen || at+took > p.end {
		p.end, p.seen = at+took, true
	}
	switch e.Kind {
	case trace.KindFault:
		pid := p.pid(e.Processor)
		tid := p.lane(trackKey{pid: pid, kind: trackFaults, client: e.PID, thread: e.Thread}, at, at+took, false)
		access := "read"
		if e.Write {
			access = "write"
		}
		p.begin("X", access+" fault ("+e.FaultKind.String()+")", "fault", pid, tid, at)
		p.dur(took)
		p.args()
		p.argHex("address", e.Addr)
		p.argStr("kind", e.FaultKind.String())
		p.argStr("access", access)
		p.argInt("prefetched pages", int64(e.Prefetched))
		p.argInt("pid", int64(e.PID))
		p.argInt("thread", int64(e.Thread))
		p.argInt("range", int64(e.Range))
		p.close()
		p.faults = append(p.faults, faultRec{key: p.key(e.PID, e.Processor, e.Range, e.Addr), tid: int32(tid), at: at, took: uint32(min(took, math.MaxUint32))})
	case trace.KindMigration:
		pid := p.pid(e.To)
		p.pid(e.From) // a row for the source too, though nothing may happen on it
		tid := p.lane(trackKey{pid: pid, kind: trackMigrations}, at, at+took, false)
		p.begin("X", e.Cause.String()+" from "+trace.ProcessorName(e.From), "migration", pid, tid, at)
		p.dur(took)
		p.args()
		p.argStr("from", trace.ProcessorName(e.From))
		p.argStr("to", trace.ProcessorName(e.To))
		p.argStr("cause", e.Cause.String())
		p.pageArgs(e)
		p.close()
		if e.Cause == trace.CauseFault {
			p.migs = append(p.migs, migRec{key: p.key(e.PID, e.To, e.Range, e.Addr), tid: int32(tid), at: at, took: uint32(min(took, math.MaxUint32))})
		}
		d := direction{e.From, e.To}
		if p.bins[d] == nil {
			p.bins[d] = map[int64]uint64{}
		}
		p.bins[d][floorDiv(at, int64(bandwidthBin))] += e.MovedBytes()
	case trace.KindEviction:
		p.pages(e, e.From, trackEvictions, "eviction")
	case trace.KindPopulate:
		p.pages(e, e.To, trackPopulate, "populate")
	case trace.KindRemoteMap:
		p.pages(e, e.Processor, trackRemoteMaps, "remote map")
	case trace.KindDuplicate:
		p.pages(e, e.To, trackDuplicates, "duplicate")
	case trace.KindArm:
		p.pages(e, e.Processor, trackArms, "armed")
	case trace.KindDiscard:
		p.pages(e, trace.CPU, trackDiscards, "discarded") // every location's copies: shown on the host's row
	case trace.KindProtect:
		p.pages(e, e.Processor, trackProtects, "protected")
	case trace.KindAccess:
		// A slice over the window in which the pages were touched.
		pid := p.pid(e.Processor)
		window := int64(max(e.Duration, 0))
		start := at - window
		tid := p.lane(trackKey{pid: pid, kind: trackAccesses}, start, at, false)
		p.begin("X", "accessed", "access", pid, tid, start)
		p.dur(window)
		p.args()
		p.pageArgs(e)
		p.close()
	case trace.KindLaunch:
		pid := p.pid(e.Processor)
		tid := p.lane(trackKey{pid: pid, kind: trackLaunches}, at, at, true)
		name := e.Name
		if name == "" {
			name = "launch"
		}
		p.begin("i", name, "launch", pid, tid, at)
		p.buf = append(p.buf, `,"s":"t"`...)
		p.args()
		p.argInt("stream", int64(e.Stream))
		p.argInt("pid", int64(e.PID))
		p.argStr("kernel", e.Name)
		p.close()
	case trace.KindSync:
		pid := p.pid(e.Processor)
		tid := p.lane(trackKey{pid: pid, kind: trackSyncs}, at, at+took, false)
		name := fmt.Sprintf("sync stream %d", e.Stream)
		if e.Stream == 0 {
			name = "sync" // the default stream, or the whole context
		}
		p.begin("X", name, "sync", pid, tid, at)
		p.dur(took)
		p.args()
		p.argInt("stream", int64(e.Stream))
		p.argInt("pid", int64(e.PID))
		p.close()
	case trace.KindAlloc:
		if a, ok := p.allocs[e.Range]; ok { // a number used twice: the first ends here
			p.allocation(e.Range, a, at, "")
		}
		p.allocs[e.Range] = openAlloc{at: at, pid: e.PID, addr: e.Addr, bytes: e.Bytes}
	case trace.KindFree:
		a, ok := p.allocs[e.Range]
		if !ok { // allocated before the trace began
			a = openAlloc{at: 0, pid: e.PID, addr: e.Addr}
		}
		delete(p.allocs, e.Range)
		p.allocation(e.Range, a, at, "")
	case trace.KindSession:
		p.sessions[e.PID] = append(p.sessions[e.PID], openSession{at: at, name: e.Name})
	case trace.KindSessionEnd:
		open := p.sessions[e.PID]
		s := openSession{at: 0} // connected before the trace began
		if len(open) > 0 {
			s, p.sessions[e.PID] = open[0], open[1:]
		}
		p.session(e.PID, s, at, "")
	}
}

// pages writes an event that covers pages but takes no time of its own
// as an instant on processor n's track of kind k.
func (p *perfetto) pages(e *trace.Event, n int32, k trackKind, name string) {
	pid := p.pid(n)
	tid := p.lane(trackKey{pid: pid, kind: k}, int64(e.Time), int64(e.Time), true)
	p.begin("i", name, e.Kind.String(), pid, tid, int64(e.Time))
	p.buf = append(p.buf, `,"s":"t"`...)
	p.args()
	p.pageArgs(e)
	p.close()
}

// pageArgs writes the arguments of an event that covers pages: their
// count, bytes, first address, client and allocation.
func (p *perfetto) pageArgs(e *trace.Event) {
	p.argInt("pages", int64(e.Pages))
	p.argInt("bytes", int64(e.MovedBytes()))
	p.argHex("address", e.Addr)
	p.argInt("pid", int64(e.PID))
	p.argInt("range", int64(e.Range))
}

// allocation writes allocation rng's slice, on a row of its own.
func (p *perfetto) allocation(rng uint64, a openAlloc, end int64, note string) {
	p.process(pidAllocations, "allocations", 1<<20)
	name := hex(a.addr)
	if a.bytes > 0 {
		name += " (" + trace.HumanSize(a.bytes) + ")"
	} else {
		name += " (allocated before the trace)"
	}
	tid := p.row(pidAllocations, name, 0)
	p.begin("X", name, "allocation", pidAllocations, tid, a.at)
	p.dur(max(end-a.at, 0))
	p.args()
	p.argHex("address", a.addr)
	p.argInt("bytes", int64(a.bytes))
	p.argInt("pid", int64(a.pid))
	p.argInt("range", int64(rng))
	if note != "" {
		p.argStr("note", note)
	}
	p.close()
}

// session writes a client's connection as a slice on its row.
func (p *perfetto) session(pid int32, s openSession, end int64, note string) {
	p.process(pidClients, "clients", 1<<20+1)
	tid := p.lane(trackKey{pid: pidClients, kind: trackSessions, client: pid}, s.at, end, false)
	name := s.name
	if name == "" {
		name = "session"
	}
	p.begin("X", name, "session", pidClients, tid, s.at)
	p.dur(max(end-s.at, 0))
	p.args()
	p.argInt("pid", int64(pid))
	p.argStr("command", s.name)
	if note != "" {
		p.argStr("note", note)
	}
	p.close()
}

func (p *perfetto) key(pid, processor int32, rng, addr uint64) uint32 {
	k := flowKey{pid, processor, rng, addr >> blockShift}
	id, ok := p.keys[k]
	if !ok {
		id = uint32(len(p.keys))
		p.keys[k] = id
		p.keyOf = append(p.keyOf, k)
	}
	return id
}

// flows links each fault-caused migration to its fault: the latest fault
// (by Time, and the last written among equals) at or before the
// migration's start of the same client, allocation and 2 MiB block, on
// the processor the pages went to. The server moves a block's pages for
// the fault that wanted them, so that fault is almost always the one;
// when two threads of the processor fault in one block at once, the
// arrow may start from the other's fault. The file order cannot decide
// it: a fault is written when it is resolved, after the migrations it
// caused. Each flow is an "s" on the fault's slice and an "f" that binds
// to its enclosing slice ("bp":"e") on the migration's. Both lie inside
// their slices, not at their starts: Perfetto binds a flow event to the
// slice open on its row when it reads it, and among equal timestamps
// the flow event may come first and find none. The "s" lies halfway
// from the fault's start to the migration's (when the fault lasts that
// long), so that chrome://tracing, which draws from one flow event to
// the other, draws the arrow forward in time.
func (p *perfetto) flows() {
	order := func(a, b faultRec) int { return cmp.Or(cmp.Compare(a.key, b.key), cmp.Compare(a.at, b.at)) }
	slices.SortStableFunc(p.faults, order)
	id := 0
	for _, m := range p.migs {
		// The first fault after m's start among those of its key,
		// then one back.
		i, _ := slices.BinarySearchFunc(p.faults, faultRec{key: m.key, at: m.at + 1}, order)
		if i == 0 || p.faults[i-1].key != m.key {
			continue
		}
		f := p.faults[i-1]
		id++
		pid := p.pids[p.keyOf[m.key].processor] // the fault's processor is the migration's To
		window := min(m.at, f.at+int64(f.took)) - f.at
		if window < 2 {
			window = int64(f.took)
		}
		p.begin("s", "fault -> migration", "flow", pid, int(f.tid), f.at+window/2)
		p.buf = append(p.buf, `,"id":`...)
		p.buf = strconv.AppendInt(p.buf, int64(id), 10)
		p.close()
		p.begin("f", "fault -> migration", "flow", pid, int(m.tid), m.at+int64(m.took)/2)
		p.buf = append(p.buf, `,"id":`...)
		p.buf = strconv.AppendInt(p.buf, int64(id), 10)
		p.buf = append(p.buf, `,"bp":"e"`...)
		p.close()
	}
	p.faults, p.migs, p.keys, p.keyOf = nil, nil, nil, nil
}

// bandwidth writes each direction's bytes per bin as MB/s counters on
// the destination's process, a migration counted whole in the bin it
// began in, and a zero after each run of busy bins so the line drops.
func (p *perfetto) bandwidth() {
	dirs := make([]direction, 0, len(p.bins))
	for d := range p.bins {
		dirs = append(dirs, d)
	}
	slices.SortFunc(dirs, func(a, b direction) int { return cmp.Or(cmp.Compare(a.from, b.from), cmp.Compare(a.to, b.to)) })
	for _, d := range dirs {
		pid := p.pid(d.to)
		arg := "from " + trace.ProcessorName(d.from)
		bins := make([]int64, 0, len(p.bins[d]))
		for b := range p.bins[d] {
			bins = append(bins, b)
		}
		slices.Sort(bins)
		for i, b := range bins {
			p.counter(pid, b*int64(bandwidthBin), arg, float64(p.bins[d][b])/(bandwidthBin.Seconds()*1e6))
			if i == len(bins)-1 || bins[i+1] != b+1 {
				p.counter(pid, (b+1)*int64(bandwidthBin), arg, 0)
			}
		}
	}
}

func (p *perfetto) counter(pid int, at int64, arg string, v float64) {
	p.begin("C", "migration bandwidth MB/s", "migration", pid, -1, at)
	p.args()
	p.arg(arg)
	p.buf = strconv.AppendFloat(p.buf, v, 'f', -1, 64)
	p.close()
}

// finish closes what is open at the trace's end, draws the flows and
// counters, and writes the metadata.
func (p *perfetto) finish(h trace.Header, dropped uint64) error {
	ranges := make([]uint64, 0, len(p.allocs))
	for r := range p.allocs {
		ranges = append(ranges, r)
	}
	slices.Sort(ranges)
	for _, r := range ranges {
		p.allocation(r, p.allocs[r], p.end, "not freed before the trace ended")
	}
	pids := make([]int32, 0, len(p.sessions))
	for pid := range p.sessions {
		pids = append(pids, pid)
	}
	slices.Sort(pids)
	for _, pid := range pids {
		for _, s := range p.sessions[pid] {
			p.session(pid, s, p.end, "still connected when the trace ended")
		}
	}
	p.flows()
	p.bandwidth()
	meta, err := json.Marshal(struct {
		trace.Header
		Events   int    `json:"events"`
		Dropped  uint64 `json:"dropped"`
		Exporter string `json:"exporter"`
	}{h, p.events, dropped, "softuvm trace/export"})
	if err != nil {
		return fmt.Errorf("perfetto export: %w", err)
	}
	p.buf = append(p.buf, "\n],\n"+`"displayTimeUnit":"ns",`+"\n"+`"metadata":`...)
	p.buf = append(p.buf, meta...)
	p.buf = append(p.buf, "}\n"...)
	p.flush()
	if p.err == nil {
		p.err = p.out.Flush()
	}
	if p.err != nil {
		return fmt.Errorf("perfetto export: %w", p.err)
	}
	return nil
}

// The writing of one trace event: begin, the fields, args and arg..., close.

func (p *perfetto) begin(ph, name, cat string, pid, tid int, at int64) {
	if p.items > 0 {
		p.buf = append(p.buf, ',')
	}
	p.items++
	p.buf = append(p.buf, "\n"+`{"ph":"`...)
	p.buf = append(p.buf, ph...)
	p.buf = append(p.buf, `","name":`...)
	p.buf = appendString(p.buf, name)
	p.buf = append(p.buf, `,"cat":"`...)
	p.buf = append(p.buf, cat...)
	p.buf = append(p.buf, `","pid":`...)
	p.buf = strconv.AppendInt(p.buf, int64(pid), 10)
	if tid >= 0 {
		p.buf = append(p.buf, `,"tid":`...)
		p.buf = strconv.AppendInt(p.buf, int64(tid), 10)
	}
	p.buf = append(p.buf, `,"ts":`...)
	p.buf = appendMicros(p.buf, at)
}

func (p *perfetto) dur(ns int64) {
	p.buf = append(p.buf, `,"dur":`...)
	p.buf = appendMicros(p.buf, ns)
}

// args opens the args object; close closes it with the event.
func (p *perfetto) args() {
	p.buf = append(p.buf, `,"args":{`...)
	p.inArgs, p.nargs = true, 0
}

func (p *perfetto) arg(k string) {
	if p.nargs > 0 {
		p.buf = append(p.buf, ',')
	}
	p.nargs++
	p.buf = appendString(p.buf, k)
	p.buf = append(p.buf, ':')
}

func (p *perfetto) argStr(k, v string) {
	p.arg(k)
	p.buf = appendString(p.buf, v)
}

func (p *perfetto) argHex(k string, v uint64) {
	p.arg(k)
	p.buf = append(p.buf, `"0x`...)
	p.buf = strconv.AppendUint(p.buf, v, 16)
	p.buf = append(p.buf, '"')
}

func (p *perfetto) argInt(k string, v int64) {
	p.arg(k)
	p.buf = strconv.AppendInt(p.buf, v, 10)
}

func (p *perfetto) close() {
	if p.inArgs {
		p.buf = append(p.buf, '}')
		p.inArgs = false
	}
	p.buf = append(p.buf, '}')
	if len(p.buf) >= 256<<10 {
		p.flush()
	}
}

func (p *perfetto) flush() {
	if p.err == nil {
		_, p.err = p.out.Write(p.buf)
	}
	p.buf = p.buf[:0]
}

// meta writes a metadata ("M") event with one string arg; tid < 0: the
// process's.
func (p *perfetto) meta(name string, pid, tid int, k, v string) {
	p.begin("M", name, "__metadata", pid, tid, 0)
	p.args()
	p.argStr(k, v)
	p.close()
}

func (p *perfetto) metaInt(name string, pid, tid int, k string, v int) {
	p.begin("M", name, "__metadata", pid, tid, 0)
	p.args()
	p.argInt(k, int64(v))
	p.close()
}

// appendMicros appends ns as microseconds, exactly: the trace-event
// format's unit, with the nanoseconds as three decimals at most.
func appendMicros(b []byte, ns int64) []byte {
	u := uint64(ns)
	if ns < 0 {
		b = append(b, '-')
		u = -u
	}
	b = strconv.AppendUint(b, u/1000, 10)
	if f := u % 1000; f != 0 {
		b = append(b, '.', byte('0'+f/100), byte('0'+f/10%10), byte('0'+f%10))
		for b[len(b)-1] == '0' {
			b = b[:len(b)-1]
		}
	}
	return b
}

// appendString appends s as a JSON string. Kernel and command names are
// whatever the client sent, so bytes that are not UTF-8 become U+FFFD
// rather than make the file unreadable.
func appendString(b []byte, s string) []byte {
	const hexDigits = "0123456789abcdef"
	b = append(b, '"')
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			switch {
			case c == '"' || c == '\\':
				b = append(b, '\\', c)
			case c == '\n':
				b = append(b, '\\', 'n')
			case c == '\t':
				b = append(b, '\\', 't')
			case c < 0x20 || c == 0x7f:
				b = append(b, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xf])
			default:
				b = append(b, c)
			}
			i++
			continue
		}
		r, n := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && n == 1:
			b = append(b, `\ufffd`...)
		case r == '\u2028' || r == '\u2029': // valid JSON, but not JavaScript before ES2019
			b = append(b, `\u202`...)
			b = append(b, hexDigits[r&0xf])
		default:
			b = append(b, s[i:i+n]...)
		}
		i += n
	}
	return append(b, '"')
}

func hex(a uint64) string { return "0x" + strconv.FormatUint(a, 16) }

func floorDiv(a, b int64) int64 {
	q := a / b
	if a%b != 0 && a < 0 {
		q--
	}
	return q
}
