package wire

import (
	"net"
	"syscall"
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

// ReadMessage reads one datagram into buf and the descriptors it carries
// (at most maxMessageFDs). A closed peer is ErrPeerGone.
func ReadMessage(c *net.UnixConn, buf []byte) ([]byte, []int, error) {
	return socket{conn: c}.recvMsg(buf, maxMessageFDs)
}

// WriteMessage sends b as one datagram, with fds (none: nil).
func WriteMessage(c *net.UnixConn, b []byte, fds []int) error {
	return socket{conn: c}.sendMsg(b, fds)
}

func CloseFDs(fds []int) {
	for _, fd := range fds {
		syscall.Close(fd)
	}
}
