package uvm

import (
	"encoding/binary"
	"runtime"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/softuvm/softuvm/devmem"
	"github.com/softuvm/softuvm/internal/device"
	"github.com/softuvm/softuvm/internal/wire"
)

// Kernels of the stream, event and schedule tests.
func init() {
	// st-waitThenFill: params = flag address, then rangeParams. Waits
	// until the 32-bit flag (in pinned host memory, which the test sets)
	// is not 0, then fills the range as fill does.
	MustRegisterKernel("st-waitThenFill", func(tid, n int, p []byte) {
		waitFlag(uintptr(binary.LittleEndian.Uint64(p)))
		addr, length, v := paramRange(p[8:])
		b := devmem.BytesAt(addr, length)
		for i := range b {
			b[i] = v + byte(i>>12)
		}
	})
	// st-copy: params = dst, src, length: copies.
	MustRegisterKernel("st-copy", func(tid, n int, p []byte) {
		dst, src, length := uintptr(binary.LittleEndian.Uint64(p)), uintptr(binary.LittleEndian.Uint64(p[8:])), int64(binary.LittleEndian.Uint64(p[16:]))
		copy(devmem.BytesAt(dst, length), devmem.BytesAt(src, length))
	})
	// st-sleep: params = nanoseconds, and optionally the address of two
	// int64 words where it stores when it started and ended
	// (CLOCK_MONOTONIC nanoseconds): sleeps that long. The last 0.5 ms
	// it waits awake: a sleeping thread's wake-up comes late by up to a
	// millisecond, and the tests time the events, not the timer.
	MustRegisterKernel("st-sleep", func(tid, n int, p []byte) {
		t0 := devmem.MonotonicNow()
		d := time.Duration(binary.LittleEndian.Uint64(p))
		time.Sleep(d - min(d, 500*time.Microsecond))
		for devmem.MonotonicNow()-t0 < d {
		}
		if len(p) == 16 {
			out := devmem.BytesAt(uintptr(binary.LittleEndian.Uint64(p[8:])), 16)
			binary.LittleEndian.PutUint64(out, uint64(t0))
			binary.LittleEndian.PutUint64(out[8:], uint64(devmem.MonotonicNow()))
		}
	})
}

// waitFlag waits until the 32-bit word at addr is not 0.
func waitFlag(addr uintptr) {
	word := (*uint32)(unsafe.Pointer(&devmem.BytesAt(addr, 4)[0]))
	for atomic.LoadUint32(word) == 0 {
		time.Sleep(20 * time.Microsecond)
	}
}

// flag is a word of pinned host memory that kernels wait on.
type flag struct{ a *Allocation }

func newFlag(t *testing.T, s *Session) flag {
	a, err := s.HostAlloc(PageSize, 0)
	require.NoError(t, err)
	return flag{a}
}

func (f flag) set() { atomic.StoreUint32((*uint32)(f.a.Pointer()), 1) }

// waitThenFill's parameters.
func (f flag) params(addr uintptr, length int64, v byte) []byte {
	return append(binary.LittleEndian.AppendUint64(nil, uint64(f.a.Addr())), rangeParams(addr, length, v)...)
}

func stCopyParams(dst, src uintptr, length int64) []byte {
	p := binary.LittleEndian.AppendUint64(nil, uint64(dst))
	p = binary.LittleEndian.AppendUint64(p, uint64(src))
	return binary.LittleEndian.AppendUint64(p, uint64(length))
}

func sleepParams(d time.Duration) []byte { return binary.LittleEndian.AppendUint64(nil, uint64(d)) }

// within runs f and fails the test if it does not return within d; then
// it calls unblock (which lets f finish) and waits for f anyway.
func within(t *testing.T, d time.Duration, what string, unblock func(), f func()) {
	t.Helper()
	done := make(chan struct{})
	go func() { defer close(done); f() }()
	select {
	case <-done:
	case <-time.After(d):
		t.Errorf("%s did not return within %v", what, d)
		unblock()
		<-done
	}
}

// TestPrefetchAsyncOverlapsKernel: a prefetch queued on stream A while a
// kernel runs on stream B returns at once, runs while the kernel runs
// (A's synchronize returns while B's kernel still waits for the test),
// and the data is at the destination after A's synchronize. A prefetch
// behind a kernel on its own stream waits for it.
func TestPrefetchAsyncOverlapsKernel(t *testing.T) {
	s := newSession(t, testServerConfig())
	const size = 1 << 20
	a, err := s.MallocManaged(size)
	require.NoError(t, err)
	copy(a.Bytes(), wantFill(size, 5)) // resident on the host
	stA, err := s.StreamCreate(0)
	require.NoError(t, err)
	stB, err := s.StreamCreate(0)
	require.NoError(t, err)
	f := newFlag(t, s)
	out, err := s.MallocManaged(PageSize)
	require.NoError(t, err)
	require.NoError(t, s.Launch(0, stB, "st-waitThenFill", 1, f.params(out.Addr(), PageSize, 1)))

	within(t, 10*time.Second, "PrefetchAsync and A's synchronize, while B's kernel runs", f.set, func() {
		require.NoError(t, s.PrefetchAsync(a.Addr(), size, 0, stA))
		require.NoError(t, s.StreamSynchronize(stA))
	})
	st := stats(t, a)
	assert.Equal(t, uint64(size/PageSize), st.MigratedPages(CPU, 0), "the pages moved to device 0 before B's kernel ended")
	loc, err := s.RangeAttribute(a.Addr(), size, AttrLastPrefetchLocation)
	require.NoError(t, err)
	assert.Equal(t, Device(0), loc)
	assert.Equal(t, []byte{0}, out.Bytes()[:1], "B's kernel is still waiting")
	f.set()
	require.NoError(t, s.StreamSynchronize(stB))
	sameBytes(t, wantFill(PageSize, 1), out.Bytes(), "B's kernel ran once the flag was set")

	// Behind a kernel on its own stream, the prefetch waits for it.
	f2 := newFlag(t, s)
	require.NoError(t, s.Launch(0, stA, "st-waitThenFill", 1, f2.params(out.Addr(), PageSize, 2)))
	require.NoError(t, s.PrefetchAsync(a.Addr(), size, CPU, stA), "returns while the kernel before it waits")
	assert.Zero(t, stats(t, a).MigratedPages(0, CPU), "nothing moved before the kernel before it ended")
	f2.set()
	require.NoError(t, s.StreamSynchronize(stA))
	assert.Equal(t, uint64(size/PageSize), stats(t, a).MigratedPages(0, CPU))
	sameBytes(t, wantFill(PageSize, 2), out.Bytes(), "the kernel's output")
	sameBytes(t, wantFill(size, 5), a.Bytes(), "the data came back intact")
}

// TestAsyncCopiesInStreamOrder: MemcpyAsync and MemsetAsync run after
// the kernel before them on their stream, and the kernel after them runs
// after them.
func TestAsyncCopiesInStreamOrder(t *testing.T) {
	s := newSession(t, testServerConfig())
	const size = 256 << 10
	m, err := s.MallocManaged(size)
	require.NoError(t, err)
	d, err := s.Malloc(0, size)
	require.NoError(t, err)
	host := make([]byte, size)
	st, err := s.StreamCreate(0)
	require.NoError(t, err)
	f := newFlag(t, s)
	// K1 fills m with fill(7) once the flag is set; the copy to device
	// memory must see that, not the zeros before it.
	require.NoError(t, s.Launch(0, st, "st-waitThenFill", 1, f.params(m.Addr(), size, 7)))
	require.NoError(t, s.MemcpyAsync(d.Addr(), m.Addr(), size, MemcpyDefault, st))
	// K2 adds one to m: after the copy, so d keeps fill(7).
	require.NoError(t, s.Launch(0, st, "addOne", 2, rangeParams(m.Addr(), size, 0)))
	// The memset overwrites m's first half after K2.
	require.NoError(t, s.MemsetAsync(m.Addr(), 0xab, size/2, st))
	// d comes back to ordinary host memory after everything before.
	require.NoError(t, s.MemcpyAsync(uintptr(unsafe.Pointer(&host[0])), d.Addr(), size, MemcpyDeviceToHost, st))
	assert.Equal(t, make([]byte, size), host, "nothing ran before the flag")
	f.set()
	require.NoError(t, s.StreamSynchronize(st))
	sameBytes(t, wantFill(size, 7), host, "the copy ran after K1, and K2 after the copy")
	want := wantFill(size, 8)
	for i := range size / 2 {
		want[i] = 0xab
	}
	sameBytes(t, want, m.Bytes(), "the memset ran after K2")
	// A memset of device memory on a nil stream goes to its device's
	// default stream (which, as cudaStreamPerThread, is not ordered
	// with the other streams).
	require.NoError(t, s.MemsetAsync(d.Addr(), 0x11, PageSize, nil))
	require.NoError(t, s.DefaultStreamSynchronize(0))
	back := make([]byte, PageSize)
	require.NoError(t, s.Memcpy(uintptr(unsafe.Pointer(&back[0])), d.Addr(), PageSize, MemcpyDeviceToHost))
	sameBytes(t, bytesOf(0x11, PageSize), back, "the default stream's memset")
	runtime.KeepAlive(host)
}

func bytesOf(v byte, n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = v
	}
	return b
}

// TestQueuedErrorsComeBackFromSynchronize: an operation that fails when
// it runs reports its error at the stream's next synchronize, once; a
// kernel's failure behind it too, and at every synchronize after.
func TestQueuedErrorsComeBackFromSynchronize(t *testing.T) {
	s := newSession(t, testServerConfig())
	// Non-blocking: the synchronous calls below do not wait for it.
	st, err := s.StreamCreateWithFlags(0, StreamNonBlocking)
	require.NoError(t, err)
	a, err := s.MallocManaged(64 << 10)
	require.NoError(t, err)
	f := newFlag(t, s)
	out, err := s.MallocManaged(PageSize)
	require.NoError(t, err)
	require.NoError(t, s.Launch(0, st, "st-waitThenFill", 1, f.params(out.Addr(), PageSize, 1)))
	require.NoError(t, s.PrefetchAsync(a.Addr(), 64<<10, 0, st), "the arguments are good when it is queued")
	require.NoError(t, s.Launch(0, st, "panics", 2, nil))
	// Before the prefetch runs, device memory takes all but a page of
	// device 0's arena: the prefetch finds no room.
	in, err := s.Info()
	require.NoError(t, err)
	full, err := s.Malloc(0, in.Devices[0].Capacity-in.Devices[0].UsedBytes-PageSize)
	require.NoError(t, err)
	require.NoError(t, s.Memset(full.Addr(), 1, full.Size()))
	f.set()
	err = s.StreamSynchronize(st)
	require.ErrorIs(t, err, ErrMemoryAllocation)
	assert.Contains(t, err.Error(), "PrefetchAsync of")
	assert.Contains(t, err.Error(), "arena full")
	require.ErrorIs(t, err, ErrLaunchFailure, "the kernel queued behind it failed too")
	assert.Contains(t, err.Error(), `kernel "panics" panicked`)
	err = s.StreamSynchronize(st)
	require.ErrorIs(t, err, ErrLaunchFailure, "the kernel's failure is sticky")
	assert.NotContains(t, err.Error(), "PrefetchAsync of", "an operation's error is reported once")
	sameBytes(t, wantFill(PageSize, 1), out.Bytes(), "the kernel's output")
	require.NoError(t, s.DeviceReset(0))
}

// TestMemcpyPeer copies device memory of one device to another's,
// synchronously and in stream order.
func TestMemcpyPeer(t *testing.T) {
	s := newSession(t, twoDeviceConfig())
	const size = 64 << 10
	d0, err := s.Malloc(0, size)
	require.NoError(t, err)
	d1, err := s.Malloc(1, size)
	require.NoError(t, err)
	m, err := s.MallocManaged(size)
	require.NoError(t, err)
	// A kernel on device 0 writes d0; MemcpyPeer waits for it.
	require.NoError(t, s.Launch(0, nil, "fill", 2, rangeParams(d0.Addr(), size, 3)))
	require.NoError(t, s.MemcpyPeer(d1.Addr(), 1, d0.Addr(), 0, size))
	require.NoError(t, s.MemcpyPeer(m.Addr(), 0, d1.Addr(), 1, size), "managed memory is every device's")
	sameBytes(t, wantFill(size, 3), m.Bytes(), "device 0 -> device 1 -> managed, behind the kernel")

	// In stream order: behind a kernel on device 1's stream.
	st, err := s.StreamCreate(1)
	require.NoError(t, err)
	f := newFlag(t, s)
	require.NoError(t, s.Launch(1, st, "st-waitThenFill", 1, f.params(d1.Addr(), size, 9)))
	require.NoError(t, s.MemcpyPeerAsync(d0.Addr(), 0, d1.Addr(), 1, size, st))
	require.NoError(t, s.MemcpyPeerAsync(m.Addr(), 1, d0.Addr(), 0, size, st))
	f.set()
	require.NoError(t, s.StreamSynchronize(st))
	sameBytes(t, wantFill(size, 9), m.Bytes(), "the peer copies ran after the kernel")
	require.NoError(t, s.DeviceSynchronize(0))

	for _, tc := range []struct {
		name string
		err  error
		is   error
		msg  string
	}{
		{"device memory of the other device", s.MemcpyPeer(d0.Addr(), 1, d1.Addr(), 1, size), ErrInvalidValue, "is device memory of device 0, not of device 1"},
		{"the CPU", s.MemcpyPeer(m.Addr(), CPU, d1.Addr(), 1, size), ErrInvalidDevice, "peer copy to cpu"},
		{"ordinary memory", s.MemcpyPeerAsync(uintptr(unsafe.Pointer(&make([]byte, 8)[0])), 0, d1.Addr(), 1, 8, nil), ErrInvalidValue, "ordinary host memory, which no device reaches"},
		{"too long", s.MemcpyPeer(d0.Addr(), 0, d1.Addr(), 1, size+1), ErrInvalidValue, "runs past the end"},
	} {
		require.Error(t, tc.err, tc.name)
		assert.ErrorIs(t, tc.err, tc.is, tc.name)
		assert.Contains(t, tc.err.Error(), tc.msg, tc.name)
	}
}

// TestStreamDestroyRunsQueuedWork: a destroyed stream's queued work
// still runs, and DeviceSynchronize waits for it.
func TestStreamDestroyRunsQueuedWork(t *testing.T) {
	s := newSession(t, testServerConfig())
	const size = 64 << 10
	m, err := s.MallocManaged(size)
	require.NoError(t, err)
	st, err := s.StreamCreate(0)
	require.NoError(t, err)
	f := newFlag(t, s)
	require.NoError(t, s.Launch(0, st, "st-waitThenFill", 1, f.params(m.Addr(), size, 4)))
	require.NoError(t, s.MemsetAsync(m.Addr(), 0xcd, PageSize, st))
	// The last kernel comes well after the flag: a synchronize that
	// did not wait for the stream would see the data without it.
	require.NoError(t, s.Launch(0, st, "st-sleep", 1, sleepParams(30*time.Millisecond)))
	require.NoError(t, s.Launch(0, st, "addOne", 1, rangeParams(m.Addr(), size, 0)))
	require.NoError(t, s.StreamDestroy(st))
	require.ErrorIs(t, s.Launch(0, st, "nothing", 1, nil), ErrInvalidValue, "the handle is stale")
	f.set()
	require.NoError(t, s.DeviceSynchronize(0))
	want := wantFill(size, 5)
	for i := range PageSize {
		want[i] = 0xce
	}
	sameBytes(t, want, m.Bytes(), "fill, then the memset, then addOne")
}

// TestLaunchFastPathAllocates no more than encoding the launch does.
func TestLaunchFastPathAllocates(t *testing.T) {
	s := newSession(t, testServerConfig())
	params := rangeParams(0, 0, 0)
	require.NoError(t, s.Launch(0, nil, "nothing", 1, params))
	require.NoError(t, s.DefaultStreamSynchronize(0))
	encode := testing.AllocsPerRun(100, func() {
		wire.EncodeLaunch(1, wire.LaunchRequest{Name: "nothing", Nthreads: 1, Params: params, Cpu: device.LaunchCPUHint(0, true)})
	})
	launches := 0
	launch := testing.AllocsPerRun(100, func() {
		if err := s.Launch(0, nil, "nothing", 1, params); err != nil {
			t.Fatal(err)
		}
		if launches++; launches%50 == 0 { // the names of launches in flight are kept
			require.NoError(t, s.DefaultStreamSynchronize(0))
		}
	})
	require.NoError(t, s.DefaultStreamSynchronize(0))
	assert.LessOrEqual(t, launch, encode+0.1, "a launch allocates what encoding it does (%v), and nothing more", encode)
}

// TestDeviceResetEndsQueuedWork: a reset drops what streams still hold,
// fails events recorded behind it, and leaves the device working.
func TestDeviceResetEndsQueuedWork(t *testing.T) {
	s := newSession(t, testServerConfig())
	st, err := s.StreamCreate(0)
	require.NoError(t, err)
	f := newFlag(t, s)
	m, err := s.MallocManaged(PageSize)
	require.NoError(t, err)
	require.NoError(t, s.Launch(0, st, "st-waitThenFill", 1, f.params(m.Addr(), PageSize, 1)))
	require.NoError(t, s.PrefetchAsync(m.Addr(), PageSize, CPU, st))
	ev, err := s.EventCreate(EventDefault)
	require.NoError(t, err)
	require.NoError(t, s.EventRecord(ev, st))
	require.ErrorIs(t, s.EventQuery(ev), ErrNotReady)
	within(t, 20*time.Second, "DeviceReset with a kernel waiting", f.set, func() { require.NoError(t, s.DeviceReset(0)) })
	err = s.EventSynchronize(ev)
	require.ErrorIs(t, err, ErrLaunchFailure)
	assert.Contains(t, err.Error(), "was reset")
	require.ErrorIs(t, s.StreamSynchronize(st), ErrInvalidValue, "the stream is stale")
	require.NoError(t, s.Launch(0, nil, "fill", 1, rangeParams(m.Addr(), PageSize, 3)))
	require.NoError(t, s.DefaultStreamSynchronize(0))
	sameBytes(t, wantFill(PageSize, 3), m.Bytes(), "the kernel's output")
}
