package bench

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/softuvm/softuvm/internal/bench/workloads"
	"github.com/softuvm/softuvm/trace"
)

// buildUVMForTest builds uvm and libuvm (its preload library beside it)
// into a temporary directory for a test that runs `uvm run`, and returns
// the uvm binary's path. It skips the test where that cannot work: -short,
// not root (userfaultfd), or one of the tools missing (go, make, cc and
// those named).
func buildUVMForTest(t *testing.T, tools ...string) string {
	t.Helper()
	if testing.Short() {
		t.Skip("builds uvm and libuvm")
	}
	if os.Geteuid() != 0 {
		t.Skip("uvm run needs userfaultfd, which is root-only here")
	}
	for _, tool := range append([]string{"go", "make", "cc"}, tools...) {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("no %s: %v", tool, err)
		}
	}
	dir := t.TempDir()
	for _, args := range [][]string{
		{"go", "build", "-o", filepath.Join(dir, "uvm"), "github.com/softuvm/softuvm/cmd/uvm"},
		{"make", "-s", "-C", "../..", "lib", "BIN=" + dir},
	} {
		out, err := exec.Command(args[0], args[1:]...).CombinedOutput()
		require.NoError(t, err, "%s: %s", strings.Join(args, " "), out)
	}
	return filepath.Join(dir, "uvm")
}

// A tiny `uvm bench run`: sort of 4 MiB with a budget of its whole peak
// (nothing here is timed or meant to thrash), every variant run and
// checked, the figures read from `uvm run --stats-json`, and the cgroup
// and swap device gone after.
func TestBenchRun(t *testing.T) {
	uvmBin := buildUVMForTest(t, "sort")
	leftNothing := noCgroupOrSwapLeft(t)
	progs, err := workloads.Select("sort")
	require.NoError(t, err)
	traces := t.TempDir()
	rep, err := Run(context.Background(), RunOptions{Programs: progs, Fraction: 1, Evictions: []string{"lru"}, Runs: 1,
		Size: map[string]int64{"sort": 4 << 20}, UVMBin: uvmBin, Timeout: time.Minute, Progress: t.Logf, TraceDir: traces})
	require.NoError(t, err)
	require.Len(t, rep.Programs, 1)
	p := rep.Programs[0]
	require.Empty(t, p.Skipped)
	assert.Positive(t, p.PeakRSSBytes)
	assert.Equal(t, workloads.Budget(p.PeakRSSBytes, 1, 4<<20), p.BudgetBytes)
	assert.Empty(t, p.Plain.Failed)
	assert.Len(t, p.Plain.Runs, 1)
	require.Len(t, p.Managed, 1)
	m := p.Managed[0]
	assert.Empty(t, m.Failed, "the run under uvm run")
	assert.Len(t, m.Runs, 1)
	assert.Equal(t, "lru", m.Eviction)
	assert.Positive(t, m.AllocatedBytes, "figures from --stats-json")
	assert.Positive(t, m.Faults)
	// --trace: the last run's trace, whose faults are the ones its
	// statistics counted.
	assert.Equal(t, filepath.Join(traces, "sort-lru.uvmtrace"), m.Trace)
	summary, err := trace.Summarize(m.Trace)
	require.NoError(t, err)
	assert.EqualValues(t, m.Faults, summary.TotalFaults(), "the trace's faults against uvm run's statistics")
	assert.Contains(t, p.ManagedToPlain, "lru")
	assert.Contains(t, p.GoalPlainMet, "lru")
	if p.Cgroup == nil {
		assert.NotEmpty(t, p.CgroupSkipped)
		t.Logf("cgroup variant skipped: %s", p.CgroupSkipped)
	} else {
		assert.Empty(t, p.Cgroup.Failed)
		assert.Len(t, p.Cgroup.Runs, 1)
		assert.Contains(t, p.GoalCgroupMet, "lru")
	}
	leftNothing()
}
