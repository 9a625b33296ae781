package uvm

import (
	"fmt"
	"strconv"
)

// Device names a processor: a device index from 0, or CPU for the host.
type Device int

const (
	// CPU is the host processor, CUDA's cudaCpuDeviceId (CU_DEVICE_CPU).
	CPU Device = -1
	// InvalidDevice is returned where no single device answers a query,
	// CUDA's CU_DEVICE_INVALID.
	InvalidDevice Device = -2
)

func (d Device) String() string {
	switch {
	case d == CPU:
		return "cpu"
	case d == InvalidDevice:
		return "invalid"
	case d >= 0:
		return "device " + strconv.Itoa(int(d))
	}
	return fmt.Sprintf("device(%d)", int(d))
}

// location is a processor's index in residency bookkeeping: 0 is the host,
// 1+i is device i. A set of locations fits a uint32, so at most 31
// devices.
type location uint8

const (
	hostLoc    location = 0
	maxDevices          = 31
)

func locationOf(d Device) location { return location(d + 1) }
func (l location) device() Device  { return Device(l) - 1 }

// DeviceInfo describes one device as the server configured it.
type DeviceInfo struct {
	Device   Device `json:"device"`
	Capacity int64  `json:"capacity_bytes"`
	Backend  string `json:"backend"`
	Node     int    `json:"numa_node"`
	Workers  int    `json:"workers"` // threads that run the device's kernels
}

// RangeAttributes are the answers of cuMemRangeGetAttribute for one range
// (see RangeAttribute for each attribute's rule).
type RangeAttributes struct {
	// ReadMostly is true when every page of the range has read
	// duplication enabled (AttrReadMostly).
	ReadMostly bool
	// PreferredLocation is the preferred location shared by every page,
	// or InvalidDevice when the pages disagree or some have none.
	PreferredLocation Device
	// AccessedBy lists the processors that have accessed-by advice for
	// the entire range.
	AccessedBy []Device
	// LastPrefetchLocation is the last location every page of the range
	// was explicitly prefetched to, or InvalidDevice if some page was
	// never prefetched or the pages disagree.
	LastPrefetchLocation Device
}

// RangeAttr names one attribute for RangeAttribute.
type RangeAttr int

const (
	AttrReadMostly RangeAttr = iota + 1
	AttrPreferredLocation
	AttrAccessedBy
	AttrLastPrefetchLocation
)

func (a RangeAttr) String() string {
	switch a {
	case AttrReadMostly:
		return "read-mostly"
	case AttrPreferredLocation:
		return "preferred-location"
	case AttrAccessedBy:
		return "accessed-by"
	case AttrLastPrefetchLocation:
		return "last-prefetch-location"
	}
	return "range-attribute(" + strconv.Itoa(int(a)) + ")"
}

// MemoryType says what kind of memory a pointer addresses, after
// cudaMemoryType.
type MemoryType int

const (
	MemoryUnregistered MemoryType = iota // not known to the runtime
	MemoryHost                           // pinned host memory (HostAlloc)
	MemoryDevice                         // device-only memory (Malloc)
	MemoryManaged                        // managed memory (MallocManaged)
)

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
