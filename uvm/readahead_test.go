package uvm

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/softuvm/softuvm/internal/core"
	"github.com/softuvm/softuvm/policy"
)

// readAheadRange fills blocks blocks with a pattern (patternedManaged)
// and moves them whole to device 0; it returns what they must hold. The
// host's writes are a sweep too, of blocks never touched: none of them
// is read ahead (their first toucher places them).
func readAheadRange(t *testing.T, s *Session, blocks int) (*Allocation, []byte, []byte) {
	t.Helper()
	a, b, want := patternedManaged(t, s, int64(blocks)*BlockSize, 13, 1)
	require.NoError(t, a.Prefetch(0))
	st, err := a.Stats()
	require.NoError(t, err)
	require.Zero(t, st.ReadAheadPages, "a first touch read ahead")
	return a, b, want
}

// readBlock reads every byte of block blk of b and wants want's.
func readBlock(t *testing.T, b, want []byte, blk int) {
	t.Helper()
	for i := blk * BlockSize; i < (blk+1)*BlockSize; i++ {
		if b[i] != want[i] {
			t.Fatalf("byte %#x of block %d reads %#x, want %#x", i, blk, b[i], want[i])
		}
	}
}

// waitReadAhead waits until the allocation counts pages read ahead.
func waitReadAhead(t *testing.T, a *Allocation, pages uint64, step string) {
	t.Helper()
	Eventually(t, 10*time.Second, func() bool {
		st, err := a.Stats()
		require.NoError(t, err)
		require.LessOrEqual(t, st.ReadAheadPages, pages, "%s: more pages read ahead than the sweep reached", step)
		return st.ReadAheadPages == pages
	}, "%s: want %d pages read ahead", step, pages)
}

// TestReadAheadFollowsAHostSweep: the host reads a range that lives on a
// device, block after block. Its faults on blocks 0 to 3 make a sweep
// (policy.SweepRun faults in a row), and the fault on block 3 reads
// block 4 ahead; from there the first touch of each block read ahead
// reads the next. Each step is awaited before the host goes on, so the
// counts are exact: every block from 4 on arrives ahead of the host,
// none past the range's end, and every byte is right.
func TestReadAheadFollowsAHostSweep(t *testing.T) {
	s := largeFolioSession(t, largeFolioConfig(t))
	const blocks = 10
	a, b, want := readAheadRange(t, s, blocks)
	first := policy.SweepRun + 1 // the first block read ahead
	for blk := range blocks {
		readBlock(t, b, want, blk)
		if blk+1 >= first && blk+1 < blocks {
			waitReadAhead(t, a, uint64(blk+2-first)*core.PagesPerBlock, fmt.Sprintf("after block %d", blk))
		}
	}
	st, err := a.Stats()
	require.NoError(t, err)
	assert.Equal(t, uint64(blocks-first)*core.PagesPerBlock, st.ReadAheadPages, "blocks %d to %d read ahead", first, blocks-1)
	assert.Equal(t, uint64(blocks)*core.PagesPerBlock, st.MigratedPages(0, CPU), "every page came back once")
	assert.Equal(t, uint64(blocks)*core.PagesPerBlock, st.MigratedPages(CPU, 0), "nothing went back to the device after the setup's prefetch")
	for blk := range blocks {
		readBlock(t, b, want, blk)
	}
}

// TestNoReadAheadOutOfASweep: blocks touched out of order, and a sweep
// under a policy that does not read ahead (window and none do not
// implement policy.ReadAhead), read nothing ahead.
func TestNoReadAheadOutOfASweep(t *testing.T) {
	s := largeFolioSession(t, largeFolioConfig(t))
	const blocks = 8
	a, b, want := readAheadRange(t, s, blocks)
	for _, blk := range []int{5, 1, 7, 3, 0, 6, 2, 4} {
		readBlock(t, b, want, blk)
	}
	st, err := a.Stats()
	require.NoError(t, err)
	assert.Zero(t, st.ReadAheadPages, "blocks out of order")
	assert.Equal(t, uint64(blocks)*core.PagesPerBlock, st.MigratedPages(0, CPU))

	w, err := s.MallocManaged(blocks*BlockSize, WithPrefetch(PrefetchSpec{Policy: "window", Window: core.PagesPerBlock}))
	require.NoError(t, err)
	defer w.Free()
	wb := w.Bytes()
	copy(wb, want)
	require.NoError(t, w.Prefetch(0))
	st, err = w.Stats()
	require.NoError(t, err)
	assert.Equal(t, uint64(0), st.ReadAheadPages, "a first touch under a policy without ReadAhead")
	for blk := range blocks {
		readBlock(t, wb, want, blk)
	}
	st, err = w.Stats()
	require.NoError(t, err)
	assert.Equal(t, uint64(0), st.ReadAheadPages, "a policy without ReadAhead")
}

// ReadsAhead: only a sweep of the host that brings the whole block, onto
// a processor with room, where nothing thrashes.
func TestDensityReadsAheadOnlyInAWholeSweep(t *testing.T) {
	d := policy.DensityPrefetch{Threshold: 51}
	c := policy.PrefetchContext{Processor: core.CPU, Pages: core.PagesPerBlock, Populated: true, Sweep: true}
	var whole, half core.PageMask
	whole.FillRange(0, core.PagesPerBlock)
	half.FillRange(0, core.PagesPerBlock/2)
	assert.True(t, d.ReadsAhead(&c, whole), "a sweep bringing the whole block")
	assert.False(t, d.ReadsAhead(&c, half), "a sweep bringing half the block")
	c.Thrashing.Set(9)
	assert.False(t, d.ReadsAhead(&c, whole), "pages thrash")
	c.Thrashing = core.PageMask{}
	c.Full = true
	assert.False(t, d.ReadsAhead(&c, whole), "a full processor")
	c.Full = false
	c.Sweep = false
	assert.False(t, d.ReadsAhead(&c, whole), "no sweep")
	assert.False(t, policy.ReadsAhead(policy.NoPrefetch{}, &c, whole), "none never reads ahead")
	c.Sweep = true
	assert.True(t, policy.ReadsAhead(d, &c, whole))
	c.Processor = 0
	assert.False(t, d.ReadsAhead(&c, whole), "a device's sweep")
	short := policy.PrefetchContext{Processor: core.CPU, Pages: 100, Populated: true, Sweep: true}
	var all100 core.PageMask
	all100.FillRange(0, 100)
	assert.True(t, d.ReadsAhead(&short, all100), "the last, short block of a range, whole")
}

// TestNoReadAheadOntoAFullHost: under a host budget of four blocks a
// sweep of ten reads nothing ahead once the host is full (a read-ahead
// never evicts), and every byte still arrives.
func TestNoReadAheadOntoAFullHost(t *testing.T) {
	cfg := largeFolioConfig(t)
	cfg.HostBudget = 4 * BlockSize
	s := largeFolioSession(t, cfg)
	const blocks = 10
	a, b, want := readAheadRange(t, s, blocks)
	for blk := range blocks {
		readBlock(t, b, want, blk)
	}
	st, err := a.Stats()
	require.NoError(t, err)
	assert.Zero(t, st.ReadAheadPages, "read ahead onto a full host")
	assert.GreaterOrEqual(t, st.MigratedPages(0, CPU), uint64(blocks)*core.PagesPerBlock, "every page came back")
}
