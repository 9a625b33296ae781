package uvm

import (
	"fmt"
	"strconv"

	"github.com/softuvm/softuvm/internal/core"
	"github.com/softuvm/softuvm/internal/wire"
)

// DeviceProp describes one device, after cudaDeviceProp: the properties
// that mean something for a device that is a process on the host's CPUs,
// under cudaDeviceProp's names, each with the value DeviceGetAttribute
// gives its attribute. Where a figure is a GPU's limit that a CPU does not
// have (registers, constant memory), it is CUDA's, so that a program that
// checks it against what it needs passes, and it says so.
type DeviceProp struct {
	// Name says which device it is and what its memory is made of:
	// "softuvm device 1 (memfd)", or with the NUMA node of a NUMA arena,
	// "softuvm device 1 (numa, node 0)".
	Name string
	// TotalGlobalMem is the device's memory in bytes: its arena's
	// capacity, which device memory and the managed pages resident on
	// the device share (MemGetInfo says how much is free).
	TotalGlobalMem int64
	// Major and Minor are the compute capability, 6.0: the feature level
	// emulated (Pascal's: managed memory migrated on demand, concurrent
	// managed access, cooperative launches, block barriers and shared
	// memory), less warp intrinsics and textures, which a CPU device does
	// not emulate, and without Volta's independent thread scheduling (a
	// thread spinning on another thread of its block never lets it run).
	Major, Minor int
	// ClockRate is the CPU's clock in kHz: its maximum where the kernel
	// says (cpufreq), else what /proc/cpuinfo says now, else 0.
	ClockRate int
	// MultiProcessorCount is the number of worker threads that run the
	// device's kernels: a launch's threads, or a grid's blocks, are
	// spread over them (AttrMultiProcessorCount).
	MultiProcessorCount int
	// MaxLaunchThreads is the most threads one Launch may have.
	MaxLaunchThreads int
	// The limits of a grid launch (LaunchGrid), CUDA's at 6.0: threads in
	// a block, in each dimension of a block, blocks in each dimension of
	// a grid, shared memory of a block (the opt-in bound is the same:
	// there is nothing to opt into).
	MaxThreadsPerBlock     int
	MaxThreadsDim          [3]int
	MaxGridSize            [3]int
	SharedMemPerBlock      int64
	SharedMemPerBlockOptin int64
	// MaxThreadsPerMultiProcessor (2048) and MaxBlocksPerMultiProcessor
	// (32) bound the blocks a worker keeps resident at once, which is
	// what a cooperative launch needs (OccupancyMaxActiveBlocksPerMultiprocessor);
	// SharedMemPerMultiprocessor is 32 times SharedMemPerBlock, so that
	// shared memory is never the tighter bound.
	MaxThreadsPerMultiProcessor int
	MaxBlocksPerMultiProcessor  int
	SharedMemPerMultiprocessor  int64
	// WarpSize is 1: no two threads of a block run in lock step
	// (core.WarpSize says why).
	WarpSize int
	// RegsPerBlock and RegsPerMultiprocessor are CUDA's 65536: registers
	// limit nothing on a CPU.
	RegsPerBlock, RegsPerMultiprocessor int
	// TotalConstMem is CUDA's 64 KiB: __constant__ variables are managed
	// memory here (uvm_cuda.h), limited only by the host's memory.
	TotalConstMem int64
	// MemPitch is the largest pitch of a 2D copy, CUDA's 2^31-1.
	MemPitch int64
	// L2CacheSize is the CPU's unified level-2 cache, in bytes (0 where
	// sysfs does not say).
	L2CacheSize int
	// AsyncEngineCount is 2: copies in both directions run at the same
	// time as each other and as kernels (each on its stream's thread).
	AsyncEngineCount int
	// ComputeMode is 0 (cudaComputeModeDefault): any number of programs
	// may use the device (a daemon's devices are shared by its clients,
	// each with its own device processes).
	ComputeMode int
	// ConcurrentKernels is true: kernels of different streams of a
	// device may run at the same time.
	ConcurrentKernels bool
	// CooperativeLaunch is true: LaunchConfig.Cooperative keeps every
	// block resident, and Thread.SyncGrid waits for the whole grid.
	CooperativeLaunch bool
	// CanMapHostMemory is true: kernels reach pinned host memory
	// (HostAlloc, HostRegister) where it is, without a copy.
	CanMapHostMemory bool
	// UnifiedAddressing is true: one address means the same memory in
	// the host and in every device, for every kind of memory.
	UnifiedAddressing bool
	// ManagedMemory is true: MallocManaged memory is reachable from the
	// host and every device.
	ManagedMemory bool
	// Integrated is true: the device's memory is the host's (its arena
	// is host memory), as an integrated GPU's is.
	Integrated bool
	// ConcurrentManagedAccess says whether the host and devices may
	// touch managed memory at the same time, pages migrating on demand
	// (cudaDevAttrConcurrentManagedAccess). When false, the host must not
	// touch managed memory a kernel may use until a synchronize.
	ConcurrentManagedAccess bool
	// PageableMemoryAccess is false: kernels reach memory of this
	// runtime, not the program's ordinary (pageable) memory.
	PageableMemoryAccess bool
	// PageableMemoryAccessUsesHostPageTables is false: a device process
	// has page tables of its own (that is why a device is a process), and
	// reaches no pageable memory at all.
	PageableMemoryAccessUsesHostPageTables bool
	// CanUseHostPointerForRegisteredMem is false: kernels reach memory
	// registered with HostRegister at the address HostGetDevicePointer
	// gives, not at the program's own address.
	CanUseHostPointerForRegisteredMem bool
	// DirectManagedMemAccessFromHost is false: the host touching managed
	// memory resident on a device migrates it, it does not read it
	// there.
	DirectManagedMemAccessFromHost bool
	// HostNativeAtomicSupported is true: an atomic operation of the host
	// and one of a kernel on the same managed word are the CPU's own
	// atomics on one page (a page is in one place at a time, or mapped
	// where it is).
	HostNativeAtomicSupported bool
	// ComputePreemptionSupported is true: kernels are threads the
	// operating system preempts.
	ComputePreemptionSupported bool
	// GlobalL1CacheSupported and LocalL1CacheSupported are true: the
	// CPU's caches hold both.
	GlobalL1CacheSupported, LocalL1CacheSupported bool
	// HostRegisterSupported is true (HostRegister).
	HostRegisterSupported bool
	// KernelExecTimeoutEnabled, ECCEnabled, StreamPrioritiesSupported and
	// MemoryPoolsSupported are false: no watchdog ends a kernel, memory
	// errors are the host's business, streams have no priorities, and
	// there is no MallocAsync.
	KernelExecTimeoutEnabled, ECCEnabled, StreamPrioritiesSupported, MemoryPoolsSupported bool
	// SingleToDoublePrecisionPerfRatio is 2: a CPU's vector units hold
	// half as many doubles as floats.
	SingleToDoublePrecisionPerfRatio int
	// TexturePitchAlignment is the alignment of MallocPitch's pitch, in
	// bytes: 512, as CUDA's texturePitchAlignment on most GPUs.
	TexturePitchAlignment int64
	// NUMANode is the host NUMA node the device's memory is bound to, or
	// -1 where it is not bound to one (cudaDevAttrNumaId).
	NUMANode int
	// HostNUMANode is the host NUMA node nearest the device: its memory's
	// node if bound, else the first node of the machine, -1 without NUMA
	// (cudaDevAttrHostNumaId, for a prefetch to LocationHostNUMA).
	HostNUMANode int
}

// GetDeviceProperties describes device d, as cudaGetDeviceProperties.
func (s *Session) GetDeviceProperties(d Device) (DeviceProp, error) {
	if err := s.checkDevice(d, "properties of"); err != nil {
		return DeviceProp{}, err
	}
	info := s.devices[d]
	name := fmt.Sprintf("softuvm device %d (%s)", d, info.Backend)
	if info.Node >= 0 {
		name = fmt.Sprintf("softuvm device %d (%s, node %d)", d, info.Backend, info.Node)
	}
	host := info.Node
	if host < 0 {
		host = firstNUMANode()
	}
	return DeviceProp{
		Name:                                   name,
		TotalGlobalMem:                         info.Capacity,
		Major:                                  core.ComputeCapabilityMajor,
		Minor:                                  core.ComputeCapabilityMinor,
		ClockRate:                              cpuClockKHz(),
		MultiProcessorCount:                    info.Workers,
		MaxLaunchThreads:                       wire.MaxLaunchThreads,
		MaxThreadsPerBlock:                     core.MaxThreadsPerBlock,
		MaxThreadsDim:                          [3]int{core.MaxBlockDimX, core.MaxBlockDimY, core.MaxBlockDimZ},
		MaxGridSize:                            [3]int{core.MaxGridDimX, core.MaxGridDimY, core.MaxGridDimZ},
		SharedMemPerBlock:                      core.MaxSharedMemoryPerBlock,
		SharedMemPerBlockOptin:                 core.MaxSharedMemoryPerBlock,
		MaxThreadsPerMultiProcessor:            core.MaxThreadsPerMultiprocessor,
		MaxBlocksPerMultiProcessor:             core.MaxBlocksPerMultiprocessor,
		SharedMemPerMultiprocessor:             core.SharedMemoryPerMultiprocessor,
		WarpSize:                               core.WarpSize,
		RegsPerBlock:                           65536,
		RegsPerMultiprocessor:                  65536,
		TotalConstMem:                          64 << 10,
		MemPitch:                               1<<31 - 1,
		L2CacheSize:                            l2CacheBytes(),
		AsyncEngineCount:                       2,
		ComputeMode:                            0,
		ConcurrentKernels:                      true,
		CooperativeLaunch:                      true,
		CanMapHostMemory:                       true,
		UnifiedAddressing:                      true,
		ManagedMemory:                          true,
		Integrated:                             true,
		ConcurrentManagedAccess:                s.concurrentManagedAccess(),
		HostNativeAtomicSupported:              true,
		ComputePreemptionSupported:             true,
		GlobalL1CacheSupported:                 true,
		LocalL1CacheSupported:                  true,
		HostRegisterSupported:                  true,
		SingleToDoublePrecisionPerfRatio:       2,
		TexturePitchAlignment:                  pitchAlignment,
		NUMANode:                               info.Node,
		HostNUMANode:                           host,
		PageableMemoryAccess:                   false,
		PageableMemoryAccessUsesHostPageTables: false,
	}, nil
}

// DeviceAttr names a device attribute for DeviceGetAttribute, with
// cudaDeviceAttr's value: AttrX is cudaDevAttrX. Each is the DeviceProp
// field of the same name (where it has one), which says what it is and
// why; booleans are 0 or 1.
type DeviceAttr int

const (
	AttrMaxThreadsPerBlock                     DeviceAttr = 1
	AttrMaxBlockDimX                           DeviceAttr = 2
	AttrMaxBlockDimY                           DeviceAttr = 3
	AttrMaxBlockDimZ                           DeviceAttr = 4
	AttrMaxGridDimX                            DeviceAttr = 5
	AttrMaxGridDimY                            DeviceAttr = 6
	AttrMaxGridDimZ                            DeviceAttr = 7
	AttrMaxSharedMemoryPerBlock                DeviceAttr = 8
	AttrTotalConstantMemory                    DeviceAttr = 9
	AttrWarpSize                               DeviceAttr = 10
	AttrMaxPitch                               DeviceAttr = 11
	AttrMaxRegistersPerBlock                   DeviceAttr = 12
	AttrClockRate                              DeviceAttr = 13
	AttrGpuOverlap                             DeviceAttr = 15 // 1: copies run while kernels do
	AttrMultiProcessorCount                    DeviceAttr = 16
	AttrKernelExecTimeout                      DeviceAttr = 17
	AttrIntegrated                             DeviceAttr = 18
	AttrCanMapHostMemory                       DeviceAttr = 19
	AttrComputeMode                            DeviceAttr = 20
	AttrConcurrentKernels                      DeviceAttr = 31
	AttrEccEnabled                             DeviceAttr = 32
	AttrPciBusID                               DeviceAttr = 33 // 0: no PCI device
	AttrPciDeviceID                            DeviceAttr = 34 // 0
	AttrTccDriver                              DeviceAttr = 35 // 0
	AttrL2CacheSize                            DeviceAttr = 38
	AttrMaxThreadsPerMultiProcessor            DeviceAttr = 39
	AttrAsyncEngineCount                       DeviceAttr = 40
	AttrUnifiedAddressing                      DeviceAttr = 41
	AttrPciDomainID                            DeviceAttr = 50 // 0
	AttrTexturePitchAlignment                  DeviceAttr = 51
	AttrComputeCapabilityMajor                 DeviceAttr = 75
	AttrComputeCapabilityMinor                 DeviceAttr = 76
	AttrStreamPrioritiesSupported              DeviceAttr = 78
	AttrGlobalL1CacheSupported                 DeviceAttr = 79
	AttrLocalL1CacheSupported                  DeviceAttr = 80
	AttrMaxSharedMemoryPerMultiprocessor       DeviceAttr = 81
	AttrMaxRegistersPerMultiprocessor          DeviceAttr = 82
	AttrManagedMemory                          DeviceAttr = 83
	AttrIsMultiGpuBoard                        DeviceAttr = 84 // 0
	AttrMultiGpuBoardGroupID                   DeviceAttr = 85 // 0
	AttrHostNativeAtomicSupported              DeviceAttr = 86
	AttrSingleToDoublePrecisionPerfRatio       DeviceAttr = 87
	AttrPageableMemoryAccess                   DeviceAttr = 88
	AttrConcurrentManagedAccess                DeviceAttr = 89
	AttrComputePreemptionSupported             DeviceAttr = 90
	AttrCanUseHostPointerForRegisteredMem      DeviceAttr = 91
	AttrCooperativeLaunch                      DeviceAttr = 95
	AttrCooperativeMultiDeviceLaunch           DeviceAttr = 96 // 0: a cooperative launch is of one device
	AttrMaxSharedMemoryPerBlockOptin           DeviceAttr = 97
	AttrCanFlushRemoteWrites                   DeviceAttr = 98 // 0
	AttrHostRegisterSupported                  DeviceAttr = 99
	AttrPageableMemoryAccessUsesHostPageTables DeviceAttr = 100
	AttrDirectManagedMemAccessFromHost         DeviceAttr = 101
	AttrMaxBlocksPerMultiprocessor             DeviceAttr = 106
	AttrReservedSharedMemoryPerBlock           DeviceAttr = 111 // 0: the runtime keeps none of a block's shared memory
	AttrMemoryPoolsSupported                   DeviceAttr = 115
	AttrNumaConfig                             DeviceAttr = 130 // 1 (cudaDeviceNumaConfigNumaNode) for an arena bound to a node, else 0
	AttrNumaID                                 DeviceAttr = 131 // NUMANode
	AttrHostNumaID                             DeviceAttr = 134 // HostNUMANode
	// AttrArenaCapacity is the device's memory in bytes (TotalGlobalMem);
	// softuvm's own.
	AttrArenaCapacity DeviceAttr = 1000
	// AttrWorkerCount is AttrMultiProcessorCount, under its older name.
	AttrWorkerCount = AttrMultiProcessorCount
)

// attrNames are the attributes' names, without the Attr.
var attrNames = map[DeviceAttr]string{
	AttrMaxThreadsPerBlock: "MaxThreadsPerBlock", AttrMaxBlockDimX: "MaxBlockDimX", AttrMaxBlockDimY: "MaxBlockDimY", AttrMaxBlockDimZ: "MaxBlockDimZ",
	AttrMaxGridDimX: "MaxGridDimX", AttrMaxGridDimY: "MaxGridDimY", AttrMaxGridDimZ: "MaxGridDimZ", AttrMaxSharedMemoryPerBlock: "MaxSharedMemoryPerBlock",
	AttrTotalConstantMemory: "TotalConstantMemory", AttrWarpSize: "WarpSize", AttrMaxPitch: "MaxPitch", AttrMaxRegistersPerBlock: "MaxRegistersPerBlock",
	AttrClockRate: "ClockRate", AttrGpuOverlap: "GpuOverlap", AttrMultiProcessorCount: "MultiProcessorCount", AttrKernelExecTimeout: "KernelExecTimeout",
	AttrIntegrated: "Integrated", AttrCanMapHostMemory: "CanMapHostMemory", AttrComputeMode: "ComputeMode", AttrConcurrentKernels: "ConcurrentKernels",
	AttrEccEnabled: "EccEnabled", AttrPciBusID: "PciBusID", AttrPciDeviceID: "PciDeviceID", AttrTccDriver: "TccDriver", AttrL2CacheSize: "L2CacheSize",
	AttrMaxThreadsPerMultiProcessor: "MaxThreadsPerMultiProcessor", AttrAsyncEngineCount: "AsyncEngineCount", AttrUnifiedAddressing: "UnifiedAddressing",
	AttrPciDomainID: "PciDomainID", AttrTexturePitchAlignment: "TexturePitchAlignment", AttrComputeCapabilityMajor: "ComputeCapabilityMajor",
	AttrComputeCapabilityMinor: "ComputeCapabilityMinor", AttrStreamPrioritiesSupported: "StreamPrioritiesSupported",
	AttrGlobalL1CacheSupported: "GlobalL1CacheSupported", AttrLocalL1CacheSupported: "LocalL1CacheSupported",
	AttrMaxSharedMemoryPerMultiprocessor: "MaxSharedMemoryPerMultiprocessor", AttrMaxRegistersPerMultiprocessor: "MaxRegistersPerMultiprocessor",
	AttrManagedMemory: "ManagedMemory", AttrIsMultiGpuBoard: "IsMultiGpuBoard", AttrMultiGpuBoardGroupID: "MultiGpuBoardGroupID",
	AttrHostNativeAtomicSupported: "HostNativeAtomicSupported", AttrSingleToDoublePrecisionPerfRatio: "SingleToDoublePrecisionPerfRatio",
	AttrPageableMemoryAccess: "PageableMemoryAccess", AttrConcurrentManagedAccess: "ConcurrentManagedAccess",
	AttrComputePreemptionSupported: "ComputePreemptionSupported", AttrCanUseHostPointerForRegisteredMem: "CanUseHostPointerForRegisteredMem",
	AttrCooperativeLaunch: "CooperativeLaunch", AttrCooperativeMultiDeviceLaunch: "CooperativeMultiDeviceLaunch",
	AttrMaxSharedMemoryPerBlockOptin: "MaxSharedMemoryPerBlockOptin", AttrCanFlushRemoteWrites: "CanFlushRemoteWrites",
	AttrHostRegisterSupported: "HostRegisterSupported", AttrPageableMemoryAccessUsesHostPageTables: "PageableMemoryAccessUsesHostPageTables",
	AttrDirectManagedMemAccessFromHost: "DirectManagedMemAccessFromHost", AttrMaxBlocksPerMultiprocessor: "MaxBlocksPerMultiprocessor",
	AttrReservedSharedMemoryPerBlock: "ReservedSharedMemoryPerBlock", AttrMemoryPoolsSupported: "MemoryPoolsSupported",
	AttrNumaConfig: "NumaConfig", AttrNumaID: "NumaID", AttrHostNumaID: "HostNumaID", AttrArenaCapacity: "ArenaCapacity",
}

func (a DeviceAttr) String() string {
	if n, ok := attrNames[a]; ok {
		return n
	}
	return "device-attribute(" + strconv.Itoa(int(a)) + ")"
}

// isTextureAttr reports whether a is one of CUDA's texture and surface
// limits (cudaDevAttrTextureAlignment, MaxTexture*, MaxSurface*,
// SurfaceAlignment), which a CPU device has none of.
func isTextureAttr(a DeviceAttr) bool {
	return a == 14 || (a >= 21 && a <= 30) || (a >= 42 && a <= 74 && a != 50 && a != 51) || a == 77
}

// DeviceGetAttribute returns an attribute of device d, as
// cudaDeviceGetAttribute: the DeviceProp field of the attribute's name,
// booleans as 0 or 1. CUDA's texture and surface attributes are
// ErrNotSupported (no textures here); other numbers, ErrInvalidValue.
func (s *Session) DeviceGetAttribute(attr DeviceAttr, d Device) (int64, error) {
	p, err := s.GetDeviceProperties(d)
	if err != nil {
		return 0, err
	}
	b := func(v bool) int64 {
		if v {
			return 1
		}
		return 0
	}
	switch attr {
	case AttrMaxThreadsPerBlock:
		return int64(p.MaxThreadsPerBlock), nil
	case AttrMaxBlockDimX, AttrMaxBlockDimY, AttrMaxBlockDimZ:
		return int64(p.MaxThreadsDim[attr-AttrMaxBlockDimX]), nil
	case AttrMaxGridDimX, AttrMaxGridDimY, AttrMaxGridDimZ:
		return int64(p.MaxGridSize[attr-AttrMaxGridDimX]), nil
	case AttrMaxSharedMemoryPerBlock:
		return p.SharedMemPerBlock, nil
	case AttrTotalConstantMemory:
		return p.TotalConstMem, nil
	case AttrWarpSize:
		return int64(p.WarpSize), nil
	case AttrMaxPitch:
		return p.MemPitch, nil
	case AttrMaxRegistersPerBlock:
		return int64(p.RegsPerBlock), nil
	case AttrClockRate:
		return int64(p.ClockRate), nil
	case AttrGpuOverlap, AttrConcurrentKernels:
		return b(p.ConcurrentKernels), nil
	case AttrMultiProcessorCount:
		return int64(p.MultiProcessorCount), nil
	case AttrKernelExecTimeout:
		return b(p.KernelExecTimeoutEnabled), nil
	case AttrIntegrated:
		return b(p.Integrated), nil
	case AttrCanMapHostMemory:
		return b(p.CanMapHostMemory), nil
	case AttrComputeMode:
		return int64(p.ComputeMode), nil
	case AttrEccEnabled:
		return b(p.ECCEnabled), nil
	case AttrPciBusID, AttrPciDeviceID, AttrPciDomainID, AttrTccDriver, AttrIsMultiGpuBoard, AttrMultiGpuBoardGroupID,
		AttrCooperativeMultiDeviceLaunch, AttrCanFlushRemoteWrites, AttrReservedSharedMemoryPerBlock:
		return 0, nil
	case AttrL2CacheSize:
		return int64(p.L2CacheSize), nil
	case AttrMaxThreadsPerMultiProcessor:
		return int64(p.MaxThreadsPerMultiProcessor), nil
	case AttrAsyncEngineCount:
		return int64(p.AsyncEngineCount), nil
	case AttrUnifiedAddressing:
		return b(p.UnifiedAddressing), nil
	case AttrTexturePitchAlignment:
		return p.TexturePitchAlignment, nil
	case AttrComputeCapabilityMajor:
		return int64(p.Major), nil
	case AttrComputeCapabilityMinor:
		return int64(p.Minor), nil
	case AttrStreamPrioritiesSupported:
		return b(p.StreamPrioritiesSupported), nil
	case AttrGlobalL1CacheSupported:
		return b(p.GlobalL1CacheSupported), nil
	case AttrLocalL1CacheSupported:
		return b(p.LocalL1CacheSupported), nil
	case AttrMaxSharedMemoryPerMultiprocessor:
		return p.SharedMemPerMultiprocessor, nil
	case AttrMaxRegistersPerMultiprocessor:
		return int64(p.RegsPerMultiprocessor), nil
	case AttrManagedMemory:
		return b(p.ManagedMemory), nil
	case AttrHostNativeAtomicSupported:
		return b(p.HostNativeAtomicSupported), nil
	case AttrSingleToDoublePrecisionPerfRatio:
		return int64(p.SingleToDoublePrecisionPerfRatio), nil
	case AttrPageableMemoryAccess:
		return b(p.PageableMemoryAccess), nil
	case AttrConcurrentManagedAccess:
		return b(p.ConcurrentManagedAccess), nil
	case AttrComputePreemptionSupported:
		return b(p.ComputePreemptionSupported), nil
	case AttrCanUseHostPointerForRegisteredMem:
		return b(p.CanUseHostPointerForRegisteredMem), nil
	case AttrCooperativeLaunch:
		return b(p.CooperativeLaunch), nil
	case AttrMaxSharedMemoryPerBlockOptin:
		return p.SharedMemPerBlockOptin, nil
	case AttrHostRegisterSupported:
		return b(p.HostRegisterSupported), nil
	case AttrPageableMemoryAccessUsesHostPageTables:
		return b(p.PageableMemoryAccessUsesHostPageTables), nil
	case AttrDirectManagedMemAccessFromHost:
		return b(p.DirectManagedMemAccessFromHost), nil
	case AttrMaxBlocksPerMultiprocessor:
		return int64(p.MaxBlocksPerMultiProcessor), nil
	case AttrMemoryPoolsSupported:
		return b(p.MemoryPoolsSupported), nil
	case AttrNumaConfig:
		return b(p.NUMANode >= 0), nil
	case AttrNumaID:
		return int64(p.NUMANode), nil
	case AttrHostNumaID:
		return int64(p.HostNUMANode), nil
	case AttrArenaCapacity:
		return p.TotalGlobalMem, nil
	}
	if isTextureAttr(attr) {
		return 0, fmt.Errorf("%w: device attribute %d is a texture or surface limit: a CPU device emulates no textures", ErrNotSupported, int(attr))
	}
	return 0, fmt.Errorf("%w: device attribute %d: not one of cudaDeviceAttr's with a meaning here (see DeviceAttr)", ErrInvalidValue, int(attr))
}

// concurrentManagedAccess is cudaDevAttrConcurrentManagedAccess: true
// under the fault coherence model, where the CPU and devices may touch
// managed memory at the same time; false under the launch model, which
// hands managed memory to a launch's device until the synchronize that
// follows.
func (s *Session) concurrentManagedAccess() bool { return !s.launchModel() }

// MemGetInfo returns device d's free and total memory in bytes, as
// cudaMemGetInfo, as the server knows them now: total is the arena's
// capacity, free what neither device memory nor managed pages resident on
// the device take, whichever process's (a daemon's devices are shared by
// its clients).
func (s *Session) MemGetInfo(d Device) (free, total int64, err error) {
	if err := s.checkDevice(d, "memory information of"); err != nil {
		return 0, 0, err
	}
	in, err := s.Info()
	if err != nil {
		return 0, 0, err
	}
	for _, a := range in.Devices {
		if a.Device == d {
			return max(a.Capacity-a.UsedBytes, 0), a.Capacity, nil
		}
	}
	return 0, 0, fmt.Errorf("%w: memory information of device %d: the server did not describe it", ErrInternal, d)
}
