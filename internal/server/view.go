package server

import (
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/softuvm/softuvm/devmem"
	"github.com/softuvm/softuvm/internal/core"
	"github.com/softuvm/softuvm/internal/guard"
	"github.com/softuvm/softuvm/internal/wire"
	"github.com/softuvm/softuvm/uffd"
)

// view is one process's mapping of a session's managed ranges: the
// client's (the host location, mapping the host file) or a device
// process's (device d, mapping the session's file of device d). Each view
// has its own userfaultfd, registered over every range, and its own
// handler threads; a fault on a view is a fault by that view's processor.
type view struct {
	sess *session
	loc  core.Device
	pid  int
	uffd *uffd.FD

	// handlers serve the view's faults. They are stopped before uffd is
	// closed. Written by watch and unwatch only.
	handlers []*handler

	// use is held for reading by anyone using uffd who is not one of the
	// view's own handlers (a fault of another view write-protecting pages
	// here, a prefetch), and for writing by detach before uffd is closed.
	// Nobody holds it while waiting for a block lock.
	use        sync.RWMutex
	gone       bool // guarded by use
	detachOnce sync.Once

	// Device views: the server's requests to the device process (map and
	// unmap ranges), one at a time; replies arrive on the connection's
	// reader goroutine.
	conn    *net.UnixConn
	reqMu   sync.Mutex
	replies chan []byte
	seq     atomic.Uint32
	// awaited is the number of the request in flight, 0 for none: the
	// reader delivers only its reply. Another is a reply to a request
	// nobody waits for any more: one of a server that died (it waits in
	// the connection the guard kept), or one given up on. Delivered, it
	// would take the one place in replies, and the reply awaited, read
	// right after it, would be dropped: the request then timed out after
	// deviceRequestTimeout and the device process was hung up on (soak,
	// 2026-12-07: a takeover stalled for 10 s, then the client's next
	// synchronize failed with its device process "exited with status 1").
	awaited atomic.Uint32
	// report is the server's end of the process's report socket, nil if
	// it reports nothing (devicetrace.go); the guard keeps a copy.
	report *deviceTrace
	// connDone is closed when the device process's connection ends, so
	// that a request in flight fails at once instead of at its timeout
	// (detach waits for it).
	connDone chan struct{}

	// Access counting (access.go): the code the counters know the view's
	// process by (0: not counted), its minflt when it was attached, and
	// where the next round of hint faults starts (the access loop's).
	code        uint32
	minfltStart uint64
	hintCursor  uintptr

	// minorOwn: a device process registers its mappings of its own file
	// for MINOR faults (deviceMinor). Set before the view is published.
	minorOwn bool

	// mapsFull: the device process has no mappings left for another
	// remote run (vm.max_map_count): the view maps its own file where
	// policy would map another's, and pages there migrate on touch
	// (remote.go, mapsFull).
	mapsFull atomic.Bool
}

// deviceRequestTimeout bounds how long the server waits for a device
// process to map or unmap a range before it gives up on the process.
const deviceRequestTimeout = 10 * time.Second

// connEnded reports whether a device view's process connection ended.
func (v *view) connEnded() bool {
	select {
	case <-v.connDone:
		return true
	default:
		return false
	}
}

// viewRef returns the live view of location l with its use lock held for
// reading, or nil. The caller must call release.
func (sess *session) viewRef(l core.Device) *view {
	v := sess.views[l.Slot()].Load()
	if v == nil {
		return nil
	}
	v.use.RLock()
	if v.gone {
		v.use.RUnlock()
		return nil
	}
	return v
}

func (v *view) release() {
	if v != nil {
		v.use.RUnlock()
	}
}

// detach takes a view away: no new user finds it, its handlers stop, the
// users in flight finish, and its userfaultfd is closed. The data it held
// stays in its location's file.
func (sess *session) detach(v *view) {
	// Both the end of the session and the end of a device's connection
	// detach; the first does the work and the other waits for it.
	v.detachOnce.Do(func() { sess.detachOnce(v) })
}

func (sess *session) detachOnce(v *view) {
	sess.views[v.loc.Slot()].CompareAndSwap(v, nil)
	sess.srv.unwatch(v)
	v.use.Lock()
	v.gone = true
	v.use.Unlock()
	if v.loc != core.CPU {
		sess.srv.guard.Send(guard.LocMsg(guard.OpViewGone, sess.id, v.loc))
	}
	sess.srv.untrack(v)
	v.uffd.Close()
	if v.conn != nil {
		wire.HangUpConn(v.conn)
	}
}

// deviceConnect answers msgDeviceConnect: a socketpair whose other end the
// client passes to the device process.
func (sess *session) deviceConnect(d core.Device) (int, error) {
	if d < 0 || int(d) >= len(sess.srv.arenas) {
		return -1, sess.srv.checkDevice(d, "device process for")
	}
	local, remote, err := wire.SocketPair(fmt.Sprintf("softuvm-device-%d", d))
	if err != nil {
		return -1, fmt.Errorf("%w: %v", core.ErrInternal, err)
	}
	go sess.serveDevice(core.Device(d), local, nil)
	fd, err := wire.DupCloexec(remote)
	remote.Close()
	return fd, err
}

// guardFDs are the descriptors of a device view the guard keeps: its
// connection, its userfaultfd, and its report socket if it has one.
func (v *view) guardFDs() []int {
	fds := []int{wire.RawFD(v.conn), v.uffd.Fd()}
	if v.report != nil {
		if fd := wire.RawFD(v.report.conn); fd >= 0 { // -1: the process closed it, and it was let go
			fds = append(fds, fd)
		}
	}
	return fds
}

// serveDevice runs the server's side of a device process's connection.
// report is the server's end of its report socket, nil if none.
func (sess *session) serveDevice(l core.Device, c *net.UnixConn, report *deviceTrace) {
	srv := sess.srv
	v, err := sess.attachDevice(l, c, report)
	if err != nil {
		if !errors.Is(err, wire.ErrPeerGone) {
			srv.logger.Printf("pid %d device %d: %v", sess.pid, l, err)
		}
		c.Close()
		return
	}
	sess.readDeviceReplies(v)
}

// readDeviceReplies reads a device process's replies until it goes
// away, then detaches its view.
func (sess *session) readDeviceReplies(v *view) {
	buf := make([]byte, wire.MaxMessageSize)
	for {
		b, fds, err := wire.ReadMessage(v.conn, buf)
		wire.CloseFDs(fds)
		if err != nil {
			break
		}
		v.deliver(b)
	}
	close(v.connDone)
	sess.detach(v)
}

// deliver passes a message of the device process to the request in
// flight. A reply to a request nobody waits for is dropped. It reports
// whether the message was delivered.
func (v *view) deliver(b []byte) bool {
	if h, _, err := wire.ParseHeader(b); err == nil && h.Seq != v.awaited.Load() {
		return false
	}
	select {
	case v.replies <- append([]byte(nil), b...):
		return true
	default:
		v.sess.srv.logger.Printf("pid %d device %d: unexpected message from the device process", v.sess.pid, v.loc)
		return false
	}
}

// staleViewWait bounds how long a device process's hello waits for the
// view of its slot's exited process to go.
const staleViewWait = 5 * time.Second

// awaitExitedView lets the view of location l go first where its process
// has exited. A client that restarts a device process (DeviceReset, then
// a launch) reaps the old one before it starts the new, but the old view
// leaves only when this server's reader of its connection has seen the
// end and detached it; on a loaded machine the new process's hello came
// first and was refused ("already has a process"). So: if the slot's
// view belongs to a process that no longer exists, wait (up to wait) for
// its connection's end, then for its detach. A view whose process lives
// is left alone: the hello is refused, as it should be. Called without
// sess.mu, which a detach's users may need.
func (sess *session) awaitExitedView(l core.Device, wait time.Duration) {
	old := sess.views[l.Slot()].Load()
	if old == nil || !errors.Is(syscall.Kill(old.pid, 0), syscall.ESRCH) {
		return
	}
	timer := time.NewTimer(wait)
	defer timer.Stop()
	select {
	case <-old.connDone:
		sess.detach(old) // the reader's detach: this waits for it to finish
	case <-timer.C:
	}
}

func (sess *session) attachDevice(l core.Device, c *net.UnixConn, report *deviceTrace) (*view, error) {
	srv := sess.srv
	buf := make([]byte, wire.MaxMessageSize)
	b, fds, err := wire.ReadMessage(c, buf)
	if err != nil {
		return nil, err
	}
	h, req, err := wire.ParseRequest(b)
	dh, ok := req.(wire.DeviceHelloRequest)
	if err == nil && !ok {
		err = fmt.Errorf("%w: first message of a device process is %s, want device hello", core.ErrInvalidValue, h.Typ)
	}
	if err == nil && (len(fds) != 1 || core.Device(dh.Device) != l) {
		err = fmt.Errorf("%w: device hello for device %d with %d descriptors, want device %d and 1", core.ErrInvalidValue, dh.Device, len(fds), l)
	}
	if err != nil {
		wire.CloseFDs(fds)
		wire.WriteMessage(c, wire.EncodeError(h, err), nil)
		return nil, err
	}
	u := uffd.NewFD(fds[0])
	if _, err := u.Handshake(srv.features & core.WantedFeatures); err != nil {
		u.Close()
		err = fmt.Errorf("%w: userfaultfd handshake of device %d: %v", core.ErrInitialization, l, err)
		wire.WriteMessage(c, wire.EncodeError(h, err), nil)
		return nil, err
	}
	// The device maps every location's file: its own over its ranges,
	// the others' where it maps remotely.
	fds = fds[:0]
	for loc := range sess.views {
		f, err := sess.file(core.DeviceAtSlot(loc))
		if err != nil {
			u.Close()
			wire.WriteMessage(c, wire.EncodeError(h, err), nil)
			return nil, err
		}
		fds = append(fds, f.Fd())
	}
	v := &view{sess: sess, loc: l, pid: int(dh.Pid), uffd: u, conn: c, replies: make(chan []byte, 1), connDone: make(chan struct{}),
		minorOwn: sess.deviceMinor(l, u), report: report}

	sess.awaitExitedView(l, staleViewWait)

	// The range table is frozen while the device maps it: an allocation
	// meanwhile would be missed.
	sess.mu.Lock()
	defer sess.mu.Unlock()
	if old := sess.views[l.Slot()].Load(); old != nil {
		u.Close()
		err := fmt.Errorf("%w: device %d of pid %d already has a process (pid %d)", core.ErrInvalidValue, l, sess.pid, old.pid)
		wire.WriteMessage(c, wire.EncodeError(h, err), nil)
		return nil, err
	}
	runs, err := sess.layoutFor(v)
	if err == nil {
		// The reply carries the files; the rest of a long layout
		// follows it in pieces (wire.Layout).
		for i, m := range wire.EncodeLayout(h, wire.Layout{Runs: runs, MinorRemote: srv.Access.user, MinorOwn: v.minorOwn}) {
			if i > 0 {
				fds = nil
			}
			if err = wire.WriteMessage(c, m, fds); err != nil {
				break
			}
		}
	}
	if err != nil {
		u.Close()
		wire.WriteMessage(c, wire.EncodeError(h, err), nil)
		return nil, err
	}
	// The device maps and registers its layout and says so. sess.mu is
	// held meanwhile, so a device that never answers must not hold every
	// allocation of its client up.
	c.SetReadDeadline(time.Now().Add(deviceRequestTimeout))
	b, fds, err = wire.ReadMessage(c, buf)
	c.SetReadDeadline(time.Time{})
	wire.CloseFDs(fds)
	if err == nil {
		h, req, err = wire.ParseRequest(b)
		if _, ok := req.(wire.DeviceReadyRequest); err == nil && !ok {
			err = fmt.Errorf("%w: device %d sent %s, want ready", core.ErrInvalidValue, l, h.Typ)
		}
	}
	if err != nil {
		u.Close()
		return nil, err
	}
	if err := srv.watch(v); err != nil {
		u.Close()
		wire.WriteMessage(c, wire.EncodeError(h, err), nil)
		return nil, err
	}
	srv.guard.Send(guard.ViewMsg(sess.id, l, v.pid), v.guardFDs()...)
	srv.track(v)
	// The view takes no request (a remote mapping of advice or a
	// prefetch, hints) before the device has read the answer to its
	// ready: it reads nothing else until then, and a map request
	// written first was taken for a malformed answer. Every request
	// holds reqMu, which comes after sess.mu and before the block locks
	// protectCopies takes.
	v.reqMu.Lock()
	defer v.reqMu.Unlock()
	sess.views[l.Slot()].Store(v)
	// Published first, so that copies made from now on protect it too;
	// the device runs no kernel before the reply.
	sess.protectCopies(v)
	if err := wire.WriteMessage(c, wire.EncodeEmptyReply(h), nil); err != nil {
		sess.views[l.Slot()].Store(nil)
		srv.unwatch(v)
		u.Close()
		return nil, err
	}
	return v, nil
}

// layoutFor computes what the new process of device view v maps: each
// range from its own file (or, for pinned host and device memory, the
// owner's), then the runs policy wants mapped remotely, as many as the
// process has mappings left for (remoteRunBudget); past that the view
// maps its own file, where pages migrate on touch, and is marked full.
// It records them as the view's mappings. sess.mu is held, so the ranges
// stand still.
func (sess *session) layoutFor(v *view) ([]wire.Mapping, error) {
	l := v.loc
	var out []wire.Mapping
	budget := remoteRunBudget(v.pid)
	for _, r := range sess.ranges.Load().ranges {
		if !r.mapsDeviceMemory(l) {
			continue // a peer's device memory without peer access: left reserved (peer.go)
		}
		base := l
		if f, ok := r.StaticFile(l); ok {
			base = f
		}
		out = append(out, wire.Mapping{Addr: uint64(r.Start), Length: uint64(r.Length), File: base})
		if r.Kind != core.KindManaged {
			if base != l {
				sess.srv.countRemote(r.Range, l, r.Start, int(r.Length/core.PageSize))
			}
			continue
		}
		for bi := range r.Blocks() {
			b := r.BlockAt(bi)
			if b == nil {
				continue
			}
			b.Lock()
			b.ResetMaps(l)
			o := r.NewMover(bi, b)
			for from := 0; ; {
				first, outer, to, found := o.Mismatch(l, from)
				if !found {
					break
				}
				if budget--; budget < 0 {
					sess.mapsFull(v, "its layout")
					break
				}
				b.SetMapping(l, first, outer, to, false)
				out = append(out, wire.Mapping{Addr: uint64(o.PageAddr(first)), Length: uint64(outer-first) * core.PageSize, File: to})
				if to != l {
					sess.srv.countRemote(r.Range, l, o.PageAddr(first), outer-first)
				}
				from = outer
			}
			b.Unlock()
		}
	}
	return out, nil
}

// protectCopies write-protects, in a new device view, every page with
// several copies (read duplication), so that its writes fault.
func (sess *session) protectCopies(v *view) {
	for _, r := range sess.ranges.Load().ranges {
		for bi := range r.Blocks() {
			b := r.BlockAt(bi)
			if b == nil {
				continue
			}
			b.Lock()
			dup := b.Duplicated()
			for p, q := dup.NextRun(0); p >= 0; p, q = dup.NextRun(q) {
				addr := r.Start + uintptr(bi)*core.BlockSize + uintptr(p)*core.PageSize
				if err := v.uffd.WriteProtect(addr, uintptr(q-p)*core.PageSize, true, true); err != nil {
					sess.srv.logger.Printf("pid %d device %d: protect copies at %#x: %v", sess.pid, v.loc, addr, err)
				}
			}
			b.Unlock()
		}
	}
}

// request asks the device process to act and waits for its reply.
func (v *view) request(b []byte, typ wire.MsgType) error {
	v.reqMu.Lock()
	defer v.reqMu.Unlock()
	return v.requestLocked(b, typ)
}

// errDeviceGone is a request that found its device process gone: its
// connection ended, or would take no more. The next process of the device
// maps the whole layout at its hello, so a map it missed is no failure.
var errDeviceGone = errors.New("device process gone")

// requestLocked is request with v.reqMu held.
func (v *view) requestLocked(b []byte, typ wire.MsgType) error {
	h, _, _ := wire.ParseHeader(b)
	v.awaited.Store(h.Seq) // before the request: its reply cannot come sooner
	defer v.awaited.Store(0)
	if err := wire.WriteMessage(v.conn, b, nil); err != nil {
		return fmt.Errorf("%w: device %d process (pid %d): %w (%v)", core.ErrInternal, v.loc, v.pid, errDeviceGone, err)
	}
	timeout := time.After(deviceRequestTimeout)
	for {
		select {
		case reply := <-v.replies:
			if rh, _, err := wire.ParseHeader(reply); err == nil && rh.Seq != h.Seq {
				continue // answers a request of the server before this one
			}
			_, err := wire.ParseReply(reply, h)
			return err
		case <-v.connDone:
			return fmt.Errorf("%w: device %d process (pid %d): %w", core.ErrInternal, v.loc, v.pid, errDeviceGone)
		case <-timeout:
			wire.HangUpConn(v.conn) // its reader ends and detaches the view
			return fmt.Errorf("%w: device %d process (pid %d) did not answer %s within %v", core.ErrInternal, v.loc, v.pid, typ, deviceRequestTimeout)
		}
	}
}

// mapInDevices makes every device view map and register a new range.
// sess.mu is held.
func (sess *session) mapInDevices(r *managedRange) error {
	for l := 1; l < len(sess.views); l++ {
		if !r.mapsDeviceMemory(core.DeviceAtSlot(l)) {
			continue // a peer's device memory without peer access: left reserved (peer.go)
		}
		v := sess.viewRef(core.DeviceAtSlot(l))
		if v == nil {
			continue
		}
		loc := core.DeviceAtSlot(l)
		if f, ok := r.StaticFile(loc); ok {
			loc = f
		}
		err := v.request(wire.EncodeDeviceMap(v.seq.Add(1), wire.DeviceMapRequest{Addr: uint64(r.Start), Length: uint64(r.Length), File: loc}), wire.MsgDeviceMap)
		v.release()
		if err == nil && loc != core.DeviceAtSlot(l) {
			sess.srv.countRemote(r.Range, core.DeviceAtSlot(l), r.Start, int(r.Length/core.PageSize))
		}
		if errors.Is(err, errDeviceGone) {
			continue // a kernel crashed it, say: its successor maps the range at its hello
		}
		if err != nil {
			return fmt.Errorf("map %#x+%d in device %d: %w", r.Start, r.Length, l-1, err)
		}
	}
	return nil
}

// unmapInDevices makes every device view unmap a freed range; the device
// process keeps the addresses reserved. sess.mu is held.
func (sess *session) unmapInDevices(r *managedRange) {
	for l := 1; l < len(sess.views); l++ {
		if v := sess.viewRef(core.DeviceAtSlot(l)); v != nil {
			if err := v.request(wire.EncodeDeviceUnmap(v.seq.Add(1), uint64(r.Start), uint64(r.Length)), wire.MsgDeviceUnmap); err != nil && !errors.Is(err, errDeviceGone) {
				sess.srv.logger.Printf("unmap %#x+%d in device %d: %v", r.Start, r.Length, l-1, err)
			}
			v.release()
		}
	}
}

// file returns location l's file for the session.
func (sess *session) file(l core.Device) (*devmem.File, error) {
	if l == core.CPU {
		return sess.host, nil
	}
	return sess.deviceFile(int(l))
}
