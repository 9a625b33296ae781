package uvm

import (
	"fmt"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/softuvm/softuvm/devmem"
	"github.com/softuvm/softuvm/internal/config"
)

func init() {
	// waitFlag: params = the address of a uint32 in pinned host memory;
	// sets it to 1 (the kernel runs), then waits until it is 2.
	MustRegisterKernel("waitFlag", func(tid, n int, p []byte) {
		flag := (*atomic.Uint32)(unsafe.Pointer(unsafe.SliceData(devmem.BytesAt(uintptr(paramU64(p, 0)), 4))))
		flag.Store(1)
		for flag.Load() != 2 {
			time.Sleep(50 * time.Microsecond)
		}
	})
	testRoles["touch-during-kernel"] = roleTouchDuringKernel
	testRoles["attach-in-stream-order"] = roleAttachInStreamOrder
}

func paramU64(p []byte, i int) uint64 {
	return uint64(p[8*i]) | uint64(p[8*i+1])<<8 | uint64(p[8*i+2])<<16 | uint64(p[8*i+3])<<24 |
		uint64(p[8*i+4])<<32 | uint64(p[8*i+5])<<40 | uint64(p[8*i+6])<<48 | uint64(p[8*i+7])<<56
}

func launchConfig(dirty string) ServerConfig {
	c := testServerConfig()
	c.Coherence = "launch"
	c.DirtyTracking = dirty
	return c
}

// TestLaunchModelCopiesWhatTheCPUWrote: under the launch model a launch
// copies to the device the pages the host wrote (every page, the first
// time: none was on the device) and no page the host only read; a host
// write between launches is seen by the next kernel; the kernel's writes
// are seen by the host after the synchronize. Both ways of finding the
// written pages.
func TestLaunchModelCopiesWhatTheCPUWrote(t *testing.T) {
	for _, dirty := range []string{"wp-async", "wp-fault"} {
		t.Run(dirty, func(t *testing.T) {
			s := newSession(t, launchConfig(dirty))
			require.Equal(t, "launch", s.Coherence())
			in, err := s.Info()
			require.NoError(t, err)
			require.Len(t, in.Sessions, 1)
			assert.Equal(t, "launch", in.Sessions[0].Coherence)
			assert.Equal(t, dirty, in.Sessions[0].DirtyTracking)
			concurrent, err := s.DeviceGetAttribute(AttrConcurrentManagedAccess, 0)
			require.NoError(t, err)
			assert.Zero(t, concurrent, "the CPU may not touch what a kernel may use")
			props, err := s.GetDeviceProperties(0)
			require.NoError(t, err)
			assert.False(t, props.ConcurrentManagedAccess)

			const pages = 64
			a, err := s.MallocManaged(pages * PageSize)
			require.NoError(t, err)
			b := a.Bytes()
			want := make([]byte, len(b))
			for i := range b {
				b[i] = byte(i*7 + i>>12)
				want[i] = b[i]
			}
			launchAddOne := func() {
				t.Helper()
				require.NoError(t, s.Launch(0, nil, "addOne", 2, rangeParams(a.Addr(), a.Size(), 0)))
				require.NoError(t, s.DeviceSynchronize(0))
				for i := range want {
					want[i]++
				}
			}
			before := stats(t, a)
			launchAddOne()
			st := stats(t, a)
			assert.Equal(t, uint64(pages), st.LaunchCopiedPages-before.LaunchCopiedPages, "every page goes to the device at the first launch")
			assert.Zero(t, st.LaunchCleanPages-before.LaunchCleanPages)
			sameBytes(t, want, b, "the host reads what the kernel wrote")

			// The host read every page (copies the device keeps), and
			// writes five.
			for _, p := range []int{3, 4, 5, 6, 40} {
				b[p*PageSize+11] = 0xee
				want[p*PageSize+11] = 0xee
			}
			before = stats(t, a)
			launchAddOne()
			st = stats(t, a)
			assert.Equal(t, uint64(5), st.LaunchCopiedPages-before.LaunchCopiedPages, "only the written pages are copied")
			assert.Equal(t, uint64(pages-5), st.LaunchCleanPages-before.LaunchCleanPages, "the pages only read are dropped, not copied")
			sameBytes(t, want, b, "the kernel saw the host's writes, and the host sees the kernel's")

			// Nothing touched on the host since: nothing to copy.
			before = stats(t, a)
			require.NoError(t, s.Launch(0, nil, "nothing", 1, nil))
			require.NoError(t, s.DeviceSynchronize(0))
			st = stats(t, a)
			assert.Equal(t, uint64(0), st.LaunchCopiedPages-before.LaunchCopiedPages)
			sameBytes(t, want, b, "unchanged")
		})
	}
}

// TestLaunchModelAttachment: memory attached to the host stays the CPU's
// while a kernel runs, and memory attached to one stream stays the
// CPU's while a kernel runs on another; a kernel on its own stream
// takes it.
func TestLaunchModelAttachment(t *testing.T) {
	s := newSession(t, launchConfig(""))
	flagMem, err := s.HostAlloc(PageSize, HostAllocMapped)
	require.NoError(t, err)
	flag := (*atomic.Uint32)(flagMem.Pointer())
	hostOnly, err := s.MallocManaged(4*PageSize, WithFlags(AttachHost))
	require.NoError(t, err)
	single, err := s.MallocManaged(4 * PageSize)
	require.NoError(t, err)
	stA, err := s.StreamCreate(0)
	require.NoError(t, err)
	stB, err := s.StreamCreate(0)
	require.NoError(t, err)
	require.NoError(t, s.StreamAttachMemAsync(stA, single.Addr(), 0, AttachSingle))
	fillBytes(single.Bytes(), 5)
	fillBytes(hostOnly.Bytes(), 9)

	require.NoError(t, s.Launch(0, stB, "waitFlag", 1, params(uint64(flagMem.Addr()))))
	for flag.Load() != 1 {
		time.Sleep(100 * time.Microsecond)
	}
	// The kernel on B runs: both stay the CPU's.
	for i, v := range hostOnly.Bytes() {
		require.Equal(t, byte(9), v, "byte %d of host-attached memory", i)
	}
	fillBytes(hostOnly.Bytes(), 10)
	for i, v := range single.Bytes() {
		require.Equal(t, byte(5), v, "byte %d of memory attached to stream A", i)
	}
	fillBytes(single.Bytes(), 6)
	flag.Store(2)
	require.NoError(t, s.StreamSynchronize(stB))

	// A's kernel takes its memory and sees the CPU's writes.
	require.NoError(t, s.Launch(0, stA, "addOne", 1, rangeParams(single.Addr(), single.Size(), 0)))
	require.NoError(t, s.StreamSynchronize(stA))
	for i, v := range single.Bytes() {
		require.Equal(t, byte(7), v, "byte %d after stream A's kernel", i)
	}
	for i, v := range hostOnly.Bytes() {
		require.Equal(t, byte(10), v, "byte %d of host-attached memory", i)
	}

	// Misuse.
	assert.ErrorIs(t, s.StreamAttachMemAsync(stA, single.Addr()+PageSize, 0, AttachSingle), ErrInvalidValue, "not the allocation's start")
	assert.ErrorIs(t, s.StreamAttachMemAsync(stA, single.Addr(), 5, AttachSingle), ErrInvalidValue, "a length that is not the size")
	assert.ErrorIs(t, s.StreamAttachMemAsync(nil, single.Addr(), 0, AttachSingle), ErrInvalidValue, "single with no stream")
	assert.ErrorIs(t, s.StreamAttachMemAsync(stA, single.Addr(), 0, 0x10), ErrInvalidValue, "unknown flags")
	assert.ErrorIs(t, s.StreamAttachMemAsync(stA, flagMem.Addr(), 0, AttachGlobal), ErrInvalidValue, "pinned host memory")
	err = s.StreamAttachMemAsync(stA, single.Addr(), 0, 0x10)
	assert.Contains(t, err.Error(), "0x10")
}

// roleTouchDuringKernel: a client that touches managed memory while a
// kernel that may use it runs, under UVM_COHERENCE (of the test).
func roleTouchDuringKernel() int {
	cfg := testServerConfig()
	s, err := Connect(Config{Server: "private", Private: cfg, Coherence: os.Getenv("TOUCH_COHERENCE")})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	flagMem, _ := s.HostAlloc(PageSize, HostAllocMapped)
	flag := (*atomic.Uint32)(flagMem.Pointer())
	a, err := s.MallocManaged(PageSize)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	a.Bytes()[0] = 1
	if err := s.Launch(0, nil, "waitFlag", 1, params(uint64(flagMem.Addr()))); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	for flag.Load() != 1 {
		time.Sleep(100 * time.Microsecond)
	}
	fmt.Fprintln(os.Stderr, "touching")
	a.Bytes()[0] = 2 // SIGBUS under the launch model
	flag.Store(2)
	if err := s.DeviceSynchronize(0); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	fmt.Fprintln(os.Stderr, "touched, value", a.Bytes()[0])
	s.Close()
	return 0
}

// TestLaunchModelRefusesTheCPUDuringAKernel: under the launch model a
// CPU touch of managed memory a running kernel may use kills the thread
// with SIGBUS, and the message names the allocation and the kernel;
// under the fault model the same program runs.
func TestLaunchModelRefusesTheCPUDuringAKernel(t *testing.T) {
	requireRoot(t)
	for _, model := range []string{"launch", "fault"} {
		t.Run(model, func(t *testing.T) {
			out, err := runChildRole(t, "touch-during-kernel", "TOUCH_COHERENCE="+model)
			if model == "fault" {
				require.NoError(t, err, "%s", out)
				assert.Contains(t, out, "touched, value 2")
				return
			}
			require.Error(t, err, "%s", out)
			assert.Contains(t, out, "touching")
			assert.NotContains(t, out, "touched, value")
			assert.Contains(t, out, "SIGBUS", "the thread dies of SIGBUS: %s", out)
			assert.Contains(t, out, `while kernel "waitFlag" (device 0 stream 0) may use it`, "%s", out)
			assert.True(t, strings.Contains(out, "managed allocation 0x"), "the message names the allocation: %s", out)
		})
	}
}

// roleAttachInStreamOrder: a launch-model client that attaches memory to
// the host on the legacy stream, synchronizes it and touches the memory
// while a kernel that took it at its launch still runs on a
// non-blocking stream; then after an unsynchronized kernel on a blocking
// stream. It says "touched" at the end: a touch refused kills it with
// SIGBUS first.
func roleAttachInStreamOrder() int {
	s, err := Connect(Config{Server: "private", Private: launchConfig("")})
	fail := func(err error) int { fmt.Fprintln(os.Stderr, err); return 2 }
	if err != nil {
		return fail(err)
	}
	defer s.Close()
	flagMem, err := s.HostAlloc(PageSize, HostAllocMapped)
	if err != nil {
		return fail(err)
	}
	flag := (*atomic.Uint32)(flagMem.Pointer())
	x, err := s.MallocManaged(4 * PageSize)
	if err != nil {
		return fail(err)
	}
	nb, err := s.StreamCreateWithFlags(0, StreamNonBlocking)
	if err != nil {
		return fail(err)
	}
	fillBytes(x.Bytes(), 1)
	if err := s.Launch(0, nb, "waitFlag", 1, params(uint64(flagMem.Addr()))); err != nil { // takes x: global
		return fail(err)
	}
	for flag.Load() != 1 {
		time.Sleep(100 * time.Microsecond)
	}
	legacy := s.DefaultStream(0)
	if err := s.StreamAttachMemAsync(legacy, x.Addr(), 0, AttachHost); err != nil {
		return fail(err)
	}
	if err := s.StreamSynchronize(legacy); err != nil {
		return fail(err)
	}
	if err := allBytes(x.Bytes(), 1); err != nil {
		return fail(err)
	}
	fillBytes(x.Bytes(), 2)
	flag.Store(2)
	if err := s.StreamSynchronize(nb); err != nil {
		return fail(err)
	}

	// A kernel on a blocking stream takes it, and is never synchronized
	// by itself.
	s1, err := s.StreamCreate(0)
	if err != nil {
		return fail(err)
	}
	if err := s.StreamAttachMemAsync(s1, x.Addr(), 0, AttachGlobal); err != nil {
		return fail(err)
	}
	if err := s.Launch(0, s1, "addOne", 2, rangeParams(x.Addr(), x.Size(), 0)); err != nil {
		return fail(err)
	}
	if err := s.StreamAttachMemAsync(legacy, x.Addr(), 0, AttachHost); err != nil {
		return fail(err)
	}
	if err := s.StreamSynchronize(legacy); err != nil {
		return fail(err)
	}
	if err := allBytes(x.Bytes(), 3); err != nil {
		return fail(fmt.Errorf("after the kernel: %w", err))
	}
	fillBytes(x.Bytes(), 4)
	fmt.Fprintln(os.Stderr, "touched")
	return 0
}

// allBytes says which byte of b is not v, if one is not.
func allBytes(b []byte, v byte) error {
	for i, x := range b {
		if x != v {
			return fmt.Errorf("byte %d is %d, want %d", i, x, v)
		}
	}
	return nil
}

// TestLaunchModelAttachmentInStreamOrder: an attachment takes effect when
// its stream reaches it, and then frees the memory of running kernels
// that took it: the CPU may touch memory attached to the host on the
// legacy stream, once that stream is synchronized, while such a kernel
// runs (in a child: a refused touch is SIGBUS).
func TestLaunchModelAttachmentInStreamOrder(t *testing.T) {
	requireRoot(t)
	out, err := runChildRole(t, "attach-in-stream-order")
	require.NoError(t, err, "%s", out)
	assert.Contains(t, out, "touched")
}

// runChildRole runs role in a child and returns its standard error and how
// it ended. The standard error is a file, not a pipe: the private server
// and its guard outlive a child that dies, and would hold a pipe open. A
// touch that is neither refused nor served would fault for ever: a
// child still running after a minute is killed rather than the test.
func runChildRole(t *testing.T, role string, env ...string) (string, error) {
	t.Helper()
	cmd := child(t, role, env...)
	stderr, err := os.Create(t.TempDir() + "/stderr")
	require.NoError(t, err)
	defer stderr.Close()
	cmd.Stderr = stderr
	require.NoError(t, cmd.Start())
	stop := time.AfterFunc(time.Minute, func() { cmd.Process.Kill() })
	err = cmd.Wait()
	stop.Stop()
	b, rerr := os.ReadFile(stderr.Name())
	require.NoError(t, rerr)
	return string(b), err
}

// TestLaunchModelRefusals: what CUDA refuses without concurrent managed
// access is refused under the launch model, and allowed under the fault
// model.
func TestLaunchModelRefusals(t *testing.T) {
	for _, model := range []string{"launch", "fault"} {
		t.Run(model, func(t *testing.T) {
			cfg := launchConfig("")
			cfg.Coherence = model
			cfg.Devices = twoDeviceConfig().Devices
			s := newSession(t, cfg)
			a, err := s.MallocManaged(4 * PageSize)
			require.NoError(t, err)
			st, err := s.StreamCreate(0)
			require.NoError(t, err)
			check := func(err error, what string) {
				t.Helper()
				if model == "fault" {
					require.NoError(t, err, what)
					return
				}
				require.ErrorIs(t, err, ErrInvalidDevice, what)
				assert.Contains(t, err.Error(), "concurrent managed access 0", what)
			}
			check(s.Prefetch(a.Addr(), a.Size(), 0), "prefetch to a device")
			check(s.Prefetch(a.Addr(), a.Size(), CPU), "prefetch to the CPU")
			check(s.PrefetchAsync(a.Addr(), a.Size(), 0, st), "an asynchronous prefetch")
			check(s.MemAdvise(a.Addr(), a.Size(), AdviseSetPreferredLocation, 1), "preferred location on a device")
			check(s.MemAdvise(a.Addr(), a.Size(), AdviseSetAccessedBy, 0), "accessed by a device")
			require.NoError(t, s.MemAdvise(a.Addr(), a.Size(), AdviseSetPreferredLocation, CPU))
			require.NoError(t, s.MemAdvise(a.Addr(), a.Size(), AdviseSetReadMostly, 0))
			require.NoError(t, s.StreamSynchronize(st))
		})
	}
}

// TestLaunchModelKeepsTheCPUsWritesToItsCopies: under the launch model
// the host writes its copies of device pages without a fault (the
// writes are found at the next launch's hand-off). Whatever moves those
// pages before that launch must carry the host's bytes, not a device's
// older copy. Under this model CUDA refuses prefetches
// (TestLaunchModelRefusals), so what moves them is a launch on the other
// device, each way (eviction, the other way, is
// TestDataIntegrityUnderTheCoreLaunch's).
func TestLaunchModelKeepsTheCPUsWritesToItsCopies(t *testing.T) {
	for _, dirty := range []string{"wp-async", "wp-fault"} {
		t.Run(dirty, func(t *testing.T) {
			cfg := launchConfig(dirty)
			cfg.Devices = config.DeviceSpecs(2, []int64{8 << 20}, cfg.Devices[0].Backend)
			s := newSession(t, cfg)
			const pages = 32
			a, err := s.MallocManaged(pages * PageSize)
			require.NoError(t, err)
			b := a.Bytes()
			want := make([]byte, len(b))
			round := 0
			// write puts a new byte in every page on the host: after a
			// launch, into the copies the host reads back from the
			// device.
			write := func() {
				round++
				for p := range pages {
					b[p*PageSize+p] = byte(round*31 + p)
					want[p*PageSize+p] = b[p*PageSize+p]
				}
			}
			launchOn := func(d Device) {
				t.Helper()
				require.NoError(t, s.Launch(d, nil, "addOne", 2, rangeParams(a.Addr(), a.Size(), 0)))
				require.NoError(t, s.DeviceSynchronize(d))
				for i := range want {
					want[i]++
				}
			}
			write()
			launchOn(0)
			sameBytes(t, want, b, "the host reads what device 0 wrote") // host copies now
			write()
			launchOn(1)
			sameBytes(t, want, b, "device 1's kernel saw the host's writes")
			write()
			launchOn(0)
			sameBytes(t, want, b, "device 0's kernel saw the host's writes after device 1's")
			write()
			launchOn(1)
			sameBytes(t, want, b, "device 1's kernel saw the host's writes after device 0's")
		})
	}
}
