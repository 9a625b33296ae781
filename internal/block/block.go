package block

import (
	"sync"
	"sync/atomic"

	"github.com/softuvm/softuvm/internal/core"
	"github.com/softuvm/softuvm/internal/workingset"
	"github.com/softuvm/softuvm/policy"
)

// Range is one allocation as the engine sees it. Its page k lives at
// file offset FileOff+k*PageSize in every location file of its space,
// so contiguous pages are contiguous in every file.
type Range struct {
	// Space is the memory the range lives in: the client session's
	// files and views (the server's) or the lab's simulated page
	// tables.
	Space Memory
	// Ext is what the range's owner keeps with it (the server's
	// managedRange); the engine never looks at it.
	Ext     any
	Session uint64 // the space's id, as policies see it (policy.Block)
	ID      uint64 // the allocation's id, unique in its space
	// Start is the range's address in the client; FileOff never changes.
	Start   uintptr
	FileOff int64
	Length  uintptr // a multiple of PageSize
	Kind    core.RangeKind
	Owner   core.Device // the device of device memory

	Prefetch      policy.PrefetchPolicy
	TrackPrefetch bool
	Stats         *core.Counters
	// Freed is set once, under each block's lock; a fault that finds it
	// set after taking a block lock must not touch anything.
	Freed atomic.Bool

	eng    *Engine
	sweeps []sweepState
	ahead  readAheadState
	blocks []atomic.Pointer[Block] // created on first use
}

// NewRange makes the engine's record of an allocation of length bytes
// (a multiple of PageSize) at start; the caller fills in the rest of
// the fields before the range is used.
func (e *Engine) NewRange(space Memory, start uintptr, length uintptr) *Range {
	return &Range{Space: space, Start: start, FileOff: int64(start), Length: length, Stats: core.NewCounters(e.locs),
		eng: e, sweeps: make([]sweepState, e.locs), blocks: make([]atomic.Pointer[Block], (length+core.BlockSize-1)/core.BlockSize)}
}

// Engine is the engine the range belongs to.
func (r *Range) Engine() *Engine { return r.eng }

// Pages is the range's page count.
func (r *Range) Pages() int { return int(r.Length / core.PageSize) }

// End is the address past the range.
func (r *Range) End() uintptr { return r.Start + r.Length }

// Blocks is the range's block count.
func (r *Range) Blocks() int { return len(r.blocks) }

// BlockAt returns block i, nil if it was never used.
func (r *Range) BlockAt(i int) *Block { return r.blocks[i].Load() }

// Block returns block i, creating it on first use.
func (r *Range) Block(i int) *Block {
	if b := r.blocks[i].Load(); b != nil {
		return b
	}
	b := &Block{Pages: min(core.PagesPerBlock, r.Pages()-i*core.PagesPerBlock), Resident: make([]core.PageMask, r.eng.locs)}
	b.Ref = policy.NewBlock(r.Session, r.Start+uintptr(i)*core.BlockSize, b.Pages, Ref{R: r, I: i, B: b})
	if r.blocks[i].CompareAndSwap(nil, b) {
		return b
	}
	return r.blocks[i].Load()
}

// Quiesce waits for operations in progress on the range's blocks. A
// thread woken by a resolving ioctl can run before the handler that woke
// it has counted the fault; taking each block lock once orders a reader
// after every such handler.
func (r *Range) Quiesce() {
	for i := range r.blocks {
		if b := r.blocks[i].Load(); b != nil {
			b.Lock()
			b.Unlock() //nolint:staticcheck // an empty critical section is the point: it is a barrier
		}
	}
}

// Free forgets the range as it is freed: each block, under its lock, is
// marked freed, its protections end and the eviction policy forgets it;
// the host's count loses its pages. It returns the pages it held at each
// location slot: the caller releases the devices' arenas once their files
// have let them go.
func (r *Range) Free() []int64 {
	resident := make([]int64, r.eng.locs)
	for i := range r.blocks {
		b := r.blocks[i].Load()
		if b == nil {
			continue
		}
		b.Lock()
		r.Freed.Store(true)
		o := r.NewMover(i, b)
		o.Free(resident)
		b.Unlock()
	}
	r.Freed.Store(true)
	r.eng.hostPages.Add(-resident[core.CPU.Slot()])
	return resident
}

// Ref names a block of a range: the owner of its policy.Block.
type Ref struct {
	R *Range
	I int
	B *Block
}

// RefOf returns the block a policy names, ok false where it is not one
// of the engine's (a policy's mistake).
func RefOf(pb *policy.Block) (Ref, bool) {
	v, ok := pb.Owner().(Ref)
	return v, ok && v.B.Ref == pb
}

// Block holds the residency of one 2 MiB block of a range. Its lock is
// held across every decision and kernel operation that changes where
// the block's pages are, and guards every field but those said to be
// atomic.
type Block struct {
	sync.Mutex
	Pages int // pages in the block: PagesPerBlock, or fewer at a range's end
	// Resident[l] holds the pages with a valid copy at location slot l.
	// Without read duplication each page is in at most one set.
	Resident core.Residency
	// PrefetchPending holds pages brought to the host speculatively and
	// installed unmapped, whose use is still unknown (tracking mode).
	PrefetchPending core.PageMask
	// LastPrefetch[p] is where page p was last explicitly prefetched to,
	// none if never.
	LastPrefetch [core.PagesPerBlock]core.PageProcessor
	// Advice is the block's share of its range's cuMemAdvise state, nil
	// until advice touches the block.
	Advice *Advice
	// maps[l] says which file device view l maps over each page, nil
	// while it maps its own everywhere (remote.go).
	maps []*viewMap
	// thrash is the thrashing policy's state of the block, nil until a
	// fault moves a page of the block from one processor to another.
	thrash any
	// ws is the block's refault stamps and protected pages, by
	// processor (workingset.go).
	ws workingset.Block
	// Ref is the block as policies see it (policy.Block), made with the
	// block.
	Ref *policy.Block
	// HostWrote holds the pages the host wrote (a write fault, or a
	// write to a clean copy): clean eviction duplicates only the others
	// (clean.go).
	HostWrote core.PageMask
	// large has bit l set while location l's file may hold the block in
	// a 2 MiB folio (whole.go), so that a partial punch there rebuilds
	// it first. Written under the lock; atomic so that the use observer,
	// which holds no block lock, can read it.
	large atomic.Uint64
	// WatchRegions is set once an eviction policy watches the block's
	// host use by 64 KiB region: a MINOR fault of the host view then
	// maps its page's region only, not the whole block, so that the
	// other regions' use still shows. Set by the observer's Watch,
	// without the block's lock.
	WatchRegions atomic.Bool
	// WatchSample is what the observer's last Watch of the block
	// unmapped on each processor: bit l set where it unmapped only a
	// sample, one page of each 64 KiB region, the page at offset
	// WatchSample>>WatchPhaseShift in each; clear where it unmapped the
	// whole block. Set by Watch, without the block's lock.
	WatchSample atomic.Uint64
	// Memory is what the memory implementation keeps per block (the
	// lab's simulated page tables); nil in the server.
	Memory any
}

// WatchPhaseShift is where Block.WatchSample keeps the sample's page
// offset within each region, above a bit per processor.
const WatchPhaseShift = 32

// Populated reports whether any page of the block has a copy anywhere.
func (b *Block) Populated() bool { return b.Resident.Populated() }

// OnDevices returns the pages with a copy on some device.
func (b *Block) OnDevices() core.PageMask {
	var m core.PageMask
	for l := range b.Resident {
		if core.DeviceAtSlot(l) != core.CPU {
			m.Or(&b.Resident[l])
		}
	}
	return m
}

// HostDuplicates returns the pages with a copy on the host and on some
// device.
func (b *Block) HostDuplicates() core.PageMask {
	m := b.OnDevices()
	m.And(&b.Resident[core.CPU.Slot()])
	return m
}

// LocationOf returns where page p is resident, or ok false if it was
// never populated.
func (b *Block) LocationOf(p int) (core.Device, bool) { return b.Resident.LocationOf(p) }

// SoleLocation returns where page p lives if it has exactly one copy.
func (b *Block) SoleLocation(p int) (core.Device, bool) {
	at, n := core.Device(0), 0
	for l := range b.Resident {
		if b.Resident[l].Test(p) {
			at = core.DeviceAtSlot(l)
			n++
		}
	}
	return at, n == 1
}

// Copies returns how many locations hold page p.
func (b *Block) Copies(p int) int {
	n := 0
	for l := range b.Resident {
		if b.Resident[l].Test(p) {
			n++
		}
	}
	return n
}

// Duplicated returns the pages with more than one copy.
func (b *Block) Duplicated() core.PageMask {
	var seen, dup core.PageMask
	for l := range b.Resident {
		x := b.Resident[l]
		x.And(&seen)
		dup.Or(&x)
		seen.Or(&b.Resident[l])
	}
	return dup
}

// MayBeLargeAt reports whether location l's file may hold the block in a
// 2 MiB folio: l took it whole (or adopted it). Read without the lock by
// the use observer.
func (b *Block) MayBeLargeAt(l core.Device) bool { return b.large.Load()&(1<<l.Slot()) != 0 }

// MarkLarge records that every location's file may hold the block in a
// 2 MiB folio: a server taking over does not know which blocks its
// predecessor moved whole. The block's lock is held.
func (b *Block) MarkLarge() { b.large.Store(^uint64(0)) }

// PreferredAt returns page p's preferred location, ok false for none.
func (b *Block) PreferredAt(p int) (core.Device, bool) {
	if b.Advice == nil {
		return 0, false
	}
	return b.Advice.Preferred[p].Device()
}

// Advice is one block's share of its range's advice.
type Advice struct {
	ReadMostly core.PageMask
	Preferred  [core.PagesPerBlock]core.PageProcessor // the preferred location, if any
	AccessedBy []core.PageMask                        // by processor slot
	// Remote is set once preferred-location or accessed-by advice
	// touched the block: device mappings may then follow residency.
	Remote bool
}

// AdviceOf returns the block's advice, made on first use. The block's
// lock is held.
func (b *Block) AdviceOf() *Advice {
	if b.Advice == nil {
		b.Advice = &Advice{AccessedBy: make([]core.PageMask, len(b.Resident))}
	}
	return b.Advice
}
