package server

import (
	"errors"
	"fmt"
	"os"
	"sync"
	"syscall"

	"github.com/softuvm/softuvm/internal/block"
	"github.com/softuvm/softuvm/internal/core"
	"github.com/softuvm/softuvm/policy"
	"github.com/softuvm/softuvm/uffd"
)

// useObserver is the server's policy.Observer: hint faults, as the
// access mode of traces arms pages (accesstrace.go), but for the blocks
// an eviction policy is about to judge. Watch unmaps a block's pages
// from the process that uses them (the client for the host, the device
// process for a device) with process_madvise(MADV_PAGEOUT), which leaves
// a tmpfs page in its file while no swap is on; the process's next touch
// maps it again (a MINOR fault that the server serves with one
// UFFDIO_CONTINUE for the block, or that the kernel serves itself where
// the view does not register them); Touched reads that process's page
// table with PAGEMAP_SCAN. Device processes map their files at the
// client's addresses, so one run of addresses serves both. A policy that
// judges 64 KiB regions asks Watch for them: the server's MINOR fault of
// the host on the block then maps the faulting page's region only
// (block.Mover.serveContinue, Block.WatchRegions), from then on (such a policy may
// read Touched more than once in a watch). A device's MINOR fault, where
// the server serves it, maps the block whole: its regions then all show
// as touched, and it gives up whole blocks.
//
// A block held in 4 KiB folios is watched by a sample, one page of each
// 64 KiB region (watchSamplePages), not whole: MADV_PAGEOUT puts every
// folio it unmaps through reclaim (isolated from its LRU list, unmapped
// from every mapping, offered to a writeback that has no swap to write
// to, put back), which cost 0.6-1.3 ms for the 512 folios of a block,
// against 45-50 us for its 32 sampled pages (docs/benchmarks.md). A
// region touched anywhere is most likely touched again on its sampled
// page within the watch, as the program keeps using it; one used only
// on its other pages looks untouched, and the block comes back from
// the ghost list when it is missed. The sample's page moves on by one
// with every watch, so that no page is always unsampled. A block that
// may be one 2 MiB folio (block.large) is unmapped whole: one folio is
// as cheap, and a sample would split it. So is every block a policy
// watches by region: it must see every region's use.
//
// Not watched: any processor while swap is on (reclaim would swap the
// pages out), memory under the launch coherence model (unmapping would
// hide the CPU's writes from the dirty tracking), ranges that audit
// prefetched pages by their mappings, and a device with no process.
type useObserver struct{ srv *Server }

// sessionWatch is what watching one process of a session needs (the
// client, or a device process): a pidfd and the process's pagemap,
// opened on first use and again when the process is another (a device
// restarted). mu guards them; a leaf lock, taken with no other held or
// under a block's.
type sessionWatch struct {
	mu      sync.Mutex
	pid     int
	ended   bool
	proc    *uffd.Process
	pagemap *os.File
	err     error
}

func (w *sessionWatch) open(pid int) (*uffd.Process, *os.File, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.ended {
		return nil, nil, fmt.Errorf("session ended")
	}
	if w.pid != pid {
		w.closeLocked()
		w.pid = pid
		w.proc, w.err = uffd.OpenProcess(pid)
		if w.err == nil {
			if w.pagemap, w.err = os.Open(fmt.Sprintf("/proc/%d/pagemap", pid)); w.err != nil {
				w.proc.Close()
				w.proc = nil
			}
		}
	}
	return w.proc, w.pagemap, w.err
}

func (w *sessionWatch) closeLocked() {
	if w.proc != nil {
		w.proc.Close()
		w.pagemap.Close()
		w.proc, w.pagemap = nil, nil
	}
}

func (w *sessionWatch) close() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.closeLocked()
	w.ended = true
}

// watchOf returns what watching processor p of the session needs: its
// process's pid and watch state. No device process: ok is false.
func (sess *session) watchOf(p core.Device) (pid int, w *sessionWatch, ok bool) {
	if p == core.CPU {
		return sess.pid, &sess.watch, true
	}
	v := sess.viewRef(p)
	if v == nil {
		return 0, nil, false
	}
	defer v.release()
	return v.pid, &sess.deviceWatch[int(p)], true
}

func (o useObserver) Watchable(p policy.Processor) bool {
	swap, err := uffd.SwapTotal()
	return err == nil && swap == 0
}

// watchedRange returns b's block and the run of client addresses its
// pages span, where b may be watched.
func watchedRange(b *policy.Block) (block.Ref, uffd.PageRun, bool) {
	v, ok := block.RefOf(b)
	if !ok {
		return v, uffd.PageRun{}, false
	}
	r := v.R
	if r.Freed.Load() || r.Kind != core.KindManaged || r.TrackPrefetch || r.Space.LaunchModel() {
		return v, uffd.PageRun{}, false
	}
	start := r.Start + uintptr(v.I)*core.BlockSize
	return v, uffd.PageRun{Start: start, End: min(start+core.BlockSize, r.End())}, true
}

func (o useObserver) Watch(b *policy.Block, p policy.Processor, regions bool) bool {
	v, run, ok := watchedRange(b)
	if !ok {
		return false
	}
	pid, w, ok := rangeOf(v.R).sess.watchOf(p)
	if !ok {
		return false
	}
	proc, _, err := w.open(pid)
	if err != nil {
		o.srv.warnWatchOnce(rangeOf(v.R).sess, p, err)
		return false
	}
	// Set before the pages are unmapped, so that every hint fault after
	// it maps what it should (serveContinue): one region (the host's
	// only), and of a sampled block what the page table lacks.
	host := p == core.CPU
	if host {
		v.B.WatchRegions.Store(regions)
	}
	runs := []uffd.PageRun{run}
	if sample, ok := setWatchSample(v.B, p, regions); ok {
		runs = sampleRuns(run.Start, sample, runs[:0])
	}
	if _, err := proc.PageOut(runs); err != nil {
		if host {
			v.B.WatchRegions.Store(false)
		}
		o.srv.warnWatchOnce(rangeOf(v.R).sess, p, err)
		return false
	}
	return true
}

func (o useObserver) Touched(b *policy.Block, p policy.Processor) core.PageMask {
	var touched core.PageMask
	v, run, ok := watchedRange(b)
	if !ok {
		return touched
	}
	pid, w, ok := rangeOf(v.R).sess.watchOf(p)
	if !ok {
		return touched
	}
	_, pagemap, err := w.open(pid)
	if err != nil {
		return touched
	}
	touched, err = mappedPages(pagemap, run.Start, v.B.Pages)
	if err != nil {
		o.srv.warnWatchOnce(rangeOf(v.R).sess, p, err)
		return core.PageMask{}
	}
	if sample, ok := watchedSample(v.B, p); ok {
		touched.And(&sample) // the other pages were never unmapped
	}
	return touched
}

// mappedPages returns the pages of the block of pages pages at start
// that the process whose pagemap file pagemap is maps (PAGEMAP_SCAN).
func mappedPages(pagemap *os.File, start uintptr, pages int) (core.PageMask, error) {
	var mapped core.PageMask
	var buf [32]uffd.PageRun
	present, err := uffd.ScanPresent(pagemap, start, start+uintptr(pages)*core.PageSize, buf[:0])
	for _, pr := range present {
		mapped.FillRange(int((pr.Start-start)/core.PageSize), int((pr.End-start)/core.PageSize))
	}
	return mapped, err
}

// watchSamplePages is the sample a watch at phase unmaps of a block of
// pages pages: the page at offset phase of each 64 KiB region (the last
// page of a region the block's end cuts short of it).
func watchSamplePages(phase, pages int) core.PageMask {
	var m core.PageMask
	for first := 0; first < pages; first += policy.RegionPages {
		m.Set(min(first+phase, pages-1))
	}
	return m
}

// setWatchSample records what a Watch of the block on p is about to
// unmap, and returns the sample, or false where it unmaps the whole
// block: a block that may be one 2 MiB folio there (block.large), and
// any block where the policy judges regions (a region used only off its
// sampled page would look unused, and leave: clock:regions lost the
// regions in use more often than clock:blocks).
func setWatchSample(b *block.Block, p core.Device, regions bool) (core.PageMask, bool) {
	bit := uint64(1) << p.Slot()
	sampled := !regions && (b.Pages < core.PagesPerBlock || !b.MayBeLargeAt(p))
	for {
		old := b.WatchSample.Load()
		phase := old >> block.WatchPhaseShift
		next := old &^ bit & (1<<block.WatchPhaseShift - 1)
		if sampled {
			phase = (phase + 1) % policy.RegionPages
			next |= bit
		}
		if b.WatchSample.CompareAndSwap(old, next|phase<<block.WatchPhaseShift) {
			if !sampled {
				return core.PageMask{}, false
			}
			return watchSamplePages(int(phase), b.Pages), true
		}
	}
}

// watchedSample returns the sample the last Watch of the block on p
// unmapped, or false where it unmapped the whole block (or none did).
// Where another processor's watch came since, its phase is the one
// given: pages that p's watch left mapped then look touched, and the
// block is kept for a round (only blocks duplicated for reading are
// watched on two processors).
func watchedSample(b *block.Block, p core.Device) (core.PageMask, bool) {
	ws := b.WatchSample.Load()
	if ws&(1<<p.Slot()) == 0 {
		return core.PageMask{}, false
	}
	return watchSamplePages(int(ws>>block.WatchPhaseShift), b.Pages), true
}

// sampleRuns appends to out a run of one page for each page of sample in
// the block that starts at start.
func sampleRuns(start uintptr, sample core.PageMask, out []uffd.PageRun) []uffd.PageRun {
	for p, q := sample.NextRun(0); p >= 0; p, q = sample.NextRun(q) {
		out = append(out, uffd.PageRun{Start: start + uintptr(p)*core.PageSize, End: start + uintptr(q)*core.PageSize})
	}
	return out
}

// warnWatchOnce logs, once per session, why its use cannot be watched.
// A process that has exited (ESRCH: a client's forked child, a program
// ending) has no use left to watch, and is not worth a line.
func (s *Server) warnWatchOnce(sess *session, p core.Device, err error) {
	if errors.Is(err, syscall.ESRCH) {
		return
	}
	if sess.watchWarned.CompareAndSwap(false, true) {
		who := "the client's"
		if p != core.CPU {
			who = fmt.Sprintf("device %d's", p)
		}
		s.logger.Printf("pid %d: eviction %s cannot watch %s use of its memory (blocks go in arrival order): %v", sess.pid, s.eng.Policies().Eviction.Name(), who, err)
	}
}

// evictionUse is Info.EvictionUse: whether the eviction policy, where it
// watches use, can watch the host's now.
func (s *Server) evictionUse() string {
	if _, ok := s.eng.Policies().Eviction.(policy.Observing); !ok {
		return ""
	}
	if (useObserver{s}).Watchable(core.CPU) {
		return "host and device use watched with hint faults (a block in 4 KiB folios by a page of each 64 KiB region)"
	}
	return "use not watched while swap is on: blocks leave in arrival order"
}
