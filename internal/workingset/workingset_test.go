package workingset

import (
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/softuvm/softuvm/internal/core"
)

const locations = 2 // the host (slot 0) and one device

func pages(list ...int) core.PageMask {
	var m core.PageMask
	for _, p := range list {
		m.Set(p)
	}
	return m
}

func span(first, outer int) core.PageMask {
	var m core.PageMask
	m.FillRange(first, outer)
	return m
}

// TestRefaultDistance: a page's distance is the pages the processor
// evicted after it, counted from its own eviction, whichever blocks
// they were of; recent is at most Limits.Recent.
func TestRefaultDistance(t *testing.T) {
	s := NewSet[int](locations)
	s.SetLimits(0, Limits{Capacity: 100, Recent: 10, Protect: 90, Age: 1000})
	var a, b Block
	s.Evicted(&a, 0, locations, pages(1, 2))    // clock 0 -> 2
	s.Evicted(&b, 0, locations, span(0, 7))     // -> 9
	s.Evicted(&a, 0, locations, pages(3))       // -> 10
	s.Evicted(&b, 0, locations, span(100, 105)) // -> 15
	require.EqualValues(t, 15, s.Evictions(0))

	// Pages 1 and 2 left first: 13 evictions since (7 + 1 + 5).
	rf := s.Arrived(&a, 0, locations, pages(1, 3, 4))
	assert.Equal(t, pages(3), rf.Recent, "page 3: 5 evictions since")
	assert.Equal(t, pages(1), rf.Far, "page 1: 13 since, over 10")
	assert.EqualValues(t, 5, rf.Distance)
	// Its stamp is gone: back again, it is no refault.
	rf = s.Arrived(&a, 0, locations, pages(1, 3))
	assert.True(t, rf.Recent.Empty() && rf.Far.Empty())
	// A departure other than by eviction forgets the stamp too.
	s.Left(&a, 0, pages(2))
	rf = s.Arrived(&a, 0, locations, pages(2))
	assert.True(t, rf.Recent.Empty() && rf.Far.Empty(), "page 2 left by a move since its eviction")
	// Each processor counts its own.
	assert.Zero(t, s.Evictions(1))
	rf = s.Arrived(&b, 1, locations, span(0, 7))
	assert.True(t, rf.Recent.Empty() && rf.Far.Empty(), "evicted from the host, not from the device")
	rf = s.Arrived(&b, 0, locations, span(0, 8))
	assert.Equal(t, span(0, 7), rf.Recent, "6 evictions since; page 7 was never evicted")
	assert.EqualValues(t, 6, rf.Distance)
}

// TestProtectionLimitsAndAge: protected pages count against the limit
// until they leave, are evicted, or their generation's successor ends;
// then Due names their block and Release returns them.
func TestProtectionLimitsAndAge(t *testing.T) {
	s := NewSet[string](locations)
	s.SetLimits(0, Limits{Capacity: 64, Recent: 64, Protect: 40, Age: 100})
	var a, b Block
	assert.EqualValues(t, 40, s.Room(0))
	s.Protect(&a, "a", 0, locations, span(0, 16))
	s.Protect(&b, "b", 0, locations, span(0, 8))
	assert.EqualValues(t, 24, s.ProtectedPages(0))
	assert.EqualValues(t, 16, s.Room(0))
	assert.Equal(t, span(0, 16), s.Protected(&a, 0))
	assert.Equal(t, span(0, 16), s.Hidden(&a, 0))

	// A move away ends their protection, and says which were hidden.
	hidden := s.Left(&a, 0, span(8, 24))
	assert.Equal(t, span(8, 16), hidden)
	assert.EqualValues(t, 16, s.ProtectedPages(0))
	// An eviction of a protected page (a demotion) does too.
	s.Evicted(&b, 0, locations, pages(0))
	assert.EqualValues(t, 15, s.ProtectedPages(0))
	assert.Equal(t, span(1, 8), s.Protected(&b, 0))

	// 99 evictions: still generation 0.
	var c Block
	s.Evicted(&c, 0, locations, span(0, 98))
	assert.EqualValues(t, 99, s.Evictions(0))
	assert.Empty(t, s.Due(0, nil))
	// Generation 1 begins: generation 0's pages stay protected.
	s.Evicted(&c, 0, locations, pages(200))
	assert.Empty(t, s.Due(0, nil))
	assert.EqualValues(t, 15, s.ProtectedPages(0))
	s.Protect(&c, "c", 0, locations, pages(300))
	assert.EqualValues(t, 16, s.ProtectedPages(0))
	assert.Equal(t, []string{"a", "b", "c"}, s.Oldest(0, nil), "the oldest generation's blocks first")

	// Generation 2 begins: generation 0's protections end, generation
	// 1's stay.
	s.Evicted(&c, 0, locations, span(0, 100))
	assert.EqualValues(t, 1, s.ProtectedPages(0))
	due := s.Due(0, nil)
	assert.ElementsMatch(t, []string{"a", "b"}, due)
	assert.Empty(t, s.Due(0, nil), "Due forgets what it returned")
	assert.True(t, ptr(s.Protected(&a, 0)).Empty())
	assert.Equal(t, span(0, 8), s.Hidden(&a, 0), "ended, not yet released")
	assert.Equal(t, span(0, 8), s.Release(&a, 0))
	assert.True(t, ptr(s.Hidden(&a, 0)).Empty())
	assert.True(t, ptr(s.Release(&a, 0)).Empty())
	// A busy block goes back on the list.
	s.Requeue(0, []string{"b"})
	assert.Equal(t, []string{"b"}, s.Due(0, nil))
	assert.Equal(t, span(1, 8), s.Release(&b, 0))
	assert.Equal(t, pages(300), s.Protected(&c, 0))
	// Leaving after the end costs the count nothing more.
	s.Left(&b, 0, span(0, 8))
	assert.EqualValues(t, 1, s.ProtectedPages(0))

	// A processor without limits protects nothing.
	assert.Zero(t, s.Room(1))
	_, ok := s.Limits(1)
	assert.False(t, ok)
}

// TestOldestPages: a block's pages in the order they arrived, whatever
// their addresses.
func TestOldestPages(t *testing.T) {
	s := NewSet[int](locations)
	s.SetLimits(0, Limits{Capacity: 64, Recent: 64, Protect: 40, Age: 100})
	var a Block
	s.Arrived(&a, 0, locations, pages(40, 41))
	s.Arrived(&a, 0, locations, pages(3))
	s.Arrived(&a, 0, locations, pages(90))
	s.Arrived(&a, 0, locations, pages(1))
	all := pages(1, 3, 40, 41, 90)
	assert.Equal(t, pages(40, 41), s.OldestPages(&a, 0, all, 2))
	assert.Equal(t, pages(40, 41, 3), s.OldestPages(&a, 0, all, 3))
	assert.Equal(t, pages(3), s.OldestPages(&a, 0, pages(1, 3), 1))
	assert.Equal(t, all, s.OldestPages(&a, 0, all, 9))
}

// TestProtectedCountMatchesBlocks: under random protections, moves,
// evictions and releases over many blocks, the processor's count of
// protected pages is always the sum of what its blocks protect.
func TestProtectedCountMatchesBlocks(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	s := NewSet[int](locations)
	s.SetLimits(0, Limits{Capacity: 4096, Recent: 4096, Protect: 3000, Age: 700})
	blocks := make([]Block, 12)
	for step := 0; step < 20000; step++ {
		i := rng.IntN(len(blocks))
		b := &blocks[i]
		first := rng.IntN(core.PagesPerBlock)
		m := span(first, min(core.PagesPerBlock, first+1+rng.IntN(40)))
		switch rng.IntN(5) {
		case 0:
			m.AndNot(ptr(s.Protected(b, 0)))
			if int64(m.Count()) <= s.Room(0) {
				s.Protect(b, i, 0, locations, m)
			}
		case 1:
			s.Left(b, 0, m)
		case 2:
			s.Evicted(b, 0, locations, m)
		case 3:
			for _, j := range s.Due(0, nil) {
				s.Release(&blocks[j], 0)
			}
		case 4:
			s.Arrived(b, 0, locations, m)
		}
		var sum int64
		for j := range blocks {
			sum += int64(ptr(s.Protected(&blocks[j], 0)).Count())
		}
		require.Equal(t, sum, s.ProtectedPages(0), "step %d", step)
		require.LessOrEqual(t, sum, int64(3000))
	}
}

func ptr(m core.PageMask) *core.PageMask { return &m }
