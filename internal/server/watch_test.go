package server

import (
	"fmt"
	"io"
	"log"
	"os"
	"strings"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/softuvm/softuvm/devmem"
	"github.com/softuvm/softuvm/internal/block"
	"github.com/softuvm/softuvm/internal/core"
	"github.com/softuvm/softuvm/policy"
	"github.com/softuvm/softuvm/uffd"
)

// watchHarness is a session whose client is this process: two host
// blocks of a file that takes large folios, mapped and every page
// touched, block 0 written in 64 KiB pieces (4 KiB folios) and block 1
// whole (one 2 MiB folio).
type watchHarness struct {
	obs     useObserver
	r       *managedRange
	mem     []byte
	pagemap *os.File
	// view is the host view over the mapping, registered for MINOR
	// faults (minor), as the server's is where the host file takes
	// large folios.
	view *view
}

// newWatchHarness makes the harness; with minor, its mapping is
// registered for MINOR faults (then nothing may touch an unmapped page:
// no thread serves the fault).
func newWatchHarness(t *testing.T, minor bool) *watchHarness {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: a tmpfs of its own for large folios")
	}
	if err := devmem.LargeFoliosAvailable(); err != nil {
		t.Skipf("no large folios here: %v", err)
	}
	swap, err := uffd.SwapTotal()
	require.NoError(t, err)
	if swap != 0 {
		t.Skip("swap is on: MADV_PAGEOUT would swap the pages out")
	}
	const size = 2 * core.BlockSize
	f, err := devmem.CreateLargeFolioFile("watch-test", size)
	require.NoError(t, err)
	t.Cleanup(func() { f.Close() })
	piece := make([]byte, policy.RegionPages*core.PageSize)
	for off := 0; off < core.BlockSize; off += len(piece) {
		for i := range piece {
			piece[i] = watchTestByte(off + i)
		}
		_, err := f.WriteAt(piece, int64(off))
		require.NoError(t, err)
	}
	whole := make([]byte, core.BlockSize)
	for i := range whole {
		whole[i] = watchTestByte(core.BlockSize + i)
	}
	_, err = f.WriteAt(whole, core.BlockSize)
	require.NoError(t, err)
	m, err := f.Map(0, size)
	require.NoError(t, err)
	t.Cleanup(func() { m.Unmap() })
	mem := m.Bytes()
	var sum byte
	for p := 0; p < size; p += core.PageSize {
		sum += mem[p]
	}
	watchSink = sum
	pagemap, err := os.Open("/proc/self/pagemap")
	require.NoError(t, err)
	t.Cleanup(func() { pagemap.Close() })

	var u *uffd.FD
	if minor {
		if u, err = uffd.Open(0); err != nil {
			t.Skipf("no userfaultfd here: %v", err)
		}
		t.Cleanup(func() { u.Close() })
		if _, err := u.Handshake(uffd.FeatureMinorShmem); err != nil {
			t.Skipf("no MINOR faults on shared memory here: %v", err)
		}
		_, err = u.Register(m.Addr(), size, uffd.RegisterMinor)
		require.NoError(t, err)
	}

	srv := &Server{logger: log.New(io.Discard, "", 0), eng: testEngine(t, policy.Specs{})}
	sess := &session{srv: srv, host: f, pid: os.Getpid()}
	t.Cleanup(sess.watch.close)
	r := &managedRange{Range: srv.eng.NewRange(sess, m.Addr(), size), sess: sess}
	r.Ext, r.Kind, r.FileOff = r, core.KindManaged, 0 // the file is the two blocks alone
	for i := 0; i < 2; i++ {
		b := r.Block(i)
		b.Resident[core.CPU.Slot()].FillRange(0, core.PagesPerBlock)
	}
	r.Block(1).MarkLarge()
	return &watchHarness{obs: useObserver{srv}, r: r, mem: mem, pagemap: pagemap, view: &view{sess: sess, loc: core.CPU, pid: sess.pid, uffd: u}}
}

var watchSink byte

// watchTestByte is what the harness writes at offset off of its file.
func watchTestByte(off int) byte { return byte(off/core.PageSize*7 + off%251) }

// unmapped returns the pages of block i that this process does not map.
func (h *watchHarness) unmapped(t *testing.T, i int) core.PageMask {
	t.Helper()
	start := h.r.Start + uintptr(i)*core.BlockSize
	present, err := uffd.ScanPresent(h.pagemap, start, start+core.BlockSize, nil)
	require.NoError(t, err)
	var m core.PageMask
	m.FillRange(0, core.PagesPerBlock)
	for _, pr := range present {
		var run core.PageMask
		run.FillRange(int((pr.Start-start)/core.PageSize), int((pr.End-start)/core.PageSize))
		m.AndNot(&run)
	}
	return m
}

func (h *watchHarness) touch(i, page int) {
	watchSink += h.mem[i*core.BlockSize+page*core.PageSize+5]
}

// pageSet is a mask of the pages given.
func pageSet(pages ...int) core.PageMask {
	var m core.PageMask
	for _, p := range pages {
		m.Set(p)
	}
	return m
}

// TestWatchSamplesBlocksInSmallFolios: a block held in 4 KiB folios is
// watched by unmapping one page of each 64 KiB region, at an offset that
// moves on with every watch; Touched then tells which of those the
// program touched again, and no other page (the others were never
// unmapped). A block in one 2 MiB folio is unmapped whole. No byte
// changes.
func TestWatchSamplesBlocksInSmallFolios(t *testing.T) {
	h := newWatchHarness(t, false)
	small, large := h.r.Block(0), h.r.Block(1)

	for watch, phase := range []int{1, 2} {
		require.True(t, h.obs.Watch(small.Ref, core.CPU, false))
		var sample []int
		for region := 0; region < core.PagesPerBlock/policy.RegionPages; region++ {
			sample = append(sample, region*policy.RegionPages+phase)
		}
		want := pageSet(sample...)
		if watch > 0 {
			// The first watch's sample is still unmapped, but for the
			// page touched since.
			for _, p := range sample {
				if p-1 != 5*policy.RegionPages+1 {
					want.Set(p - 1)
				}
			}
		}
		assert.Equal(t, want, h.unmapped(t, 0), "watch %d of the block in 4 KiB folios: unmapped pages", watch)
		assert.Equal(t, core.PageMask{}, h.obs.Touched(small.Ref, core.CPU), "watch %d: touched before any touch", watch)

		// The sample's page of region 5 and a page of region 7 outside
		// the sample: only the first is seen.
		h.touch(0, 5*policy.RegionPages+phase)
		h.touch(0, 7*policy.RegionPages+(phase+3)%policy.RegionPages)
		assert.Equal(t, pageSet(5*policy.RegionPages+phase), h.obs.Touched(small.Ref, core.CPU), "watch %d: touched", watch)
	}

	require.True(t, h.obs.Watch(large.Ref, core.CPU, false))
	var all core.PageMask
	all.FillRange(0, core.PagesPerBlock)
	assert.Equal(t, all, h.unmapped(t, 1), "the block in one 2 MiB folio is unmapped whole")
	assert.Equal(t, core.PageMask{}, h.obs.Touched(large.Ref, core.CPU), "the whole block: touched before any touch")
	h.touch(1, 300)
	touched := h.obs.Touched(large.Ref, core.CPU)
	assert.True(t, touched.Test(300), "the whole block's touched page (%d pages touched)", touched.Count())

	for off := range h.mem {
		if h.mem[off] != watchTestByte(off) {
			t.Fatalf("byte %#x is %d after the watches, want %d", off, h.mem[off], watchTestByte(off))
		}
	}
}

// TestHintFaultInSampledBlockMapsWhatTheViewLacks: the server's answer
// to a MINOR fault in a block watched by samples maps every page the
// view lacks, the samples of earlier watches too, in one go. Mapping
// only the current sample left the others to a fault each, and a block
// watched at every eviction then faulted page by page (gzip in
// TestRunRealPrograms: 16 times the faults and bytes).
func TestHintFaultInSampledBlockMapsWhatTheViewLacks(t *testing.T) {
	h := newWatchHarness(t, true)
	small := h.r.Block(0)
	require.True(t, h.obs.Watch(small.Ref, core.CPU, false))
	require.True(t, h.obs.Watch(small.Ref, core.CPU, false))
	unmapped := h.unmapped(t, 0)
	require.Equal(t, 2*core.PagesPerBlock/policy.RegionPages, unmapped.Count(), "two watches' samples unmapped")

	small.Lock()
	o := h.r.NewMover(0, small)
	o.FV = h.view
	plan, err := o.ServeFault(5*policy.RegionPages+2, &block.Fault{Kind: core.FaultMinor})
	small.Unlock()
	require.NoError(t, err)
	require.Equal(t, block.PlanContinue, plan)
	// require: touching a page left unmapped would wait forever on its
	// MINOR fault.
	require.Equal(t, core.PageMask{}, h.unmapped(t, 0), "pages still unmapped after the hint fault")
	for off := 0; off < core.BlockSize; off++ {
		if h.mem[off] != watchTestByte(off) {
			t.Fatalf("byte %#x is %d after the hint fault, want %d", off, h.mem[off], watchTestByte(off))
		}
	}
}

// A session whose process has exited says nothing of its watch: the
// error of a watch on a gone process (a forked child that exited) is
// ESRCH, and the one warning a session gets is kept for a real cause.
func TestWarnWatchOnceQuietForAGoneProcess(t *testing.T) {
	var out strings.Builder
	srv := &Server{logger: log.New(&out, "", 0), eng: testEngine(t, policy.Specs{Eviction: "lru"})}
	sess := &session{srv: srv, pid: 12345}
	gone := fmt.Errorf("PAGEMAP_SCAN of %#x-%#x: %w", 0x600000000000, 0x600000200000, syscall.ESRCH)
	srv.warnWatchOnce(sess, core.CPU, gone)
	assert.Empty(t, out.String(), "a gone process is not warned of")
	srv.warnWatchOnce(sess, core.CPU, fmt.Errorf("process_madvise(MADV_PAGEOUT): %w", syscall.EPERM))
	assert.Equal(t, "pid 12345: eviction lru cannot watch the client's use of its memory (blocks go in arrival order): process_madvise(MADV_PAGEOUT): operation not permitted\n", out.String())
	srv.warnWatchOnce(sess, core.CPU, fmt.Errorf("again: %w", syscall.EINVAL))
	assert.Equal(t, 1, strings.Count(out.String(), "\n"), "once per session")
}

// testEngine is a block engine of the CPU alone, with the policies specs
// name.
func testEngine(t *testing.T, specs policy.Specs) *block.Engine {
	t.Helper()
	set, err := policy.NewSet(specs)
	require.NoError(t, err)
	return block.New(block.Config{Policies: set, Now: func() int64 { return 1 }})
}
