package uvm

import (
	"fmt"
	"os"
	"sort"
	"sync"

	"github.com/softuvm/softuvm/devmem"
	"github.com/softuvm/softuvm/internal/core"
)

// Memory locations, as cudaMemLocation: PrefetchLocation and
// MemAdviseLocation (cudaMemPrefetchAsync_v2, cudaMemAdvise_v2) name a
// device, the host, one of the host's NUMA nodes, or the node nearest the
// calling thread.
//
// The fault server knows the host as one processor. For a host NUMA node
// the client does the node's part through the host file's pages mapped in
// this process: it gives them the policy that prefers the node
// (devmem.PreferNode: mbind MPOL_PREFERRED, which the shared host file
// keeps, so pages the server brings to the host later are allocated there
// too), a prefetch moving the pages already on the host there before the
// server brings the rest; a preferred location elsewhere, or none, puts
// the default policy back where a node was preferred. It records which
// ranges were prefetched to, or prefer, which node, so that RangeAttributes
// says LocationHostNUMA and the node where every page agrees. libuvm's
// location.c does the same for C.

type (
	// MemLocationType is what a MemLocation names: LocationDevice,
	// LocationHost, LocationHostNUMA, LocationHostNUMACurrent (and
	// LocationInvalid in range attributes, for pages that disagree).
	MemLocationType = core.MemLocationType
)

const (
	LocationInvalid         = core.LocationInvalid
	LocationDevice          = core.LocationDevice
	LocationHost            = core.LocationHost
	LocationHostNUMA        = core.LocationHostNUMA
	LocationHostNUMACurrent = core.LocationHostNUMACurrent
)

// MemLocation is a location of memory: a device (ID: its index), the host
// (ID ignored), a host NUMA node (ID: the node, as /sys/devices/system/node
// numbers them; DeviceProp.HostNUMANode is the one nearest a device), or
// the node nearest the calling thread's CPU (ID ignored).
type MemLocation struct {
	Type MemLocationType
	ID   int
}

// resolve turns a location into the processor the server knows and the
// host node (-1: none) the client handles.
func (s *Session) resolve(what string, loc MemLocation) (Device, int, error) {
	switch loc.Type {
	case LocationDevice:
		if loc.ID < 0 || loc.ID >= len(s.devices) {
			return InvalidDevice, -1, fmt.Errorf("%w: %s device %d: %s", ErrInvalidDevice, what, loc.ID, s.deviceChoicesNoCPU())
		}
		return Device(loc.ID), -1, nil
	case LocationHost:
		return CPU, -1, nil
	case LocationHostNUMA:
		if _, err := os.Stat(fmt.Sprintf("/sys/devices/system/node/node%d", loc.ID)); loc.ID < 0 || err != nil {
			return InvalidDevice, -1, fmt.Errorf("%w: %s host NUMA node %d: no such node (/sys/devices/system/node lists them)", ErrInvalidValue, what, loc.ID)
		}
		return CPU, loc.ID, nil
	case LocationHostNUMACurrent:
		node, err := devmem.CurrentNode()
		if err != nil {
			return InvalidDevice, -1, fmt.Errorf("%w: %s the calling thread's host NUMA node: %v", ErrInternal, what, err)
		}
		return CPU, node, nil
	}
	return InvalidDevice, -1, fmt.Errorf("%w: %s location type %d: want %v (%d), %v (%d), %v (%d) or %v (%d)", ErrInvalidValue, what, int(loc.Type),
		LocationDevice, int(LocationDevice), LocationHost, int(LocationHost), LocationHostNUMA, int(LocationHostNUMA), LocationHostNUMACurrent, int(LocationHostNUMACurrent))
}

// PrefetchLocation migrates [addr, addr+n) to loc, as Prefetch does to a
// processor, and returns when the data is there. To a host NUMA node, the
// host pages prefer the node from then on and those already on the host
// move there first. Under the launch coherence model it is refused
// (ErrInvalidDevice), as Prefetch is.
func (s *Session) PrefetchLocation(addr uintptr, n int64, loc MemLocation) error {
	dst, node, err := s.resolve("prefetch to", loc)
	if err != nil {
		return err
	}
	return s.prefetchTo(addr, n, dst, node)
}

// PrefetchLocationAsync is PrefetchLocation in stream order, as
// cudaMemPrefetchAsync_v2: it checks its arguments and returns at once;
// the migration runs after the work queued on st before it, and its error
// comes back from st's next synchronize. A nil st is the device's default
// stream for a device location; a host location names no device, and
// needs a stream (DefaultStream(d) for a device's default one).
func (s *Session) PrefetchLocationAsync(addr uintptr, n int64, loc MemLocation, st *Stream) error {
	dst, node, err := s.resolve("prefetch to", loc)
	if err != nil {
		return err
	}
	if err := s.refuseUnderLaunchModel("prefetch to", dst); err != nil {
		return err
	}
	if _, _, _, err := s.pageRange("prefetch", addr, n); err != nil {
		return err
	}
	if st == nil {
		if dst == CPU {
			return fmt.Errorf("%w: prefetch of %#x+%d to %v on a nil stream: no device's default stream is meant; pass a stream, or DefaultStream(device)", ErrInvalidValue, addr, n, loc.Type)
		}
		st = s.DefaultStream(dst)
	}
	return s.queueHost(st, "prefetch on", func() error {
		if err := s.prefetchTo(addr, n, dst, node); err != nil {
			return fmt.Errorf("PrefetchLocationAsync of %#x+%d to %v %d on %v: %w", addr, n, loc.Type, loc.ID, st, err)
		}
		return nil
	})
}

// prefetchTo prefetches to processor dst and, for the host, to node (-1:
// none), and records the node.
func (s *Session) prefetchTo(addr uintptr, n int64, dst Device, node int) error {
	_, start, length, err := s.pageRange("prefetch", addr, n)
	if err != nil {
		return err
	}
	if node >= 0 {
		// The node first, so that the pages the server brings back are
		// allocated there.
		if err := devmem.PreferNode(start, int64(length), node, true); err != nil {
			return fmt.Errorf("%w: prefetch of %#x+%d to host NUMA node %d: %v", ErrInternal, addr, n, node, err)
		}
	}
	if err := s.prefetchProcessor(addr, n, dst); err != nil {
		return err
	}
	s.nodes.record(&s.nodes.prefetched, start, length, node)
	return nil
}

// MemAdviseLocation advises the runtime about [addr, addr+n) for loc, as
// MemAdvise does for a processor (cudaMemAdvise_v2). A preferred host
// NUMA node steers the pages that come to the host there, moving none
// now; AdviseSetReadMostly ignores loc; a node is the host for
// AdviseSetAccessedBy. What MemAdvise refuses under the launch coherence
// model, this refuses too.
func (s *Session) MemAdviseLocation(addr uintptr, n int64, advice Advice, loc MemLocation) error {
	d, node := CPU, -1
	if advice.UsesDevice() {
		var err error
		if d, node, err = s.resolve(advice.String()+" for", loc); err != nil {
			return err
		}
	}
	return s.adviseFor(addr, n, advice, d, node)
}

// adviseFor takes advice for processor d and host node node (-1: none).
func (s *Session) adviseFor(addr uintptr, n int64, advice Advice, d Device, node int) error {
	if err := s.adviseProcessor(addr, n, advice, d); err != nil {
		return err
	}
	if advice != AdviseSetPreferredLocation && advice != AdviseUnsetPreferredLocation {
		return nil
	}
	_, start, length, err := s.pageRange(advice.String(), addr, n)
	if err != nil {
		return err
	}
	if node >= 0 || s.nodes.query(&s.nodes.preferred, start, length) != noNode {
		if err := devmem.PreferNode(start, int64(length), node, false); err != nil {
			return fmt.Errorf("%w: %v of %#x+%d for host NUMA node %d: %v", ErrInternal, advice, addr, n, node, err)
		}
	}
	s.nodes.record(&s.nodes.preferred, start, length, node)
	return nil
}

// locate fills in a range's locations from its processors (as the server
// answers them) and the nodes recorded.
func (s *Session) locate(a *RangeAttributes, start, length uintptr) {
	a.PreferredLocationType, a.PreferredLocationID = s.nodes.location(&s.nodes.preferred, a.PreferredLocation, start, length)
	a.LastPrefetchLocationType, a.LastPrefetchLocationID = s.nodes.location(&s.nodes.prefetched, a.LastPrefetchLocation, start, length)
}

// hostNodes records the host NUMA nodes of ranges: the last prefetched to,
// and the preferred. The zero value is empty.
type hostNodes struct {
	mu                    sync.Mutex
	prefetched, preferred []nodeRun // each sorted by start, disjoint; guarded by mu
}

type nodeRun struct {
	start, end uintptr
	node       int
}

// What query finds besides a node.
const (
	noNode    = -1 // no byte of the range has one
	mixedNode = -2 // some bytes have none, or bytes have different ones
)

// record sets node for [start, start+length) in runs, or clears it (node
// -1).
func (h *hostNodes) record(runs *[]nodeRun, start, length uintptr, node int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	end := start + length
	var out []nodeRun
	for _, r := range *runs {
		if r.end <= start || r.start >= end {
			out = append(out, r)
			continue
		}
		if r.start < start {
			out = append(out, nodeRun{r.start, start, r.node})
		}
		if r.end > end {
			out = append(out, nodeRun{end, r.end, r.node})
		}
	}
	if node >= 0 {
		out = append(out, nodeRun{start, end, node})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].start < out[j].start })
	*runs = out
}

// query is the node of every byte of [start, start+length): a node,
// noNode or mixedNode.
func (h *hostNodes) query(runs *[]nodeRun, start, length uintptr) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	end := start + length
	node, covered := noNode, uintptr(0)
	for _, r := range *runs {
		if r.end <= start || r.start >= end {
			continue
		}
		if node >= 0 && r.node != node {
			return mixedNode
		}
		node = r.node
		covered += min(r.end, end) - max(r.start, start)
	}
	if covered == 0 {
		return noNode
	}
	if covered != length {
		return mixedNode
	}
	return node
}

// location is the location type and id of a range whose pages are on (or
// prefer) processor p, as the server says: a device, the CPU, or
// InvalidDevice where they disagree.
func (h *hostNodes) location(runs *[]nodeRun, p Device, start, length uintptr) (MemLocationType, int) {
	switch {
	case p >= 0:
		return LocationDevice, int(p)
	case p != CPU:
		return LocationInvalid, int(InvalidDevice)
	}
	switch node := h.query(runs, start, length); node {
	case noNode:
		return LocationHost, int(CPU)
	case mixedNode:
		return LocationInvalid, int(InvalidDevice)
	default:
		return LocationHostNUMA, node
	}
}

// forget drops a freed allocation's records.
func (h *hostNodes) forget(start, length uintptr) {
	h.record(&h.prefetched, start, length, -1)
	h.record(&h.preferred, start, length, -1)
}
