package integration

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/softuvm/softuvm/internal/bench/workloads"
)

// quarterSizes are the inputs TestRunWorkloads gives the real programs:
// small enough that each finishes under a quarter of its peak in seconds
// on the 2-CPU VM, where their default inputs (0.5-3 s plain) thrash for
// minutes (benchmarks.md has those figures), and large enough that most
// of each peak is heap, not the program's text and libraries. Measured
// with clock eviction on 2026-11-26: peaks of 8-20 MiB plain; under
// `uvm run` 1-12 s, moving 0.2-2 GiB each way.
var quarterSizes = map[string]int64{
	"gawk":    1 << 20,
	"perl":    1 << 20,
	"python3": 1 << 20,
	"sqlite3": 2 << 20,
	"jq":      1 << 20,
	"tsort":   1 << 20,
	"sort":    8 << 20,
	"zstd":    256 << 10,
	// The checkers: small, so that the budget below moves their memory
	// to the device and back thousands of times in seconds.
	"memtester": 2 << 20,
	"stress-ng": 4 << 20,
}

// TestRunWorkloads runs each real program of internal/bench/workloads (gawk, perl,
// python3, sqlite3, jq, tsort, sort, zstd: text tools, interpreters, a
// database, sort and a compressor, all allocating in small pieces) plain,
// through the peak-RSS wrapper, then under `uvm run` with its defaults
// and a host budget of a quarter of that peak (rounded up to a MiB), and
// wants:
//
//   - standard output (and zstd's output file) byte for byte the plain
//     run's;
//   - at least half of the plain peak managed: RunStats.ManagedBytes,
//     the smaller of the report's allocated_bytes (what the managed
//     allocations asked for) and its populated pages (the managed pages
//     the program touched), both counted over the whole run (the report
//     has no peak of managed memory);
//   - evictions: the report's evicted_pages above zero.
//
// Then memtester and stress-ng --verify, which check the memory they
// write, run under `uvm run` with a host budget of half their memory:
// exit status 0, no error line, evictions. Each run under `uvm run` is
// limited to two minutes (the checkers three), so that a program at the
// thrashing cliff fails with what it had moved instead of running for
// hours.
func TestRunWorkloads(t *testing.T) {
	requireRoot(t)
	uvmBin := filepath.Join(binDir, "uvm")
	peakWrapper, err := workloads.BuildPeakWrapper(t.TempDir())
	require.NoError(t, err)
	for _, p := range workloads.Set() {
		t.Run(p.Name, func(t *testing.T) {
			if _, err := p.Path(); err != nil {
				t.Skipf("%v (.ci/run installs it)", err)
			}
			size, ok := quarterSizes[p.Name]
			require.True(t, ok, "no input size chosen for %s", p.Name)
			dir := t.TempDir()
			w, err := p.Prepare(dir, size)
			require.NoError(t, err)
			w.PeakWrapper = peakWrapper

			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			plain, err := w.RunPlain(ctx, filepath.Join(dir, "plain"))
			cancel()
			require.NoError(t, err)
			require.NoError(t, w.Check(plain), "%s without uvm run", p.Name)

			budget := workloads.Budget(plain.MaxRSS, 0.25, 1<<20)
			if p.Checker {
				budget = size / 2
			}
			limit := 2 * time.Minute
			if p.Checker {
				limit = 3 * time.Minute // memtester: 45-50 s here
			}
			ctx, cancel = context.WithTimeout(context.Background(), limit)
			defer cancel()
			managed, err := w.RunUVM(ctx, filepath.Join(dir, "uvm"), workloads.UVMOptions{Bin: uvmBin, HostBudget: budget})
			if ctx.Err() != nil {
				soFar := ""
				if managed != nil && managed.Stats != nil {
					soFar = "; until then: " + managed.Describe()
				}
				t.Fatalf("%s under uvm run --host-budget %s did not finish within %v (plain: %s): a thrashing cliff?%s", p.Name, mib(uint64(budget)),
					limit, plain.Describe(), soFar)
			}
			require.NoError(t, err)
			t.Logf("%s (%s): plain %s; under uvm run --host-budget %s: %s", p.Name, w.CommandLine(), plain.Describe(), mib(uint64(budget)), managed.Describe())
			require.NoError(t, w.Check(managed), "%s under uvm run", p.Name)
			assert.NotContains(t, managed.Stderr, "libuvm-preload", "the preload library had something to say")
			assert.Positive(t, managed.Stats.EvictedPages, "%s: nothing was evicted under a host budget of %s", p.Name, mib(uint64(budget)))
			if p.Checker {
				return
			}
			assert.NoError(t, w.Compare(plain, managed), "%s's output under uvm run differs from its output without", p.Name)
			st := managed.Stats
			assert.GreaterOrEqual(t, st.ManagedBytes(), uint64(plain.MaxRSS/2),
				"%s: managed memory (allocated %s, populated %s) is less than half its plain peak RSS of %s", p.Name,
				mib(st.AllocatedBytes), mib(st.PopulatedBytes()), mib(uint64(plain.MaxRSS)))
		})
	}
}
