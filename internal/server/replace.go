package server

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/softuvm/softuvm/devmem"
	"github.com/softuvm/softuvm/internal/block"
	"github.com/softuvm/softuvm/internal/config"
	"github.com/softuvm/softuvm/internal/core"
	"github.com/softuvm/softuvm/internal/guard"
	"github.com/softuvm/softuvm/internal/wire"
)

// ReplaceDaemon makes this process the daemon serving path in place of
// the one running there, with its configuration (which adjust, if not
// nil, may change: the metrics' address), and serves until a SIGINT or
// SIGTERM, as ListenAndServe does. ready is called once it serves.
func ReplaceDaemon(path string, adjust func(*config.ServerConfig), ready func(*Server)) error {
	m, err := wire.ConnectMonitor(path)
	if err != nil {
		return err
	}
	old := m.ServerPID()
	local, remote, err := wire.SocketPair("softuvm-successor")
	if err != nil {
		m.Close()
		return err
	}
	fd, err := wire.DupCloexec(remote)
	remote.Close()
	if err != nil {
		m.Close()
		local.Close()
		return err
	}
	_, err = m.RequestFDs(wire.NewMessage(wire.Header{Typ: wire.MsgReplace, Seq: m.NextSeq()}).B, wire.MsgReplace, []int{fd})
	syscall.Close(fd)
	m.Close()
	if err != nil {
		local.Close()
		return fmt.Errorf("the daemon at %s (pid %d) refused to retire: %w", path, old, err)
	}
	srv, paths, err := takeOver(local, adjust)
	if err != nil {
		return fmt.Errorf("take over from the daemon at %s (pid %d): %w", path, old, err)
	}
	defer func() {
		srv.Close()
		for _, p := range paths {
			os.Remove(p)
		}
	}()
	srv.serveAsDaemon(paths, ready)
	return nil
}

// ServeMetrics serves the statistics of server s at addr in the
// Prometheus text format for as long as the process runs, as `uvm serve
// --metrics` does. This package does not include the endpoint: the
// program that does (package cli) sets it, and a server that takes a
// daemon over, or replaces it, serves the daemon's metrics
// (ServerConfig.Metrics) with it.
var ServeMetrics func(s *Server, addr string, anyAddress bool) error

// takeOver reads a handover from the guard on link and serves what it
// holds: the sessions, and the listeners (whose paths it returns). adjust,
// if not nil, changes the configuration taken over.
func takeOver(link *net.UnixConn, adjust func(*config.ServerConfig)) (*Server, []string, error) {
	st := guard.NewState()
	end, err := st.ReceiveHandover(link)
	if err != nil {
		st.Close()
		return nil, nil, err
	}
	cfg, err := config.UnmarshalServerConfig(st.Config)
	if err != nil {
		st.Close()
		return nil, nil, fmt.Errorf("the dead server's configuration: %w", err)
	}
	adjusted := false
	if adjust != nil {
		before := cfg.Marshal()
		adjust(&cfg)
		adjusted = cfg.Marshal() != before
	}
	var area *block.Staging
	if st.Staging >= 0 {
		f, err := devmem.FileFromFD(st.Staging, "staging file")
		st.Staging = -1
		if err == nil {
			area, err = block.MapStaging(f)
		}
		if err != nil {
			st.Close()
			return nil, nil, fmt.Errorf("staging file: %w", err)
		}
	}
	g := guard.AdoptLink(link, end.GuardPID)
	srv, err := newServer(cfg, serverStart{guard: g, staging: area, mode: st.Mode, attempts: st.Attempts})
	if err != nil {
		st.Close()
		return nil, nil, err
	}
	srv.adopt(st, end.Died, end.Restarts)
	var paths []string
	for _, kl := range st.Listeners {
		l, err := listenerFromFD(kl.FD)
		if err != nil {
			srv.logger.Printf("listener %s: %v", kl.Path, err)
			continue
		}
		srv.keptMu.Lock()
		srv.keptListeners = append(srv.keptListeners, keptListenerRef{path: kl.Path, l: l})
		srv.keptMu.Unlock()
		paths = append(paths, kl.Path)
		go srv.Serve(l)
	}
	st.Listeners = nil
	if adjusted {
		srv.setMode(st.Mode) // the guard keeps the configuration as changed
	}
	g.Send([]byte{guard.OpReady})
	srv.logger.Printf("took over from a server that ended %v ago (restart %d): %d sessions, %d pages adopted, %d put back from the staging file, %d whole-block moves settled",
		time.Since(end.Died).Round(time.Millisecond), end.Restarts, srv.SessionCount(), srv.restart.adoptedPages.Load(), srv.restart.recoveredPages.Load(), srv.restart.settledMoves.Load())
	if cfg.Metrics != "" {
		err := errors.New("this program does not include them")
		if ServeMetrics != nil {
			err = ServeMetrics(srv, cfg.Metrics, cfg.MetricsAnyAddress)
		}
		if err != nil {
			srv.logger.Printf("the daemon's metrics at %s are not served: %v", cfg.Metrics, err)
		}
	}
	return srv, paths, nil
}

// serveAsDaemon serves as the daemon at paths until a SIGINT or SIGTERM,
// or until the server closes; SIGUSR2 starts its replacement. ready is
// called once it serves.
func (s *Server) serveAsDaemon(paths []string, ready func(*Server)) {
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	defer signal.Stop(sigs)
	s.handleReplaceSignal(paths)
	if ready != nil {
		ready(s)
	}
	select {
	case <-sigs:
	case <-s.Done():
	}
}

// retireStopTimeout bounds how long a retiring server waits for its
// handler threads to stop reading before it exits.
const retireStopTimeout = 10 * time.Second

// retire hands this server's place to the process at the other end of
// successor: the guard gets the socket, the handler threads stop, and the
// process exits without ending any session.
func (s *Server) retire(successor int) error {
	if s.guard == nil {
		return fmt.Errorf("%w: this server runs without a guard, which a replacement needs", core.ErrNotSupported)
	}
	if s.mode != guard.ModeDaemon {
		return fmt.Errorf("%w: only a daemon (uvm serve) is replaced in place", core.ErrNotSupported)
	}
	go func() {
		// After the reply has gone out.
		time.Sleep(10 * time.Millisecond)
		s.guard.Retire(successor)
		syscall.Close(successor)
		stopped := make(chan struct{})
		go func() {
			for _, sess := range s.sessionList() {
				for l := range sess.views {
					if v := sess.views[l].Load(); v != nil {
						s.unwatch(v)
					}
				}
			}
			close(stopped)
		}()
		select {
		case <-stopped:
			s.logger.Printf("retiring: a new server takes over")
		case <-time.After(retireStopTimeout):
			// A handler busy with a fault that cannot end (it waits on
			// a peer) would keep this process, and so the guard's link
			// that the successor waits for, alive for ever. The new
			// server wakes every thread blocked in a fault, so the
			// faults it leaves are served again.
			s.logger.Printf("retiring: handler threads still busy after %v; leaving them to the new server", retireStopTimeout)
		}
		os.Exit(0)
	}()
	return nil
}

// handleReplaceSignal makes SIGUSR2 start `uvm serve --replace` from this
// server's binary, which takes over from it.
func (s *Server) handleReplaceSignal(paths []string) {
	if len(paths) == 0 {
		return
	}
	exe, err := os.Executable()
	if err != nil {
		return
	}
	exe = strings.TrimSuffix(exe, " (deleted)")
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGUSR2)
	go func() {
		for range sigs {
			cmd := exec.Command(exe, "serve", "--replace", "--socket", paths[0])
			cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
			cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
			if err := cmd.Start(); err != nil {
				s.logger.Printf("SIGUSR2: start %s serve --replace: %v", exe, err)
				continue
			}
			go cmd.Wait()
		}
	}()
}
