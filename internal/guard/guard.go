package guard

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"sort"
	"syscall"
	"time"

	"github.com/softuvm/softuvm/internal/config"
	"github.com/softuvm/softuvm/internal/core"
	"github.com/softuvm/softuvm/internal/device"
	"github.com/softuvm/softuvm/internal/wire"
	"github.com/softuvm/softuvm/uffd"
)

// Server to guard (and guard to a new server, the same messages), one
// SOCK_SEQPACKET datagram each; numbers little-endian:
const (
	OpConfig   = 'C' // mode(1: 'p' private, 'd' daemon) restart attempts(4) the config, JSON
	OpListener = 'L' // the socket's path; fd: the listening socket
	OpStaging  = 'W' // fd: the staging file
	OpSession  = 'S' // id(8) pid(4) features(8); fds: control socket, userfaultfd, host file
	OpFile     = 'F' // id(8) location(1); fd: the session's file of that location
	OpView     = 'V' // id(8) location(1) pid(4); fds: the device connection, its userfaultfd, and its report socket where it reports to a trace
	OpViewGone = 'v' // id(8) location(1)
	OpRecord   = 'R' // id(8) then a Journal record
	OpEnd      = 'E' // id(8): the session ended
	OpQuit     = 'Q' // the server is closing cleanly: exit
	OpRetire   = 'X' // fd: a socket to the server that replaces this one
	OpReady    = 'K' // a new server to the guard: adoption done
	OpHandover = 'T' // died(8, unix ns) restarts(4) guard pid(4): ends a handover to a new server
)

const (
	ModePrivate = 'p'
	ModeDaemon  = 'd'
)

// State is everything the guard holds, and everything a new server
// receives from it.
type State struct {
	Mode      byte
	Attempts  int
	Config    string
	Listeners []Listener
	Staging   int
	Sessions  map[uint64]*Session
}

type Listener struct {
	Path string
	FD   int
}

type Session struct {
	ID       uint64
	PID      int
	Features uint64
	Conn     int
	Uffd     int
	Host     int
	Files    map[core.Device]int
	Views    map[core.Device]*View
	Journal  *Journal
}

type View struct {
	PID  int
	Conn int
	Uffd int
	// Report is the server's end of the process's report socket
	// (launches and synchronizations for a trace), -1 if it has none.
	Report int
}

// FDs are the view's descriptors as OpView carries them.
func (v *View) FDs() []int {
	if v.Report >= 0 {
		return []int{v.Conn, v.Uffd, v.Report}
	}
	return []int{v.Conn, v.Uffd}
}

func (v *View) Close() {
	wire.CloseFDs([]int{v.Conn, v.Uffd})
	if v.Report >= 0 {
		syscall.Close(v.Report)
	}
}

func NewState() *State {
	return &State{Staging: -1, Sessions: map[uint64]*Session{}, Attempts: config.DefaultRestartAttempts}
}

func ConfigMsg(mode byte, attempts int, config string) []byte {
	b := binary.LittleEndian.AppendUint32([]byte{OpConfig, mode}, uint32(int32(attempts)))
	return append(b, config...)
}

func SessionMsg(id uint64, pid int, features uint64) []byte {
	b := binary.LittleEndian.AppendUint64([]byte{OpSession}, id)
	b = binary.LittleEndian.AppendUint32(b, uint32(pid))
	return binary.LittleEndian.AppendUint64(b, features)
}

func IDMsg(op byte, id uint64) []byte { return binary.LittleEndian.AppendUint64([]byte{op}, id) }

func LocMsg(op byte, id uint64, l core.Device) []byte {
	return append(IDMsg(op, id), byte(int8(l)))
}

func ViewMsg(id uint64, l core.Device, pid int) []byte {
	return binary.LittleEndian.AppendUint32(LocMsg(OpView, id, l), uint32(pid))
}

func RecordMsg(id uint64, rec []byte) []byte { return append(IDMsg(OpRecord, id), rec...) }

// HandoverEnd is what the last message of a handover says.
type HandoverEnd struct {
	Died     time.Time // when the guard saw the server before die
	Restarts int       // servers that died or retired, that one included
	GuardPID int
}

// runGuard is the guard process's main function.
func Run() int {
	signal.Ignore(syscall.SIGINT, syscall.SIGHUP, syscall.SIGTERM, syscall.SIGPIPE)
	// The guard is small and holds what every client needs: never the
	// process the OOM killer chooses (where this user may say so).
	os.WriteFile("/proc/self/oom_score_adj", []byte("-1000"), 0)
	link, err := device.FileConn(3)
	if err != nil {
		fmt.Fprintf(os.Stderr, "softuvm guard: %v\n", err)
		return 2
	}
	g := &guard{st: NewState(), serverPID: os.Getppid()}
	return g.run(link)
}

type guard struct {
	st        *State
	serverPID int
	restarts  int
	// readyAt is when the server now running took over; quickDeaths
	// counts the servers in a row that died soon after it (a server that
	// cannot live, not one that was killed once).
	readyAt     time.Time
	quickDeaths int
	// server is the server the guard started, and exited closed once it
	// has been waited for; nil for the first server (the guard's parent).
	server *exec.Cmd
	exited chan struct{}
}

// quickDeath is how soon after taking over an exit counts against the
// restart attempts. A server killed by a signal (SIGKILL, the OOM
// killer) never does: only one that fails by itself.
const quickDeath = 250 * time.Millisecond

// poisonFault answers a fault no server will serve. A write to a page
// held still by write protection (a move the dead server began) finds
// the page's data in place: the protection is lifted. A MINOR fault is
// on a page the process's file holds: it is mapped. Any other fault is
// on a hole, a page that is not in this process's file: poison.
func poisonFault(u *uffd.FD, m *uffd.Msg) {
	addr := uintptr(m.Address) &^ core.PageOffsetMask
	if m.Flags&uffd.PagefaultWP != 0 {
		if err := u.WriteProtect(addr, core.PageSize, false, false); err == nil {
			return
		}
	}
	if m.Flags&uffd.PagefaultMinor != 0 {
		if _, err := u.Continue(addr, core.PageSize, 0); err == nil || errors.Is(err, uffd.ErrExist) {
			u.Wake(addr, core.PageSize)
			return
		}
	}
	if _, err := u.Poison(addr, core.PageSize, false); err != nil {
		// Filled meanwhile, or protected: let it retry.
		u.WriteProtect(addr, core.PageSize, false, true)
		u.Wake(addr, core.PageSize)
	}
}

// wakeAll wakes every thread of u's process blocked in a fault: on each
// range the Journal knows, and, for faults on ranges it does not, the
// whole address space.
func wakeAll(u *uffd.FD, j *Journal) {
	for addr, msg := range j.allocs {
		_, req, _ := wire.ParseRequest(msg)
		u.Wake(uintptr(addr), uintptr(req.(wire.AllocRequest).Length))
	}
	const wakeStart, wakeLen = 1 << 16, 1<<47 - 2<<16
	u.Wake(wakeStart, wakeLen)
}

// hangUp ends a connection for its peer even while other descriptors of
// it stay open.
func hangUp(fd int) {
	syscall.Shutdown(fd, syscall.SHUT_RDWR)
	syscall.Close(fd)
}

// notifyClient writes msg on the standard error of process pid.
func notifyClient(pid int, msg string) {
	f, err := os.OpenFile(fmt.Sprintf("/proc/%d/fd/2", pid), os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		return
	}
	f.WriteString(msg)
	f.Close()
}

// apply takes one message into the state. It owns fds: they are kept or
// closed, never leaked, whatever the message.
func (st *State) Apply(b []byte, fds []int) error {
	keep := false
	defer func() {
		if !keep {
			wire.CloseFDs(fds)
		}
	}()
	bad := func(what string) error {
		return fmt.Errorf("%w: guard message %q: %s (%d bytes, %d descriptors)", core.ErrInvalidValue, b[0], what, len(b), len(fds))
	}
	if len(b) == 0 {
		return fmt.Errorf("%w: empty guard message", core.ErrInvalidValue)
	}
	le := binary.LittleEndian
	body := b[1:]
	var ks *Session
	if b[0] == OpFile || b[0] == OpView || b[0] == OpViewGone || b[0] == OpRecord || b[0] == OpEnd {
		if len(body) < 8 {
			return bad("no session id")
		}
		ks = st.Sessions[le.Uint64(body)]
		if ks == nil {
			return nil // a session that ended, or one never kept (monitors)
		}
	}
	switch b[0] {
	case OpConfig:
		if len(body) < 5 || len(fds) != 0 {
			return bad("want mode, attempts and the config")
		}
		st.Mode, st.Attempts, st.Config = body[0], int(int32(le.Uint32(body[1:]))), string(body[5:])
	case OpListener:
		if len(fds) != 1 {
			return bad("want one descriptor")
		}
		st.Listeners = append(st.Listeners, Listener{Path: string(body), FD: fds[0]})
	case OpStaging:
		if len(fds) != 1 {
			return bad("want one descriptor")
		}
		if st.Staging >= 0 {
			syscall.Close(st.Staging)
		}
		st.Staging = fds[0]
	case OpSession:
		if len(body) != 20 || len(fds) != 3 {
			return bad("want id, pid, features and three descriptors")
		}
		id := le.Uint64(body)
		if old := st.Sessions[id]; old != nil {
			old.Close()
		}
		st.Sessions[id] = &Session{ID: id, PID: int(le.Uint32(body[8:])), Features: le.Uint64(body[12:]),
			Conn: fds[0], Uffd: fds[1], Host: fds[2], Files: map[core.Device]int{}, Views: map[core.Device]*View{}, Journal: NewJournal()}
	case OpFile:
		if len(body) != 9 || len(fds) != 1 {
			return bad("want id, location and one descriptor")
		}
		l := core.Device(int8(body[8]))
		if old, ok := ks.Files[l]; ok {
			syscall.Close(old)
		}
		ks.Files[l] = fds[0]
	case OpView:
		if len(body) != 13 || len(fds) != 2 && len(fds) != 3 {
			return bad("want id, location, pid and two or three descriptors")
		}
		l := core.Device(int8(body[8]))
		if old := ks.Views[l]; old != nil {
			old.Close()
		}
		v := &View{PID: int(le.Uint32(body[9:])), Conn: fds[0], Uffd: fds[1], Report: -1}
		if len(fds) == 3 {
			v.Report = fds[2]
		}
		ks.Views[l] = v
	case OpViewGone:
		if len(body) != 9 {
			return bad("want id and location")
		}
		if old := ks.Views[core.Device(int8(body[8]))]; old != nil {
			old.Close()
			delete(ks.Views, core.Device(int8(body[8])))
		}
	case OpRecord:
		return ks.Journal.Apply(body[8:])
	case OpEnd:
		ks.Close()
		delete(st.Sessions, ks.ID)
	default:
		return bad("unknown message")
	}
	keep = true
	return nil
}

func (ks *Session) Close() {
	wire.CloseFDs([]int{ks.Conn, ks.Uffd, ks.Host})
	for _, fd := range ks.Files {
		syscall.Close(fd)
	}
	for _, v := range ks.Views {
		v.Close()
	}
}

func (st *State) Close() {
	for _, ks := range st.Sessions {
		ks.Close()
	}
	st.Sessions = map[uint64]*Session{}
	for _, l := range st.Listeners {
		syscall.Close(l.FD)
	}
	st.Listeners = nil
	if st.Staging >= 0 {
		syscall.Close(st.Staging)
		st.Staging = -1
	}
}

// sessionIDs returns the sessions in the order they were made.
func (st *State) SessionIDs() []uint64 {
	ids := make([]uint64, 0, len(st.Sessions))
	for id := range st.Sessions {
		ids = append(ids, id)
	}
	sort.Slice(ids, func(i, j int) bool { return ids[i] < ids[j] })
	return ids
}

// send writes the whole state to c, as a handover or to a new guard.
func (st *State) Send(c *net.UnixConn) error {
	if err := wire.WriteMessage(c, ConfigMsg(st.Mode, st.Attempts, st.Config), nil); err != nil {
		return err
	}
	for _, l := range st.Listeners {
		if err := wire.WriteMessage(c, append([]byte{OpListener}, l.Path...), []int{l.FD}); err != nil {
			return err
		}
	}
	if st.Staging >= 0 {
		if err := wire.WriteMessage(c, []byte{OpStaging}, []int{st.Staging}); err != nil {
			return err
		}
	}
	for _, id := range st.SessionIDs() {
		ks := st.Sessions[id]
		if err := wire.WriteMessage(c, SessionMsg(id, ks.PID, ks.Features), []int{ks.Conn, ks.Uffd, ks.Host}); err != nil {
			return err
		}
		for l, fd := range ks.Files {
			if err := wire.WriteMessage(c, LocMsg(OpFile, id, l), []int{fd}); err != nil {
				return err
			}
		}
		for l, v := range ks.Views {
			if err := wire.WriteMessage(c, ViewMsg(id, l, v.PID), v.FDs()); err != nil {
				return err
			}
		}
		for _, rec := range ks.Journal.Records() {
			if err := wire.WriteMessage(c, RecordMsg(id, rec), nil); err != nil {
				return err
			}
		}
	}
	return nil
}

// receiveHandover reads a handover into st, up to its end.
func (st *State) ReceiveHandover(c *net.UnixConn) (HandoverEnd, error) {
	buf := make([]byte, wire.MaxMessageSize)
	le := binary.LittleEndian
	for {
		b, fds, err := wire.ReadMessage(c, buf)
		if err != nil {
			return HandoverEnd{}, fmt.Errorf("handover: %w", err)
		}
		if len(b) == 17 && b[0] == OpHandover {
			wire.CloseFDs(fds)
			return HandoverEnd{Died: time.Unix(0, int64(le.Uint64(b[1:]))), Restarts: int(le.Uint32(b[9:])), GuardPID: int(le.Uint32(b[13:]))}, nil
		}
		if err := st.Apply(b, fds); err != nil {
			return HandoverEnd{}, fmt.Errorf("handover: %w", err)
		}
	}
}

func (g *guard) logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "softuvm guard[%d]: %s\n", os.Getpid(), fmt.Sprintf(format, args...))
}

func (g *guard) run(link *net.UnixConn) int {
	for {
		successor, quit := g.follow(link)
		link.Close()
		if quit {
			g.st.Close()
			return 0
		}
		died := time.Now()
		if g.failedQuickly(died) {
			g.quickDeaths++
		} else {
			g.quickDeaths = 0
		}
		if g.st.Mode != ModeDaemon && len(g.st.Sessions) == 0 {
			g.st.Close() // a private server whose clients are all gone
			return 0
		}
		if successor != nil {
			if err := g.handover(successor, died); err == nil {
				link = successor
				g.readyAt, g.quickDeaths = time.Now(), 0
				g.server, g.exited = nil, nil // not the guard's child: no exit status to read
				continue
			} else {
				g.logf("the replacement server did not take over: %v", err)
				successor.Close()
			}
		}
		next, why := g.restart(died)
		if next == nil {
			if len(g.st.Sessions) == 0 {
				g.logf("no server took over (%s), and none has clients: exiting", why)
				g.st.Close()
				return 1
			}
			g.poison(why)
			return 1
		}
		link = next
		g.readyAt = time.Now()
	}
}

// failedQuickly reports whether the server whose link just ended exited
// by itself (not by a signal) soon after it took over.
func (g *guard) failedQuickly(died time.Time) bool {
	if g.server == nil || g.readyAt.IsZero() || died.Sub(g.readyAt) >= quickDeath {
		return false
	}
	select {
	case <-g.exited:
	case <-time.After(time.Second):
		return false
	}
	ws, ok := g.server.ProcessState.Sys().(syscall.WaitStatus)
	return ok && !ws.Signaled()
}

// follow keeps the state the server sends until the link ends. It
// returns the successor's socket if the server retired for one, and quit
// if the server closed cleanly.
func (g *guard) follow(link *net.UnixConn) (successor *net.UnixConn, quit bool) {
	buf := make([]byte, wire.MaxMessageSize)
	for {
		b, fds, err := wire.ReadMessage(link, buf)
		if err != nil {
			if !errors.Is(err, wire.ErrPeerGone) {
				g.logf("server link: %v", err)
			}
			return successor, false
		}
		switch {
		case len(b) == 1 && b[0] == OpQuit:
			wire.CloseFDs(fds)
			return nil, true
		case len(b) == 1 && b[0] == OpReady:
			wire.CloseFDs(fds)
		case len(b) == 1 && b[0] == OpRetire && len(fds) == 1:
			c, err := device.FileConn(uintptr(fds[0]))
			if err != nil {
				g.logf("successor socket: %v", err)
				continue
			}
			successor = c
		default:
			if err := g.st.Apply(b, fds); err != nil {
				g.logf("%v", err)
			}
		}
	}
}

// handover sends the state to a new server and waits until it has taken
// over.
func (g *guard) handover(c *net.UnixConn, died time.Time) error {
	if err := g.st.Send(c); err != nil {
		return err
	}
	end := binary.LittleEndian.AppendUint64([]byte{OpHandover}, uint64(died.UnixNano()))
	end = binary.LittleEndian.AppendUint32(end, uint32(g.restarts+1))
	end = binary.LittleEndian.AppendUint32(end, uint32(os.Getpid()))
	if err := wire.WriteMessage(c, end, nil); err != nil {
		return err
	}
	// Changes the new server makes while adopting arrive before its
	// ready.
	c.SetReadDeadline(time.Now().Add(config.AdoptTimeout))
	defer c.SetReadDeadline(time.Time{})
	buf := make([]byte, wire.MaxMessageSize)
	for {
		b, fds, err := wire.ReadMessage(c, buf)
		if err != nil {
			return fmt.Errorf("before it was ready: %w", err)
		}
		if len(b) == 1 && b[0] == OpReady {
			g.restarts++
			return nil
		}
		if err := g.st.Apply(b, fds); err != nil {
			g.logf("%v", err)
		}
	}
}

// restart starts new servers until one takes over, with back-off, and
// returns its link; or nil and why none did.
func (g *guard) restart(died time.Time) (*net.UnixConn, string) {
	if g.st.Attempts <= 0 {
		return nil, "restarts are off"
	}
	var last error
	if g.quickDeaths > 0 {
		last = fmt.Errorf("%d servers in a row died within %v of taking over", g.quickDeaths, quickDeath)
	}
	for attempt := g.quickDeaths; attempt < g.st.Attempts; attempt++ {
		if attempt > 0 {
			time.Sleep(config.RestartBackoff << min(attempt-1, 5))
		}
		local, remote, err := wire.SocketPair("softuvm-guard")
		if err != nil {
			last = err
			continue
		}
		// The configuration tells the new process whether the policies
		// it names are registered when package uvm initializes, or only
		// once the program's main calls uvm.Main (uvm/spawn.go).
		cmd, err := wire.Reexec("adopt", "softuvm-server", nil, []*os.File{remote}, config.ServerConfigEnv+"="+g.st.Config)
		remote.Close()
		if err != nil {
			local.Close()
			last = err
			continue
		}
		exited := make(chan struct{})
		go func() { cmd.Wait(); close(exited) }()
		if err := g.handover(local, died); err != nil {
			cmd.Process.Kill()
			<-exited
			local.Close()
			last = err
			g.logf("new server (pid %d, attempt %d of %d) did not take over: %v", cmd.Process.Pid, attempt+1, g.st.Attempts, err)
			continue
		}
		g.serverPID, g.server, g.exited = cmd.Process.Pid, cmd, exited
		return local, ""
	}
	return nil, fmt.Sprintf("%d new servers in a row failed to take over (the last: %v)", g.st.Attempts, last)
}

// poison serves the kept sessions' faults with poison until their
// processes exit.
func (g *guard) poison(why string) {
	st := g.st
	for _, l := range st.Listeners {
		syscall.Close(l.FD)
	}
	st.Listeners = nil
	p, err := uffd.NewPoller()
	if err != nil {
		g.logf("%v", err)
		return
	}
	defer p.Close()
	type watched struct {
		pid int
		u   *uffd.FD
		id  uint64
	}
	var all []*watched
	for _, id := range st.SessionIDs() {
		ks := st.Sessions[id]
		hangUp(ks.Conn)
		notifyClient(ks.PID, fmt.Sprintf("softuvm: the fault server of this process (pid %d) exited and no new server took over (%s); managed memory that was not on the host is lost, and touching it now raises SIGBUS (bus error)\n", g.serverPID, why))
		ws := []*watched{{pid: ks.PID, u: uffd.NewFD(ks.Uffd), id: id}}
		for _, v := range ks.Views {
			hangUp(v.Conn)
			if v.Report >= 0 {
				hangUp(v.Report) // its next report fails, and it stops reporting
				v.Report = -1
			}
			ws = append(ws, &watched{pid: v.PID, u: uffd.NewFD(v.Uffd), id: id})
		}
		for _, w := range ws {
			// The server read in blocking mode; epoll needs nonblocking.
			w.u.SetNonblock(true)
			p.Add(w.u, uint64(len(all)))
			all = append(all, w)
			wakeAll(w.u, ks.Journal)
		}
	}
	msgs := make([]uffd.Msg, 16)
	keys := make([]uint64, 0, 16)
	live := len(all)
	for live > 0 {
		ready, _, err := p.Wait(keys[:0], 200*time.Millisecond)
		if err != nil {
			return
		}
		for _, k := range ready {
			w := all[k]
			if w == nil {
				continue
			}
			n, _ := w.u.ReadMessages(msgs)
			for _, m := range msgs[:n] {
				if m.Event == uffd.EventFork {
					wire.CloseFDs([]int{m.ChildFD})
				}
				if m.Event != uffd.EventPagefault {
					continue
				}
				poisonFault(w.u, &m)
			}
		}
		for i, w := range all {
			if w != nil && syscall.Kill(w.pid, 0) == syscall.ESRCH {
				p.Remove(w.u)
				w.u.Close()
				all[i] = nil
				live--
			}
		}
	}
}
