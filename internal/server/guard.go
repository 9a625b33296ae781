package server

import (
	"net"
	"syscall"

	"github.com/softuvm/softuvm/internal/core"
	"github.com/softuvm/softuvm/internal/guard"
	"github.com/softuvm/softuvm/internal/wire"
)

// The guard (package internal/guard; guard.Link is the server's end) is
// the process beside the server that holds a duplicate of what the
// server owns, and starts a new server that takes over (adopt.go) when
// this one dies. This file is what a new guard is sent (snapshot).

// RunGuard is the guard process's main function.
var RunGuard = guard.Run

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
	s.guard.Send(append([]byte{guard.OpListener}, path...), wire.RawFD(l))
}

// setMode says whether the guard restarts this server even when no
// session is left (a daemon) or only while clients need it (private).
func (s *Server) setMode(mode byte) {
	s.mode = mode
	s.guard.Send(guard.ConfigMsg(mode, s.cfg.RestartAttempts(), s.cfg.Marshal()))
}
