package policy

import (
	"time"

	"github.com/softuvm/softuvm/internal/core"
)

// NvidiaThrashing is the thrashing detector of NVIDIA's driver
// (kernel-open/nvidia-uvm/uvm_perf_thrashing.c): a page that a fault
// moves Threshold times in a row, each move within Lapse of the one
// before, thrashes. Its next fault is throttled (the processor waits a
// Nap); after PinThreshold throttles, a page whose preferred location is
// the host (or none) is pinned there for Pin, and devices map it
// remotely. Throttles are forgotten after Epoch without a move.
//
// NVIDIA's driver has no answer to thrashing under oversubscription but
// its throttle; this one also answers refaults (Refaulting) where
// Spec.Refault is set: a page back within RefaultDistance percent of a
// processor's capacity in evictions joins its resident core, of at most
// Core percent of the capacity (and at least a 64 KiB region less than
// all of it), for CoreAge to twice CoreAge capacities of evictions.
type NvidiaThrashing struct {
	Spec ThrashingSpec
}

// nvidiaBlock is one block's detector state. Times are the server's clock
// in microseconds (0: never).
type nvidiaBlock struct {
	last       [PagesPerBlock]int64
	count      [PagesPerBlock]uint8
	throttles  [PagesPerBlock]uint8
	pinnedTill [PagesPerBlock]int64
	pinnedMax  int64 // the latest pinnedTill: no page is pinned after it
	// near counts the pages whose count is at least Threshold-1, those
	// Avoid marks even unpinned: with none near and none pinned, Avoid,
	// asked at every fault, marks nothing without reading 512 pages.
	near int
}

// setCount sets page p's count, keeping near.
func (n *NvidiaThrashing) setCount(th *nvidiaBlock, p int, c uint8) {
	was := int(th.count[p]) >= n.Spec.Threshold-1
	th.count[p] = c
	if is := int(c) >= n.Spec.Threshold-1; is != was {
		if is {
			th.near++
		} else {
			th.near--
		}
	}
}

func (n *NvidiaThrashing) Name() string { return "nvidia:" + n.Spec.String() }

// RefaultLimits: the spec's percentages of capacity. Where Spec.Refault
// is off, refaults are still told recent from far (the statistics count
// them), and nothing is protected.
func (n *NvidiaThrashing) RefaultLimits(_ Processor, capacity int64) RefaultLimits {
	if capacity <= 0 {
		return RefaultLimits{}
	}
	distance := n.Spec.RefaultDistance
	if distance <= 0 {
		distance = DefaultThrashing.RefaultDistance
	}
	l := RefaultLimits{Recent: max(capacity*int64(distance)/100, 1)}
	if n.Spec.Refault {
		// The rest must hold what one fault brings: a 64 KiB region at
		// least, so that a fault never has to give up what it just
		// brought.
		l.Protect = max(min(capacity*int64(n.Spec.Core)/100, capacity-core.BigPagePages), 0)
		l.Age = max(capacity*int64(n.Spec.CoreAge), 1)
	}
	return l
}

// Refaulted protects the pages where they fit whole under the limit:
// part of a block that came back whole would split its folio.
func (n *NvidiaThrashing) Refaulted(f Refault) RefaultHint {
	if f.Protected+int64(f.Pages.Count()) > f.Limits.Protect {
		return RefaultNone
	}
	return RefaultProtect
}

func (n *NvidiaThrashing) NewState() any { return &nvidiaBlock{} }

func micros(c Clock) int64 { return c.Microseconds() }

func (n *NvidiaThrashing) Migrated(state any, pages PageMask, now Clock) {
	th := state.(*nvidiaBlock)
	t := micros(now)
	lapse := time.Duration(n.Spec.Lapse).Microseconds()
	for p := pages.NextSet(0); p >= 0; p = pages.NextSet(p + 1) {
		if th.last[p] != 0 && t-th.last[p] <= lapse {
			if th.count[p] < 255 {
				n.setCount(th, p, th.count[p]+1)
			}
		} else {
			n.setCount(th, p, 1)
		}
		th.last[p] = t
	}
}

func (n *NvidiaThrashing) Check(state any, f ThrashFault) ThrashHint {
	th := state.(*nvidiaBlock)
	p, now := f.Page, micros(f.Now)
	if th.pinnedTill[p] > now {
		return ThrashPinned
	}
	if now-th.last[p] > time.Duration(n.Spec.Epoch).Microseconds() {
		th.throttles[p] = 0
	}
	if int(th.count[p]) < n.Spec.Threshold || now-th.last[p] > time.Duration(n.Spec.Lapse).Microseconds() {
		return ThrashNone
	}
	n.setCount(th, p, 0)
	th.throttles[p]++
	if int(th.throttles[p]) >= n.Spec.PinThreshold && f.HostPreferred {
		th.throttles[p] = 0
		th.pinnedTill[p] = now + time.Duration(n.Spec.Pin).Microseconds()
		th.pinnedMax = max(th.pinnedMax, th.pinnedTill[p])
		return ThrashPin
	}
	return ThrashThrottle
}

func (n *NvidiaThrashing) Pinned(state any, page int, now Clock) bool {
	return state.(*nvidiaBlock).pinnedTill[page] > micros(now)
}

func (n *NvidiaThrashing) PinnedUntil(state any) Clock {
	return Clock(state.(*nvidiaBlock).pinnedMax) * Clock(time.Microsecond)
}

// Avoid marks the pinned pages and those one move short of thrashing, as
// NVIDIA's prefetcher leaves thrashing pages out of its regions.
func (n *NvidiaThrashing) Avoid(state any, pages int, now Clock, out *PageMask) {
	th := state.(*nvidiaBlock)
	t := micros(now)
	if th.near == 0 && th.pinnedMax <= t {
		return
	}
	for p := 0; p < pages; p++ {
		if th.pinnedTill[p] > t || int(th.count[p]) >= n.Spec.Threshold-1 {
			out.Set(p)
		}
	}
}

func (n *NvidiaThrashing) Nap() time.Duration { return time.Duration(n.Spec.Nap) }

func (n *NvidiaThrashing) PinDuration() time.Duration { return time.Duration(n.Spec.Pin) }
