package server

import (
	"sync"
	"time"

	"github.com/softuvm/softuvm/internal/procinfo"
)

// Handler placement, measured on this kind of VM (2 CPUs, KVM): a fault
// served on the faulting CPU costs about 8.5 us; one served from the other
// CPU 45-50 us, most of it the cross-CPU wake. A handler blocked in
// read(2) on the faulting CPU wins the race for the message (uffd.Reader),
// but every other handler blocked in read(2) on the same userfaultfd is
// woken too, and waking a thread on an idle CPU costs the faulting thread
// several microseconds here: with a handler waiting on every CPU, the
// median fault took 12-20 us. So a session keeps a handler waiting only on
// the CPUs its threads fault on.
//
// A handler that serves a fault looks up which CPU the faulting thread
// ran on (field 39 of /proc/PID/task/TID/stat, read by
// procinfo.ThreadCPUs and cached per thread for a few milliseconds; the
// file stays open, as opening it cost five system calls to the one
// read) and wakes that CPU's handler if it was parked. A
// handler that served a fault from another CPU and has seen none from its
// own for parkAfter parks itself, as long as another handler waits. Every
// handler starts waiting, so the first faults are served locally wherever
// they come from.
const (
	// parkAfter is how long a handler keeps waiting without a fault from
	// its own CPU.
	parkAfter = 5 * time.Millisecond
	// threadCPUFresh is how long a thread's CPU is trusted before it is
	// read again.
	threadCPUFresh    = 2 * time.Millisecond
	maxTrackedThreads = 4096
)

// placement tracks where a session's threads fault and which handlers
// wait. Used by a session's handlers with HandlersFollow.
type placement struct {
	mu      sync.Mutex
	byCPU   map[int]*handler   // guarded by mu
	waiting int                // handlers not parked, guarded by mu
	threads map[uint32]seenCPU // guarded by mu
	// cpus reads the threads' CPUs; its lock is a leaf, never taken
	// with mu held.
	cpus *procinfo.ThreadCPUs
}

type seenCPU struct {
	cpu int
	at  time.Time
}

func newPlacement(hs []*handler) *placement {
	p := &placement{byCPU: map[int]*handler{}, threads: map[uint32]seenCPU{}, cpus: procinfo.NewThreadCPUs(), waiting: len(hs)}
	for _, h := range hs {
		p.byCPU[h.cpu] = h
	}
	return p
}

// close closes the threads' stat files: the view's handlers have stopped.
func (p *placement) close() { p.cpus.Close() }

// served is called by handler h after serving a fault of thread tid: it
// notes a fault from h's own CPU, or wakes the handler of the thread's
// CPU if that one is parked.
func (p *placement) served(h *handler, pid int, tid uint32, now time.Time) {
	cpu, ok := p.cpuOf(pid, tid, now)
	if !ok {
		return
	}
	if cpu == h.cpu {
		h.lastLocal.Store(now.UnixNano())
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if target := p.byCPU[cpu]; target != nil {
		target.lastLocal.Store(now.UnixNano())
		if target.parked {
			target.parked = false
			p.waiting++
			// A handler is marked parked only just before it waits for
			// this, so the buffer is empty; were it not, the handler
			// would wake anyway, and a send that blocked here would hold
			// mu against every handler.
			select {
			case target.unpark <- struct{}{}:
			default:
			}
		}
	}
}

// parkIfIdle is called by handler h after it served a batch of messages
// with at least one fault: it returns true, marking h parked, if h has
// seen no fault from its own CPU for parkAfter and another handler
// waits. h must then wait for its unpark channel. Deciding once per batch
// keeps each park matched by one wake: a handler that parked while
// serving the rest of its batch, was woken and parked again, consumed the
// first wake and waited on as parked, and the next wake blocked.
func (p *placement) parkIfIdle(h *handler, now time.Time) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if h.parked || now.UnixNano()-h.lastLocal.Load() <= int64(parkAfter) || p.waiting <= 1 {
		return false
	}
	h.parked = true
	p.waiting--
	return true
}

// cpuOf returns the CPU thread tid of process pid last ran on: where it
// faulted, while it waits for the fault.
func (p *placement) cpuOf(pid int, tid uint32, now time.Time) (int, bool) {
	p.mu.Lock()
	seen, ok := p.threads[tid]
	p.mu.Unlock()
	if ok && now.Sub(seen.at) < threadCPUFresh {
		return seen.cpu, true
	}
	cpu, err := p.cpus.Read(pid, tid)
	if err != nil {
		return 0, false
	}
	p.mu.Lock()
	if len(p.threads) >= maxTrackedThreads {
		clear(p.threads)
	}
	p.threads[tid] = seenCPU{cpu: cpu, at: now}
	p.mu.Unlock()
	return cpu, true
}
