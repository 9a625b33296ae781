package server

import (
	"errors"
	"fmt"
	"os"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cilium/ebpf/ringbuf"

	"github.com/softuvm/softuvm/bpf"
	"github.com/softuvm/softuvm/internal/block"
	"github.com/softuvm/softuvm/internal/config"
	"github.com/softuvm/softuvm/internal/core"
	"github.com/softuvm/softuvm/internal/procinfo"
	"github.com/softuvm/softuvm/internal/wire"
	"github.com/softuvm/softuvm/policy"
	"github.com/softuvm/softuvm/uffd"
)

// accessState is the server's access counting: how it counts, the views
// it counts for, and the access loop's channels.
type accessState struct {
	policy policy.AccessPolicy
	Mode   string        // what Info says
	Ebpf   *bpf.Counters // counting in the kernel; nil otherwise
	user   bool          // counting in user space

	mu         sync.Mutex
	views      map[uint32]*view     // by code; guarded by mu
	nextCode   uint32               // guarded by mu
	userCounts map[regionKey]uint64 // guarded by mu

	crossings chan crossing
	quit      chan struct{}
	loops     sync.WaitGroup
	anatomy   *anatomy // nil without eBPF or sampling
}

type regionKey struct {
	code   uint32
	region uint64
}

// crossing is a region whose count reached a multiple of the threshold.
type crossing struct {
	code   uint32
	region uint64
}

// readRing hands each record of one of the program's ring buffers to
// handle until the buffer is closed or handle says stop; it ends one of
// the access state's loops.
func readRing[T any](s *Server, what string, read func(deadline time.Time) (T, error), handle func(T) bool) {
	defer s.Access.loops.Done()
	for {
		x, err := read(time.Time{})
		if errors.Is(err, ringbuf.ErrClosed) || errors.Is(err, os.ErrClosed) {
			return
		}
		if err != nil {
			s.logger.Printf("%s: %v", what, err)
			continue
		}
		if !handle(x) {
			return
		}
	}
}

// maxCrossingBatch bounds the reports serviced together.
const maxCrossingBatch = 4096

// maxHintRuns bounds the runs one hint request names: 16 bytes each.
const maxHintRuns = 8192

func (a *accessState) counting() bool { return a.Ebpf != nil || a.user }

// startAccessCounting loads the counters as the configuration asks,
// records the mode Info reports, and starts the access loop.
func (s *Server) startAccessCounting() error {
	a := &accessState{policy: s.cfg.ParsedAccessPolicy(), views: map[uint32]*view{}, userCounts: map[regionKey]uint64{},
		crossings: make(chan crossing, maxCrossingBatch), quit: make(chan struct{})}
	s.Access = a
	switch s.cfg.AccessCounting {
	case config.AccessCountingOff:
		a.Mode = "off (configured)"
		return nil
	case config.AccessCountingUser:
		a.user = true
		a.Mode = "user (configured): MINOR-mode faults on remote mappings, counted by the server"
	default:
		c, err := bpf.Load(uint64(a.policy.Threshold))
		switch {
		case err == nil:
			a.Ebpf = c
			a.Mode = fmt.Sprintf("ebpf: exceptions:page_fault_user, 64 KiB regions, threshold %d", a.policy.Threshold)
		case s.cfg.AccessCounting == config.AccessCountingEBPF:
			return fmt.Errorf("%w: %v", core.ErrInitialization, err)
		default:
			a.user = true
			a.Mode = fmt.Sprintf("user: eBPF could not load (%v); MINOR-mode faults on remote mappings, counted by the server", err)
		}
	}
	if a.Ebpf != nil {
		if every := a.policy.AnatomyEvery; every > 0 {
			if err := a.Ebpf.EnableAnatomy(); err != nil {
				s.logger.Printf("fault anatomy off: %v", err)
			} else {
				a.anatomy = newAnatomy(uint64(every))
			}
		}
		a.loops.Add(1)
		go s.readCrossings()
		if a.anatomy != nil {
			a.loops.Add(1)
			go s.readResumes()
		}
	}
	if a.policy.Hints {
		a.Mode += fmt.Sprintf("; hint faults every %v over up to %s of each device's remote mappings, delayed migration, counts halved every %v",
			time.Duration(a.policy.Period), core.FormatSize(a.policy.Sample), time.Duration(a.policy.Decay))
	} else {
		a.Mode += "; no hint faults or delayed migration (policy hints=off)"
	}
	a.loops.Add(1)
	go s.accessLoop()
	return nil
}

// stopAccessCounting ends the access loop and detaches the program: no
// map, program or link is left.
func (s *Server) stopAccessCounting() {
	a := s.Access
	close(a.quit)
	if a.Ebpf != nil {
		a.Ebpf.Close() // ends the ring buffer readers
	}
	a.loops.Wait()
}

// track notes view v's process's minflt and, when counting, gives the
// view a code and starts counting its process's faults.
func (s *Server) track(v *view) {
	v.minfltStart, _ = procinfo.MinorFaults(v.pid) // the kernel's count, shown even when counting is off
	a := s.Access
	if !a.counting() {
		return
	}
	a.mu.Lock()
	a.nextCode++
	if a.nextCode == 0 {
		a.nextCode = 1
	}
	v.code = a.nextCode
	a.views[v.code] = v
	a.mu.Unlock()
	if a.Ebpf != nil {
		if err := a.Ebpf.Track(v.pid, v.code); err != nil {
			s.logger.Printf("access counters: %v", err)
		}
	}
}

// untrack stops counting for view v.
func (s *Server) untrack(v *view) {
	a := s.Access
	if v.code == 0 {
		return
	}
	a.mu.Lock()
	if a.views[v.code] == v {
		delete(a.views, v.code)
	}
	for k := range a.userCounts {
		if k.code == v.code {
			delete(a.userCounts, k)
		}
	}
	a.mu.Unlock()
	if a.Ebpf != nil {
		a.Ebpf.Untrack(v.pid)
	}
}

func (a *accessState) viewOf(code uint32) *view {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.views[code]
}

// countUser counts one access of view v at addr in user space, and
// reports the region when it reaches the threshold.
func (s *Server) countUser(v *view, addr uintptr) {
	a := s.Access
	k := regionKey{code: v.code, region: uint64(addr) >> bpf.RegionShift}
	a.mu.Lock()
	a.userCounts[k]++
	n := a.userCounts[k]
	a.mu.Unlock()
	if n%uint64(a.policy.Threshold) == 0 {
		select {
		case a.crossings <- crossing{code: k.code, region: k.region}:
		default: // the loop is behind: reported again at the next multiple
		}
	}
}

// readCrossings forwards the eBPF program's threshold crossings to the
// access loop until the program is closed.
func (s *Server) readCrossings() {
	a := s.Access
	readRing(s, "access counters", a.Ebpf.ReadCrossing, func(x bpf.Crossing) bool {
		select {
		case a.crossings <- crossing{code: x.Processor, region: x.Region}:
			return true
		case <-a.quit:
			return false
		}
	})
}

// accessLoop arms hint faults, decays the counts and migrates the
// regions reported, one thing at a time: none of it is on a fault path.
func (s *Server) accessLoop() {
	a := s.Access
	defer a.loops.Done()
	period := time.NewTicker(time.Duration(a.policy.Period))
	defer period.Stop()
	decay := time.NewTicker(time.Duration(a.policy.Decay))
	defer decay.Stop()
	for {
		select {
		case <-a.quit:
			return
		case <-period.C:
			if a.policy.Hints && a.counting() {
				s.armHints()
			}
			if an := a.anatomy; an != nil {
				an.expire(time.Second)
			}
		case <-decay.C:
			s.decayCounts()
		case x := <-a.crossings:
			s.serviceCrossings(a.drainCrossings(x))
		}
	}
}

// decayCounts halves every count.
func (s *Server) decayCounts() {
	a := s.Access
	if a.Ebpf != nil {
		if err := a.Ebpf.Decay(); err != nil {
			s.logger.Printf("access counters: decay: %v", err)
		}
	}
	a.mu.Lock()
	for k, n := range a.userCounts {
		if n/2 == 0 {
			delete(a.userCounts, k)
		} else {
			a.userCounts[k] = n / 2
		}
	}
	a.mu.Unlock()
}

// resetRegion forgets a serviced region's count, as NVIDIA's driver
// clears a counter once it has serviced its notification.
func (s *Server) resetRegion(k regionKey) {
	a := s.Access
	if a.Ebpf != nil {
		a.Ebpf.Reset(k.code, k.region)
	}
	a.mu.Lock()
	delete(a.userCounts, k)
	a.mu.Unlock()
}

// drainCrossings returns x and the reports waiting behind it: a kernel
// streaming over a range brings its regions to the threshold in the same
// round, and moving and remapping them together costs one remap per run
// instead of one per region.
func (a *accessState) drainCrossings(x crossing) []crossing {
	batch := []crossing{x}
	for len(batch) < maxCrossingBatch {
		select {
		case y := <-a.crossings:
			batch = append(batch, y)
		default:
			return batch
		}
	}
	return batch
}

// serviceCrossings migrates reported regions to the processors whose
// views reached them, page by page as policy allows: pages a view reaches
// remotely (accessed-by), not pinned by a preferred location elsewhere or
// by thrashing. Adjacent regions of one view move as one run, and the
// view's mapping follows each run before the next.
func (s *Server) serviceCrossings(batch []crossing) {
	sort.Slice(batch, func(i, j int) bool {
		if batch[i].code != batch[j].code {
			return batch[i].code < batch[j].code
		}
		return batch[i].region < batch[j].region
	})
	for i := 0; i < len(batch); {
		j := i + 1
		for j < len(batch) && batch[j].code == batch[i].code && batch[j].region <= batch[j-1].region+1 {
			j++
		}
		s.serviceRun(batch[i].code, batch[i:j])
		for _, x := range batch[i:j] {
			s.resetRegion(regionKey{code: x.code, region: x.region})
		}
		i = j
	}
}

// serviceRun services the reports of one view over consecutive regions.
func (s *Server) serviceRun(code uint32, run []crossing) {
	v := s.Access.viewOf(code)
	if v == nil {
		return // the view went away
	}
	sess, l := v.sess, v.loc
	lo := uintptr(run[0].region) << bpf.RegionShift
	hi := uintptr(run[len(run)-1].region+1) << bpf.RegionShift
	ranges := sess.ranges.Load()
	for _, x := range run {
		if r := ranges.lookup(uintptr(x.region) << bpf.RegionShift); r != nil {
			r.Stats.Crossings[l.Slot()].Add(1)
		}
	}
	if !s.Access.policy.Hints || l == core.CPU {
		return // the CPU maps no remote memory: its faults migrate already
	}
	for _, r := range ranges.ranges {
		if r.End() <= lo || r.Start >= hi || r.Kind != core.KindManaged {
			continue
		}
		from, to := max(lo, r.Start), min(hi, r.End())
		// Blocks move in parallel, as Prefetch moves them, unless the
		// device must evict to take them.
		movers := s.copyCalibration().BlockMovers
		if !s.eng.RoomFor(l, int64(to-from)) {
			movers = 1
		}
		var moved atomic.Int64
		err := r.eachBlockParallel(from, to-from, movers, s.nodeOf(l), func(o *block.Mover, pages core.PageMask) error {
			var want core.PageMask
			for p := pages.NextSet(0); p >= 0; p = pages.NextSet(p + 1) {
				if o.CounterMovable(l, p) {
					want.Set(p)
				}
			}
			if want.Empty() {
				return nil
			}
			err := o.MoveIn(l, want, policy.CauseCounters)
			want.And(&o.B.Resident[l.Slot()])
			moved.Add(int64(want.Count()))
			return err
		})
		if err != nil {
			s.logger.Printf("pid %d: delayed migration of %#x+%d to %v: %v", sess.pid, from, to-from, l, err)
		}
		if n := moved.Load(); n > 0 {
			if err := sess.remapRange(r, from, to-from); err != nil {
				s.logger.Printf("pid %d: after delayed migration: %v", sess.pid, err)
			}
			// Counted once the device maps its own file over them, so
			// that whoever watches the count (a test, uvm stat) sees the
			// migration when a kernel reads the pages there without
			// faults.
			r.Stats.CounterMigrated[l.Slot()].Add(uint64(n))
		}
	}
}

// armHints drops, in every device view, the page-table entries of up to
// the policy's sample of its remote mappings, from where the last round
// stopped, so that the next access to each page is a fault the counters
// see. The pages stay in their files; the fault is a minor one.
func (s *Server) armHints() {
	for _, sess := range s.sessionList() {
		for l := 1; l < len(sess.views); l++ {
			// No use lock is held across the request: like a remap, it
			// waits for the device process, and a view going away
			// meanwhile only makes it fail (its connection is closed).
			v := sess.views[l].Load()
			if v == nil || v.connEnded() {
				continue
			}
			runs := sess.remoteRuns(v, s.Access.policy.Sample)
			if len(runs) > 0 {
				if err := v.request(wire.EncodeDeviceHints(v.seq.Add(1), runs), wire.MsgDeviceHints); err != nil && !v.connEnded() {
					s.logger.Printf("pid %d device %d: arm hint faults: %v", sess.pid, l-1, err)
				}
			}
		}
	}
}

// remoteRuns collects up to budget bytes of the runs view v maps from
// another location's file, from v's hint cursor on, wrapping around once,
// and counts them as armed.
func (sess *session) remoteRuns(v *view, budget int64) []wire.Mapping {
	l := v.loc
	var out []wire.Mapping
	add := func(r *managedRange, addr uintptr, pages int) {
		n := int64(pages) * core.PageSize
		if n > budget {
			pages = int(budget / core.PageSize)
			n = int64(pages) * core.PageSize
		}
		if pages == 0 || len(out) == maxHintRuns {
			return
		}
		if k := len(out) - 1; k >= 0 && uintptr(out[k].Addr+out[k].Length) == addr {
			out[k].Length += uint64(n)
		} else {
			out = append(out, wire.Mapping{Addr: uint64(addr), Length: uint64(n)})
		}
		budget -= n
		v.hintCursor = addr + uintptr(n)
		r.Stats.HintsArmed[l.Slot()].Add(uint64(pages))
	}
	full := func() bool { return budget < core.PageSize || len(out) == maxHintRuns }
	// visit adds the remote runs of [from, to), which lies in r.
	visit := func(r *managedRange, from, to uintptr) {
		if f, ok := r.StaticFile(l); ok {
			if f != l {
				add(r, from, int((to-from)/core.PageSize))
			}
			return
		}
		for bi := int((from - r.Start) >> core.BlockShift); bi <= int((to-1-r.Start)>>core.BlockShift) && !full(); bi++ {
			b := r.BlockAt(bi)
			if b == nil {
				continue
			}
			blockAddr := r.Start + uintptr(bi)*core.BlockSize
			first := int((max(from, blockAddr) - blockAddr) / core.PageSize)
			outer := int((min(to, blockAddr+core.BlockSize) - blockAddr) / core.PageSize)
			b.Lock()
			b.ViewRuns(l, first, outer, true, full, func(p, q int) {
				add(r, blockAddr+uintptr(p)*core.PageSize, q-p)
			})
			b.Unlock()
		}
	}
	sess.walkFromCursor(v.hintCursor, full, visit)
	if budget >= core.PageSize {
		v.hintCursor = 0 // everything fit: start from the beginning next time
	}
	return out
}

// walkFromCursor visits the parts [from, to) of the session's live
// ranges from cursor to the end of the address space, then from the start
// up to cursor, until full says to stop: a sample that goes on where the
// last one stopped.
func (sess *session) walkFromCursor(cursor uintptr, full func() bool, visit func(r *managedRange, from, to uintptr)) {
	ranges := sess.ranges.Load().ranges
	for _, r := range ranges {
		if !full() && r.End() > cursor && !r.Freed.Load() {
			visit(r, max(r.Start, cursor), r.End())
		}
	}
	for _, r := range ranges {
		if !full() && r.Start < cursor && !r.Freed.Load() {
			visit(r, r.Start, min(r.End(), cursor))
		}
	}
}

// serveHintFault serves a MINOR fault of the user-space fallback: a
// device's access to a page it maps remotely, whose page-table entry a
// hint round dropped. The access is counted and the page mapped again,
// write-protected if it has other copies. The block's lock is held.
func (sess *session) serveHintFault(o *block.Mover, v *view, p int) error {
	addr := o.PageAddr(p)
	sess.srv.countUser(v, addr)
	var mode uffd.ContinueMode
	if o.B.Copies(p) > 1 {
		mode = uffd.ContinueWP
	}
	h := handlerOf(o)
	h.ioctlBegins()
	_, err := v.uffd.Continue(addr, core.PageSize, mode)
	h.ioctlEnds()
	if err != nil {
		// The page left its file meanwhile (the retry faults as
		// missing), or another handler mapped it: wake the thread.
		_ = v.uffd.Wake(addr, core.PageSize)
	}
	return nil
}

// processFaults reads view v's process's counts.
func (s *Server) processFaults(v *view) config.ProcessFaults {
	pf := config.ProcessFaults{Processor: v.loc, PID: v.pid}
	if c := s.Access.Ebpf; c != nil {
		if n, err := c.ProcessFaults(v.pid); err == nil {
			pf.EBPFFaults = &n
		}
	}
	if n, ok := procinfo.MinorFaults(v.pid); ok && n >= v.minfltStart {
		d := n - v.minfltStart
		pf.MinorFaults = &d
	}
	return pf
}

// faultCounts fills in the session's fault counts three ways: the
// server's (faults it served), eBPF's (every user fault of the process,
// served by the kernel or the server) and the kernel's minflt, each since
// the session began; and the same for its device processes.
func (sess *session) faultCounts(in *config.SessionInfo) {
	if sess.role != wire.RoleClient {
		return
	}
	st := sess.counters(nil).Snapshot()
	in.ServedFaults = st.FaultsBy(core.CPU).Total()
	if v := sess.client(); v != nil {
		pf := sess.srv.processFaults(v)
		in.EBPFFaults, in.MinorFaults = pf.EBPFFaults, pf.MinorFaults
	}
	for l := 1; l < len(sess.views); l++ {
		if v := sess.viewRef(core.DeviceAtSlot(l)); v != nil {
			pf := sess.srv.processFaults(v)
			pf.Served = st.FaultsBy(core.DeviceAtSlot(l)).Total()
			in.Devices = append(in.Devices, pf)
			v.release()
		}
	}
}
