package core

import (
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// model is the obvious implementation PageMask is checked against.
type model [PagesPerBlock]bool

func TestPageMaskAgainstModel(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for iter := 0; iter < 2000; iter++ {
		var m model
		for i := range m {
			m[i] = rng.IntN(4) == 0
		}
		if iter%5 == 0 { // sparse, or empty: a few pages in a few words
			for i := range m {
				m[i] = rng.IntN(300) == 0
			}
		}
		if iter%7 == 0 { // long runs, across word boundaries
			lo := rng.IntN(PagesPerBlock)
			hi := lo + rng.IntN(PagesPerBlock-lo+1)
			for i := lo; i < hi; i++ {
				m[i] = true
			}
		}
		pm := m.mask()
		lo := rng.IntN(PagesPerBlock + 1)
		hi := lo + rng.IntN(PagesPerBlock-lo+1)

		want := 0
		for i := lo; i < hi; i++ {
			if m[i] {
				want++
			}
		}
		require.Equal(t, want, pm.CountRange(lo, hi), "CountRange(%d, %d)", lo, hi)

		next := -1
		for i := lo; i < PagesPerBlock; i++ {
			if m[i] {
				next = i
				break
			}
		}
		require.Equal(t, next, pm.NextSet(lo), "NextSet(%d)", lo)

		last := -1
		for i := PagesPerBlock - 1; i >= 0; i-- {
			if m[i] {
				last = i
				break
			}
		}
		require.Equal(t, last, pm.LastSet(), "LastSet")

		first, outer := pm.NextRun(lo)
		if next < 0 {
			require.Equal(t, -1, first)
		} else {
			end := next
			for end < PagesPerBlock && m[end] {
				end++
			}
			require.Equal(t, [2]int{next, end}, [2]int{first, outer}, "NextRun(%d)", lo)
		}

		filled := pm
		filled.FillRange(lo, hi)
		for i := 0; i < PagesPerBlock; i++ {
			require.Equal(t, m[i] || (i >= lo && i < hi), filled.Test(i), "FillRange(%d, %d) page %d", lo, hi, i)
		}
		trimmed := pm
		trimmed.TrimTo(hi)
		require.Equal(t, pm.CountRange(0, hi), trimmed.Count())
	}
}

func TestPageMaskBasics(t *testing.T) {
	var m PageMask
	assert.True(t, m.Empty())
	m.Set(0)
	m.Set(63)
	m.Set(64)
	m.Set(511)
	assert.Equal(t, 4, m.Count())
	assert.False(t, m.Empty())
	m.Clear(63)
	assert.False(t, m.Test(63))
	var o PageMask
	o.FillRange(0, 65)
	x := m
	x.And(&o)
	assert.Equal(t, 2, x.Count())
	x = m
	x.AndNot(&o)
	assert.Equal(t, 1, x.Count())
	assert.True(t, x.Test(511))
	x.Or(&o)
	assert.Equal(t, 66, x.Count())
}

func (m *model) mask() (pm PageMask) {
	for i, v := range m {
		if v {
			pm.Set(i)
		}
	}
	return pm
}

func TestLowestAndPagesOverBudget(t *testing.T) {
	var m PageMask
	m.Set(3)
	m.Set(64)
	m.Set(200)
	got := m.Lowest(2)
	assert.Equal(t, 2, got.Count())
	assert.True(t, got.Test(3) && got.Test(64) && !got.Test(200))
	assert.Equal(t, m, m.Lowest(5), "fewer than asked: all of them")
	none := m.Lowest(0)
	assert.True(t, none.Empty())

	assert.Equal(t, int64(0), PagesOverBudget(100, 0), "no budget")
	assert.Equal(t, int64(0), PagesOverBudget(10, 10*PageSize), "at the budget")
	assert.Equal(t, int64(1), PagesOverBudget(10, 10*PageSize-1), "a byte over is a page")
	assert.Equal(t, int64(3), PagesOverBudget(13, 10*PageSize))
}
