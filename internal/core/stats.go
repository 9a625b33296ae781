package core

import (
	"fmt"
	"math"
	"math/bits"
	"sync/atomic"
	"time"
)

// Fault kinds, as userfaultfd reports them.
type FaultKind int

const (
	FaultMissing FaultKind = iota // no page in the view's file: first touch or resident elsewhere
	FaultMinor                    // page in the file but not mapped in the view
	FaultWP                       // write to a write-protected page
	numFaultKinds
)

// Cause says why pages moved.
type Cause int

const (
	CauseFault    Cause = iota + 1 // a fault on one of them
	CausePrefetch                  // a prefetch (cudaMemPrefetchAsync)
	CauseEviction                  // room was made on their location
	CauseCounters                  // access counters crossed the threshold
	CauseAdvice                    // advice (read duplication, a pin)
	CauseLaunch                    // a launch under the launch coherence model handed them to its device
	numCauses
)

var causeNames = [numCauses]string{"", "fault", "prefetch", "eviction", "counters", "advice", "launch"}

func (c Cause) String() string {
	if c > 0 && c < numCauses {
		return causeNames[c]
	}
	return fmt.Sprintf("cause(%d)", int(c))
}

// counters are the statistics of one scope (the server, or one
// allocation). Every field is updated with atomics from the fault path,
// so readers never stop it. The per-processor slices are indexed by
// Device.Slot.
type Counters struct {
	processors int
	Faults     [][numFaultKinds]atomic.Uint64 // by faulting processor
	migrated   []atomic.Uint64                // pages, index (cause*processors+from.Slot())*processors+to.Slot()
	Populated  []atomic.Uint64                // zero-filled pages, by processor
	Evicted    []atomic.Uint64                // pages evicted from each location
	// By processor: pages a device's view came to map in another
	// location's memory, pages copied to it by read duplication, faults
	// of it throttled, and pins of pages it thrashed on.
	RemoteMapped   []atomic.Uint64
	ReadDuplicated []atomic.Uint64
	Throttles      []atomic.Uint64
	Pins           []atomic.Uint64
	// By processor: pages whose mappings were dropped so that their next
	// access is sampled (hint faults), regions reported at the access
	// counters' threshold, and pages those reports migrated to it.
	HintsArmed      []atomic.Uint64
	Crossings       []atomic.Uint64
	CounterMigrated []atomic.Uint64
	// By processor, the resident core (package workingset): pages a
	// fault brought back after the processor evicted them, those of
	// them back soon, pages protected, pages whose protection ended
	// with its generation, and protected pages evicted where nothing
	// else could give room.
	Refaulted       []atomic.Uint64
	RefaultedRecent []atomic.Uint64
	Protected       []atomic.Uint64
	Unprotected     []atomic.Uint64
	Demoted         []atomic.Uint64
	Prefetched      atomic.Uint64 // pages brought speculatively
	// Under the launch coherence model: pages handed to a device at a
	// launch (copied: the CPU wrote them, or they had no device copy),
	// and host copies dropped at a launch without a copy (the CPU only
	// read them, and the device kept its own).
	LaunchCopied atomic.Uint64
	LaunchClean  atomic.Uint64
	// Discarded counts pages a discard (MemDiscard, the preload's heap
	// purge) found populated and dropped everywhere.
	Discarded atomic.Uint64
	// EvictedClean counts host pages evicted without a copy: the device
	// kept a copy when the host read them back (clean eviction), and the
	// host had not written them since.
	EvictedClean atomic.Uint64
	// ReadAhead counts pages read ahead of a sweep (among Prefetched).
	ReadAhead atomic.Uint64
	// Managed allocations made and the bytes they asked for. Only the
	// server's and the sessions' counters count them (an allocation's
	// own would be retired into its session's twice).
	Allocations    atomic.Uint64
	AllocatedBytes atomic.Uint64
	Used           atomic.Uint64 // of those, pages seen touched
	Unused         atomic.Uint64 // of those, pages that left untouched
	Service        LiveHistogram // fault service time
}

// newCounters sizes counters for the host and devices-1 devices: a
// server with one device keeps 2x2 migration counters, not 32x32, which
// matters with thousands of allocations.
func NewCounters(processors int) *Counters {
	return &Counters{
		processors: processors,
		Faults:     make([][numFaultKinds]atomic.Uint64, processors),
		migrated:   make([]atomic.Uint64, int(numCauses)*processors*processors),
		Populated:  make([]atomic.Uint64, processors),
		Evicted:    make([]atomic.Uint64, processors),

		RemoteMapped:   make([]atomic.Uint64, processors),
		ReadDuplicated: make([]atomic.Uint64, processors),
		Throttles:      make([]atomic.Uint64, processors),
		Pins:           make([]atomic.Uint64, processors),

		HintsArmed:      make([]atomic.Uint64, processors),
		Crossings:       make([]atomic.Uint64, processors),
		CounterMigrated: make([]atomic.Uint64, processors),

		Refaulted:       make([]atomic.Uint64, processors),
		RefaultedRecent: make([]atomic.Uint64, processors),
		Protected:       make([]atomic.Uint64, processors),
		Unprotected:     make([]atomic.Uint64, processors),
		Demoted:         make([]atomic.Uint64, processors),
	}
}

// Stats is a snapshot of counters, as `uvm stat` and the API report them.
type Stats struct {
	// Allocations counts the managed allocations made (MallocManaged,
	// uvmMallocManaged, the allocations libuvm-preload.so turns into
	// managed memory), and AllocatedBytes the bytes they asked for,
	// freed or not. The server and session scopes count them; an
	// allocation's own statistics leave them zero.
	Allocations    uint64 `json:"allocations"`
	AllocatedBytes uint64 `json:"allocated_bytes"`
	// Faults counts faults by the processor that took them.
	Faults []ProcessorFaults `json:"faults"`
	// Migrations counts pages moved between processors, one entry per
	// direction that saw traffic.
	Migrations []Migration `json:"migrations"`
	// MigrationsByCause splits Migrations by why the pages moved (the
	// Cause of each entry).
	MigrationsByCause []Migration `json:"migrations_by_cause,omitempty"`
	// Populated counts pages created zero-filled (first touch, or a
	// prefetch of never-touched memory), by processor.
	Populated []ProcessorPages `json:"populated"`
	// Evicted counts pages evicted from each location: from a device to
	// the host when its arena was full, from the host to a device above
	// the host budget.
	Evicted []ProcessorPages `json:"evicted"`
	// RemoteMapped counts pages a device came to map where they lie, in
	// another processor's memory, instead of migrating them (preferred
	// location, accessed-by, pinned thrashing pages).
	RemoteMapped []ProcessorPages `json:"remote_mapped"`
	// ReadDuplicated counts pages copied to a processor by read
	// duplication (read-mostly advice), the other copies kept.
	ReadDuplicated []ProcessorPages `json:"read_duplicated"`
	// Throttles counts a processor's faults on thrashing pages that were
	// made to wait; Pins counts pages pinned in host memory because the
	// processor kept taking them.
	Throttles []ProcessorCount `json:"throttles"`
	Pins      []ProcessorCount `json:"pins"`
	// HintsArmed counts pages of a device's remote mappings whose
	// page-table entries were dropped so that the next access faults and
	// is counted (hint faults); AccessCrossings the 64 KiB regions the
	// access counters reported at their threshold for the processor; and
	// CounterMigrated the pages those reports migrated to it (delayed
	// migration; also counted in Migrations).
	HintsArmed      []ProcessorPages `json:"hints_armed"`
	AccessCrossings []ProcessorCount `json:"access_crossings"`
	CounterMigrated []ProcessorPages `json:"counter_migrated"`
	// Refaults counts, by processor that evicted pages, what its
	// eviction cost and how it answered (ProcessorRefaults).
	Refaults []ProcessorRefaults `json:"refaults,omitempty"`
	// PrefetchedPages counts pages brought in speculatively, beyond the
	// faulted ones.
	PrefetchedPages uint64 `json:"prefetched_pages"`
	// LaunchCopiedPages counts pages the launch coherence model copied
	// to a device at a launch (written by the CPU since it had them, or
	// never on a device), LaunchCleanPages the host copies it dropped
	// without copying (only read: the device kept its copy).
	LaunchCopiedPages uint64 `json:"launch_copied_pages,omitempty"`
	LaunchCleanPages  uint64 `json:"launch_clean_pages,omitempty"`
	// DiscardedPages counts populated pages a discard dropped (their
	// contents were no longer wanted: nothing was copied).
	DiscardedPages uint64 `json:"discarded_pages,omitempty"`
	// EvictedCleanPages counts host pages evicted without a copy (clean
	// eviction: the device's copy was current); they are among Evicted.
	EvictedCleanPages uint64 `json:"evicted_clean_pages,omitempty"`
	// ReadAheadPages counts the pages brought ahead of a sweep, a block
	// past the faulted one (policy.ReadAhead); they are among
	// PrefetchedPages.
	ReadAheadPages uint64 `json:"read_ahead_pages,omitempty"`
	// PrefetchedUsed and PrefetchedUnused count, among prefetched pages
	// whose fate is known, those later touched and those that left
	// (migrated, evicted, freed) untouched. They are only known for
	// allocations made with prefetch-use tracking (see TrackPrefetchUse):
	// an eagerly mapped page raises no fault when touched, so nothing
	// observes its use.
	PrefetchedUsed   uint64 `json:"prefetched_used"`
	PrefetchedUnused uint64 `json:"prefetched_unused"`
	// FaultService is the time from the server reading a fault to the
	// ioctl that resolved it returning.
	FaultService Histogram `json:"fault_service"`
}

// ProcessorFaults counts one processor's faults by kind.
type ProcessorFaults struct {
	Processor    Device `json:"processor"`
	Missing      uint64 `json:"missing"`
	Minor        uint64 `json:"minor"`
	WriteProtect uint64 `json:"write_protect"`
}

// Migration counts pages moved in one direction (for one cause, in
// MigrationsByCause).
type Migration struct {
	From  Device `json:"from"`
	To    Device `json:"to"`
	Cause string `json:"cause,omitempty"`
	Pages uint64 `json:"pages"`
	Bytes uint64 `json:"bytes"`
}

// ProcessorPages counts pages for one processor.
type ProcessorPages struct {
	Processor Device `json:"processor"`
	Pages     uint64 `json:"pages"`
}

// ProcessorRefaults counts one processor's refaults: pages a fault
// brought back after the processor had evicted them (Pages), those of
// them back after fewer evictions than the processor holds (Recent:
// evicted too early), the pages its thrashing policy protected from
// eviction for that (Protected: the resident core), those whose
// protection ended with its generation (Unprotected), and protected
// pages evicted because nothing else could give room (Demoted).
type ProcessorRefaults struct {
	Processor   Device `json:"processor"`
	Pages       uint64 `json:"pages"`
	Recent      uint64 `json:"recent"`
	Protected   uint64 `json:"protected"`
	Unprotected uint64 `json:"unprotected"`
	Demoted     uint64 `json:"demoted"`
}

// ProcessorCount counts events of one processor.
type ProcessorCount struct {
	Processor Device `json:"processor"`
	Count     uint64 `json:"count"`
}

func pagesOf(ps []ProcessorPages, d Device) uint64 {
	for _, p := range ps {
		if p.Processor == d {
			return p.Pages
		}
	}
	return 0
}

func countOf(cs []ProcessorCount, d Device) uint64 {
	for _, c := range cs {
		if c.Processor == d {
			return c.Count
		}
	}
	return 0
}

// histogram records durations in buckets that grow geometrically: four
// per power of two, so a quantile is within 19% of the truth, from 1 ns to
// about 4.6 hours, lock-free.
type LiveHistogram struct {
	buckets [HistBuckets]atomic.Uint64
	count   atomic.Uint64
	sum     atomic.Uint64 // nanoseconds
	max     atomic.Uint64
}

const (
	histSubBits = 2
	HistBuckets = (64 - 20) << histSubBits // values up to 2^44 ns
)

func HistBucket(ns uint64) int {
	if ns < 1<<histSubBits {
		return int(ns)
	}
	exp := bits.Len64(ns) - 1 // ns in [2^exp, 2^(exp+1))
	sub := (ns >> (uint(exp) - histSubBits)) & (1<<histSubBits - 1)
	b := (exp-histSubBits+1)<<histSubBits + int(sub)
	return min(b, HistBuckets-1)
}

// histBucketUpper is the smallest value above bucket b.
func HistBucketUpper(b int) uint64 {
	if b < 1<<histSubBits {
		return uint64(b) + 1
	}
	exp := b>>histSubBits + histSubBits - 1
	sub := uint64(b & (1<<histSubBits - 1))
	return (1<<histSubBits + sub + 1) << uint(exp-histSubBits)
}

// Histogram is a snapshot of a latency histogram.
type Histogram struct {
	Count   uint64   `json:"count"`
	SumNS   uint64   `json:"sum_ns"`
	MaxNS   uint64   `json:"max_ns"`
	Buckets []Bucket `json:"buckets"` // nonempty buckets, ascending
}

// Bucket counts the values below UpperNS and at or above the previous
// bucket's bound.
type Bucket struct {
	UpperNS uint64 `json:"upper_ns"`
	Count   uint64 `json:"count"`
}

// addFrom adds o's counts into c (both sized alike): a freed allocation's
// statistics retire into its session's.
func (c *Counters) AddFrom(o *Counters) {
	for l := range o.Faults {
		for k := range o.Faults[l] {
			c.Faults[l][k].Add(o.Faults[l][k].Load())
		}
		c.Populated[l].Add(o.Populated[l].Load())
		c.Evicted[l].Add(o.Evicted[l].Load())
		c.RemoteMapped[l].Add(o.RemoteMapped[l].Load())
		c.ReadDuplicated[l].Add(o.ReadDuplicated[l].Load())
		c.Throttles[l].Add(o.Throttles[l].Load())
		c.Pins[l].Add(o.Pins[l].Load())
		c.HintsArmed[l].Add(o.HintsArmed[l].Load())
		c.Crossings[l].Add(o.Crossings[l].Load())
		c.CounterMigrated[l].Add(o.CounterMigrated[l].Load())
		c.Refaulted[l].Add(o.Refaulted[l].Load())
		c.RefaultedRecent[l].Add(o.RefaultedRecent[l].Load())
		c.Protected[l].Add(o.Protected[l].Load())
		c.Unprotected[l].Add(o.Unprotected[l].Load())
		c.Demoted[l].Add(o.Demoted[l].Load())
	}
	for i := range o.migrated {
		c.migrated[i].Add(o.migrated[i].Load())
	}
	c.Prefetched.Add(o.Prefetched.Load())
	c.LaunchCopied.Add(o.LaunchCopied.Load())
	c.LaunchClean.Add(o.LaunchClean.Load())
	c.Discarded.Add(o.Discarded.Load())
	c.EvictedClean.Add(o.EvictedClean.Load())
	c.ReadAhead.Add(o.ReadAhead.Load())
	c.Allocations.Add(o.Allocations.Load())
	c.AllocatedBytes.Add(o.AllocatedBytes.Load())
	c.Used.Add(o.Used.Load())
	c.Unused.Add(o.Unused.Load())
	for b := range o.Service.buckets {
		c.Service.buckets[b].Add(o.Service.buckets[b].Load())
	}
	c.Service.count.Add(o.Service.count.Load())
	c.Service.sum.Add(o.Service.sum.Load())
	for m := o.Service.max.Load(); ; {
		cur := c.Service.max.Load()
		if m <= cur || c.Service.max.CompareAndSwap(cur, m) {
			break
		}
	}
}

// AddMigrated counts pages moved from one processor to another, for
// cause (0 where none is known).
func (c *Counters) AddMigrated(from, to Device, cause Cause, pages int) {
	if cause < 0 || cause >= numCauses {
		cause = 0
	}
	c.migrated[(int(cause)*c.processors+from.Slot())*c.processors+to.Slot()].Add(uint64(pages))
}

// Total is the processor's fault count.
func (p ProcessorFaults) Total() uint64 { return p.Missing + p.Minor + p.WriteProtect }

// TotalFaults sums faults over processors.
func (s Stats) TotalFaults() uint64 {
	var n uint64
	for _, f := range s.Faults {
		n += f.Total()
	}
	return n
}

// MigratedPages returns the pages moved from one processor to another.
func (s Stats) MigratedPages(from, to Device) uint64 {
	for _, m := range s.Migrations {
		if m.From == from && m.To == to {
			return m.Pages
		}
	}
	return 0
}

// FaultsBy returns the faults taken by one processor.
func (s Stats) FaultsBy(d Device) ProcessorFaults {
	for _, f := range s.Faults {
		if f.Processor == d {
			return f
		}
	}
	return ProcessorFaults{Processor: d}
}

// EvictedPages returns the pages evicted from one processor's memory.
func (s Stats) EvictedPages(d Device) uint64 { return pagesOf(s.Evicted, d) }

// RemoteMappedPages returns the pages device d came to map remotely.
func (s Stats) RemoteMappedPages(d Device) uint64 { return pagesOf(s.RemoteMapped, d) }

// ReadDuplicatedPages returns the pages copied to d by read duplication.
func (s Stats) ReadDuplicatedPages(d Device) uint64 { return pagesOf(s.ReadDuplicated, d) }

// ThrottlesOf returns how many of d's faults were throttled.
func (s Stats) ThrottlesOf(d Device) uint64 { return countOf(s.Throttles, d) }

// PinsOf returns how many pages were pinned because d thrashed on them.
func (s Stats) PinsOf(d Device) uint64 { return countOf(s.Pins, d) }

// HintsArmedPages returns the pages of d's remote mappings armed for a
// hint fault.
func (s Stats) HintsArmedPages(d Device) uint64 { return pagesOf(s.HintsArmed, d) }

// CrossingsOf returns the regions reported at the threshold for d.
func (s Stats) CrossingsOf(d Device) uint64 { return countOf(s.AccessCrossings, d) }

// CounterMigratedPages returns the pages access counters migrated to d.
func (s Stats) CounterMigratedPages(d Device) uint64 { return pagesOf(s.CounterMigrated, d) }

// RefaultsOf returns processor d's refault counts.
func (s Stats) RefaultsOf(d Device) ProcessorRefaults {
	for _, r := range s.Refaults {
		if r.Processor == d {
			return r
		}
	}
	return ProcessorRefaults{Processor: d}
}

// PopulatedPages returns the pages zero-filled on one processor.
func (s Stats) PopulatedPages(d Device) uint64 { return pagesOf(s.Populated, d) }

func (c *Counters) Snapshot() Stats {
	var s Stats
	locations := c.processors
	for l := 0; l < locations; l++ {
		f := ProcessorFaults{Processor: DeviceAtSlot(l),
			Missing: c.Faults[l][FaultMissing].Load(), Minor: c.Faults[l][FaultMinor].Load(), WriteProtect: c.Faults[l][FaultWP].Load()}
		if f.Total() > 0 {
			s.Faults = append(s.Faults, f)
		}
		if n := c.Populated[l].Load(); n > 0 {
			s.Populated = append(s.Populated, ProcessorPages{Processor: DeviceAtSlot(l), Pages: n})
		}
		d := DeviceAtSlot(l)
		if n := c.Evicted[l].Load(); n > 0 {
			s.Evicted = append(s.Evicted, ProcessorPages{Processor: d, Pages: n})
		}
		if n := c.RemoteMapped[l].Load(); n > 0 {
			s.RemoteMapped = append(s.RemoteMapped, ProcessorPages{Processor: d, Pages: n})
		}
		if n := c.ReadDuplicated[l].Load(); n > 0 {
			s.ReadDuplicated = append(s.ReadDuplicated, ProcessorPages{Processor: d, Pages: n})
		}
		if n := c.Throttles[l].Load(); n > 0 {
			s.Throttles = append(s.Throttles, ProcessorCount{Processor: d, Count: n})
		}
		if n := c.Pins[l].Load(); n > 0 {
			s.Pins = append(s.Pins, ProcessorCount{Processor: d, Count: n})
		}
		if n := c.HintsArmed[l].Load(); n > 0 {
			s.HintsArmed = append(s.HintsArmed, ProcessorPages{Processor: d, Pages: n})
		}
		if n := c.Crossings[l].Load(); n > 0 {
			s.AccessCrossings = append(s.AccessCrossings, ProcessorCount{Processor: d, Count: n})
		}
		if n := c.CounterMigrated[l].Load(); n > 0 {
			s.CounterMigrated = append(s.CounterMigrated, ProcessorPages{Processor: d, Pages: n})
		}
		rf := ProcessorRefaults{Processor: d, Pages: c.Refaulted[l].Load(), Recent: c.RefaultedRecent[l].Load(),
			Protected: c.Protected[l].Load(), Unprotected: c.Unprotected[l].Load(), Demoted: c.Demoted[l].Load()}
		if rf != (ProcessorRefaults{Processor: d}) {
			s.Refaults = append(s.Refaults, rf)
		}
		for to := 0; to < locations; to++ {
			var n uint64
			for cause := range numCauses {
				k := c.migrated[(int(cause)*locations+l)*locations+to].Load()
				if k > 0 && cause > 0 {
					s.MigrationsByCause = append(s.MigrationsByCause, Migration{From: DeviceAtSlot(l), To: DeviceAtSlot(to), Cause: cause.String(), Pages: k, Bytes: k * PageSize})
				}
				n += k
			}
			if n > 0 {
				s.Migrations = append(s.Migrations, Migration{From: DeviceAtSlot(l), To: DeviceAtSlot(to), Pages: n, Bytes: n * PageSize})
			}
		}
	}
	s.Allocations = c.Allocations.Load()
	s.AllocatedBytes = c.AllocatedBytes.Load()
	s.PrefetchedPages = c.Prefetched.Load()
	s.LaunchCopiedPages = c.LaunchCopied.Load()
	s.LaunchCleanPages = c.LaunchClean.Load()
	s.DiscardedPages = c.Discarded.Load()
	s.EvictedCleanPages = c.EvictedClean.Load()
	s.ReadAheadPages = c.ReadAhead.Load()
	s.PrefetchedUsed = c.Used.Load()
	s.PrefetchedUnused = c.Unused.Load()
	s.FaultService = c.Service.Snapshot()
	return s
}

func (h *LiveHistogram) Record(d time.Duration) {
	ns := uint64(max(d, 0))
	h.buckets[HistBucket(ns)].Add(1)
	h.count.Add(1)
	h.sum.Add(ns)
	for {
		m := h.max.Load()
		if ns <= m || h.max.CompareAndSwap(m, ns) {
			return
		}
	}
}

func (h *LiveHistogram) Snapshot() Histogram {
	s := Histogram{Count: h.count.Load(), SumNS: h.sum.Load(), MaxNS: h.max.Load()}
	for b := range h.buckets {
		if n := h.buckets[b].Load(); n > 0 {
			s.Buckets = append(s.Buckets, Bucket{UpperNS: HistBucketUpper(b), Count: n})
		}
	}
	return s
}

// Quantile estimates the q-quantile (0 <= q <= 1) as the upper bound of
// the bucket that holds it, capped at the maximum seen.
func (h Histogram) Quantile(q float64) time.Duration {
	var total uint64
	for _, b := range h.Buckets {
		total += b.Count
	}
	if total == 0 {
		return 0
	}
	rank := uint64(math.Ceil(q * float64(total)))
	rank = max(rank, 1)
	var seen uint64
	for _, b := range h.Buckets {
		seen += b.Count
		if seen >= rank {
			return time.Duration(min(b.UpperNS, max(h.MaxNS, 1)))
		}
	}
	return time.Duration(h.MaxNS)
}

// Mean is the average value.
func (h Histogram) Mean() time.Duration {
	if h.Count == 0 {
		return 0
	}
	return time.Duration(h.SumNS / h.Count)
}

// Add merges another snapshot into h.
func (h *Histogram) Add(o Histogram) {
	h.Count += o.Count
	h.SumNS += o.SumNS
	h.MaxNS = max(h.MaxNS, o.MaxNS)
	merged := make([]Bucket, 0, len(h.Buckets)+len(o.Buckets))
	i, j := 0, 0
	for i < len(h.Buckets) || j < len(o.Buckets) {
		switch {
		case j == len(o.Buckets) || (i < len(h.Buckets) && h.Buckets[i].UpperNS < o.Buckets[j].UpperNS):
			merged = append(merged, h.Buckets[i])
			i++
		case i == len(h.Buckets) || o.Buckets[j].UpperNS < h.Buckets[i].UpperNS:
			merged = append(merged, o.Buckets[j])
			j++
		default:
			merged = append(merged, Bucket{UpperNS: h.Buckets[i].UpperNS, Count: h.Buckets[i].Count + o.Buckets[j].Count})
			i++
			j++
		}
	}
	h.Buckets = merged
}

// Since returns what h, a later snapshot of the same histogram as
// earlier, counted after earlier was taken: a benchmark's timed part
// without its warm-up. The maximum is h's, which may be the warm-up's.
func (h Histogram) Since(earlier Histogram) Histogram {
	out := Histogram{Count: h.Count - min(h.Count, earlier.Count), SumNS: h.SumNS - min(h.SumNS, earlier.SumNS), MaxNS: h.MaxNS}
	before := map[uint64]uint64{}
	for _, b := range earlier.Buckets {
		before[b.UpperNS] = b.Count
	}
	for _, b := range h.Buckets {
		if n := b.Count - min(b.Count, before[b.UpperNS]); n > 0 {
			out.Buckets = append(out.Buckets, Bucket{UpperNS: b.UpperNS, Count: n})
		}
	}
	return out
}
