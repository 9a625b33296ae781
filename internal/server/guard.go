package server

import (
	"net"
	"os"
	"sync"
	"syscall"
	"time"

	"github.com/softuvm/softuvm/internal/core"
	"github.com/softuvm/softuvm/internal/guard"
	"github.com/softuvm/softuvm/internal/wire"
)

// The guard (package internal/guard) is the process beside the server
// that holds a duplicate of every userfaultfd, file, connection,
// listening socket, the staging file and each session's journal, and
// starts a new server that takes over (adopt.go) when this one dies.
// This file is the server's end of it: the link the server sends what
// it gets to, and a new guard the whole state when one dies.

// The guard's messages and modes, as the server's files name them.
const (
	GuardStaging  = guard.OpStaging
	GuardFile     = guard.OpFile
	GuardViewGone = guard.OpViewGone
	GuardEnd      = guard.OpEnd
	modePrivate   = guard.ModePrivate
	ModeDaemon    = guard.ModeDaemon
)

var (
	GuardConfigMsg  = guard.ConfigMsg
	GuardSessionMsg = guard.SessionMsg
	GuardIDMsg      = guard.IDMsg
	GuardLocMsg     = guard.LocMsg
	GuardViewMsg    = guard.ViewMsg
	GuardRecordMsg  = guard.RecordMsg
	// RunGuard is the guard process's main function.
	RunGuard = guard.Run
)

// journal is a session's journal (guard.Journal).
type journal = guard.Journal

// guardLink is the server's end of its guard. Lock order: mu is a leaf
// (taken after session.journalMu by record).
type guardLink struct {
	mu   sync.Mutex
	conn *net.UnixConn // nil once the server quit
	pid  int
	// holding queues messages (with duplicated descriptors) while a new
	// guard is being sent the whole state; flushed after it.
	holding bool
	pending []pendingGuardMsg
	// quitting is set when the server closes or retires: the end of the
	// link is then no reason to start a new guard.
	quitting bool
	done     chan struct{} // closed when the watcher has seen the link end
}

type pendingGuardMsg struct {
	b   []byte
	fds []int
}

// startGuard starts a guard process.
func startGuard() (*guardLink, error) {
	local, remote, err := wire.SocketPair("softuvm-guard")
	if err != nil {
		return nil, err
	}
	cmd, err := wire.Reexec("guard", "softuvm-guard", nil, []*os.File{remote})
	remote.Close()
	if err != nil {
		local.Close()
		return nil, err
	}
	go cmd.Wait()
	return &guardLink{conn: local, pid: cmd.Process.Pid, done: make(chan struct{})}, nil
}

// PID is the guard's process id, 0 without a guard.
func (g *guardLink) PID() int {
	if g == nil {
		return 0
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.pid
}

// send writes one message. The descriptors stay the caller's. A failure
// means the guard is gone: the watcher notices and sends a new one the
// whole state.
func (g *guardLink) send(b []byte, fds ...int) {
	if g == nil {
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.conn == nil {
		return
	}
	if g.holding {
		m := pendingGuardMsg{b: append([]byte(nil), b...)}
		for _, fd := range fds {
			if d, err := syscall.Dup(fd); err == nil {
				syscall.CloseOnExec(d)
				m.fds = append(m.fds, d)
			}
		}
		g.pending = append(g.pending, m)
		return
	}
	wire.WriteMessage(g.conn, b, fds)
}

// quit tells the guard that the server is going away on purpose, and
// waits for it to let go of everything.
func (g *guardLink) quit() {
	if g == nil {
		return
	}
	g.mu.Lock()
	c := g.conn
	g.conn = nil
	g.quitting = true
	g.mu.Unlock()
	if c == nil {
		return
	}
	wire.WriteMessage(c, []byte{guard.OpQuit}, nil)
	select { // the guard closes its end once it has closed what it held
	case <-g.done:
	case <-time.After(2 * time.Second):
	}
	c.Close()
}

// watchGuard waits for the guard link to end; unless the server is
// leaving, the guard died, and a new one gets the whole state.
func (s *Server) watchGuard() {
	g := s.guard
	defer close(g.done)
	buf := make([]byte, 16)
	for {
		g.mu.Lock()
		c := g.conn
		g.mu.Unlock()
		if c == nil {
			return
		}
		for {
			if _, fds, err := wire.ReadMessage(c, buf); err != nil {
				break
			} else {
				wire.CloseFDs(fds)
			}
		}
		g.mu.Lock()
		leaving := g.quitting || g.conn != c
		g.mu.Unlock()
		if leaving {
			return
		}
		select {
		case <-s.done:
			return
		default:
		}
		if err := s.replaceGuard(c); err != nil {
			s.logger.Printf("the guard (pid %d) died and no new one could start: %v; if this server dies too, its clients' data not on the host is lost", g.PID(), err)
			return
		}
	}
}

// replaceGuard starts a new guard and sends it everything the dead one
// held.
func (s *Server) replaceGuard(old *net.UnixConn) error {
	g := s.guard
	dead := g.PID()
	ng, err := startGuard()
	if err != nil {
		return err
	}
	g.mu.Lock()
	g.conn, g.pid, g.holding = ng.conn, ng.pid, true
	g.mu.Unlock()
	old.Close()
	st := s.snapshot()
	defer st.Close()
	g.mu.Lock()
	defer g.mu.Unlock()
	g.holding = false
	err = st.Send(g.conn)
	for _, m := range g.pending {
		if err == nil {
			err = wire.WriteMessage(g.conn, m.b, m.fds)
		}
		wire.CloseFDs(m.fds)
	}
	g.pending = nil
	if err == nil {
		s.logger.Printf("the guard (pid %d) died; a new one (pid %d) holds every session again", dead, g.pid)
	}
	return err
}

// snapshot is the server's state as the guard keeps it, with duplicated
// descriptors (close it after use).
func (s *Server) snapshot() *guard.State {
	st := guard.NewState()
	st.Mode, st.Attempts, st.Config = s.mode, s.cfg.RestartAttempts(), s.cfg.Marshal()
	dup := func(fd int) int {
		d, err := syscall.Dup(fd)
		if err != nil {
			return -1
		}
		syscall.CloseOnExec(d)
		return d
	}
	s.keptMu.Lock()
	for _, kl := range s.keptListeners {
		st.Listeners = append(st.Listeners, guard.Listener{Path: kl.path, FD: dup(wire.RawFD(kl.l))})
	}
	s.keptMu.Unlock()
	st.Staging = dup(s.staging.FD())
	for _, sess := range s.sessionList() {
		client := sess.viewRef(core.CPU)
		if client == nil {
			continue
		}
		ks := &guard.Session{ID: sess.id, PID: sess.pid, Features: uint64(client.uffd.Features()),
			Conn: dup(wire.RawFD(sess.conn)), Uffd: dup(client.uffd.Fd()), Host: dup(sess.host.Fd()),
			Files: map[core.Device]int{}, Views: map[core.Device]*guard.View{}, Journal: guard.NewJournal()}
		client.release()
		sess.filesMu.Lock()
		for d, f := range sess.devFiles {
			if f != nil {
				ks.Files[core.Device(d)] = dup(f.Fd())
			}
		}
		sess.filesMu.Unlock()
		for l := 1; l < len(sess.views); l++ {
			if v := sess.viewRef(core.DeviceAtSlot(l)); v != nil {
				kv := &guard.View{PID: v.pid, Report: -1}
				fds := v.guardFDs()
				kv.Conn, kv.Uffd = dup(fds[0]), dup(fds[1])
				if len(fds) == 3 {
					kv.Report = dup(fds[2])
				}
				ks.Views[core.DeviceAtSlot(l)] = kv
				v.release()
			}
		}
		sess.journalMu.Lock()
		for _, rec := range sess.journal.Records() {
			ks.Journal.Apply(rec)
		}
		sess.journalMu.Unlock()
		st.Sessions[sess.id] = ks
	}
	return st
}

// keepListener gives the guard a copy of a listening socket, so that it
// outlives this server.
func (s *Server) KeepListener(l *net.UnixListener, path string) {
	s.keptMu.Lock()
	s.keptListeners = append(s.keptListeners, keptListenerRef{path: path, l: l})
	s.keptMu.Unlock()
	s.guard.send(append([]byte{guard.OpListener}, path...), wire.RawFD(l))
}

// setMode says whether the guard restarts this server even when no
// session is left (a daemon) or only while clients need it (private).
func (s *Server) setMode(mode byte) {
	s.mode = mode
	s.guard.send(GuardConfigMsg(mode, s.cfg.RestartAttempts(), s.cfg.Marshal()))
}
