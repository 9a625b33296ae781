package uvm

import (
	"strconv"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/softuvm/softuvm/internal/wire"
)

// readDevice copies n bytes of device memory at p to the host.
func readDevice(t *testing.T, s *Session, p uintptr, n int64) []byte {
	t.Helper()
	got := make([]byte, n)
	require.NoError(t, s.Memcpy(addr(got), p, n, MemcpyDeviceToHost))
	return got
}

// launchFails launches addOne over [p, p+n) on device d and checks that
// the next synchronize reports the kernel's fault; it then resets the
// device, which stays failed until then.
func launchFails(t *testing.T, s *Session, d Device, p uintptr, n int64, why string) {
	t.Helper()
	require.NoError(t, s.Launch(d, nil, "addOne", 2, rangeParams(p, n, 0)), why)
	err := s.DeviceSynchronize(d)
	require.Error(t, err, why)
	assert.ErrorIs(t, err, ErrLaunchFailure, why)
	assert.Contains(t, err.Error(), `kernel "addOne" panicked on device `+strconv.Itoa(int(d)), why)
	require.NoError(t, s.DeviceReset(d), why)
}

// launchWorks launches addOne over [p, p+n) on device d and waits.
func launchWorks(t *testing.T, s *Session, d Device, p uintptr, n int64, why string) {
	t.Helper()
	require.NoError(t, s.Launch(d, nil, "addOne", 2, rangeParams(p, n, 0)), why)
	require.NoError(t, s.DeviceSynchronize(d), why)
}

// TestPeerAccess: a kernel reaches another device's device memory only
// while its device has peer access to that device: before, the touch
// faults and the synchronize says so, and nothing changes; after, the
// memory is mapped in the device's process, whether allocated before or
// after, in a running process and in a new one; access is one way; and
// disabling takes it away again. Managed memory needs none.
func TestPeerAccess(t *testing.T) {
	s := newSession(t, twoDeviceConfig())
	const size = 256 << 10
	for _, tc := range []struct {
		d, peer Device
		want    bool
	}{{0, 1, true}, {1, 0, true}, {0, 0, false}, {1, 1, false}} {
		can, err := s.DeviceCanAccessPeer(tc.d, tc.peer)
		require.NoError(t, err)
		assert.Equal(t, tc.want, can, "can device %d access device %d", tc.d, tc.peer)
	}

	d0, err := s.Malloc(0, size)
	require.NoError(t, err)
	src := pattern(size, 5)
	require.NoError(t, s.Memcpy(d0.Addr(), addr(src), size, MemcpyHostToDevice))

	launchFails(t, s, 1, d0.Addr(), size, "device 1 without peer access to device 0")
	sameBytes(t, src, readDevice(t, s, d0.Addr(), size), "the refused kernel changed nothing")
	assert.Zero(t, stats(t, d0).RemoteMappedPages(1), "device 1 does not map device 0's memory")
	launchWorks(t, s, 0, d0.Addr(), size, "device 0 reaches its own memory")
	sameBytes(t, plus(src, 1), readDevice(t, s, d0.Addr(), size), "device 0's kernel")

	// Enabled while device 1's process runs: mapped now, and an
	// allocation made afterwards is mapped as it is made.
	require.NoError(t, s.DeviceEnablePeerAccess(1, 0, 0))
	err = s.DeviceEnablePeerAccess(1, 0, 0)
	require.ErrorIs(t, err, ErrPeerAccessAlreadyEnabled)
	assert.NotErrorIs(t, err, ErrInvalidValue, "a class of its own")
	assert.Contains(t, err.Error(), "device 1's access to device 0's memory is enabled already")
	later, err := s.Malloc(0, size)
	require.NoError(t, err)
	laterSrc := pattern(size, 9)
	require.NoError(t, s.Memcpy(later.Addr(), addr(laterSrc), size, MemcpyHostToDevice))
	launchWorks(t, s, 1, d0.Addr(), size, "device 1 with peer access")
	launchWorks(t, s, 1, later.Addr(), size, "device 1 with peer access, memory allocated after")
	sameBytes(t, plus(src, 2), readDevice(t, s, d0.Addr(), size), "device 1's kernel wrote device 0's memory")
	sameBytes(t, plus(laterSrc, 1), readDevice(t, s, later.Addr(), size), "and the later allocation")
	for _, a := range []*Allocation{d0, later} {
		st := stats(t, a)
		assert.Equal(t, uint64(size/PageSize), st.RemoteMappedPages(1), "device 1 maps device 0's memory remotely")
		assert.Zero(t, st.FaultsBy(1).Total(), "and takes no fault on it")
		assert.Empty(t, st.Migrations, "device memory never moves")
	}

	// One way: device 0 gains nothing on device 1's memory.
	d1, err := s.Malloc(1, size)
	require.NoError(t, err)
	d1Src := pattern(size, 3)
	require.NoError(t, s.Memcpy(d1.Addr(), addr(d1Src), size, MemcpyHostToDevice))
	launchFails(t, s, 0, d1.Addr(), size, "device 0 without access to device 1")
	sameBytes(t, d1Src, readDevice(t, s, d1.Addr(), size), "device 1's memory unchanged")

	// A new process of device 1 maps what the table says.
	require.NoError(t, s.DeviceReset(1))
	launchWorks(t, s, 1, d0.Addr(), size, "a new process of device 1, peer access enabled")
	sameBytes(t, plus(src, 3), readDevice(t, s, d0.Addr(), size), "device 1's new process")

	// Disabled: refused again, in the running process and in a new one.
	require.NoError(t, s.DeviceDisablePeerAccess(1, 0))
	err = s.DeviceDisablePeerAccess(1, 0)
	require.ErrorIs(t, err, ErrPeerAccessNotEnabled)
	assert.Contains(t, err.Error(), "device 1's access to device 0's memory is not enabled")
	launchFails(t, s, 1, later.Addr(), size, "device 1 after disabling")
	require.NoError(t, s.DeviceReset(1))
	launchFails(t, s, 1, d0.Addr(), size, "a new process of device 1 after disabling")
	sameBytes(t, plus(laterSrc, 1), readDevice(t, s, later.Addr(), size), "refused kernels changed nothing")
	sameBytes(t, plus(src, 3), readDevice(t, s, d0.Addr(), size), "refused kernels changed nothing")

	// Managed memory needs no peer access: it migrates.
	m, err := s.MallocManaged(size)
	require.NoError(t, err)
	fill(m.Bytes(), 7)
	launchWorks(t, s, 1, m.Addr(), size, "managed memory on device 1")
	launchWorks(t, s, 0, m.Addr(), size, "managed memory on device 0")
	sameBytes(t, plus(pattern(size, 7), 2), m.Bytes(), "both devices' kernels")

	for _, a := range []*Allocation{d0, later, d1, m} {
		require.NoError(t, a.Free())
	}
}

// TestPeerAccessMisuse: bad devices, a device and itself, and flags are
// refused with the class CUDA uses and a message naming the value, by the
// client and, for a client that does not check, by the server.
func TestPeerAccessMisuse(t *testing.T) {
	s := newSession(t, twoDeviceConfig())
	for _, tc := range []struct {
		name string
		err  error
		want error
		msg  string
	}{
		{"enable of a device and itself", s.DeviceEnablePeerAccess(0, 0, 0), ErrInvalidDevice, "peer access of device 0 to itself"},
		{"enable of a bad device", s.DeviceEnablePeerAccess(2, 0, 0), ErrInvalidDevice, "enable peer access of device 2: want a device from 0 to 1"},
		{"enable of a bad peer", s.DeviceEnablePeerAccess(0, 5, 0), ErrInvalidDevice, "enable peer access to device 5"},
		{"enable of the CPU", s.DeviceEnablePeerAccess(CPU, 0, 0), ErrInvalidDevice, "enable peer access of cpu"},
		{"enable with flags", s.DeviceEnablePeerAccess(1, 0, 1), ErrInvalidValue, "with flags 0x1: want 0"},
		{"disable of a device and itself", s.DeviceDisablePeerAccess(1, 1), ErrInvalidDevice, "peer access of device 1 to itself"},
		{"disable of a bad peer", s.DeviceDisablePeerAccess(0, 3), ErrInvalidDevice, "disable peer access to device 3"},
		{"disable of what is not enabled", s.DeviceDisablePeerAccess(0, 1), ErrPeerAccessNotEnabled, "device 0's access to device 1's memory is not enabled"},
		{"can access of a bad device", func() error { _, err := s.DeviceCanAccessPeer(2, 0); return err }(), ErrInvalidDevice, "peer access of device 2"},
		{"can access of the CPU", func() error { _, err := s.DeviceCanAccessPeer(0, CPU); return err }(), ErrInvalidDevice, "peer access to cpu"},
	} {
		require.Error(t, tc.err, tc.name)
		assert.ErrorIs(t, tc.err, tc.want, tc.name)
		assert.Contains(t, tc.err.Error(), tc.msg, tc.name)
	}

	// The server checks for itself.
	raw := func(req wire.PeerAccessRequest) error {
		r, err := s.rpc.Request(wire.EncodePeerAccess(s.rpc.NextSeq(), req), wire.MsgPeerAccess)
		if err != nil {
			return err
		}
		_, err = wire.DecodePeerAccessReply(r)
		return err
	}
	for _, tc := range []struct {
		name string
		req  wire.PeerAccessRequest
		want error
		msg  string
	}{
		{"itself", wire.PeerAccessRequest{Device: 1, Peer: 1, Enable: true}, ErrInvalidDevice, "peer access of device 1 to itself"},
		{"a device the server lacks", wire.PeerAccessRequest{Device: 4, Peer: 0, Enable: true}, ErrInvalidDevice, "peer access of device 4: this server has devices 0 to 1"},
		{"a peer the server lacks", wire.PeerAccessRequest{Device: 0, Peer: 30}, ErrInvalidDevice, "peer access to device 30"},
		{"flags", wire.PeerAccessRequest{Device: 0, Peer: 1, Enable: true, Flags: 2}, ErrInvalidValue, "peer access flags 0x2: want 0"},
	} {
		err := raw(tc.req)
		require.Error(t, err, tc.name)
		assert.ErrorIs(t, err, tc.want, tc.name)
		assert.Contains(t, err.Error(), tc.msg, tc.name)
	}
	// A refused request changed nothing.
	require.ErrorIs(t, s.DeviceDisablePeerAccess(0, 1), ErrPeerAccessNotEnabled)
}
