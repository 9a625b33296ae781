package server

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/softuvm/softuvm/devmem"
	"github.com/softuvm/softuvm/internal/config"
	"github.com/softuvm/softuvm/internal/core"
	"github.com/softuvm/softuvm/internal/guard"
	"github.com/softuvm/softuvm/internal/wire"
	"github.com/softuvm/softuvm/policy"
	"github.com/softuvm/softuvm/trace"
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
	// hostReplaced: the server made the host file (one of large folios)
	// in place of the client's memfd, and the hello reply hands it over.
	hostReplaced bool
	// views[p.Slot()] is the live view of processor p: the CPU's is the
	// client's (nil for monitors), device d's its process, if running.
	views []atomic.Pointer[view]

	// mu serializes control operations (alloc, free, prefetch, teardown)
	// and guards nextID. Lock order: mu, then block locks, then filesMu.
	mu     sync.Mutex
	nextID uint64
	// filesMu guards devFiles: faults (holding block locks, not mu) and
	// control operations both create device files on first use.
	filesMu  sync.Mutex
	devFiles []*devmem.File // one per device, created on first use

	// tracer records this client's own events (UVM_TRACE, or between
	// uvmProfilerStart and Stop), nil while it records none; set before
	// the session serves, swapped by trace-control requests (trace.go),
	// closed at its end.
	tracer atomic.Pointer[trace.Recorder]
	// devTraces are the report sockets of its device processes, which
	// report their launches and synchronizations while the session is
	// traced under the fault model (devicetrace.go).
	devTraces deviceTraces
	// traceAccess is the access mode its trace asks for (the server's
	// --trace-access, else the client's UVM_TRACE_ACCESS with its own
	// trace), set with the trace; sampler runs it (accesstrace.go), nil
	// when off; set before the session is in the server's table.
	traceAccess config.TraceAccess
	sampler     *accessSampler

	ranges atomic.Pointer[rangeTable]
	// recentFrees remembers the last ranges freed and when, guarded by
	// freedMu: a fault message read before its range was freed (another
	// thread's fault on the same page, read in the same batch and served
	// after the free) is stale, not a touch of freed memory.
	freedMu     sync.Mutex
	recentFrees [64]freedRange
	nextFreed   int

	// statsMu guards stats and counted (a leaf): every event is counted
	// once, in its range's counters, which a free adds to the session's
	// in the same step as it stops listing the range, so that a sum
	// (counters) sees each event exactly once, never during a free twice
	// or not at all.
	statsMu sync.Mutex
	stats   *core.Counters             // retired statistics of freed ranges, and the session's own
	counted map[*managedRange]struct{} // ranges whose statistics are not in stats yet
	remaps  *remapper                  // device mapping changes that faults cause

	// journal is what a new server needs to take the session over
	// (journal.go); journalMu guards it and orders what goes to the
	// guard, so that the guard's copy follows the same order.
	journalMu sync.Mutex
	journal   *guard.Journal
	// profiler is the client's last profiler request the journal held,
	// on a session taken over: what openSessionTrace records (nil: none,
	// UVM_TRACE decides).
	profiler *wire.TraceControlRequest
	// lastSeq is the sequence number of the last request answered: a
	// client that learns of a restart sends its pending request again,
	// and when the new server had it already, the copy is dropped.
	// Owned by the control loop.
	lastSeq uint32
	// launch is the launch coherence model's state, nil under the
	// fault model. Set at the handshake.
	launch *launchState
	// adoptedViews are the device processes a new server takes over,
	// until resume attaches them.
	adoptedViews map[core.Device]*guard.View
	// peers is which devices reach which devices' memory (peer.go).
	peers peerTable
	// watch and deviceWatch hold what an eviction policy's hint faults
	// on the client and on each device process need (watch.go);
	// watchWarned says why they cannot be had was logged.
	watch       sessionWatch
	deviceWatch [core.MaxDevices]sessionWatch
	watchWarned atomic.Bool
}

func roleName(r uint8) string {
	switch r {
	case wire.RoleClient:
		return "client"
	case wire.RoleMonitor:
		return "monitor"
	}
	return fmt.Sprintf("role %d", r)
}

// freedRange is a range freed at a time.
type freedRange struct {
	start, end uintptr
	at         time.Time
}

// newSession makes a session that serves nobody yet.
func (s *Server) newSession(id uint64, pid int, role uint8, conn *net.UnixConn) *session {
	sess := &session{srv: s, id: id, pid: pid, role: role, conn: conn, stats: core.NewCounters(s.eng.Locations()),
		counted: map[*managedRange]struct{}{},
		views:   make([]atomic.Pointer[view], s.eng.Locations()), remaps: newRemapper(), journal: guard.NewJournal()}
	sess.ranges.Store(&rangeTable{})
	return sess
}

// record adds rec to the session's journal and sends it to the guard.
func (sess *session) record(rec []byte) {
	sess.journalMu.Lock()
	defer sess.journalMu.Unlock()
	if err := sess.journal.Apply(rec); err != nil {
		sess.srv.logger.Printf("session %d journal: %v", sess.id, err)
		return
	}
	sess.srv.guard.Send(guard.RecordMsg(sess.id, rec))
}

// client is the session's client view, nil for a monitor.
func (sess *session) client() *view { return sess.views[core.CPU.Slot()].Load() }

// handshake reads the hello. The session's pid is the peer's, as the
// kernel reports it, not the one the hello claims.
func (s *Server) handshake(c *net.UnixConn, peerPID int) (*session, error) {
	buf := make([]byte, wire.MaxMessageSize)
	b, fds, err := wire.ReadMessage(c, buf)
	if err != nil {
		return nil, err
	}
	h, req, err := wire.ParseRequest(b)
	if err == nil && h.Typ != wire.MsgHello {
		err = fmt.Errorf("%w: first message is %s, want hello", core.ErrInvalidValue, h.Typ)
	}
	hello, _ := req.(wire.HelloRequest)
	want := 0
	if err == nil && hello.Role == wire.RoleClient {
		want = 2
	}
	if err == nil && len(fds) != want {
		err = fmt.Errorf("%w: hello as %s carries %d file descriptors, want %d", core.ErrInvalidValue, roleName(hello.Role), len(fds), want)
	}
	if err != nil {
		wire.CloseFDs(fds)
		wire.WriteMessage(c, wire.EncodeError(h, err), nil)
		return nil, err
	}
	sess := s.newSession(s.nextSessionID.Add(1), peerPID, hello.Role, c)
	if hello.Role == wire.RoleClient {
		ls, err := s.newLaunchState(hello.Coherence, peerPID)
		if err == nil {
			if err = sess.adopt(fds[0], fds[1], s.launchFeatures(hello.Coherence)); err != nil {
				ls.close()
			}
		} else {
			wire.CloseFDs(fds)
		}
		if err != nil {
			wire.WriteMessage(c, wire.EncodeError(h, err), nil)
			return nil, err
		}
		sess.launch = ls.settle(sess.client().uffd.Features())
		if sess.launch != nil {
			sess.record(guard.ModelRecord(string(sess.launch.dirty)))
		}
	}
	if hello.Role == wire.RoleClient {
		s.track(sess.client())
		sess.openSessionTrace(false)
		sess.startAccessSampler()
	}
	s.sessionsMu.Lock()
	s.sessions[sess.id] = sess
	s.sessionsMu.Unlock()
	go sess.remapLoop() // ended by endSession
	var features uint64
	if v := sess.client(); v != nil {
		if err := s.watch(v); err != nil {
			s.endSession(sess)
			wire.WriteMessage(c, wire.EncodeError(h, err), nil)
			return nil, err
		}
		features = uint64(v.uffd.Features())
	}
	reply := wire.EncodeHelloReply(h, wire.HelloReply{ServerPID: uint32(os.Getpid()), SessionID: sess.id, Features: features, Devices: s.Devices(), Coherence: sess.coherence()})
	var replyFDs []int
	if sess.hostReplaced {
		replyFDs = []int{sess.host.Fd()}
	}
	if err := wire.WriteMessage(c, reply, replyFDs); err != nil {
		s.endSession(sess)
		return nil, err
	}
	return sess, nil
}

// adopt takes the client's userfaultfd and host file and does the API
// handshake on its behalf.
func (sess *session) adopt(uffdFD, hostFD int, features uffd.Feature) error {
	host, err := devmem.FileFromFD(hostFD, fmt.Sprintf("host file of pid %d", sess.pid))
	if err != nil {
		syscall.Close(uffdFD)
		return fmt.Errorf("%w: host file: %v", core.ErrInvalidValue, err)
	}
	u := uffd.NewFD(uffdFD)
	granted, err := u.Handshake(features)
	if err != nil {
		u.Close()
		host.Close()
		return fmt.Errorf("%w: userfaultfd handshake: %v", core.ErrInitialization, err)
	}
	if missing := core.RequiredFeatures &^ granted; missing != 0 {
		u.Close()
		host.Close()
		return fmt.Errorf("%w: userfaultfd granted %v, missing %v", core.ErrNotSupported, granted, missing)
	}
	if sess.srv.largeFolios == nil && !host.Large() {
		// The client made an ordinary memfd (it cannot mount a tmpfs):
		// this one takes large folios, and the hello reply hands it over
		// before the client maps anything from its own.
		if large, err := devmem.CreateLargeFolioFile(fmt.Sprintf("softuvm-host-pid%d", sess.pid), devmem.FileSize); err == nil {
			host.Close()
			host = large
			sess.hostReplaced = true
		} else {
			sess.srv.logger.Printf("session %d: host file of large folios: %v (keeping the client's)", sess.id, err)
		}
	}
	sess.host = host
	sess.views[core.CPU.Slot()].Store(&view{sess: sess, loc: core.CPU, pid: sess.pid, uffd: u})
	sess.srv.guard.Send(guard.SessionMsg(sess.id, sess.pid, uint64(granted)), wire.RawFD(sess.conn), u.Fd(), host.Fd())
	return nil
}

// controlLoop answers requests until the peer disconnects.
func (sess *session) controlLoop() {
	buf := make([]byte, wire.MaxMessageSize)
	for {
		b, fds, err := wire.ReadMessage(sess.conn, buf)
		if err != nil {
			if !errors.Is(err, wire.ErrPeerGone) {
				sess.srv.logger.Printf("session %d (pid %d): %v", sess.id, sess.pid, err)
			}
			return
		}
		h, req, err := wire.ParseRequest(b)
		if err == nil && h.Typ == wire.MsgReplace {
			err = sess.replace(fds)
			reply := wire.EncodeEmptyReply(h)
			if err != nil {
				reply = wire.EncodeError(h, err)
			}
			wire.WriteMessage(sess.conn, reply, nil)
			continue
		}
		wire.CloseFDs(fds) // no other request after hello carries descriptors
		if err == nil && h.Status == wire.RequestRetried && h.Seq == sess.lastSeq {
			continue // answered already: this server read it before the client learnt of the restart
		}
		var reply []byte
		if err == nil && h.Typ == wire.MsgHello {
			err = fmt.Errorf("%w: hello sent twice", core.ErrInvalidValue)
		}
		if err == nil && sess.client() == nil && h.Typ != wire.MsgStats && h.Typ != wire.MsgInfo {
			err = fmt.Errorf("%w: %s needs a client session; this is a monitor", core.ErrInvalidValue, h.Typ)
		}
		var replyFDs []int
		if err == nil {
			reply, replyFDs, err = sess.dispatch(h, req)
		}
		sess.lastSeq = h.Seq
		if err != nil {
			reply = wire.EncodeError(h, err)
		}
		werr := wire.WriteMessage(sess.conn, reply, replyFDs)
		wire.CloseFDs(replyFDs) // sent: the peer has its own copies
		if werr != nil {
			return
		}
	}
}

// dispatch answers one request; a reply may carry descriptors.
func (sess *session) dispatch(h wire.Header, req any) ([]byte, []int, error) {
	switch r := req.(type) {
	case wire.AllocRequest:
		id, err := sess.alloc(r)
		if err != nil {
			return nil, nil, err
		}
		return wire.EncodeU64Reply(h, id), nil, nil
	case wire.RangeRequest:
		if h.Typ == wire.MsgFree {
			err := sess.free(uintptr(r.Addr))
			if err != nil && h.Status == wire.RequestRetried && sess.ranges.Load().lookup(uintptr(r.Addr)) == nil {
				err = nil // the server before this one freed it, and died before it could answer
			}
			return wire.EncodeEmptyReply(h), nil, err
		}
		if h.Typ == wire.MsgDiscard {
			return wire.EncodeEmptyReply(h), nil, sess.discard(uintptr(r.Addr), uintptr(r.Length))
		}
		if h.Typ != wire.MsgRangeAttrs {
			break
		}
		a, err := sess.rangeAttributes(uintptr(r.Addr), uintptr(r.Length))
		if err != nil {
			return nil, nil, err
		}
		return wire.EncodeRangeAttrsReply(h, a), nil, nil
	case wire.PrefetchRequest:
		return wire.EncodeEmptyReply(h), nil, sess.prefetch(uintptr(r.Addr), uintptr(r.Length), core.Device(r.Dst))
	case wire.DeviceCopyRequest:
		return wire.EncodeEmptyReply(h), nil, sess.deviceCopy(r)
	case wire.AdviseRequest:
		err := sess.advise(uintptr(r.Addr), uintptr(r.Length), core.Advice(r.Advice), core.Device(r.Device))
		if err == nil {
			sess.record(guard.AdviseRecord(wire.EncodeAdvise(0, r)))
		}
		return wire.EncodeEmptyReply(h), nil, err
	case wire.StatsRequest:
		st, err := sess.statsFor(r)
		if err != nil {
			return nil, nil, err
		}
		b, _ := json.Marshal(st)
		return wire.EncodeStringReply(h, string(b)), nil, nil
	case struct{}: // info
		return wire.EncodeStringReply(h, sess.srv.infoJSON()), nil, nil
	case wire.StreamAttachRequest:
		err := sess.streamAttach(r)
		if err == nil {
			sess.record(guard.AttachRecord(wire.EncodeStreamAttach(0, r)))
		}
		return wire.EncodeEmptyReply(h), nil, err
	case wire.LaunchBeginRequest:
		if sess.tracing() {
			sess.emit(&trace.Event{Kind: trace.KindLaunch, Processor: r.Device, Stream: uint64(r.Stream), Name: r.Kernel})
		}
		return wire.EncodeEmptyReply(h), nil, sess.launchBegin(r)
	case wire.StreamsIdleRequest:
		if sess.tracing() {
			sess.emit(&trace.Event{Kind: trace.KindSync, Processor: r.Device, Stream: uint64(r.Stream)})
		}
		return wire.EncodeEmptyReply(h), nil, sess.streamsIdle(r)
	case wire.TraceControlRequest:
		return wire.EncodeEmptyReply(h), nil, sess.traceControl(r)
	case wire.PeerAccessRequest:
		was, err := sess.peerAccess(r)
		return wire.EncodePeerAccessReply(h, wire.PeerAccessReply{WasEnabled: was}), nil, err
	case wire.DeviceConnectRequest:
		if h.Typ == wire.MsgDeviceFile {
			return sess.deviceFileReply(h, core.Device(r.Device))
		}
		connect := sess.deviceConnect
		if sess.tracesDevices() {
			connect = sess.deviceConnectTraced
		}
		fd, err := connect(core.Device(r.Device))
		if err != nil {
			return nil, nil, err
		}
		return wire.EncodeEmptyReply(h), []int{fd}, nil
	}
	return nil, nil, fmt.Errorf("%w: %s is not a request a client may send", core.ErrInvalidValue, h.Typ)
}

// alloc registers a range the client has mapped from its host file at
// offset == address.
func (sess *session) alloc(r wire.AllocRequest) (uint64, error) {
	mr, err := sess.newRange(r)
	if err != nil {
		return 0, err
	}
	start, length := mr.Start, mr.Length
	sess.mu.Lock()
	defer sess.mu.Unlock()
	// The kernel gave this address to a new mapping, so any range still
	// recorded there was unmapped without a free: it is stale.
	for _, old := range sess.ranges.Load().overlapping(start, length) {
		sess.freeRangeLocked(old, false)
	}
	sess.nextID++
	mr.ID = sess.nextID
	// Publish before registering: a stale fault message that names this
	// address once it is registered must find the range, not be taken
	// for a stray and poisoned.
	sess.ranges.Store(sess.ranges.Load().with(mr))
	sess.countRange(mr)
	if _, err := sess.client().uffd.Register(start, length, sess.hostViewMode(mr.TrackPrefetch)); err != nil {
		sess.ranges.Store(sess.ranges.Load().without(mr))
		sess.retireRange(mr)
		mr.releaseReservation()
		return 0, fmt.Errorf("%w: register %#x+%d with userfaultfd (is it mapped from the host file at offset == address?): %v", core.ErrInvalidValue, start, length, err)
	}
	if err := sess.mapInDevices(mr); err != nil {
		sess.freeRangeLocked(mr, false)
		return 0, err
	}
	sess.record(guard.AllocRecord(wire.EncodeAlloc(0, r)))
	if r.Kind == core.KindManaged {
		// sess.stats, not mr.Stats: an allocation's counters retire into
		// its session's when it is freed, and would count it twice.
		sess.stats.Allocations.Add(1)
		sess.stats.AllocatedBytes.Add(r.Size)
	}
	sess.traceAlloc(mr)
	return mr.ID, nil
}

// newRange makes the range an alloc request describes, reserving device
// memory's capacity, without publishing or registering it.
func (sess *session) newRange(r wire.AllocRequest) (*managedRange, error) {
	prefetch := sess.srv.eng.Policies().Prefetch
	if r.Prefetch != "" {
		spec, err := policy.ParsePrefetchSpec(r.Prefetch)
		if err != nil {
			return nil, err
		}
		if prefetch, err = policy.NewPrefetchPolicy(spec); err != nil {
			return nil, err
		}
	}
	start, length := uintptr(r.Addr), uintptr(r.Length)
	owner := core.CPU
	if r.Kind == core.KindDevice {
		d := core.Device(r.Device)
		if d == core.CPU {
			return nil, fmt.Errorf("%w: device memory on the CPU: use pinned host memory (HostAlloc)", core.ErrInvalidDevice)
		}
		if err := sess.srv.checkDevice(d, "device memory on"); err != nil {
			return nil, err
		}
		// Device memory takes its capacity now, as cudaMalloc does,
		// evicting managed pages if it must.
		owner = core.Device(d)
		if err := sess.srv.eng.Reserve(owner, int64(length/core.PageSize)); err != nil {
			if !errors.Is(err, core.ErrMemoryAllocation) {
				err = fmt.Errorf("%w: %v", core.ErrMemoryAllocation, err)
			}
			return nil, fmt.Errorf("%s of device memory on device %d: %w", core.FormatSize(int64(length)), d, err)
		}
	}
	mr := &managedRange{Range: sess.srv.eng.NewRange(sess, start, length), sess: sess, size: int64(r.Size), flags: r.Flags,
		launch: rangeLaunch{attach: attachOf(r.Flags)}, born: time.Now()}
	mr.Ext, mr.Session, mr.Kind, mr.Owner = mr, sess.id, r.Kind, owner
	mr.Prefetch, mr.TrackPrefetch = prefetch, r.TrackPrefetch || sess.srv.cfg.TrackPrefetchUse
	return mr, nil
}

// replace answers msgReplace: the sender takes this server's place.
func (sess *session) replace(fds []int) error {
	if len(fds) != 1 {
		wire.CloseFDs(fds)
		return fmt.Errorf("%w: replace carries %d descriptors, want 1 (the successor's socket)", core.ErrInvalidValue, len(fds))
	}
	if err := sess.srv.retire(fds[0]); err != nil {
		wire.CloseFDs(fds)
		return err
	}
	return nil
}

// findRange returns the range containing [addr, addr+length), which must
// lie inside one allocation.
func (sess *session) findRange(addr, length uintptr, what string) (*managedRange, error) {
	r := sess.ranges.Load().lookup(addr)
	if r == nil {
		return nil, fmt.Errorf("%w: %s: address %#x is not managed memory of pid %d", core.ErrInvalidValue, what, addr, sess.pid)
	}
	if length > r.End()-addr {
		return nil, fmt.Errorf("%w: %s: range %#x+%d runs past the end of the allocation %#x+%d", core.ErrInvalidValue, what, addr, length, r.Start, r.Length)
	}
	return r, nil
}

func (sess *session) free(addr uintptr) error {
	sess.mu.Lock()
	defer sess.mu.Unlock()
	r := sess.ranges.Load().lookup(addr)
	if r == nil {
		return fmt.Errorf("%w: free %#x: not managed memory of pid %d", core.ErrInvalidValue, addr, sess.pid)
	}
	if r.Start != addr {
		return fmt.Errorf("%w: free %#x: not the start of the allocation at %#x", core.ErrInvalidValue, addr, r.Start)
	}
	sess.auditPrefetch(r, true)
	sess.freeRangeLocked(r, true)
	sess.record(guard.FreeRecord(addr))
	return nil
}

// freeRangeLocked releases everything a range holds. sess.mu is held.
// With wake, threads blocked in faults on the range are woken so that
// they retry against the (unmapped) range and fail as the program's bug
// deserves, instead of waiting forever.
func (sess *session) freeRangeLocked(r *managedRange, wake bool) {
	if r.Freed.Load() {
		return
	}
	sess.noteFreed(r.Start, r.End())
	sess.ranges.Store(sess.ranges.Load().without(r))
	if sess.tracing() && r.Kind == core.KindManaged {
		sess.emit(&trace.Event{Kind: trace.KindFree, Range: r.ID, Addr: uint64(r.Start)})
	}
	resident := r.Free()
	sess.retireRange(r)
	// The rest of the first and last blocks goes too where no range uses
	// it: a large folio a client made there (pinned memory filled, device
	// memory written through its mapping) covers the whole 2 MiB, and the
	// pages past the range would otherwise greet the next range placed
	// there as present (read as zeros, written without a fault). Ranges
	// adopted by libuvm (uvm run) may share a block.
	unused := func(from, to uintptr) bool {
		for _, o := range sess.ranges.Load().overlapping(from, to-from) {
			if o != r {
				return false
			}
		}
		return true
	}
	start, end := r.Start, r.End()
	if head := start &^ (core.BlockSize - 1); unused(head, start) {
		start = head
	}
	if tail := core.RoundUp(end, core.BlockSize); unused(end, tail) {
		end = tail
	}
	fileOff, span := r.FileOff-int64(r.Start-start), int64(end-start)
	if err := sess.host.Punch(fileOff, span); err != nil {
		sess.srv.logger.Printf("free %#x: %v", r.Start, err)
	}
	sess.filesMu.Lock()
	files := append([]*devmem.File(nil), sess.devFiles...)
	sess.filesMu.Unlock()
	for d, f := range files {
		if f == nil {
			continue
		}
		if err := f.Punch(fileOff, span); err != nil {
			sess.srv.logger.Printf("free %#x on device %d: %v", r.Start, d, err)
		}
		if r.Kind != core.KindDevice {
			sess.srv.arenas[d].Release(resident[d+1])
		}
	}
	r.releaseReservation()
	if wake {
		// Threads of every view blocked on the range retry and fail.
		for l := range sess.views {
			if v := sess.viewRef(core.DeviceAtSlot(l)); v != nil {
				_ = v.uffd.Wake(r.Start, r.Length) // ENOENT and ESRCH are fine: nobody waits
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
	name := fmt.Sprintf("softuvm-dev%d-pid%d", d, sess.pid)
	var f *devmem.File
	var err error
	if sess.srv.largeFolios == nil {
		f, err = sess.srv.arenas[d].NewLargeFolioFile(name)
	} else {
		f, err = sess.srv.arenas[d].NewFile(name)
	}
	if err != nil {
		return nil, fmt.Errorf("%w: device %d file: %v", core.ErrMemoryAllocation, d, err)
	}
	sess.devFiles[d] = f
	sess.srv.guard.Send(guard.LocMsg(guard.OpFile, sess.id, core.Device(d)), f.Fd())
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
	sess.stopAccessSampler()
	defer func() {
		sess.watch.close()
		for i := range sess.deviceWatch {
			sess.deviceWatch[i].close()
		}
	}()
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
	sess.launch.close()
	sess.filesMu.Lock()
	for _, f := range sess.devFiles {
		if f != nil {
			f.Close()
		}
	}
	sess.devFiles = nil
	sess.filesMu.Unlock()
	if sess.role == wire.RoleClient {
		s.guard.Send(guard.IDMsg(guard.OpEnd, sess.id))
		// Before the session leaves the list: a closing server waits
		// for the list to empty, then closes its trace.
		sess.endDeviceTraces()
		if sess.tracing() {
			sess.emit(&trace.Event{Kind: trace.KindSessionEnd})
		}
		sess.closeSessionTrace()
	}
	s.sessionsMu.Lock()
	// Its ranges are freed, so its own counters hold everything it
	// counted; they move to the server's in the same step as it leaves the
	// list, so that a sum sees them once.
	if s.sessions[sess.id] == sess {
		s.retired.AddFrom(sess.counters(nil))
	}
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

func (sess *session) info() config.SessionInfo {
	in := config.SessionInfo{ID: sess.id, PID: sess.pid, Role: roleName(sess.role)}
	if sess.role == wire.RoleClient {
		sess.launchInfo(&in)
	}
	for _, r := range sess.ranges.Load().ranges {
		in.Allocations++
		in.ManagedBytes += r.size
		for i := range r.Blocks() {
			if b := r.BlockAt(i); b != nil {
				b.Lock()
				for l := range b.Resident {
					in.ResidentBytes += int64(b.Resident[l].Count()) * core.PageSize
				}
				b.Unlock()
			}
		}
	}
	if sess.host != nil {
		in.HostBytes, _ = sess.host.AllocatedBytes()
		in.FileBytes = in.HostBytes
		for _, n := range sess.deviceFileBytes() {
			in.FileBytes += n
		}
	}
	sess.faultCounts(&in)
	return in
}

// countRange lists r's statistics among the session's.
func (sess *session) countRange(r *managedRange) {
	sess.statsMu.Lock()
	sess.counted[r] = struct{}{}
	sess.statsMu.Unlock()
}

// retireRange moves a freed range's statistics into the session's: once
// it is freed nothing counts into them any more.
func (sess *session) retireRange(r *managedRange) {
	sess.statsMu.Lock()
	defer sess.statsMu.Unlock()
	if _, ok := sess.counted[r]; ok {
		delete(sess.counted, r)
		sess.stats.AddFrom(r.Stats)
	}
}

// counters sums the session's counters: its live ranges' (each passed to
// prepare first, if given) and those that frees retired.
func (sess *session) counters(prepare func(r *managedRange)) *core.Counters {
	if prepare != nil {
		for _, r := range sess.ranges.Load().ranges {
			prepare(r)
		}
	}
	total := core.NewCounters(sess.srv.eng.Locations())
	sess.statsMu.Lock()
	defer sess.statsMu.Unlock()
	total.AddFrom(sess.stats)
	for r := range sess.counted {
		total.AddFrom(r.Stats)
	}
	return total
}

func (sess *session) statsFor(r wire.StatsRequest) (core.Stats, error) {
	switch r.Scope {
	case wire.ScopeServer:
		sess.srv.quiesce()
		return sess.srv.counters().Snapshot(), nil
	case wire.ScopeSession:
		return sess.counters(func(r *managedRange) {
			sess.auditPrefetch(r, false)
			r.Quiesce()
		}).Snapshot(), nil
	}
	mr := sess.ranges.Load().lookup(uintptr(r.Addr))
	if mr == nil {
		return core.Stats{}, fmt.Errorf("%w: stats: address %#x is not managed memory of pid %d", core.ErrInvalidValue, r.Addr, sess.pid)
	}
	sess.auditPrefetch(mr, false)
	mr.Quiesce()
	return mr.Stats.Snapshot(), nil
}

// remapped handles an mremap the client made of managed memory. Moving a
// managed range is not supported: the old addresses are no longer mapped,
// and faults at the new ones find no range and are poisoned, so touching
// moved pages that were not on the host raises SIGBUS instead of reading
// zeros.
func (sess *session) remapped(from, to, length uintptr) {
	sess.srv.logger.Printf("pid %d moved managed memory %#x+%d to %#x with mremap, which softuvm does not support: the moved pages are no longer managed", sess.pid, from, length, to)
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
