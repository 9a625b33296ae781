package server

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"sort"
	"sync"
	"syscall"
	"time"

	"github.com/softuvm/softuvm/internal/config"
	"github.com/softuvm/softuvm/internal/core"
	"github.com/softuvm/softuvm/internal/device"
	"github.com/softuvm/softuvm/internal/wire"
	"github.com/softuvm/softuvm/uffd"
)

// The guard is a small process the server starts beside itself, and the
// reason no managed memory depends on one server process staying alive.
// From the moment each exists it holds a duplicate of:
//
//   - every listening socket (a daemon's, a private server's monitor
//     socket), so that clients connecting while no server runs wait in
//     the backlog instead of failing;
//   - every client's control socket (the server's end) and every device
//     process's server connection, so that no peer ever sees the server
//     go away;
//   - every userfaultfd (the client's, each device process's), so that
//     the kernel never unregisters a range and lets holes fill with zeros;
//   - every location file (host and device files) and the staging file,
//     where migrations in flight keep the pages they carry (staging.go);
//   - each session's journal: its ranges and advice (journal.go).
//
// When the server dies (killed, crashed, or retiring for a replacement),
// the guard starts a new one and hands it all of this (adopt.go): the new
// server rebuilds residency from the files, wakes every thread left in a
// fault, and tells each client that its pending request may have been
// lost, so that it sends it again. Programs see a pause.
//
// When no server can take over (restarts are off, or new servers keep
// failing), the guard serves the faults itself, with poison: a thread
// touching a page that is not on the host gets SIGBUS, and a message on
// its standard error says why; pages on the host stay readable. Every
// peer's connection is hung up, so calls fail with ErrServerGone.
//
// If the guard dies, the server starts a new one and sends it everything
// again. Only the death of both at once loses what was not on the host.
//
// Server to guard (and guard to a new server, the same messages), one
// SOCK_SEQPACKET datagram each; numbers little-endian:
const (
	guardConfig   = 'C' // mode(1: 'p' private, 'd' daemon) restart attempts(4) the config, JSON
	guardListener = 'L' // the socket's path; fd: the listening socket
	GuardStaging  = 'W' // fd: the staging file
	guardSession  = 'S' // id(8) pid(4) features(8); fds: control socket, userfaultfd, host file
	GuardFile     = 'F' // id(8) location(1); fd: the session's file of that location
	guardView     = 'V' // id(8) location(1) pid(4); fds: the device connection, its userfaultfd
	GuardViewGone = 'v' // id(8) location(1)
	guardRecord   = 'R' // id(8) then a journal record
	GuardEnd      = 'E' // id(8): the session ended
	GuardQuit     = 'Q' // the server is closing cleanly: exit
	guardRetire   = 'X' // fd: a socket to the server that replaces this one
	guardReady    = 'K' // a new server to the guard: adoption done
	guardHandover = 'T' // died(8, unix ns) restarts(4) guard pid(4): ends a handover to a new server
)

const (
	modePrivate = 'p'
	ModeDaemon  = 'd'
)

// keptState is everything the guard holds, and everything a new server
// receives from it.
type keptState struct {
	mode      byte
	attempts  int
	config    string
	listeners []keptListener
	staging   int
	Sessions  map[uint64]*KeptSession
}

type keptListener struct {
	path string
	fd   int
}

type KeptSession struct {
	Id       uint64
	pid      int
	features uint64
	Conn     int
	Uffd     int
	Host     int
	Files    map[core.Device]int
	Views    map[core.Device]*KeptView
	Journal  *journal
}

type KeptView struct {
	pid  int
	conn int
	uffd int
}

func NewKeptState() *keptState {
	return &keptState{staging: -1, Sessions: map[uint64]*KeptSession{}, attempts: config.DefaultRestartAttempts}
}

func GuardConfigMsg(mode byte, attempts int, config string) []byte {
	b := binary.LittleEndian.AppendUint32([]byte{guardConfig, mode}, uint32(int32(attempts)))
	return append(b, config...)
}

func GuardSessionMsg(id uint64, pid int, features uint64) []byte {
	b := binary.LittleEndian.AppendUint64([]byte{guardSession}, id)
	b = binary.LittleEndian.AppendUint32(b, uint32(pid))
	return binary.LittleEndian.AppendUint64(b, features)
}

func GuardIDMsg(op byte, id uint64) []byte { return binary.LittleEndian.AppendUint64([]byte{op}, id) }

func GuardLocMsg(op byte, id uint64, l core.Device) []byte {
	return append(GuardIDMsg(op, id), byte(int8(l)))
}

func GuardViewMsg(id uint64, l core.Device, pid int) []byte {
	return binary.LittleEndian.AppendUint32(GuardLocMsg(guardView, id, l), uint32(pid))
}

func GuardRecordMsg(id uint64, rec []byte) []byte { return append(GuardIDMsg(guardRecord, id), rec...) }

// handoverEnd is what the last message of a handover says.
type handoverEnd struct {
	died     time.Time // when the guard saw the server before die
	restarts int       // servers that died or retired, that one included
	guardPID int
}

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

// runGuard is the guard process's main function.
func RunGuard() int {
	signal.Ignore(syscall.SIGINT, syscall.SIGHUP, syscall.SIGTERM, syscall.SIGPIPE)
	// The guard is small and holds what every client needs: never the
	// process the OOM killer chooses (where this user may say so).
	os.WriteFile("/proc/self/oom_score_adj", []byte("-1000"), 0)
	link, err := device.FileConn(3)
	if err != nil {
		fmt.Fprintf(os.Stderr, "softuvm guard: %v\n", err)
		return 2
	}
	g := &guard{st: NewKeptState(), serverPID: os.Getppid()}
	return g.run(link)
}

type guard struct {
	st        *keptState
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
// range the journal knows, and, for faults on ranges it does not, the
// whole address space.
func wakeAll(u *uffd.FD, j *journal) {
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
func (st *keptState) Apply(b []byte, fds []int) error {
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
	var ks *KeptSession
	if b[0] == GuardFile || b[0] == guardView || b[0] == GuardViewGone || b[0] == guardRecord || b[0] == GuardEnd {
		if len(body) < 8 {
			return bad("no session id")
		}
		ks = st.Sessions[le.Uint64(body)]
		if ks == nil {
			return nil // a session that ended, or one never kept (monitors)
		}
	}
	switch b[0] {
	case guardConfig:
		if len(body) < 5 || len(fds) != 0 {
			return bad("want mode, attempts and the config")
		}
		st.mode, st.attempts, st.config = body[0], int(int32(le.Uint32(body[1:]))), string(body[5:])
	case guardListener:
		if len(fds) != 1 {
			return bad("want one descriptor")
		}
		st.listeners = append(st.listeners, keptListener{path: string(body), fd: fds[0]})
	case GuardStaging:
		if len(fds) != 1 {
			return bad("want one descriptor")
		}
		if st.staging >= 0 {
			syscall.Close(st.staging)
		}
		st.staging = fds[0]
	case guardSession:
		if len(body) != 20 || len(fds) != 3 {
			return bad("want id, pid, features and three descriptors")
		}
		id := le.Uint64(body)
		if old := st.Sessions[id]; old != nil {
			old.close()
		}
		st.Sessions[id] = &KeptSession{Id: id, pid: int(le.Uint32(body[8:])), features: le.Uint64(body[12:]),
			Conn: fds[0], Uffd: fds[1], Host: fds[2], Files: map[core.Device]int{}, Views: map[core.Device]*KeptView{}, Journal: NewJournal()}
	case GuardFile:
		if len(body) != 9 || len(fds) != 1 {
			return bad("want id, location and one descriptor")
		}
		l := core.Device(int8(body[8]))
		if old, ok := ks.Files[l]; ok {
			syscall.Close(old)
		}
		ks.Files[l] = fds[0]
	case guardView:
		if len(body) != 13 || len(fds) != 2 {
			return bad("want id, location, pid and two descriptors")
		}
		l := core.Device(int8(body[8]))
		if old := ks.Views[l]; old != nil {
			wire.CloseFDs([]int{old.conn, old.uffd})
		}
		ks.Views[l] = &KeptView{pid: int(le.Uint32(body[9:])), conn: fds[0], uffd: fds[1]}
	case GuardViewGone:
		if len(body) != 9 {
			return bad("want id and location")
		}
		if old := ks.Views[core.Device(int8(body[8]))]; old != nil {
			wire.CloseFDs([]int{old.conn, old.uffd})
			delete(ks.Views, core.Device(int8(body[8])))
		}
	case guardRecord:
		return ks.Journal.apply(body[8:])
	case GuardEnd:
		ks.close()
		delete(st.Sessions, ks.Id)
	default:
		return bad("unknown message")
	}
	keep = true
	return nil
}

func (ks *KeptSession) close() {
	wire.CloseFDs([]int{ks.Conn, ks.Uffd, ks.Host})
	for _, fd := range ks.Files {
		syscall.Close(fd)
	}
	for _, v := range ks.Views {
		wire.CloseFDs([]int{v.conn, v.uffd})
	}
}

func (st *keptState) close() {
	for _, ks := range st.Sessions {
		ks.close()
	}
	st.Sessions = map[uint64]*KeptSession{}
	for _, l := range st.listeners {
		syscall.Close(l.fd)
	}
	st.listeners = nil
	if st.staging >= 0 {
		syscall.Close(st.staging)
		st.staging = -1
	}
}

// sessionIDs returns the sessions in the order they were made.
func (st *keptState) sessionIDs() []uint64 {
	ids := make([]uint64, 0, len(st.Sessions))
	for id := range st.Sessions {
		ids = append(ids, id)
	}
	sort.Slice(ids, func(i, j int) bool { return ids[i] < ids[j] })
	return ids
}

// send writes the whole state to c, as a handover or to a new guard.
func (st *keptState) send(c *net.UnixConn) error {
	if err := wire.WriteMessage(c, GuardConfigMsg(st.mode, st.attempts, st.config), nil); err != nil {
		return err
	}
	for _, l := range st.listeners {
		if err := wire.WriteMessage(c, append([]byte{guardListener}, l.path...), []int{l.fd}); err != nil {
			return err
		}
	}
	if st.staging >= 0 {
		if err := wire.WriteMessage(c, []byte{GuardStaging}, []int{st.staging}); err != nil {
			return err
		}
	}
	for _, id := range st.sessionIDs() {
		ks := st.Sessions[id]
		if err := wire.WriteMessage(c, GuardSessionMsg(id, ks.pid, ks.features), []int{ks.Conn, ks.Uffd, ks.Host}); err != nil {
			return err
		}
		for l, fd := range ks.Files {
			if err := wire.WriteMessage(c, GuardLocMsg(GuardFile, id, l), []int{fd}); err != nil {
				return err
			}
		}
		for l, v := range ks.Views {
			if err := wire.WriteMessage(c, GuardViewMsg(id, l, v.pid), []int{v.conn, v.uffd}); err != nil {
				return err
			}
		}
		for _, rec := range ks.Journal.Records() {
			if err := wire.WriteMessage(c, GuardRecordMsg(id, rec), nil); err != nil {
				return err
			}
		}
	}
	return nil
}

// receiveHandover reads a handover into st, up to its end.
func (st *keptState) receiveHandover(c *net.UnixConn) (handoverEnd, error) {
	buf := make([]byte, wire.MaxMessageSize)
	le := binary.LittleEndian
	for {
		b, fds, err := wire.ReadMessage(c, buf)
		if err != nil {
			return handoverEnd{}, fmt.Errorf("handover: %w", err)
		}
		if len(b) == 17 && b[0] == guardHandover {
			wire.CloseFDs(fds)
			return handoverEnd{died: time.Unix(0, int64(le.Uint64(b[1:]))), restarts: int(le.Uint32(b[9:])), guardPID: int(le.Uint32(b[13:]))}, nil
		}
		if err := st.Apply(b, fds); err != nil {
			return handoverEnd{}, fmt.Errorf("handover: %w", err)
		}
	}
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
	wire.WriteMessage(c, []byte{GuardQuit}, nil)
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
	defer st.close()
	g.mu.Lock()
	defer g.mu.Unlock()
	g.holding = false
	err = st.send(g.conn)
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
func (s *Server) snapshot() *keptState {
	st := NewKeptState()
	st.mode, st.attempts, st.config = s.mode, s.cfg.RestartAttempts(), s.cfg.Marshal()
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
		st.listeners = append(st.listeners, keptListener{path: kl.path, fd: dup(wire.RawFD(kl.l))})
	}
	s.keptMu.Unlock()
	st.staging = dup(s.staging.FD())
	for _, sess := range s.sessionList() {
		client := sess.viewRef(core.CPU)
		if client == nil {
			continue
		}
		ks := &KeptSession{Id: sess.id, pid: sess.pid, features: uint64(client.uffd.Features()),
			Conn: dup(wire.RawFD(sess.conn)), Uffd: dup(client.uffd.Fd()), Host: dup(sess.host.Fd()),
			Files: map[core.Device]int{}, Views: map[core.Device]*KeptView{}, Journal: NewJournal()}
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
				ks.Views[core.DeviceAtSlot(l)] = &KeptView{pid: v.pid, conn: dup(wire.RawFD(v.conn)), uffd: dup(v.uffd.Fd())}
				v.release()
			}
		}
		sess.journalMu.Lock()
		for _, rec := range sess.journal.Records() {
			ks.Journal.apply(rec)
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
	s.guard.send(append([]byte{guardListener}, path...), wire.RawFD(l))
}

// setMode says whether the guard restarts this server even when no
// session is left (a daemon) or only while clients need it (private).
func (s *Server) setMode(mode byte) {
	s.mode = mode
	s.guard.send(GuardConfigMsg(mode, s.cfg.RestartAttempts(), s.cfg.Marshal()))
}

func (g *guard) logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "softuvm guard[%d]: %s\n", os.Getpid(), fmt.Sprintf(format, args...))
}

func (g *guard) run(link *net.UnixConn) int {
	for {
		successor, quit := g.follow(link)
		link.Close()
		if quit {
			g.st.close()
			return 0
		}
		died := time.Now()
		if g.failedQuickly(died) {
			g.quickDeaths++
		} else {
			g.quickDeaths = 0
		}
		if g.st.mode != ModeDaemon && len(g.st.Sessions) == 0 {
			g.st.close() // a private server whose clients are all gone
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
				g.st.close()
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
		case len(b) == 1 && b[0] == GuardQuit:
			wire.CloseFDs(fds)
			return nil, true
		case len(b) == 1 && b[0] == guardReady:
			wire.CloseFDs(fds)
		case len(b) == 1 && b[0] == guardRetire && len(fds) == 1:
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
	if err := g.st.send(c); err != nil {
		return err
	}
	end := binary.LittleEndian.AppendUint64([]byte{guardHandover}, uint64(died.UnixNano()))
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
		if len(b) == 1 && b[0] == guardReady {
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
	if g.st.attempts <= 0 {
		return nil, "restarts are off"
	}
	var last error
	if g.quickDeaths > 0 {
		last = fmt.Errorf("%d servers in a row died within %v of taking over", g.quickDeaths, quickDeath)
	}
	for attempt := g.quickDeaths; attempt < g.st.attempts; attempt++ {
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
		cmd, err := wire.Reexec("adopt", "softuvm-server", nil, []*os.File{remote}, config.ServerConfigEnv+"="+g.st.config)
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
			g.logf("new server (pid %d, attempt %d of %d) did not take over: %v", cmd.Process.Pid, attempt+1, g.st.attempts, err)
			continue
		}
		g.serverPID, g.server, g.exited = cmd.Process.Pid, cmd, exited
		return local, ""
	}
	return nil, fmt.Sprintf("%d new servers in a row failed to take over (the last: %v)", g.st.attempts, last)
}

// poison serves the kept sessions' faults with poison until their
// processes exit.
func (g *guard) poison(why string) {
	st := g.st
	for _, l := range st.listeners {
		syscall.Close(l.fd)
	}
	st.listeners = nil
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
	for _, id := range st.sessionIDs() {
		ks := st.Sessions[id]
		hangUp(ks.Conn)
		notifyClient(ks.pid, fmt.Sprintf("softuvm: the fault server of this process (pid %d) exited and no new server took over (%s); managed memory that was not on the host is lost, and touching it now raises SIGBUS (bus error)\n", g.serverPID, why))
		ws := []*watched{{pid: ks.pid, u: uffd.NewFD(ks.Uffd), id: id}}
		for _, v := range ks.Views {
			hangUp(v.conn)
			ws = append(ws, &watched{pid: v.pid, u: uffd.NewFD(v.uffd), id: id})
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
