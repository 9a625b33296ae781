package server

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"

	"github.com/softuvm/softuvm/internal/config"
	"github.com/softuvm/softuvm/internal/core"
	"github.com/softuvm/softuvm/internal/guard"
)

// ListenAndServe runs a daemon on the socket at path until a SIGINT or
// SIGTERM: `uvm serve`.
func ListenAndServe(cfg config.ServerConfig, path string, ready func(*Server)) error {
	srv, err := NewServer(cfg)
	if err != nil {
		return err
	}
	defer srv.Close()
	l, err := ListenUnix(path)
	if err != nil {
		return err
	}
	defer os.Remove(path)
	srv.setMode(guard.ModeDaemon)
	srv.KeepListener(l, path)
	srv.handleReplaceSignal([]string{path})
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	defer signal.Stop(sigs)
	go func() {
		select {
		case <-sigs:
			srv.Close()
		case <-srv.Done():
		}
	}()
	if ready != nil {
		ready(srv)
	}
	return srv.Serve(l)
}

// listenUnix listens on path with owner-only permissions, in a directory
// only the owner can enter. A socket file left by a dead server is
// replaced; one a live server answers on is an error.
func ListenUnix(path string) (*net.UnixListener, error) {
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("%w: socket directory %s: %v", core.ErrInitialization, dir, err)
	}
	if fi, err := os.Stat(dir); err == nil && fi.Mode().Perm()&0o077 != 0 && dir != os.TempDir() {
		os.Chmod(dir, 0o700)
	}
	removeStaleMonitors(dir)
	if _, err := os.Lstat(path); err == nil {
		if c, err := net.Dial("unixpacket", path); err == nil {
			c.Close()
			return nil, fmt.Errorf("%w: a fault server already listens on %s", core.ErrInitialization, path)
		}
		os.Remove(path)
	}
	old := syscall.Umask(0o177)
	l, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: path, Net: "unixpacket"})
	syscall.Umask(old)
	if err != nil {
		return nil, fmt.Errorf("%w: listen on %s: %v", core.ErrInitialization, path, err)
	}
	l.SetUnlinkOnClose(false)
	if err := os.Chmod(path, 0o600); err != nil && !errors.Is(err, os.ErrNotExist) {
		l.Close()
		return nil, fmt.Errorf("%w: chmod %s: %v", core.ErrInitialization, path, err)
	}
	return l, nil
}

// removeStaleMonitors removes from dir the monitor sockets of private
// servers (config.PrivateServerSocketPath: uvm-PID.sock) whose process
// PID is gone and on which nobody listens. A server that exits removes
// its own, but one killed with SIGKILL, or with the process it served,
// leaves it behind; the restart tests and benchmarks kill hundreds, and
// /run is memory. A socket whose process is gone but whose server still
// listens (an orphaned `uvm run` server) is kept: `uvm stat` finds it
// there.
func removeStaleMonitors(dir string) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return
	}
	for _, e := range entries {
		var pid int
		if _, err := fmt.Sscanf(e.Name(), "uvm-%d.sock", &pid); err != nil || pid <= 0 || e.Name() != fmt.Sprintf("uvm-%d.sock", pid) {
			continue
		}
		if err := syscall.Kill(pid, 0); !errors.Is(err, syscall.ESRCH) {
			continue // alive, or not ours to ask about
		}
		path := filepath.Join(dir, e.Name())
		if c, err := net.Dial("unixpacket", path); err == nil {
			c.Close()
			continue
		}
		os.Remove(path)
	}
}
