package lab

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// lackeyOf writes a lackey trace of the given references: a page
// number, and whether it is a store.
func lackeyOf(refs []int, stores []bool) string {
	var b strings.Builder
	b.WriteString("==1== Lackey, an example Valgrind tool\n")
	for i, p := range refs {
		kind := "L"
		if stores != nil && stores[i] {
			kind = "S"
		}
		fmt.Fprintf(&b, "I  04016b0,3\n %s %x,8\n", kind, 0x10000000+p*PageSize+64)
	}
	b.WriteString("==1== \n")
	return b.String()
}

// lruMisses simulates LRU on a list, counting the misses but the first
// reference to each page.
func lruMisses(refs []int, capacity int) int64 {
	var stack []int // most recent last
	seen := map[int]bool{}
	var misses int64
	for _, p := range refs {
		if i := slices.Index(stack, p); i >= 0 {
			stack = slices.Delete(stack, i, i+1)
		} else {
			if seen[p] {
				misses++
			}
			if len(stack) == capacity {
				stack = stack[1:]
			}
		}
		seen[p] = true
		stack = append(stack, p)
	}
	return misses
}

// fewestMisses tries every choice of victim at every miss: the least
// misses (but the first references) any eviction can take.
func fewestMisses(refs []int, capacity int) int64 {
	var best int64 = 1 << 62
	var walk func(i int, resident []int, seen map[int]bool, misses int64)
	walk = func(i int, resident []int, seen map[int]bool, misses int64) {
		if misses >= best {
			return
		}
		if i == len(refs) {
			best = misses
			return
		}
		p := refs[i]
		if slices.Contains(resident, p) {
			walk(i+1, resident, seen, misses)
			return
		}
		add := int64(0)
		if seen[p] {
			add = 1
		}
		wasSeen := seen[p]
		seen[p] = true
		if len(resident) < capacity {
			walk(i+1, append(slices.Clone(resident), p), seen, misses+add)
		} else {
			for v := range resident {
				next := slices.Clone(resident)
				next[v] = p
				walk(i+1, next, seen, misses+add)
			}
		}
		seen[p] = wasSeen
	}
	walk(0, nil, map[int]bool{}, 0)
	return best
}

func TestBoundMatchesSimulationAndBruteForce(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 11))
	for trial := 0; trial < 300; trial++ {
		pages := 2 + rng.IntN(5)
		refs := make([]int, 4+rng.IntN(12))
		for i := range refs {
			refs[i] = rng.IntN(pages)
		}
		r, err := ReadLackey(strings.NewReader(lackeyOf(refs, nil)))
		require.NoError(t, err)
		g, err := r.Granules(nil, PageSize)
		require.NoError(t, err)
		distinct := map[int]bool{}
		for _, p := range refs {
			distinct[p] = true
		}
		require.Equal(t, int64(len(distinct))*PageSize, g.Footprint())
		for capacity := 1; capacity <= pages; capacity++ {
			m := g.Misses(capacity)
			require.Equal(t, int64(len(distinct)), m.Cold)
			require.Equal(t, lruMisses(refs, capacity), m.LRU, "LRU, refs %v capacity %d", refs, capacity)
			require.Equal(t, fewestMisses(refs, capacity), m.OPT, "MIN, refs %v capacity %d", refs, capacity)
		}
	}
}

func TestBoundLoop(t *testing.T) {
	// A loop over n pages with room for c < n: LRU misses every
	// reference after the first round; MIN, which keeps c-1 pages
	// through each miss and evicts the page just used, misses (n-c)/(n-1)
	// of them (checked against the brute force on short loops first).
	loop := func(n, rounds int) []int {
		var refs []int
		for round := 0; round < rounds; round++ {
			for p := 0; p < n; p++ {
				refs = append(refs, p)
			}
		}
		return refs
	}
	for _, nc := range [][2]int{{4, 2}, {5, 3}, {5, 2}} {
		n, c := nc[0], nc[1]
		refs := loop(n, 4)
		r, err := ReadLackey(strings.NewReader(lackeyOf(refs, nil)))
		require.NoError(t, err)
		g, err := r.Granules(nil, PageSize)
		require.NoError(t, err)
		after := float64(len(refs) - n)
		require.InDelta(t, after*float64(n-c)/float64(n-1), float64(fewestMisses(refs, c)), 1, "brute force, n %d c %d", n, c)
		require.Equal(t, fewestMisses(refs, c), g.Misses(c).OPT)
	}

	refs := loop(10, 50)
	stores := make([]bool, len(refs))
	for i, p := range refs {
		stores[i] = p%2 == 0
	}
	r, err := ReadLackey(strings.NewReader(lackeyOf(refs, stores)))
	require.NoError(t, err)
	require.Equal(t, int64(250), r.Stores)
	require.Equal(t, int64(250), r.Loads)
	g, err := r.Granules(nil, PageSize)
	require.NoError(t, err)
	m := g.Misses(4)
	require.Equal(t, int64(490), m.LRU)
	require.InDelta(t, 490.0*6/9, float64(m.OPT), 3, "the last round ends early: a few misses fewer")
	// Half the pages are written: about half of MIN's evictions (one per
	// miss, but for the last round's) write back.
	require.InDelta(t, float64(m.OPT)/2, float64(m.OPTWriteBacks), 0.1*float64(m.OPT))

	r, err = ReadLackey(strings.NewReader(lackeyOf(refs, nil)))
	require.NoError(t, err)
	g, err = r.Granules(nil, PageSize)
	require.NoError(t, err)
	require.Zero(t, g.Misses(4).OPTWriteBacks, "nothing was written")
}

// PageRefs makes the stream ReadLackey reads from the same references:
// the same pages in the same order, the same repeats collapsed, the same
// counts, and so the same misses.
func TestPageRefsMatchesLackey(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 5))
	refs := make([]int, 2000)
	stores := make([]bool, len(refs))
	for i := range refs {
		refs[i], stores[i] = rng.IntN(40), rng.IntN(3) == 0
	}
	refs[1], stores[1] = refs[0], false // a repeat to collapse
	fromLackey, err := ReadLackey(strings.NewReader(lackeyOf(refs, stores)))
	require.NoError(t, err)
	fromPages, err := PageRefs(func(yield func(uint64, bool) bool) {
		for i, p := range refs {
			// lackeyOf's addresses: 0x10000000 + p pages + 64 bytes.
			if !yield(0x10000+uint64(p), stores[i]) {
				return
			}
		}
	})
	require.NoError(t, err)
	require.Equal(t, fromLackey.pages, fromPages.pages)
	require.Equal(t, fromLackey.seq, fromPages.seq)
	require.Equal(t, fromLackey.Loads, fromPages.Loads)
	require.Equal(t, fromLackey.Stores, fromPages.Stores)
	require.Less(t, fromPages.References(), len(refs), "repeats collapsed")
	g, err := fromPages.Granules(nil, PageSize)
	require.NoError(t, err)
	for _, c := range []int{1, 10, 39, 40} {
		m := g.Misses(c)
		require.Equal(t, lruMisses(refs, c), m.LRU, "capacity %d", c)
	}
}

func TestBoundGranulesAndSpans(t *testing.T) {
	// Pages 0-15 are one 64 KiB granule, 16-31 another; page 40 lies
	// in the span excluded.
	refs := []int{0, 15, 16, 40, 1, 31, 40, 0}
	r, err := ReadLackey(strings.NewReader(lackeyOf(refs, nil)))
	require.NoError(t, err)
	base := uint64(0x10000000)
	g, err := r.Granules([]Span{{base + 40*PageSize, base + 41*PageSize}}, 16*PageSize)
	require.NoError(t, err)
	require.Equal(t, int64(2*16*PageSize), g.Footprint())
	// Granules referenced: A A B A B A, collapsed: A B A B A.
	require.Equal(t, 5, g.References())
	m := g.Misses(1)
	require.Equal(t, int64(3), m.LRU)
	require.Equal(t, int64(3), m.OPT)
	require.Equal(t, int64(0), g.Misses(2).LRU)

	_, err = r.Granules(nil, 3000)
	require.ErrorContains(t, err, "granule 3000 bytes")
}

func TestReadLackeyCrossingsAndErrors(t *testing.T) {
	// An 8-byte load at the last 4 bytes of a page references two pages;
	// a modify is a store.
	r, err := ReadLackey(strings.NewReader(" L 1ffc,8\n M 3000,4\n S 3004,4\nI  400000,2\n"))
	require.NoError(t, err)
	require.Equal(t, []uint64{1, 2, 3}, r.pages)
	require.Equal(t, []uint32{0, 1, 2 | storeBit}, r.seq)
	require.Equal(t, int64(1), r.Loads)
	require.Equal(t, int64(2), r.Stores)

	_, err = ReadLackey(strings.NewReader(" L zz,8\n"))
	require.ErrorContains(t, err, `line 1 "L zz,8": address`)
	_, err = ReadLackey(strings.NewReader(" S 1000\n"))
	require.ErrorContains(t, err, "want ADDR,SIZE")
}

func TestNotHeap(t *testing.T) {
	maps := `00400000-00401000 r-xp 00000000 fe:00 12 /usr/bin/prog
00401000-00402000 rw-p 00001000 fe:00 12 /usr/bin/prog
004ae000-004b6000 rw-p 00000000 00:00 0 
01000000-01100000 rw-p 00000000 00:00 0                          [heap]
05400000-06500000 rw-p 00000000 00:00 0 
06500000-06600000 rw-s 00000000 00:01 9 /memfd:x (deleted)
1ffefef000-1fff001000 rw-p 00000000 00:00 0 
7ffffcd99000-7ffffcdba000 rw-p 00000000 00:00 0                          [stack]
`
	spans, err := NotHeap([]byte(maps), 0x1fff000010)
	require.NoError(t, err)
	require.Equal(t, []Span{{0x400000, 0x401000}, {0x401000, 0x402000}, {0x6500000, 0x6600000}, {0x1ffefef000, 0x1fff001000}, {0x7ffffcd99000, 0x7ffffcdba000}}, spans,
		"files, the kernel's mappings and the main stack; not anonymous memory nor [heap]")
	_, err = NotHeap([]byte("zz rw-p 0 0 0\n"), 0)
	require.ErrorContains(t, err, "bad address range")
}
