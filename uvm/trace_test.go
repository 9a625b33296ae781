package uvm

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/softuvm/softuvm/internal/server"
	"github.com/softuvm/softuvm/trace"
)

// traceCounts is what a trace says happened, summed the way the
// statistics count it.
type traceCounts struct {
	faults    map[Device][3]uint64 // by processor: missing, minor, write-protect
	moved     map[[2]Device]uint64 // pages by from, to
	byCause   map[[2]Device]map[string]uint64
	populated map[Device]uint64
	evicted   map[Device]uint64
	kinds     map[trace.Kind]int
	events    []trace.Event
}

func readTraceCounts(t *testing.T, path string) (trace.Header, traceCounts) {
	t.Helper()
	h, events, err := trace.ReadFile(path)
	require.NoError(t, err, "the trace must be whole, its end record written")
	c := traceCounts{faults: map[Device][3]uint64{}, moved: map[[2]Device]uint64{}, byCause: map[[2]Device]map[string]uint64{},
		populated: map[Device]uint64{}, evicted: map[Device]uint64{}, kinds: map[trace.Kind]int{}, events: events}
	for _, e := range events {
		c.kinds[e.Kind]++
		switch e.Kind {
		case trace.KindFault:
			f := c.faults[Device(e.Processor)]
			f[e.FaultKind]++
			c.faults[Device(e.Processor)] = f
		case trace.KindMigration:
			k := [2]Device{Device(e.From), Device(e.To)}
			c.moved[k] += uint64(e.Pages)
			if c.byCause[k] == nil {
				c.byCause[k] = map[string]uint64{}
			}
			c.byCause[k][e.Cause.String()] += uint64(e.Pages)
		case trace.KindPopulate:
			c.populated[Device(e.To)] += uint64(e.Pages)
		case trace.KindEviction:
			c.evicted[Device(e.From)] += uint64(e.Pages)
		}
	}
	return h, c
}

// recordingSession connects to a private server with cfg that records
// every session's events into a trace in a temporary directory (name),
// logging to the returned file. It returns the session and the trace's
// path.
func recordingSession(t *testing.T, cfg ServerConfig, name string) (*Session, string, *os.File) {
	t.Helper()
	path := filepath.Join(t.TempDir(), name)
	cfg.Trace = path
	log, err := os.CreateTemp(t.TempDir(), "server-*.log")
	require.NoError(t, err)
	t.Cleanup(func() { log.Close() })
	s, err := Connect(Config{Server: "private", Private: cfg, Log: log})
	require.NoError(t, err)
	return s, path, log
}

// waitTraceClosed waits for a private server, ended with its last
// client, to write the end of its trace at path.
func waitTraceClosed(t *testing.T, path string) {
	t.Helper()
	require.Eventually(t, func() bool {
		_, _, err := trace.ReadFile(path)
		return err == nil
	}, 10*time.Second, 10*time.Millisecond, "the server did not close its trace")
}

// requireTraceMatchesStats checks a trace against the statistics of the
// same events: every fault, migration (by direction and cause),
// population and eviction the counters count is in the trace, and no
// more.
func requireTraceMatchesStats(t *testing.T, c traceCounts, st Stats) {
	t.Helper()
	wantFaults := map[Device][3]uint64{}
	for _, f := range st.Faults {
		wantFaults[f.Processor] = [3]uint64{f.Missing, f.Minor, f.WriteProtect}
	}
	assert.Equal(t, wantFaults, c.faults, "faults by processor (missing, minor, write-protect)")
	wantMoved := map[[2]Device]uint64{}
	for _, m := range st.Migrations {
		wantMoved[[2]Device{m.From, m.To}] = m.Pages
	}
	assert.Equal(t, wantMoved, c.moved, "pages migrated by direction")
	wantCause := map[[2]Device]map[string]uint64{}
	for _, m := range st.MigrationsByCause {
		k := [2]Device{m.From, m.To}
		if wantCause[k] == nil {
			wantCause[k] = map[string]uint64{}
		}
		wantCause[k][m.Cause] = m.Pages
	}
	assert.Equal(t, wantCause, c.byCause, "pages migrated by direction and cause")
	wantPop := map[Device]uint64{}
	for _, p := range st.Populated {
		wantPop[p.Processor] = p.Pages
	}
	assert.Equal(t, wantPop, c.populated, "pages populated by processor")
	wantEv := map[Device]uint64{}
	for _, p := range st.Evicted {
		wantEv[p.Processor] = p.Pages
	}
	assert.Equal(t, wantEv, c.evicted, "pages evicted by processor")
}

// TestTraceHoldsWhatTheStatisticsCount records a server (--trace) while
// the host writes N pages, a kernel on device 0 adds one to each, and the
// host reads them back; the trace, read once the server has closed it,
// holds exactly the faults, migrations and populations its statistics
// count, and each event's fields are what the program did.
func TestTraceHoldsWhatTheStatisticsCount(t *testing.T) {
	requireRoot(t)
	cfg := testServerConfig()
	s, path, log := recordingSession(t, cfg, "run.uvmtrace")
	const size = 4 << 20
	const pages = size / PageSize
	a, err := s.MallocManaged(size)
	require.NoError(t, err)
	b := a.Bytes()
	for i := 0; i < size; i += PageSize {
		b[i] = byte(i >> 12)
	}
	require.NoError(t, s.Launch(0, nil, "addOne", 3, rangeParams(a.Addr(), size, 0)))
	require.NoError(t, s.DeviceSynchronize(0))
	for i := 0; i < size; i += PageSize {
		require.Equal(t, byte(i>>12)+1, b[i], "page %d", i/PageSize)
	}
	addr := a.Addr()
	require.NoError(t, a.Free())
	st, err := s.Stats()
	require.NoError(t, err)
	require.NoError(t, s.Close())
	// The private server ends with its last client; it writes the
	// trace's end when it closes.
	waitTraceClosed(t, path)

	h, c := readTraceCounts(t, path)
	assert.Equal(t, "server", h.Scope)
	assert.Equal(t, 1, h.Devices)
	assert.NotEmpty(t, h.Policies["prefetch"])

	// What the program did, independently of the counters.
	assert.EqualValues(t, pages, c.populated[CPU], "the host's first touch of every page")
	assert.EqualValues(t, pages, c.moved[[2]Device{CPU, 0}], "every page to the device for the kernel")
	assert.EqualValues(t, pages, c.moved[[2]Device{0, CPU}], "every page back for the host's reads")
	requireTraceMatchesStats(t, c, st)

	assert.Equal(t, 1, c.kinds[trace.KindAlloc])
	assert.Equal(t, 1, c.kinds[trace.KindFree])
	assert.Equal(t, 1, c.kinds[trace.KindSession])
	assert.Equal(t, 1, c.kinds[trace.KindSessionEnd], "%v", c.kinds)
	me := int32(os.Getpid())
	var prev time.Duration
	var readAhead uint64
	for i, e := range c.events {
		switch e.Kind {
		case trace.KindAlloc:
			assert.Equal(t, uint64(addr), e.Addr)
			assert.Equal(t, uint64(size), e.Bytes)
			assert.Equal(t, me, e.PID)
		case trace.KindSession:
			assert.Equal(t, me, e.PID)
			assert.Zero(t, i, "the session comes first")
		case trace.KindFault:
			require.GreaterOrEqual(t, e.Addr, uint64(addr), "fault %d", i)
			require.Less(t, e.Addr, uint64(addr)+size, "fault %d", i)
			require.Zero(t, e.Addr%PageSize)
			require.Positive(t, e.Duration, "fault %d's service time", i)
			require.NotZero(t, e.Thread, "fault %d's thread", i)
			if e.Processor == int32(CPU) {
				require.Equal(t, me, e.PID, "a host fault is the client's")
			}
		case trace.KindMigration:
			require.GreaterOrEqual(t, e.Addr, uint64(addr), "migration %d", i)
			require.LessOrEqual(t, e.Addr+e.MovedBytes(), uint64(addr)+size, "migration %d", i)
			require.Positive(t, e.Pages)
			if e.Cause == trace.CausePrefetch {
				// A block read ahead of the host's sweep back.
				require.Equal(t, int32(CPU), e.To, "a read-ahead goes to the host: %+v", e)
				readAhead += uint64(e.Pages)
			} else {
				require.Equal(t, trace.CauseFault, e.Cause, "this program only faults, and reads ahead: %+v", e)
			}
			require.Positive(t, e.Duration, "migration %d's copy time", i)
		}
		// Threads race to the writer, but not by much.
		require.Greater(t, e.Time, prev-50*time.Millisecond, "event %d's time", i)
		prev = max(prev, e.Time)
	}
	assert.Equal(t, st.ReadAheadPages, readAhead, "the trace's read-ahead is what the statistics count")
	checkServerLog(t, log)
}

// TestTraceOfOneClient: a client started with UVM_TRACE=FILE gets its own
// events recorded by a daemon that records nothing else, and the trace
// holds what the daemon's statistics count (it is the only client).
func TestTraceOfOneClient(t *testing.T) {
	cfg := testServerConfig()
	cfg.Guard = false
	srv, sock := startServer(t, cfg)
	path := filepath.Join(t.TempDir(), "client.uvmtrace")
	out, err := child(t, "prefetch-round-trip", EnvSocket+"="+sock, server.TraceEnv+"="+path).CombinedOutput()
	require.NoError(t, err, "%s", out)
	Eventually(t, 10*time.Second, func() bool { return srv.SessionCount() == 0 }, "the client's session did not end")
	h, c := readTraceCounts(t, path)
	assert.Equal(t, "session", h.Scope)
	require.NotEmpty(t, h.Command)
	const pages = 8 << 20 / PageSize
	assert.EqualValues(t, pages, c.byCause[[2]Device{CPU, 0}]["prefetch"], "the prefetch to the device")
	assert.EqualValues(t, pages, c.byCause[[2]Device{0, CPU}]["prefetch"], "the prefetch back")
	requireTraceMatchesStats(t, c, srv.Stats())

	// A second client without UVM_TRACE records nothing there.
	fi, err := os.Stat(path)
	require.NoError(t, err)
	out, err = child(t, "prefetch-round-trip", EnvSocket+"="+sock).CombinedOutput()
	require.NoError(t, err, "%s", out)
	Eventually(t, 10*time.Second, func() bool { return srv.SessionCount() == 0 }, "the second session did not end")
	fi2, err := os.Stat(path)
	require.NoError(t, err)
	assert.Equal(t, fi.ModTime(), fi2.ModTime(), "another client's events went into the first one's trace")
}
