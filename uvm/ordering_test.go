package uvm

import (
	"errors"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/softuvm/softuvm/devmem"
)

// CUDA's order between streams and calls, as in libuvm/tests/ordering_test.c.
// A rule that says "waits" is checked with a kernel that takes a while
// (it naps, then writes): what comes after must see all it wrote. A rule
// that says "does not wait" is checked with a kernel that waits for a
// flag the test sets only once the call returned (within: a call that
// waited fails the test).

// slowNap is how long a slow kernel naps before it writes: far longer
// than a call that does not wait takes to come back.
const slowNap = 40 * time.Millisecond

func init() {
	// ord-slowFill: params = rangeParams: naps slowNap, then fills the
	// range as fill does (each thread its share).
	MustRegisterKernel("ord-slowFill", func(tid, n int, p []byte) {
		time.Sleep(slowNap)
		addr, length, v := paramRange(p)
		b := devmem.BytesAt(addr, length)
		for i := tid * PageSize; i < len(b); i += n * PageSize {
			for j := i; j < min(i+PageSize, len(b)); j++ {
				b[j] = v + byte(j>>12)
			}
		}
	})
}

const ordSize = 64 << 10

// slowFill launches ord-slowFill of [a, a+ordSize) with v on st of d.
func slowFill(t *testing.T, s *Session, d Device, st *Stream, a uintptr, v byte) {
	t.Helper()
	require.NoError(t, s.Launch(d, st, "ord-slowFill", 2, rangeParams(a, ordSize, v)))
}

func managed(t *testing.T, s *Session) *Allocation {
	t.Helper()
	a, err := s.MallocManaged(ordSize)
	require.NoError(t, err)
	return a
}

// TestSyncCopyReadsKernelResult: a kernel, then a synchronous copy of
// what it wrote, reads the kernel's result: Memcpy is issued on the
// legacy default stream, which waits for the kernel there and on a
// blocking stream; Memset after a kernel lands last; MemcpyPeer waits
// for the legacy streams of both its devices.
func TestSyncCopyReadsKernelResult(t *testing.T) {
	s := newSession(t, twoDeviceConfig())
	dev, err := s.Malloc(0, ordSize)
	require.NoError(t, err)
	blocking, err := s.StreamCreate(0)
	require.NoError(t, err)
	host := make([]byte, ordSize)
	for i, st := range []*Stream{nil, blocking} {
		clear(host)
		slowFill(t, s, 0, st, dev.Addr(), byte(10+i))
		require.NoError(t, s.Memcpy(addr(host), dev.Addr(), ordSize, MemcpyDeviceToHost))
		sameBytes(t, wantFill(ordSize, byte(10+i)), host, "the kernel's output")
	}
	slowFill(t, s, 0, blocking, dev.Addr(), 3)
	require.NoError(t, s.Memset(dev.Addr(), 0x5a, ordSize))
	require.NoError(t, s.Memcpy(addr(host), dev.Addr(), ordSize, MemcpyDeviceToHost))
	sameBytes(t, fillOf(ordSize, 0x5a), host, "the fill, after the kernel")

	dev1, err := s.Malloc(1, ordSize)
	require.NoError(t, err)
	slowFill(t, s, 1, nil, dev1.Addr(), 90)
	slowFill(t, s, 0, nil, dev.Addr(), 1)
	require.NoError(t, s.MemcpyPeer(dev.Addr(), 0, dev1.Addr(), 1, ordSize))
	require.NoError(t, s.Memcpy(addr(host), dev.Addr(), ordSize, MemcpyDeviceToHost))
	sameBytes(t, wantFill(ordSize, 90), host, "device 1's kernel output, over device 0's")
	require.NoError(t, s.DeviceSynchronize(0))
	require.NoError(t, s.DeviceSynchronize(1))
}

func fillOf(n int, v byte) []byte {
	b := make([]byte, n)
	fillBytes(b, v)
	return b
}

// TestNonBlockingStreamsOutOfLegacyOrder: a synchronous copy, the legacy
// stream's synchronize and its kernels do not wait for a non-blocking
// stream, nor it for them.
func TestNonBlockingStreamsOutOfLegacyOrder(t *testing.T) {
	s := newSession(t, testServerConfig())
	nb, err := s.StreamCreateWithFlags(0, StreamNonBlocking)
	require.NoError(t, err)
	assert.Equal(t, uint32(StreamNonBlocking), nb.Flags())
	_, err = s.StreamCreateWithFlags(0, 0x8)
	require.ErrorIs(t, err, ErrInvalidValue)
	f := newFlag(t, s)
	a, b := managed(t, s), managed(t, s)
	require.NoError(t, s.Launch(0, nb, "st-waitThenFill", 1, f.params(a.Addr(), ordSize, 50)))
	within(t, 20*time.Second, "a synchronous copy beside a gated non-blocking stream", f.set, func() {
		src := fillOf(ordSize, 7)
		require.NoError(t, s.Memcpy(b.Addr(), addr(src), ordSize, MemcpyHostToDevice))
		require.NoError(t, s.Memset(b.Addr(), 8, ordSize))
		require.NoError(t, s.DefaultStreamSynchronize(0))
		slowFill(t, s, 0, nil, b.Addr(), 9)
		require.NoError(t, s.DefaultStreamSynchronize(0))
		require.ErrorIs(t, s.StreamQuery(nb), ErrNotReady)
	})
	sameBytes(t, wantFill(ordSize, 9), b.Bytes(), "the legacy stream's kernel ran")
	f.set()
	require.NoError(t, s.StreamSynchronize(nb))
	sameBytes(t, wantFill(ordSize, 50), a.Bytes(), "the gated kernel's output")
	require.NoError(t, s.StreamQuery(nb))

	// The other way: a non-blocking stream's work runs while the legacy
	// stream waits for a gated kernel of its own.
	g := newFlag(t, s)
	require.NoError(t, s.Launch(0, nil, "st-waitThenFill", 1, g.params(a.Addr(), ordSize, 60)))
	within(t, 20*time.Second, "a non-blocking stream beside a gated legacy stream", g.set, func() {
		slowFill(t, s, 0, nb, b.Addr(), 11)
		require.NoError(t, s.StreamSynchronize(nb))
		require.ErrorIs(t, s.StreamQuery(s.DefaultStream(0)), ErrNotReady)
	})
	g.set()
	require.NoError(t, s.DeviceSynchronize(0))
	sameBytes(t, wantFill(ordSize, 11), b.Bytes(), "the non-blocking stream's kernel")
	require.NoError(t, s.StreamQuery(s.DefaultStream(0)))
}

// TestLegacyOrderBetweenKernels: work on the legacy stream waits for the
// blocking streams' work before it, and a blocking stream's work after
// it waits for it.
func TestLegacyOrderBetweenKernels(t *testing.T) {
	s := newSession(t, testServerConfig())
	s1, err := s.StreamCreate(0)
	require.NoError(t, err)
	a, b, c := managed(t, s), managed(t, s), managed(t, s)
	slowFill(t, s, 0, s1, a.Addr(), 10)
	require.NoError(t, s.Launch(0, nil, "st-copy", 1, stCopyParams(b.Addr(), a.Addr(), ordSize)))
	slowFill(t, s, 0, nil, c.Addr(), 20)
	require.NoError(t, s.Launch(0, s1, "st-copy", 1, stCopyParams(a.Addr(), c.Addr(), ordSize)))
	require.NoError(t, s.StreamSynchronize(s1))
	sameBytes(t, wantFill(ordSize, 10), b.Bytes(), "the legacy stream's copy waited for s1's kernel")
	sameBytes(t, wantFill(ordSize, 20), a.Bytes(), "s1's copy waited for the legacy stream's kernel")
}

// TestBlockingStreamsDoNotWaitForEachOther: two goroutines' own
// streams, blocking both, do not wait for each other (Go's stand-in for
// C's per-thread default streams), and each waits for the legacy
// stream's work before it.
func TestBlockingStreamsDoNotWaitForEachOther(t *testing.T) {
	s := newSession(t, testServerConfig())
	s1, err := s.StreamCreate(0)
	require.NoError(t, err)
	s2, err := s.StreamCreate(0)
	require.NoError(t, err)
	f := newFlag(t, s)
	a, b, c := managed(t, s), managed(t, s), managed(t, s)
	slowFill(t, s, 0, nil, c.Addr(), 6) // the legacy stream's, before both
	require.NoError(t, s.Launch(0, s1, "st-waitThenFill", 1, f.params(a.Addr(), ordSize, 5)))
	done := make(chan error, 1)
	go func() { // another goroutine's stream
		if err := s.Launch(0, s2, "st-copy", 1, stCopyParams(b.Addr(), c.Addr(), ordSize)); err != nil {
			done <- err
			return
		}
		done <- s.StreamSynchronize(s2)
	}()
	within(t, 20*time.Second, "a stream beside another's gated kernel", f.set, func() { require.NoError(t, <-done) })
	sameBytes(t, wantFill(ordSize, 6), b.Bytes(), "s2's copy waited for the legacy stream's kernel")
	require.ErrorIs(t, s.StreamQuery(s1), ErrNotReady)
	f.set()
	require.NoError(t, s.StreamSynchronize(s1))
	sameBytes(t, wantFill(ordSize, 5), a.Bytes(), "the gated kernel's output")
}

// TestEventOnLegacyStream: an event recorded on the legacy stream
// completes after the work of every blocking stream before it, and not
// after a non-blocking stream's; its time is when that work finished.
func TestEventOnLegacyStream(t *testing.T) {
	s := newSession(t, testServerConfig())
	nb, err := s.StreamCreateWithFlags(0, StreamNonBlocking)
	require.NoError(t, err)
	f := newFlag(t, s)
	gated := managed(t, s)
	require.NoError(t, s.Launch(0, nb, "st-waitThenFill", 1, f.params(gated.Addr(), ordSize, 1)))
	start, err := s.EventCreate(EventDefault)
	require.NoError(t, err)
	stop, err := s.EventCreate(EventDefault)
	require.NoError(t, err)
	legacy := s.DefaultStream(0)
	require.NoError(t, s.EventRecord(start, legacy))
	var outs []*Allocation
	for i := range 3 {
		st, err := s.StreamCreate(0)
		require.NoError(t, err)
		out := managed(t, s)
		outs = append(outs, out)
		slowFill(t, s, 0, st, out.Addr(), byte(30*i))
	}
	require.NoError(t, s.EventRecord(stop, legacy))
	within(t, 20*time.Second, "an event on the legacy stream beside a gated non-blocking stream", f.set, func() {
		require.NoError(t, s.EventSynchronize(stop))
	})
	for i, out := range outs {
		sameBytes(t, wantFill(ordSize, byte(30*i)), out.Bytes(), "a blocking stream's kernel, before the event")
	}
	require.NoError(t, s.EventQuery(stop))
	ms, err := s.EventElapsedTime(start, stop)
	require.NoError(t, err)
	assert.GreaterOrEqual(t, ms, float32(slowNap)/float32(time.Millisecond), "the kernels napped that long")
	require.ErrorIs(t, s.StreamQuery(nb), ErrNotReady, "the non-blocking stream's kernel still waits")
	f.set()
	require.NoError(t, s.StreamSynchronize(nb))
}

// TestFreeWaitsForKernels: a free waits for the kernels that may use the
// memory, on every stream (a non-blocking one too), as cudaFree: they
// finished before it returned, and none crashed on freed memory.
func TestFreeWaitsForKernels(t *testing.T) {
	s := newSession(t, testServerConfig())
	nb, err := s.StreamCreateWithFlags(0, StreamNonBlocking)
	require.NoError(t, err)
	a, b := managed(t, s), managed(t, s)
	slowFill(t, s, 0, nil, a.Addr(), 3)
	slowFill(t, s, 0, nb, b.Addr(), 4)
	require.NoError(t, a.Free())
	sameBytes(t, wantFill(ordSize, 4), b.Bytes(), "the other stream's kernel had finished too")
	require.NoError(t, b.Free())
	require.NoError(t, s.DeviceSynchronize(0))
}

// TestHostFuncBetweenWork: a host function runs once the work before it
// finished, and the work after it waits for it, on a created stream and
// on the legacy one; a callback gets its stream and status.
func TestHostFuncBetweenWork(t *testing.T) {
	s := newSession(t, testServerConfig())
	st, err := s.StreamCreate(0)
	require.NoError(t, err)
	for _, on := range []*Stream{st, s.DefaultStream(0)} {
		before, after, copied := managed(t, s), managed(t, s), managed(t, s)
		sawBefore, calls := false, 0
		var cbStream *Stream
		cbStatus := errors.New("not called")
		slowFill(t, s, 0, on, before.Addr(), 60)
		require.NoError(t, s.LaunchHostFunc(on, func() {
			calls++
			sawBefore = string(before.Bytes()) == string(wantFill(ordSize, 60))
			copy(after.Bytes(), wantFill(ordSize, 70))
		}))
		require.NoError(t, s.Launch(0, on, "st-copy", 1, stCopyParams(copied.Addr(), after.Addr(), ordSize)))
		require.NoError(t, s.StreamAddCallback(on, func(st *Stream, status error) {
			calls++
			cbStream, cbStatus = st, status
		}, 0))
		require.NoError(t, s.StreamSynchronize(on))
		assert.Equal(t, 2, calls)
		assert.True(t, sawBefore, "the host function saw the kernel before it")
		sameBytes(t, wantFill(ordSize, 70), copied.Bytes(), "the kernel after it saw what it wrote")
		assert.Same(t, on, cbStream)
		assert.NoError(t, cbStatus)
	}
	require.ErrorIs(t, s.LaunchHostFunc(st, nil), ErrInvalidValue)
	require.ErrorIs(t, s.LaunchHostFunc(nil, func() {}), ErrInvalidValue)
	require.ErrorIs(t, s.StreamAddCallback(st, func(*Stream, error) {}, 1), ErrInvalidValue)
}

// TestFailedLaunchIsSticky: a kernel that fails fails its device: every
// later synchronize of its stream, of the device's other streams and of
// the device, and every event of the device, reports it; new work is
// refused; a callback behind it gets it as its status; a reset clears it
// all. A launch that fails at the call (the device's process was killed)
// fails the device the same way.
func TestFailedLaunchIsSticky(t *testing.T) {
	s := newSession(t, testServerConfig())
	st, err := s.StreamCreate(0)
	require.NoError(t, err)
	other, err := s.StreamCreateWithFlags(0, StreamNonBlocking)
	require.NoError(t, err)
	before, err := s.EventCreate(EventDefault)
	require.NoError(t, err)
	after, err := s.EventCreate(EventDefault)
	require.NoError(t, err)
	require.NoError(t, s.EventRecord(before, st))
	require.NoError(t, s.EventSynchronize(before))
	require.NoError(t, s.Launch(0, st, "panics", 2, nil))
	var status error
	require.NoError(t, s.StreamAddCallback(st, func(_ *Stream, err error) { status = err }, 0))
	require.NoError(t, s.EventRecord(after, st))
	err = s.EventSynchronize(after)
	require.ErrorIs(t, err, ErrLaunchFailure)
	assert.Contains(t, err.Error(), `kernel "panics" panicked`)
	for range 2 {
		require.ErrorIs(t, s.EventSynchronize(after), ErrLaunchFailure)
		require.ErrorIs(t, s.EventQuery(after), ErrLaunchFailure)
		require.ErrorIs(t, s.EventSynchronize(before), ErrLaunchFailure)
		require.ErrorIs(t, s.StreamSynchronize(st), ErrLaunchFailure)
		require.ErrorIs(t, s.StreamSynchronize(other), ErrLaunchFailure)
		require.ErrorIs(t, s.DefaultStreamSynchronize(0), ErrLaunchFailure)
		require.ErrorIs(t, s.DeviceSynchronize(0), ErrLaunchFailure)
		require.ErrorIs(t, s.StreamQuery(st), ErrLaunchFailure)
	}
	require.ErrorIs(t, status, ErrLaunchFailure, "the callback's status")
	_, err = s.EventElapsedTime(before, after)
	require.ErrorIs(t, err, ErrLaunchFailure)
	err = s.Launch(0, other, "nothing", 1, nil)
	require.ErrorIs(t, err, ErrLaunchFailure)
	assert.Contains(t, err.Error(), "DeviceReset clears that")
	require.ErrorIs(t, s.EventRecord(after, s.DefaultStream(0)), ErrLaunchFailure)
	require.ErrorIs(t, s.LaunchHostFunc(st, func() {}), ErrLaunchFailure)

	require.NoError(t, s.DeviceReset(0))
	require.NoError(t, s.DeviceSynchronize(0))
	require.NoError(t, s.EventSynchronize(after))
	st, err = s.StreamCreate(0)
	require.NoError(t, err)
	require.NoError(t, s.Launch(0, st, "nothing", 1, nil))
	require.NoError(t, s.EventRecord(after, st))
	require.NoError(t, s.EventSynchronize(after))

	// The process killed: the next launch finds it dead and fails.
	pid := s.DevicePID(0)
	require.NotZero(t, pid)
	require.NoError(t, killPID(pid))
	for !errors.Is(syscall.Kill(pid, 0), syscall.ESRCH) { // reaped by the session
		time.Sleep(time.Millisecond)
	}
	err = s.Launch(0, st, "nothing", 1, nil)
	require.ErrorIs(t, err, ErrLaunchFailure)
	assert.Contains(t, err.Error(), "killed")
	require.ErrorIs(t, s.EventSynchronize(after), ErrLaunchFailure)
	require.ErrorIs(t, s.StreamSynchronize(st), ErrLaunchFailure)
	require.NoError(t, s.DeviceReset(0))
}
