package uvm

import (
	"strconv"
)

// MemoryType says what kind of memory a pointer addresses, after
// cudaMemoryType.
type MemoryType int

const (
	MemoryUnregistered MemoryType = iota // not known to the runtime
	MemoryHost                           // pinned host memory (HostAlloc)
	MemoryDevice                         // device-only memory (Malloc)
	MemoryManaged                        // managed memory (MallocManaged)
)

// PointerAttributes describe the allocation a pointer falls in, after
// cuPointerGetAttribute.
type PointerAttributes struct {
	Type MemoryType
	// Device is the device the memory was allocated against: the
	// current device at allocation for managed memory.
	Device Device
	// DevicePointer and HostPointer are the addresses through which a
	// kernel and the host reach the byte; for managed memory both equal
	// the pointer queried.
	DevicePointer, HostPointer uintptr
	// RangeStart and RangeSize delimit the whole allocation.
	RangeStart uintptr
	RangeSize  int64
	// BufferID is unique among the process's allocations, never reused.
	BufferID uint64
	// IsManaged is true for managed memory.
	IsManaged bool
}

func (t MemoryType) String() string {
	switch t {
	case MemoryUnregistered:
		return "unregistered"
	case MemoryHost:
		return "host"
	case MemoryDevice:
		return "device"
	case MemoryManaged:
		return "managed"
	}
	return "memory-type(" + strconv.Itoa(int(t)) + ")"
}
