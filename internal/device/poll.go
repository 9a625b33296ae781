package device

import (
	"encoding/binary"
	"fmt"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"github.com/softuvm/softuvm/devmem"
	"github.com/softuvm/softuvm/internal/core"
	"github.com/softuvm/softuvm/internal/wire"
)

// A launch's Cpu field tells the stream's thread where the launching
// thread runs, so that it runs near it, and how the client will wait for
// the synchronize that usually follows:
//
//   - cpu >= 0: the client sleeps until the answer comes (or yields the
//     CPU while it polls). The stream's thread runs on the client's CPU,
//     where a wake-up costs a few microseconds, against tens across CPUs
//     on a small VM.
//   - -1: the client does not know its CPU; the thread stays where it is.
//   - -2-cpu: the client polls for the answer on CPU cpu
//     (DeviceScheduleSpin). The thread runs on the other CPUs, and polls
//     for its next message for streamSpin before it sleeps: with both
//     sides polling, a launch and its synchronize cost no wake-up.
//
// Older device processes take every negative value for -1.

// LaunchCPUHint encodes the launching thread's CPU (negative: unknown)
// and whether its client polls, for a launch's Cpu field.
func LaunchCPUHint(cpu int, polling bool) int32 {
	switch {
	case cpu < 0:
		return -1
	case polling:
		return int32(-2 - cpu)
	}
	return int32(cpu)
}

// cpuOfHint decodes a launch's Cpu field: the client's CPU (-1 if
// unknown) and whether it polls.
func cpuOfHint(v int32) (cpu int, polling bool) {
	switch {
	case v >= 0:
		return int(v), false
	case v == -1:
		return -1, false
	}
	return int(-2 - v), true
}

// streamSpin is how long a stream's thread polls for its next message
// before it sleeps, when its client polls: a synchronize follows its
// launch at once, and the next launch its synchronize's answer, and
// catching them awake saves a wake-up on each side.
const streamSpin = 100 * time.Microsecond

// follow places the stream's thread for a client on cpu: on that CPU,
// or, if the client polls, on the process's other CPUs. It returns
// whether the thread is to poll: not when the client's CPU is its only
// one. The goroutine holds its thread.
func (rt *deviceRuntime) follow(cpu int, polling bool) (bool, error) {
	if polling {
		others := make([]int, 0, len(rt.cpus))
		for _, c := range rt.cpus {
			if c != cpu {
				others = append(others, c)
			}
		}
		if len(others) > 0 {
			return true, devmem.PinCurrentThreadToCPUs(others)
		}
	}
	return false, devmem.PinCurrentThread(cpu)
}

// nextMessage reads the stream's next message into buf: after polling
// for streamSpin if polling, with a blocking read otherwise or then.
func nextMessage(conn *wire.DirectConn, buf []byte, polling bool) ([]byte, error) {
	if polling {
		deadline := time.Now().Add(streamSpin)
		for i := 1; ; i++ {
			n, _, errno := syscall.RawSyscall6(syscall.SYS_RECVFROM, uintptr(conn.Fd), uintptr(unsafe.Pointer(unsafe.SliceData(buf))), uintptr(len(buf)),
				syscall.MSG_DONTWAIT|syscall.MSG_TRUNC, 0, 0)
			switch {
			case errno == 0 && n == 0:
				return nil, wire.ErrPeerGone
			case errno == 0 && int(n) > len(buf):
				return nil, fmt.Errorf("%w: a message of %d bytes, over %d", core.ErrInvalidValue, n, len(buf))
			case errno == 0:
				return buf[:n], nil
			case errno != syscall.EAGAIN && errno != syscall.EINTR:
				return conn.Read(buf, 0) // which says what is wrong
			}
			if i%32 == 0 && time.Now().After(deadline) {
				break
			}
		}
	}
	return conn.Read(buf, 0)
}

// send writes one message on conn, with a non-blocking send that skips
// the runtime's system call bookkeeping when the socket has room, as it
// nearly always has; else with conn's blocking write.
func send(conn *wire.DirectConn, b []byte) error {
	_, _, errno := syscall.RawSyscall6(syscall.SYS_SENDTO, uintptr(conn.Fd), uintptr(unsafe.Pointer(unsafe.SliceData(b))), uintptr(len(b)),
		syscall.MSG_NOSIGNAL|syscall.MSG_DONTWAIT, 0, 0)
	if errno == 0 {
		return nil
	}
	return conn.Write(b)
}

// EventTimeKernel is the device's built-in kernel that an event's record
// launches: it stores, into the 8 bytes at the address its parameters
// give (pinned host memory of the client), the CLOCK_MONOTONIC time in
// nanoseconds at which it runs, which is when the kernels before it on
// its stream have finished. The client reads it once the synchronize
// after it is answered: the event's time does not depend on how soon
// the client's thread wakes up. No registered kernel can have the name.
const EventTimeKernel = "softuvm/event-time"

// stampTime runs EventTimeKernel.
func stampTime(params []byte, device int) (err error) {
	if len(params) != 8 {
		return fmt.Errorf("%w: %s on device %d with %d bytes of parameters, want 8", core.ErrLaunchFailure, EventTimeKernel, device, len(params))
	}
	addr := uintptr(binary.LittleEndian.Uint64(params))
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("%w: %s on device %d: store at %#x: %v", core.ErrLaunchFailure, EventTimeKernel, device, addr, r)
		}
	}()
	word := (*int64)(unsafe.Pointer(&devmem.BytesAt(addr, 8)[0]))
	atomic.StoreInt64(word, int64(devmem.MonotonicNow()))
	return nil
}
