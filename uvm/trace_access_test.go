package uvm

import (
	"errors"
	"io"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/softuvm/softuvm/internal/config"
	"github.com/softuvm/softuvm/internal/core"
	"github.com/softuvm/softuvm/trace"
)

// readTraceSoFar returns the events a trace being written holds now.
func readTraceSoFar(t *testing.T, path string) []trace.Event {
	t.Helper()
	r, err := trace.Open(path)
	if err != nil {
		return nil // the header is not written yet
	}
	defer r.Close()
	var out []trace.Event
	for {
		var e trace.Event
		err := r.Next(&e)
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			return out
		}
		require.NoError(t, err)
		out = append(out, e)
	}
}

// accessedPages counts, by page, the access events of processor p
// covering [start, start+size) whose window began after since and ended
// before until.
func accessedPages(events []trace.Event, p Device, start uintptr, size int, since, until time.Duration) map[uintptr]int {
	seen := map[uintptr]int{}
	for _, e := range events {
		if e.Kind != trace.KindAccess || e.Processor != int32(p) || e.Time-e.Duration < since || e.Time > until {
			continue
		}
		for i := range uintptr(e.Pages) {
			a := uintptr(e.Addr) + i*PageSize
			if a >= start && a < start+uintptr(size) {
				seen[a]++
			}
		}
	}
	return seen
}

// accessSink keeps the compiler from dropping the test's reads.
var accessSink byte

// forever is a time after every event.
const forever = time.Duration(1<<63 - 1)

// freeTime is when the trace recorded the free of the allocation at addr:
// the test's marker of a moment in the trace's clock.
func freeTime(events []trace.Event, addr uintptr) (time.Duration, bool) {
	for _, e := range events {
		if e.Kind == trace.KindFree && e.Addr == uint64(addr) {
			return e.Time, true
		}
	}
	return 0, false
}

// TestTraceAccessMode: with the access mode on, the trace records the
// pages each processor touched without faulting, and only those. The
// host keeps reading a hot array and never a cold one after writing it;
// device 0 keeps adding one to a third. Every hot page must show as
// accessed by the CPU in several windows, every device page by device 0;
// no cold page may show in a window that began after the marker (the
// free of a small allocation made once the cold array was written), and
// neither processor may show a page it never touched. Each access must
// be of a page the round before armed, once, and the data must be
// intact.
func TestTraceAccessMode(t *testing.T) {
	requireRoot(t)
	cfg := testServerConfig()
	cfg.TraceAccess = config.TraceAccess{Period: core.Duration(20 * time.Millisecond), Sample: 64 << 20}
	s, path, log := recordingSession(t, cfg, "access.uvmtrace")

	const size = 1 << 20
	alloc := func() (*Allocation, []byte) {
		a, err := s.MallocManaged(size)
		require.NoError(t, err)
		return a, a.Bytes()
	}
	hotA, hot := alloc()
	coldA, cold := alloc()
	devA, dev := alloc()
	for i := 0; i < size; i += PageSize {
		hot[i], cold[i], dev[i] = byte(i>>12), byte(i>>12)+1, byte(i>>12)+2
	}
	marker, err := s.MallocManaged(PageSize)
	require.NoError(t, err)
	markerAddr := marker.Addr()
	require.NoError(t, marker.Free())

	// Read the hot array and run the device's kernel until the trace
	// shows every hot page touched by the CPU in three windows after the
	// marker, and every device page by device 0 in two.
	launches := 0
	deadline := time.Now().Add(60 * time.Second)
	for {
		for i := 0; i < size; i += PageSize {
			accessSink += hot[i]
		}
		require.NoError(t, s.Launch(0, nil, "addOne", 1, rangeParams(devA.Addr(), size, 0)))
		require.NoError(t, s.DeviceSynchronize(0))
		launches++
		events := readTraceSoFar(t, path)
		if since, ok := freeTime(events, markerAddr); ok {
			hotSeen := accessedPages(events, CPU, hotA.Addr(), size, since, forever)
			devSeen := accessedPages(events, 0, devA.Addr(), size, since, forever)
			if minCount(hotSeen, size/PageSize) >= 3 && minCount(devSeen, size/PageSize) >= 2 {
				break
			}
		}
		if !time.Now().Before(deadline) {
			kinds := map[string]int{}
			for _, e := range events {
				kinds[e.Kind.String()+" "+trace.ProcessorName(e.Processor)]++
			}
			since, _ := freeTime(events, markerAddr)
			in := func(a uint64, base uintptr) bool { return a >= uint64(base) && a < uint64(base)+size }
			armedIn := map[string]uint64{}
			for _, e := range events {
				if e.Kind == trace.KindArm {
					name := trace.ProcessorName(e.Processor)
					switch {
					case in(e.Addr, hotA.Addr()):
						armedIn[name+" hot"] += uint64(e.Pages)
					case in(e.Addr, coldA.Addr()):
						armedIn[name+" cold"] += uint64(e.Pages)
					case in(e.Addr, devA.Addr()):
						armedIn[name+" dev"] += uint64(e.Pages)
					}
				}
			}
			t.Logf("armed pages: %v", armedIn)
			t.Logf("events so far: %v; hot seen %d pages, device %d", kinds, len(accessedPages(events, CPU, hotA.Addr(), size, since, forever)), len(accessedPages(events, 0, devA.Addr(), size, since, forever)))
			logBytes, _ := os.ReadFile(log.Name())
			t.Logf("server log: %s", logBytes)
		}
		require.True(t, time.Now().Before(deadline), "the trace did not show every hot page touched three times and every device page twice in 60 s (%d launches)", launches)
	}
	// The second marker: the checks below read every array.
	marker, err = s.MallocManaged(PageSize)
	require.NoError(t, err)
	marker2Addr := marker.Addr()
	require.NoError(t, marker.Free())
	for i := 0; i < size; i += PageSize {
		require.Equal(t, byte(i>>12), hot[i], "hot page %d", i/PageSize)
		require.Equal(t, byte(i>>12)+1, cold[i], "cold page %d", i/PageSize)
	}
	for i := 0; i < size; i++ {
		want := byte(launches)
		if i%PageSize == 0 {
			want += byte(i>>12) + 2
		}
		require.Equal(t, want, dev[i], "device array byte %d after %d launches", i, launches)
	}
	st, err := s.Stats()
	require.NoError(t, err)
	require.NoError(t, s.Close())
	waitTraceClosed(t, path)

	h, c := readTraceCounts(t, path)
	assert.Equal(t, 20*time.Millisecond, h.AccessPeriod)
	assert.EqualValues(t, 64<<20, h.AccessSample)
	requireTraceMatchesStats(t, c, st)
	since, ok := freeTime(c.events, markerAddr)
	require.True(t, ok, "the first marker's free is in the trace")
	until, ok := freeTime(c.events, marker2Addr)
	require.True(t, ok, "the second marker's free is in the trace")
	assert.Empty(t, accessedPages(c.events, CPU, coldA.Addr(), size, since, until), "cold pages the CPU did not touch between the markers")
	assert.Empty(t, accessedPages(c.events, 0, coldA.Addr(), size, 0, forever), "cold pages device 0 never touched")
	assert.Empty(t, accessedPages(c.events, 0, hotA.Addr(), size, 0, forever), "hot pages device 0 never touched")

	// Each access is of a page armed by the processor's round before
	// (the arm events sharing the latest time before it), at most once.
	armed := map[int32]map[uint64]bool{}
	armedAt := map[int32]time.Duration{}
	rounds := map[int32]int{}
	for i, e := range c.events {
		switch e.Kind {
		case trace.KindArm:
			if armed[e.Processor] == nil || armedAt[e.Processor] != e.Time {
				armed[e.Processor], armedAt[e.Processor] = map[uint64]bool{}, e.Time
				rounds[e.Processor]++
			}
			require.Positive(t, e.Pages, "arm event %d", i)
			for p := range uint64(e.Pages) {
				armed[e.Processor][e.Addr+p*PageSize] = true
			}
		case trace.KindAccess:
			require.Positive(t, e.Pages, "access event %d", i)
			require.Equal(t, e.Time-armedAt[e.Processor], e.Duration, "access event %d's window is from its round's arming", i)
			for p := range uint64(e.Pages) {
				a := e.Addr + p*PageSize
				require.True(t, armed[e.Processor][a], "access event %d: page %#x of %s was not armed by the round before", i, a, trace.ProcessorName(e.Processor))
				delete(armed[e.Processor], a) // once
			}
		}
	}
	assert.GreaterOrEqual(t, rounds[int32(CPU)], 3, "rounds that armed the CPU")
	assert.GreaterOrEqual(t, rounds[0], 2, "rounds that armed device 0")
	checkServerLog(t, log)
}

// minCount is the least count of n pages in seen (0 if any is missing).
func minCount(seen map[uintptr]int, n int) int {
	if len(seen) < n {
		return 0
	}
	least := -1
	for _, c := range seen {
		if least < 0 || c < least {
			least = c
		}
	}
	return least
}

// TestTraceAccessSampleMovesOn: a sample of one and a half blocks arms
// one 2 MiB block of the host a round and goes on where the last round
// stopped, so that every allocation is armed in turn, not the first one
// again and again.
func TestTraceAccessSampleMovesOn(t *testing.T) {
	requireRoot(t)
	cfg := testServerConfig()
	cfg.TraceAccess = config.TraceAccess{Period: core.Duration(20 * time.Millisecond), Sample: 3 << 20}
	s, path, log := recordingSession(t, cfg, "moves-on.uvmtrace")
	const size = 2 << 20
	var starts []uintptr
	for range 3 {
		a, err := s.MallocManaged(size)
		require.NoError(t, err)
		b := a.Bytes()
		for i := 0; i < size; i += PageSize {
			b[i] = 1
		}
		starts = append(starts, a.Addr())
	}
	armedIn := func(events []trace.Event) []int {
		n := make([]int, len(starts))
		for _, e := range events {
			for i, a := range starts {
				if e.Kind == trace.KindArm && e.Processor == int32(CPU) && e.Addr >= uint64(a) && e.Addr < uint64(a)+size {
					n[i]++
				}
			}
		}
		return n
	}
	Eventually(t, 30*time.Second, func() bool { return !slices.Contains(armedIn(readTraceSoFar(t, path)), 0) },
		"every allocation armed in turn")
	require.NoError(t, s.Close())
	waitTraceClosed(t, path)
	_, events, err := trace.ReadFile(path)
	require.NoError(t, err)
	perRound := map[time.Duration]uint64{}
	for _, e := range events {
		if e.Kind == trace.KindArm && e.Processor == int32(CPU) {
			perRound[e.Time] += uint64(e.Pages)
		}
	}
	for at, pages := range perRound {
		require.LessOrEqual(t, pages, uint64(size/PageSize), "round at %v armed more than one block", at)
	}
	checkServerLog(t, log)
}
