package wire

import (
	"errors"
	"fmt"
	"os"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/softuvm/softuvm/internal/core"
)

// directConn is one end of a SOCK_SEQPACKET socket used with blocking
// system calls, outside the Go runtime's network poller: the thread
// waiting for a message is the one the kernel wakes when it arrives,
// instead of a poller thread that then hands the message to a goroutine
// on some other thread. A launch and synchronize is two such round trips
// between the client and a device process, and on a small VM each
// hand-off costs a cross-CPU wake-up (tens of microseconds).
type DirectConn struct {
	Fd     int
	closed atomic.Bool
}

// newDirectConn takes f's descriptor (a SOCK_SEQPACKET socket) and makes
// it blocking.
func NewDirectConn(f *os.File) (*DirectConn, error) {
	fd, err := syscall.Dup(int(f.Fd()))
	f.Close()
	if err != nil {
		return nil, fmt.Errorf("dup socket: %w", err)
	}
	syscall.CloseOnExec(fd)
	if err := syscall.SetNonblock(fd, false); err != nil {
		syscall.Close(fd)
		return nil, fmt.Errorf("make socket blocking: %w", err)
	}
	return &DirectConn{Fd: fd}, nil
}

// directSocketPair returns two connected sockets: this process's end as
// a directConn, the other as a file to hand to a child.
func DirectSocketPair(name string) (*DirectConn, *os.File, error) {
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_SEQPACKET|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, nil, fmt.Errorf("socketpair: %w", err)
	}
	return &DirectConn{Fd: fds[0]}, os.NewFile(uintptr(fds[1]), name), nil
}

// write sends one message.
func (c *DirectConn) Write(b []byte) error { return c.WriteFDs(b, nil) }

// writeFDs sends one message carrying descriptors.
func (c *DirectConn) WriteFDs(b []byte, fds []int) error {
	if err := (socket{fd: c.Fd}).sendMsg(b, fds); err != nil {
		return fmt.Errorf("send: %w", err)
	}
	return nil
}

// read receives one message into buf, waiting at most timeout (0: no
// limit). A closed peer is errPeerGone. Descriptors sent with it are
// closed.
func (c *DirectConn) Read(buf []byte, timeout time.Duration) ([]byte, error) {
	b, _, err := c.read(buf, timeout, 0)
	return b, err
}

// readFDs is read that returns the descriptors the message carries.
func (c *DirectConn) ReadFDs(buf []byte, timeout time.Duration) ([]byte, []int, error) {
	return c.read(buf, timeout, maxMessageFDs)
}

// read receives one message and keeps at most keep of its descriptors.
func (c *DirectConn) read(buf []byte, timeout time.Duration, keep int) ([]byte, []int, error) {
	if timeout > 0 {
		tv := syscall.NsecToTimeval(timeout.Nanoseconds())
		if err := syscall.SetsockoptTimeval(c.Fd, syscall.SOL_SOCKET, syscall.SO_RCVTIMEO, &tv); err != nil {
			return nil, nil, fmt.Errorf("set receive timeout: %w", err)
		}
		defer syscall.SetsockoptTimeval(c.Fd, syscall.SOL_SOCKET, syscall.SO_RCVTIMEO, &syscall.Timeval{})
	}
	b, fds, err := socket{fd: c.Fd}.recvMsg(buf, keep)
	switch {
	case err == nil, errors.Is(err, ErrPeerGone), errors.Is(err, core.ErrInvalidValue):
		return b, fds, err
	case err == syscall.EAGAIN && timeout > 0:
		return nil, nil, fmt.Errorf("no message within %v", timeout)
	case c.closed.Load():
		return nil, nil, ErrPeerGone
	}
	return nil, nil, fmt.Errorf("receive: %w", err)
}

// Close wakes a thread blocked reading (shutdown does, close does not)
// and releases the descriptor.
func (c *DirectConn) Close() error {
	if c.closed.Swap(true) {
		return nil
	}
	syscall.Shutdown(c.Fd, syscall.SHUT_RDWR)
	return syscall.Close(c.Fd)
}
