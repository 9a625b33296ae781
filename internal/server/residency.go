package server

import (
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/softuvm/softuvm/internal/core"
	"github.com/softuvm/softuvm/internal/workingset"
	"github.com/softuvm/softuvm/policy"
)

// managedRange is one allocation as the server sees it. Its page k lives
// at file offset fileOff+k*PageSize in every location file of its session
// (the host file, and each device's file), so contiguous pages are
// contiguous in every file.
type managedRange struct {
	sess *session
	id   uint64 // buffer id, unique in the session, never reused
	// start is the range's address in the client. It changes only when
	// the client mremaps the whole range (EventRemap), under sess.mu and
	// every block lock; fileOff never changes.
	start   uintptr
	fileOff int64
	born    time.Time // when the server made it: older fault messages are stale
	length  uintptr   // a multiple of PageSize
	size    int64     // bytes asked for
	flags   uint32

	kind  core.RangeKind
	owner core.Device // the device of device memory

	// launch is the range's attachment and locks under the launch
	// coherence model (coherence.go), guarded by sess.launch.mu.
	launch rangeLaunch

	prefetch      policy.PrefetchPolicy
	trackPrefetch bool
	stats         *core.Counters
	// sweeps tells, per location, whether its faults sweep the range
	// (mover.sweep).
	sweeps []sweepState
	// readAhead is the host's read-ahead of its sweeps (readahead.go).
	readAhead readAheadState

	// freed is set once, under sess.mu and then each block's lock; a
	// fault that finds it set after taking a block lock must not touch
	// anything.
	freed atomic.Bool

	blocks []atomic.Pointer[block] // created on first use
}

// block holds the residency of one 2 MiB block of a range. All fields are
// guarded by mu, which is held across every decision and kernel operation
// that changes where the block's pages are.
type block struct {
	mu    sync.Mutex
	pages int // pages in the block: PagesPerBlock, or fewer at a range's end
	// resident[l] holds the pages with a valid copy at location l. Without
	// read duplication each page is in at most one set.
	resident core.Residency
	// prefetchPending holds pages brought to the host speculatively and
	// installed unmapped, whose use is still unknown (tracking mode).
	prefetchPending core.PageMask
	// lastPrefetch[p] is where page p was last explicitly prefetched to,
	// none if never.
	lastPrefetch [core.PagesPerBlock]core.PageProcessor
	// advice is the block's share of its range's cuMemAdvise state, nil
	// until advice touches the block.
	advice *blockAdvice
	// maps[l] says which file device view l maps over each page, nil
	// while it maps its own everywhere (remote.go).
	maps []*viewMap
	// thrash is the thrashing policy's state of the block, nil until a
	// fault moves a page of the block from one processor to another.
	thrash any
	// ws is the block's refault stamps and protected pages, by
	// processor (workingset.go).
	ws workingset.Block
	// ref is the block as policies see it (policy.Block), made with the
	// block.
	ref *policy.Block
	// hostWrote holds the pages the host wrote (a write fault, or a
	// write to a clean copy): clean eviction duplicates only the others
	// (fault.go cleanCopy).
	hostWrote core.PageMask
	// large has bit l set while location l's file may hold the block in
	// a 2 MiB folio (whole.go: moveWhole), so that a partial punch there
	// checks that the kernel split it. Written under mu; atomic so that
	// the use observer, which holds no block lock, can read it (watch.go).
	large atomic.Uint64
	// watchRegions is set once an eviction policy watches the block's
	// host use by 64 KiB region (watch.go): a MINOR fault of the host
	// view then maps its page's region only, not the whole block, so
	// that the other regions' use still shows. Set by the observer's
	// Watch, without the block's lock.
	watchRegions atomic.Bool
	// watchSample is what the observer's last Watch of the block
	// unmapped on each processor (watch.go): bit l set where it unmapped
	// only a sample, one page of each 64 KiB region, the page at offset
	// watchSample>>watchPhaseShift in each; clear where it unmapped the
	// whole block. Set by Watch, without the block's lock.
	watchSample atomic.Uint64
}

// rangeTable is an immutable, sorted snapshot of a session's ranges. Faults
// look ranges up in it without a lock; control operations publish a new
// one under sess.mu.
type rangeTable struct {
	ranges []*managedRange // sorted by start, disjoint
}

func (r *managedRange) pages() int { return int(r.length / core.PageSize) }

func (r *managedRange) end() uintptr { return r.start + r.length }

// block returns block i, creating it on first use.
func (r *managedRange) block(i int) *block {
	if b := r.blocks[i].Load(); b != nil {
		return b
	}
	b := &block{pages: min(core.PagesPerBlock, r.pages()-i*core.PagesPerBlock), resident: make([]core.PageMask, r.sess.srv.locations())}
	b.ref = policy.NewBlock(r.sess.id, r.start+uintptr(i)*core.BlockSize, b.pages, blockRef{r: r, i: i, b: b})
	if r.blocks[i].CompareAndSwap(nil, b) {
		return b
	}
	return r.blocks[i].Load()
}

// populated reports whether any page of the block has a copy anywhere.
func (b *block) populated() bool { return b.resident.Populated() }

// onDevices returns the pages with a copy on some device.
func (b *block) onDevices() core.PageMask {
	var m core.PageMask
	for l := range b.resident {
		if core.DeviceAtSlot(l) != core.CPU {
			m.Or(&b.resident[l])
		}
	}
	return m
}

// hostDuplicates returns the pages with a copy on the host and on some
// device.
func (b *block) hostDuplicates() core.PageMask {
	m := b.onDevices()
	m.And(&b.resident[core.CPU.Slot()])
	return m
}

// locationOfPage returns where page p is resident, or ok false if it was
// never populated.
func (b *block) locationOfPage(p int) (core.Device, bool) { return b.resident.LocationOf(p) }

// unpopulated returns the pages of mask resident nowhere.
func (b *block) unpopulated(mask core.PageMask) core.PageMask {
	for l := range b.resident {
		mask.AndNot(&b.resident[l])
	}
	return mask
}

func (t *rangeTable) lookup(addr uintptr) *managedRange {
	if t == nil {
		return nil
	}
	rs := t.ranges
	i := sort.Search(len(rs), func(i int) bool { return rs[i].end() > addr })
	if i < len(rs) && rs[i].start <= addr {
		return rs[i]
	}
	return nil
}

func (t *rangeTable) with(r *managedRange) *rangeTable {
	n := &rangeTable{ranges: make([]*managedRange, 0, len(t.ranges)+1)}
	n.ranges = append(n.ranges, t.ranges...)
	n.ranges = append(n.ranges, r)
	sort.Slice(n.ranges, func(i, j int) bool { return n.ranges[i].start < n.ranges[j].start })
	return n
}

func (t *rangeTable) without(r *managedRange) *rangeTable {
	n := &rangeTable{ranges: make([]*managedRange, 0, len(t.ranges))}
	for _, x := range t.ranges {
		if x != r {
			n.ranges = append(n.ranges, x)
		}
	}
	return n
}

// overlapping returns the ranges that meet [start, start+length).
func (t *rangeTable) overlapping(start, length uintptr) []*managedRange {
	var out []*managedRange
	for _, r := range t.ranges {
		if r.start < start+length && start < r.end() {
			out = append(out, r)
		}
	}
	return out
}

// quiesce waits for operations in progress on the range's blocks. A
// thread woken by a resolving ioctl can run before the handler that woke
// it has counted the fault; taking each block lock once orders a reader
// after every such handler.
func (r *managedRange) quiesce() {
	for i := range r.blocks {
		if b := r.blocks[i].Load(); b != nil {
			b.mu.Lock()
			b.mu.Unlock() //nolint:staticcheck // an empty critical section is the point: it is a barrier
		}
	}
}

// releaseReservation gives device memory's capacity back to its arena.
func (r *managedRange) releaseReservation() {
	if r.kind == core.KindDevice {
		r.sess.srv.arenas[r.owner].Release(int64(r.length / core.PageSize))
	}
}
