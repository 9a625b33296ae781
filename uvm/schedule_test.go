package uvm

import (
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestDeviceFlags: the flags are kept and checked as cudaSetDeviceFlags
// checks them.
func TestDeviceFlags(t *testing.T) {
	s := newSession(t, twoDeviceConfig())
	got, err := s.GetDeviceFlags()
	require.NoError(t, err)
	assert.Equal(t, uint32(DeviceScheduleAuto|DeviceMapHost), got, "auto, and host memory always mapped")
	for _, f := range []uint32{DeviceScheduleSpin, DeviceScheduleYield | DeviceMapHost, DeviceScheduleBlockingSync | DeviceLmemResizeToMax, DeviceScheduleAuto} {
		require.NoError(t, s.SetDeviceFlags(f), "%#x", f)
		got, err := s.GetDeviceFlags()
		require.NoError(t, err)
		assert.Equal(t, f|DeviceMapHost, got)
		assert.Equal(t, f, s.deviceProc(1).flags.Load(), "every device has them")
	}
	for _, tc := range []struct {
		flags uint32
		msg   string
	}{
		{DeviceScheduleSpin | DeviceScheduleYield, "DeviceScheduleSpin and DeviceScheduleYield: want at most one schedule flag"},
		{DeviceScheduleYield | DeviceScheduleBlockingSync, "DeviceScheduleYield and DeviceScheduleBlockingSync"},
		{0x20, "unknown bits 0x20"},
		{DeviceScheduleSpin | 0x100, "unknown bits 0x100"},
	} {
		err := s.SetDeviceFlags(tc.flags)
		require.ErrorIs(t, err, ErrInvalidValue, "%#x", tc.flags)
		assert.Contains(t, err.Error(), tc.msg)
	}
	got, err = s.GetDeviceFlags()
	require.NoError(t, err)
	assert.Equal(t, uint32(DeviceScheduleAuto|DeviceMapHost), got, "a refused call changes nothing")
}

// TestScheduleModesSynchronize: under each schedule flag, synchronizes
// of streams, devices and events wait for the work and see its results.
func TestScheduleModesSynchronize(t *testing.T) {
	s := newSession(t, testServerConfig())
	const size = 64 << 10
	m, err := s.MallocManaged(size)
	require.NoError(t, err)
	st, err := s.StreamCreate(0)
	require.NoError(t, err)
	ev, err := s.EventCreate(0)
	require.NoError(t, err)
	v := byte(0)
	for _, flags := range []uint32{DeviceScheduleSpin, DeviceScheduleYield, DeviceScheduleBlockingSync, DeviceScheduleAuto} {
		require.NoError(t, s.SetDeviceFlags(flags))
		for i := range 20 {
			v++
			require.NoError(t, s.Launch(0, nil, "fill", 2, rangeParams(m.Addr(), size, v)))
			require.NoError(t, s.DefaultStreamSynchronize(0))
			sameBytes(t, wantFill(size, v), m.Bytes(), "the default stream's kernel ran")
			require.NoError(t, s.Launch(0, st, "addOne", 1, rangeParams(m.Addr(), size, 0)))
			v++
			switch i % 3 {
			case 0:
				require.NoError(t, s.StreamSynchronize(st))
			case 1:
				require.NoError(t, s.DeviceSynchronize(0))
			case 2:
				require.NoError(t, s.EventRecord(ev, st))
				require.NoError(t, s.EventSynchronize(ev))
				require.NoError(t, s.StreamSynchronize(st))
			}
			sameBytes(t, wantFill(size, v), m.Bytes(), "the stream's kernel ran")
		}
		// A synchronize waits for a long kernel.
		t0 := time.Now()
		require.NoError(t, s.Launch(0, st, "st-sleep", 1, sleepParams(5*time.Millisecond)))
		require.NoError(t, s.StreamSynchronize(st))
		assert.GreaterOrEqual(t, time.Since(t0), 5*time.Millisecond, "flags %#x", flags)
	}
	require.NoError(t, s.SetDeviceFlags(DeviceScheduleSpin))
	assert.Equal(t, waitSpin, s.deviceProc(0).waitMode())
	require.NoError(t, s.SetDeviceFlags(DeviceScheduleYield))
	assert.Equal(t, waitYield, s.deviceProc(0).waitMode())
	require.NoError(t, s.SetDeviceFlags(DeviceScheduleBlockingSync))
	assert.Equal(t, waitBlock, s.deviceProc(0).waitMode())
}

// TestAsyncMisuse: every misuse of the stream-ordered operations is an
// error that names what is wrong, returned at once.
func TestAsyncMisuse(t *testing.T) {
	s := newSession(t, twoDeviceConfig())
	other := newSession(t, testServerConfig())
	foreign, err := other.StreamCreate(0)
	require.NoError(t, err)
	st, err := s.StreamCreate(0)
	require.NoError(t, err)
	stale, err := s.StreamCreate(1)
	require.NoError(t, err)
	require.NoError(t, s.StreamDestroy(stale))
	m, err := s.MallocManaged(64 << 10)
	require.NoError(t, err)
	d, err := s.Malloc(0, 64<<10)
	require.NoError(t, err)
	d1, err := s.Malloc(1, 64<<10)
	require.NoError(t, err)
	host := make([]byte, 64<<10)
	hp := addrOf(host)
	for _, tc := range []struct {
		name string
		err  error
		is   error
		msg  string
	}{
		{"prefetch to no device", s.PrefetchAsync(m.Addr(), 4096, 7, st), ErrInvalidDevice, "prefetch to device 7"},
		{"prefetch of unmanaged memory", s.PrefetchAsync(hp, 4096, 0, st), ErrInvalidValue, "is not managed memory"},
		{"prefetch past the end", s.PrefetchAsync(m.Addr(), 1<<20, 0, st), ErrInvalidValue, "runs past the end"},
		{"prefetch to the CPU on a nil stream", s.PrefetchAsync(m.Addr(), 4096, CPU, nil), ErrInvalidValue, "to the CPU on a nil stream"},
		{"prefetch on a foreign stream", s.PrefetchAsync(m.Addr(), 4096, 0, foreign), ErrInvalidValue, "belongs to another session"},
		{"prefetch on a destroyed stream", s.PrefetchAsync(m.Addr(), 4096, 0, stale), ErrInvalidValue, "destroyed"},
		{"memcpy of a negative size", s.MemcpyAsync(m.Addr(), hp, -1, MemcpyDefault, st), ErrInvalidValue, "memcpy of -1 bytes"},
		{"memcpy kind", s.MemcpyAsync(m.Addr(), hp, 8, MemcpyKind(9), st), ErrInvalidValue, "memcpy kind 9"},
		{"memcpy of the wrong kind", s.MemcpyAsync(d.Addr(), hp, 8, MemcpyDeviceToHost, st), ErrInvalidValue, "which is not reachable from a device"},
		{"memcpy overlapping", s.MemcpyAsync(m.Addr()+8, m.Addr(), 64, MemcpyDefault, st), ErrInvalidValue, "overlap"},
		{"memcpy of host memory on a nil stream", s.MemcpyAsync(m.Addr(), hp, 64, MemcpyDefault, nil), ErrInvalidValue, "touches no device memory"},
		{"memcpy between devices on a nil stream", s.MemcpyAsync(d.Addr(), d1.Addr(), 64, MemcpyDefault, nil), ErrInvalidValue, "device memory of device 0 and of device 1"},
		{"memcpy on a foreign stream", s.MemcpyAsync(m.Addr(), hp, 64, MemcpyDefault, foreign), ErrInvalidValue, "belongs to another session"},
		{"empty memcpy on a foreign stream", s.MemcpyAsync(m.Addr(), hp, 0, MemcpyDefault, foreign), ErrInvalidValue, "belongs to another session"},
		{"memset of a negative size", s.MemsetAsync(m.Addr(), 1, -4, st), ErrInvalidValue, "memset of -4 bytes"},
		{"memset of managed memory on a nil stream", s.MemsetAsync(m.Addr(), 1, 4, nil), ErrInvalidValue, "nil stream"},
		{"memset past the end", s.MemsetAsync(d.Addr(), 1, 1<<20, nil), ErrInvalidValue, "runs past the end"},
		{"memset on a stale stream", s.MemsetAsync(d.Addr(), 1, 4, stale), ErrInvalidValue, "destroyed"},
		{"peer copy to no device", s.MemcpyPeerAsync(d1.Addr(), 5, d.Addr(), 0, 8, st), ErrInvalidDevice, "device 5"},
		{"peer copy on a foreign stream", s.MemcpyPeerAsync(d1.Addr(), 1, d.Addr(), 0, 8, foreign), ErrInvalidValue, "belongs to another session"},
		{"default stream of no device", s.MemsetAsync(d.Addr(), 1, 4, s.DefaultStream(9)), ErrInvalidDevice, "device 9"},
		{"destroy a default stream", s.StreamDestroy(s.DefaultStream(0)), ErrInvalidValue, "default stream cannot be destroyed"},
		{"synchronize a nil stream", s.StreamSynchronize(nil), ErrInvalidValue, "DefaultStream"},
	} {
		require.Error(t, tc.err, tc.name)
		assert.ErrorIs(t, tc.err, tc.is, tc.name)
		assert.Contains(t, tc.err.Error(), tc.msg, tc.name)
	}
	// None of them queued anything.
	require.NoError(t, s.DeviceSynchronize(0))
	require.NoError(t, s.DeviceSynchronize(1))
	require.NoError(t, s.StreamSynchronize(s.DefaultStream(1)), "a default stream's handle synchronizes")
	require.NoError(t, s.Launch(1, s.DefaultStream(1), "nothing", 1, nil), "and takes launches")
	require.ErrorIs(t, s.Launch(0, s.DefaultStream(1), "nothing", 1, nil), ErrInvalidValue, "on its own device only")
	require.NoError(t, s.DefaultStreamSynchronize(1))
}

// addrOf is the address of b's first byte.
func addrOf(b []byte) uintptr { return uintptr(unsafe.Pointer(&b[0])) }
