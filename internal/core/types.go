package core

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

// location is a processor's index in residency bookkeeping: 0 is the host,
// 1+i is device i. A set of locations fits a uint32, so at most 31
// devices.
type Location uint8

const (
	HostLoc    Location = 0
	MaxDevices          = 31
)

func LocationOf(d Device) Location { return Location(d + 1) }

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

func (l Location) Device() Device { return Device(l) - 1 }

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

// The attachment flags of a managed allocation, as cudaMemAttachGlobal
// and cudaMemAttachHost, with their values on the wire.
const (
	AttachGlobal = 0x1
	AttachHost   = 0x2
)
