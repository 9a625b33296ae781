package grade

import (
	"compress/gzip"
	"io"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/softuvm/softuvm/lab/course"
	"github.com/softuvm/softuvm/uvm"
)

// The live runs' private servers are re-executions of this test binary.
func TestMain(m *testing.M) {
	uvm.Main()
	os.Exit(m.Run())
}

func TestOutcome(t *testing.T) {
	assert.Equal(t, Beats, outcome(90, 100))
	assert.Equal(t, Loses, outcome(110, 100))
	assert.Equal(t, Ties, outcome(100, 100))
	assert.Equal(t, Ties, outcome(100.05, 100), "within a thousandth")
	assert.Equal(t, Ties, outcome(0, 0))
	assert.Equal(t, Ties, outcomeWithin(1.02, 1, liveTie), "live runs vary by a percent or two")
	assert.Equal(t, Beats, outcomeWithin(0.9, 1, liveTie))
}

func TestVerdict(t *testing.T) {
	half := 0.5
	r := &Report{Baseline: "lru", Oracle: "opt", Traces: []TraceScore{
		{Outcome: Beats, VsBaseline: 0.5, GapClosed: &half},
		{Outcome: Ties, VsBaseline: 1, GapClosed: &half},
	}}
	r.sum()
	v := r.Verdict
	assert.True(t, v.Pass, "beats somewhere, loses nowhere")
	assert.Equal(t, 1, v.Beats)
	assert.Equal(t, 1, v.Ties)
	assert.InDelta(t, math.Sqrt(0.5), v.MeanVsBaseline, 1e-9, "the geometric mean")
	require.NotNil(t, v.MeanGapClosed)
	assert.InDelta(t, 0.5, *v.MeanGapClosed, 1e-9)
	assert.Contains(t, v.Line, "beats the baseline (lru) on 1 of 2 traces")
	assert.Contains(t, v.Line, "PASS")

	r.Live = &Live{Outcome: Loses}
	r.sum()
	assert.False(t, r.Verdict.Pass, "losing live fails")
	r.Live = &Live{Skipped: "no userfaultfd"}
	r.sum()
	assert.True(t, r.Verdict.Pass, "a skipped live run does not count")
	assert.Contains(t, r.Verdict.Line, "live run skipped")

	r = &Report{Baseline: "off", Traces: []TraceScore{{Outcome: Ties, VsBaseline: 1}}}
	r.sum()
	assert.False(t, r.Verdict.Pass, "ties everywhere is not yet a pass")
	assert.Nil(t, r.Verdict.MeanGapClosed, "no oracle")
}

// TestNoStudentPolicy: this test binary registers no policy named
// "student": Grade says so, and how to register one.
func TestNoStudentPolicy(t *testing.T) {
	_, err := Grade("eviction", Options{File: "mine.go", Traces: []string{t.TempDir()}, NoLive: true})
	require.Error(t, err)
	assert.Contains(t, err.Error(), `mine.go registers no eviction policy named "student"`)
	assert.Contains(t, err.Error(), `policy.RegisterEviction("student", ...)`)

	_, err = Grade("paging", Options{})
	require.Error(t, err)
	assert.Contains(t, err.Error(), `unknown assignment "paging": want one of prefetch, eviction, thrashing`)
}

func TestPolicyFrames(t *testing.T) {
	stack := "goroutine 7 [running]:\n" +
		"runtime/debug.Stack()\n\t/go/src/runtime/debug/stack.go:26 +0x5e\n" +
		"github.com/softuvm/softuvm/lab/course/grade.replayOne.func1()\n\t/src/lab/course/grade/replay.go:140 +0x45\n" +
		"panic({0x1, 0x2})\n\t/go/src/runtime/panic.go:785 +0x132\n" +
		"github.com/softuvm/softuvm/lab/course/_grade/ab/student.(*Stream).Expand(...)\n\t/src/lab/course/_grade/ab/student/student.go:61 +0x1\n" +
		"github.com/softuvm/softuvm/lab.(*sim).fault(...)\n\t/src/lab/sim.go:400 +0x1\n"
	got := policyFrames([]byte(stack))
	assert.Equal(t, "github.com/softuvm/softuvm/lab/course/_grade/ab/student.(*Stream).Expand(...)\n\t/src/lab/course/_grade/ab/student/student.go:61 +0x1", got)
}

// TestRecordTurnsTrace records the thrashing assignment's own trace,
// lab/course/thrashing/traces/turns.uvmtrace.gz: the live program of the
// assignment (the host and a device writing the same pages in turn, a
// round every few hundred microseconds) with no thrashing policy, so
// that every round's faults are in it. It is the quick ping-pong that
// NVIDIA's detector is made for; the shipped lab/traces/pingpong is a
// slow one, a round every few tens of milliseconds. It runs only when
// asked:
//
//	UVM_COURSE_RECORD=1 go test ./lab/course/grade -run TestRecordTurnsTrace
func TestRecordTurnsTrace(t *testing.T) {
	if os.Getenv("UVM_COURSE_RECORD") == "" {
		t.Skip("set UVM_COURSE_RECORD=1 to record lab/course/thrashing/traces/turns.uvmtrace.gz")
	}
	if os.Geteuid() != 0 {
		t.Skip("needs root: /dev/userfaultfd is root-only here")
	}
	a, err := course.Lookup("thrashing")
	require.NoError(t, err)
	raw := filepath.Join(t.TempDir(), "turns.uvmtrace")
	run, err := liveOnce(workloadOf(a), "baseline", "off", "off", raw, "")
	require.NoError(t, err)
	require.True(t, run.Checked)
	t.Logf("recorded: %d faults, %d pages moved", run.Faults, run.PagesToDevice+run.PagesToHost)

	out := filepath.Join("..", "thrashing", "traces", "turns.uvmtrace.gz")
	require.NoError(t, os.MkdirAll(filepath.Dir(out), 0o755))
	in, err := os.Open(raw)
	require.NoError(t, err)
	defer in.Close()
	f, err := os.Create(out)
	require.NoError(t, err)
	zw, err := gzip.NewWriterLevel(f, gzip.BestCompression)
	require.NoError(t, err)
	_, err = io.Copy(zw, in)
	require.NoError(t, err)
	require.NoError(t, zw.Close())
	require.NoError(t, f.Close())
	st, err := os.Stat(out)
	require.NoError(t, err)
	t.Logf("wrote %s (%d bytes)", out, st.Size())
	assert.True(t, strings.HasSuffix(out, ".uvmtrace.gz"))
}
