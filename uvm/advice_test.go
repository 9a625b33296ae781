package uvm

import (
	"encoding/binary"
	"math/rand/v2"
	"sync"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/softuvm/softuvm/devmem"
	"github.com/softuvm/softuvm/internal/config"
	"github.com/softuvm/softuvm/internal/core"
	"github.com/softuvm/softuvm/policy"
)

func init() {
	// sum: params = address, length, out; thread 0 adds up every byte of
	// the range and stores the sum (uint64) at out.
	MustRegisterKernel("sum", func(tid, n int, p []byte) {
		if tid != 0 {
			return
		}
		addr, length, out := u64Params(p)
		var sum uint64
		for _, c := range devmem.BytesAt(uintptr(addr), int64(length)) {
			sum += uint64(c)
		}
		*u64At(out) = sum
	})
	// hammer: params = counter address, duration in microseconds, out;
	// increments the uint64 counter until the time is up, then stores how
	// many times at out.
	MustRegisterKernel("hammer", func(tid, n int, p []byte) {
		addr, us, out := u64Params(p)
		c := u64At(addr)
		var times uint64
		for deadline := time.Now().Add(time.Duration(us) * time.Microsecond); time.Now().Before(deadline); {
			*c++
			times++
		}
		*u64At(out) = times
	})
}

// u64At is the uint64 of managed memory at addr.
func u64At(addr uint64) *uint64 {
	return (*uint64)(unsafe.Pointer(&devmem.BytesAt(uintptr(addr), 8)[0]))
}

func u64Params(p []byte) (uint64, uint64, uint64) {
	return binary.LittleEndian.Uint64(p), binary.LittleEndian.Uint64(p[8:]), binary.LittleEndian.Uint64(p[16:])
}

func params(vs ...uint64) []byte {
	b := make([]byte, 8*len(vs))
	for i, v := range vs {
		binary.LittleEndian.PutUint64(b[8*i:], v)
	}
	return b
}

func twoDeviceConfig() ServerConfig {
	c := DefaultServerConfig()
	c.Devices = config.DeviceSpecs(2, []int64{64 << 20}, c.Devices[0].Backend)
	c.DeviceWorkers = 2
	return c
}

// plus returns b with n added to every byte, what addOne kernels do.
func plus(b []byte, n byte) []byte {
	out := make([]byte, len(b))
	for i, c := range b {
		out[i] = c + n
	}
	return out
}

// sameBytes compares without printing megabytes: it names the first
// difference.
func sameBytes(t *testing.T, want, got []byte, msg string) {
	t.Helper()
	require.Equal(t, len(want), len(got), msg)
	for i := range want {
		if want[i] != got[i] {
			t.Fatalf("%s: first difference at byte %d (page %d): want %#x, got %#x", msg, i, i/PageSize, want[i], got[i])
		}
	}
}

func byteSum(b []byte) uint64 {
	var s uint64
	for _, c := range b {
		s += uint64(c)
	}
	return s
}

// runSum runs the sum kernel on device d over a and returns its result.
func runSum(t *testing.T, s *Session, d Device, a *Allocation, out *Allocation) uint64 {
	t.Helper()
	require.NoError(t, s.Launch(d, nil, "sum", 1, params(uint64(a.Addr()), uint64(a.Size()), uint64(out.Addr()))))
	require.NoError(t, s.DeviceSynchronize(d))
	return binary.LittleEndian.Uint64(out.Bytes())
}

func stats(t *testing.T, a *Allocation) Stats {
	t.Helper()
	st, err := a.Stats()
	require.NoError(t, err)
	return st
}

// TestReadMostly: with read-mostly advice, a device's reads make a
// read-only copy on the device and the host keeps its own: nothing
// migrates, both read without faulting again. A write collapses the
// copies to the writer's.
func TestReadMostly(t *testing.T) {
	s := newSession(t, twoDeviceConfig())
	const size = 1 << 20
	pages := uint64(size / PageSize)
	a, err := s.MallocManaged(size)
	require.NoError(t, err)
	out, err := s.MallocManaged(8)
	require.NoError(t, err)
	fill(a.Bytes(), 5)
	want := byteSum(a.Bytes())
	require.NoError(t, s.MemAdvise(a.Addr(), size, AdviseSetReadMostly, 0))
	rm, err := s.RangeAttribute(a.Addr(), size, AttrReadMostly)
	require.NoError(t, err)
	assert.Equal(t, true, rm)

	assert.Equal(t, want, runSum(t, s, 0, a, out))
	assert.Equal(t, want, runSum(t, s, 1, a, out))
	st := stats(t, a)
	assert.Equal(t, pages, st.ReadDuplicatedPages(0), "device 0 got a copy of every page")
	assert.Equal(t, pages, st.ReadDuplicatedPages(1), "device 1 too")
	assert.Zero(t, st.MigratedPages(CPU, 0)+st.MigratedPages(CPU, 1), "nothing migrated")
	hostFaults := st.FaultsBy(CPU).Total()
	assert.Equal(t, want, byteSum(a.Bytes()), "the host still reads its own copy")
	assert.Equal(t, want, runSum(t, s, 0, a, out))
	st = stats(t, a)
	assert.Equal(t, hostFaults, st.FaultsBy(CPU).Total(), "the host did not fault on its copy")
	assert.Equal(t, pages, st.ReadDuplicatedPages(0), "device 0 read its copy again without faulting")

	// A host write collapses that page's copies to the host's.
	wpBefore := st.FaultsBy(CPU).WriteProtect
	a.Bytes()[0]++
	want++
	st = stats(t, a)
	assert.Equal(t, wpBefore+1, st.FaultsBy(CPU).WriteProtect, "the write hit the protection")
	assert.Equal(t, want, runSum(t, s, 1, a, out), "device 1 reads the new byte")
	st = stats(t, a)
	assert.Equal(t, pages+1, st.ReadDuplicatedPages(1), "device 1 copied the written page again")

	// A device write collapses the copies to the device's.
	shadow := append([]byte(nil), a.Bytes()...)
	for i := range PageSize {
		shadow[i]++
	}
	require.NoError(t, s.Launch(0, nil, "addOne", 1, rangeParams(a.Addr(), PageSize, 0)))
	require.NoError(t, s.DeviceSynchronize(0))
	want = byteSum(shadow)
	sameBytes(t, shadow, a.Bytes(), "the host sees the device's write")

	// Unset collapses every copy to one.
	require.NoError(t, s.MemAdvise(a.Addr(), size, AdviseUnsetReadMostly, 0))
	in, err := s.rpc.Info()
	require.NoError(t, err)
	assert.Zero(t, in.Devices[0].UsedBytes+in.Devices[1].UsedBytes, "the host had a copy of every page, and kept it")
	assert.Equal(t, want, runSum(t, s, 1, a, out))
	st = stats(t, a)
	assert.Equal(t, pages, st.MigratedPages(CPU, 1), "without the advice, a read migrates")
}

// TestPreferredLocationHost: with the host preferred, a device's kernel
// maps host memory remotely instead of migrating it; the host never
// faults.
func TestPreferredLocationHost(t *testing.T) {
	s := newSession(t, twoDeviceConfig())
	const size = 1 << 20
	a, err := s.MallocManaged(size)
	require.NoError(t, err)
	fill(a.Bytes(), 1)
	require.NoError(t, s.MemAdvise(a.Addr(), size, AdviseSetPreferredLocation, CPU))
	pl, err := s.RangeAttribute(a.Addr(), size, AttrPreferredLocation)
	require.NoError(t, err)
	assert.Equal(t, CPU, pl)
	before := stats(t, a)

	require.NoError(t, s.Launch(0, nil, "addOne", 2, rangeParams(a.Addr(), size, 0)))
	require.NoError(t, s.DeviceSynchronize(0))
	st := stats(t, a)
	assert.Zero(t, st.MigratedPages(CPU, 0), "nothing migrated")
	assert.Zero(t, st.FaultsBy(0).Total(), "the device mapped host memory: no faults")
	assert.Equal(t, uint64(size/PageSize), st.RemoteMappedPages(0))
	sameBytes(t, plus(pattern(size, 1), 1), a.Bytes(), "the host sees the kernel's writes in place")
	assert.Equal(t, before.FaultsBy(CPU).Total(), stats(t, a).FaultsBy(CPU).Total(), "the host never faulted")

	// Unset: the next kernel migrates again.
	require.NoError(t, s.MemAdvise(a.Addr(), size, AdviseUnsetPreferredLocation, CPU))
	require.NoError(t, s.Launch(0, nil, "addOne", 2, rangeParams(a.Addr(), size, 0)))
	require.NoError(t, s.DeviceSynchronize(0))
	assert.Equal(t, uint64(size/PageSize), stats(t, a).MigratedPages(CPU, 0))
	sameBytes(t, plus(pattern(size, 1), 2), a.Bytes(), "after the advice is unset")
}

// TestPreferredLocationDevice: with device 0 preferred, the host's
// accesses migrate (a CPU cannot map device memory), and device 1's
// kernel brings the pages back to device 0 and maps them there.
func TestPreferredLocationDevice(t *testing.T) {
	s := newSession(t, twoDeviceConfig())
	const size = 1 << 20
	pages := uint64(size / PageSize)
	a, err := s.MallocManaged(size)
	require.NoError(t, err)
	require.NoError(t, s.MemAdvise(a.Addr(), size, AdviseSetPreferredLocation, 0))
	fill(a.Bytes(), 7)
	require.NoError(t, s.Launch(1, nil, "addOne", 2, rangeParams(a.Addr(), size, 0)))
	require.NoError(t, s.DeviceSynchronize(1))
	st := stats(t, a)
	assert.Equal(t, pages, st.MigratedPages(CPU, 0), "device 1's faults brought the pages home to device 0")
	assert.Zero(t, st.MigratedPages(CPU, 1), "not to device 1")
	assert.Equal(t, pages, st.RemoteMappedPages(1))
	in, err := s.rpc.Info()
	require.NoError(t, err)
	assert.Equal(t, int64(size), in.Devices[0].UsedBytes)
	assert.Zero(t, in.Devices[1].UsedBytes)
	sameBytes(t, plus(pattern(size, 7), 1), a.Bytes(), "the host migrates them back to read them")
	assert.Equal(t, pages, stats(t, a).MigratedPages(0, CPU))
}

// TestAccessedBy: a device with accessed-by advice maps the data where it
// lives and follows it: its kernels never fault on the range.
func TestAccessedBy(t *testing.T) {
	s := newSession(t, twoDeviceConfig())
	const size = 1 << 20
	a, err := s.MallocManaged(size)
	require.NoError(t, err)
	out, err := s.MallocManaged(8)
	require.NoError(t, err)
	fill(a.Bytes(), 3)
	want := byteSum(a.Bytes())
	require.NoError(t, s.Prefetch(a.Addr(), size, 0))
	require.NoError(t, s.MemAdvise(a.Addr(), size, AdviseSetAccessedBy, 1))
	ab, err := s.RangeAttribute(a.Addr(), size, AttrAccessedBy)
	require.NoError(t, err)
	assert.Equal(t, []Device{1}, ab)
	require.NoError(t, s.Prefetch(out.Addr(), 8, 1))

	assert.Equal(t, want, runSum(t, s, 1, a, out), "device 1 reads device 0's memory")
	st := stats(t, a)
	assert.Zero(t, st.FaultsBy(1).Total(), "without a fault")
	assert.Zero(t, st.MigratedPages(0, 1))
	assert.Equal(t, uint64(size/PageSize), st.RemoteMappedPages(1))

	// The data moves to the host; device 1's mapping follows.
	require.NoError(t, s.Prefetch(a.Addr(), size, CPU))
	assert.Equal(t, want, runSum(t, s, 1, a, out))
	st = stats(t, a)
	assert.Zero(t, st.FaultsBy(1).Total(), "still without a fault")
	assert.Equal(t, uint64(2*size/PageSize), st.RemoteMappedPages(1))

	require.NoError(t, s.MemAdvise(a.Addr(), size, AdviseUnsetAccessedBy, 1))
	assert.Equal(t, want, runSum(t, s, 1, a, out))
	assert.Positive(t, stats(t, a).FaultsBy(1).Total(), "without the advice, device 1 faults and migrates")
}

// TestThrashing: the host and a kernel writing the same page at once make
// it thrash: faults get throttled, then the page is pinned in host memory
// and the device maps it there. Every increment survives.
func TestThrashing(t *testing.T) {
	cfg := twoDeviceConfig()
	cfg.Thrashing = policy.ThrashingSpec{Enabled: true, Threshold: 3, Lapse: core.Duration(20 * time.Millisecond), Nap: core.Duration(200 * time.Microsecond),
		PinThreshold: 3, Pin: core.Duration(5 * time.Second), Epoch: core.Duration(10 * time.Second)}
	s := newSession(t, cfg)
	a, err := s.MallocManaged(PageSize)
	require.NoError(t, err)
	out, err := s.MallocManaged(8)
	require.NoError(t, err)
	require.NoError(t, s.Prefetch(out.Addr(), 8, 0))
	counters := unsafe.Slice((*uint64)(a.Pointer()), 2)
	counters[0] = 0
	const runFor = 300 * time.Millisecond
	require.NoError(t, s.Launch(0, nil, "hammer", 1, params(uint64(a.Addr()), uint64(runFor/time.Microsecond), uint64(out.Addr()))))
	var hostTimes uint64
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for deadline := time.Now().Add(runFor); time.Now().Before(deadline); {
			counters[1]++
			hostTimes++
		}
	}()
	wg.Wait()
	require.NoError(t, s.DeviceSynchronize(0))
	kernelTimes := binary.LittleEndian.Uint64(out.Bytes())
	assert.Equal(t, kernelTimes, counters[0], "every kernel increment survived")
	assert.Equal(t, hostTimes, counters[1], "every host increment survived")
	st := stats(t, a)
	t.Logf("kernel %d, host %d increments; throttles %v, pins %v, migrations %v", kernelTimes, hostTimes, st.Throttles, st.Pins, st.Migrations)
	assert.Positive(t, st.ThrottlesOf(0)+st.ThrottlesOf(CPU), "faults were throttled")
	assert.Positive(t, st.PinsOf(0)+st.PinsOf(CPU), "the page was pinned")
	assert.Positive(t, st.RemoteMappedPages(0), "the device mapped the pinned page in host memory")
}

func TestAdviceBadInput(t *testing.T) {
	s := newSession(t, twoDeviceConfig())
	a, err := s.MallocManaged(PageSize)
	require.NoError(t, err)
	var local [64]byte
	stack := uintptr(unsafe.Pointer(&local[0]))
	for _, tc := range []struct {
		name string
		err  error
		is   error
		msg  string
	}{
		{"unknown device", s.MemAdvise(a.Addr(), 1, AdviseSetPreferredLocation, 5), ErrInvalidDevice, "device 5"},
		{"unknown advice", s.MemAdvise(a.Addr(), 1, Advice(42), 0), ErrInvalidValue, "advice 42"},
		{"unmanaged memory", s.MemAdvise(stack, 8, AdviseSetReadMostly, 0), ErrInvalidValue, "is not managed memory"},
		{"past the end", s.MemAdvise(a.Addr(), 2*PageSize, AdviseSetAccessedBy, 0), ErrInvalidValue, "runs past the end"},
	} {
		require.Error(t, tc.err, tc.name)
		assert.ErrorIs(t, tc.err, tc.is, tc.name)
		assert.Contains(t, tc.err.Error(), tc.msg, tc.name)
	}
	// The device argument of read-mostly advice is ignored, as CUDA's.
	require.NoError(t, s.MemAdvise(a.Addr(), 1, AdviseSetReadMostly, 99))
}

// TestWritesVisibleEverywhere: the host and two devices take turns writing
// a whole range, with prefetches and advice between, and every write is
// what the host reads next. It catches a migration that lets the
// destination write before the source copy is gone: a reader of the
// source then sees old bytes after the write.
func TestWritesVisibleEverywhere(t *testing.T) {
	s := newSession(t, twoDeviceConfig())
	const size = 3 * PageSize
	a, err := s.MallocManaged(size)
	require.NoError(t, err)
	shadow := make([]byte, size)
	rng := rand.New(rand.NewPCG(1, 2))
	for it := range 3000 {
		seed := rng.Uint64()
		switch op := rng.IntN(8); op {
		case 0, 1:
			for i := range shadow {
				shadow[i] = seededByte(seed, i)
			}
			copy(a.Bytes(), shadow)
		case 2, 3, 4:
			d := Device(op % 2)
			require.NoError(t, s.Launch(d, nil, "writeSeeded", 1+rng.IntN(2), params(uint64(a.Addr()), size, seed)))
			require.NoError(t, s.DeviceSynchronize(d))
			for i := range shadow {
				shadow[i] = seededByte(seed, i)
			}
		case 5:
			require.NoError(t, s.Prefetch(a.Addr(), size, Device(rng.IntN(3)-1)))
		case 6:
			advice := Advice(1 + rng.IntN(6))
			require.NoError(t, s.MemAdvise(a.Addr(), size, advice, Device(rng.IntN(3)-1)))
		}
		got := a.Bytes()
		for i := range shadow {
			if got[i] != shadow[i] {
				t.Fatalf("iteration %d: byte %d is %d, want %d", it, i, got[i], shadow[i])
			}
		}
	}
}
