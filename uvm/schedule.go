package uvm

import (
	"fmt"
	"runtime"
	"strings"
	"sync/atomic"
	"syscall"
	"unsafe"

	"github.com/softuvm/softuvm/internal/wire"
)

// Device flags, as cudaSetDeviceFlags's. The schedule flags say how a
// thread waits in a synchronize (StreamSynchronize,
// DefaultStreamSynchronize, DeviceSynchronize, EventSynchronize) for the
// device's answer; at most one may be set.
const (
	// DeviceScheduleAuto chooses, at each synchronize, after CUDA's
	// heuristic: DeviceScheduleSpin while this program's running device
	// processes, the waiting thread and the fault server fit in the CPUs
	// it may use (runtime.NumCPU), DeviceScheduleBlockingSync otherwise
	// (CUDA yields; here the server must run to serve the kernels'
	// faults). A device process counts from its first launch until it
	// ends.
	DeviceScheduleAuto = 0x00
	// DeviceScheduleSpin polls for the answer with non-blocking reads in
	// a busy loop: the lowest latency, one CPU spent while waiting. The
	// device's stream thread then runs off the waiting thread's CPU and
	// polls briefly for the next message before it sleeps.
	DeviceScheduleSpin = 0x01
	// DeviceScheduleYield polls too, and yields the CPU (sched_yield)
	// between polls, so that other threads may run while it waits.
	DeviceScheduleYield = 0x02
	// DeviceScheduleBlockingSync sleeps in a blocking read until the
	// answer comes: no CPU spent, a wake-up paid.
	DeviceScheduleBlockingSync = 0x04
	// DeviceScheduleMask covers the schedule flags.
	DeviceScheduleMask = 0x07
	// DeviceMapHost is accepted and always in effect: every device maps
	// pinned host memory (HostAlloc, HostRegister).
	DeviceMapHost = 0x08
	// DeviceLmemResizeToMax is accepted and changes nothing: kernels
	// here have no local memory to keep.
	DeviceLmemResizeToMax = 0x10

	deviceFlagsKnown = DeviceScheduleMask | DeviceMapHost | DeviceLmemResizeToMax
)

// waitMode is how a synchronize waits: the schedule flag resolved.
type waitMode uint8

const (
	waitBlock waitMode = iota
	waitSpin
	waitYield
)

// liveDeviceProcs counts the device processes of this program that run,
// for DeviceScheduleAuto: a process is counted from its start to its end.
var liveDeviceProcs atomic.Int32

// numCPU is how many CPUs this program may use.
var numCPU = int32(runtime.NumCPU())

// SetDeviceFlags sets the session's device flags, as cudaSetDeviceFlags
// sets a device's: at most one schedule flag (DeviceScheduleAuto, the
// default, DeviceScheduleSpin, DeviceScheduleYield,
// DeviceScheduleBlockingSync), with DeviceMapHost and
// DeviceLmemResizeToMax accepted. Go has no current device, so they
// apply to every device of the session; they take effect at the next
// synchronize and launch, even on devices already running. A session
// without devices has nothing to set (ErrInvalidDevice).
func (s *Session) SetDeviceFlags(flags uint32) error {
	if unknown := flags &^ deviceFlagsKnown; unknown != 0 {
		return fmt.Errorf("%w: device flags %#x: unknown bits %#x; want one of DeviceScheduleAuto (0), DeviceScheduleSpin (%#x), DeviceScheduleYield (%#x) or DeviceScheduleBlockingSync (%#x), with DeviceMapHost (%#x) and DeviceLmemResizeToMax (%#x)",
			ErrInvalidValue, flags, unknown, DeviceScheduleSpin, DeviceScheduleYield, DeviceScheduleBlockingSync, DeviceMapHost, DeviceLmemResizeToMax)
	}
	if sched := flags & DeviceScheduleMask; sched&(sched-1) != 0 {
		return fmt.Errorf("%w: device flags %#x set %s: want at most one schedule flag", ErrInvalidValue, flags, scheduleNames(sched))
	}
	if len(s.devices) == 0 {
		return fmt.Errorf("%w: set device flags %#x: there are no devices", ErrInvalidDevice, flags)
	}
	for d := range s.devices {
		s.deviceProc(Device(d)).flags.Store(flags)
	}
	return nil
}

// GetDeviceFlags returns the session's device flags, as
// cudaGetDeviceFlags: those SetDeviceFlags set (DeviceScheduleAuto until
// then), with DeviceMapHost, which is always in effect.
func (s *Session) GetDeviceFlags() (uint32, error) {
	if len(s.devices) == 0 {
		return 0, fmt.Errorf("%w: get device flags: there are no devices", ErrInvalidDevice)
	}
	return s.deviceProc(0).flags.Load() | DeviceMapHost, nil
}

// scheduleNames names the schedule flags set in sched.
func scheduleNames(sched uint32) string {
	var names []string
	for _, f := range []struct {
		bit  uint32
		name string
	}{{DeviceScheduleSpin, "DeviceScheduleSpin"}, {DeviceScheduleYield, "DeviceScheduleYield"}, {DeviceScheduleBlockingSync, "DeviceScheduleBlockingSync"}} {
		if sched&f.bit != 0 {
			names = append(names, f.name)
		}
	}
	return strings.Join(names, " and ")
}

// waitMode resolves the device's schedule flag.
func (dp *deviceProc) waitMode() waitMode {
	switch dp.flags.Load() & DeviceScheduleMask {
	case DeviceScheduleSpin:
		return waitSpin
	case DeviceScheduleYield:
		return waitYield
	case DeviceScheduleBlockingSync:
		return waitBlock
	}
	// CUDA spins while its contexts are fewer than the CPUs. Here the
	// fault server needs a CPU as well, to serve the kernels' faults, and
	// a spinning client and device on a machine of two CPUs starved it
	// (launch and touch of 4 KiB took 1.4-3.8 ms, not 0.15): spin only
	// when each device's stream thread, the waiting thread and the server
	// have a CPU each, else sleep.
	if liveDeviceProcs.Load()+2 < numCPU {
		return waitSpin
	}
	return waitBlock
}

// readReply reads one message from c as mode says: a blocking read, or
// non-blocking reads in a loop, yielding the CPU between them for
// waitYield. Only the stream's reader calls it.
func readReply(c *wire.DirectConn, buf []byte, mode waitMode) ([]byte, error) {
	if mode == waitBlock {
		return c.Read(buf, 0)
	}
	for {
		// recvfrom(MSG_DONTWAIT|MSG_TRUNC), without the runtime's
		// system call bookkeeping: it never blocks. MSG_TRUNC makes it
		// return the datagram's whole length.
		n, _, errno := syscall.RawSyscall6(syscall.SYS_RECVFROM, uintptr(c.Fd), uintptr(unsafe.Pointer(unsafe.SliceData(buf))), uintptr(len(buf)),
			syscall.MSG_DONTWAIT|syscall.MSG_TRUNC, 0, 0)
		switch {
		case errno == 0 && n == 0:
			return nil, wire.ErrPeerGone
		case errno == 0 && int(n) > len(buf):
			return nil, fmt.Errorf("%w: a reply of %d bytes, over %d", ErrInternal, n, len(buf))
		case errno == 0:
			return buf[:n], nil
		case errno == syscall.EAGAIN, errno == syscall.EINTR:
			if mode == waitYield {
				syscall.RawSyscall(syscall.SYS_SCHED_YIELD, 0, 0, 0)
			}
		default:
			return nil, fmt.Errorf("receive: %w", errno)
		}
	}
}

// send writes one message on c, with a non-blocking send that skips the
// runtime's system call bookkeeping when the socket has room, as it
// nearly always has; else with c's blocking write.
func send(c *wire.DirectConn, b []byte) error {
	_, _, errno := syscall.RawSyscall6(syscall.SYS_SENDTO, uintptr(c.Fd), uintptr(unsafe.Pointer(unsafe.SliceData(b))), uintptr(len(b)),
		syscall.MSG_NOSIGNAL|syscall.MSG_DONTWAIT, 0, 0)
	if errno == 0 {
		return nil
	}
	return c.Write(b) // full, interrupted, or an error it reports
}

// waitClosed waits until done is closed, as mode says: blocked on the
// channel, or polling it (yielding the CPU between polls for waitYield).
func waitClosed(done <-chan struct{}, mode waitMode) {
	if mode == waitBlock {
		<-done
		return
	}
	for i := 1; ; i++ {
		select {
		case <-done:
			return
		default:
		}
		switch {
		case mode == waitYield:
			syscall.RawSyscall(syscall.SYS_SCHED_YIELD, 0, 0, 0)
		case i%64 == 0:
			// Whoever closes done is a goroutine, which may need
			// this one's processor (GOMAXPROCS=1).
			runtime.Gosched()
		}
	}
}
