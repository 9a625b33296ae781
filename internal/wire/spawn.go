package wire

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"syscall"

	"github.com/softuvm/softuvm/internal/config"
	"github.com/softuvm/softuvm/internal/core"
)

// socketPair returns two connected SOCK_SEQPACKET sockets.
func SocketPair(name string) (local *net.UnixConn, remote *os.File, err error) {
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_SEQPACKET|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, nil, fmt.Errorf("socketpair: %w", err)
	}
	lf := os.NewFile(uintptr(fds[0]), name)
	defer lf.Close()
	c, err := net.FileConn(lf)
	if err != nil {
		syscall.Close(fds[1])
		return nil, nil, fmt.Errorf("socketpair: %w", err)
	}
	return c.(*net.UnixConn), os.NewFile(uintptr(fds[1]), name), nil
}

// reexec starts this program's binary in a role, with extra as fds 3, 4...,
// writing to log (nil: this process's standard error).
func Reexec(role, argv0 string, log *os.File, extra []*os.File, env ...string) (*exec.Cmd, error) {
	cmd := exec.Command("/proc/self/exe")
	cmd.Args = []string{argv0}
	cmd.Env = append(append(os.Environ(), config.RoleEnv+"="+role), env...)
	cmd.ExtraFiles = extra
	if log == nil {
		log = os.Stderr
	}
	cmd.Stdout, cmd.Stderr = log, log
	// Its own process group: a Ctrl-C meant for the program must not
	// kill the server under it (the server exits when its client does).
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("%w: start %s process (%s): %v", core.ErrInitialization, role, argv0, err)
	}
	return cmd, nil
}
