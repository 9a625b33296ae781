package uffd

import (
	"errors"
	"math"
	"strconv"
	"time"

	"golang.org/x/sys/unix"
)

// WakeupKey is reserved: Poller uses it for its own eventfd, so Add refuses
// it.
const WakeupKey = math.MaxUint64

// maxPollEvents bounds one Wait, so that its event buffer fits on the stack.
const maxPollEvents = 64

// Poller waits for messages on many FDs with epoll, level-triggered and
// not exclusive: when several Pollers hold the same FD (one per handler
// thread), a pending message wakes all of them, the first ReadMessages takes
// it and the others read 0 messages. FDs must be NonBlock, both because the
// kernel reports a blocking userfaultfd as always in error to epoll and so
// that the losers of that race do not block.
//
// Add, Remove and Wakeup may be called from any goroutine; Wait from one
// goroutine at a time; Close only once nobody else uses the Poller.
type Poller struct {
	epfd int // -1 after Close
	efd  int // eventfd behind Wakeup
}

// NewPoller creates an empty Poller.
func NewPoller() (*Poller, error) {
	epfd, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		return nil, pollerError("create", -1, err)
	}
	efd, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		unix.Close(epfd)
		return nil, pollerError("create eventfd", -1, err)
	}
	p := &Poller{epfd: epfd, efd: efd}
	if err := p.ctl(unix.EPOLL_CTL_ADD, efd, WakeupKey); err != nil {
		p.Close()
		return nil, pollerError("add eventfd", efd, err)
	}
	return p, nil
}

func pollerError(op string, fd int, err error) error {
	e := &OpError{Op: "poller " + op, noRange: true, Err: err}
	if fd >= 0 {
		e.detail = "fd " + strconv.Itoa(fd)
	}
	return e
}

// ctl stores key in the epoll data, split over the two 32-bit fields x/sys
// declares for it; the kernel returns the 64 bits unchanged.
func (p *Poller) ctl(op, fd int, key uint64) error {
	ev := unix.EpollEvent{Events: unix.EPOLLIN, Fd: int32(uint32(key)), Pad: int32(uint32(key >> 32))}
	return unix.EpollCtl(p.epfd, op, fd, &ev)
}

func eventKey(ev *unix.EpollEvent) uint64 {
	return uint64(uint32(ev.Fd)) | uint64(uint32(ev.Pad))<<32
}

// Add watches f; Wait reports key when f has messages pending. key must not
// be WakeupKey, and f must have been opened with NonBlock.
func (p *Poller) Add(f *FD, key uint64) error {
	if key == WakeupKey {
		return pollerError("add", f.fd, errors.New("key WakeupKey is reserved for Wakeup"))
	}
	fl, err := unix.FcntlInt(uintptr(f.fd), unix.F_GETFL, 0)
	if err != nil {
		return pollerError("add", f.fd, err)
	}
	if fl&unix.O_NONBLOCK == 0 {
		e := pollerError("add", f.fd, unix.EINVAL).(*OpError)
		e.hint = "the userfaultfd is blocking; epoll reports a blocking userfaultfd as always in error: open it with NonBlock"
		return e
	}
	if err := p.ctl(unix.EPOLL_CTL_ADD, f.fd, key); err != nil {
		return pollerError("add", f.fd, err)
	}
	return nil
}

// Remove stops watching f. Closing f also removes it.
func (p *Poller) Remove(f *FD) error {
	if err := unix.EpollCtl(p.epfd, unix.EPOLL_CTL_DEL, f.fd, nil); err != nil {
		return pollerError("remove", f.fd, err)
	}
	return nil
}

// Wait blocks until at least one FD has messages pending, Wakeup is called,
// or the timeout passes (negative: no timeout; zero: do not block). It
// appends the keys of the ready FDs to keys[:0] and returns them; woken
// reports a Wakeup. At most 64 FDs are reported per call, fewer if cap(keys)
// is smaller; the others stay ready for the next call. It does not allocate
// when keys has room.
func (p *Poller) Wait(keys []uint64, timeout time.Duration) (ready []uint64, woken bool, err error) {
	ready = keys[:0]
	var events [maxPollEvents]unix.EpollEvent
	limit := maxPollEvents
	if c := cap(keys); c > 0 && c+1 < limit {
		limit = c + 1 // one more for the eventfd
	}
	var deadline time.Time
	if timeout > 0 {
		deadline = time.Now().Add(timeout)
	}
	for {
		n, err := unix.EpollWait(p.epfd, events[:limit], timeoutMillis(timeout))
		if err == unix.EINTR {
			if timeout > 0 {
				if timeout = time.Until(deadline); timeout <= 0 {
					return ready, false, nil
				}
			}
			continue
		}
		if err != nil {
			return ready, false, pollerError("wait", p.epfd, err)
		}
		for i := range n {
			key := eventKey(&events[i])
			if key == WakeupKey {
				woken = true
				p.drainWakeup()
				continue
			}
			ready = append(ready, key)
		}
		return ready, woken, nil
	}
}

// timeoutMillis rounds up, so that a short positive timeout still waits.
func timeoutMillis(d time.Duration) int {
	switch {
	case d < 0:
		return -1
	case d == 0:
		return 0
	}
	ms := (d + time.Millisecond - 1) / time.Millisecond
	if ms > math.MaxInt32 {
		return -1
	}
	return int(ms)
}

func (p *Poller) drainWakeup() {
	var buf [8]byte
	unix.Read(p.efd, buf[:]) // EAGAIN: another Wait drained it first
}

// Wakeup makes a Wait in another goroutine return with woken set (or the
// next Wait, if none is waiting).
func (p *Poller) Wakeup() error {
	var buf [8]byte
	native.PutUint64(buf[:], 1)
	for {
		_, err := unix.Write(p.efd, buf[:])
		switch err {
		case nil, unix.EAGAIN: // EAGAIN: the counter is full, a wakeup is pending anyway
			return nil
		case unix.EINTR:
			continue
		}
		return pollerError("wakeup", p.efd, err)
	}
}

// Close releases the Poller; the FDs it watched stay open. Closing twice is
// not an error.
func (p *Poller) Close() error {
	if p.epfd < 0 {
		return nil
	}
	err1 := unix.Close(p.epfd)
	err2 := unix.Close(p.efd)
	p.epfd, p.efd = -1, -1
	if err := errors.Join(err1, err2); err != nil {
		return pollerError("close", -1, err)
	}
	return nil
}
