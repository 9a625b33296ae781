package uvm

import (
	"encoding/binary"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/softuvm/softuvm/devmem"
)

// Kernels of the tests, registered as programs register theirs: in init.
func init() {
	// fill: params = address, length, value; thread t of n fills its share.
	MustRegisterKernel("fill", func(tid, n int, p []byte) {
		addr, length, v := paramRange(p)
		b := devmem.BytesAt(addr, length)
		lo, hi := int64(tid)*length/int64(n), int64(tid+1)*length/int64(n)
		for i := lo; i < hi; i++ {
			b[i] = v + byte(i>>12)
		}
	})
	// addOne: adds 1 to every byte of its share.
	MustRegisterKernel("addOne", func(tid, n int, p []byte) {
		addr, length, _ := paramRange(p)
		b := devmem.BytesAt(addr, length)
		lo, hi := int64(tid)*length/int64(n), int64(tid+1)*length/int64(n)
		for i := lo; i < hi; i++ {
			b[i]++
		}
	})
	MustRegisterKernel("nothing", func(tid, n int, p []byte) {})
	MustRegisterKernel("panics", func(tid, n int, p []byte) {
		if tid == n-1 {
			panic("kernel bug")
		}
	})
	// fillThenHang fills like fill, then spins until killed.
	MustRegisterKernel("fillThenHang", func(tid, n int, p []byte) {
		addr, length, v := paramRange(p)
		b := devmem.BytesAt(addr, length)
		for i := range b {
			b[i] = v + byte(i>>12)
		}
		for {
			time.Sleep(time.Millisecond)
		}
	})
}

func rangeParams(addr uintptr, length int64, v byte) []byte {
	p := make([]byte, 17)
	binary.LittleEndian.PutUint64(p, uint64(addr))
	binary.LittleEndian.PutUint64(p[8:], uint64(length))
	p[16] = v
	return p
}

func paramRange(p []byte) (uintptr, int64, byte) {
	return uintptr(binary.LittleEndian.Uint64(p)), int64(binary.LittleEndian.Uint64(p[8:])), p[16]
}

func wantFill(n int, v byte) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = v + byte(i>>12)
	}
	return b
}

// TestKernelFaultsAndMigrates: a kernel writes managed memory that was
// never touched (device first touch), then the host reads it (migrated
// back), then a kernel reads and changes host-resident data (migrated to
// the device), and the host sees the change.
func TestKernelFaultsAndMigrates(t *testing.T) {
	s := newSession(t, testServerConfig())
	const size = 4 << 20
	a, err := s.MallocManaged(size)
	require.NoError(t, err)
	require.NoError(t, s.Launch(0, nil, "fill", 4, rangeParams(a.Addr(), size, 3)))
	require.NoError(t, s.DeviceSynchronize(0))
	st, err := a.Stats()
	require.NoError(t, err)
	assert.Positive(t, st.FaultsBy(0).Missing, "the device faulted")
	assert.Equal(t, uint64(size/PageSize), st.PopulatedPages(0), "pages were created on the device")
	in, err := s.Info()
	require.NoError(t, err)
	assert.Equal(t, int64(size), in.Devices[0].UsedBytes)

	require.Equal(t, wantFill(size, 3), a.Bytes(), "the host reads what the kernel wrote")
	st, err = a.Stats()
	require.NoError(t, err)
	assert.Equal(t, uint64(size/PageSize), st.MigratedPages(0, CPU))
	assert.Positive(t, st.FaultsBy(CPU).Missing)

	require.NoError(t, s.Launch(0, nil, "addOne", 3, rangeParams(a.Addr(), size, 0)))
	require.NoError(t, s.DeviceSynchronize(0))
	st, err = a.Stats()
	require.NoError(t, err)
	assert.Equal(t, uint64(size/PageSize), st.MigratedPages(CPU, 0), "the kernel pulled the pages to the device")
	require.Equal(t, wantFill(size, 4), a.Bytes())
	require.NoError(t, a.Free())
}

func TestKernelErrorsComeBackFromSynchronize(t *testing.T) {
	s := newSession(t, testServerConfig())
	st, err := s.StreamCreate(0)
	require.NoError(t, err)
	require.NoError(t, s.Launch(0, st, "panics", 8, nil))
	err = s.StreamSynchronize(st)
	require.ErrorIs(t, err, ErrLaunchFailure)
	assert.Contains(t, err.Error(), `kernel "panics" panicked on device 0 in thread 7 of 8: kernel bug`)
	// Sticky, as a CUDA context's kernel fault: every synchronize of the
	// stream and the device reports it, and the device takes no launch,
	// until a reset.
	require.ErrorIs(t, s.StreamSynchronize(st), ErrLaunchFailure)
	require.ErrorIs(t, s.DeviceSynchronize(0), ErrLaunchFailure)
	require.ErrorIs(t, s.DefaultStreamSynchronize(0), ErrLaunchFailure)
	err = s.Launch(0, nil, "nothing", 1, nil)
	require.ErrorIs(t, err, ErrLaunchFailure)
	assert.Contains(t, err.Error(), "DeviceReset clears that")
	require.NoError(t, s.DeviceReset(0))
	require.NoError(t, s.Launch(0, nil, "nothing", 1, nil))
	require.NoError(t, s.DeviceSynchronize(0), "the device works again")
}

// TestDeviceProcessKilledMidKernel: a device process killed in the middle
// of a kernel loses none of the device's data, the death comes back from
// synchronize naming the kernel, and after a reset the next launch works.
func TestDeviceProcessKilledMidKernel(t *testing.T) {
	s := newSession(t, testServerConfig())
	const size = 1 << 20
	a, err := s.MallocManaged(size)
	require.NoError(t, err)
	require.NoError(t, s.Launch(0, nil, "fillThenHang", 1, rangeParams(a.Addr(), size, 9)))
	pid := s.DevicePID(0)
	require.NotZero(t, pid)
	// Wait until the kernel has written everything (the pages are on the
	// device), then kill the process.
	Eventually(t, 10*time.Second, func() bool {
		in, err := s.Info()
		return err == nil && in.Devices[0].UsedBytes == size
	}, "the kernel did not fill the range")
	time.Sleep(20 * time.Millisecond)
	require.NoError(t, killPID(pid))
	err = s.DeviceSynchronize(0)
	require.ErrorIs(t, err, ErrLaunchFailure)
	assert.Contains(t, err.Error(), `kernel "fillThenHang" (stream 0)`)
	assert.Contains(t, err.Error(), "killed")
	require.Equal(t, wantFill(size, 9), a.Bytes(), "the data lives in the device's file, not its process")

	require.ErrorIs(t, s.Launch(0, nil, "addOne", 2, rangeParams(a.Addr(), size, 0)), ErrLaunchFailure, "failed until a reset")
	require.NoError(t, s.DeviceReset(0))
	require.NoError(t, s.Launch(0, nil, "addOne", 2, rangeParams(a.Addr(), size, 0)))
	require.NoError(t, s.DeviceSynchronize(0))
	assert.NotEqual(t, pid, s.DevicePID(0), "a new process")
	require.Equal(t, wantFill(size, 10), a.Bytes())
}

// TestLaunchBadInput: every misuse of launches and streams is an error that
// names the value, never a crash.
func TestLaunchBadInput(t *testing.T) {
	s := newSession(t, twoDeviceConfig())
	st, err := s.StreamCreate(1)
	require.NoError(t, err)
	stale, err := s.StreamCreate(0)
	require.NoError(t, err)
	require.NoError(t, s.Launch(0, stale, "nothing", 1, nil))
	require.NoError(t, s.DeviceReset(0))
	for _, tc := range []struct {
		name string
		err  error
		is   error
		msg  string
	}{
		{"unknown device", s.Launch(2, nil, "nothing", 1, nil), ErrInvalidDevice, "device 2"},
		{"the CPU", s.Launch(CPU, nil, "nothing", 1, nil), ErrInvalidDevice, "cpu"},
		{"unregistered kernel", s.Launch(0, nil, "no-such-kernel", 1, nil), ErrInvalidValue, `"no-such-kernel"`},
		{"params too large", s.Launch(0, nil, "nothing", 1, make([]byte, MaxKernelParams+1)), ErrInvalidValue, "4097 bytes of parameters"},
		{"no threads", s.Launch(0, nil, "nothing", 0, nil), ErrInvalidValue, "0 threads"},
		{"stream of another device", s.Launch(0, st, "nothing", 1, nil), ErrInvalidValue, "stream 1 of device 1"},
		{"stream after reset", s.Launch(0, stale, "nothing", 1, nil), ErrInvalidValue, "destroyed (by StreamDestroy or DeviceReset)"},
		{"sync after reset", s.StreamSynchronize(stale), ErrInvalidValue, "destroyed"},
		{"sync nil stream", s.StreamSynchronize(nil), ErrInvalidValue, "DefaultStreamSynchronize"},
		{"destroy nil stream", s.StreamDestroy(nil), ErrInvalidValue, "default stream"},
		{"sync unknown device", s.DeviceSynchronize(5), ErrInvalidDevice, "device 5"},
		{"attribute of unknown device", second(s.DeviceGetAttribute(AttrWorkerCount, 9)), ErrInvalidDevice, "device 9"},
		{"unknown attribute", second(s.DeviceGetAttribute(DeviceAttr(36), 0)), ErrInvalidValue, "device attribute 36"},
		{"texture attribute", second(s.DeviceGetAttribute(DeviceAttr(21), 0)), ErrNotSupported, "no textures"},
	} {
		require.Error(t, tc.err, tc.name)
		assert.ErrorIs(t, tc.err, tc.is, tc.name)
		assert.Contains(t, tc.err.Error(), tc.msg, tc.name)
	}
	// The device works after its reset.
	require.NoError(t, s.Launch(0, nil, "nothing", 1, nil))
	require.NoError(t, s.DeviceSynchronize(0))
}

// TestDeviceAttributes reports what the configuration says.
func TestDeviceAttributes(t *testing.T) {
	s := newSession(t, twoDeviceConfig())
	assert.Equal(t, 2, s.DeviceCount())
	for attr, want := range map[DeviceAttr]int64{
		AttrArenaCapacity: 64 << 20, AttrConcurrentManagedAccess: 1, AttrCanMapHostMemory: 1,
		AttrPageableMemoryAccess: 0, AttrWorkerCount: 2,
	} {
		got, err := s.DeviceGetAttribute(attr, 1)
		require.NoError(t, err, "%v", attr)
		assert.Equal(t, want, got, "%v", attr)
	}
}

// TestStreamsOrderAndPrefetchBetweenDevices: work on one stream runs in
// order, prefetches on a stream wait for the kernels before them, and a
// prefetch moves pages from one device to another.
func TestStreamsOrderAndPrefetchBetweenDevices(t *testing.T) {
	s := newSession(t, twoDeviceConfig())
	const size = 1 << 20
	a, err := s.MallocManaged(size)
	require.NoError(t, err)
	st, err := s.StreamCreate(0)
	require.NoError(t, err)
	require.NoError(t, s.Launch(0, st, "fill", 2, rangeParams(a.Addr(), size, 1)))
	for range 5 {
		require.NoError(t, s.Launch(0, st, "addOne", 2, rangeParams(a.Addr(), size, 0)))
	}
	require.NoError(t, s.PrefetchAsync(a.Addr(), size, 1, st), "after the kernels")
	require.NoError(t, s.StreamSynchronize(st), "the prefetch is queued: it is done once the stream is")
	st1 := stats(t, a)
	assert.Equal(t, uint64(size/PageSize), st1.MigratedPages(0, 1), "device 0 to device 1")
	pa, err := s.RangeAttribute(a.Addr(), size, AttrLastPrefetchLocation)
	require.NoError(t, err)
	assert.Equal(t, Device(1), pa)
	sameBytes(t, wantFill(size, 6), a.Bytes(), "fill then five increments, in order")
	require.NoError(t, s.StreamDestroy(st))
}
