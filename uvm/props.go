package uvm

import (
	"fmt"

	"github.com/softuvm/softuvm/internal/wire"
)

// DeviceProp describes one device, after cudaDeviceProp. Only the
// properties that mean something for a device that is a process on the
// host's CPUs are here.
type DeviceProp struct {
	// Name says which device it is and what its memory is made of:
	// "softuvm device 1 (memfd)", or with the NUMA node of a NUMA arena,
	// "softuvm device 1 (numa, node 0)".
	Name string
	// TotalGlobalMem is the device's memory in bytes: its arena's
	// capacity, which device memory and the managed pages resident on
	// the device share (MemGetInfo says how much is free).
	TotalGlobalMem int64
	// MultiProcessorCount is the number of worker threads that run the
	// device's kernels: a launch's threads are spread over them.
	MultiProcessorCount int
	// MaxLaunchThreads is the most threads one launch may have.
	MaxLaunchThreads int
	// ConcurrentKernels is true: kernels of different streams of a
	// device may run at the same time.
	ConcurrentKernels bool
	// CanMapHostMemory is true: kernels reach pinned host memory
	// (HostAlloc, HostRegister) where it is, without a copy.
	CanMapHostMemory bool
	// UnifiedAddressing is true: one address means the same memory in
	// the host and in every device, for every kind of memory.
	UnifiedAddressing bool
	// ManagedMemory is true: MallocManaged memory is reachable from the
	// host and every device.
	ManagedMemory bool
	// ConcurrentManagedAccess says whether the host and devices may
	// touch managed memory at the same time, pages migrating on demand
	// (cudaDevAttrConcurrentManagedAccess). When false, the host must not
	// touch managed memory a kernel may use until a synchronize.
	ConcurrentManagedAccess bool
	// PageableMemoryAccess is false: kernels reach memory of this
	// runtime, not the program's ordinary (pageable) memory.
	PageableMemoryAccess bool
	// CanUseHostPointerForRegisteredMem is false: kernels reach memory
	// registered with HostRegister at the address HostGetDevicePointer
	// gives, not at the program's own address.
	CanUseHostPointerForRegisteredMem bool
	// DirectManagedMemAccessFromHost is false: the host touching managed
	// memory resident on a device migrates it, it does not read it
	// there.
	DirectManagedMemAccessFromHost bool
	// TexturePitchAlignment is the alignment of MallocPitch's pitch, in
	// bytes: 512, as CUDA's texturePitchAlignment on most GPUs.
	TexturePitchAlignment int64
	// NUMANode is the host NUMA node the device's memory is bound to, or
	// -1 where it is not bound to one.
	NUMANode int
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
	return DeviceProp{
		Name:                    name,
		TotalGlobalMem:          info.Capacity,
		MultiProcessorCount:     info.Workers,
		MaxLaunchThreads:        wire.MaxLaunchThreads,
		ConcurrentKernels:       true,
		CanMapHostMemory:        true,
		UnifiedAddressing:       true,
		ManagedMemory:           true,
		ConcurrentManagedAccess: s.concurrentManagedAccess(),
		TexturePitchAlignment:   pitchAlignment,
		NUMANode:                info.Node,
	}, nil
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
