package server

import (
	"errors"
	"fmt"
	"runtime"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/softuvm/softuvm/devmem"
	"github.com/softuvm/softuvm/internal/block"
	"github.com/softuvm/softuvm/internal/config"
	"github.com/softuvm/softuvm/internal/core"
	"github.com/softuvm/softuvm/uffd"
)

// handler is one fault-serving thread of one session: one per CPU, pinned
// to it and blocked in read(2) on the session's userfaultfd. The kernel
// wakes every waiting handler when a fault arrives; the one on the
// faulting CPU runs first, because the faulting thread has just gone to
// sleep there, and takes the message inside the kernel (see uffd.Reader
// for why read(2) and not epoll). With HandlersFollow, handlers on CPUs
// where the session's threads do not fault park (placement.go).
type handler struct {
	srv    *Server
	sess   *session
	view   *view // the view whose faults it serves; alive while it runs
	cpu    int   // -1 when unpinned
	reader *uffd.Reader
	done   chan struct{}
	stop   chan struct{}

	// With HandlersFollow (see placement.go):
	place     *placement
	unpark    chan struct{} // capacity 1
	parked    bool          // guarded by place.mu
	lastLocal atomic.Int64  // unix ns of the last fault from this CPU

	// Owned by the handler's thread. Scratch space, so that serving a
	// fault allocates nothing: garbage collection in the server competes
	// with the client for CPUs.
	msgs    [16]uffd.Msg
	fr      faultRequest
	scratch block.Scratch
	staging []byte
	// The fault being sampled for the anatomy, if any, and the faults
	// this handler has seen (anatomy.go).
	sample     anatomySample
	sampling   *anatomySample
	faultsSeen uint64
}

// handlerCPUs returns the CPUs handler threads go on; -1 is unpinned.
func (s *Server) handlerCPUs() ([]int, error) {
	if s.cfg.Handlers == config.HandlersSingle {
		return []int{-1}, nil
	}
	cpus, err := devmem.OnlineCPUs()
	if err != nil {
		return nil, fmt.Errorf("%w: list CPUs for handler threads: %v", core.ErrInitialization, err)
	}
	return cpus, nil
}

// watch starts a view's handler threads.
func (s *Server) watch(v *view) error {
	var hs []*handler
	for _, cpu := range s.cpus {
		r, err := v.uffd.NewReader()
		if err != nil {
			return fmt.Errorf("%w: %v", core.ErrInitialization, err)
		}
		hs = append(hs, &handler{srv: s, sess: v.sess, view: v, cpu: cpu, reader: r, done: make(chan struct{}),
			stop: make(chan struct{}), unpark: make(chan struct{}, 1)})
	}
	if s.cfg.Handlers == config.HandlersFollow && len(hs) > 1 {
		p := newPlacement(hs)
		for _, h := range hs {
			h.place = p
		}
	}
	for _, h := range hs {
		ready := make(chan error, 1)
		go h.run(ready)
		if err := <-ready; err != nil {
			s.unwatch(v)
			return fmt.Errorf("%w: handler thread on CPU %d: %v", core.ErrInitialization, h.cpu, err)
		}
		v.handlers = append(v.handlers, h)
	}
	return nil
}

// unwatch stops a view's handler threads; afterwards none of them uses
// its userfaultfd.
func (s *Server) unwatch(v *view) {
	for _, h := range v.handlers {
		close(h.stop)
	}
	for _, h := range v.handlers {
		if err := h.reader.Stop(5 * time.Second); err != nil {
			s.logger.Printf("pid %d: %v", v.pid, err)
			continue
		}
		<-h.done
	}
	if len(v.handlers) > 0 && v.handlers[0].place != nil {
		v.handlers[0].place.close()
	}
	v.handlers = nil
}

func (h *handler) run(ready chan<- error) {
	defer close(h.done)
	defer h.reader.Release()
	defer func() {
		if h.staging != nil {
			h.srv.staging.Put(h.staging)
			h.staging = nil
		}
	}()
	// The thread stays locked for its life: it is pinned, and when the
	// goroutine returns the runtime retires the thread with it.
	runtime.LockOSThread()
	if h.cpu >= 0 {
		if err := devmem.PinCurrentThread(h.cpu); err != nil {
			ready <- err
			return
		}
	}
	ready <- nil
	h.lastLocal.Store(time.Now().UnixNano())
	for {
		readFrom := time.Now()
		n, err := h.reader.Read(h.msgs[:])
		if errors.Is(err, uffd.ErrStopped) {
			return
		}
		if err != nil && n == 0 {
			h.srv.logger.Printf("read userfaultfd of pid %d: %v", h.view.pid, err)
			if errors.Is(err, syscall.EBADF) {
				// Closed under it: nothing will ever be read again, and
				// retrying would only repeat this line every millisecond.
				return
			}
			time.Sleep(time.Millisecond)
			continue
		}
		faults := false
		read := time.Now()
		for i := 0; i < n; i++ {
			h.serve(&h.msgs[i], readFrom, read)
			if h.place != nil && h.msgs[i].Event == uffd.EventPagefault {
				h.place.served(h, h.view.pid, h.msgs[i].TID, time.Now())
				faults = true
			}
		}
		if faults && h.place.parkIfIdle(h, time.Now()) {
			select {
			case <-h.unpark:
			case <-h.stop:
				return
			}
		}
	}
}

func (h *handler) serve(m *uffd.Msg, readFrom, read time.Time) {
	if m.Event != uffd.EventPagefault {
		h.sess.event(h.view, m)
		return
	}
	h.fr = faultRequestOf(m, readFrom, read)
	if an := h.srv.Access.anatomy; an != nil && an.take(h) {
		h.serveSampled(an, m, read)
		return
	}
	h.sess.serveFaultMsg(h.view, h, &h.fr)
}
