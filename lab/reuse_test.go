package lab

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestReuseKeepsHotSetThroughScans: a program that uses a hot set of 32
// pages, scans 1024 pages it never uses again (four times, each time
// fresh ones), and uses the hot set after each scan, under a budget of
// 256 pages. lru loses the hot set to every scan (the brute-force LRU's
// count, 32 faults a scan more than the least); reuse keeps it, and takes
// Belady's faults: each page's first touch and no more.
func TestReuseKeepsHotSetThroughScans(t *testing.T) {
	const hot, scan, rounds, budget = 32, 1024, 4, 256
	refs, blocks := hotSetThroughScans(hot, scan, rounds)
	h, events := pageTrace(refs, nil, blocks, budget)

	minFaults, _, _ := bruteMIN(refs, budget)
	lruFaults, _, _ := bruteLRU(refs, budget)
	require.Equal(t, hot+rounds*scan, minFaults, "Belady: every page's first touch")
	require.Equal(t, hot+rounds*scan+rounds*hot, lruFaults, "LRU: the hot set again after every scan")

	lru, err := ReplayEvents(h, events, Config{Eviction: "lru"})
	require.NoError(t, err)
	reuse, err := ReplayEvents(h, events, Config{Eviction: "reuse"})
	require.NoError(t, err)
	assert.EqualValues(t, lruFaults, lru.Replayed.Faults, "lru")
	assert.EqualValues(t, minFaults, reuse.Replayed.Faults, "reuse")
	assert.LessOrEqual(t, reuse.Replayed.EvictedPages, uint64(rounds*scan+hot-budget))
}

// TestReuseLoopNearMIN: a loop over 128 pages of each of 3 blocks,
// eight times, under a budget of 256 pages: lru faults on every touch;
// reuse, which evicts the newest of other blocks' pages, keeps much of
// the loop: at most 1.6 times Belady's faults (the brute force's count),
// where LRU takes 2.4 times. (The pages it keeps are used in place, so
// they look to it like pages that arrived once, which leave before pages
// that came back: on the next pass it gives some of them up, where MIN
// would not.) (A loop inside one block is another matter: the block being
// served is never its own victim, and the engine's last resort takes its
// oldest pages, as LRU does.)
func TestReuseLoopNearMIN(t *testing.T) {
	const perBlock, blocks, passes, budget = 128, 3, 8, 256
	var refs []int
	for p := 0; p < passes; p++ {
		for b := 0; b < blocks; b++ {
			for i := 0; i < perBlock; i++ {
				refs = append(refs, b*pagesPerBlock+i)
			}
		}
	}
	h, events := pageTrace(refs, nil, blocks, budget)
	minFaults, _, _ := bruteMIN(refs, budget)
	lruFaults, _, _ := bruteLRU(refs, budget)
	require.Equal(t, perBlock*blocks*passes, lruFaults, "LRU misses every touch of a loop larger than memory")

	reuse, err := ReplayEvents(h, events, Config{Eviction: "reuse"})
	require.NoError(t, err)
	t.Logf("loop of %d pages under %d, %d passes: reuse %d faults, MIN %d, LRU %d", perBlock*blocks, budget, passes, reuse.Replayed.Faults, minFaults, lruFaults)
	assert.LessOrEqual(t, float64(reuse.Replayed.Faults), 1.6*float64(minFaults))
}

// hotSetThroughScans is the page references of a program that uses a
// hot set (pages 0 to hot-1), then scans scan pages it never uses again
// (in blocks of their own, fresh each round), rounds times, and uses the
// hot set once more at the end; and the blocks they span.
func hotSetThroughScans(hot, scan, rounds int) (refs []int, blocks int) {
	perScan := (scan + pagesPerBlock - 1) / pagesPerBlock
	for r := 0; r < rounds; r++ {
		for p := 0; p < hot; p++ {
			refs = append(refs, p)
		}
		first := pagesPerBlock * (1 + perScan*r)
		for p := first; p < first+scan; p++ {
			refs = append(refs, p)
		}
	}
	for p := 0; p < hot; p++ {
		refs = append(refs, p)
	}
	return refs, 1 + perScan*rounds
}
