package uvm

import (
	"strconv"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/softuvm/softuvm/internal/config"
)

// TestGetDeviceProperties: each device's properties are what the server
// was configured with, and agree with DeviceGetAttribute.
func TestGetDeviceProperties(t *testing.T) {
	cfg := DefaultServerConfig()
	cfg.Devices = config.DeviceSpecs(2, []int64{48 << 20, 80 << 20}, cfg.Devices[0].Backend)
	cfg.DeviceWorkers = 3
	s := newSession(t, cfg)
	for d, capacity := range []int64{48 << 20, 80 << 20} {
		p, err := s.GetDeviceProperties(Device(d))
		require.NoError(t, err)
		info := s.Devices()[d]
		want := DeviceProp{
			Name:                    "softuvm device " + strconv.Itoa(d) + " (" + info.Backend + ")",
			TotalGlobalMem:          capacity,
			MultiProcessorCount:     3,
			MaxLaunchThreads:        1 << 30,
			ConcurrentKernels:       true,
			CanMapHostMemory:        true,
			UnifiedAddressing:       true,
			ManagedMemory:           true,
			ConcurrentManagedAccess: true,
			TexturePitchAlignment:   512,
			NUMANode:                -1,
		}
		if info.Node >= 0 { // a NUMA arena on a machine with several nodes
			want.Name = "softuvm device " + strconv.Itoa(d) + " (" + info.Backend + ", node " + strconv.Itoa(info.Node) + ")"
			want.NUMANode = info.Node
		}
		assert.Equal(t, want, p, "device %d", d)
		for attr, v := range map[DeviceAttr]int64{AttrArenaCapacity: p.TotalGlobalMem, AttrWorkerCount: int64(p.MultiProcessorCount),
			AttrConcurrentManagedAccess: b2i(p.ConcurrentManagedAccess), AttrCanMapHostMemory: b2i(p.CanMapHostMemory), AttrPageableMemoryAccess: b2i(p.PageableMemoryAccess)} {
			got, err := s.DeviceGetAttribute(attr, Device(d))
			require.NoError(t, err)
			assert.Equal(t, got, v, "device %d: %v", d, attr)
		}
	}
	for _, d := range []Device{2, CPU, -7} {
		_, err := s.GetDeviceProperties(d)
		require.ErrorIs(t, err, ErrInvalidDevice, "device %d", d)
		assert.Contains(t, err.Error(), "properties of "+d.String()+": want a device from 0 to 1")
	}
}

func b2i(b bool) int64 {
	if b {
		return 1
	}
	return 0
}

// TestMemGetInfo: a device's total memory is its arena's capacity, and
// its free memory drops by what device memory and managed pages resident
// there take, and comes back when they go.
func TestMemGetInfo(t *testing.T) {
	s := newSession(t, twoDeviceConfig()) // two 64 MiB devices
	const capacity = 64 << 20
	free0, total, err := s.MemGetInfo(1)
	require.NoError(t, err)
	assert.Equal(t, int64(capacity), total)
	assert.Equal(t, int64(capacity), free0, "nothing on device 1 yet")

	const size = 3<<20 + 5 // device memory takes whole pages
	d, err := s.Malloc(1, size)
	require.NoError(t, err)
	free1, total1, err := s.MemGetInfo(1)
	require.NoError(t, err)
	assert.Equal(t, int64(capacity), total1)
	assert.GreaterOrEqual(t, free0-free1, int64(size), "free drops by at least the allocation")
	assert.Equal(t, int64(capacity-(3<<20+PageSize)), free1, "by its pages exactly")
	other, _, err := s.MemGetInfo(0)
	require.NoError(t, err)
	assert.Equal(t, int64(capacity), other, "device 0 is untouched")

	const managed = 2 << 20
	m, err := s.MallocManaged(managed)
	require.NoError(t, err)
	fill(m.Bytes(), 1)
	require.NoError(t, m.Prefetch(1))
	free2, _, err := s.MemGetInfo(1)
	require.NoError(t, err)
	assert.Equal(t, free1-managed, free2, "managed pages resident on the device take room too")

	require.NoError(t, m.Prefetch(CPU))
	require.NoError(t, d.Free())
	free3, _, err := s.MemGetInfo(1)
	require.NoError(t, err)
	assert.Equal(t, int64(capacity), free3, "all back")
	require.NoError(t, m.Free())

	for _, d := range []Device{2, CPU} {
		_, _, err := s.MemGetInfo(d)
		require.ErrorIs(t, err, ErrInvalidDevice)
		assert.Contains(t, err.Error(), "memory information of "+d.String())
	}
}
