package wire

import (
	"errors"
	"fmt"
	"io"
	"net"
	"syscall"

	"github.com/softuvm/softuvm/internal/core"
)

// maxMessageFDs bounds the descriptors one message carries: the most is
// a device hello's reply, with one file per processor.
const maxMessageFDs = core.MaxDevices + 1

// rightsSpace is the room for a control message of maxMessageFDs
// descriptors (syscall.CmsgSpace, which is not a constant: a constant
// lets the buffer live on the stack).
const rightsSpace = syscall.SizeofCmsghdr + (4*maxMessageFDs+7)&^7

// socket is one end of a SOCK_SEQPACKET socket, as one of two kinds: a
// connection of the runtime's network poller (conn), or a descriptor used
// with blocking system calls (fd, see DirectConn). sendMsg and recvMsg
// are the one place where descriptors are packed into and out of
// datagrams (SCM_RIGHTS).
type socket struct {
	conn *net.UnixConn
	fd   int
}

// sendMsg sends b as one datagram, with fds (none: nil).
func (s socket) sendMsg(b []byte, fds []int) error {
	var oob []byte
	if len(fds) > 0 {
		if len(fds) > maxMessageFDs {
			return fmt.Errorf("%w: a message with %d descriptors: at most %d", core.ErrInvalidValue, len(fds), maxMessageFDs)
		}
		oob = syscall.UnixRights(fds...)
	}
	if s.conn != nil {
		_, _, err := s.conn.WriteMsgUnix(b, oob, nil)
		return err
	}
	for {
		err := syscall.Sendmsg(s.fd, b, oob, nil, syscall.MSG_NOSIGNAL)
		if err != syscall.EINTR {
			return err
		}
	}
}

// recvMsg receives one datagram into buf, and keeps at most keep of the
// descriptors that come with it (close-on-exec); it closes the others,
// so that a peer sending more than the caller wants leaks nothing. A
// datagram longer than buf, or with more descriptors than any message
// carries (MSG_CTRUNC), is an error, and leaves no descriptor open. A
// peer that closed its end is ErrPeerGone; other errors are the system
// call's, EAGAIN included (the timeout of a DirectConn).
func (s socket) recvMsg(buf []byte, keep int) ([]byte, []int, error) {
	var oob [rightsSpace]byte
	var n, oobn, flags int
	var err error
	if s.conn != nil {
		// The runtime asks for close-on-exec descriptors by itself.
		n, oobn, flags, _, err = s.conn.ReadMsgUnix(buf, oob[:])
	} else {
		for {
			n, oobn, flags, _, err = syscall.Recvmsg(s.fd, buf, oob[:], syscall.MSG_CMSG_CLOEXEC)
			if err != syscall.EINTR {
				break
			}
		}
	}
	if err != nil {
		if errors.Is(err, io.EOF) || errors.Is(err, net.ErrClosed) || errors.Is(err, syscall.ECONNRESET) {
			return nil, nil, ErrPeerGone
		}
		return nil, nil, err
	}
	var fds []int
	if oobn > 0 {
		// A copy, so that oob stays on the stack: the parser keeps
		// what it is given.
		fds = takeRights(append([]byte(nil), oob[:oobn]...))
	}
	switch {
	case n == 0 && oobn == 0:
		return nil, nil, ErrPeerGone // every message has a header: an empty read is the end of the stream
	case flags&syscall.MSG_CTRUNC != 0:
		CloseFDs(fds)
		return nil, nil, fmt.Errorf("%w: message truncated (MSG_CTRUNC): it carried more than %d descriptors", core.ErrInvalidValue, maxMessageFDs)
	case flags&syscall.MSG_TRUNC != 0:
		CloseFDs(fds)
		return nil, nil, fmt.Errorf("%w: message truncated (MSG_TRUNC): over %d bytes", core.ErrInvalidValue, len(buf))
	}
	if len(fds) > keep {
		CloseFDs(fds[keep:])
		fds = fds[:keep]
	}
	if len(fds) == 0 {
		fds = nil
	}
	return buf[:n], fds, nil
}

// takeRights returns the descriptors of every SCM_RIGHTS message in a
// datagram's control data. Control data the kernel wrote is well formed;
// a message of another kind carries none.
func takeRights(oob []byte) []int {
	msgs, err := syscall.ParseSocketControlMessage(oob)
	if err != nil {
		return nil
	}
	var fds []int
	for i := range msgs {
		if got, err := syscall.ParseUnixRights(&msgs[i]); err == nil {
			fds = append(fds, got...)
		}
	}
	return fds
}
