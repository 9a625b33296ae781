package guard

import (
	"net"
	"os"
	"sync"
	"syscall"
	"time"

	"github.com/softuvm/softuvm/internal/wire"
)

// Link is the server's end of its guard: the messages that keep the
// guard's copy of the state (Send), the end of the server (Quit, Retire),
// and a new guard sent the whole state when this one dies (Watch). Lock
// order: mu is a leaf (the server sends its journal records under the
// session's journal lock). Its methods do nothing on a nil Link, a
// server without a guard.
type Link struct {
	mu   sync.Mutex
	conn *net.UnixConn // nil once the server quit
	pid  int
	// holding queues messages (with duplicated descriptors) while a new
	// guard is being sent the whole state; flushed after it.
	holding bool
	pending []pendingMsg
	// quitting is set when the server closes or retires: the end of the
	// link is then no reason to start a new guard.
	quitting bool
	done     chan struct{} // closed when Watch has seen the link end
}

type pendingMsg struct {
	b   []byte
	fds []int
}

// Start starts a guard process and returns the link to it.
func Start() (*Link, error) {
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
	return &Link{conn: local, pid: cmd.Process.Pid, done: make(chan struct{})}, nil
}

// AdoptLink is the link of a server that took over, on the socket the
// guard (pid) handed the state over.
func AdoptLink(conn *net.UnixConn, pid int) *Link {
	return &Link{conn: conn, pid: pid, done: make(chan struct{})}
}

// PID is the guard's process id, 0 without a guard.
func (g *Link) PID() int {
	if g == nil {
		return 0
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.pid
}

// Send writes one message. The descriptors stay the caller's. A failure
// means the guard is gone: Watch notices and sends a new one the whole
// state.
func (g *Link) Send(b []byte, fds ...int) {
	if g == nil {
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.conn == nil {
		return
	}
	if g.holding {
		m := pendingMsg{b: append([]byte(nil), b...)}
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

// Quit tells the guard that the server is going away on purpose, and
// waits for it to let go of everything.
func (g *Link) Quit() {
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
	wire.WriteMessage(c, []byte{OpQuit}, nil)
	select { // the guard closes its end once it has closed what it held
	case <-g.done:
	case <-time.After(2 * time.Second):
	}
	c.Close()
}

// Retire hands the guard the socket of the server that replaces this one
// (successor, which stays the caller's): the end of this link is then no
// death.
func (g *Link) Retire(successor int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.quitting = true
	if g.conn != nil {
		wire.WriteMessage(g.conn, []byte{OpRetire}, []int{successor})
	}
}

// Watch waits for the link to end; unless the server is leaving (done
// closed, Quit or Retire), the guard died, and a new one is started and
// sent the whole state, snapshot's (closed after), with the messages sent
// meanwhile after it. logf says what happened.
func (g *Link) Watch(done <-chan struct{}, snapshot func() *State, logf func(format string, args ...any)) {
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
		case <-done:
			return
		default:
		}
		if err := g.replace(c, snapshot, logf); err != nil {
			logf("the guard (pid %d) died and no new one could start: %v; if this server dies too, its clients' data not on the host is lost", g.PID(), err)
			return
		}
	}
}

// replace starts a new guard and sends it everything the dead one held.
func (g *Link) replace(old *net.UnixConn, snapshot func() *State, logf func(format string, args ...any)) error {
	dead := g.PID()
	ng, err := Start()
	if err != nil {
		return err
	}
	g.mu.Lock()
	g.conn, g.pid, g.holding = ng.conn, ng.pid, true
	g.mu.Unlock()
	old.Close()
	st := snapshot()
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
		logf("the guard (pid %d) died; a new one (pid %d) holds every session again", dead, g.pid)
	}
	return err
}
