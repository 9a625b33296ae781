package server

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/softuvm/softuvm/bpf"
	"github.com/softuvm/softuvm/devmem"
	"github.com/softuvm/softuvm/internal/core"
	"github.com/softuvm/softuvm/uffd"
)

type anatomy struct {
	every uint64

	// Halves of sampled faults waiting for the other, and the recording
	// of a joined one; guarded by mu.
	mu        sync.Mutex
	pending   map[anatomyKey]anatomySample
	resumed   map[anatomyKey]time.Duration
	resumedAt map[anatomyKey]time.Time

	samples                                            atomic.Uint64
	toServer, sampling, decision, ioctl, wake, overall core.LiveHistogram
}

type anatomyKey struct {
	tid   int
	entry time.Duration
}

// anatomySample is the server's half of one sampled fault, in
// CLOCK_MONOTONIC time.
type anatomySample struct {
	entry, read, decided, ioctlStart, ioctlEnd time.Duration
	taken                                      time.Time
	tid                                        int
}

func newAnatomy(every uint64) *anatomy {
	return &anatomy{every: every, pending: map[anatomyKey]anatomySample{}, resumed: map[anatomyKey]time.Duration{}, resumedAt: map[anatomyKey]time.Time{}}
}

func monotonicNow() time.Duration { return devmem.MonotonicNow() }

// take reports whether handler h's next fault is sampled: one in every
// of each handler's, counted on the handler's own thread so that the
// fault path touches no shared cache line for it.
func (a *anatomy) take(h *handler) bool {
	h.faultsSeen++
	return h.faultsSeen%a.every == 0
}

// ioctlBegins and ioctlEnds time the resolving ioctl of a sampled fault.
func (s *anatomySample) ioctlBegins() {
	if s.ioctlStart == 0 {
		s.ioctlStart = monotonicNow()
	}
}

func (s *anatomySample) ioctlEnds() { s.ioctlEnd = monotonicNow() }

// ioctlBegins and ioctlEnds mark the resolving ioctl when a handler
// serves a sampled fault on its own thread (h nil: the control path, a
// deferred fault).
func (h *handler) ioctlBegins() {
	if h != nil && h.sampling != nil {
		h.sampling.ioctlBegins()
	}
}

func (h *handler) ioctlEnds() {
	if h != nil && h.sampling != nil {
		h.sampling.ioctlEnds()
	}
}

// serveSampled serves a fault while taking its anatomy: the thread's
// fault entry comes from the eBPF program, which is told to report when
// the thread runs again.
func (h *handler) serveSampled(an *anatomy, m *uffd.Msg, read time.Time) {
	readAt := monotonicNow() - time.Since(read)
	entry, addr, ok := h.srv.Access.Ebpf.Sample(int(m.TID))
	if !ok || addr&^core.PageOffsetMask != m.Address&^core.PageOffsetMask {
		// No entry, or a later fault's: not this fault's anatomy.
		h.sess.serveFaultMsg(h.view, h, &h.fr)
		return
	}
	h.sample = anatomySample{entry: entry, read: readAt, decided: monotonicNow(), tid: int(m.TID)}
	h.sampling = &h.sample
	h.sess.serveFaultMsg(h.view, h, &h.fr)
	// The fault's event (block.EvFault) completed the sample where it was
	// served (finishSample); deferred, it was not.
	h.sampling = nil
}

// finishSample completes the sample of the fault the handler served
// (serverObserver, at the fault's event): the server's half joins the
// eBPF program's report of the thread running again.
func (h *handler) finishSample() {
	s := h.sampling
	h.sampling = nil
	if s.ioctlEnd == 0 {
		return // no single resolving ioctl
	}
	s.taken = time.Now()
	h.srv.Access.anatomy.join(anatomyKey{tid: s.tid, entry: s.entry}, s, 0)
}

// complete takes the eBPF program's report of a sampled thread running
// again.
func (a *anatomy) complete(tid int, entry, resumed time.Duration) {
	a.join(anatomyKey{tid: tid, entry: entry}, nil, resumed)
}

// join matches the two halves of a sampled fault, the server's (s) and
// the eBPF program's (resumed), which arrive in either order: the thread
// may run, and be reported, before the handler is done with the fault.
// Recorded under mu: a snapshot sees all of a sample or none of it.
func (a *anatomy) join(k anatomyKey, s *anatomySample, resumed time.Duration) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if s != nil {
		if r, ok := a.resumed[k]; ok {
			delete(a.resumed, k)
			delete(a.resumedAt, k)
			resumed = r
		} else {
			a.pending[k] = *s
		}
	} else {
		if p, ok := a.pending[k]; ok {
			delete(a.pending, k)
			s = &p
		} else {
			a.resumed[k] = resumed
			a.resumedAt[k] = time.Now()
		}
	}
	if s == nil || resumed == 0 {
		return
	}
	a.toServer.Record(s.read - s.entry)
	a.sampling.Record(s.decided - s.read)
	a.decision.Record(s.ioctlStart - s.decided)
	// The ioctl wakes the thread from inside; on another CPU it may run
	// before the ioctl has returned to the handler. The ioctl's stage
	// ends at whichever comes first, so that the stages add up to the
	// whole, and the wake counts as none.
	a.ioctl.Record(min(s.ioctlEnd, resumed) - s.ioctlStart)
	a.wake.Record(resumed - s.ioctlEnd)
	a.overall.Record(resumed - s.entry)
	a.samples.Add(1)
}

// expire forgets halves whose other half never came: a thread that
// never ran again (it exited), a report of a fault the handler did not
// resolve with one ioctl.
func (a *anatomy) expire(age time.Duration) {
	a.mu.Lock()
	for k, s := range a.pending {
		if time.Since(s.taken) > age {
			delete(a.pending, k)
		}
	}
	for k, at := range a.resumedAt {
		if time.Since(at) > age {
			delete(a.resumed, k)
			delete(a.resumedAt, k)
		}
	}
	a.mu.Unlock()
}

func (a *anatomy) snapshot() *core.FaultAnatomy {
	a.mu.Lock()
	defer a.mu.Unlock()
	return &core.FaultAnatomy{SampleEvery: int(a.every), Samples: a.samples.Load(),
		ToServer: a.toServer.Snapshot(), Sampling: a.sampling.Snapshot(), Decision: a.decision.Snapshot(), Ioctl: a.ioctl.Snapshot(),
		Wake: a.wake.Snapshot(), Total: a.overall.Snapshot()}
}

// readResumes feeds the eBPF program's reports of sampled threads
// running again to the anatomy until the program is closed.
func (s *Server) readResumes() {
	readRing(s, "fault anatomy", s.Access.Ebpf.ReadResume, func(r bpf.Resume) bool {
		s.Access.anatomy.complete(r.TID, r.Entry, r.Resumed)
		return true
	})
}
