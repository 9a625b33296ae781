package block

import (
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/softuvm/softuvm/internal/core"
)

// sweepHarness is a range of four blocks with sweep state for the host
// and one device, and a fault function that says whether a fault at a
// page of the range (of the range, not the block) is taken for a sweep
// and then notes that it brought pages [page, page+brought).
type sweepHarness struct {
	r *Range
}

func newSweepHarness() sweepHarness {
	const start = 0x7f0000000000
	return sweepHarness{r: &Range{Start: start, Length: 4 * core.BlockSize, sweeps: make([]sweepState, 2)}}
}

func (h sweepHarness) fault(m core.Device, page, brought int) bool {
	bi := page / core.PagesPerBlock
	o := &Mover{R: h.r, B: &Block{Pages: core.PagesPerBlock}, BlockAddr: h.r.Start + uintptr(bi)*core.BlockSize}
	p := page % core.PagesPerBlock
	sweep, _ := o.sweep(m, p, false)
	var pages core.PageMask
	pages.FillRange(p, min(p+brought, core.PagesPerBlock))
	o.noteFetch(m, pages)
	return sweep
}

// Pages are told from fault to fault: what the policy decides does not
// matter here, only where the faults land against what the last one
// brought.
func TestSweepNeedsThreeFaultsInARowOneWay(t *testing.T) {
	h := newSweepHarness()
	// Ascending, a page at a time: the third fault past the first is
	// the sweep.
	var got []bool
	for page := 100; page < 106; page++ {
		got = append(got, h.fault(core.CPU, page, 1))
	}
	assert.Equal(t, []bool{false, false, false, true, true, true}, got)

	// A fault far away ends it; so does one inside what the last brought.
	assert.False(t, h.fault(core.CPU, 1500, 1), "a jump of 1,394 pages")
	for page := 1501; page < 1504; page++ {
		h.fault(core.CPU, page, 1)
	}
	assert.True(t, h.fault(core.CPU, 1504, 16))
	assert.False(t, h.fault(core.CPU, 1510, 1), "inside the pages the last fault brought")

	// Descending, a big page at a time.
	var down []bool
	for page := 1200; page > 1100; page -= 16 {
		down = append(down, h.fault(core.CPU, page, 1))
	}
	assert.Equal(t, []bool{false, false, false, true, true, true, true}, down)
	// Turning back is not a sweep on: the count starts again.
	assert.False(t, h.fault(core.CPU, 1120, 1), "turned back from 1104 to 1120")
}

// A whole block brought puts the next fault of a sweep at the next block,
// 512 pages past the fault before: still just past what it brought.
func TestSweepCountsFromWhatTheFaultBrought(t *testing.T) {
	h := newSweepHarness()
	h.fault(core.CPU, 0, 16)
	h.fault(core.CPU, 16, 16)
	h.fault(core.CPU, 32, 16)
	assert.True(t, h.fault(core.CPU, 48, 464), "the third big page in a row past the first, bringing the rest of block 0")
	assert.True(t, h.fault(core.CPU, 512, 512), "the next block's first page lies just past block 0")
	assert.True(t, h.fault(core.CPU, 1024+40, 512), "40 pages past block 1: within four big pages")
	assert.False(t, h.fault(core.CPU, 1536+100, 1), "100 pages past block 2: too far")
}

// Locations sweep apart: a device's faults do not break the host's run.
func TestSweepIsPerLocation(t *testing.T) {
	h := newSweepHarness()
	for page := 0; page < 3; page++ {
		h.fault(core.CPU, page, 1)
		h.fault(0, 1000-page, 1)
	}
	assert.True(t, h.fault(core.CPU, 3, 1))
	assert.True(t, h.fault(0, 997, 1))
}

// Random faults over a range seldom look like a sweep: fewer than one
// in a hundred, where one in twenty lands within four big pages of the
// one before.
func TestSweepIsRareUnderRandomFaults(t *testing.T) {
	h := newSweepHarness()
	// A fixed pseudo-random walk (a linear congruential generator), so
	// the figure is the same every run.
	x := uint32(12345)
	sweeps, faults := 0, 20000
	for range faults {
		x = x*1664525 + 1013904223
		if h.fault(core.CPU, int(x>>16)%(4*core.PagesPerBlock), 1) {
			sweeps++
		}
	}
	assert.Less(t, sweeps, faults/100, "random faults taken for a sweep")
}
