package export_test

import (
	"bytes"
	"encoding/csv"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/softuvm/softuvm/trace"
	"github.com/softuvm/softuvm/trace/export"
)

// base is an allocation's start, 2 MiB aligned.
const base = 0x7f0000000000

// The events of the test trace, by name, so that checks can point at
// them. Times are in ns and most are not whole microseconds, to see the
// fractions.
var (
	session    = trace.Event{Kind: trace.KindSession, Time: 1_000, PID: 100, Name: "prog --x"}
	session2   = trace.Event{Kind: trace.KindSession, Time: 1_500, PID: 300, Name: "other"}
	alloc1     = trace.Event{Kind: trace.KindAlloc, Time: 2_500, PID: 100, Range: 1, Addr: base, Bytes: 64 << 20}
	alloc2     = trace.Event{Kind: trace.KindAlloc, Time: 3_000, PID: 100, Range: 2, Addr: base + 0x4000000, Bytes: 3 << 19}
	populate   = trace.Event{Kind: trace.KindPopulate, Time: 9_000, PID: 100, To: trace.CPU, Range: 1, Addr: base + 0x201000, Pages: 1}
	migToCPU   = trace.Event{Kind: trace.KindMigration, Time: 10_500, PID: 100, From: 0, To: trace.CPU, Cause: trace.CauseFault, Range: 1, Addr: base + 0x200000, Pages: 16, Duration: 3_000}
	faultCPU   = trace.Event{Kind: trace.KindFault, Time: 10_001, PID: 100, Thread: 101, Processor: trace.CPU, Range: 1, Addr: base + 0x201000, FaultKind: trace.FaultMissing, Write: true, Duration: 12_345, Prefetched: 15}
	faultEarly = trace.Event{Kind: trace.KindFault, Time: 15_000, PID: 100, Thread: 103, Processor: 0, Range: 1, Addr: base + 0x400000, FaultKind: trace.FaultMissing, Duration: 1_000}
	faultDev   = trace.Event{Kind: trace.KindFault, Time: 20_500, PID: 100, Thread: 102, Processor: 0, Range: 1, Addr: base + 0x401000, FaultKind: trace.FaultMinor, Duration: 7_000}
	faultCPU2  = trace.Event{Kind: trace.KindFault, Time: 20_800, PID: 100, Thread: 105, Processor: trace.CPU, Range: 1, Addr: base + 0x400000, FaultKind: trace.FaultWP, Write: true, Duration: 900}
	faultOther = trace.Event{Kind: trace.KindFault, Time: 20_900, PID: 100, Thread: 104, Processor: 0, Range: 1, Addr: base + 0x600000, Duration: 800}
	migToDev   = trace.Event{Kind: trace.KindMigration, Time: 21_000, PID: 100, From: trace.CPU, To: 0, Cause: trace.CauseFault, Range: 1, Addr: base + 0x400000, Pages: 16, Duration: 3_000}
	migNoFault = trace.Event{Kind: trace.KindMigration, Time: 22_000, PID: 200, From: trace.CPU, To: 0, Cause: trace.CauseFault, Range: 1, Addr: base + 0x400000, Pages: 16, Duration: 2_000}
	migPref    = trace.Event{Kind: trace.KindMigration, Time: 25_000, PID: 100, From: trace.CPU, To: 0, Cause: trace.CausePrefetch, Range: 1, Addr: base + 0x800000, Pages: 512, Duration: 50_000}
	migEvict   = trace.Event{Kind: trace.KindMigration, Time: 26_000, PID: 100, From: 0, To: trace.CPU, Cause: trace.CauseEviction, Range: 1, Addr: base + 0xa00000, Pages: 32, Duration: 4_000}
	eviction   = trace.Event{Kind: trace.KindEviction, Time: 26_100, PID: 100, From: 0, Range: 1, Addr: base + 0xa00000, Pages: 32}
	migCount   = trace.Event{Kind: trace.KindMigration, Time: 27_000, PID: 100, From: trace.CPU, To: 1, Cause: trace.CauseCounters, Range: 1, Addr: base + 0xc00000, Pages: 8, Duration: 1_000}
	migAdvice  = trace.Event{Kind: trace.KindMigration, Time: 28_000, PID: 100, From: 1, To: trace.CPU, Cause: trace.CauseAdvice, Range: 1, Addr: base + 0xc00000, Pages: 8, Duration: 1_100}
	launch     = trace.Event{Kind: trace.KindLaunch, Time: 30_000, PID: 100, Processor: 0, Stream: 7, Name: "saxpy"}
	remoteMap  = trace.Event{Kind: trace.KindRemoteMap, Time: 30_500, PID: 100, Processor: 1, Range: 1, Addr: base + 0xe00000, Pages: 4}
	duplicate  = trace.Event{Kind: trace.KindDuplicate, Time: 30_700, PID: 100, To: 1, Range: 1, Addr: base + 0xe00000, Pages: 2}
	syncDev    = trace.Event{Kind: trace.KindSync, Time: 31_000, PID: 100, Processor: 0, Stream: 7, Duration: 5_000}
	syncCtx    = trace.Event{Kind: trace.KindSync, Time: 32_000, PID: 100, Processor: trace.CPU, Duration: 2_500}
	faultLate  = trace.Event{Kind: trace.KindFault, Time: 40_000, PID: 100, Thread: 102, Processor: 0, Range: 1, Addr: base + 0x402000, Duration: 500}
	migLaunch  = trace.Event{Kind: trace.KindMigration, Time: 15_000_123, PID: 100, From: trace.CPU, To: 0, Cause: trace.CauseLaunch, Range: 2, Addr: base + 0x4000000, Pages: 64, Duration: 100_000}
	free1      = trace.Event{Kind: trace.KindFree, Time: 16_000_000, PID: 100, Range: 1, Addr: base}
	sessionEnd = trace.Event{Kind: trace.KindSessionEnd, Time: 17_000_000, PID: 100}
)

// traceEvents is the test trace in the order it is written: as a server
// writes them, a fault after the migrations it caused.
func traceEvents() []trace.Event {
	return []trace.Event{session, session2, alloc1, alloc2, populate, migToCPU, faultCPU, faultEarly, migToDev,
		faultDev, faultCPU2, faultOther, migNoFault, migPref, migEvict, eviction, migCount, migAdvice, launch,
		remoteMap, duplicate, syncDev, syncCtx, faultLate, migLaunch, free1, sessionEnd}
}

// traceEnd is the latest time an event of the test trace reaches.
const traceEnd = 17_000_000

// record writes events to an in-memory trace file.
func record(t testing.TB, events []trace.Event) []byte {
	var buf bytes.Buffer
	w, err := trace.NewRecorder(&buf, trace.Header{Devices: 2, Scope: "server", Command: []string{"prog", "--x"}})
	require.NoError(t, err)
	for _, e := range events {
		w.Emit(&e)
	}
	require.NoError(t, w.Close())
	return buf.Bytes()
}

// jsonEvent is an event of the trace-event format, as a viewer reads it.
type jsonEvent struct {
	Ph   string         `json:"ph"`
	Name string         `json:"name"`
	Cat  string         `json:"cat"`
	Pid  *int           `json:"pid"`
	Tid  *int           `json:"tid"`
	Ts   *float64       `json:"ts"`
	Dur  *float64       `json:"dur"`
	ID   *int           `json:"id"`
	Bp   string         `json:"bp"`
	S    string         `json:"s"`
	Args map[string]any `json:"args"`
}

type jsonTrace struct {
	TraceEvents     []jsonEvent    `json:"traceEvents"`
	DisplayTimeUnit string         `json:"displayTimeUnit"`
	Metadata        map[string]any `json:"metadata"`
}

// parsed is an export read back, with its processes and rows by name.
type parsed struct {
	jsonTrace
	procs   map[string]int    // process name: pid
	threads map[[2]int]string // pid, tid: row name
}

func parse(t *testing.T, data []byte) *parsed {
	t.Helper()
	var p parsed
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	require.NoError(t, dec.Decode(&p.jsonTrace), "the export is not trace-event JSON")
	p.procs, p.threads = map[string]int{}, map[[2]int]string{}
	for _, e := range p.TraceEvents {
		require.NotNil(t, e.Pid, "every event has a pid: %+v", e)
		require.NotNil(t, e.Ts, "every event has a ts: %+v", e)
		switch {
		case e.Ph == "M" && e.Name == "process_name":
			name := e.Args["name"].(string)
			_, dup := p.procs[name]
			require.False(t, dup, "process %q named twice", name)
			p.procs[name] = *e.Pid
		case e.Ph == "M" && e.Name == "thread_name":
			require.NotNil(t, e.Tid)
			p.threads[[2]int{*e.Pid, *e.Tid}] = e.Args["name"].(string)
		}
	}
	return &p
}

// us is ns in the format's microseconds, computed apart from the code
// under test.
func us(ns time.Duration) float64 { return float64(ns) / 1000 }

func hexAddr(a uint64) string { return fmt.Sprintf("%#x", a) }

// find returns the one event of cat and ph at ts (and address, where
// given).
func (p *parsed) find(t *testing.T, ph, cat string, at time.Duration, addr string) jsonEvent {
	t.Helper()
	var found []jsonEvent
	for _, e := range p.TraceEvents {
		if e.Ph == ph && e.Cat == cat && *e.Ts == us(at) && (addr == "" || e.Args["address"] == addr) {
			found = append(found, e)
		}
	}
	require.Len(t, found, 1, "%s %s at %v %s", ph, cat, at, addr)
	return found[0]
}

func (p *parsed) row(e jsonEvent) string {
	if e.Tid == nil {
		return ""
	}
	return p.threads[[2]int{*e.Pid, *e.Tid}]
}

func exportPerfetto(t *testing.T, events []trace.Event) []byte {
	t.Helper()
	data := record(t, events)
	r, err := trace.NewReader(bytes.NewReader(data))
	require.NoError(t, err)
	var streamed bytes.Buffer
	n, err := export.PerfettoFrom(&streamed, r)
	require.NoError(t, err)
	assert.Equal(t, len(events), n)

	r, err = trace.NewReader(bytes.NewReader(data))
	require.NoError(t, err)
	var all []trace.Event
	for {
		var e trace.Event
		if err := r.Next(&e); err != nil {
			require.ErrorIs(t, err, io.EOF)
			break
		}
		all = append(all, e)
	}
	var whole bytes.Buffer
	require.NoError(t, export.Perfetto(&whole, r.Header(), all))
	require.Equal(t, whole.String(), streamed.String(), "the streaming and the in-memory exports agree")
	return streamed.Bytes()
}

func TestPerfettoEveryKind(t *testing.T) {
	p := parse(t, exportPerfetto(t, traceEvents()))
	assert.Equal(t, "ns", p.DisplayTimeUnit)
	assert.EqualValues(t, 2, p.Metadata["devices"])
	assert.Equal(t, "server", p.Metadata["scope"])
	assert.EqualValues(t, len(traceEvents()), p.Metadata["events"])
	assert.EqualValues(t, 0, p.Metadata["dropped"])

	for _, name := range []string{"cpu", "device 0", "device 1", "allocations", "clients"} {
		assert.Contains(t, p.procs, name)
	}
	pids := map[int]bool{}
	for _, pid := range p.procs {
		pids[pid] = true
	}
	assert.Len(t, pids, len(p.procs), "a pid per process")
	proc := func(n int32) int { return p.procs[trace.ProcessorName(n)] }

	cats := map[string]string{}
	for _, e := range p.TraceEvents {
		if e.Ph != "M" {
			cats[e.Cat] = e.Ph
		}
	}
	for _, cat := range []string{"fault", "migration", "eviction", "populate", "remote_map", "duplicate", "launch", "sync", "allocation", "session"} {
		assert.Contains(t, cats, cat, "every kind appears")
	}

	t.Run("faults", func(t *testing.T) {
		for _, f := range []trace.Event{faultCPU, faultEarly, faultDev, faultCPU2, faultOther, faultLate} {
			e := p.find(t, "X", "fault", f.Time, hexAddr(f.Addr))
			assert.Equal(t, proc(f.Processor), *e.Pid)
			require.NotNil(t, e.Dur)
			assert.Equal(t, us(f.Duration), *e.Dur)
			assert.Equal(t, fmt.Sprintf("faults, thread %d", f.Thread), p.row(e))
			access := map[bool]string{false: "read", true: "write"}[f.Write]
			assert.Equal(t, access, e.Args["access"])
			assert.Equal(t, f.FaultKind.String(), e.Args["kind"])
			assert.EqualValues(t, f.Prefetched, e.Args["prefetched pages"])
			assert.EqualValues(t, f.PID, e.Args["pid"])
			assert.EqualValues(t, f.Thread, e.Args["thread"])
			assert.Contains(t, e.Name, access)
		}
		e := p.find(t, "X", "fault", faultCPU.Time, "")
		assert.Equal(t, 10.001, *e.Ts)
		assert.Equal(t, 12.345, *e.Dur)
	})

	t.Run("migrations", func(t *testing.T) {
		for _, m := range []trace.Event{migToCPU, migToDev, migNoFault, migPref, migEvict, migCount, migAdvice, migLaunch} {
			e := p.find(t, "X", "migration", m.Time, hexAddr(m.Addr))
			assert.Equal(t, proc(m.To), *e.Pid, "on the destination")
			assert.Equal(t, "migrations in", strings.TrimRight(p.row(e), " (0123456789)"))
			require.NotNil(t, e.Dur)
			assert.Equal(t, us(m.Duration), *e.Dur)
			assert.Equal(t, trace.ProcessorName(m.From), e.Args["from"])
			assert.Equal(t, trace.ProcessorName(m.To), e.Args["to"])
			assert.Equal(t, m.Cause.String(), e.Args["cause"])
			assert.EqualValues(t, m.Pages, e.Args["pages"])
			assert.EqualValues(t, m.Pages*4096, e.Args["bytes"])
		}
	})

	t.Run("instants", func(t *testing.T) {
		for _, c := range []struct {
			ev        trace.Event
			cat, row  string
			processor int32
		}{
			{eviction, "eviction", "evictions", eviction.From},
			{populate, "populate", "populate", populate.To},
			{remoteMap, "remote_map", "remote maps", remoteMap.Processor},
			{duplicate, "duplicate", "duplicates in", duplicate.To},
		} {
			e := p.find(t, "i", c.cat, c.ev.Time, hexAddr(c.ev.Addr))
			assert.Equal(t, "t", e.S, "a thread instant")
			assert.Equal(t, proc(c.processor), *e.Pid, c.cat)
			assert.Equal(t, c.row, p.row(e))
			assert.EqualValues(t, c.ev.Pages, e.Args["pages"])
			assert.EqualValues(t, c.ev.Pages*4096, e.Args["bytes"])
		}
		e := p.find(t, "i", "launch", launch.Time, "")
		assert.Equal(t, "saxpy", e.Name)
		assert.Equal(t, proc(0), *e.Pid)
		assert.Equal(t, "launches", p.row(e))
		assert.EqualValues(t, 7, e.Args["stream"])
		assert.Equal(t, 30.0, *e.Ts)
	})

	t.Run("syncs", func(t *testing.T) {
		for _, s := range []trace.Event{syncDev, syncCtx} {
			e := p.find(t, "X", "sync", s.Time, "")
			assert.Equal(t, proc(s.Processor), *e.Pid)
			assert.Equal(t, "syncs", p.row(e))
			assert.Equal(t, us(s.Duration), *e.Dur)
			assert.EqualValues(t, s.Stream, e.Args["stream"])
		}
	})

	t.Run("allocations", func(t *testing.T) {
		e := p.find(t, "X", "allocation", alloc1.Time, hexAddr(base))
		assert.Equal(t, p.procs["allocations"], *e.Pid)
		assert.Equal(t, 2.5, *e.Ts)
		assert.Equal(t, us(free1.Time-alloc1.Time), *e.Dur, "to its free")
		assert.Equal(t, "0x7f0000000000 (64 MiB)", e.Name)
		assert.Equal(t, e.Name, p.row(e), "its own row, named as the slice")
		assert.EqualValues(t, 64<<20, e.Args["bytes"])
		e2 := p.find(t, "X", "allocation", alloc2.Time, hexAddr(alloc2.Addr))
		assert.Equal(t, us(traceEnd-alloc2.Time), *e2.Dur, "unfreed: to the trace's end")
		assert.Equal(t, "0x7f0004000000 (1.5 MiB)", e2.Name)
		assert.NotEqual(t, *e.Tid, *e2.Tid)
	})

	t.Run("sessions", func(t *testing.T) {
		e := p.find(t, "X", "session", session.Time, "")
		assert.Equal(t, p.procs["clients"], *e.Pid)
		assert.Equal(t, "prog --x", e.Name)
		assert.Equal(t, us(sessionEnd.Time-session.Time), *e.Dur)
		assert.Equal(t, "pid 100", p.row(e))
		e2 := p.find(t, "X", "session", session2.Time, "")
		assert.Equal(t, us(traceEnd-session2.Time), *e2.Dur)
		assert.Equal(t, "pid 300", p.row(e2))
	})

	t.Run("flows", func(t *testing.T) {
		starts, finishes := map[int]jsonEvent{}, map[int]jsonEvent{}
		for _, e := range p.TraceEvents {
			switch e.Ph {
			case "s", "f":
				require.NotNil(t, e.ID)
				m := map[string]map[int]jsonEvent{"s": starts, "f": finishes}[e.Ph]
				_, dup := m[*e.ID]
				require.False(t, dup, "one %s per id", e.Ph)
				m[*e.ID] = e
			}
		}
		// The slice of cat on the flow event's row that holds it.
		holder := func(f jsonEvent, cat string) jsonEvent {
			var in []jsonEvent
			for _, e := range p.TraceEvents {
				if e.Ph == "X" && e.Cat == cat && *e.Pid == *f.Pid && *e.Tid == *f.Tid && *e.Ts <= *f.Ts && *f.Ts <= *e.Ts+*e.Dur {
					in = append(in, e)
				}
			}
			require.Len(t, in, 1, "the %s event lies on one %s slice", f.Ph, cat)
			return in[0]
		}
		type pair struct{ fault, mig float64 }
		var got []pair
		for id, s := range starts {
			f, ok := finishes[id]
			require.True(t, ok, "flow %d has its end", id)
			assert.Equal(t, "e", f.Bp, "the end binds to its enclosing slice")
			assert.Equal(t, s.Name, f.Name)
			assert.Equal(t, s.Cat, f.Cat)
			assert.LessOrEqual(t, *s.Ts, *f.Ts, "the arrow points forward in time")
			got = append(got, pair{*holder(s, "fault").Ts, *holder(f, "migration").Ts})
		}
		assert.Len(t, finishes, len(starts))
		assert.ElementsMatch(t, []pair{{us(faultCPU.Time), us(migToCPU.Time)}, {us(faultDev.Time), us(migToDev.Time)}}, got,
			"each fault-caused migration from its block's latest earlier fault on its destination; none for a migration with no such fault")
	})

	t.Run("bandwidth", func(t *testing.T) {
		got := map[float64]float64{}
		for _, e := range p.TraceEvents {
			if e.Ph == "C" && *e.Pid == proc(0) {
				assert.Equal(t, "migration bandwidth MB/s", e.Name)
				if v, ok := e.Args["from cpu"]; ok {
					got[*e.Ts] = v.(float64)
				}
			}
		}
		// bytes per 10 ms bin, in MB/s: bytes / 1e6 / 0.01 s.
		bin0 := float64((migToDev.Pages+migNoFault.Pages+migPref.Pages)*4096) / 1e6 / 0.01
		bin1 := float64(migLaunch.Pages*4096) / 1e6 / 0.01
		require.Len(t, got, 3)
		assert.InDelta(t, bin0, got[0], 1e-9)
		assert.InDelta(t, bin1, got[10_000], 1e-9)
		v, ok := got[20_000]
		assert.True(t, ok && v == 0, "a zero after the last busy bin")
	})
}

func TestPerfettoRowsNest(t *testing.T) {
	// Faults of a few threads, of one with no thread id, migrations and
	// syncs, overlapping at random and out of order.
	rng := rand.New(rand.NewPCG(3, 4))
	var events []trace.Event
	for i := range 3000 {
		at := time.Duration(1 + rng.IntN(1_000_000))
		took := time.Duration(rng.IntN(50_000))
		switch i % 3 {
		case 0:
			events = append(events, trace.Event{Kind: trace.KindFault, Time: at, PID: 9, Thread: int32(rng.IntN(3)), Processor: int32(rng.IntN(2)) - 1, Range: 1, Addr: base + uint64(rng.IntN(64))<<12, Duration: took})
		case 1:
			events = append(events, trace.Event{Kind: trace.KindMigration, Time: at, PID: 9, From: -1, To: 0, Cause: trace.CauseFault, Range: 1, Addr: base, Pages: 1, Duration: took})
		default:
			events = append(events, trace.Event{Kind: trace.KindSync, Time: at, PID: 9, Processor: 0, Duration: took})
		}
	}
	p := parse(t, exportPerfetto(t, events))
	rows := map[[2]int][]jsonEvent{}
	n := 0
	for _, e := range p.TraceEvents {
		if e.Ph == "X" {
			rows[[2]int{*e.Pid, *e.Tid}] = append(rows[[2]int{*e.Pid, *e.Tid}], e)
			n++
		}
	}
	assert.Equal(t, len(events), n)
	for k, row := range rows {
		sort.SliceStable(row, func(i, j int) bool { return *row[i].Ts < *row[j].Ts })
		var open []float64 // ends of the enclosing slices
		for _, e := range row {
			for len(open) > 0 && open[len(open)-1] <= *e.Ts {
				open = open[:len(open)-1]
			}
			end := *e.Ts + *e.Dur
			if len(open) > 0 {
				require.LessOrEqual(t, end, open[len(open)-1], "row %q: a slice at %v overlaps the one it starts in", p.threads[k], *e.Ts)
			}
			open = append(open, end)
		}
	}
	assert.Contains(t, slices.Collect(func(yield func(string) bool) {
		for _, name := range p.threads {
			if !yield(name) {
				return
			}
		}
	}), "faults, pid 9", "faults with no thread id get a row of their client")
}

func TestPerfettoCutShortTrace(t *testing.T) {
	data := record(t, traceEvents())
	r, err := trace.NewReader(bytes.NewReader(data[:len(data)-8]))
	require.NoError(t, err)
	var buf bytes.Buffer
	n, err := export.PerfettoFrom(&buf, r)
	require.ErrorIs(t, err, io.ErrUnexpectedEOF)
	assert.Less(t, n, len(traceEvents()))
	assert.Positive(t, n)
	parse(t, buf.Bytes()) // still whole JSON
}

func TestPerfettoStrangeNames(t *testing.T) {
	name := "k\"er\\nel\n\x01\xff é \u2028"
	p := parse(t, exportPerfetto(t, []trace.Event{{Kind: trace.KindLaunch, Time: 1, PID: 1, Processor: 0, Name: name}}))
	e := p.find(t, "i", "launch", 1, "")
	assert.Equal(t, strings.ToValidUTF8(name, "\uFFFD"), e.Name)
}

// wantRow is the CSV row an event should make, built from the trace
// package's description of each kind.
func wantRow(e trace.Event) map[string]string {
	row := map[string]string{"kind": e.Kind.String(), "time_ns": strconv.FormatInt(int64(e.Time), 10), "pid": strconv.Itoa(int(e.PID))}
	proc := trace.ProcessorName
	rangeAddr := func() {
		row["range"] = strconv.FormatUint(e.Range, 10)
		row["addr"] = fmt.Sprintf("0x%x", e.Addr)
	}
	pages := func() {
		row["pages"] = strconv.Itoa(int(e.Pages))
		row["bytes"] = strconv.Itoa(int(e.Pages) * 4096)
	}
	switch e.Kind {
	case trace.KindFault:
		row["thread"] = strconv.Itoa(int(e.Thread))
		row["processor"] = proc(e.Processor)
		rangeAddr()
		row["fault_kind"] = e.FaultKind.String()
		row["write"] = strconv.FormatBool(e.Write)
		row["prefetched"] = strconv.Itoa(int(e.Prefetched))
		row["duration_ns"] = strconv.Itoa(int(e.Duration))
	case trace.KindMigration:
		row["from"], row["to"], row["cause"] = proc(e.From), proc(e.To), e.Cause.String()
		rangeAddr()
		pages()
		row["duration_ns"] = strconv.Itoa(int(e.Duration))
	case trace.KindEviction:
		row["from"] = proc(e.From)
		rangeAddr()
		pages()
	case trace.KindPopulate, trace.KindDuplicate:
		row["to"] = proc(e.To)
		rangeAddr()
		pages()
	case trace.KindRemoteMap:
		row["processor"] = proc(e.Processor)
		rangeAddr()
		pages()
	case trace.KindLaunch:
		row["processor"], row["stream"], row["name"] = proc(e.Processor), strconv.Itoa(int(e.Stream)), e.Name
	case trace.KindSync:
		row["processor"], row["stream"], row["duration_ns"] = proc(e.Processor), strconv.Itoa(int(e.Stream)), strconv.Itoa(int(e.Duration))
	case trace.KindAlloc:
		rangeAddr()
		row["bytes"] = strconv.FormatUint(e.Bytes, 10)
	case trace.KindFree:
		rangeAddr()
	case trace.KindSession:
		row["name"] = e.Name
	}
	return row
}

func TestCSV(t *testing.T) {
	events := traceEvents()
	events[0].Name = "prog, \"quoted\"\nand a newline"
	data := record(t, events)
	r, err := trace.NewReader(bytes.NewReader(data))
	require.NoError(t, err)
	var buf bytes.Buffer
	n, err := export.CSVFrom(&buf, r)
	require.NoError(t, err)
	assert.Equal(t, len(events), n)

	var whole bytes.Buffer
	require.NoError(t, export.CSV(&whole, events))
	assert.Equal(t, whole.String(), buf.String())

	rows, err := csv.NewReader(&buf).ReadAll()
	require.NoError(t, err)
	header := []string{"kind", "time_ns", "pid", "thread", "processor", "from", "to", "range", "addr", "pages",
		"bytes", "fault_kind", "write", "prefetched", "cause", "duration_ns", "stream", "name"}
	require.Equal(t, header, rows[0])
	require.Len(t, rows, len(events)+1)
	for i, e := range events {
		want := wantRow(e)
		for j, col := range header {
			assert.Equal(t, want[col], rows[i+1][j], "event %d (%s), column %s", i, e.Kind, col)
		}
	}
	assert.Equal(t, []string{"fault", "10001", "100", "101", "cpu", "", "", "1", "0x7f0000201000", "", "", "missing", "true", "15", "", "12345", "", ""}, rows[1+slices.IndexFunc(events, func(e trace.Event) bool { return e == faultCPU })],
		"a fault's row, spelled out")
}

// manyEvents is n events as a busy server writes them: each thread's
// faults one after another, a fault-caused migration within each.
func manyEvents(n int) []trace.Event {
	events := make([]trace.Event, 0, n)
	for i := 0; len(events) < n; i++ {
		at := time.Duration(i) * 3 * time.Microsecond
		addr := base + uint64(i%100_000)<<12
		events = append(events,
			trace.Event{Kind: trace.KindMigration, Time: at + 500, PID: 1, From: -1, To: int32(i % 2), Cause: trace.CauseFault, Range: 1, Addr: addr, Pages: 16, Duration: 2 * time.Microsecond},
			trace.Event{Kind: trace.KindFault, Time: at, PID: 1, Thread: int32(i % 16), Processor: int32(i % 2), Range: 1, Addr: addr, Duration: 40 * time.Microsecond, Prefetched: 15})
	}
	return events
}

func BenchmarkPerfetto(b *testing.B) {
	events := manyEvents(200_000)
	b.ReportAllocs()
	for b.Loop() {
		require.NoError(b, export.Perfetto(io.Discard, trace.Header{}, events))
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(events)), "ns/event")
}

func BenchmarkCSV(b *testing.B) {
	events := manyEvents(200_000)
	b.ReportAllocs()
	for b.Loop() {
		require.NoError(b, export.CSV(io.Discard, events))
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(events)), "ns/event")
}
