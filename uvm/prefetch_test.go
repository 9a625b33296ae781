package uvm

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/softuvm/softuvm/internal/core"
	"github.com/softuvm/softuvm/policy"
)

// touchSequentially simulates a processor touching every page of a block
// in order under policy p, and returns the pages that faulted: those not
// yet brought by an earlier fault.
func touchSequentially(p policy.PrefetchPolicy, pages int) []int {
	var resident core.PageMask
	var faults []int
	for page := 0; page < pages; page++ {
		if resident.Test(page) {
			continue
		}
		faults = append(faults, page)
		c := policy.PrefetchContext{Pages: pages, ResidentOnDest: resident, Populated: !resident.Empty()}
		c.Faulted.Set(page)
		extra := p.Expand(&c)
		extra.TrimTo(pages)
		resident.Or(&extra)
		resident.Set(page)
	}
	return faults
}

// TestDensitySequential: a sequential first touch of a 2 MiB block faults
// on the first page of each region the tree doubles into: 16 pages (the
// big page), then 16, 32, 64, 128, 256.
func TestDensitySequential(t *testing.T) {
	faults := touchSequentially(policy.DensityPrefetch{Threshold: 51}, core.PagesPerBlock)
	assert.Equal(t, []int{0, 16, 32, 64, 128, 256}, faults)
}

func TestDensityFirstFaultIsBigPage(t *testing.T) {
	d := policy.DensityPrefetch{Threshold: 51}
	c := policy.PrefetchContext{Pages: core.PagesPerBlock}
	c.Faulted.Set(37)
	got := d.Expand(&c)
	var want core.PageMask
	want.FillRange(32, 48)
	assert.Equal(t, want, got, "a lone fault brings its 64 KiB big page")
}

func TestDensityThreshold(t *testing.T) {
	// Half of the first 64 pages resident: 32 + the faulted big page's
	// 16 = 48 of 64 > 51%: the whole 64-page subtree comes.
	c := policy.PrefetchContext{Pages: core.PagesPerBlock, Populated: true}
	c.ResidentOnDest.FillRange(0, 32)
	c.Faulted.Set(40)
	got := policy.DensityPrefetch{Threshold: 51}.Expand(&c)
	assert.Equal(t, 64, got.CountRange(0, 64))
	assert.Equal(t, 64, got.Count())
	// With a threshold of 80 the 64-page subtree (75%) does not qualify
	// but the 32-page one holding page 40 ([32,64): 16 of 32 = 50%) does
	// not either: only the big page comes.
	got = policy.DensityPrefetch{Threshold: 80}.Expand(&c)
	assert.Equal(t, 16, got.Count())
}

func TestDensityPreferredFirstTouchFillsBlock(t *testing.T) {
	c := policy.PrefetchContext{Pages: 300, DestIsPreferred: true}
	c.Faulted.Set(5)
	got := policy.DensityPrefetch{Threshold: 51}.Expand(&c)
	assert.Equal(t, 300, got.Count())
}

func TestDensityShortBlockClamps(t *testing.T) {
	// A block of 20 pages: the first big page makes 16 of its 20 pages
	// (the subtree clamped to the real pages) dense, so one fault brings
	// all 20, and nothing past them.
	faults := touchSequentially(policy.DensityPrefetch{Threshold: 51}, 20)
	assert.Equal(t, []int{0}, faults)
	c := policy.PrefetchContext{Pages: 20}
	c.Faulted.Set(19)
	got := policy.DensityPrefetch{Threshold: 51}.Expand(&c)
	assert.Equal(t, -1, got.NextSet(20))
}

func TestDensityRespectsThrashing(t *testing.T) {
	c := policy.PrefetchContext{Pages: core.PagesPerBlock}
	c.Faulted.Set(3)
	c.Thrashing.Set(5)
	got := policy.DensityPrefetch{Threshold: 51}.Expand(&c)
	assert.True(t, got.Empty() || !got.Test(5), "thrashing pages are never prefetched")
	assert.Equal(t, 0, got.CountRange(0, 16)-got.CountRange(3, 4), "a big page with a thrashing page is not grown")
}

func TestDensitySourceLargeBringsBlockInASweepUnlessThrashing(t *testing.T) {
	c := policy.PrefetchContext{Pages: core.PagesPerBlock, Populated: true, SourceLarge: true, Sweep: true}
	c.Faulted.Set(37)
	got := policy.DensityPrefetch{Threshold: 51}.Expand(&c)
	assert.Equal(t, core.PagesPerBlock, got.Count(), "a sweep's fault into a block in one large folio elsewhere brings all of it")
	c.Thrashing.Set(300)
	got = policy.DensityPrefetch{Threshold: 51}.Expand(&c)
	assert.Equal(t, 16, got.Count(), "a thrashing block moves as NVIDIA's would: the big page")
	c.Thrashing = core.PageMask{}
	none := policy.NoPrefetch{}.Expand(&c)
	assert.True(t, none.Empty(), "none still moves the faulted page alone")
	c.Sweep = false
	got = policy.DensityPrefetch{Threshold: 51}.Expand(&c)
	assert.Equal(t, 16, got.Count(), "out of a sweep, a block in one large folio elsewhere gives its big page")
	c.Faulted = core.PageMask{}
	c.Faulted.Set(0)
	got = policy.DensityPrefetch{Threshold: 51}.Expand(&c)
	assert.Equal(t, core.PagesPerBlock, got.Count(), "a fault on the block's first page, where a sweep enters it, brings all of it")
}

// On a full processor, out of a sweep, a fault brings no page that has a
// copy elsewhere beyond the faulted ones (each would push a page out),
// and still brings pages resident nowhere (a zero fill); in a sweep it
// brings what it would anyway.
func TestDensityOnAFullProcessorCopiesOnlyTheFaultedPages(t *testing.T) {
	c := policy.PrefetchContext{Pages: core.PagesPerBlock, Populated: true, Full: true}
	c.ResidentOnDest.FillRange(0, 260) // with the faulted big page, 54%: the whole block would come
	c.Elsewhere.FillRange(260, 400)    // on a device; 400 to 511 never touched
	c.Faulted.Set(300)
	got := policy.DensityPrefetch{Threshold: 51}.Expand(&c)
	var want core.PageMask
	want.FillRange(0, 260) // resident already: bringing them is nothing
	want.FillRange(400, core.PagesPerBlock)
	assert.Equal(t, want, got)

	c.Sweep = true
	got = policy.DensityPrefetch{Threshold: 51}.Expand(&c)
	assert.Equal(t, core.PagesPerBlock, got.Count(), "a sweep still brings the dense block")
	c.Sweep, c.Full = false, false
	got = policy.DensityPrefetch{Threshold: 51}.Expand(&c)
	assert.Equal(t, core.PagesPerBlock, got.Count(), "with room to spare, the dense block comes")
}

// On a full processor a sweep must be dense: each fault on the page just
// after what the last brought; with room to spare, within four big pages.
func TestSweepStepOnAFullProcessorWantsTheNextPage(t *testing.T) {
	walk := func(stride int64, full bool) []bool {
		var got []bool
		var run int32
		lo, hi := int64(-1), int64(-1)
		for page := int64(1000); page < 1000+6*stride; page += stride {
			var sweeping bool
			run, sweeping = policy.SweepStep(lo, hi, run, page, full)
			got = append(got, sweeping)
			lo, hi = page, page // each fault brought its page alone
		}
		return got
	}
	sweep := []bool{false, false, false, true, true, true}
	none := []bool{false, false, false, false, false, false}
	assert.Equal(t, sweep, walk(1, true), "page after page, full")
	assert.Equal(t, none, walk(5, true), "a stride of five pages is no sweep when full")
	assert.Equal(t, sweep, walk(5, false), "but is one with room to spare")
	assert.Equal(t, none, walk(policy.SweepWindow+1, false), "past the window it never is")
}

func TestWindowAndNone(t *testing.T) {
	assert.Len(t, touchSequentially(policy.NoPrefetch{}, 64), 64)
	assert.Equal(t, []int{0, 9, 18, 27}, touchSequentially(policy.WindowPrefetch{Pages: 8}, 32))
	c := policy.PrefetchContext{Pages: 10}
	c.Faulted.Set(8)
	got := policy.WindowPrefetch{Pages: 8}.Expand(&c)
	assert.Equal(t, 1, got.Count(), "the window stops at the block's end")
}

func TestParsePrefetchSpec(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want PrefetchSpec
	}{
		{"density", PrefetchSpec{Policy: "density", Threshold: 51}},
		{"", PrefetchSpec{Policy: "density", Threshold: 51}},
		{"density:75", PrefetchSpec{Policy: "density", Threshold: 75}},
		{"window:16", PrefetchSpec{Policy: "window", Window: 16}},
		{"none", PrefetchSpec{Policy: "none"}},
	} {
		got, err := ParsePrefetchSpec(tc.in)
		require.NoError(t, err, tc.in)
		assert.Equal(t, tc.want, got, tc.in)
		p, err := policy.NewPrefetchPolicy(got)
		require.NoError(t, err)
		assert.Equal(t, got.String(), p.Name())
	}
	for _, bad := range []string{"density:0", "density:101", "density:x", "window", "window:0", "window:513", "none:1", "psychic"} {
		_, err := ParsePrefetchSpec(bad)
		require.Error(t, err, bad)
		assert.ErrorIs(t, err, ErrInvalidValue)
		assert.Contains(t, err.Error(), bad, "the error names the value")
	}
}

type everyOther struct{}

func TestRegisterPrefetchPolicy(t *testing.T) {
	require.NoError(t, policy.RegisterPrefetchPolicy("every-other", func(arg string) (policy.PrefetchPolicy, error) { return everyOther{}, nil }))
	require.Error(t, policy.RegisterPrefetchPolicy("every-other", nil), "twice")
	require.Error(t, policy.RegisterPrefetchPolicy("density", nil), "reserved")
	require.Error(t, policy.RegisterPrefetchPolicy("a:b", nil), "colon")
	spec, err := ParsePrefetchSpec("every-other")
	require.NoError(t, err)
	p, err := policy.NewPrefetchPolicy(spec)
	require.NoError(t, err)
	assert.Equal(t, "every-other", p.Name())
	assert.Contains(t, policy.PrefetchPolicyNames(), "every-other")
}

func BenchmarkDensityExpand(b *testing.B) {
	d := policy.DensityPrefetch{Threshold: 51}
	c := policy.PrefetchContext{Pages: core.PagesPerBlock, Populated: true}
	c.ResidentOnDest.FillRange(0, 200)
	c.Faulted.Set(200)
	b.ReportAllocs()
	for b.Loop() {
		d.Expand(&c)
	}
}

func (everyOther) Name() string { return "every-other" }

func (everyOther) Expand(c *policy.PrefetchContext) (m core.PageMask) {
	for p := c.Faulted.NextSet(0); p >= 0; p = c.Faulted.NextSet(p + 1) {
		if p+2 < c.Pages {
			m.Set(p + 2)
		}
	}
	return m
}

// A sweep with room to spare brings the whole block from wherever it
// lives, in 4 KiB folios or one: a whole block moves as one folio, and
// goes on moving so (launch and touch, where both sides sweep). Without
// the sweep, and on a full processor, the density tree decides.
func TestDensitySweepWithRoomBringsTheWholeBlock(t *testing.T) {
	c := policy.PrefetchContext{Pages: core.PagesPerBlock, Populated: true, Sweep: true}
	c.Elsewhere.FillRange(0, core.PagesPerBlock) // all of it on a device, in small folios
	c.Faulted.Set(40)
	got := policy.DensityPrefetch{Threshold: 51}.Expand(&c)
	assert.Equal(t, core.PagesPerBlock, got.Count(), "a sweep with room brings the whole block")

	c.Sweep = false
	got = policy.DensityPrefetch{Threshold: 51}.Expand(&c)
	var bigPage core.PageMask
	bigPage.FillRange(32, 48)
	assert.Equal(t, bigPage, got, "out of a sweep, the faulted big page")

	c.Sweep, c.Full = true, true
	got = policy.DensityPrefetch{Threshold: 51}.Expand(&c)
	assert.Equal(t, bigPage, got, "a sweep on a full processor brings what the tree wants")

	c.Full = false
	c.Thrashing.Set(100)
	got = policy.DensityPrefetch{Threshold: 51}.Expand(&c)
	assert.Equal(t, bigPage, got, "nor does a block that thrashes come whole")
}
