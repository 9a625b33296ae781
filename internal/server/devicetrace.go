package server

import (
	"errors"
	"fmt"
	"net"
	"sync"
	"syscall"
	"time"

	"github.com/softuvm/softuvm/internal/core"
	"github.com/softuvm/softuvm/internal/device"
	"github.com/softuvm/softuvm/internal/wire"
	"github.com/softuvm/softuvm/trace"
)

// Launches and synchronizations in traces under the fault coherence
// model. A launch and a synchronize go from the client straight to the
// device process, never through the server, so the device process of a
// traced session reports them (internal/wire/devicetrace.go): when the
// client asks for a device process's connection and something records
// the session, the server queues a device-trace notice on it, the first
// message the process reads there, carrying one end of a report socket;
// the process sends batches of records on the other end, and the server
// emits each as a trace event, at the time the process measured it.
//
// A session nobody records gets the connection of today, byte for byte:
// no notice, no socket, and its device processes check a nil pointer per
// launch. Whether the session is recorded is read when the device
// process connects: one attached before a recording started reports
// nothing, and one attached while it ran goes on reporting after it
// stopped (the server then records nothing of it). Under the launch
// coherence model the client tells the server of each launch and
// synchronization itself (MsgLaunchBegin, MsgStreamsIdle), which records
// them there, so device processes are not asked to report: nothing is
// recorded twice.
//
// The guard keeps a copy of the server's end of each report socket with
// the device process's view: a server that takes the session over reads
// on, from the first report the dead one had not read, into its own
// trace (adoptDeviceTrace), so that a kernel run across a takeover is
// traced once.

// tracesDevices reports whether the session's device processes are to
// report their launches and synchronizations.
func (sess *session) tracesDevices() bool { return sess.tracing() && sess.launch == nil }

// deviceTraces are a session's report sockets.
type deviceTraces struct {
	mu     sync.Mutex
	list   []*deviceTrace
	closed bool // the session ended: no new one
}

// deviceTrace is the server's end of one device process's report socket.
type deviceTrace struct {
	sess *session
	dev  core.Device
	conn *net.UnixConn
	// base pairs the server's clock (with its monotonic reading) with
	// CLOCK_MONOTONIC, the clock of the reports' times.
	base   time.Time
	baseNS int64

	// mu is held to read the socket and emit what it held, so that the
	// session's end (endDeviceTraces) emits every report queued before
	// it, and none after: a leaf but for the recorders' locks.
	mu     sync.Mutex
	ended  bool
	buf    []byte
	lost   uint64 // records the process dropped: the socket was full
	failed bool   // a malformed report was logged

	done chan struct{} // closed when serve returns
}

// reportWait bounds how long the end of a session waits for its device
// processes to send their last reports and exit: they do as soon as
// their client is gone, or the server hangs up on them.
const reportWait = 2 * time.Second

// deviceConnectTraced answers MsgDeviceConnect, as deviceConnect does,
// for a session whose device processes report: the connection starts with
// a device-trace notice. If the report socket cannot be made, the device
// process runs unreported, and the log says so.
func (sess *session) deviceConnectTraced(d core.Device) (int, error) {
	if d < 0 || int(d) >= len(sess.srv.arenas) {
		if err := sess.srv.checkDevice(d, "device process for"); err != nil {
			return -1, err
		}
		return -1, fmt.Errorf("%w: a device process for the CPU (%d): want a device", core.ErrInvalidDevice, d)
	}
	local, remote, err := wire.SocketPair(fmt.Sprintf("softuvm-device-%d", d))
	if err != nil {
		return -1, fmt.Errorf("%w: %v", core.ErrInternal, err)
	}
	dt, err := sess.offerDeviceTrace(d, local)
	if err != nil {
		sess.srv.logger.Printf("pid %d device %d: its launches will not be traced: %v", sess.pid, d, err)
	}
	go sess.serveDevice(d, local, dt)
	fd, err := wire.DupCloexec(remote)
	remote.Close()
	return fd, err
}

// offerDeviceTrace makes a report socket for a process of device d and
// queues the notice that carries it on conn, the process's connection,
// where it comes before the device hello's reply. It returns the
// server's end, being served, or nil if the session ended.
func (sess *session) offerDeviceTrace(d core.Device, conn *net.UnixConn) (*deviceTrace, error) {
	ours, theirs, err := wire.SocketPair(fmt.Sprintf("softuvm-device-%d-report", d))
	if err != nil {
		return nil, err
	}
	err = wire.WriteMessage(conn, wire.EncodeDeviceTrace(wire.DeviceTraceNotice{Flags: wire.TraceLaunches}), []int{int(theirs.Fd())})
	theirs.Close() // sent: the process has its own
	if err != nil {
		ours.Close()
		return nil, err
	}
	return sess.serveDeviceTrace(d, ours), nil
}

// adoptDeviceTrace reads on the report socket of an adopted process of
// device d, the server's end of which the guard kept (fd).
func (sess *session) adoptDeviceTrace(d core.Device, fd int) (*deviceTrace, error) {
	conn, err := device.FileConn(uintptr(fd))
	if err != nil {
		return nil, err
	}
	return sess.serveDeviceTrace(d, conn), nil
}

// serveDeviceTrace records what arrives on conn, the server's end of a
// report socket of a process of device d, and returns it; nil (conn
// closed) if the session ended.
func (sess *session) serveDeviceTrace(d core.Device, conn *net.UnixConn) *deviceTrace {
	dt := &deviceTrace{sess: sess, dev: d, conn: conn, buf: make([]byte, 64<<10), done: make(chan struct{})}
	// Read between two readings of the server's clock: the pair is off
	// by at most half the time between them.
	t0 := time.Now()
	dt.baseNS = int64(monotonicNow())
	t1 := time.Now()
	dt.base = t0.Add(t1.Sub(t0) / 2)

	sess.devTraces.mu.Lock()
	closed := sess.devTraces.closed
	if !closed {
		sess.devTraces.list = append(sess.devTraces.list, dt)
	}
	sess.devTraces.mu.Unlock()
	if closed {
		conn.Close()
		return nil
	}
	go dt.serve()
	return dt
}

// serve records the process's reports until it closes its end (it
// exited) or the session ends.
func (dt *deviceTrace) serve() {
	defer close(dt.done)
	if raw, err := dt.conn.SyscallConn(); err == nil {
		// The runtime's poller waits for the socket to be readable; the
		// reads themselves happen under dt.mu.
		raw.Read(func(fd uintptr) bool {
			dt.mu.Lock()
			defer dt.mu.Unlock()
			return dt.drainLocked(int(fd))
		})
	}
	dt.mu.Lock()
	dt.ended = true
	lost := dt.lost
	dt.mu.Unlock()
	dt.conn.Close()
	sess := dt.sess
	sess.devTraces.mu.Lock()
	for i, x := range sess.devTraces.list {
		if x == dt {
			sess.devTraces.list = append(sess.devTraces.list[:i], sess.devTraces.list[i+1:]...)
			break
		}
	}
	sess.devTraces.mu.Unlock()
	if lost > 0 {
		sess.srv.logger.Printf("pid %d device %d: %d launch and synchronization records were not traced: the server did not read them in time", sess.pid, dt.dev, lost)
	}
}

// drainLocked records every report waiting on the socket fd, without
// waiting for more. It returns true once the socket is done with: the
// process closed its end, or the session ended. dt.mu is held.
func (dt *deviceTrace) drainLocked(fd int) bool {
	for !dt.ended {
		n, _, flags, _, err := syscall.Recvmsg(fd, dt.buf, nil, syscall.MSG_DONTWAIT)
		switch {
		case errors.Is(err, syscall.EINTR):
			continue
		case errors.Is(err, syscall.EAGAIN):
			return false
		case err != nil || n == 0:
			return true // the process is gone
		case flags&syscall.MSG_TRUNC != 0:
			dt.malformed(fmt.Errorf("%w: a report over %d bytes", core.ErrInvalidValue, len(dt.buf)))
			continue
		}
		dt.record(dt.buf[:n])
	}
	return true
}

// record emits the events of one report.
func (dt *deviceTrace) record(b []byte) {
	h, req, err := wire.ParseRequest(b)
	rep, ok := req.(wire.DeviceReport)
	if err == nil && !ok {
		err = fmt.Errorf("%w: %s on a report socket, want device-report", core.ErrInvalidValue, h.Typ)
	}
	if err != nil {
		dt.malformed(err)
		return
	}
	dt.lost += uint64(rep.Lost)
	for i := range rep.Records {
		rec := &rep.Records[i]
		e := trace.Event{Kind: trace.KindLaunch, Processor: int32(dt.dev), Stream: uint64(rec.Stream), Name: rec.Name,
			Duration: time.Duration(rec.End - rec.Start)}
		if rec.Kind == wire.ReportSync {
			e.Kind = trace.KindSync
		}
		dt.sess.emitAt(&e, dt.at(rec.Start))
	}
}

// at is the server's time of a CLOCK_MONOTONIC reading.
func (dt *deviceTrace) at(ns uint64) time.Time {
	return dt.base.Add(time.Duration(int64(ns) - dt.baseNS))
}

// malformed logs the first bad report of a process: the others are
// dropped quietly.
func (dt *deviceTrace) malformed(err error) {
	if !dt.failed {
		dt.failed = true
		dt.sess.srv.logger.Printf("pid %d device %d: a malformed launch report (%v); dropped", dt.sess.pid, dt.dev, err)
	}
}

// endDeviceTraces records what the session's device processes report
// until they exit, and closes their report sockets. It runs once the
// device views are detached: a device process sends its last batch as
// it exits, which it does when its client is gone (or closed the
// session, which stops its devices first) or the server hung up on it.
// One that has not exited within reportWait is given up on: what it sent
// is recorded, the rest is lost.
func (sess *session) endDeviceTraces() {
	sess.devTraces.mu.Lock()
	list := sess.devTraces.list
	sess.devTraces.list, sess.devTraces.closed = nil, true
	sess.devTraces.mu.Unlock()
	if len(list) == 0 {
		return
	}
	timer := time.NewTimer(reportWait)
	defer timer.Stop()
	expired := false
	for _, dt := range list {
		if !expired {
			select {
			case <-dt.done:
				continue
			case <-timer.C:
				expired = true
			}
		}
		if raw, err := dt.conn.SyscallConn(); err == nil {
			raw.Control(func(fd uintptr) {
				dt.mu.Lock()
				dt.drainLocked(int(fd))
				dt.ended = true
				dt.mu.Unlock()
			})
		}
		dt.conn.Close() // its reader returns
		<-dt.done
	}
}
