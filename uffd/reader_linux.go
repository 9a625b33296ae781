package uffd

import (
	"errors"
	"fmt"
	"os"
	"os/signal"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Reader reads messages with read(2) blocking on a userfaultfd, on one
// locked OS thread, and can be stopped from another goroutine.
//
// Why block in read(2) rather than wait in epoll: when a fault arrives the
// kernel wakes every waiter. A thread blocked in read(2) takes the message
// off the queue inside the kernel as soon as it runs, and the waiter
// pinned to the faulting CPU runs first, because the faulting thread has
// just gone to sleep there. A thread woken from epoll must first return to
// user space and call read(2), which gives a waiter on another CPU time to
// take the message, and then the fault is resolved across CPUs, several
// times slower on a VM.
//
// A thread blocked in read(2) on a userfaultfd is woken by nothing but a
// message or a signal, and the Go runtime installs its signal handlers
// with SA_RESTART, which restarts the read. Stop therefore sends a
// real-time signal whose handler has SA_RESTART cleared (the Go runtime's
// handler is kept, so the signal is consumed normally), and repeats it
// until the reader has returned.
type Reader struct {
	f      *FD
	tid    atomic.Int32
	stop   atomic.Bool
	exited chan struct{}
	once   sync.Once
}

// ErrStopped is returned by Reader.Read after Stop.
var ErrStopped = errors.New("uffd: reader stopped")

// InterruptSignal is the signal Stop uses. It must not be reset or
// ignored by the program (signal.Reset, signal.Ignore), which would
// restore SA_RESTART.
const InterruptSignal = syscall.Signal(58) // SIGRTMIN+24 with glibc's numbering

var interruptSetup = sync.OnceValue(func() error {
	ch := make(chan os.Signal, 64)
	signal.Notify(ch, InterruptSignal)
	go func() {
		for range ch { // consume: the point was to interrupt a read
		}
	}()
	// struct kernel_sigaction on 64-bit Linux.
	type sigaction struct {
		handler  uintptr
		flags    uint64
		restorer uintptr
		mask     uint64
	}
	const saRestart = 0x10000000
	var act sigaction
	if _, _, e := unix.RawSyscall6(unix.SYS_RT_SIGACTION, uintptr(InterruptSignal), 0, uintptr(unsafe.Pointer(&act)), 8, 0, 0); e != 0 {
		return fmt.Errorf("uffd: read the action of signal %d: %w", InterruptSignal, e)
	}
	act.flags &^= saRestart
	if _, _, e := unix.RawSyscall6(unix.SYS_RT_SIGACTION, uintptr(InterruptSignal), uintptr(unsafe.Pointer(&act)), 0, 8, 0, 0); e != 0 {
		return fmt.Errorf("uffd: clear SA_RESTART on signal %d: %w", InterruptSignal, e)
	}
	return nil
})

// NewReader returns a reader of f, which must be blocking (opened without
// NonBlock, or SetNonblock(false)).
func (f *FD) NewReader() (*Reader, error) {
	if err := interruptSetup(); err != nil {
		return nil, err
	}
	return &Reader{f: f, exited: make(chan struct{})}, nil
}

// Read waits for messages and reads up to len(msgs) (at most 64) of them.
// Call it from one goroutine locked to its thread (runtime.LockOSThread):
// Stop signals that thread. After Stop it returns 0, ErrStopped. It does
// not allocate.
func (r *Reader) Read(msgs []Msg) (int, error) {
	if r.tid.Load() == 0 {
		r.tid.Store(int32(unix.Gettid()))
	}
	var buf [maxReadMsgs * MsgSize]byte
	b := buf[:min(len(msgs), maxReadMsgs)*MsgSize]
	for {
		if r.stop.Load() {
			r.once.Do(func() { close(r.exited) })
			return 0, ErrStopped
		}
		n, err := unix.Read(r.f.fd, b)
		switch err {
		case nil:
		case unix.EINTR:
			continue
		case unix.EAGAIN:
			return 0, &OpError{Op: "read", noRange: true, Err: err, hint: "the reader needs a blocking userfaultfd"}
		default:
			return 0, &OpError{Op: "read", noRange: true, Err: err}
		}
		count := n / MsgSize
		var firstErr error
		for i := range count {
			msgs[i] = Msg{}
			if err := decodeMsg(&msgs[i], (*[MsgSize]byte)(b[i*MsgSize:])); err != nil && firstErr == nil {
				firstErr = err
			}
		}
		return count, firstErr
	}
}

// Release tells the reader that its owner will not call Read again (it
// left its loop while not reading): Stop then returns at once.
func (r *Reader) Release() { r.once.Do(func() { close(r.exited) }) }

// Stop makes Read return ErrStopped and waits until it has, or until
// timeout passes. A reader that never called Read, or was released, is
// stopped at once.
func (r *Reader) Stop(timeout time.Duration) error {
	r.stop.Store(true)
	deadline := time.Now().Add(timeout)
	for {
		tid := r.tid.Load()
		if tid == 0 {
			r.once.Do(func() { close(r.exited) })
		}
		select {
		case <-r.exited:
			return nil
		default:
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("uffd: reader on thread %d did not stop within %v", tid, timeout)
		}
		if tid != 0 {
			// Resent until the reader leaves: the first may land before
			// it entered read(2).
			_ = unix.Tgkill(unix.Getpid(), int(tid), unix.Signal(InterruptSignal))
		}
		select {
		case <-r.exited:
			return nil
		case <-time.After(2 * time.Millisecond):
		}
	}
}

// SetNonblock sets or clears O_NONBLOCK on the userfaultfd's open file,
// which every process holding it shares.
func (f *FD) SetNonblock(nonblock bool) error {
	if err := unix.SetNonblock(f.fd, nonblock); err != nil {
		return &OpError{Op: "set nonblock", noRange: true, Err: err}
	}
	return nil
}
