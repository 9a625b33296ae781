package policy

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/softuvm/softuvm/internal/core"
)

// cacheSim plays a processor of a fixed capacity in pages under an
// eviction policy, as the server does: an access to a 64 KiB region that
// is resident is a hit the policy never hears of; a miss brings the
// region, after evicting what the policy names (its blocks whole, for a
// policy that chooses blocks).
type cacheSim struct {
	t        *testing.T
	ev       Eviction
	capacity int
	blocks   []*Block
	resident map[*Block]*PageMask
	pages    int
	misses   int
}

func newCacheSim(t *testing.T, ev Eviction, capacity, nblocks int) *cacheSim {
	s := &cacheSim{t: t, ev: ev, capacity: capacity, resident: map[*Block]*PageMask{}}
	for i := 0; i < nblocks; i++ {
		s.blocks = append(s.blocks, NewBlock(1, uintptr(i)*core.BlockSize, core.PagesPerBlock, i))
	}
	return s
}

func regionMask(r int) PageMask {
	var m PageMask
	m.FillRange(r*RegionPages, (r+1)*RegionPages)
	return m
}

// access touches region r (counted across blocks) of the simulated memory.
func (s *cacheSim) access(region int) {
	b := s.blocks[region/regionsPerBlock]
	m := regionMask(region % regionsPerBlock)
	have := s.resident[b]
	if have != nil {
		x := m
		x.And(have)
		if x.Count() == RegionPages {
			return
		}
	}
	s.misses++
	for s.pages+RegionPages > s.capacity {
		s.evict(RegionPages - (s.capacity - s.pages))
	}
	if have == nil {
		have = &PageMask{}
		s.resident[b] = have
	}
	have.Or(&m)
	s.pages += RegionPages
	if pe, ok := s.ev.(PageEviction); ok {
		pe.ArrivedPages(b, core.CPU, m, CauseFault)
	} else {
		s.ev.Arrived(b, core.CPU, RegionPages, CauseFault)
	}
}

func (s *cacheSim) evict(want int) {
	if pe, ok := s.ev.(PageEviction); ok {
		victims := pe.VictimPages(core.CPU, want, nil)
		require.NotEmpty(s.t, victims, "nothing to evict with %d pages resident", s.pages)
		for _, v := range victims {
			have := s.resident[v.Block]
			require.NotNil(s.t, have, "a victim that never arrived")
			x := v.Pages
			x.And(have)
			require.Equal(s.t, v.Pages, x, "victim pages that are not resident")
			have.AndNot(&x)
			s.pages -= x.Count()
			pe.LeftPages(v.Block, core.CPU, x)
			if have.Empty() {
				delete(s.resident, v.Block)
				pe.Left(v.Block, core.CPU)
			}
		}
		return
	}
	victims := s.ev.Victims(core.CPU, 1, nil)
	require.NotEmpty(s.t, victims)
	s.pages -= s.resident[victims[0]].Count()
	delete(s.resident, victims[0])
	s.ev.Left(victims[0], core.CPU)
}

// TestTwoQLoop: a loop over three times what fits. Least recently
// migrated blocks miss on every access of every pass; 2Q keeps a
// protected part that hits on each pass after the first two.
func TestTwoQLoop(t *testing.T) {
	const capacity = 4 * core.PagesPerBlock // 8 MiB
	const regions = 3 * capacity / RegionPages
	misses := map[string]int{}
	for _, ev := range []Eviction{NewLRU(), NewTwoQ()} {
		s := newCacheSim(t, ev, capacity, regions/regionsPerBlock)
		for pass := 0; pass < 10; pass++ {
			for r := 0; r < regions; r++ {
				s.access(r)
			}
		}
		misses[ev.Name()] = s.misses
		assert.LessOrEqual(t, s.pages, capacity)
	}
	t.Logf("misses of %d accesses: %v", 10*regions, misses)
	assert.Equal(t, 10*regions, misses["lru"], "LRU misses every access of a loop larger than memory")
	// Passes 3..10 hit on the protected regions: at least half of what
	// fits, every pass.
	assert.Less(t, misses["2q"], 10*regions-8*(capacity/RegionPages)/2)
}

// TestTwoQScan: a working set used in a loop over more than fits, with a
// scan of ten times memory between passes. The scan's regions are
// brought once and leave first; the loop's regions, evicted and asked for
// again, are protected, and keep hitting after each scan. (A working set
// that fits and is used only in place raises no fault, so neither policy
// hears of its use: that takes access information, not arrivals.)
func TestTwoQScan(t *testing.T) {
	const capacity = 8 * core.PagesPerBlock
	const loop = 2 * capacity / RegionPages
	const scan = 10 * capacity / RegionPages
	misses := map[string]int{}
	for _, ev := range []Eviction{NewLRU(), NewTwoQ()} {
		s := newCacheSim(t, ev, capacity, (loop+scan)/regionsPerBlock+1)
		for round := 0; round < 6; round++ {
			for pass := 0; pass < 3; pass++ {
				for r := 0; r < loop; r++ {
					s.access(r)
				}
			}
			for r := loop; r < loop+scan; r++ {
				s.access(r)
			}
		}
		misses[ev.Name()] = s.misses
	}
	t.Logf("misses of %d accesses: %v", 6*(3*loop+scan), misses)
	assert.Equal(t, 6*(3*loop+scan), misses["lru"], "least recently migrated blocks miss on every access")
	// Every round after the first, the loop hits on the protected regions
	// (at least a quarter of memory) in each of its passes.
	assert.Less(t, misses["2q"], misses["lru"]-5*3*(capacity/RegionPages)/4)
}

// TestTwoQForgets: pages that leave are forgotten, whole blocks too, and
// a victim never names pages that did not arrive.
func TestTwoQForgets(t *testing.T) {
	q := NewTwoQ()
	a := NewBlock(1, 0, core.PagesPerBlock, nil)
	b := NewBlock(1, core.BlockSize, core.PagesPerBlock, nil)
	var m PageMask
	m.Set(3)
	m.Set(17)
	q.ArrivedPages(a, core.CPU, m, CauseFault)
	q.ArrivedPages(b, core.CPU, regionMask(31), CauseFault)
	v := q.VictimPages(core.CPU, 1, nil)
	require.Len(t, v, 1)
	assert.Equal(t, a, v[0].Block, "the oldest arrival first")
	var want PageMask
	want.Set(3)
	assert.Equal(t, want, v[0].Pages, "the region's resident pages, no more")
	q.LeftPages(a, core.CPU, m)
	q.Left(b, core.CPU)
	assert.Empty(t, q.VictimPages(core.CPU, 1000, nil), "nothing left to offer")
	assert.Empty(t, q.VictimPages(core.Device(0), 1000, nil), "a processor never heard of")
}
