package policy

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/softuvm/softuvm/internal/core"
)

// reuseBlocks makes n blocks for Reuse's tests.
func reuseBlocks(n int) []*Block {
	var out []*Block
	for i := 0; i < n; i++ {
		out = append(out, NewBlock(1, uintptr(i)*core.BlockSize, core.PagesPerBlock, i))
	}
	return out
}

func pagesMask(pages ...int) PageMask {
	var m PageMask
	for _, p := range pages {
		m.Set(p)
	}
	return m
}

// victimPages flattens victims to "block index/page" pairs, in order.
func victimPages(vs []Victim) [][2]int {
	var out [][2]int
	for _, v := range vs {
		for i := v.Pages.NextSet(0); i >= 0; i = v.Pages.NextSet(i + 1) {
			out = append(out, [2]int{v.Block.Owner().(int), i})
		}
	}
	return out
}

// TestReuseBookkeeping: arrivals and departures keep the page table, the
// list of pages that arrived once and the ghosts in step: the newest
// page that arrived once is offered first; a page offered and gone is a
// ghost, and on its return has the interval counted by hand, leaves the
// list of pages that arrived once and moves the rule to oldest first; a
// page that left unoffered (freed) leaves no ghost.
func TestReuseBookkeeping(t *testing.T) {
	r := NewReuse()
	bs := reuseBlocks(2)
	r.ArrivedPages(bs[0], CPU, pagesMask(0, 1, 2), CauseFault) // clock 1, 2, 3
	r.ArrivedPages(bs[1], CPU, pagesMask(7), CauseFault)       // clock 4
	s := r.procs[CPU]
	require.Len(t, s.pages, 4)
	assert.Equal(t, 4, s.once.Len())
	assert.EqualValues(t, 4, s.clock)

	// Newest first while nothing came back.
	got := victimPages(r.VictimPages(CPU, 2, nil))
	assert.Equal(t, [][2]int{{1, 7}, {0, 2}}, got)

	// Both leave: ghosts, remembered with their arrival.
	r.LeftPages(bs[1], CPU, pagesMask(7))
	r.LeftPages(bs[0], CPU, pagesMask(2))
	assert.Len(t, s.pages, 2)
	assert.Equal(t, 2, s.once.Len())
	require.Contains(t, s.ghosts, pageKey{bs[1], 7})
	assert.EqualValues(t, 4, s.ghosts[pageKey{bs[1], 7}].arrived)
	assert.True(t, s.ghosts[pageKey{bs[1], 7}].newest)
	assert.True(t, s.ghosts[pageKey{bs[1], 7}].once)

	// A page freed without an offer: no ghost.
	r.Left(bs[0], CPU)
	assert.Empty(t, s.pages)
	assert.Zero(t, s.once.Len())
	assert.NotContains(t, s.ghosts, pageKey{bs[0], 0})
	assert.Len(t, s.ghosts, 2)

	// 7 comes back at clock 5: interval 5-4 = 1, out of the list of
	// pages that arrived once, and its return leans the rule to oldest
	// first.
	r.ArrivedPages(bs[1], CPU, pagesMask(7), CauseFault)
	e := s.byKey[pageKey{bs[1], 7}]
	require.NotNil(t, e)
	assert.EqualValues(t, 1, e.interval)
	assert.Nil(t, e.elem)
	assert.NotContains(t, s.ghosts, pageKey{bs[1], 7})
	assert.Equal(t, -1, s.lean)

	// Oldest first now, among pages that arrived once; the page with an
	// interval comes after them.
	r.ArrivedPages(bs[0], CPU, pagesMask(10, 11), CauseFault) // clock 6, 7
	got = victimPages(r.VictimPages(CPU, 3, nil))
	assert.Equal(t, [][2]int{{0, 10}, {0, 11}, {1, 7}}, got)
}

// TestReuseOffersOthersNextCall: a page offered by the call before and
// still resident (its block busy, or the one being served) is not
// offered again at once, so that the server's next round finds others;
// the call after that may offer it again.
func TestReuseOffersOthersNextCall(t *testing.T) {
	r := NewReuse()
	bs := reuseBlocks(1)
	r.ArrivedPages(bs[0], CPU, pagesMask(0, 1, 2), CauseFault)
	assert.Equal(t, [][2]int{{0, 2}}, victimPages(r.VictimPages(CPU, 1, nil)))
	assert.Equal(t, [][2]int{{0, 1}}, victimPages(r.VictimPages(CPU, 1, nil)))
	assert.Equal(t, [][2]int{{0, 2}}, victimPages(r.VictimPages(CPU, 1, nil)))
	// Two pages of one block make one victim.
	vs := r.VictimPages(CPU, 2, nil)
	require.Len(t, vs, 1)
	assert.Equal(t, 2, vs[0].Pages.Count())
}

// TestReusePredictsLoops: pages of a loop that came back are judged by
// their predicted next use: the page that came back last is next needed
// furthest, and leaves before the loop's older pages.
func TestReusePredictsLoops(t *testing.T) {
	r := NewReuse()
	bs := reuseBlocks(1)
	s := r.proc(CPU)
	// Pages 0..7 arrive and leave after an offer each (ghosts), then come
	// back in order: each with interval 8.
	for i := 0; i < 8; i++ {
		r.ArrivedPages(bs[0], CPU, pagesMask(i), CauseFault)
	}
	for i := 0; i < 8; i++ {
		s.byKey[pageKey{bs[0], i}].offered = 1
		r.LeftPages(bs[0], CPU, pagesMask(i))
	}
	for i := 0; i < 8; i++ {
		r.ArrivedPages(bs[0], CPU, pagesMask(i), CauseFault)
		assert.EqualValues(t, 8, s.byKey[pageKey{bs[0], i}].interval)
	}
	assert.Zero(t, s.once.Len())
	// Page 7 arrived last (clock 16): next at 24, the furthest; page 0
	// (clock 9) at 17.
	assert.EqualValues(t, 24, s.next(s.byKey[pageKey{bs[0], 7}]))
	assert.EqualValues(t, 17, s.next(s.byKey[pageKey{bs[0], 0}]))
	// With 8 pages and 32 samples, the sample holds 7 (a miss has
	// chance (7/8)^32, under 1.4%, and the generator is seeded: the
	// test is repeatable).
	assert.Equal(t, [][2]int{{0, 7}}, victimPages(r.VictimPages(CPU, 1, nil)))
	// A page unused for 64 intervals is predicted never.
	s.clock += 64*8 + 1
	assert.EqualValues(t, uint64(1<<64-1), s.next(s.byKey[pageKey{bs[0], 0}]))
}

// TestReuseGhostsBounded: the ghosts are at most four times the resident
// pages, at least 1024, the oldest forgotten first.
func TestReuseGhostsBounded(t *testing.T) {
	r := NewReuse()
	bs := reuseBlocks(8)
	s := r.proc(CPU)
	for _, b := range bs {
		r.ArrivedPages(b, CPU, wholeBlock, CauseFault)
	}
	for _, b := range bs {
		for i := 0; i < core.PagesPerBlock; i++ {
			s.byKey[pageKey{b, i}].offered = 1
		}
		r.LeftPages(b, CPU, wholeBlock)
	}
	assert.Len(t, s.ghosts, 1024)
	assert.NotContains(t, s.ghosts, pageKey{bs[0], 0})
	assert.Contains(t, s.ghosts, pageKey{bs[7], 511})
	assert.LessOrEqual(t, len(s.ghostOrder), 2*1024+1)
}

// TestReuseArgument: reuse takes no argument.
func TestReuseArgument(t *testing.T) {
	ev, err := NewEviction("reuse")
	require.NoError(t, err)
	assert.Equal(t, "reuse", ev.Name())
	_, ok := ev.(PageEviction)
	assert.True(t, ok)
	_, err = NewEviction("reuse:3")
	assert.ErrorIs(t, err, core.ErrInvalidValue)
	assert.ErrorContains(t, err, `"reuse:3": reuse takes no argument`)
}
