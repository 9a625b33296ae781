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

// PointerAttr names one attribute of a pointer, after CUpointer_attribute,
// for PointerGetAttributesOf and PointerSetAttribute. Each comment gives
// the Go type of the attribute's value.
type PointerAttr int

const (
	// PointerAttrMemoryType is the kind of memory: a MemoryType.
	PointerAttrMemoryType PointerAttr = iota + 1
	// PointerAttrDevice is the device the memory was allocated against
	// (CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL): a Device, CPU for pinned
	// host memory.
	PointerAttrDevice
	// PointerAttrDevicePointer is the address at which kernels reach the
	// byte: a uintptr.
	PointerAttrDevicePointer
	// PointerAttrHostPointer is the address at which the host reaches
	// the byte, 0 for device memory: a uintptr.
	PointerAttrHostPointer
	// PointerAttrIsManaged says whether it is managed memory: a bool.
	PointerAttrIsManaged
	// PointerAttrRangeStart is the start of the allocation (of the
	// program's own address for registered memory): a uintptr.
	PointerAttrRangeStart
	// PointerAttrRangeSize is the allocation's size as asked: an int64.
	PointerAttrRangeSize
	// PointerAttrSyncMemops is what PointerSetAttribute last set for the
	// allocation, false until then: a bool.
	PointerAttrSyncMemops
	// PointerAttrBufferID is the allocation's buffer id, unique in the
	// process and never reused: a uint64.
	PointerAttrBufferID
)

func (a PointerAttr) String() string {
	switch a {
	case PointerAttrMemoryType:
		return "memory-type"
	case PointerAttrDevice:
		return "device"
	case PointerAttrDevicePointer:
		return "device-pointer"
	case PointerAttrHostPointer:
		return "host-pointer"
	case PointerAttrIsManaged:
		return "is-managed"
	case PointerAttrRangeStart:
		return "range-start"
	case PointerAttrRangeSize:
		return "range-size"
	case PointerAttrSyncMemops:
		return "sync-memops"
	case PointerAttrBufferID:
		return "buffer-id"
	}
	return "pointer-attribute(" + strconv.Itoa(int(a)) + ")"
}
