package uvm

import (
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/softuvm/softuvm/internal/config"
	"github.com/softuvm/softuvm/lab"
	"github.com/softuvm/softuvm/policy"
)

// pagesPerBlock is the pages of a block.
const pagesPerBlock = BlockSize / PageSize

// loopPages is the page numbers (of allocation a) a loop touches, in
// order, each pass.
type loopPages []int

func pageRange(first, outer int) loopPages {
	l := make(loopPages, 0, outer-first)
	for p := first; p < outer; p++ {
		l = append(l, p)
	}
	return l
}

// minFaultsPerPass is Belady's MIN's misses a pass (the first pass's,
// all cold, not counted) of passes over loop, with room for capacity
// granules of granule bytes: the lab's bound, from the references the
// test program makes, given to it as valgrind's lackey would report
// them.
func minFaultsPerPass(t *testing.T, loop loopPages, passes int, granule int64, capacity int) float64 {
	t.Helper()
	var refs strings.Builder
	for range passes {
		for _, p := range loop {
			fmt.Fprintf(&refs, " M %x,1\n", 0x10000000+p*PageSize)
		}
	}
	stream, err := lab.ReadLackey(strings.NewReader(refs.String()))
	require.NoError(t, err)
	g, err := stream.Granules(nil, granule)
	require.NoError(t, err)
	m := g.Misses(capacity)
	return float64(m.OPT) / float64(passes-1)
}

// loopMissingFaults runs, under cfg, a program that adds one to the
// first byte of each page of loop in order, warm passes and then
// measured passes, checks every page, and returns the host's missing
// faults (those that brought pages) per measured pass.
func loopMissingFaults(t *testing.T, cfg ServerConfig, pages int, loop loopPages, warm, measured int) (float64, Stats) {
	t.Helper()
	s := newSession(t, cfg)
	a, err := s.MallocManaged(int64(pages) * PageSize)
	require.NoError(t, err)
	b := a.Bytes()
	var before Stats
	for pass := 0; pass < warm+measured; pass++ {
		if pass == warm {
			before, err = a.Stats()
			require.NoError(t, err)
		}
		for _, p := range loop {
			b[p*PageSize]++
		}
	}
	after, err := a.Stats()
	require.NoError(t, err)
	count := map[int]byte{}
	for _, p := range loop {
		count[p]++
	}
	for p := 0; p < pages; p++ {
		require.Equal(t, byte(int(count[p])*(warm+measured)), b[p*PageSize], "page %d", p)
	}
	faults := after.FaultsBy(CPU).Missing - before.FaultsBy(CPU).Missing
	return float64(faults) / float64(measured), after
}

// refaultConfig is a server with a host budget of budget bytes, a
// device to take what the host cannot hold, prefetch as given, and the
// resident core on or off.
func refaultConfig(budget int64, prefetch string, refault bool) ServerConfig {
	cfg := smallArenaConfig(64 << 20)
	cfg.HostBudget = budget
	if prefetch != "" {
		ps, err := policy.ParsePrefetchSpec(prefetch)
		if err != nil {
			panic(err)
		}
		cfg.Prefetch = ps
	}
	cfg.Thrashing.Refault = refault
	return cfg
}

// TestRefaultCoreLoopOfBlocks: a program loops over 23 blocks under a
// host budget of 20 (1.15 times what fits), whole blocks moving. Least
// recently moved blocks, and the clock, whose blocks all come back soon
// after they left, lose every block each pass; with its refaults
// answered, the host keeps a core of the loop and faults on its excess,
// at most twice as often as Belady's MIN (3.1 blocks a pass here).
func TestRefaultCoreLoopOfBlocks(t *testing.T) {
	const blocks, budget, warm, measured = 23, 20, 4, 8
	loop := pageRange(0, blocks*pagesPerBlock)
	min := minFaultsPerPass(t, loop, warm+measured, BlockSize, budget)
	for _, refault := range []bool{true, false} {
		t.Run(fmt.Sprintf("refault=%v", refault), func(t *testing.T) {
			cfg := refaultConfig(budget*BlockSize, "", refault)
			cfg.LargeFolios = config.LargeFoliosAuto // blocks move whole where they may
			got, st := loopMissingFaults(t, cfg, blocks*pagesPerBlock, loop, warm, measured)
			t.Logf("missing faults a pass %.1f, MIN's %.2f; %+v", got, min, st.RefaultsOf(CPU))
			if refault {
				assert.LessOrEqual(t, got, 2*min, "faults a pass, against twice MIN's")
				assert.Positive(t, st.RefaultsOf(CPU).Protected, "nothing was protected")
			} else {
				assert.Greater(t, got, 2*min, "without the core the loop should fault on (nearly) every block")
			}
		})
	}
}

// TestRefaultCoreLoopOfPages: the same within one block, page by page
// (no prefetch): a loop over 460 pages under a budget of 400. The
// eviction policy has no other block to offer, so the block's own pages
// leave; without the core the oldest (the loop's next) go at each
// fault.
func TestRefaultCoreLoopOfPages(t *testing.T) {
	const pages, budget, warm, measured = 460, 400, 4, 10
	loop := pageRange(0, pages)
	min := minFaultsPerPass(t, loop, warm+measured, PageSize, budget)
	for _, refault := range []bool{true, false} {
		t.Run(fmt.Sprintf("refault=%v", refault), func(t *testing.T) {
			got, st := loopMissingFaults(t, refaultConfig(budget*PageSize, "none", refault), pages, loop, warm, measured)
			t.Logf("missing faults a pass %.1f, MIN's %.2f; %+v", got, min, st.RefaultsOf(CPU))
			if refault {
				assert.LessOrEqual(t, got, 2*min, "faults a pass, against twice MIN's")
			} else {
				assert.Greater(t, got, 2*min, "without the core the loop should fault on (nearly) every page")
			}
		})
	}
}

// TestRefaultCoreFollowsAWorkingSetThatMovesOn: a program loops over
// 460 pages of one block under a budget of 400, then over 460 pages of
// another. The first loop's core fills the host's protections; they end
// with their generation, so that the second loop forms a core of its
// own and, once it has, faults at most twice as often as MIN. A core
// that never aged would leave the second loop to fault on every page.
func TestRefaultCoreFollowsAWorkingSetThatMovesOn(t *testing.T) {
	const budget = 400
	first, second := pageRange(0, 460), pageRange(pagesPerBlock, pagesPerBlock+460)
	cfg := refaultConfig(budget*PageSize, "none", true)
	s := newSession(t, cfg)
	a, err := s.MallocManaged(2 * BlockSize)
	require.NoError(t, err)
	b := a.Bytes()
	pass := func(loop loopPages) {
		for _, p := range loop {
			b[p*PageSize]++
		}
	}
	for range 10 {
		pass(first)
	}
	// Protections last one to two generations of four budgets of
	// evictions: 1,600 to 3,200 pages, seven passes at most.
	const settle, measured = 16, 6
	for range settle {
		pass(second)
	}
	before, err := a.Stats()
	require.NoError(t, err)
	for range measured {
		pass(second)
	}
	after, err := a.Stats()
	require.NoError(t, err)
	for _, p := range first {
		require.Equal(t, byte(10), b[p*PageSize], "page %d", p)
	}
	for _, p := range second {
		require.Equal(t, byte(settle+measured), b[p*PageSize], "page %d", p)
	}
	got := float64(after.FaultsBy(CPU).Missing-before.FaultsBy(CPU).Missing) / measured
	min := minFaultsPerPass(t, second, settle+measured, PageSize, budget)
	rf := after.RefaultsOf(CPU)
	t.Logf("second loop: missing faults a pass %.1f, MIN's %.2f; %+v", got, min, rf)
	assert.LessOrEqual(t, got, 2*min, "faults a pass of the second loop, against twice MIN's")
	assert.Positive(t, rf.Unprotected, "no protection ended")
}

// TestRefaultCoreKeepsAHotSetThroughAScan: a scan, pages written once,
// is no loop: none of it comes back, so none of it is protected, and a
// hot set that does come back is kept through it, even by least
// recently moved blocks, which without the core lose it again and
// again.
func TestRefaultCoreKeepsAHotSetThroughAScan(t *testing.T) {
	for _, refault := range []bool{true, false} {
		t.Run(fmt.Sprintf("refault=%v", refault), func(t *testing.T) {
			hot, cold := hotEvictionsThroughAScan(t, "lru", false, refault)
			t.Logf("hot pages evicted %d; cold pages protected %d", hot, cold.Protected)
			assert.Zero(t, cold.Protected, "the scan's pages were protected")
			if refault {
				// Each hot block may be lost once, before it came
				// back and was protected.
				assert.LessOrEqual(t, hot, uint64(8*BlockSize/PageSize), "hot pages evicted")
			} else {
				assert.Greater(t, hot, uint64(8*BlockSize/PageSize), "lru should lose the hot blocks again and again")
			}
		})
	}
}
