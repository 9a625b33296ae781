package server

import (
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/softuvm/softuvm/internal/config"
	"github.com/softuvm/softuvm/internal/core"
	"github.com/softuvm/softuvm/internal/procinfo"
	"github.com/softuvm/softuvm/internal/wire"
	"github.com/softuvm/softuvm/trace"
	"github.com/softuvm/softuvm/uffd"
)

// TraceAccessEnv turns on the access mode for a client recording its own
// trace (UVM_TRACE), with ParseTraceAccess's syntax: UVM_TRACE_ACCESS=100ms.
const TraceAccessEnv = config.EnvTraceAccess

// The access mode of traces: a fault shows only the first touch of a
// page where it lies, so a trace of faults alone cannot say what another
// policy would have done with the touches that did not fault. Every
// period, an accessSampler takes up to a sample of a traced client's
// managed pages out of each processor's page table while leaving them in
// their files (arming them), and the next round reads which of them the
// processor mapped again: those it touched (KindAccess), the touch being
// a minor fault that the kernel resolves, or that the server serves
// where the view is registered for minor faults.
//
// Only a process can drop its own page-table entries with MADV_DONTNEED.
// The host view is armed from here with process_madvise(MADV_PAGEOUT):
// reclaim unmaps a file page from the one process mapping it and, with
// nowhere to write a tmpfs page (no swap), leaves it in the file. With
// swap on, that would swap the client's pages out, so the host is not
// armed then. Device processes are ours: they drop their mappings on
// request (MsgDeviceHints), over the pages they map from their own file;
// the pages they map from elsewhere are the access counters' to arm.
// Reading back uses PAGEMAP_SCAN on each process's pagemap.
//
// What it cannot see: a touch between the arming and the scan that
// follows it (the page then looks never unmapped and is not armed), a
// second touch of a page in one window, pages outside the round's
// sample, and touches of pages a view maps from another location's file.
// A page the server maps into a view for its own reasons (a prefetch to
// the CPU maps what it writes; a remap) between two rounds reads as
// touched.

// accessSampler runs the access mode of one traced session.
type accessSampler struct {
	sess   *session
	period time.Duration
	sample uintptr // bytes a view, a whole number of pages
	quit   chan struct{}
	done   chan struct{}
	client *uffd.Process // for process_madvise; nil when not to be had

	// views is by view slot; touched only by the sampler's goroutine.
	views []samplerView
	// warned says which reasons not to arm a view were logged already.
	warned map[string]bool
}

// samplerView is what the sampler knows of one processor's view.
type samplerView struct {
	cursor  uintptr     // where the next round's sample starts
	armedAt time.Time   // when the last round armed
	armed   []armedPage // runs of pages armed then, not mapped right after
}

// armedPage is a run [start, end) of range r.
type armedPage struct {
	r          *managedRange
	start, end uintptr
}

// clientTraceAccess reads the access mode a client recording its own
// trace asks for (UVM_TRACE_ACCESS in its starting environment).
func clientTraceAccess(pid int) (config.TraceAccess, error) {
	text, err := procinfo.Env(pid, TraceAccessEnv)
	if err != nil || text == "" {
		return config.TraceAccess{}, err
	}
	a, err := config.ParseTraceAccess(text)
	if err != nil {
		return a, fmt.Errorf("%s: %w", TraceAccessEnv, err)
	}
	return a, nil
}

// startAccessSampler starts the access mode for a traced session where
// it is asked for. Failing to start is logged: the trace goes on without
// accesses.
func (sess *session) startAccessSampler() {
	a := sess.traceAccess
	if !a.On() || !sess.tracing() {
		return
	}
	if sess.launch != nil {
		sess.srv.logger.Printf("pid %d: the trace's access mode is off under the launch coherence model: unmapping the client's pages would hide its writes from the dirty tracking", sess.pid)
		return
	}
	as := &accessSampler{sess: sess, period: time.Duration(a.Period), sample: uintptr(a.Sample) &^ (core.PageSize - 1),
		quit: make(chan struct{}), done: make(chan struct{}), views: make([]samplerView, len(sess.views)), warned: map[string]bool{}}
	var err error
	as.client, err = uffd.OpenProcess(sess.pid)
	if err != nil {
		as.warnOnce("pidfd", "pid %d: the trace's access mode does not arm the CPU: %v", sess.pid, err)
	}
	sess.sampler = as
	go as.loop()
}

// stopAccessSampler stops the access mode, before the session's views go.
func (sess *session) stopAccessSampler() {
	as := sess.sampler
	if as == nil {
		return
	}
	close(as.quit)
	<-as.done
	if as.client != nil {
		as.client.Close()
	}
}

func (as *accessSampler) warnOnce(key, format string, args ...any) {
	if !as.warned[key] {
		as.warned[key] = true
		as.sess.srv.logger.Printf(format, args...)
	}
}

func (as *accessSampler) loop() {
	defer close(as.done)
	tick := time.NewTicker(as.period)
	defer tick.Stop()
	for {
		select {
		case <-as.quit:
			return
		case <-tick.C:
			as.round()
		}
	}
}

// round reads what each view touched since the last round and arms the
// next sample.
func (as *accessSampler) round() {
	sess := as.sess
	for slot := range sess.views {
		v := sess.views[slot].Load()
		sv := &as.views[slot]
		if v == nil || (v.loc != core.CPU && v.connEnded()) {
			*sv = samplerView{cursor: sv.cursor}
			continue
		}
		pagemap, err := os.Open(fmt.Sprintf("/proc/%d/pagemap", v.pid))
		if err != nil {
			if !errors.Is(err, os.ErrNotExist) {
				as.warnOnce("pagemap", "pid %d: the trace's access mode cannot read the page table of pid %d: %v", sess.pid, v.pid, err)
			}
			*sv = samplerView{cursor: sv.cursor}
			continue
		}
		as.readBack(v, sv, pagemap)
		as.arm(v, sv, pagemap)
		pagemap.Close()
	}
}

// readBack records the pages armed last round that view v maps now.
func (as *accessSampler) readBack(v *view, sv *samplerView, pagemap *os.File) {
	if len(sv.armed) == 0 {
		return
	}
	now := time.Now()
	window := now.Sub(sv.armedAt)
	var present []uffd.PageRun
	for _, ap := range sv.armed {
		if ap.r.Freed.Load() {
			continue
		}
		var err error
		present, err = uffd.ScanPresent(pagemap, ap.start, ap.end, present[:0])
		if err != nil {
			as.warnOnce("scan", "pid %d: the trace's access mode: %v", as.sess.pid, err)
			break
		}
		for _, run := range present {
			as.sess.emitAt(&trace.Event{Kind: trace.KindAccess, Processor: int32(v.loc), Range: ap.r.ID,
				Addr: uint64(run.Start), Pages: uint32((run.End - run.Start) / core.PageSize), Duration: window}, now)
		}
	}
	sv.armed = sv.armed[:0]
}

// arm unmaps the next sample of view v's pages and records which are not
// mapped after it.
func (as *accessSampler) arm(v *view, sv *samplerView, pagemap *os.File) {
	windows := as.nextSample(v, sv)
	if len(windows) == 0 {
		return
	}
	if !as.unmap(v, windows) {
		return
	}
	sv.armedAt = time.Now()
	var present []uffd.PageRun
	for _, w := range windows {
		var err error
		present, err = uffd.ScanPresent(pagemap, w.start, w.end, present[:0])
		if err != nil {
			as.warnOnce("scan", "pid %d: the trace's access mode: %v", as.sess.pid, err)
			sv.armed = sv.armed[:0]
			return
		}
		// The window less what is mapped: mapped pages were touched
		// between the unmapping and now, or are shared with another
		// process (a device mapping the page remotely), which
		// MADV_PAGEOUT leaves alone.
		at := w.start
		for _, p := range append(present, uffd.PageRun{Start: w.end, End: w.end}) {
			if p.Start > at {
				sv.armed = append(sv.armed, armedPage{r: w.r, start: at, end: p.Start})
				as.sess.emitAt(&trace.Event{Kind: trace.KindArm, Processor: int32(v.loc), Range: w.r.ID,
					Addr: uint64(at), Pages: uint32((p.Start - at) / core.PageSize)}, sv.armedAt)
			}
			at = max(at, p.End)
		}
	}
}

// unmap takes the windows out of view v's page table, the pages staying
// in their files. It reports whether anything was unmapped.
func (as *accessSampler) unmap(v *view, windows []armedPage) bool {
	sess := as.sess
	if v.loc == core.CPU {
		if as.client == nil {
			return false
		}
		if swap, err := uffd.SwapTotal(); err == nil && swap > 0 {
			as.warnOnce("swap", "pid %d: the trace's access mode does not arm the CPU while swap is on: unmapping its pages with MADV_PAGEOUT would swap them out", sess.pid)
			return false
		}
		runs := make([]uffd.PageRun, len(windows))
		for i, w := range windows {
			runs[i] = uffd.PageRun{Start: w.start, End: w.end}
		}
		if _, err := as.client.PageOut(runs); err != nil {
			as.warnOnce("pageout", "pid %d: the trace's access mode does not arm the CPU: %v", sess.pid, err)
			return false
		}
		return true
	}
	maps := make([]wire.Mapping, 0, len(windows))
	for _, w := range windows {
		if k := len(maps) - 1; k >= 0 && uintptr(maps[k].Addr+maps[k].Length) == w.start {
			maps[k].Length += uint64(w.end - w.start)
		} else {
			maps = append(maps, wire.Mapping{Addr: uint64(w.start), Length: uint64(w.end - w.start)})
		}
	}
	for len(maps) > 0 {
		n := min(len(maps), maxHintRuns)
		if err := v.request(wire.EncodeDeviceHints(v.seq.Add(1), maps[:n]), wire.MsgDeviceHints); err != nil {
			if !v.connEnded() {
				as.warnOnce(fmt.Sprintf("device %d", v.loc), "pid %d device %d: the trace's access mode: %v", sess.pid, v.loc, err)
			}
			return false
		}
		maps = maps[n:]
	}
	return true
}

// nextSample picks up to the sample's bytes of view v's managed pages,
// from its cursor on, wrapping around once: whole blocks on the host (so
// that reclaim never has a large folio to split), and for a device the
// runs it maps from its own file.
func (as *accessSampler) nextSample(v *view, sv *samplerView) []armedPage {
	sess := as.sess
	budget := as.sample
	var out []armedPage
	add := func(r *managedRange, start, end uintptr) {
		n := min(end-start, budget)
		if n == 0 {
			return
		}
		if k := len(out) - 1; k >= 0 && out[k].r == r && out[k].end == start {
			out[k].end += n
		} else {
			out = append(out, armedPage{r: r, start: start, end: start + n})
		}
		budget -= n
		sv.cursor = start + n
	}
	full := func() bool { return budget == 0 }
	visit := func(r *managedRange, from, to uintptr) {
		if r.Kind != core.KindManaged || (v.loc == core.CPU && r.TrackPrefetch) {
			// Ranges that audit prefetched pages read the host's page
			// table to tell used from unused ones.
			return
		}
		for bi := int((from - r.Start) >> core.BlockShift); bi <= int((to-1-r.Start)>>core.BlockShift) && !full(); bi++ {
			blockAddr := r.Start + uintptr(bi)*core.BlockSize
			first, outer := max(from, blockAddr), min(to, blockAddr+core.BlockSize, r.End())
			if v.loc == core.CPU {
				if first == blockAddr && budget < outer-first {
					if len(out) > 0 {
						budget = 0 // full: this block whole next round, from here
						return
					}
					budget = outer - first // a sample smaller than a block arms one
				}
				add(r, first, outer)
				continue
			}
			b := r.BlockAt(bi)
			if b == nil {
				continue
			}
			b.Lock()
			b.ViewRuns(v.loc, int((first-blockAddr)/core.PageSize), int((outer-blockAddr)/core.PageSize), false, full,
				func(p, q int) { add(r, blockAddr+uintptr(p)*core.PageSize, blockAddr+uintptr(q)*core.PageSize) })
			b.Unlock()
		}
	}
	sess.walkFromCursor(sv.cursor, full, visit)
	if budget > 0 {
		sv.cursor = 0 // everything fit: start from the beginning next time
	}
	return out
}
