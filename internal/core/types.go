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

// MaxDevices bounds the devices of a server: a set of processors (the
// CPU and every device) fits a uint32.
const MaxDevices = 31

// Slot is d's position in a table with one entry per processor: 0 for
// the CPU, 1+i for device i. It is an array index, not a second name for
// the processor: tables are indexed with it, and everything else (the
// API, the policies, the server's decisions, the wire) speaks of Device.
func (d Device) Slot() int { return int(d) + 1 }

// DeviceAtSlot is the processor whose table position is i (see Slot).
func DeviceAtSlot(i int) Device { return Device(i - 1) }

// PageProcessor is an optional processor in one byte, for the per-page
// tables of a block (a preferred location, the file a view maps, the last
// prefetch destination): the zero value is none. It is the only place a
// processor is packed into a byte.
type PageProcessor uint8

// NoProcessor is the zero PageProcessor: no processor.
const NoProcessor PageProcessor = 0

// PageProcessorOf packs d.
func PageProcessorOf(d Device) PageProcessor { return PageProcessor(d.Slot() + 1) }

// Device returns the processor packed in p, and ok false for none.
func (p PageProcessor) Device() (d Device, ok bool) {
	return DeviceAtSlot(int(p) - 1), p != NoProcessor
}

// Is reports whether p holds d.
func (p PageProcessor) Is(d Device) bool { return p != NoProcessor && p == PageProcessorOf(d) }

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
	// The preferred and last prefetch locations as locations
	// (AttrPreferredLocationType and ID, AttrLastPrefetchLocationType and
	// ID): a device and its index, the host, or one of its NUMA nodes and
	// the node; LocationInvalid where the pages disagree or have none.
	// The server answers with processors; the client adds the nodes.
	PreferredLocationType, LastPrefetchLocationType MemLocationType
	PreferredLocationID, LastPrefetchLocationID     int
}

// MemLocationType is what a memory location (cudaMemLocation) names, with
// cudaMemLocationType's values.
type MemLocationType int

const (
	LocationInvalid         MemLocationType = 0 // no location: pages that disagree, or none
	LocationDevice          MemLocationType = 1 // a device; the id is its index
	LocationHost            MemLocationType = 2 // the host; the id is ignored (reported as CPU, -1)
	LocationHostNUMA        MemLocationType = 3 // a host NUMA node; the id is the node
	LocationHostNUMACurrent MemLocationType = 4 // the host node nearest the calling thread; the id is ignored
)

func (t MemLocationType) String() string {
	switch t {
	case LocationInvalid:
		return "invalid"
	case LocationDevice:
		return "device"
	case LocationHost:
		return "host"
	case LocationHostNUMA:
		return "host-numa"
	case LocationHostNUMACurrent:
		return "host-numa-current"
	}
	return "location-type(" + strconv.Itoa(int(t)) + ")"
}

// RangeAttr names one attribute for RangeAttribute.
type RangeAttr int

const (
	AttrReadMostly RangeAttr = iota + 1
	AttrPreferredLocation
	AttrAccessedBy
	AttrLastPrefetchLocation
	AttrPreferredLocationType
	AttrPreferredLocationID
	AttrLastPrefetchLocationType
	AttrLastPrefetchLocationID
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
	case AttrPreferredLocationType:
		return "preferred-location-type"
	case AttrPreferredLocationID:
		return "preferred-location-id"
	case AttrLastPrefetchLocationType:
		return "last-prefetch-location-type"
	case AttrLastPrefetchLocationID:
		return "last-prefetch-location-id"
	}
	return "range-attribute(" + strconv.Itoa(int(a)) + ")"
}
