package server

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/softuvm/softuvm/internal/block"
	"github.com/softuvm/softuvm/internal/config"
	"github.com/softuvm/softuvm/internal/core"
	"github.com/softuvm/softuvm/internal/guard"
	"github.com/softuvm/softuvm/internal/procinfo"
	"github.com/softuvm/softuvm/internal/wire"
	"github.com/softuvm/softuvm/trace"
)

// TraceEnv names the trace file of one client: a client whose process
// starts with UVM_TRACE=FILE in its environment has its own events
// recorded there (relative names are the client's working directory's).
const TraceEnv = config.EnvTrace

// Recording: a server with ServerConfig.Trace records every session's
// events into s.tracer; a client started with UVM_TRACE records its own
// into sess.tracer. Emitting encodes the event into memory under the
// recorder's own short lock (a leaf: nothing is taken under it), so the
// fault path holds block locks only a few hundred nanoseconds longer;
// the recorder's goroutine writes the file.

// openTrace starts the server's recording, if configured. A server that
// takes over from a dead one records to a file of its own (FILE.pidN),
// so that the dead one's trace stays readable up to where it stopped.
func (s *Server) openTrace(takeover bool) error {
	if s.cfg.Trace == "" {
		return nil
	}
	path := s.cfg.Trace
	if takeover {
		path = fmt.Sprintf("%s.pid%d", path, os.Getpid())
	}
	h := s.traceHeader("server")
	rec, err := trace.Create(path, h)
	if err != nil {
		return fmt.Errorf("recording the server's events (--trace): %w", err)
	}
	s.tracer = rec
	if takeover {
		s.logger.Printf("taking over: recording this server's events to %s", path)
	}
	return nil
}

// traceHeader describes this server in a trace's header.
func (s *Server) traceHeader(scope string) trace.Header {
	h := trace.Header{Devices: len(s.arenas), Scope: scope, HostBudget: s.cfg.HostBudget,
		Policies: map[string]string{"prefetch": s.eng.Policies().Prefetch.Name(), "eviction": s.eng.Policies().Eviction.Name(),
			"thrashing": s.cfg.Thrashing.String(), "access": s.cfg.ParsedAccessPolicy().String()},
		Command: s.cfg.TraceCommand, LargeFolios: s.largeFolios == nil}
	if scope == "server" && s.cfg.TraceAccess.On() {
		h.AccessPeriod, h.AccessSample = time.Duration(s.cfg.TraceAccess.Period), s.cfg.TraceAccess.Sample
	}
	if len(s.arenas) > 0 {
		h.DeviceBytes = s.arenas[0].Capacity()
	}
	h.Host, _ = os.Hostname()
	h.Kernel = procinfo.KernelRelease()
	return h
}

// closeTrace ends the server's recording.
func (s *Server) closeTrace() {
	if s.tracer == nil {
		return
	}
	if err := s.tracer.Close(); err != nil {
		s.logger.Printf("trace: %v", err)
	}
	if _, dropped := s.tracer.Counts(); dropped > 0 {
		s.logger.Printf("trace %s: %d events dropped: the disk did not keep pace", s.cfg.Trace, dropped)
	}
}

// clientTracePath reads UVM_TRACE from the environment client pid
// started with, made absolute against its working directory; "" if
// unset.
func clientTracePath(pid int) (string, error) {
	path, err := procinfo.Env(pid, TraceEnv)
	if err != nil {
		return "", err
	}
	if path == "" || filepath.IsAbs(path) {
		return path, nil
	}
	cwd, err := os.Readlink(fmt.Sprintf("/proc/%d/cwd", pid))
	if err != nil {
		return "", fmt.Errorf("%s=%s is relative, and the client's working directory cannot be read: %v", TraceEnv, path, err)
	}
	return filepath.Join(cwd, path), nil
}

// openSessionTrace starts recording a client's own events where it asks
// for it (UVM_TRACE), and records the session's start. A failure is
// logged, not fatal: the client runs untraced.
func (sess *session) openSessionTrace(takeover bool) {
	path, err := clientTracePath(sess.pid)
	if p := sess.profiler; takeover && p != nil {
		// The profiler's last word wins over UVM_TRACE: it recorded to
		// p.Path, or it stopped.
		path = ""
		if p.Op == wire.TraceStart {
			path = p.Path
		}
	}
	if err == nil && path != "" {
		if takeover {
			path = fmt.Sprintf("%s.pid%d", path, os.Getpid())
		} else {
			path = trace.SessionFile(path, sess.pid)
		}
		err = sess.startSessionTrace(path)
	}
	if err != nil {
		sess.srv.logger.Printf("pid %d: %s: %v (its events are not recorded)", sess.pid, TraceEnv, err)
	}
	if sess.srv.tracer != nil && sess.srv.cfg.TraceAccess.On() {
		sess.traceAccess = sess.srv.cfg.TraceAccess // the server's trace's setting wins
	}
	if sess.tracing() {
		sess.emit(&trace.Event{Kind: trace.KindSession, PID: int32(sess.pid), Name: sess.command()})
	}
}

// startSessionTrace starts recording the session's own events to path.
func (sess *session) startSessionTrace(path string) error {
	h := sess.srv.traceHeader("session")
	if cmd, cerr := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", sess.pid)); cerr == nil {
		h.Command = strings.Split(strings.TrimRight(string(cmd), "\x00"), "\x00")
	}
	own, aerr := clientTraceAccess(sess.pid)
	if aerr != nil {
		sess.srv.logger.Printf("pid %d: the trace's access mode is off: %v", sess.pid, aerr)
	}
	h.AccessPeriod, h.AccessSample = time.Duration(own.Period), own.Sample
	rec, err := trace.Create(path, h)
	if err != nil {
		return err
	}
	sess.traceAccess = own
	sess.tracer.Store(rec)
	return nil
}

// traceControl starts or stops the session's own recording, for the
// profiler API (uvmProfilerStart, uvmProfilerStop). A start while one
// records, or a stop while none does, changes nothing, as CUDA's calls
// are no errors then. A start records to path, or to path.2 and on where
// this process wrote path already (sessionTraceFile), and records the
// session's start; a stop completes the file. The kernels a device
// process runs are in the trace when the process started while it was
// recording (its report socket is given at its hello).
//
// Each start and stop is in the session's journal (the start with the
// file it records to): a server that takes the session over records to
// FILE.pidN while the profiler ran, and nothing after a stop, whatever
// UVM_TRACE says (openSessionTrace).
func (sess *session) traceControl(r wire.TraceControlRequest) error {
	if r.Op == wire.TraceStop {
		if rec := sess.tracer.Swap(nil); rec != nil {
			sess.record(guard.ProfileRecord(wire.EncodeTraceControl(0, r)))
			if err := rec.Close(); err != nil {
				return fmt.Errorf("%w: stop recording pid %d's events: %v", core.ErrInternal, sess.pid, err)
			}
		}
		return nil
	}
	if sess.tracer.Load() != nil {
		return nil
	}
	path := trace.SessionFile(r.Path, sess.pid)
	if err := sess.startSessionTrace(path); err != nil {
		return fmt.Errorf("%w: record pid %d's events to %s: %v", core.ErrInvalidValue, sess.pid, r.Path, err)
	}
	sess.record(guard.ProfileRecord(wire.EncodeTraceControl(0, wire.TraceControlRequest{Op: wire.TraceStart, Path: path})))
	sess.emit(&trace.Event{Kind: trace.KindSession, PID: int32(sess.pid), Name: sess.command()})
	return nil
}

// command is the client's command name, for a session event.
func (sess *session) command() string {
	comm, err := os.ReadFile(fmt.Sprintf("/proc/%d/comm", sess.pid))
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(comm))
}

// closeSessionTrace ends a client's own recording.
func (sess *session) closeSessionTrace() {
	rec := sess.tracer.Swap(nil)
	if rec == nil {
		return
	}
	if err := rec.Close(); err != nil {
		sess.srv.logger.Printf("pid %d: %s: %v", sess.pid, TraceEnv, err)
	}
}

// tracing reports whether anything records this session's events: the
// one check on paths that would otherwise build events for nobody.
func (sess *session) tracing() bool { return sess.srv.tracer != nil || sess.tracer.Load() != nil }

// emit records e, as of now, in the server's trace and the session's
// own.
func (sess *session) emit(e *trace.Event) { sess.emitAt(e, time.Now()) }

// emitAt records e as of t, each trace on its own clock.
func (sess *session) emitAt(e *trace.Event, t time.Time) {
	if e.PID == 0 {
		e.PID = int32(sess.pid)
	}
	if r := sess.srv.tracer; r != nil {
		e.Time = r.Since(t)
		r.Emit(e)
	}
	if r := sess.tracer.Load(); r != nil {
		e.Time = r.Since(t)
		r.Emit(e)
	}
}

// traceEvent records an event of the block engine in the traces of the
// event's session: the migrations, populations and duplications of
// pages, evictions, protections, remote mappings and faults, each where
// it is counted, so that a trace's sums equal the counters.
func traceEvent(ev *block.Event) {
	if ev.R == nil {
		return
	}
	r := rangeOf(ev.R)
	sess := r.sess
	if !sess.tracing() {
		return
	}
	e := trace.Event{Range: r.ID, Addr: uint64(ev.Addr()), Pages: uint32(ev.Pages.Count())}
	switch ev.Kind {
	case block.EvFault:
		e = trace.Event{Kind: trace.KindFault, Thread: ev.Thread, Processor: int32(ev.Processor), Range: r.ID, Addr: uint64(ev.Addr()),
			FaultKind: trace.FaultKind(ev.FaultKind), Write: ev.Write, Duration: ev.Duration, Prefetched: uint32(ev.Prefetched)}
		sess.emitAt(&e, ev.Started)
		return
	case block.EvArrived:
		e.To, e.Cause = int32(ev.To), trace.Cause(ev.Cause)
		if !ev.Populated {
			e.Kind = trace.KindPopulate
			sess.emit(&e)
			return
		}
		e.Kind, e.From = trace.KindMigration, int32(ev.From)
		if ev.Started.IsZero() {
			sess.emit(&e)
			return
		}
		e.Duration = time.Since(ev.Started)
		sess.emitAt(&e, ev.Started)
		return
	case block.EvDuplicated:
		e.Kind, e.To = trace.KindDuplicate, int32(ev.To)
	case block.EvEvicted:
		e.Kind, e.From = trace.KindEviction, int32(ev.From)
	case block.EvProtected:
		e.Kind, e.Processor = trace.KindProtect, int32(ev.Processor)
	case block.EvRemoteMapped:
		e.Kind, e.Processor, e.Pages = trace.KindRemoteMap, int32(ev.Processor), uint32(ev.N)
	default:
		return
	}
	sess.emit(&e)
}

// traceAlloc records an allocation the session made, or one a takeover
// restored. Only managed memory is recorded: device and pinned memory
// never move, and their pages raise no events.
func (sess *session) traceAlloc(r *managedRange) {
	if sess.tracing() && r.Kind == core.KindManaged {
		sess.emit(&trace.Event{Kind: trace.KindAlloc, Range: r.ID, Addr: uint64(r.Start), Bytes: uint64(r.size)})
	}
}
