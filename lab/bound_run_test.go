package lab

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/softuvm/softuvm/libuvm"
	"github.com/softuvm/softuvm/policy"
)

// loopSource sweeps N pages of one allocation ROUNDS times (argv[1]),
// one store a page, in order; nothing else touches the heap meanwhile.
const loopSource = `#include <stdio.h>
#include <stdlib.h>
int main(int argc, char **argv) {
	enum { N = 64 };
	int rounds = atoi(argv[1]);
	volatile char *a = aligned_alloc(4096, N * 4096);
	for (int r = 0; r < rounds; r++)
		for (int p = 0; p < N; p++)
			a[p * 4096] += r + p;
	printf("%d\n", a[0] + a[(N - 1) * 4096]);
	return 0;
}
`

// TestMeasureBoundCountsALoop runs a program that sweeps 64 pages 10 times,
// then 20 times, under valgrind with room for 32 pages, and checks what
// the ten more sweeps add, so that what the program does around the
// loop (the loader, the allocator, printf) cancels out: LRU misses every
// page of every sweep, 640 more; MIN, on a loop of n pages with room for
// c, misses (n-c)/(n-1) of the references in the long run (the lab's
// own test checks MIN against a brute force), about 325 more.
func TestMeasureBoundCountsALoop(t *testing.T) {
	if _, err := exec.LookPath("valgrind"); err != nil {
		t.Skip("valgrind is not installed (.ci/run installs it)")
	}
	if _, err := findSharedLibrary("libjemalloc.so.2"); err != nil {
		t.Skipf("no jemalloc: %v", err)
	}
	dir := t.TempDir()
	src, bin := filepath.Join(dir, "loop.c"), filepath.Join(dir, "loop")
	require.NoError(t, os.WriteFile(src, []byte(loopSource), 0o644))
	require.NoError(t, libuvm.BuildProgram(bin, src))

	opts := BoundOptions{Budgets: []BoundBudget{{Text: "128KiB", Bytes: 128 << 10}}, Granules: []int64{4096}, FaultCost: 10 * time.Microsecond, Allocator: "jemalloc"}
	short, err := MeasureBound(context.Background(), []string{bin, "10"}, opts)
	require.NoError(t, err)
	long, err := MeasureBound(context.Background(), []string{bin, "20"}, opts)
	require.NoError(t, err)

	assert.Equal(t, short.HeapBytes, long.HeapBytes, "the same pages, swept more often")
	assert.GreaterOrEqual(t, short.HeapBytes, int64(64*4096), "the array is heap")
	assert.Less(t, short.HeapBytes, int64(4<<20), "the heap is not everything the program touched")
	s, l := short.Granules[0].Rows[0], long.Granules[0].Rows[0]
	assert.Equal(t, s.Cold, l.Cold)
	assert.Equal(t, int64(640), l.LRU-s.LRU, "LRU: every page of ten more sweeps")
	// No eviction holds more than 32 of a sweep's 64 pages: at least 32
	// misses a sweep. MIN's long-run rate is (n-c)/(n-1); over ten sweeps
	// the phase of its period (n-1 references) moves the count by a few.
	assert.GreaterOrEqual(t, l.OPT-s.OPT, int64(320), "MIN: at least half of every sweep")
	assert.InDelta(t, 640.0*32/63, float64(l.OPT-s.OPT), 8, "MIN: (n-c)/(n-1) of ten more sweeps")
	assert.InDelta(t, float64(l.OPT)*10e-6, l.LeastSeconds, 1e-9)
	// The default policy's column, replayed: between MIN and LRU on a
	// sweep larger than the budget, with each sweep costing it faults.
	require.NotNil(t, s.Default)
	require.NotNil(t, l.Default)
	t.Logf("%s faults: %d and %d; LRU %d and %d; MIN %d and %d", long.DefaultEviction, *s.Default, *l.Default, s.LRU, l.LRU, s.OPT, l.OPT)
	assert.Equal(t, policy.DefaultEviction, long.DefaultEviction)
	assert.GreaterOrEqual(t, *l.Default, l.OPT, "no policy below MIN")
	assert.Greater(t, *l.Default, *s.Default, "ten more sweeps cost the default faults")
}
