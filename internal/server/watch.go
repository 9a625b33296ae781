package server

import (
	"fmt"
	"os"
	"sync"

	"github.com/softuvm/softuvm/internal/core"
	"github.com/softuvm/softuvm/policy"
	"github.com/softuvm/softuvm/uffd"
)

// useObserver is the server's policy.Observer: hint faults on the host,
// as the access mode of traces arms pages (accesstrace.go), but for the
// blocks an eviction policy is about to judge. Watch unmaps a block's
// pages from the client with process_madvise(MADV_PAGEOUT), which leaves
// a tmpfs page in its file while no swap is on; the client's next touch
// maps it again (a MINOR fault that the server serves with one
// UFFDIO_CONTINUE for the block, or that the kernel serves itself where
// the host view does not register them); Touched reads the client's page
// table with PAGEMAP_SCAN. A policy that judges 64 KiB regions asks Watch
// for them: the server's MINOR fault on the block then maps the faulting
// page's region only (serveContinue, block.watchRegions), from then on
// (such a policy may read Touched more than once in a watch).
//
// Devices are not watched: a device process maps its own file, and only
// it could drop those mappings (MsgDeviceHints), a round trip the
// eviction path should not wait for. Nor is the host while swap is on
// (reclaim would swap the pages out), under the launch coherence model
// (unmapping would hide the CPU's writes from the dirty tracking), or in
// ranges that audit prefetched pages by their mappings.
type useObserver struct{ srv *Server }

// sessionWatch is what a session needs for watching: a pidfd and the
// client's pagemap, opened on first use (mu guards them; a leaf lock,
// taken with no other held or under a block's).
type sessionWatch struct {
	mu      sync.Mutex
	opened  bool
	client  *uffd.Process
	pagemap *os.File
	err     error
}

func (w *sessionWatch) open(pid int) (*uffd.Process, *os.File, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.opened {
		w.opened = true
		w.client, w.err = uffd.OpenProcess(pid)
		if w.err == nil {
			if w.pagemap, w.err = os.Open(fmt.Sprintf("/proc/%d/pagemap", pid)); w.err != nil {
				w.client.Close()
				w.client = nil
			}
		}
	}
	return w.client, w.pagemap, w.err
}

func (w *sessionWatch) close() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.client != nil {
		w.client.Close()
		w.pagemap.Close()
		w.client, w.pagemap = nil, nil
	}
	w.opened = true
	w.err = fmt.Errorf("session ended")
}

func (o useObserver) Watchable(p policy.Processor) bool {
	if p != core.CPU {
		return false
	}
	swap, err := uffd.SwapTotal()
	return err == nil && swap == 0
}

// watchedRange returns b's block and the run of client addresses its
// pages span, where b may be watched on the host.
func watchedRange(b *policy.Block) (blockRef, uffd.PageRun, bool) {
	v, ok := b.Owner().(blockRef)
	if !ok || v.b.ref != b {
		return v, uffd.PageRun{}, false
	}
	r := v.r
	if r.freed.Load() || r.kind != core.KindManaged || r.trackPrefetch || r.sess.launch != nil {
		return v, uffd.PageRun{}, false
	}
	start := r.start + uintptr(v.i)*core.BlockSize
	return v, uffd.PageRun{Start: start, End: min(start+core.BlockSize, r.end())}, true
}

func (o useObserver) Watch(b *policy.Block, p policy.Processor, regions bool) bool {
	v, run, ok := watchedRange(b)
	if !ok || p != core.CPU {
		return false
	}
	client, _, err := v.r.sess.watch.open(v.r.sess.pid)
	if err != nil {
		o.srv.warnWatchOnce(v.r.sess, err)
		return false
	}
	// Set before the pages are unmapped, so that every hint fault after
	// it maps one region (serveContinue).
	v.b.watchRegions.Store(regions)
	if _, err := client.PageOut([]uffd.PageRun{run}); err != nil {
		v.b.watchRegions.Store(false)
		o.srv.warnWatchOnce(v.r.sess, err)
		return false
	}
	return true
}

func (o useObserver) Touched(b *policy.Block, p policy.Processor) core.PageMask {
	var touched core.PageMask
	v, run, ok := watchedRange(b)
	if !ok || p != core.CPU {
		return touched
	}
	_, pagemap, err := v.r.sess.watch.open(v.r.sess.pid)
	if err != nil {
		return touched
	}
	var buf [32]uffd.PageRun
	present, err := uffd.ScanPresent(pagemap, run.Start, run.End, buf[:0])
	if err != nil {
		o.srv.warnWatchOnce(v.r.sess, err)
		return touched
	}
	for _, pr := range present {
		touched.FillRange(int((pr.Start-run.Start)/core.PageSize), int((pr.End-run.Start)/core.PageSize))
	}
	return touched
}

// warnWatchOnce logs, once per session, why its use cannot be watched.
func (s *Server) warnWatchOnce(sess *session, err error) {
	if sess.watchWarned.CompareAndSwap(false, true) {
		s.logger.Printf("pid %d: eviction %s cannot watch the client's use of its memory (blocks go in arrival order): %v", sess.pid, s.eviction.Name(), err)
	}
}

// evictionUse is Info.EvictionUse: whether the eviction policy, where it
// watches use, can watch the host's now.
func (s *Server) evictionUse() string {
	if _, ok := s.eviction.(policy.Observing); !ok {
		return ""
	}
	if (useObserver{s}).Watchable(core.CPU) {
		return "host use watched with hint faults"
	}
	return "host use not watched while swap is on: blocks leave in arrival order"
}
