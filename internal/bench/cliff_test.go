package bench

import (
	"bytes"
	"context"
	"fmt"
	"image/png"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/softuvm/softuvm/libuvm"
)

func TestParseCliffBudgets(t *testing.T) {
	got, err := ParseCliffBudgets("25, 100,50%,90,50")
	require.NoError(t, err)
	assert.Equal(t, []float64{100, 90, 50, 25}, got, "from the largest down, once each")
}

// xorshift is the walk's generator as cliff_walk.c writes it, here
// again so that the tests do not check the code under test against
// itself.
func xorshift(x uint64) uint64 {
	x ^= x << 13
	x ^= x >> 7
	x ^= x << 17
	return x
}

// The Go walk visits the words the C program visits: the program
// prints a hash of its indices, which walkHash must give; and walkRefs
// is the program's page string: a pass writing every page, a store at
// each word visited, a pass reading every page.
func TestWalkMatchesTheCProgram(t *testing.T) {
	if _, err := exec.LookPath("cc"); err != nil {
		t.Skipf("no C compiler: %v", err)
	}
	dir := t.TempDir()
	src, bin := filepath.Join(dir, "cliff_walk.c"), filepath.Join(dir, "cliff_walk")
	require.NoError(t, os.WriteFile(src, []byte(cliffWalkSource), 0o644))
	require.NoError(t, libuvm.BuildProgram(bin, src))
	for _, c := range []struct{ bytes, steps, seed uint64 }{
		{1 << 20, 100_000, walkSeed},
		{3 * 4096, 5000, 12345},
		{8, 10, 1},
	} {
		out, err := exec.Command(bin, fmt.Sprint(c.bytes), fmt.Sprint(c.steps), fmt.Sprintf("%#x", c.seed)).CombinedOutput()
		require.NoError(t, err, "%s", out)
		m := walkLine.FindSubmatch(out)
		require.NotNil(t, m, "%s", out)
		assert.Equal(t, fmt.Sprintf("%016x", walkHash(c.bytes/8, c.steps, c.seed)), string(m[1]), "%+v", c)
	}
	out, err := exec.Command(bin, "4096", "10", "0").CombinedOutput()
	assert.Error(t, err)
	assert.Contains(t, string(out), "SEED 0: want a number other than 0")

	// Four pages, twelve steps: the pages worked out here.
	var want []string
	for p := 0; p < 4; p++ {
		want = append(want, fmt.Sprintf("S%d", p))
	}
	x := uint64(99)
	pages := map[uint64]bool{}
	for range 12 {
		x = xorshift(x)
		page := (x % 2048) * 8 / 4096
		pages[page] = true
		want = append(want, fmt.Sprintf("S%d", page))
	}
	require.Greater(t, len(pages), 2, "the steps visit several pages")
	for p := 0; p < 4; p++ {
		want = append(want, fmt.Sprintf("L%d", p))
	}
	var got []string
	for page, store := range walkRefs(16384, 12, 99) {
		got = append(got, fmt.Sprintf("%s%d", map[bool]string{true: "S", false: "L"}[store], page))
	}
	assert.Equal(t, want, got)
}

// lruFaultsBrute is least-recently-used eviction simulated on a list,
// counting every miss, first references included.
func lruFaultsBrute(refs []uint64, capacity int) int64 {
	var stack []uint64 // most recent last
	var misses int64
	for _, p := range refs {
		if i := slices.Index(stack, p); i >= 0 {
			stack = slices.Delete(stack, i, i+1)
		} else {
			misses++
			if len(stack) == capacity {
				stack = stack[1:]
			}
		}
		stack = append(stack, p)
	}
	return misses
}

// minFaultsBrute is Belady's MIN by its definition: at a miss with the
// memory full, evict the resident page whose next reference is
// furthest, found by scanning every resident page; every miss counted.
func minFaultsBrute(refs []uint64, capacity int) int64 {
	next := make([]int, len(refs)) // the position of the same page's next reference
	last := map[uint64]int{}
	for i := len(refs) - 1; i >= 0; i-- {
		next[i] = len(refs)
		if j, ok := last[refs[i]]; ok {
			next[i] = j
		}
		last[refs[i]] = i
	}
	nextUse := map[uint64]int{}
	var resident []uint64
	var misses int64
	for i, p := range refs {
		if !slices.Contains(resident, p) {
			misses++
			if len(resident) == capacity {
				victim := 0
				for k, q := range resident {
					if nextUse[q] > nextUse[resident[victim]] {
						victim = k
					}
				}
				resident = slices.Delete(resident, victim, victim+1)
			}
			resident = append(resident, p)
		}
		nextUse[p] = next[i]
	}
	return misses
}

// TestBenchCliffSynthetic draws the curve of the loop and the walk over
// 2 MiB arrays at three budgets, one run each, and checks the report:
// its structure, the managed peak (the array), the budgets made of it,
// every output checked and every budget finished, and LRU's and MIN's
// faults against brute-force simulations of reference strings built
// here from the programs' C code; then its table and its picture.
// Nothing here is timed: the times are measured, not judged.
func TestBenchCliffSynthetic(t *testing.T) {
	uvmBin := buildUVMForTest(t)
	const size = 2 << 20
	const pages = size / 4096
	percents := []float64{100, 90, 50}
	pictures := t.TempDir()
	rep, err := Cliff(context.Background(), CliffOptions{
		Programs: []string{"loop", "walk"}, Percents: percents, Runs: 1, Size: map[string]int64{"loop": size, "walk": size},
		UVMBin: uvmBin, PNG: pictures, Timeout: 5 * time.Minute, Progress: t.Logf,
	})
	require.NoError(t, err)
	require.Len(t, rep.Programs, 2)

	// The reference strings, from the C programs' loops.
	var loop, walk []uint64
	for pass := 0; pass < 1+loopSweeps+1; pass++ { // the first write, the sweeps, the check
		for p := uint64(0); p < pages; p++ {
			loop = append(loop, p)
		}
	}
	for p := uint64(0); p < pages; p++ {
		walk = append(walk, p)
	}
	x := uint64(walkSeed)
	for range size / walkBytesPerStep {
		x = xorshift(x)
		walk = append(walk, (x%(size/8))*8/4096)
	}
	for p := uint64(0); p < pages; p++ {
		walk = append(walk, p)
	}

	for i, refs := range [][]uint64{loop, walk} {
		p := rep.Programs[i]
		name := []string{"loop", "walk"}[i]
		require.Equal(t, name, p.Name)
		require.Empty(t, p.Skipped)
		assert.True(t, p.Synthetic)
		assert.Equal(t, int64(size), p.SizeBytes)
		assert.Equal(t, []string{"--min-size", "1MiB"}, p.UVMFlags)
		assert.Equal(t, int64(size), p.PeakBytes, "%s: the managed peak is the array, all of it", name)
		assert.Empty(t, p.Notes)
		assert.True(t, p.Plain.ok(), "%s plain: %s", name, p.Plain.Failed)
		assert.True(t, p.Unbounded.ok(), "%s with no budget: %s", name, p.Unbounded.Failed)
		assert.Zero(t, p.Unbounded.HostToDeviceBytes, "%s: nothing leaves the host without a budget", name)
		assert.Equal(t, int64(size), p.Unbounded.HostPeakBytes)
		assert.Equal(t, "computed from the program's exact page reference string", p.BoundSource)
		assert.Equal(t, int64(size), p.BoundHeap)
		require.Len(t, p.Points, len(percents))
		for j, pt := range p.Points {
			pct := percents[j]
			assert.Equal(t, pct, pt.Percent)
			budget := int64(size*pct/100) / 4096 * 4096
			assert.Equal(t, budget, pt.BudgetBytes, "%s at %g%%", name, pct)
			require.True(t, pt.ok(), "%s at %g%%: %s", name, pct, pt.Failed)
			assert.Len(t, pt.Runs, 1)
			assert.InDelta(t, pt.Seconds/p.Plain.Seconds, pt.ToPlain, 1e-9)
			assert.Positive(t, pt.Faults)
			assert.LessOrEqual(t, pt.MissingFaults, pt.Faults)
			if pct < 100 {
				// What is over the budget leaves the host. (Whether it
				// comes back by a fault is the server's business: at
				// 90% of one block the walk's excess may stay away.)
				assert.GreaterOrEqual(t, pt.HostToDeviceBytes, uint64(size-budget), "%s at %g%%: pages left the host", name, pct)
			}
			capacity := int(budget / 4096)
			b := pt.Bound
			require.NotNil(t, b, "%s at %g%%: LRU and MIN", name, pct)
			lru, opt := lruFaultsBrute(refs, capacity), minFaultsBrute(refs, capacity)
			assert.Equal(t, lru, b.LRUFaults, "%s at %g%%: LRU", name, pct)
			assert.Equal(t, opt, b.MINFaults, "%s at %g%%: MIN", name, pct)
			assert.Equal(t, int64(pages), b.ColdFaults)
			require.NotNil(t, b.FaultsToLRU)
			assert.InDelta(t, float64(pt.Faults)/float64(lru), *b.FaultsToLRU, 1e-9)
			// What MIN brings back: its misses but the first touches.
			assert.Equal(t, (opt-pages)*4096, b.MINBackBytes, "%s at %g%%", name, pct)
			if b.MINBackBytes > 0 {
				require.NotNil(t, b.BackToMIN)
				assert.InDelta(t, float64(pt.DeviceToHostBytes)/float64((opt-pages)*4096), *b.BackToMIN, 1e-9)
				assert.InDelta(t, float64(lru-pages)/float64(opt-pages), b.lruBackToMIN(), 1e-9)
			}
		}
		// With room for every page, both take the first touches only.
		assert.Equal(t, int64(pages), p.Points[0].Bound.LRUFaults)
		assert.Equal(t, int64(pages), p.Points[0].Bound.MINFaults)
		var goals []string
		for _, g := range p.Goals {
			goals = append(goals, g.Goal)
			assert.NotEmpty(t, g.Detail, "%s: %s", name, g.Goal)
		}
		assert.Equal(t, []string{"at 90% of the peak at most 1.5x plain", "at 50% of the peak at most 3x plain",
			"no step between neighbouring budgets above 3x", "faults at most LRU's at every budget"}, goals, name)
		g90 := p.Goals[0]
		assert.Equal(t, p.Points[1].ToPlain <= cliffGoalAt90, g90.Met, "%s: %s, %.2fx", name, g90.Goal, p.Points[1].ToPlain)
		stepsMet := p.Points[1].Seconds/p.Points[0].Seconds <= 3 && p.Points[2].Seconds/p.Points[1].Seconds <= 3
		assert.Equal(t, stepsMet, p.Goals[2].Met, "%s: %s", name, p.Goals[2].Detail)
	}

	var b bytes.Buffer
	rep.Print(&b)
	text := b.String()
	for _, want := range []string{"loop: oversub_sweep 2097152 20", "walk: cliff_walk 2097152 16384 0x9e3779b97f4a7c15", "managed peak 2 MiB (uvm run --min-size 1MiB)",
		"no budget", "90% (1.8 MiB)", "50% (1 MiB)", "goal: at 90% of the peak at most 1.5x plain:", "every goal of every program:"} {
		assert.Contains(t, text, want)
	}
	assert.Regexp(t, regexp.MustCompile(`goal: faults at most LRU's at every budget:\s+(met|NOT met)`), text)
	t.Logf("%s", text)

	// --png DIR: cliff.png in it.
	require.Equal(t, filepath.Join(pictures, "cliff.png"), rep.PNG)
	raw, err := os.ReadFile(rep.PNG)
	require.NoError(t, err)
	img, err := png.Decode(bytes.NewReader(raw))
	require.NoError(t, err)
	assert.Equal(t, cliffPlotWidth, img.Bounds().Dx())
	assert.Equal(t, cliffPlotHeight, img.Bounds().Dy())
}
