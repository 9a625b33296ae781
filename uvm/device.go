package uvm

import (
	"errors"

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

	// mu serializes the use of the process: launches, synchronizations,
	// restarts. Guards every field below.
	mu sync.Mutex
	// control opens streams in the process; streams holds the
	// connection of each stream in use, 0 the default stream's. Nil
	// while no process runs.
	control *wire.DirectConn
	streams map[uint32]*wire.DirectConn
	cmd     *exec.Cmd
	exited  chan struct{} // closed when cmd has been waited for
	gen     uint64        // incremented by each reset: older streams are stale
	pending error         // a death not yet reported by a synchronize
	// outstanding lists, per stream, the kernels launched since the
	// stream's last synchronize: what a death interrupted.
	outstanding map[uint32][]string
	nextStream  uint32
	seq         uint32
	buf         []byte
}

// Stream is an ordered queue of work on one device, as a CUDA stream: its
// kernels run one after another, and other streams' kernels may run at
// the same time. A nil *Stream is the device's default stream.
type Stream struct {
	s      *Session
	device int
	id     uint32
	gen    uint64
}

// DeviceAttr names a device attribute for DeviceGetAttribute.
type DeviceAttr int

const (
	// AttrArenaCapacity is the device's memory in bytes.
	AttrArenaCapacity DeviceAttr = iota + 1
	// AttrConcurrentManagedAccess is 1: the host and devices may touch
	// managed memory at the same time.
	AttrConcurrentManagedAccess
	// AttrCanMapHostMemory is 1: mapped host memory is reachable from
	// kernels.
	AttrCanMapHostMemory
	// AttrPageableMemoryAccess is 0: kernels reach managed memory, not
	// the process's ordinary (pageable) memory.
	AttrPageableMemoryAccess
	// AttrWorkerCount is the number of threads that run the device's
	// kernels.
	AttrWorkerCount
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

func (a DeviceAttr) String() string {
	switch a {
	case AttrArenaCapacity:
		return "arena-capacity"
	case AttrConcurrentManagedAccess:
		return "concurrent-managed-access"
	case AttrCanMapHostMemory:
		return "can-map-host-memory"
	case AttrPageableMemoryAccess:
		return "pageable-memory-access"
	case AttrWorkerCount:
		return "worker-count"
	}
	return "device-attribute(" + strconv.Itoa(int(a)) + ")"
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

// DeviceGetAttribute returns an attribute of device d, as
// cudaDeviceGetAttribute.
func (s *Session) DeviceGetAttribute(attr DeviceAttr, d Device) (int64, error) {
	if err := s.checkDevice(d, "attribute of"); err != nil {
		return 0, err
	}
	info := s.devices[d]
	switch attr {
	case AttrArenaCapacity:
		return info.Capacity, nil
	case AttrConcurrentManagedAccess, AttrCanMapHostMemory:
		return 1, nil
	case AttrPageableMemoryAccess:
		return 0, nil
	case AttrWorkerCount:
		return int64(info.Workers), nil
	}
	return 0, fmt.Errorf("%w: device attribute %d: want one of %v, %v, %v, %v, %v", ErrInvalidValue, int(attr),
		AttrArenaCapacity, AttrConcurrentManagedAccess, AttrCanMapHostMemory, AttrPageableMemoryAccess, AttrWorkerCount)
}

func (s *Session) deviceProc(d Device) *deviceProc {
	s.devMu.Lock()
	defer s.devMu.Unlock()
	if s.devs == nil {
		s.devs = make([]*deviceProc, len(s.devices))
	}
	if s.devs[d] == nil {
		s.devs[d] = &deviceProc{s: s, index: int(d), outstanding: map[uint32][]string{}, buf: make([]byte, 64<<10)}
	}
	return s.devs[d]
}

// StreamCreate makes a new stream on device d.
func (s *Session) StreamCreate(d Device) (*Stream, error) {
	if err := s.checkDevice(d, "stream on"); err != nil {
		return nil, err
	}
	dp := s.deviceProc(d)
	dp.mu.Lock()
	defer dp.mu.Unlock()
	dp.nextStream++
	return &Stream{s: s, device: int(d), id: dp.nextStream, gen: dp.gen}, nil
}

// StreamDestroy ends a stream once its queued work has run.
func (s *Session) StreamDestroy(st *Stream) error {
	if st == nil {
		return fmt.Errorf("%w: the default stream cannot be destroyed", ErrInvalidValue)
	}
	dp, err := s.streamProc(st, "destroy")
	if err != nil {
		return err
	}
	defer dp.mu.Unlock()
	st.gen = ^uint64(0) // stale from now on
	if c := dp.streams[st.id]; c != nil {
		// The process runs what is queued, then ends the stream.
		c.Write(wire.EncodeStreamRequest(wire.MsgStreamDestroy, dp.nextSeq(), st.id))
		c.Close()
		delete(dp.streams, st.id)
	}
	return nil
}

// streamProc returns the stream's device process, locked, or an error if
// the stream belongs to another session or was destroyed or reset.
func (s *Session) streamProc(st *Stream, what string) (*deviceProc, error) {
	if st.s != s {
		return nil, fmt.Errorf("%w: %s %v: the stream belongs to another session", ErrInvalidValue, what, st)
	}
	dp := s.deviceProc(Device(st.device))
	dp.mu.Lock()
	if st.gen != dp.gen {
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
	if len(params) > MaxKernelParams {
		return fmt.Errorf("%w: launch of kernel %q with %d bytes of parameters: at most %d", ErrInvalidValue, name, len(params), MaxKernelParams)
	}
	var dp *deviceProc
	var stream uint32
	if st == nil {
		dp = s.deviceProc(d)
		dp.mu.Lock()
	} else {
		if st.device != int(d) {
			return fmt.Errorf("%w: launch on device %d with %v", ErrInvalidValue, d, st)
		}
		var err error
		if dp, err = s.streamProc(st, "launch on"); err != nil {
			return err
		}
		stream = st.id
	}
	defer dp.mu.Unlock()
	if err := dp.ensureRunning(); err != nil {
		return err
	}
	c, err := dp.stream(stream)
	if err != nil {
		return err
	}
	dp.outstanding[stream] = append(dp.outstanding[stream], name)
	cpu, err := devmem.CurrentCPU()
	if err != nil {
		cpu = -1
	}
	if err := c.Write(wire.EncodeLaunch(dp.nextSeq(), wire.LaunchRequest{Stream: stream, Nthreads: uint32(nthreads), Name: name, Params: params, Cpu: int32(cpu)})); err != nil {
		dp.died(err) // reported by the next synchronize
	}
	return nil
}

// StreamSynchronize waits for the work queued on the stream and returns
// its errors. A device's default stream is DefaultStreamSynchronize's.
func (s *Session) StreamSynchronize(st *Stream) error {
	if st == nil {
		return fmt.Errorf("%w: synchronize a nil stream: the default stream belongs to a device, use DefaultStreamSynchronize(device)", ErrInvalidValue)
	}
	dp, err := s.streamProc(st, "synchronize")
	if err != nil {
		return err
	}
	defer dp.mu.Unlock()
	return dp.sync(st.id)
}

// DefaultStreamSynchronize waits for device d's default stream.
func (s *Session) DefaultStreamSynchronize(d Device) error {
	if err := s.checkDevice(d, "synchronize"); err != nil {
		return err
	}
	return s.syncDevice(d, 0)
}

// DeviceSynchronize waits for every stream of device d and returns their
// errors.
func (s *Session) DeviceSynchronize(d Device) error {
	if err := s.checkDevice(d, "synchronize"); err != nil {
		return err
	}
	return s.syncDevice(d, wire.AllStreams)
}

func (s *Session) syncDevice(d Device, stream uint32) error {
	dp := s.deviceProc(d)
	dp.mu.Lock()
	defer dp.mu.Unlock()
	return dp.sync(stream)
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
	clear(dp.outstanding)
	return nil
}

// PrefetchAsync migrates [addr, addr+n) to dst in stream order, as
// cudaMemPrefetchAsync: after the kernels queued before it on the stream.
// It returns when the data is there.
func (s *Session) PrefetchAsync(addr uintptr, n int64, dst Device, st *Stream) error {
	if st == nil {
		return s.Prefetch(addr, n, dst)
	}
	dp, err := s.streamProc(st, "prefetch on")
	if err != nil {
		return err
	}
	defer dp.mu.Unlock()
	if err := dp.sync(st.id); err != nil {
		return err
	}
	return s.Prefetch(addr, n, dst)
}

func (dp *deviceProc) nextSeq() uint32 { dp.seq++; return dp.seq }

// stream returns the connection of stream id, opening it in the process
// on first use. dp.mu is held and the process runs.
func (dp *deviceProc) stream(id uint32) (*wire.DirectConn, error) {
	if c := dp.streams[id]; c != nil {
		return c, nil
	}
	local, remote, err := wire.DirectSocketPair(fmt.Sprintf("softuvm-device-%d-stream-%d", dp.index, id))
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrInternal, err)
	}
	err = dp.control.WriteFDs(wire.EncodeStreamRequest(wire.MsgStreamOpen, dp.nextSeq(), id), []int{int(remote.Fd())})
	remote.Close()
	if err != nil {
		local.Close()
		dp.died(err)
		return nil, fmt.Errorf("%w: open stream %d on device %d: %v", ErrLaunchFailure, id, dp.index, err)
	}
	dp.streams[id] = local
	return local, nil
}

// sync waits for stream (or allStreams) and returns the kernels' errors
// and any death not reported yet. dp.mu is held.
func (dp *deviceProc) sync(stream uint32) error {
	var errs []error
	if dp.pending != nil {
		errs = append(errs, dp.pending)
		dp.pending = nil
	}
	type waiting struct {
		c *wire.DirectConn
		h wire.Header
	}
	var waits []waiting
	for id, c := range dp.streams {
		if stream != wire.AllStreams && id != stream {
			continue
		}
		h := wire.Header{Typ: wire.MsgSync, Seq: dp.nextSeq()}
		if err := c.Write(wire.EncodeStreamRequest(wire.MsgSync, h.Seq, id)); err != nil {
			dp.died(err)
			break
		}
		waits = append(waits, waiting{c, h})
	}
	for _, w := range waits {
		if dp.control == nil {
			break // died while waiting for an earlier stream
		}
		reply, err := w.c.Read(dp.buf, 0)
		if err != nil {
			dp.died(err)
			break
		}
		if _, err := wire.ParseReply(reply, w.h); err != nil {
			errs = append(errs, err)
		}
	}
	if dp.pending != nil {
		errs = append(errs, dp.pending)
		dp.pending = nil
	}
	if stream == wire.AllStreams {
		clear(dp.outstanding)
	} else {
		delete(dp.outstanding, stream)
	}
	return core.JoinErrors(errs)
}

// died records that the process went away, naming what it was running,
// and reaps it. dp.mu is held. The error that revealed it (a broken pipe,
// an end of file) says nothing the exit status does not.
func (dp *deviceProc) died(error) {
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
	for stream, names := range dp.outstanding {
		for _, n := range names {
			running = append(running, fmt.Sprintf("%q (stream %d)", n, stream))
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
	err := fmt.Errorf("%w: device %d: its process (pid %d) %s %s; the device's memory is intact and the next launch starts a new process",
		ErrLaunchFailure, dp.index, pid, how, what)
	if dp.pending == nil {
		dp.pending = err
	} else {
		dp.pending = errors.Join(dp.pending, err)
	}
	dp.closeConns()
	dp.cmd = nil
}

// closeConns closes the control and stream connections. dp.mu is held.
func (dp *deviceProc) closeConns() {
	for _, c := range dp.streams {
		c.Close()
	}
	dp.streams = nil
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
			dp.died(errors.New("exited"))
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
	dp.streams = map[uint32]*wire.DirectConn{0: defStream}
	return nil
}

// stop ends the process, if any, and says if it did not end well: it
// exited with an error, died by a signal, or had to be killed. dp.mu is
// held.
func (dp *deviceProc) stop() error {
	if dp.cmd == nil {
		return nil
	}
	dp.closeConns() // the process exits when its control connection closes
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
