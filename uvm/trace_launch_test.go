package uvm

import (
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/softuvm/softuvm/devmem"
	"github.com/softuvm/softuvm/internal/device"
	"github.com/softuvm/softuvm/internal/server"
	"github.com/softuvm/softuvm/trace"
)

// Launches and synchronizations in traces. Under the fault coherence
// model they go from the client straight to the device process, which
// reports them to the server while the session is traced
// (internal/server/devicetrace.go); under the launch model the client
// tells the server itself.

// tracedOp is what a stream's part of a trace should hold, in order: a
// launch of a kernel, or a synchronization. slot is the st-sleep
// kernel's own record of when it ran (-1: none).
type tracedOp struct {
	sync bool
	name string
	slot int
}

// launchPlan is a program of launches and synchronizations on two
// streams of device 0, and what it leaves in a trace.
type launchPlan struct {
	ops      map[uint64][]tracedOp // by stream
	launches int
	syncs    int
	out      *Allocation // the st-sleep kernels' start and end, 16 bytes a slot
}

// Each st-sleep kernel of the plan sleeps this long, so that its start
// and its end are told apart in the trace.
const (
	planSleep1 = 5 * time.Millisecond
	planSleep2 = 3 * time.Millisecond
	planRounds = 4
	planBurst  = 100 // launches between two synchronizations, more than a device's report batch
)

// runLaunchPlan runs the plan: planRounds rounds of two kernels on each
// of two streams (an st-sleep and a "nothing" of 1 or 3 threads) and a
// synchronize of each stream; then planBurst kernels on the second
// stream and its synchronize; then one kernel on the first and its
// synchronize.
func runLaunchPlan(s *Session) (*launchPlan, error) {
	out, err := s.HostAlloc(PageSize, 0)
	if err != nil {
		return nil, err
	}
	st1, err := s.StreamCreate(0)
	if err != nil {
		return nil, err
	}
	st2, err := s.StreamCreate(0)
	if err != nil {
		return nil, err
	}
	p := &launchPlan{ops: map[uint64][]tracedOp{}, out: out}
	launch := func(st *Stream, name string, threads int, params []byte, slot int) error {
		p.ops[uint64(st.id)] = append(p.ops[uint64(st.id)], tracedOp{name: name, slot: slot})
		p.launches++
		return s.Launch(0, st, name, threads, params)
	}
	sleep := func(st *Stream, d time.Duration, slot int) error {
		params := binary.LittleEndian.AppendUint64(sleepParams(d), uint64(out.Addr())+uint64(slot)*16)
		return launch(st, "st-sleep", 1, params, slot)
	}
	sync := func(st *Stream) error {
		p.ops[uint64(st.id)] = append(p.ops[uint64(st.id)], tracedOp{sync: true, slot: -1})
		p.syncs++
		return s.StreamSynchronize(st)
	}
	for r := range planRounds {
		for _, step := range []func() error{
			func() error { return sleep(st1, planSleep1, 2*r) },
			func() error { return launch(st1, "nothing", 3, nil, -1) },
			func() error { return launch(st2, "nothing", 1, nil, -1) },
			func() error { return sleep(st2, planSleep2, 2*r+1) },
			func() error { return sync(st1) },
			func() error { return sync(st2) },
		} {
			if err := step(); err != nil {
				return nil, err
			}
		}
	}
	for range planBurst {
		if err := launch(st2, "nothing", 2, nil, -1); err != nil {
			return nil, err
		}
	}
	if err := sync(st2); err != nil {
		return nil, err
	}
	if err := launch(st1, "nothing", 1, nil, -1); err != nil {
		return nil, err
	}
	if err := sync(st1); err != nil {
		return nil, err
	}
	return p, nil
}

// slot is when the st-sleep kernel of slot i started and ended, by its
// own reading of CLOCK_MONOTONIC.
func (p *launchPlan) slot(i int) (start, end time.Duration) {
	b := p.out.Bytes()[16*i:]
	return time.Duration(binary.LittleEndian.Uint64(b)), time.Duration(binary.LittleEndian.Uint64(b[8:]))
}

// launchEvents are a trace's launches and synchronizations of pid's
// device 0, by stream, in the trace's order, and how many of each.
func launchEvents(t *testing.T, events []trace.Event, pid int32) (map[uint64][]trace.Event, int, int) {
	t.Helper()
	byStream := map[uint64][]trace.Event{}
	launches, syncs := 0, 0
	for _, e := range events {
		if e.Kind != trace.KindLaunch && e.Kind != trace.KindSync {
			continue
		}
		require.Equal(t, pid, e.PID, "a %s of another process", e.Kind)
		require.EqualValues(t, 0, e.Processor, "a %s on another processor", e.Kind)
		require.NotEqual(t, device.EventTimeKernel, e.Name, "the events' built-in kernel is no launch of the program")
		if e.Kind == trace.KindLaunch {
			launches++
		} else {
			syncs++
		}
		byStream[e.Stream] = append(byStream[e.Stream], e)
	}
	return byStream, launches, syncs
}

// TestTraceRecordsLaunchesUnderFaultModel: a server recording (--trace)
// while a program under the fault model launches kernels on two streams
// and synchronizes them holds exactly its launches (kernel, stream,
// device) and synchronizations, each stream's in order; each launch lies
// after the synchronization before it and before the one after it; and
// the kernels that timed themselves started when the trace says, not
// when they ended, on the trace's clock.
func TestTraceRecordsLaunchesUnderFaultModel(t *testing.T) {
	requireRoot(t)
	cfg := testServerConfig()
	s, path, log := recordingSession(t, cfg, "launches.uvmtrace")
	require.Equal(t, "fault", s.Coherence())
	p, err := runLaunchPlan(s)
	if err != nil {
		s.Close()
		require.NoError(t, err)
	}
	// The kernels' own times, before Close frees the pinned memory.
	slots := map[int][2]time.Duration{}
	for _, ops := range p.ops {
		for _, op := range ops {
			if op.slot >= 0 {
				start, end := p.slot(op.slot)
				require.GreaterOrEqual(t, end-start, planSleep2, "slot %d: the kernel's own times", op.slot)
				slots[op.slot] = [2]time.Duration{start, end}
			}
		}
	}
	require.NoError(t, s.Close())
	waitTraceClosed(t, path)
	// CLOCK_MONOTONIC at the trace's time 0 (its header's wall-clock
	// start), from a pair of readings of both clocks.
	h, events, err := trace.ReadFile(path)
	require.NoError(t, err)
	monoOfStart := devmem.MonotonicNow() - time.Since(h.Started)
	traceTime := func(mono time.Duration) time.Duration { return mono - monoOfStart }

	byStream, launches, syncs := launchEvents(t, events, int32(os.Getpid()))
	assert.Equal(t, p.launches, launches, "launches in the trace")
	assert.Equal(t, p.syncs, syncs, "synchronizations in the trace")
	require.Len(t, byStream, 2, "two streams")
	for stream, want := range p.ops {
		got := byStream[stream]
		require.Equal(t, len(want), len(got), "stream %d: its launches and synchronizations", stream)
		var prevSyncEnd, prevLaunch time.Duration
		for i, op := range want {
			e := got[i]
			what := fmt.Sprintf("stream %d, event %d", stream, i)
			if op.sync {
				require.Equal(t, trace.KindSync, e.Kind, what)
				require.GreaterOrEqual(t, e.Duration, time.Duration(0), what)
				prevSyncEnd = e.Time + e.Duration
				continue
			}
			require.Equal(t, trace.KindLaunch, e.Kind, what)
			require.Equal(t, op.name, e.Name, what)
			require.GreaterOrEqual(t, e.Duration, time.Duration(0), "%s: ends no earlier than it began", what)
			require.GreaterOrEqual(t, e.Time, prevSyncEnd, "%s: starts after the synchronization before it answered", what)
			require.GreaterOrEqual(t, e.Time, prevLaunch, "%s: starts after the launch before it on its stream", what)
			prevLaunch = e.Time + e.Duration
			// The synchronization after it began once it had ended.
			next := i + 1
			for !want[next].sync {
				next++
			}
			require.LessOrEqual(t, e.Time+e.Duration, got[next].Time, "%s: ends before the next synchronization of its stream", what)
			if op.slot >= 0 {
				// The device reads its clock just before the kernel
				// starts: the launch's time is the kernel's start, give
				// or take the conversion between the trace's clock and
				// the wall clock, far from its end.
				k := slots[op.slot]
				start, end := traceTime(k[0]), traceTime(k[1])
				assert.InDelta(t, float64(start), float64(e.Time), float64(time.Millisecond),
					"%s: the launch's time against the kernel's own start (its end is %v later)", what, k[1]-k[0])
				assert.GreaterOrEqual(t, got[next].Time, end-time.Millisecond, "%s: the next synchronization against the kernel's own end", what)
			}
		}
	}
	checkServerLog(t, log)
}

// TestTraceLaunchesOnceUnderLaunchModel: under the launch coherence model
// the client tells the server of each launch and synchronization, and
// the trace holds each once: its device processes are not asked to
// report as well.
func TestTraceLaunchesOnceUnderLaunchModel(t *testing.T) {
	requireRoot(t)
	cfg := launchConfig("wp-async")
	s, path, log := recordingSession(t, cfg, "launch-model.uvmtrace")
	require.Equal(t, "launch", s.Coherence())
	st, err := s.StreamCreate(0)
	require.NoError(t, err)
	const k = 5
	for range k {
		require.NoError(t, s.Launch(0, st, "nothing", 2, nil))
	}
	require.NoError(t, s.StreamSynchronize(st))
	require.NoError(t, s.Launch(0, st, "nothing", 1, nil))
	require.NoError(t, s.StreamSynchronize(st))
	require.NoError(t, s.Close())
	waitTraceClosed(t, path)
	_, events, err := trace.ReadFile(path)
	require.NoError(t, err)
	byStream, launches, syncs := launchEvents(t, events, int32(os.Getpid()))
	assert.Equal(t, k+1, launches, "each launch once")
	assert.Equal(t, 2, syncs, "each synchronization once")
	assert.Len(t, byStream[uint64(st.id)], k+3)
	checkServerLog(t, log)
}

func init() { testRoles["trace-launches"] = roleTraceLaunches }

// roleTraceLaunches runs the launch plan through the daemon at
// UVM_SOCKET and prints how many launches and synchronizations it made.
func roleTraceLaunches() int {
	s, err := Connect(Config{Server: "daemon", Socket: os.Getenv(EnvSocket)})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	p, err := runLaunchPlan(s)
	if cerr := s.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	fmt.Printf("%d %d\n", p.launches, p.syncs)
	return 0
}

// TestTraceLaunchesOfOneClient: a client started with UVM_TRACE=FILE, of
// a daemon that records nothing else, gets its device's launches and
// synchronizations in its own trace.
func TestTraceLaunchesOfOneClient(t *testing.T) {
	cfg := testServerConfig()
	cfg.Guard = false
	srv, sock := startServer(t, cfg)
	path := filepath.Join(t.TempDir(), "client.uvmtrace")
	cmd := child(t, "trace-launches", EnvSocket+"="+sock, server.TraceEnv+"="+path)
	out, err := cmd.Output()
	require.NoError(t, err, "%s", out)
	Eventually(t, 10*time.Second, func() bool { return srv.SessionCount() == 0 }, "the client's session did not end")
	var wantLaunches, wantSyncs int
	_, err = fmt.Sscan(string(out), &wantLaunches, &wantSyncs)
	require.NoError(t, err, "%s", out)
	h, events, err := trace.ReadFile(path)
	require.NoError(t, err)
	assert.Equal(t, "session", h.Scope)
	_, launches, syncs := launchEvents(t, events, int32(cmd.Process.Pid))
	assert.Equal(t, wantLaunches, launches, "launches in the client's trace")
	assert.Equal(t, wantSyncs, syncs, "synchronizations in the client's trace")
}
