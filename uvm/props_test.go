package uvm

import (
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
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
			Name:                             "softuvm device " + strconv.Itoa(d) + " (" + info.Backend + ")",
			TotalGlobalMem:                   capacity,
			Major:                            6,
			Minor:                            0,
			ClockRate:                        machineClockKHz(t),
			MultiProcessorCount:              3,
			MaxLaunchThreads:                 1 << 30,
			MaxThreadsPerBlock:               1024,
			MaxThreadsDim:                    [3]int{1024, 1024, 64},
			MaxGridSize:                      [3]int{2147483647, 65535, 65535},
			SharedMemPerBlock:                48 << 10,
			SharedMemPerBlockOptin:           48 << 10,
			MaxThreadsPerMultiProcessor:      2048,
			MaxBlocksPerMultiProcessor:       32,
			SharedMemPerMultiprocessor:       32 * 48 << 10,
			WarpSize:                         1,
			RegsPerBlock:                     65536,
			RegsPerMultiprocessor:            65536,
			TotalConstMem:                    65536,
			MemPitch:                         2147483647,
			L2CacheSize:                      machineL2(t),
			AsyncEngineCount:                 2,
			ConcurrentKernels:                true,
			CooperativeLaunch:                true,
			CanMapHostMemory:                 true,
			UnifiedAddressing:                true,
			ManagedMemory:                    true,
			Integrated:                       true,
			ConcurrentManagedAccess:          true,
			HostNativeAtomicSupported:        true,
			ComputePreemptionSupported:       true,
			GlobalL1CacheSupported:           true,
			LocalL1CacheSupported:            true,
			HostRegisterSupported:            true,
			SingleToDoublePrecisionPerfRatio: 2,
			TexturePitchAlignment:            512,
			NUMANode:                         -1,
			HostNUMANode:                     0, // the first node: this machine has NUMA (node0), and the arenas are memfds
		}
		if info.Node >= 0 { // a NUMA arena on a machine with several nodes
			want.Name = "softuvm device " + strconv.Itoa(d) + " (" + info.Backend + ", node " + strconv.Itoa(info.Node) + ")"
			want.NUMANode, want.HostNUMANode = info.Node, info.Node
		}
		assert.Equal(t, want, p, "device %d", d)
		// Every attribute, its value written out here, not read from
		// the properties.
		for attr, v := range map[DeviceAttr]int64{
			AttrMaxThreadsPerBlock: 1024, AttrMaxBlockDimX: 1024, AttrMaxBlockDimY: 1024, AttrMaxBlockDimZ: 64,
			AttrMaxGridDimX: 1<<31 - 1, AttrMaxGridDimY: 65535, AttrMaxGridDimZ: 65535, AttrMaxSharedMemoryPerBlock: 49152,
			AttrTotalConstantMemory: 65536, AttrWarpSize: 1, AttrMaxPitch: 1<<31 - 1, AttrMaxRegistersPerBlock: 65536,
			AttrClockRate: int64(machineClockKHz(t)), AttrGpuOverlap: 1, AttrMultiProcessorCount: 3, AttrKernelExecTimeout: 0,
			AttrIntegrated: 1, AttrCanMapHostMemory: 1, AttrComputeMode: 0, AttrConcurrentKernels: 1, AttrEccEnabled: 0,
			AttrPciBusID: 0, AttrPciDeviceID: 0, AttrTccDriver: 0, AttrL2CacheSize: int64(machineL2(t)),
			AttrMaxThreadsPerMultiProcessor: 2048, AttrAsyncEngineCount: 2, AttrUnifiedAddressing: 1, AttrPciDomainID: 0,
			AttrTexturePitchAlignment: 512, AttrComputeCapabilityMajor: 6, AttrComputeCapabilityMinor: 0,
			AttrStreamPrioritiesSupported: 0, AttrGlobalL1CacheSupported: 1, AttrLocalL1CacheSupported: 1,
			AttrMaxSharedMemoryPerMultiprocessor: 1572864, AttrMaxRegistersPerMultiprocessor: 65536, AttrManagedMemory: 1,
			AttrIsMultiGpuBoard: 0, AttrMultiGpuBoardGroupID: 0, AttrHostNativeAtomicSupported: 1,
			AttrSingleToDoublePrecisionPerfRatio: 2, AttrPageableMemoryAccess: 0, AttrConcurrentManagedAccess: 1,
			AttrComputePreemptionSupported: 1, AttrCanUseHostPointerForRegisteredMem: 0, AttrCooperativeLaunch: 1,
			AttrCooperativeMultiDeviceLaunch: 0, AttrMaxSharedMemoryPerBlockOptin: 49152, AttrCanFlushRemoteWrites: 0,
			AttrHostRegisterSupported: 1, AttrPageableMemoryAccessUsesHostPageTables: 0, AttrDirectManagedMemAccessFromHost: 0,
			AttrMaxBlocksPerMultiprocessor: 32, AttrReservedSharedMemoryPerBlock: 0, AttrMemoryPoolsSupported: 0,
			AttrNumaConfig: b2i(info.Node >= 0), AttrNumaID: int64(info.Node), AttrHostNumaID: int64(want.HostNUMANode),
			AttrArenaCapacity: capacity,
		} {
			got, err := s.DeviceGetAttribute(attr, Device(d))
			require.NoError(t, err, "%v", attr)
			assert.Equal(t, v, got, "device %d: %v (%d)", d, attr, int(attr))
		}
	}
	for _, d := range []Device{2, CPU, -7} {
		_, err := s.GetDeviceProperties(d)
		require.ErrorIs(t, err, ErrInvalidDevice, "device %d", d)
		assert.Contains(t, err.Error(), "properties of "+d.String()+": want a device from 0 to 1")
	}
}

// machineClockKHz is this machine's CPU clock as DeviceProp gives it:
// its cpufreq maximum, else /proc/cpuinfo's first "cpu MHz" line.
func machineClockKHz(t *testing.T) int {
	if b, err := os.ReadFile("/sys/devices/system/cpu/cpu0/cpufreq/cpuinfo_max_freq"); err == nil {
		v, err := strconv.Atoi(strings.TrimSpace(string(b)))
		require.NoError(t, err)
		return v
	}
	b, err := os.ReadFile("/proc/cpuinfo")
	require.NoError(t, err)
	m := regexp.MustCompile(`(?m)^cpu MHz\s*:\s*([0-9.]+)$`).FindSubmatch(b)
	if m == nil {
		return 0
	}
	mhz, err := strconv.ParseFloat(string(m[1]), 64)
	require.NoError(t, err)
	return int(mhz * 1000)
}

// machineL2 is the CPU's unified L2 cache from sysfs, as `lscpu` finds it.
func machineL2(t *testing.T) int {
	out, err := exec.Command("sh", "-c", "for d in /sys/devices/system/cpu/cpu0/cache/index*; do if [ $(cat $d/level) = 2 ] && [ $(cat $d/type) = Unified ]; then cat $d/size; fi; done").Output()
	require.NoError(t, err)
	s := strings.TrimSpace(string(out))
	if s == "" {
		return 0
	}
	require.True(t, strings.HasSuffix(s, "K"), "L2 size %q", s)
	kb, err := strconv.Atoi(strings.TrimSuffix(s, "K"))
	require.NoError(t, err)
	return kb << 10
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
