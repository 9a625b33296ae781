package uvm

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/softuvm/softuvm/devmem"
	"github.com/softuvm/softuvm/uffd"
)

// session is one connected process, as the server sees it.
type session struct {
	srv  *Server
	id   uint64
	pid  int
	role uint8
	conn *net.UnixConn

	host *devmem.File // the client's host location file; nil for monitors
	// views[l] is the live view of location l: views[hostLoc] is the
	// client's (nil for monitors), views[1+d] device d's process, if
	// running.
	views []atomic.Pointer[view]

	// mu serializes control operations (alloc, free, prefetch, teardown)
	// and guards nextID. Lock order: mu, then block locks, then filesMu.
	mu     sync.Mutex
	nextID uint64
	// filesMu guards devFiles: faults (holding block locks, not mu) and
	// control operations both create device files on first use.
	filesMu  sync.Mutex
	devFiles []*devmem.File // one per device, created on first use

	ranges atomic.Pointer[rangeTable]
	// recentFrees remembers the last ranges freed and when, guarded by
	// freedMu: a fault message read before its range was freed (another
	// thread's fault on the same page, read in the same batch and served
	// after the free) is stale, not a touch of freed memory.
	freedMu     sync.Mutex
	recentFrees [64]freedRange
	nextFreed   int

	stats  *counters // retired statistics of freed ranges
	remaps *remapper // device mapping changes that faults cause

	// journal is what a new server needs to take the session over
	// (journal.go); journalMu guards it and orders what goes to the
	// guard, so that the guard's copy follows the same order.
	journalMu sync.Mutex
	journal   *journal
	// lastSeq is the sequence number of the last request answered: a
	// client that learns of a restart sends its pending request again,
	// and when the new server had it already, the copy is dropped.
	// Owned by the control loop.
	lastSeq uint32
	// adoptedViews are the device processes a new server takes over,
	// until resume attaches them.
	adoptedViews map[location]*keptView
}

// newSession makes a session that serves nobody yet.
func (s *Server) newSession(id uint64, pid int, role uint8, conn *net.UnixConn) *session {
	sess := &session{srv: s, id: id, pid: pid, role: role, conn: conn, stats: newCounters(s.locations()),
		views: make([]atomic.Pointer[view], s.locations()), remaps: newRemapper(), journal: newJournal()}
	sess.ranges.Store(&rangeTable{})
	return sess
}

// record adds rec to the session's journal and sends it to the guard.
func (sess *session) record(rec []byte) {
	sess.journalMu.Lock()
	defer sess.journalMu.Unlock()
	if err := sess.journal.apply(rec); err != nil {
		sess.srv.logger.Printf("session %d journal: %v", sess.id, err)
		return
	}
	sess.srv.guard.send(guardRecordMsg(sess.id, rec))
}

// client is the session's client view, nil for a monitor.
func (sess *session) client() *view { return sess.views[hostLoc].Load() }

// handshake reads the hello. The session's pid is the peer's, as the
// kernel reports it, not the one the hello claims.
func (s *Server) handshake(c *net.UnixConn, peerPID int) (*session, error) {
	buf := make([]byte, maxMessageSize)
	b, fds, err := readMessage(c, buf)
	if err != nil {
		return nil, err
	}
	h, req, err := parseRequest(b)
	if err == nil && h.typ != msgHello {
		err = fmt.Errorf("%w: first message is %s, want hello", ErrInvalidValue, h.typ)
	}
	hello, _ := req.(helloRequest)
	want := 0
	if err == nil && hello.role == roleClient {
		want = 2
	}
	if err == nil && len(fds) != want {
		err = fmt.Errorf("%w: hello as %s carries %d file descriptors, want %d", ErrInvalidValue, roleName(hello.role), len(fds), want)
	}
	if err != nil {
		closeFDs(fds)
		writeMessage(c, encodeError(h, err), nil)
		return nil, err
	}
	sess := s.newSession(s.nextSessionID.Add(1), peerPID, hello.role, c)
	if hello.role == roleClient {
		if err := sess.adopt(fds[0], fds[1]); err != nil {
			writeMessage(c, encodeError(h, err), nil)
			return nil, err
		}
	}
	if hello.role == roleClient {
		s.track(sess.client())
	}
	s.sessionsMu.Lock()
	s.sessions[sess.id] = sess
	s.sessionsMu.Unlock()
	go sess.remapLoop() // ended by endSession
	var features uint64
	if v := sess.client(); v != nil {
		if err := s.watch(v); err != nil {
			s.endSession(sess)
			writeMessage(c, encodeError(h, err), nil)
			return nil, err
		}
		features = uint64(v.uffd.Features())
	}
	reply := encodeHelloReply(h, helloReply{serverPID: uint32(os.Getpid()), sessionID: sess.id, features: features, devices: s.Devices()})
	if err := writeMessage(c, reply, nil); err != nil {
		s.endSession(sess)
		return nil, err
	}
	return sess, nil
}

func roleName(r uint8) string {
	switch r {
	case roleClient:
		return "client"
	case roleMonitor:
		return "monitor"
	}
	return fmt.Sprintf("role %d", r)
}

// adopt takes the client's userfaultfd and host file and does the API
// handshake on its behalf.
func (sess *session) adopt(uffdFD, hostFD int) error {
	host, err := devmem.FileFromFD(hostFD, fmt.Sprintf("host file of pid %d", sess.pid))
	if err != nil {
		syscall.Close(uffdFD)
		return fmt.Errorf("%w: host file: %v", ErrInvalidValue, err)
	}
	u := uffd.NewFD(uffdFD)
	granted, err := u.Handshake(sess.srv.features)
	if err != nil {
		u.Close()
		host.Close()
		return fmt.Errorf("%w: userfaultfd handshake: %v", ErrInitialization, err)
	}
	if missing := RequiredFeatures &^ granted; missing != 0 {
		u.Close()
		host.Close()
		return fmt.Errorf("%w: userfaultfd granted %v, missing %v", ErrNotSupported, granted, missing)
	}
	sess.host = host
	sess.views[hostLoc].Store(&view{sess: sess, loc: hostLoc, pid: sess.pid, uffd: u})
	sess.srv.guard.send(guardSessionMsg(sess.id, sess.pid, uint64(granted)), rawFD(sess.conn), u.Fd(), host.Fd())
	return nil
}

// controlLoop answers requests until the peer disconnects.
func (sess *session) controlLoop() {
	buf := make([]byte, maxMessageSize)
	for {
		b, fds, err := readMessage(sess.conn, buf)
		if err != nil {
			if !errors.Is(err, errPeerGone) {
				sess.srv.logger.Printf("session %d (pid %d): %v", sess.id, sess.pid, err)
			}
			return
		}
		h, req, err := parseRequest(b)
		if err == nil && h.typ == msgReplace {
			err = sess.replace(fds)
			reply := encodeEmptyReply(h)
			if err != nil {
				reply = encodeError(h, err)
			}
			writeMessage(sess.conn, reply, nil)
			continue
		}
		closeFDs(fds) // no other request after hello carries descriptors
		if err == nil && h.status == requestRetried && h.seq == sess.lastSeq {
			continue // answered already: this server read it before the client learnt of the restart
		}
		var reply []byte
		if err == nil && h.typ == msgHello {
			err = fmt.Errorf("%w: hello sent twice", ErrInvalidValue)
		}
		if err == nil && sess.client() == nil && h.typ != msgStats && h.typ != msgInfo {
			err = fmt.Errorf("%w: %s needs a client session; this is a monitor", ErrInvalidValue, h.typ)
		}
		var replyFDs []int
		if err == nil {
			reply, replyFDs, err = sess.dispatch(h, req)
		}
		sess.lastSeq = h.seq
		if err != nil {
			reply = encodeError(h, err)
		}
		werr := writeMessage(sess.conn, reply, replyFDs)
		closeFDs(replyFDs) // sent: the peer has its own copies
		if werr != nil {
			return
		}
	}
}

// dispatch answers one request; a reply may carry descriptors.
func (sess *session) dispatch(h header, req any) ([]byte, []int, error) {
	switch r := req.(type) {
	case allocRequest:
		id, err := sess.alloc(r)
		if err != nil {
			return nil, nil, err
		}
		return encodeU64Reply(h, id), nil, nil
	case rangeRequest:
		if h.typ == msgFree {
			err := sess.free(uintptr(r.addr))
			if err != nil && h.status == requestRetried && sess.ranges.Load().lookup(uintptr(r.addr)) == nil {
				err = nil // the server before this one freed it, and died before it could answer
			}
			return encodeEmptyReply(h), nil, err
		}
		if h.typ != msgRangeAttrs {
			break
		}
		a, err := sess.rangeAttributes(uintptr(r.addr), uintptr(r.length))
		if err != nil {
			return nil, nil, err
		}
		return encodeRangeAttrsReply(h, a), nil, nil
	case prefetchRequest:
		return encodeEmptyReply(h), nil, sess.prefetch(uintptr(r.addr), uintptr(r.length), Device(r.dst))
	case deviceCopyRequest:
		return encodeEmptyReply(h), nil, sess.deviceCopy(r)
	case adviseRequest:
		err := sess.advise(uintptr(r.addr), uintptr(r.length), Advice(r.advice), Device(r.device))
		if err == nil {
			sess.record(adviseRecord(encodeAdvise(0, r)))
		}
		return encodeEmptyReply(h), nil, err
	case statsRequest:
		st, err := sess.statsFor(r)
		if err != nil {
			return nil, nil, err
		}
		b, _ := json.Marshal(st)
		return encodeStringReply(h, string(b)), nil, nil
	case struct{}: // info
		return encodeStringReply(h, sess.srv.infoJSON()), nil, nil
	case deviceConnectRequest:
		if h.typ == msgDeviceFile {
			return sess.deviceFileReply(h, Device(r.device))
		}
		fd, err := sess.deviceConnect(Device(r.device))
		if err != nil {
			return nil, nil, err
		}
		return encodeEmptyReply(h), []int{fd}, nil
	}
	return nil, nil, fmt.Errorf("%w: %s is not a request a client may send", ErrInvalidValue, h.typ)
}

// alloc registers a range the client has mapped from its host file at
// offset == address.
func (sess *session) alloc(r allocRequest) (uint64, error) {
	mr, err := sess.newRange(r)
	if err != nil {
		return 0, err
	}
	start, length := mr.start, mr.length
	sess.mu.Lock()
	defer sess.mu.Unlock()
	// The kernel gave this address to a new mapping, so any range still
	// recorded there was unmapped without a free: it is stale.
	for _, old := range sess.ranges.Load().overlapping(start, length) {
		sess.freeRangeLocked(old, false)
	}
	sess.nextID++
	mr.id = sess.nextID
	// Publish before registering: a stale fault message that names this
	// address once it is registered must find the range, not be taken
	// for a stray and poisoned.
	sess.ranges.Store(sess.ranges.Load().with(mr))
	if _, err := sess.client().uffd.Register(start, length, hostViewMode); err != nil {
		sess.ranges.Store(sess.ranges.Load().without(mr))
		mr.releaseReservation()
		return 0, fmt.Errorf("%w: register %#x+%d with userfaultfd (is it mapped from the host file at offset == address?): %v", ErrInvalidValue, start, length, err)
	}
	if err := sess.mapInDevices(mr); err != nil {
		sess.freeRangeLocked(mr, false)
		return 0, err
	}
	sess.record(allocRecord(encodeAlloc(0, r)))
	if r.kind == kindManaged {
		// sess.stats, not mr.stats: an allocation's counters retire into
		// its session's when it is freed, and would count it twice.
		for _, c := range []*counters{sess.stats, sess.srv.stats} {
			c.allocations.Add(1)
			c.allocatedBytes.Add(r.size)
		}
	}
	return mr.id, nil
}

// newRange makes the range an alloc request describes, reserving device
// memory's capacity, without publishing or registering it.
func (sess *session) newRange(r allocRequest) (*managedRange, error) {
	policy := sess.srv.prefetch
	if r.prefetch != "" {
		spec, err := ParsePrefetchSpec(r.prefetch)
		if err != nil {
			return nil, err
		}
		if policy, err = NewPrefetchPolicy(spec); err != nil {
			return nil, err
		}
	}
	start, length := uintptr(r.addr), uintptr(r.length)
	owner := hostLoc
	if r.kind == kindDevice {
		d := Device(r.device)
		if d == CPU {
			return nil, fmt.Errorf("%w: device memory on the CPU: use pinned host memory (HostAlloc)", ErrInvalidDevice)
		}
		if err := sess.srv.checkDevice(d, "device memory on"); err != nil {
			return nil, err
		}
		// Device memory takes its capacity now, as cudaMalloc does,
		// evicting managed pages if it must.
		owner = locationOf(d)
		if err := (&mover{sess: sess}).reserve(owner, int64(length/PageSize)); err != nil {
			if !errors.Is(err, ErrMemoryAllocation) {
				err = fmt.Errorf("%w: %v", ErrMemoryAllocation, err)
			}
			return nil, fmt.Errorf("%s of device memory on device %d: %w", FormatSize(int64(length)), d, err)
		}
	}
	return &managedRange{
		sess: sess, start: start, fileOff: int64(start), length: length, size: int64(r.size), flags: r.flags,
		kind: r.kind, owner: owner,
		prefetch: policy, trackPrefetch: r.trackPrefetch || sess.srv.cfg.TrackPrefetchUse,
		stats:  newCounters(sess.srv.locations()),
		blocks: make([]atomic.Pointer[block], (length+BlockSize-1)/BlockSize),
		born:   time.Now(),
	}, nil
}

// replace answers msgReplace: the sender takes this server's place.
func (sess *session) replace(fds []int) error {
	if len(fds) != 1 {
		closeFDs(fds)
		return fmt.Errorf("%w: replace carries %d descriptors, want 1 (the successor's socket)", ErrInvalidValue, len(fds))
	}
	if err := sess.srv.retire(fds[0]); err != nil {
		closeFDs(fds)
		return err
	}
	return nil
}

// findRange returns the range containing [addr, addr+length), which must
// lie inside one allocation.
func (sess *session) findRange(addr, length uintptr, what string) (*managedRange, error) {
	r := sess.ranges.Load().lookup(addr)
	if r == nil {
		return nil, fmt.Errorf("%w: %s: address %#x is not managed memory of pid %d", ErrInvalidValue, what, addr, sess.pid)
	}
	if length > r.end()-addr {
		return nil, fmt.Errorf("%w: %s: range %#x+%d runs past the end of the allocation %#x+%d", ErrInvalidValue, what, addr, length, r.start, r.length)
	}
	return r, nil
}

func (sess *session) free(addr uintptr) error {
	sess.mu.Lock()
	defer sess.mu.Unlock()
	r := sess.ranges.Load().lookup(addr)
	if r == nil {
		return fmt.Errorf("%w: free %#x: not managed memory of pid %d", ErrInvalidValue, addr, sess.pid)
	}
	if r.start != addr {
		return fmt.Errorf("%w: free %#x: not the start of the allocation at %#x", ErrInvalidValue, addr, r.start)
	}
	sess.auditPrefetch(r, true)
	sess.freeRangeLocked(r, true)
	sess.record(freeRecord(addr))
	return nil
}

// freeRangeLocked releases everything a range holds. sess.mu is held.
// With wake, threads blocked in faults on the range are woken so that
// they retry against the (unmapped) range and fail as the program's bug
// deserves, instead of waiting forever.
func (sess *session) freeRangeLocked(r *managedRange, wake bool) {
	if r.freed.Load() {
		return
	}
	sess.noteFreed(r.start, r.end())
	sess.ranges.Store(sess.ranges.Load().without(r))
	resident := make([]int64, sess.srv.locations())
	for i := range r.blocks {
		b := r.blocks[i].Load()
		if b == nil {
			continue
		}
		b.mu.Lock()
		r.freed.Store(true)
		for l := range b.resident {
			resident[l] += int64(b.resident[l].Count())
			sess.srv.lrus[l].remove(b)
		}
		if n := b.prefetchPending.Count(); n > 0 {
			r.stats.unused.Add(uint64(n))
			sess.srv.stats.unused.Add(uint64(n))
		}
		b.mu.Unlock()
	}
	r.freed.Store(true)
	sess.srv.hostPages.Add(-resident[hostLoc])
	sess.stats.addFrom(r.stats)
	if err := sess.host.Punch(r.fileOff, int64(r.length)); err != nil {
		sess.srv.logger.Printf("free %#x: %v", r.start, err)
	}
	sess.filesMu.Lock()
	files := append([]*devmem.File(nil), sess.devFiles...)
	sess.filesMu.Unlock()
	for d, f := range files {
		if f == nil {
			continue
		}
		if err := f.Punch(r.fileOff, int64(r.length)); err != nil {
			sess.srv.logger.Printf("free %#x on device %d: %v", r.start, d, err)
		}
		if r.kind != kindDevice {
			sess.srv.arenas[d].Release(resident[d+1])
		}
	}
	r.releaseReservation()
	if wake {
		// Threads of every view blocked on the range retry and fail.
		for l := range sess.views {
			if v := sess.viewRef(location(l)); v != nil {
				_ = v.uffd.Wake(r.start, r.length) // ENOENT and ESRCH are fine: nobody waits
				v.release()
			}
		}
		sess.unmapInDevices(r)
	}
}

// deviceFile returns the session's location file on device d, creating
// it on first use.
func (sess *session) deviceFile(d int) (*devmem.File, error) {
	sess.filesMu.Lock()
	defer sess.filesMu.Unlock()
	if sess.devFiles == nil {
		sess.devFiles = make([]*devmem.File, len(sess.srv.arenas))
	}
	if f := sess.devFiles[d]; f != nil {
		return f, nil
	}
	f, err := sess.srv.arenas[d].NewFile(fmt.Sprintf("softuvm-dev%d-pid%d", d, sess.pid))
	if err != nil {
		return nil, fmt.Errorf("%w: device %d file: %v", ErrMemoryAllocation, d, err)
	}
	sess.devFiles[d] = f
	sess.srv.guard.send(guardLocMsg(guardFile, sess.id, locationOf(Device(d))), f.Fd())
	return f, nil
}

func (sess *session) deviceFileBytes() []int64 {
	out := make([]int64, len(sess.srv.arenas))
	sess.filesMu.Lock()
	defer sess.filesMu.Unlock()
	for d, f := range sess.devFiles {
		if f != nil {
			out[d], _ = f.AllocatedBytes()
		}
	}
	return out
}

// endSession tears a session down: stops its handlers, frees its ranges,
// closes its files, and only then removes it from the server's table, so
// that a session that is gone from the table holds nothing any more.
func (s *Server) endSession(sess *session) {
	close(sess.remaps.quit)
	// Device processes first: they map the client's ranges.
	for l := len(sess.views) - 1; l >= 0; l-- {
		if v := sess.views[l].Load(); v != nil {
			sess.detach(v)
		}
	}
	sess.mu.Lock()
	for _, r := range sess.ranges.Load().ranges {
		sess.freeRangeLocked(r, false)
	}
	sess.mu.Unlock()
	if sess.host != nil {
		sess.host.Close()
	}
	sess.filesMu.Lock()
	for _, f := range sess.devFiles {
		if f != nil {
			f.Close()
		}
	}
	sess.devFiles = nil
	sess.filesMu.Unlock()
	if sess.role == roleClient {
		s.guard.send(guardIDMsg(guardEnd, sess.id))
	}
	s.sessionsMu.Lock()
	delete(s.sessions, sess.id)
	n := len(s.sessions)
	s.sessionsMu.Unlock()
	if n == 0 {
		select {
		case s.idle <- struct{}{}:
		default:
		}
	}
}

func (sess *session) info() SessionInfo {
	in := SessionInfo{ID: sess.id, PID: sess.pid, Role: roleName(sess.role)}
	for _, r := range sess.ranges.Load().ranges {
		in.Allocations++
		in.ManagedBytes += r.size
	}
	if sess.host != nil {
		in.HostBytes, _ = sess.host.AllocatedBytes()
	}
	sess.faultCounts(&in)
	return in
}

// counters sums the session's counters: its live ranges' (each passed to
// prepare first, if given) and those that frees retired.
func (sess *session) counters(prepare func(r *managedRange)) *counters {
	total := newCounters(sess.srv.locations())
	total.addFrom(sess.stats)
	for _, r := range sess.ranges.Load().ranges {
		if prepare != nil {
			prepare(r)
		}
		total.addFrom(r.stats)
	}
	return total
}

func (sess *session) statsFor(r statsRequest) (Stats, error) {
	switch r.scope {
	case scopeServer:
		sess.srv.quiesce()
		return sess.srv.stats.snapshot(), nil
	case scopeSession:
		return sess.counters(func(r *managedRange) {
			sess.auditPrefetch(r, false)
			r.quiesce()
		}).snapshot(), nil
	}
	mr := sess.ranges.Load().lookup(uintptr(r.addr))
	if mr == nil {
		return Stats{}, fmt.Errorf("%w: stats: address %#x is not managed memory of pid %d", ErrInvalidValue, r.addr, sess.pid)
	}
	sess.auditPrefetch(mr, false)
	mr.quiesce()
	return mr.stats.snapshot(), nil
}

// rawFD returns c's descriptor, which c keeps owning.
func rawFD(c syscall.Conn) int {
	fd := -1
	if raw, err := c.SyscallConn(); err == nil {
		raw.Control(func(f uintptr) { fd = int(f) })
	}
	return fd
}

// hangUpConn ends a connection for its peer even while another process
// (the guard) holds a descriptor of it, and closes it here.
func hangUpConn(c *net.UnixConn) {
	c.CloseRead()
	c.CloseWrite()
	c.Close()
}

// readMessage reads one datagram and any descriptors it carries.
func readMessage(c *net.UnixConn, buf []byte) ([]byte, []int, error) {
	oob := make([]byte, syscall.CmsgSpace(4*4))
	n, oobn, flags, _, err := c.ReadMsgUnix(buf, oob)
	if err != nil {
		if errors.Is(err, io.EOF) || errors.Is(err, net.ErrClosed) || errors.Is(err, syscall.ECONNRESET) {
			return nil, nil, errPeerGone
		}
		return nil, nil, err
	}
	var fds []int
	if oobn > 0 {
		msgs, perr := syscall.ParseSocketControlMessage(oob[:oobn])
		if perr == nil {
			for _, m := range msgs {
				got, rerr := syscall.ParseUnixRights(&m)
				if rerr == nil {
					fds = append(fds, got...)
				}
			}
		}
	}
	if n == 0 && oobn == 0 {
		return nil, nil, errPeerGone
	}
	if flags&(syscall.MSG_TRUNC|syscall.MSG_CTRUNC) != 0 {
		closeFDs(fds)
		return buf[:0], nil, fmt.Errorf("%w: message truncated (over %d bytes or too many descriptors)", ErrInvalidValue, len(buf))
	}
	return buf[:n], fds, nil
}

func writeMessage(c *net.UnixConn, b []byte, fds []int) error {
	var oob []byte
	if len(fds) > 0 {
		oob = syscall.UnixRights(fds...)
	}
	_, _, err := c.WriteMsgUnix(b, oob, nil)
	return err
}

func closeFDs(fds []int) {
	for _, fd := range fds {
		syscall.Close(fd)
	}
}

// remapped handles an mremap the client made of managed memory. Moving a
// managed range is not supported: the old addresses are no longer mapped,
// and faults at the new ones find no range and are poisoned, so touching
// moved pages that were not on the host raises SIGBUS instead of reading
// zeros.
func (sess *session) remapped(from, to, length uintptr) {
	sess.srv.logger.Printf("pid %d moved managed memory %#x+%d to %#x with mremap, which softuvm does not support: the moved pages are no longer managed", sess.pid, from, length, to)
}

// freedRange is a range freed at a time.
type freedRange struct {
	start, end uintptr
	at         time.Time
}

func (sess *session) noteFreed(start, end uintptr) {
	sess.freedMu.Lock()
	sess.recentFrees[sess.nextFreed%len(sess.recentFrees)] = freedRange{start, end, time.Now()}
	sess.nextFreed++
	sess.freedMu.Unlock()
}

// freedSince reports whether addr lies in a range freed after read: a
// fault message read at that time belongs to the range's life, not to a
// touch of freed memory.
func (sess *session) freedSince(addr uintptr, read time.Time) bool {
	sess.freedMu.Lock()
	defer sess.freedMu.Unlock()
	for _, f := range sess.recentFrees {
		if f.start <= addr && addr < f.end && !read.After(f.at) {
			return true
		}
	}
	return false
}
