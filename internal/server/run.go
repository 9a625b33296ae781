package server

import (
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/softuvm/softuvm/internal/config"
	"github.com/softuvm/softuvm/internal/core"
	"github.com/softuvm/softuvm/internal/guard"
	"github.com/softuvm/softuvm/internal/wire"
)

// ServerProcess is a fault server in a process of its own, serving on
// sockets, as `uvm run` starts one for its program: a server in the
// process that waits for the program would die with it, while this one
// is restarted by its guard if it dies (guard.go) and the program never
// notices.
type ServerProcess struct {
	cmd   *exec.Cmd
	paths []string
	done  chan struct{}
}

const serveSocketsEnv = "SOFTUVM_SERVE_SOCKETS"

// StartServerProcess starts a server configured with cfg that listens on
// each of paths, and returns once it serves.
func StartServerProcess(cfg config.ServerConfig, paths ...string) (*ServerProcess, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if len(paths) == 0 {
		return nil, fmt.Errorf("%w: a server process needs a socket to serve on", core.ErrInvalidValue)
	}
	ready, w, err := os.Pipe()
	if err != nil {
		return nil, fmt.Errorf("%w: %v", core.ErrInitialization, err)
	}
	defer ready.Close()
	cmd, err := wire.Reexec("serve", "softuvm-server", nil, []*os.File{w}, config.ServerConfigEnv+"="+cfg.Marshal(), serveSocketsEnv+"="+strings.Join(paths, ":"))
	w.Close()
	if err != nil {
		return nil, err
	}
	p := &ServerProcess{cmd: cmd, paths: paths, done: make(chan struct{})}
	go func() { cmd.Wait(); close(p.done) }()
	msg, _ := io.ReadAll(ready) // its end closes once it serves, or fails
	if len(msg) > 0 && msg[0] != 'k' {
		<-p.done
		return nil, fmt.Errorf("%w: %s", core.ErrInitialization, strings.TrimSpace(string(msg)))
	}
	if len(msg) == 0 {
		<-p.done
		return nil, fmt.Errorf("%w: the server process exited before it served (%v)", core.ErrInitialization, cmd.ProcessState)
	}
	return p, nil
}

// runServeRole is the main function of a StartServerProcess server:
// fd 3 says when it serves (or why it cannot), and a SIGTERM closes it.
func RunServeRole() int {
	ready := os.NewFile(3, "softuvm-ready")
	fail := func(err error) int {
		fmt.Fprintf(ready, "%v\n", err)
		ready.Close()
		return 1
	}
	cfg, err := config.UnmarshalServerConfig(os.Getenv(config.ServerConfigEnv))
	os.Unsetenv(config.ServerConfigEnv)
	paths := strings.Split(os.Getenv(serveSocketsEnv), ":")
	os.Unsetenv(serveSocketsEnv)
	if err != nil {
		return fail(err)
	}
	signal.Ignore(syscall.SIGINT, syscall.SIGHUP, syscall.SIGQUIT)
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM)
	srv, err := NewServer(cfg)
	if err != nil {
		return fail(err)
	}
	srv.setMode(guard.ModeDaemon)
	for _, p := range paths {
		if err := srv.Listen(p); err != nil {
			srv.Close()
			return fail(err)
		}
	}
	ready.Write([]byte{'k'})
	ready.Close()
	starterGone := parentGone(os.Getppid())
	select {
	case <-sigs:
	case <-srv.Done():
	case <-starterGone:
		// The process that started this server (`uvm run`) ended
		// without closing it: killed with SIGKILL, say, which left this
		// server serving nobody, forever. Its program may still run:
		// serve it to its end, then go.
		for srv.SessionCount() > 0 {
			select {
			case <-sigs:
			case <-srv.Done():
			case <-srv.idle:
				continue
			}
			break
		}
	}
	srv.Close()
	return 0
}

// parentGone returns a channel closed once this process's parent, which
// was parent, has ended: the process was handed to another (init, or a
// subreaper). Checked twice a second: a pidfd would tell at once, but
// raw system calls stay in uffd and memsys, and a server serving nobody
// for half a second more costs nothing.
func parentGone(parent int) <-chan struct{} {
	gone := make(chan struct{})
	go func() {
		for os.Getppid() == parent {
			time.Sleep(500 * time.Millisecond)
		}
		close(gone)
	}()
	return gone
}

// Listen serves clients and monitors on a Unix socket at path (created
// 0600 in a 0700 directory, as `uvm serve`'s) on a goroutine of its own,
// until the server is closed; the socket file is then removed.
func (s *Server) Listen(path string) error {
	l, err := ListenUnix(path)
	if err != nil {
		return err
	}
	s.KeepListener(l, path)
	go func() {
		s.Serve(l)
		os.Remove(path)
	}()
	return nil
}

// Stats returns the server's counters (the server scope, as a monitor's
// ServerStats): every session's, the ended ones included. It first
// waits for the faults being served now.
func (s *Server) Stats() core.Stats {
	s.quiesce()
	return s.counters().Snapshot()
}

// counters sums the server's statistics: the ended sessions' and each
// live session's.
func (s *Server) counters() *core.Counters {
	total := core.NewCounters(s.eng.Locations())
	s.sessionsMu.Lock()
	defer s.sessionsMu.Unlock()
	total.AddFrom(s.retired)
	for _, sess := range s.sessions {
		total.AddFrom(sess.counters(nil))
	}
	return total
}

// Monitor connects to the server as a monitor (whichever process serves
// now: a server restarted by the guard serves the same sockets).
func (p *ServerProcess) Monitor() (*wire.Monitor, error) { return wire.ConnectMonitor(p.paths[0]) }

// Close stops the server serving now, which ends its guard, and waits
// for it to exit.
func (p *ServerProcess) Close() error {
	m, err := p.Monitor()
	if err != nil {
		p.cmd.Process.Signal(syscall.SIGTERM)
		return nil
	}
	pid := m.ServerPID()
	m.Close()
	if err := syscall.Kill(pid, syscall.SIGTERM); err != nil {
		return nil
	}
	deadline := time.Now().Add(10 * time.Second)
	for syscall.Kill(pid, 0) == nil && time.Now().Before(deadline) {
		if pid == p.cmd.Process.Pid {
			select {
			case <-p.done:
				return nil
			case <-time.After(10 * time.Second):
				return fmt.Errorf("%w: the server (pid %d) did not exit on SIGTERM", core.ErrInternal, pid)
			}
		}
		time.Sleep(5 * time.Millisecond) // not our child: nothing to wait on
	}
	return nil
}
