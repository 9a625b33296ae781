package uvm

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"github.com/softuvm/softuvm/devmem"
	"github.com/softuvm/softuvm/internal/core"
	"github.com/softuvm/softuvm/internal/device"
	"github.com/softuvm/softuvm/internal/wire"
)

// Streams on the client's side.
//
// The order between streams is CUDA's: a device's default stream (id 0,
// a nil *Stream in Launch, DefaultStream) is its legacy default stream,
// ordered with every blocking stream of the device: work submitted on it
// first waits for a marker at the end of each blocking stream with work
// in flight, and work submitted on a blocking stream first waits for a
// marker at the legacy stream's end, if it has work in flight (an opWait,
// orderLocked). Streams made with StreamNonBlocking take no part. A
// marker already placed at a stream's end, or already waited for, serves
// again, so a program that uses one stream pays nothing for the order.
//
// A stream's kernels run in its device's process, in the order their
// launch messages arrive on the stream's socket; a synchronize message
// is answered once the kernels before it have run. Work that runs in
// this process instead (PrefetchAsync, MemcpyAsync, MemsetAsync,
// MemcpyPeerAsync, StreamWaitEvent's wait) must run after the kernels
// queued before it and before those queued after, without blocking the
// caller. So each stream has a queue: while it holds anything, launches
// and everything else queue behind it, and a goroutine, the stream's
// executor, runs the queue: it writes launches as it reaches them, and
// before a host operation it writes a synchronize and waits for its
// answer (a marker). With the queue empty, which is the common case, a
// launch is written at once by its caller, as if there were no queue.
//
// Markers are the synchronize messages in flight on a stream's socket,
// in the order they were written; their answers come back in that
// order. Whoever waits for one (a synchronize, an event's synchronize,
// the executor) reads the answers itself if no one else is reading the
// stream's socket, completing the markers in order until its own is
// done, and leaves a goroutine to read the rest; otherwise it waits for
// the reader to complete its marker. An event's record is a marker: its
// time is when its answer was read, which is when the kernels before it
// had finished. A timed record launches the device's built-in
// EventTimeKernel just before its synchronize: the kernel stores the
// time it runs, which is when the kernels before it finished, into a
// slot of pinned host memory, and the client reads it with the answer.

// streamState is the client's side of one stream of a device. Its
// fields are guarded by the device's mu, but for buf, which belongs to
// whoever holds reader.
type streamState struct {
	dp *deviceProc
	id uint32
	// conn is the stream's socket in the running process, nil until the
	// first launch on it (the default stream's comes with the process).
	conn *wire.DirectConn
	// queue holds what waits behind a host operation, first to run
	// first; running says an executor goroutine runs it. A launch
	// queues while queue is not empty.
	queue   []*streamOp
	running bool
	// markers are the synchronizations written whose answers are not
	// read yet, oldest first; reader is the connection someone is
	// reading them from, nil if no one.
	markers []*marker
	reader  *wire.DirectConn
	buf     []byte
	// launched says a launch was written after the last marker.
	launched bool
	// names are the kernels of the launches not yet known to have
	// finished: launches retired+1 to written. A death names them.
	names            []string
	written, retired uint64
	// errs are the errors of the stream's kernels, host operations and
	// hooks that no synchronize has returned yet.
	errs []error
	// dead: the device was reset or the session closed; deadCh is
	// closed then. The executor drops what is queued.
	dead   bool
	deadCh chan struct{}
	// destroyed: StreamDestroy was called, and final is the marker
	// after the stream's last work; ended: the destroy message was
	// written. The state goes once its markers are read.
	destroyed, ended bool
	final            *marker
	// nonBlocking: made with StreamNonBlocking, out of the legacy
	// stream's order; priority is as made (one priority here).
	nonBlocking bool
	priority    int
	// The order with the legacy stream (orderLocked): submitted counts
	// the work submitted; tail is a marker after that work while
	// tailAt == submitted; waited is the legacy stream's marker this
	// stream waits for last, legacyWaits this stream's marker the
	// legacy stream waits for last.
	submitted, tailAt         uint64
	tail, waited, legacyWaits *marker
}

// marker is a point in a stream: done once everything queued on the
// stream before it has finished.
type marker struct {
	ss *streamState
	// seq is the synchronize message's, once written; upto is how many
	// launches the stream had written before it.
	seq     uint32
	upto    uint64
	written bool
	// timed: an event's record, which wants the time the work before
	// it finished; slot is where EventTimeKernel stores it, 0 if none.
	timed bool
	slot  uintptr
	done  chan struct{}
	// Set before done is closed: when the marker completed
	// (CLOCK_MONOTONIC nanoseconds), and why it never will (the
	// device's process died, the device was reset).
	ns  int64
	err error
}

type opKind uint8

const (
	opLaunch  opKind = iota // write a launch
	opMark                  // place a marker (a synchronize's, an event's record)
	opWait                  // wait for another stream's marker (StreamWaitEvent)
	opHost                  // run a function after the kernels before it
	opDestroy               // StreamDestroy
)

// streamOp is one entry of a stream's queue.
type streamOp struct {
	kind     opKind
	name     string
	nthreads int
	grid     *wire.LaunchGridRequest // a grid launch's shape (grid.go), or nil
	params   []byte
	cpu      int32
	m        *marker
	run      func() error
}

func (dp *deviceProc) newState(id uint32) *streamState {
	return &streamState{dp: dp, id: id, deadCh: make(chan struct{})}
}

// state returns stream id's state. dp.mu is held.
func (dp *deviceProc) state(id uint32) *streamState {
	if id == 0 {
		return dp.def
	}
	ss := dp.states[id]
	if ss == nil {
		ss = dp.newState(id)
		dp.states[id] = ss
	}
	return ss
}

func newMarker(ss *streamState) *marker { return &marker{ss: ss, done: make(chan struct{})} }

func (m *marker) isDone() bool {
	select {
	case <-m.done:
		return true
	default:
		return false
	}
}

// markLocked places m at the stream's end: it writes a synchronize, or,
// with nothing in flight on the stream and force unset, completes m at
// once. force writes one whenever the stream has a socket, so that a
// synchronize of an idle stream still learns of a death. dp.mu is held.
func (dp *deviceProc) markLocked(ss *streamState, m *marker, force bool) {
	if ss.conn == nil || (!force && !ss.launched && len(ss.markers) == 0) {
		dp.completeLocked(ss, m, now(), nil)
		return
	}
	if m.timed {
		dp.stampLocked(ss, m)
		if ss.conn == nil { // the launch found the process dead
			dp.completeLocked(ss, m, now(), dp.pending)
			return
		}
	}
	m.seq, m.upto = dp.nextSeq(), ss.written
	if err := send(ss.conn, wire.EncodeStreamRequest(wire.MsgSync, m.seq, ss.id)); err != nil {
		dp.completeLocked(ss, m, now(), dp.died(err))
		return
	}
	m.written = true
	ss.markers = append(ss.markers, m)
	ss.launched = false
}

// stampLocked launches EventTimeKernel for m, with a slot for it to
// store its time in. Without a slot, m gets the time its answer is
// read. dp.mu is held.
func (dp *deviceProc) stampLocked(ss *streamState, m *marker) {
	if len(dp.slots) == 0 {
		// A page of pinned host memory, which every device maps,
		// freed with the session.
		a, err := dp.s.HostAlloc(PageSize, 0)
		if err != nil {
			return
		}
		for off := PageSize - 8; off >= 0; off -= 8 {
			dp.slots = append(dp.slots, a.addr+uintptr(off))
		}
	}
	slot := dp.slots[len(dp.slots)-1]
	dp.slots = dp.slots[:len(dp.slots)-1]
	atomic.StoreInt64(slotWord(slot), 0)
	if err := dp.launchLocked(ss, device.EventTimeKernel, 1, nil, binary.LittleEndian.AppendUint64(nil, uint64(slot)), -1); err != nil {
		dp.slots = append(dp.slots, slot)
		return
	}
	m.slot = slot
}

func slotWord(slot uintptr) *int64 { return (*int64)(unsafe.Pointer(&devmem.BytesAt(slot, 8)[0])) }

// clockBase pairs a reading of CLOCK_MONOTONIC, the clock
// EventTimeKernel reads, with one of the runtime's monotonic clock,
// which reads the same clock without a system call.
var clockBase, clockBaseNS = time.Now(), int64(devmem.MonotonicNow())

// now reads CLOCK_MONOTONIC, within a microsecond.
func now() int64 { return clockBaseNS + int64(time.Since(clockBase)) }

// completeLocked completes m at time t (CLOCK_MONOTONIC nanoseconds),
// failed with err if not nil; a timed marker's time is its slot's.
// dp.mu is held.
func (dp *deviceProc) completeLocked(ss *streamState, m *marker, t int64, err error) {
	if m.isDone() {
		return
	}
	if m.slot != 0 {
		if stamp := atomic.LoadInt64(slotWord(m.slot)); err == nil && stamp != 0 {
			t = stamp
		}
		dp.slots = append(dp.slots, m.slot)
		m.slot = 0
	}
	if m.written && err == nil && m.upto > ss.retired {
		k := int(m.upto - ss.retired)
		n := copy(ss.names, ss.names[k:])
		clear(ss.names[n:])
		ss.names = ss.names[:n]
		ss.retired = m.upto
	}
	m.ns, m.err = t, err
	close(m.done)
}

// tailLocked returns a marker that completes once everything written to
// the stream so far has run, nil if nothing is in flight. dp.mu is held.
func (dp *deviceProc) tailLocked(ss *streamState) *marker {
	if ss.launched {
		m := newMarker(ss)
		dp.markLocked(ss, m, false)
		return m
	}
	if n := len(ss.markers); n > 0 {
		return ss.markers[n-1]
	}
	return nil
}

// barrierLocked returns a marker after everything queued on the stream
// so far, for a synchronize: placed now, or queued behind the stream's
// queue. force is markLocked's. dp.mu is held.
func (dp *deviceProc) barrierLocked(ss *streamState, force bool) *marker {
	if ss.destroyed {
		return ss.final
	}
	m := newMarker(ss)
	if len(ss.queue) > 0 {
		dp.enqueueLocked(ss, &streamOp{kind: opMark, m: m})
	} else {
		dp.markLocked(ss, m, force)
	}
	return m
}

// quiesceAll waits until the work queued so far on every stream of
// every device that has run any has finished, leaving its errors to the
// streams' synchronizes: what a free waits for, as cudaFree.
func (s *Session) quiesceAll() {
	var marks []*marker
	for _, dp := range s.deviceProcs() {
		dp.mu.Lock()
		for _, ss := range dp.states {
			if m := dp.endMarkLocked(ss, false); m != nil {
				marks = append(marks, m)
			}
		}
		dp.mu.Unlock()
	}
	for _, m := range marks {
		m.ss.dp.await(m, m.ss.dp.waitMode())
	}
	s.afterWaits(marks)
}

// waitLegacy waits as a synchronous call issued on the legacy default
// streams of devs does, as CUDA's: for the work submitted so far on each
// one's legacy stream and blocking streams (not on non-blocking ones),
// leaving its errors to their synchronizes. It returns the failure of a
// device it had to wait for, which then fails the call.
func (s *Session) waitLegacy(what string, devs ...*deviceProc) error {
	var marks []*marker
	for i, dp := range devs {
		if slices.Contains(devs[:i], dp) {
			continue
		}
		dp.mu.Lock()
		marks = append(marks, dp.legacyMarksLocked(nil, false)...)
		dp.mu.Unlock()
	}
	for _, m := range marks {
		m.ss.dp.await(m, m.ss.dp.waitMode())
	}
	s.afterWaits(marks)
	var errs []error
	for i, m := range marks {
		dp := m.ss.dp
		if slices.ContainsFunc(marks[:i], func(x *marker) bool { return x.ss.dp == dp }) {
			continue
		}
		dp.mu.Lock()
		if err := dp.refuseFailed(what); err != nil {
			errs = append(errs, err)
		}
		dp.mu.Unlock()
	}
	return core.JoinErrors(errs)
}

// afterWaits tells the launch coherence model that the streams of marks
// have finished what was before them: the CPU may touch what only they
// held. Its errors stay unreported, as the streams' errors do.
func (s *Session) afterWaits(marks []*marker) {
	for i, m := range marks {
		if m.err != nil || slices.ContainsFunc(marks[:i], func(x *marker) bool { return x.ss == m.ss }) {
			continue
		}
		s.coherenceAfterSync(Device(m.ss.dp.index), m.ss.id)
	}
}

// endMarkLocked returns a marker that completes once everything
// submitted on the stream so far has finished, nil if nothing is in
// flight: the one already at its end, or one placed now (queued behind
// its queue, or written after its launches). With reader, a goroutine
// reads its answer, for a waiter that does not read (an executor's
// wait, a query); a synchronize's await reads it itself, on its own
// thread, which costs no wake-up. dp.mu is held.
func (dp *deviceProc) endMarkLocked(ss *streamState, reader bool) *marker {
	var m *marker
	switch {
	case ss.destroyed:
		m = ss.final
	case ss.tail != nil && ss.tailAt == ss.submitted:
		m = ss.tail
	case len(ss.queue) > 0:
		m = newMarker(ss)
		dp.enqueueLocked(ss, &streamOp{kind: opMark, m: m})
	default:
		m = dp.tailLocked(ss)
		if reader {
			dp.ensureReaderLocked(ss)
		}
	}
	if m == nil || m.isDone() {
		return nil
	}
	if !ss.destroyed {
		ss.tail, ss.tailAt = m, ss.submitted
	}
	return m
}

// orderLocked makes the work about to be submitted on ss wait for what
// the legacy order says: on the legacy stream, for the work in flight on
// every blocking stream; on a blocking stream, for the legacy stream's.
// It counts the submission. dp.mu is held.
func (dp *deviceProc) orderLocked(ss *streamState) {
	defer func() { ss.submitted++ }()
	if ss.nonBlocking {
		return
	}
	if ss.id != 0 {
		if m := dp.endMarkLocked(dp.def, true); m != nil && m != ss.waited {
			dp.enqueueLocked(ss, &streamOp{kind: opWait, m: m})
			ss.waited = m
		}
		return
	}
	for _, b := range dp.states {
		if b == ss || b.nonBlocking || b.dead {
			continue
		}
		if m := dp.endMarkLocked(b, true); m != nil && m != b.legacyWaits {
			dp.enqueueLocked(ss, &streamOp{kind: opWait, m: m})
			b.legacyWaits = m
		}
	}
}

// legacyMarksLocked returns markers after the work submitted so far on
// the legacy stream and on every blocking stream of the device but skip:
// what a synchronous call issued on the legacy stream waits for. reader
// is endMarkLocked's. dp.mu is held.
func (dp *deviceProc) legacyMarksLocked(skip *streamState, reader bool) []*marker {
	var marks []*marker
	for _, ss := range dp.states {
		if ss == skip || ss.nonBlocking || ss.dead {
			continue
		}
		if m := dp.endMarkLocked(ss, reader); m != nil {
			marks = append(marks, m)
		}
	}
	return marks
}

// recordLocked places m after everything queued on the stream so far,
// as an event's record, and sees that someone reads its answer. dp.mu
// is held.
func (dp *deviceProc) recordLocked(ss *streamState, m *marker) {
	if len(ss.queue) > 0 {
		dp.enqueueLocked(ss, &streamOp{kind: opMark, m: m})
		return
	}
	dp.markLocked(ss, m, false)
	dp.ensureReaderLocked(ss)
}

// ensureReaderLocked starts a goroutine reading the stream's answers if
// some are awaited and no one reads them. dp.mu is held.
func (dp *deviceProc) ensureReaderLocked(ss *streamState) {
	if ss.reader != nil || len(ss.markers) == 0 || ss.conn == nil {
		return
	}
	conn := ss.conn
	ss.reader = conn
	dp.goWorker(func() { dp.readReplies(ss, conn, nil, waitBlock) })
}

// await waits until m completes, reading the stream's answers itself (as
// mode says) if no one else does.
func (dp *deviceProc) await(m *marker, mode waitMode) {
	ss := m.ss
	for !m.isDone() {
		dp.mu.Lock()
		if m.written && !m.isDone() && ss.reader == nil && ss.conn != nil {
			conn := ss.conn
			ss.reader = conn
			dp.mu.Unlock()
			dp.readReplies(ss, conn, m, mode)
			continue
		}
		dp.mu.Unlock()
		waitClosed(m.done, mode)
	}
}

// readReplies reads the answers of the stream's markers from conn and
// completes them in order, until target is done (nil: until none is
// awaited); others' that remain are left to a goroutine. The caller has
// made conn the stream's reader.
func (dp *deviceProc) readReplies(ss *streamState, conn *wire.DirectConn, target *marker, mode waitMode) {
	if ss.buf == nil {
		ss.buf = make([]byte, 64<<10)
	}
	for {
		b, err := readReply(conn, ss.buf, mode)
		t := now()
		dp.mu.Lock()
		if ss.reader != conn {
			// The connection was shut down under us (the process died
			// or was stopped), and the markers failed with it.
			conn.Close()
			dp.mu.Unlock()
			return
		}
		if err == nil && len(ss.markers) == 0 {
			err = fmt.Errorf("%w: an answer on %s's stream %d that nothing asked for", ErrInternal, dp.name(), ss.id)
		}
		if err != nil {
			dp.died(err) // orphans conn: ss.reader is nil now
			conn.Close()
			dp.mu.Unlock()
			return
		}
		m := ss.markers[0]
		ss.markers[0] = nil
		ss.markers = ss.markers[1:]
		if _, err := wire.ParseReply(b, wire.Header{Typ: wire.MsgSync, Seq: m.seq}); err != nil {
			dp.failDevice(err) // a kernel's error
		}
		dp.completeLocked(ss, m, t, nil)
		if len(ss.markers) == 0 {
			ss.markers = ss.markers[:0:0]
			ss.reader = nil
			dp.endIfIdleLocked(ss)
			dp.mu.Unlock()
			return
		}
		if target != nil && target.isDone() {
			dp.goWorker(func() { dp.readReplies(ss, conn, nil, waitBlock) })
			dp.mu.Unlock()
			return
		}
		dp.mu.Unlock()
	}
}

// enqueueLocked appends op to the stream's queue and starts its
// executor if none runs. dp.mu is held.
func (dp *deviceProc) enqueueLocked(ss *streamState, op *streamOp) {
	ss.queue = append(ss.queue, op)
	if !ss.running {
		ss.running = true
		dp.goWorker(func() { dp.execute(ss) })
	}
}

// execute runs the stream's queue until it is empty, or the stream dies.
func (dp *deviceProc) execute(ss *streamState) {
	dp.mu.Lock()
	defer dp.mu.Unlock()
	for len(ss.queue) > 0 && !ss.dead {
		op := ss.queue[0]
		switch op.kind {
		case opLaunch:
			// Behind a failure the device takes no launch: the failure
			// is what the next synchronize reports. A launch that
			// fails fails the device (launchLocked).
			if dp.failed == nil {
				dp.launchLocked(ss, op.name, op.nthreads, op.grid, op.params, op.cpu)
			}
		case opMark:
			dp.markLocked(ss, op.m, false)
			dp.ensureReaderLocked(ss)
		case opDestroy:
			dp.destroyLocked(ss)
		case opWait:
			dp.mu.Unlock()
			select {
			case <-op.m.done:
			case <-ss.deadCh:
			}
			dp.mu.Lock()
		case opHost:
			tail := dp.tailLocked(ss)
			dp.mu.Unlock()
			var errs []error
			if tail != nil {
				dp.await(tail, waitBlock)
				// The client knows now that the stream's launches have
				// finished: the executor holds back those after.
				if tail.err == nil {
					if err := dp.s.coherenceAfterSync(Device(dp.index), ss.id); err != nil {
						errs = append(errs, err)
					}
				}
			}
			if err := op.run(); err != nil {
				errs = append(errs, err)
			}
			dp.mu.Lock()
			ss.errs = append(ss.errs, errs...)
		}
		ss.queue[0] = nil
		ss.queue = ss.queue[1:]
	}
	if ss.dead {
		dp.dropQueueLocked(ss)
	}
	ss.queue = nil
	ss.running = false
}

// dropQueueLocked fails what a dead stream's queue held. dp.mu is held.
func (dp *deviceProc) dropQueueLocked(ss *streamState) {
	err := fmt.Errorf("%w: %v: the device was reset or the session closed before the stream reached this point", ErrLaunchFailure, ss)
	for _, op := range ss.queue {
		if op.m != nil && op.kind != opWait {
			dp.completeLocked(ss, op.m, now(), err)
		}
	}
	if ss.final != nil {
		dp.completeLocked(ss, ss.final, now(), err)
	}
	ss.queue = nil
}

// launchLocked writes a launch on the stream, starting the device's
// process and opening the stream's socket as needed: of nthreads threads,
// or of a grid of grid's shape. dp.mu is held.
func (dp *deviceProc) launchLocked(ss *streamState, name string, nthreads int, grid *wire.LaunchGridRequest, params []byte, cpu int32) error {
	if ss.dead {
		return ss.deadError()
	}
	if err := dp.refuseFailed("launch on"); err != nil {
		return err
	}
	// A launch that cannot be written fails the device, as one that
	// fails as it runs does: the work after it must not report success.
	if err := dp.ensureRunning(); err != nil {
		return dp.failDevice(err)
	}
	c, err := dp.connLocked(ss)
	if err != nil {
		return dp.failDevice(err)
	}
	if name != device.EventTimeKernel {
		if err := dp.s.coherenceBeforeLaunch(Device(dp.index), ss.id, name); err != nil {
			return dp.failDevice(err)
		}
	}
	ss.names = append(ss.names, name)
	ss.written++
	ss.launched = true
	var msg []byte
	if grid != nil {
		lg := *grid
		lg.Stream, lg.Name, lg.Params, lg.Cpu = ss.id, name, params, cpu
		msg = wire.EncodeLaunchGrid(dp.nextSeq(), lg)
	} else {
		msg = wire.EncodeLaunch(dp.nextSeq(), wire.LaunchRequest{Stream: ss.id, Nthreads: uint32(nthreads), Name: name, Params: params, Cpu: cpu})
	}
	if err := send(c, msg); err != nil {
		dp.died(err) // reported by the next synchronize
	}
	return nil
}

// queueLaunchLocked queues a launch behind the stream's queue, with a
// copy of its parameters. dp.mu is held.
func (dp *deviceProc) queueLaunchLocked(ss *streamState, name string, nthreads int, grid *wire.LaunchGridRequest, params []byte, cpu int32) {
	dp.enqueueLocked(ss, &streamOp{kind: opLaunch, name: name, nthreads: nthreads, grid: grid, params: bytes.Clone(params), cpu: cpu})
}

// destroyLocked ends a destroyed stream once what was queued before has
// been written: its final marker, then the destroy message. dp.mu is
// held.
func (dp *deviceProc) destroyLocked(ss *streamState) {
	dp.markLocked(ss, ss.final, false)
	if ss.conn != nil {
		// The process runs what is queued, answers, then ends the
		// stream; a write that fails found it dead, which the reader
		// or the next launch reports.
		ss.conn.Write(wire.EncodeStreamRequest(wire.MsgStreamDestroy, dp.nextSeq(), ss.id))
	}
	ss.ended = true
	dp.ensureReaderLocked(ss)
	dp.endIfIdleLocked(ss)
}

// endIfIdleLocked forgets a destroyed stream once nothing of it is in
// flight; errors no synchronize returned go to the device's next one.
// dp.mu is held.
func (dp *deviceProc) endIfIdleLocked(ss *streamState) {
	if !ss.ended || len(ss.markers) > 0 || ss.reader != nil {
		return
	}
	if ss.conn != nil {
		ss.conn.Close()
		ss.conn = nil
	}
	dp.pending = joinPending(dp.pending, ss.errs...)
	ss.errs = nil
	if dp.states[ss.id] == ss {
		delete(dp.states, ss.id)
	}
}

// connLocked returns the stream's socket, opening it in the process on
// first use. dp.mu is held and the process runs.
func (dp *deviceProc) connLocked(ss *streamState) (*wire.DirectConn, error) {
	if ss.conn != nil {
		return ss.conn, nil
	}
	local, remote, err := wire.DirectSocketPair(fmt.Sprintf("softuvm-device-%d-stream-%d", dp.index, ss.id))
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrInternal, err)
	}
	err = dp.control.WriteFDs(wire.EncodeStreamRequest(wire.MsgStreamOpen, dp.nextSeq(), ss.id), []int{int(remote.Fd())})
	remote.Close()
	if err != nil {
		local.Close()
		dp.died(err)
		return nil, fmt.Errorf("%w: open stream %d on device %d: %v", ErrLaunchFailure, ss.id, dp.index, err)
	}
	ss.conn = local
	return local, nil
}

// closeConnsLocked closes the streams' sockets. One being read is only
// shut down, which wakes its reader, and orphaned: the reader closes it.
// dp.mu is held.
func (dp *deviceProc) closeConnsLocked() {
	for _, ss := range dp.states {
		if ss.conn == nil {
			continue
		}
		if ss.reader == ss.conn {
			syscall.Shutdown(ss.conn.Fd, syscall.SHUT_RDWR)
			ss.reader = nil
		} else {
			ss.conn.Close()
		}
		ss.conn = nil
	}
}

// failLocked fails every marker in flight with err: their answers will
// never come. dp.mu is held.
func (dp *deviceProc) failLocked(err error) {
	t := now()
	for _, ss := range dp.states {
		for _, m := range ss.markers {
			dp.completeLocked(ss, m, t, err)
		}
		ss.markers = nil
		ss.launched = false
		clear(ss.names)
		ss.names = ss.names[:0]
		ss.retired = ss.written
		dp.endIfIdleLocked(ss)
	}
}

// goWorker runs f on a goroutine that stop waits for. dp.mu is held.
func (dp *deviceProc) goWorker(f func()) {
	if dp.workers == 0 {
		dp.idle = make(chan struct{})
	}
	dp.workers++
	go func() {
		defer dp.workerDone()
		f()
	}()
}

func (dp *deviceProc) workerDone() {
	dp.mu.Lock()
	defer dp.mu.Unlock()
	if dp.workers--; dp.workers == 0 {
		close(dp.idle)
	}
}

// waitWorkersLocked waits, with dp.mu released, up to limit for the
// executors and readers to end. dp.mu is held.
func (dp *deviceProc) waitWorkersLocked(limit time.Duration) {
	if dp.workers == 0 {
		return
	}
	idle := dp.idle
	dp.mu.Unlock()
	defer dp.mu.Lock()
	select {
	case <-idle:
	case <-time.After(limit):
	}
}

// killLocked ends every stream of the device: their executors drop what
// they hold, and their waits end. dp.mu is held.
func (dp *deviceProc) killLocked() {
	for _, ss := range dp.states {
		if !ss.dead {
			ss.dead = true
			close(ss.deadCh)
		}
		if !ss.running {
			dp.dropQueueLocked(ss)
		}
	}
}

// joinPending adds errs to an error not reported yet.
func joinPending(pending error, errs ...error) error {
	if len(errs) == 0 {
		return pending
	}
	if pending != nil {
		errs = append([]error{pending}, errs...)
	}
	return core.JoinErrors(errs)
}

// DefaultStream returns a handle on device d's default stream (stream
// 0), usable wherever a *Stream is: the stream a nil *Stream means in
// Launch. It is never destroyed; DeviceReset does not make it stale. A
// handle on a device that does not exist fails every call it is given
// to, with ErrInvalidDevice.
func (s *Session) DefaultStream(d Device) *Stream {
	if s.checkDevice(d, "default stream of") != nil {
		return &Stream{s: s, device: int(d)}
	}
	dp := s.deviceProc(d)
	dp.mu.Lock()
	defer dp.mu.Unlock()
	return dp.defHandle
}

// queueHost queues run on the stream, after the work queued before it:
// the stream's executor runs it once the kernels before it finished, and
// its error comes back from the stream's next synchronize.
func (s *Session) queueHost(st *Stream, what string, run func() error) error {
	dp, err := s.streamProc(st, what)
	if err != nil {
		return err
	}
	defer dp.mu.Unlock()
	ss := dp.state(st.id)
	if err := dp.submittable(ss, what); err != nil {
		return err
	}
	dp.orderLocked(ss)
	dp.enqueueLocked(ss, &streamOp{kind: opHost, run: run})
	return nil
}

// queueHostNowIfIdle is queueHost for what must take effect in stream
// order but costs little: on a stream with nothing in flight (nor any
// other stream's work to wait for) it runs at once, on the calling
// goroutine, and returns run's error (StreamAttachMemAsync: the next
// launch on any stream sees it).
func (s *Session) queueHostNowIfIdle(st *Stream, what string, run func() error) error {
	dp, err := s.streamProc(st, what)
	if err != nil {
		return err
	}
	ss := dp.state(st.id)
	if err := dp.submittable(ss, what); err != nil {
		dp.mu.Unlock()
		return err
	}
	dp.orderLocked(ss)
	if len(ss.queue) > 0 || ss.launched || len(ss.markers) > 0 {
		dp.enqueueLocked(ss, &streamOp{kind: opHost, run: run})
		dp.mu.Unlock()
		return nil
	}
	dp.mu.Unlock()
	return run()
}

// LaunchHostFunc runs fn on a goroutine of the stream's in stream order,
// as cudaLaunchHostFunc: once the work submitted on st before it has
// finished (for unified memory the stream is then idle: under the launch
// model its kernels have given the memory back), and the work submitted
// after it waits until fn returns. As CUDA's, fn must not call the
// Session's methods that wait for streams (synchronizes, frees,
// synchronous copies and fills): they would wait for the stream running
// it. st must not be nil: DefaultStream(d) is device d's default stream.
func (s *Session) LaunchHostFunc(st *Stream, fn func()) error {
	if fn == nil {
		return fmt.Errorf("%w: launch a host function: fn is nil", ErrInvalidValue)
	}
	if st == nil {
		return fmt.Errorf("%w: launch a host function on a nil stream: no device is named; pass a stream, or DefaultStream(device)", ErrInvalidValue)
	}
	return s.queueHost(st, "launch a host function on", func() error {
		fn()
		return nil
	})
}

// StreamAddCallback is LaunchHostFunc with fn(st, status), as
// cudaStreamAddCallback: status is nil, or the error of the work before
// it (the device's failure, else an operation queued before it that
// failed and no synchronize has reported yet). flags must be 0.
func (s *Session) StreamAddCallback(st *Stream, fn func(st *Stream, status error), flags uint32) error {
	if flags != 0 {
		return fmt.Errorf("%w: stream callback flags %#x: want 0", ErrInvalidValue, flags)
	}
	if fn == nil {
		return fmt.Errorf("%w: add a stream callback: fn is nil", ErrInvalidValue)
	}
	if st == nil {
		return fmt.Errorf("%w: add a callback to a nil stream: no device is named; pass a stream, or DefaultStream(device)", ErrInvalidValue)
	}
	dp := s.deviceProc(Device(st.device))
	return s.queueHost(st, "add a callback to", func() error {
		dp.mu.Lock()
		status := dp.failed
		if ss := dp.state(st.id); status == nil && len(ss.errs) > 0 {
			status = ss.errs[0] // an operation queued before it failed
		}
		dp.mu.Unlock()
		fn(st, status)
		return nil
	})
}

// StreamQuery says whether the work submitted on st has finished, as
// cudaStreamQuery: nil once what StreamSynchronize would wait for has
// finished (for a default stream, the blocking streams' work too),
// ErrNotReady while it runs, or the device's failure. A stream whose
// kernels may still run gets a marker at its end, read by a goroutine of
// its own, so that a later query learns when they finished.
func (s *Session) StreamQuery(st *Stream) error {
	if st == nil {
		return fmt.Errorf("%w: query a nil stream: no device is named; pass a stream, or DefaultStream(device)", ErrInvalidValue)
	}
	dp, err := s.streamProc(st, "query")
	if err != nil {
		return err
	}
	defer dp.mu.Unlock()
	ss := dp.state(st.id)
	if err := dp.refuseFailed("query stream on"); err != nil {
		return err
	}
	marks := []*marker{dp.endMarkLocked(ss, true)}
	if st.id == 0 {
		marks = append(marks, dp.legacyMarksLocked(ss, true)...)
	}
	for _, m := range marks {
		if m != nil && !m.isDone() {
			return fmt.Errorf("%w: %v has work that has not finished", ErrNotReady, ss)
		}
	}
	return nil
}

// submittable returns an error if the stream takes no more work: usable
// says why not, or its device failed. dp.mu is held.
func (dp *deviceProc) submittable(ss *streamState, what string) error {
	if err := ss.usable(what); err != nil {
		return err
	}
	return dp.refuseFailed(what)
}

// failDevice records that a launch on the device failed (err): as it was
// written, or as it ran (a kernel's error, the death of the process).
// The device has failed, as a CUDA context does on a kernel fault: every
// later synchronize of it and of its streams, and every event of it,
// reports the failure, and it takes no work, until DeviceReset. It
// returns err. dp.mu is held.
func (dp *deviceProc) failDevice(err error) error {
	if dp.failed == nil {
		dp.failed = err
	} else if !errors.Is(dp.failed, err) {
		dp.failed = errors.Join(dp.failed, err)
	}
	return err
}

// refuseFailed returns the device's failure, if it failed, as what's.
// dp.mu is held.
func (dp *deviceProc) refuseFailed(what string) error {
	if dp.failed == nil {
		return nil
	}
	return &failedError{what: fmt.Sprintf("%s device %d", what, dp.index), err: dp.failed}
}

// failedError is work refused on a failed device: the failure, as what
// it was refused for.
type failedError struct {
	what string
	err  error
}

func (e *failedError) Error() string {
	return fmt.Sprintf("%s: it failed earlier (DeviceReset clears that): %v", e.what, e.err)
}

func (e *failedError) Unwrap() error { return e.err }

// usable returns an error if the stream takes no more work: it was
// destroyed, or its device is being reset or its session closed. dp.mu
// is held.
func (ss *streamState) usable(what string) error {
	switch {
	case ss.dead:
		return ss.deadError()
	case ss.destroyed:
		return fmt.Errorf("%w: %s %v: the stream was destroyed", ErrInvalidValue, what, ss)
	}
	return nil
}

func (ss *streamState) deadError() error {
	return fmt.Errorf("%w: %v: the device is being reset, or its session closed", ErrInvalidValue, ss)
}

func (ss *streamState) String() string {
	return fmt.Sprintf("stream %d of device %d", ss.id, ss.dp.index)
}

func (dp *deviceProc) name() string { return fmt.Sprintf("device %d", dp.index) }
