package wire

import (
	"errors"
	"fmt"
	"io"
	"net"
	"syscall"

	"github.com/softuvm/softuvm/internal/core"
)

// rawFD returns c's descriptor, which c keeps owning.
func RawFD(c syscall.Conn) int {
	fd := -1
	if raw, err := c.SyscallConn(); err == nil {
		raw.Control(func(f uintptr) { fd = int(f) })
	}
	return fd
}

// hangUpConn ends a connection for its peer even while another process
// (the guard) holds a descriptor of it, and closes it here.
func HangUpConn(c *net.UnixConn) {
	c.CloseRead()
	c.CloseWrite()
	c.Close()
}

// readMessage reads one datagram and any descriptors it carries.
func ReadMessage(c *net.UnixConn, buf []byte) ([]byte, []int, error) {
	oob := make([]byte, syscall.CmsgSpace(4*4))
	n, oobn, flags, _, err := c.ReadMsgUnix(buf, oob)
	if err != nil {
		if errors.Is(err, io.EOF) || errors.Is(err, net.ErrClosed) || errors.Is(err, syscall.ECONNRESET) {
			return nil, nil, ErrPeerGone
		}
		return nil, nil, err
	}
	var fds []int
	if oobn > 0 {
		msgs, perr := syscall.ParseSocketControlMessage(oob[:oobn])
		if perr == nil {
			for _, m := range msgs {
				got, rerr := syscall.ParseUnixRights(&m)
				if rerr == nil {
					fds = append(fds, got...)
				}
			}
		}
	}
	if n == 0 && oobn == 0 {
		return nil, nil, ErrPeerGone
	}
	if flags&(syscall.MSG_TRUNC|syscall.MSG_CTRUNC) != 0 {
		CloseFDs(fds)
		return buf[:0], nil, fmt.Errorf("%w: message truncated (over %d bytes or too many descriptors)", core.ErrInvalidValue, len(buf))
	}
	return buf[:n], fds, nil
}

func WriteMessage(c *net.UnixConn, b []byte, fds []int) error {
	var oob []byte
	if len(fds) > 0 {
		oob = syscall.UnixRights(fds...)
	}
	_, _, err := c.WriteMsgUnix(b, oob, nil)
	return err
}

func CloseFDs(fds []int) {
	for _, fd := range fds {
		syscall.Close(fd)
	}
}
