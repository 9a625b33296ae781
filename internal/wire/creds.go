package wire

import (
	"fmt"
	"net"
	"os"
	"syscall"

	"github.com/softuvm/softuvm/internal/core"
)

// PeerPID accepts only processes of the server's own user, or root,
// and returns the peer's process id. A server's socket permissions already say
// so; this is the second lock.
func PeerPID(c *net.UnixConn) (int, error) {
	raw, err := c.SyscallConn()
	if err != nil {
		return 0, err
	}
	var cred *syscall.Ucred
	var credErr error
	if err := raw.Control(func(fd uintptr) {
		cred, credErr = syscall.GetsockoptUcred(int(fd), syscall.SOL_SOCKET, syscall.SO_PEERCRED)
	}); err != nil {
		return 0, err
	}
	if credErr != nil {
		return 0, fmt.Errorf("peer credentials: %w", credErr)
	}
	if me := uint32(os.Geteuid()); cred.Uid != me && cred.Uid != 0 {
		return 0, fmt.Errorf("peer pid %d runs as uid %d; this server (uid %d) serves only its own user", cred.Pid, cred.Uid, me)
	}
	return int(cred.Pid), nil
}

// DupCloexec returns a duplicate of f's descriptor that this process owns
// (f may be closed), close-on-exec.
func DupCloexec(f *os.File) (int, error) {
	fd, err := syscall.Dup(int(f.Fd()))
	if err != nil {
		return -1, fmt.Errorf("%w: dup: %v", core.ErrInternal, err)
	}
	syscall.CloseOnExec(fd)
	return fd, nil
}
