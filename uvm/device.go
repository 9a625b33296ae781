package uvm

import (
	"errors"
	"sync/atomic"

	"fmt"
	"os"
	"os/exec"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/softuvm/softuvm/devmem"
	"github.com/softuvm/softuvm/internal/config"
	"github.com/softuvm/softuvm/internal/core"
	"github.com/softuvm/softuvm/internal/device"
	"github.com/softuvm/softuvm/internal/wire"
)

// deviceProc is the client's handle on one device's process, started on
// first use (a launch) and again after it dies or is reset. Launches go to
// it directly, over a socket of their own: the fault server is not on the
// path of a launch.
type deviceProc struct {
	s     *Session
	index int
	// flags are the session's device flags (SetDeviceFlags).
	flags atomic.Uint32

	// mu serializes the use of the process and of the streams' state
	// (stream.go): launches, the writing of synchronizations, restarts.
	// Nobody waits for the process with it held. Guards every field
	// below.
	mu sync.Mutex
	// control opens streams in the process. Nil while no process runs.
	control *wire.DirectConn
	cmd     *exec.Cmd
	exited  chan struct{} // closed when cmd has been waited for
	gen     uint64        // incremented by each reset: older streams are stale
	pending error         // a destroyed stream's errors not yet reported by a synchronize
	// failed is the device's failure (failDevice): a launch that failed,
	// reported by every synchronize until DeviceReset.
	failed error
	// states holds the client's side of every stream in use, def (the
	// default stream's) at 0; defHandle is DefaultStream's handle.
	states     map[uint32]*streamState
	def        *streamState
	defHandle  *Stream
	nextStream uint32
	seq        uint32
	buf        []byte
	// workers counts the streams' executors and readers; idle is
	// closed when it falls to 0.
	workers int
	idle    chan struct{}
	// slots are free 8-byte slots of pinned host memory where
	// EventTimeKernel stores event times (stream.go).
	slots []uintptr
}

// Stream is an ordered queue of work on one device, as a CUDA stream: its
// kernels, and the operations queued on it (PrefetchAsync, MemcpyAsync,
// MemsetAsync, MemcpyPeerAsync, StreamAttachMemAsync, LaunchHostFunc,
// StreamAddCallback, EventRecord, StreamWaitEvent), run one after
// another, and other streams' work may run at the same time, within
// CUDA's order: a device's default stream (a nil *Stream given to
// Launch; DefaultStream returns a handle on it) is its legacy default
// stream, whose work waits for the work submitted before it on every
// blocking stream of the device, and whose work the blocking streams'
// later work waits for. Streams are blocking unless made with
// StreamNonBlocking. Go has no per-thread default stream (a goroutine
// has no identity): a stream of a goroutine's own made with
// StreamCreate orders its work as one would, with the legacy stream and
// no other.
type Stream struct {
	s        *Session
	device   int
	id       uint32
	gen      uint64
	flags    uint32
	priority int
}

// Stream flags, as cudaStreamCreateWithFlags's.
const (
	// StreamDefault: a blocking stream, ordered with the device's legacy
	// default stream.
	StreamDefault = 0x0
	// StreamNonBlocking: a stream that never waits for the legacy
	// default stream, nor it for the stream.
	StreamNonBlocking = 0x1
)

func processEnd(ps *os.ProcessState) string {
	if ps == nil {
		return "exited"
	}
	if ws, ok := ps.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return fmt.Sprintf("was killed by signal %d (%v)", int(ws.Signal()), ws.Signal())
	}
	return fmt.Sprintf("exited with status %d", ps.ExitCode())
}

// Device returns the stream's device.
func (st *Stream) Device() Device { return Device(st.device) }

func (st *Stream) String() string {
	return fmt.Sprintf("stream %d of device %d", st.id, st.device)
}

// checkDevice accepts the session's devices (not the CPU).
func (s *Session) checkDevice(d Device, what string) error {
	if d >= 0 && int(d) < len(s.devices) {
		return nil
	}
	return fmt.Errorf("%w: %s %v: %s", ErrInvalidDevice, what, d, s.deviceChoicesNoCPU())
}

func (s *Session) deviceChoicesNoCPU() string {
	switch len(s.devices) {
	case 0:
		return "there are no devices"
	case 1:
		return "want device 0, the only one"
	}
	return fmt.Sprintf("want a device from 0 to %d", len(s.devices)-1)
}

func (s *Session) deviceProc(d Device) *deviceProc {
	s.devMu.Lock()
	defer s.devMu.Unlock()
	if s.devs == nil {
		s.devs = make([]*deviceProc, len(s.devices))
	}
	if s.devs[d] == nil {
		dp := &deviceProc{s: s, index: int(d), buf: make([]byte, 64<<10)}
		dp.defHandle = &Stream{s: s, device: int(d)}
		dp.resetStates()
		s.devs[d] = dp
	}
	return s.devs[d]
}

// deviceProcs returns the devices' handles made so far: those that may
// have work.
func (s *Session) deviceProcs() []*deviceProc {
	s.devMu.Lock()
	defer s.devMu.Unlock()
	var dps []*deviceProc
	for _, dp := range s.devs {
		if dp != nil {
			dps = append(dps, dp)
		}
	}
	return dps
}

// resetStates starts the streams' state afresh: the default stream's
// alone. dp.mu is held, or dp is new.
func (dp *deviceProc) resetStates() {
	dp.def = dp.newState(0)
	dp.states = map[uint32]*streamState{0: dp.def}
}

// StreamCreate makes a new blocking stream on device d.
func (s *Session) StreamCreate(d Device) (*Stream, error) {
	return s.StreamCreateWithPriority(d, StreamDefault, 0)
}

// StreamCreateWithFlags makes a new stream on device d, as
// cudaStreamCreateWithFlags: flags StreamDefault (blocking) or
// StreamNonBlocking.
func (s *Session) StreamCreateWithFlags(d Device, flags uint32) (*Stream, error) {
	return s.StreamCreateWithPriority(d, flags, 0)
}

// StreamCreateWithPriority is StreamCreateWithFlags with a priority, as
// cudaStreamCreateWithPriority. Streams have one priority here
// (DeviceGetStreamPriorityRange): as CUDA's, one outside the range is
// taken as the nearest in it.
func (s *Session) StreamCreateWithPriority(d Device, flags uint32, priority int) (*Stream, error) {
	if flags&^StreamNonBlocking != 0 {
		return nil, fmt.Errorf("%w: stream flags %#x: want StreamDefault (0) or StreamNonBlocking (%#x)", ErrInvalidValue, flags, StreamNonBlocking)
	}
	if err := s.checkDevice(d, "stream on"); err != nil {
		return nil, err
	}
	dp := s.deviceProc(d)
	dp.mu.Lock()
	defer dp.mu.Unlock()
	dp.nextStream++
	ss := dp.newState(dp.nextStream)
	ss.nonBlocking = flags&StreamNonBlocking != 0
	dp.states[dp.nextStream] = ss
	return &Stream{s: s, device: int(d), id: dp.nextStream, gen: dp.gen, flags: flags}, nil
}

// DeviceGetStreamPriorityRange returns the least and greatest stream
// priorities, as cudaDeviceGetStreamPriorityRange: 0 and 0, since the
// streams of a CPU device run on its threads alike.
func (s *Session) DeviceGetStreamPriorityRange() (least, greatest int) { return 0, 0 }

// Flags returns the flags the stream was made with (StreamDefault for a
// default stream).
func (st *Stream) Flags() uint32 { return st.flags }

// Priority returns the stream's priority (always 0: see
// DeviceGetStreamPriorityRange).
func (st *Stream) Priority() int { return st.priority }

// StreamDestroy destroys a stream, as cudaStreamDestroy: it returns at
// once, and the work queued on the stream still runs; the handle is
// stale from now on. Errors of that work no synchronize of the stream
// returned come back from the device's next synchronize. A default
// stream (nil, DefaultStream) cannot be destroyed.
func (s *Session) StreamDestroy(st *Stream) error {
	if st == nil || (st.s == s && st.id == 0) {
		return fmt.Errorf("%w: the default stream cannot be destroyed", ErrInvalidValue)
	}
	dp, err := s.streamProc(st, "destroy")
	if err != nil {
		return err
	}
	defer dp.mu.Unlock()
	st.gen = ^uint64(0) // stale from now on
	ss := dp.state(st.id)
	ss.destroyed = true
	ss.final = newMarker(ss)
	if len(ss.queue) > 0 {
		dp.enqueueLocked(ss, &streamOp{kind: opDestroy})
	} else {
		dp.destroyLocked(ss)
	}
	return nil
}

// streamProc returns the stream's device process, locked, or an error if
// the stream belongs to another session or was destroyed or reset.
func (s *Session) streamProc(st *Stream, what string) (*deviceProc, error) {
	if st.s != s {
		return nil, fmt.Errorf("%w: %s %v: the stream belongs to another session", ErrInvalidValue, what, st)
	}
	if st.device < 0 || st.device >= len(s.devices) {
		return nil, fmt.Errorf("%w: %s %v: %s", ErrInvalidDevice, what, st, s.deviceChoicesNoCPU())
	}
	dp := s.deviceProc(Device(st.device))
	dp.mu.Lock()
	if st.id != 0 && st.gen != dp.gen {
		dp.mu.Unlock()
		return nil, fmt.Errorf("%w: %s %v: the stream was destroyed (by StreamDestroy or DeviceReset)", ErrInvalidValue, what, st)
	}
	return dp, nil
}

// Launch runs kernel name on device d with nthreads threads, as a CUDA
// kernel launch: asynchronously, after the work queued before it on the
// stream (nil: the device's default stream). params are copied. Errors
// of the kernel itself, and the death of the device's process, are
// reported by the next synchronize of the stream or device; the device
// then starts afresh at the next launch.
func (s *Session) Launch(d Device, st *Stream, name string, nthreads int, params []byte) error {
	if err := s.checkDevice(d, "launch on"); err != nil {
		return err
	}
	if _, ok := device.LookupKernel(name); !ok {
		return fmt.Errorf("%w: launch of kernel %q: no kernel of that name is registered (RegisterKernel in an init function)", ErrInvalidValue, name)
	}
	if nthreads < 1 || nthreads > wire.MaxLaunchThreads {
		return fmt.Errorf("%w: launch of kernel %q with %d threads: want 1 to %d", ErrInvalidValue, name, nthreads, wire.MaxLaunchThreads)
	}
	return s.launch(d, st, name, nthreads, nil, params)
}

// launch submits a launch of kernel name, nthreads threads or a grid, on
// stream st of device d (nil: its legacy default stream), in CUDA's
// order (orderLocked): written at once, or queued behind the stream's
// host work and the other streams' work it waits for; refused once the
// device has failed (submittable).
func (s *Session) launch(d Device, st *Stream, name string, nthreads int, grid *wire.LaunchGridRequest, params []byte) error {
	if len(params) > MaxKernelParams {
		return fmt.Errorf("%w: launch of kernel %q with %d bytes of parameters: at most %d", ErrInvalidValue, name, len(params), MaxKernelParams)
	}
	var dp *deviceProc
	var ss *streamState
	if st == nil {
		dp = s.deviceProc(d)
		dp.mu.Lock()
		ss = dp.def
	} else {
		if st.device != int(d) {
			return fmt.Errorf("%w: launch on device %d with %v", ErrInvalidValue, d, st)
		}
		var err error
		if dp, err = s.streamProc(st, "launch on"); err != nil {
			return err
		}
		ss = dp.state(st.id)
	}
	defer dp.mu.Unlock()
	if err := dp.submittable(ss, "launch on"); err != nil {
		return err
	}
	cpu := dp.cpuHint()
	dp.orderLocked(ss)
	if len(ss.queue) > 0 {
		// Behind a host operation or another stream's work: the
		// stream's executor writes it.
		dp.queueLaunchLocked(ss, name, nthreads, grid, params, cpu)
		return nil
	}
	return dp.launchLocked(ss, name, nthreads, grid, params, cpu)
}

// cpuHint is a launch's Cpu field: the launching thread's CPU, for the
// stream's thread to follow, and whether the synchronize that follows
// will poll (device.LaunchCPUHint).
func (dp *deviceProc) cpuHint() int32 {
	cpu, err := devmem.CurrentCPU()
	if err != nil {
		return -1
	}
	return device.LaunchCPUHint(cpu, dp.waitMode() == waitSpin)
}

// StreamSynchronize waits for the work queued on the stream, its kernels
// and the operations queued on it, and returns their errors not returned
// yet (a queued operation's error) and the device's failure (a launch
// that failed: a kernel's error, the death of the device's process),
// which every synchronize returns until DeviceReset. It waits as the
// device flags' schedule says (SetDeviceFlags). A device's default
// stream is DefaultStreamSynchronize's, or DefaultStream's handle's;
// waiting for it is waiting for the blocking streams' work before it.
func (s *Session) StreamSynchronize(st *Stream) error {
	if st == nil {
		return fmt.Errorf("%w: synchronize a nil stream: the default stream belongs to a device, use DefaultStreamSynchronize(device) or DefaultStream(device)", ErrInvalidValue)
	}
	dp, err := s.streamProc(st, "synchronize")
	if err != nil {
		return err
	}
	return dp.synchronize(st.id)
}

// DefaultStreamSynchronize waits for device d's default stream: its work
// and, as the legacy stream's work waits for theirs, the work of every
// blocking stream of d.
func (s *Session) DefaultStreamSynchronize(d Device) error {
	if err := s.checkDevice(d, "synchronize"); err != nil {
		return err
	}
	dp := s.deviceProc(d)
	dp.mu.Lock()
	return dp.synchronize(0)
}

// DeviceSynchronize waits for every stream of device d, destroyed ones
// whose work still runs included, and returns their errors and the
// device's failure.
func (s *Session) DeviceSynchronize(d Device) error {
	if err := s.checkDevice(d, "synchronize"); err != nil {
		return err
	}
	dp := s.deviceProc(d)
	dp.mu.Lock()
	return dp.synchronize(wire.AllStreams)
}

// synchronize waits for stream (wire.AllStreams: every stream) and
// returns the errors not reported yet. It is called with dp.mu held and
// returns with it released: it waits without it.
func (dp *deviceProc) synchronize(stream uint32) error {
	var markBuf [1]*marker
	var stateBuf [1]*streamState
	marks, states := markBuf[:0], stateBuf[:0]
	if stream == wire.AllStreams {
		for _, ss := range dp.states {
			states = append(states, ss)
			marks = append(marks, dp.barrierLocked(ss, true))
		}
	} else {
		ss := dp.state(stream)
		states = append(states, ss)
		marks = append(marks, dp.barrierLocked(ss, true))
		if stream == 0 {
			marks = append(marks, dp.legacyMarksLocked(ss, false)...)
		}
	}
	mode := dp.waitMode()
	dp.mu.Unlock()
	for _, m := range marks {
		dp.await(m, mode)
	}
	dp.mu.Lock()
	var errs []error
	if dp.failed != nil {
		errs = append(errs, dp.failed)
	}
	if dp.pending != nil {
		errs = append(errs, dp.pending)
		dp.pending = nil
	}
	for _, ss := range states {
		errs = append(errs, ss.errs...)
		clear(ss.errs)
		ss.errs = ss.errs[:0]
	}
	dp.mu.Unlock()
	if err := dp.s.coherenceAfterSync(Device(dp.index), stream); err != nil {
		errs = append(errs, err)
	}
	return core.JoinErrors(errs)
}

// DeviceReset stops device d's process and destroys its streams, as
// cudaDeviceReset ends a device's context. Managed memory stays: it
// belongs to the session, and the pages resident on the device stay in
// its arena. The next launch starts a new process.
func (s *Session) DeviceReset(d Device) error {
	if err := s.checkDevice(d, "reset"); err != nil {
		return err
	}
	dp := s.deviceProc(d)
	dp.mu.Lock()
	defer dp.mu.Unlock()
	_ = dp.stop() // a reset ends the process however it is: a stuck one is why it is reset
	dp.gen++
	dp.pending = nil
	dp.failed = nil
	dp.resetStates()
	return nil
}

// PrefetchAsync migrates [addr, addr+n) to dst (a device, or CPU) in
// stream order, as cudaMemPrefetchAsync: it checks its arguments and
// returns at once; the migration runs once the work queued on st before
// it has finished, and the work queued after it waits for it. Its error
// comes back from st's next synchronize (StreamSynchronize,
// DeviceSynchronize). A nil st is dst's default stream; a prefetch to
// the CPU names no device, and needs a stream (DefaultStream(d) for a
// device's default one).
func (s *Session) PrefetchAsync(addr uintptr, n int64, dst Device, st *Stream) error {
	if dst != CPU && (dst < 0 || int(dst) >= len(s.devices)) {
		return fmt.Errorf("%w: prefetch to %v: %s", ErrInvalidDevice, dst, s.deviceChoices())
	}
	if err := s.refuseUnderLaunchModel("prefetch to", dst); err != nil {
		return err
	}
	if _, _, _, err := s.pageRange("prefetch", addr, n); err != nil {
		return err
	}
	if st == nil {
		if dst == CPU {
			return fmt.Errorf("%w: prefetch of %#x+%d to the CPU on a nil stream: no device's default stream is meant; pass a stream, or DefaultStream(device)", ErrInvalidValue, addr, n)
		}
		st = s.DefaultStream(dst)
	}
	return s.queueHost(st, "prefetch on", func() error {
		if err := s.Prefetch(addr, n, dst); err != nil {
			return fmt.Errorf("PrefetchAsync of %#x+%d to %v on %v: %w", addr, n, dst, st, err)
		}
		return nil
	})
}

func (dp *deviceProc) nextSeq() uint32 { dp.seq++; return dp.seq }

// died records that the process went away, naming what it was running,
// reaps it, fails the synchronizations in flight, and returns the error
// it recorded. dp.mu is held. The error that revealed it (a broken pipe,
// an end of file) says nothing the exit status does not.
func (dp *deviceProc) died(error) error {
	how := "exited"
	pid := 0
	if dp.cmd != nil {
		pid = dp.cmd.Process.Pid
		select {
		case <-dp.exited:
		case <-time.After(2 * time.Second):
			dp.cmd.Process.Kill()
			<-dp.exited
		}
		how = processEnd(dp.cmd.ProcessState)
	}
	var running []string
	for _, ss := range dp.states {
		for _, n := range ss.names {
			running = append(running, fmt.Sprintf("%q (stream %d)", n, ss.id))
		}
	}
	sort.Strings(running)
	what := "with no kernel running"
	switch len(running) {
	case 0:
	case 1:
		what = "while kernel " + running[0] + " was running or queued"
	default:
		what = "while kernels " + strings.Join(running, ", ") + " were running or queued"
	}
	err := fmt.Errorf("%w: device %d: its process (pid %d) %s %s; the device's memory is intact, and after DeviceReset the next launch starts a new process",
		ErrLaunchFailure, dp.index, pid, how, what)
	dp.failDevice(err)
	dp.closeConns()
	dp.failLocked(err)
	if dp.cmd != nil {
		liveDeviceProcs.Add(-1)
	}
	dp.cmd = nil
	return err
}

// closeConns closes the control and stream connections. dp.mu is held.
func (dp *deviceProc) closeConns() {
	dp.closeConnsLocked()
	if dp.control != nil {
		dp.control.Close()
		dp.control = nil
	}
}

// ensureRunning starts the device's process if it has none. dp.mu is
// held.
func (dp *deviceProc) ensureRunning() error {
	if dp.control != nil {
		select {
		case <-dp.exited:
			// Dead since the last look: the device has failed, and the
			// launch with it.
			return dp.died(errors.New("exited"))
		default:
			return nil
		}
	}
	s := dp.s
	r, fds, err := s.rpc.RequestWithFDs(wire.EncodeDeviceConnect(s.rpc.NextSeq(), Device(dp.index)), wire.MsgDeviceConnect)
	if err == nil && len(fds) != 1 {
		wire.CloseFDs(fds)
		err = fmt.Errorf("%w: device connection came with %d descriptors", ErrInternal, len(fds))
	}
	if err == nil {
		err = r.Done("device connect reply")
	}
	if err != nil {
		return err
	}
	serverEnd := os.NewFile(uintptr(fds[0]), "softuvm-device-server")
	local, remote, err := wire.DirectSocketPair(fmt.Sprintf("softuvm-device-%d-control", dp.index))
	if err != nil {
		serverEnd.Close()
		return fmt.Errorf("%w: %v", ErrInitialization, err)
	}
	defStream, defRemote, err := wire.DirectSocketPair(fmt.Sprintf("softuvm-device-%d-stream-0", dp.index))
	if err != nil {
		serverEnd.Close()
		remote.Close()
		local.Close()
		return fmt.Errorf("%w: %v", ErrInitialization, err)
	}
	cmd, err := wire.Reexec("device", fmt.Sprintf("softuvm-device-%d", dp.index), s.log, []*os.File{serverEnd, remote, defRemote},
		config.DeviceEnv+"="+strconv.Itoa(dp.index), config.DeviceWorkersEnv+"="+strconv.Itoa(max(1, s.devices[dp.index].Workers)))
	// The process has its own copies now: with ours closed, its death
	// ends the read below at once instead of after the timeout.
	serverEnd.Close()
	remote.Close()
	defRemote.Close()
	if err != nil {
		local.Close()
		defStream.Close()
		return err
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	// Wait for the process to say it is up (it has mapped every range).
	b, err := local.Read(dp.buf, 30*time.Second)
	if err == nil {
		var h wire.Header
		if h, _, err = wire.ParseHeader(b); err == nil && h.Typ != wire.MsgDeviceUp {
			err = fmt.Errorf("device process sent %s, want device-up", h.Typ)
		}
	}
	if err != nil {
		cmd.Process.Kill()
		<-exited
		local.Close()
		defStream.Close()
		hint := ""
		if cmd.ProcessState != nil && cmd.ProcessState.ExitCode() == 3 {
			hint = "; the program must call uvm.Main() first in main"
		}
		return fmt.Errorf("%w: start device %d's process: %v (%s%s)", ErrInitialization, dp.index, err, processEnd(cmd.ProcessState), hint)
	}
	dp.control, dp.cmd, dp.exited = local, cmd, exited
	dp.def.conn = defStream
	liveDeviceProcs.Add(1)
	return nil
}

// stop ends the process, if any, and says if it did not end well: it
// exited with an error, died by a signal, or had to be killed. dp.mu is
// held.
func (dp *deviceProc) stop() error {
	// Every stream ends: the executors drop what they hold, the markers
	// in flight fail, and stop waits for the executors and readers, so
	// that none runs on when the session unmaps its memory.
	dp.killLocked()
	defer dp.waitWorkersLocked(5 * time.Second)
	defer dp.failLocked(fmt.Errorf("%w: device %d was reset, or its session closed, before the work queued before this point ran", ErrLaunchFailure, dp.index))
	if dp.cmd == nil {
		dp.closeConns()
		return nil
	}
	dp.closeConns() // the process exits when its control connection closes
	liveDeviceProcs.Add(-1)
	var err error
	select {
	case <-dp.exited:
		if !dp.cmd.ProcessState.Success() {
			err = fmt.Errorf("%w: device %d: its process (pid %d) %s when stopped", ErrLaunchFailure, dp.index, dp.cmd.Process.Pid, processEnd(dp.cmd.ProcessState))
		}
	case <-time.After(2 * time.Second):
		dp.cmd.Process.Kill()
		<-dp.exited
		err = fmt.Errorf("%w: device %d: its process (pid %d) did not exit within 2s of being stopped, and was killed", ErrLaunchFailure, dp.index, dp.cmd.Process.Pid)
	}
	dp.cmd = nil
	return err
}

// DevicePID returns the process id of device d's process, 0 if none runs.
// Tests and tools use it; programs have no need.
func (s *Session) DevicePID(d Device) int {
	if s.checkDevice(d, "process of") != nil {
		return 0
	}
	dp := s.deviceProc(d)
	dp.mu.Lock()
	defer dp.mu.Unlock()
	if dp.cmd == nil {
		return 0
	}
	return dp.cmd.Process.Pid
}
