package lab

import (
	"sort"

	"github.com/softuvm/softuvm/internal/core"
	"github.com/softuvm/softuvm/internal/workingset"
	"github.com/softuvm/softuvm/policy"
)

// The simulated memory: ranges of 2 MiB blocks, each with a page mask
// per location, moved by the server's rules (internal/server: fault.go's
// decision, migrate.go's runs, whole.go's large folios, evict.go's
// eviction) with the policy package's policies making the choices. The
// comments name the server function each step imitates.

// maxLocs is how many locations a replay has room for: the host and
// core.MaxDevices devices.
const maxLocs = core.MaxDevices + 2

// simRange is one allocation of the trace.
type simRange struct {
	id     uint64
	start  uint64
	pages  int
	blocks []*simBlock
	sweeps [maxLocs]sweepState
}

// sweepState is the server's per-range, per-location sweep detector
// (fault.go, sweepState), without atomics: the replay is one thread.
type sweepState struct {
	lo, hi int64 // pages of the range, plus one; 0: none yet
	run    int32
}

// simBlock is one block of a range.
type simBlock struct {
	ref      *policy.Block
	r        *simRange
	index    int
	pages    int
	resident [maxLocs]core.PageMask
	// hostMapped is the pages the host's view maps: resident on the host
	// and not unmapped since (an eviction into the host file, or an arm
	// of the access mode, leaves pages unmapped; a host touch of such a
	// page is then a MINOR fault where the host view registers them).
	hostMapped core.PageMask
	// watchRegions: an eviction policy watches the block's host use by
	// 64 KiB region (hintFaults), so a MINOR fault maps one region.
	watchRegions bool
	// wpMarked is, per device, the pages that left it while its view
	// mapped them, in a move of less than the whole block: the move
	// write-protected them there first, and the kernel keeps that
	// protection as a marker in the page table when the page is punched
	// (a whole move clears them). A page that comes back without the
	// device's own install (an eviction from the host) is mapped
	// read-only on touch, and the device's first write to it is a
	// write-protect fault.
	wpMarked [maxLocs]core.PageMask
	// unmapped is, per device, the pages its file holds that its view
	// does not map: they arrived without it (an eviction from the host).
	// Where the device's view registers MINOR faults over its own file
	// (sim.deviceMinor), the device's first touch of one is a MINOR
	// fault that maps every such page of the block, and maps it writable
	// over any marker; elsewhere the kernel maps it, and wpMarked says
	// what the first write costs.
	unmapped [maxLocs]core.PageMask
	// large has bit l.Slot() where location l may hold the block in one
	// 2 MiB folio (server: block.large).
	large  uint64
	thrash any
	// ws is the block's refault stamps and protected pages
	// (workingset.go).
	ws workingset.Block
}

func (b *simBlock) firstPage() int { return b.index * core.PagesPerBlock }

// populated reports whether any page of the block lives anywhere.
func (b *simBlock) populated() bool { return core.Residency(b.resident[:]).Populated() }

// locationOfPage is where page p lives, and whether it lives anywhere.
func (b *simBlock) locationOfPage(p int) (core.Device, bool) {
	return core.Residency(b.resident[:]).LocationOf(p)
}

// lookup finds the range holding addr.
func (s *sim) lookup(addr uint64) *simRange {
	if r := s.lastRange; r != nil && addr >= r.start && addr < r.start+uint64(r.pages)*core.PageSize {
		return r
	}
	i := sort.Search(len(s.ranges), func(i int) bool { return s.ranges[i].start > addr }) - 1
	if i < 0 {
		return nil
	}
	r := s.ranges[i]
	if addr >= r.start+uint64(r.pages)*core.PageSize {
		return nil
	}
	s.lastRange = r
	return r
}

// block returns the range's block i, made on first use.
func (s *sim) block(r *simRange, i int) *simBlock {
	b := r.blocks[i]
	if b == nil {
		pages := min(core.PagesPerBlock, r.pages-i*core.PagesPerBlock)
		b = &simBlock{r: r, index: i, pages: pages}
		b.ref = policy.NewBlock(r.id, uintptr(r.start)+uintptr(i)*core.BlockSize, pages, b)
		r.blocks[i] = b
	}
	return b
}

// addRange adds an allocation; one at an address a live range covers
// replaces it (a trace whose free was lost).
func (s *sim) addRange(id, start, bytes uint64) {
	if old := s.lookup(start); old != nil {
		s.freeRange(old)
	}
	pages := int((bytes + core.PageSize - 1) / core.PageSize)
	r := &simRange{id: id, start: start, pages: pages, blocks: make([]*simBlock, (pages+core.PagesPerBlock-1)/core.PagesPerBlock)}
	i := sort.Search(len(s.ranges), func(i int) bool { return s.ranges[i].start > start })
	s.ranges = append(s.ranges, nil)
	copy(s.ranges[i+1:], s.ranges[i:])
	s.ranges[i] = r
	s.byID[id] = r
}

// freeRange drops an allocation: its pages leave every location.
func (s *sim) freeRange(r *simRange) {
	var all core.PageMask
	all.FillRange(0, core.PagesPerBlock)
	for _, b := range r.blocks {
		if b != nil {
			s.dropPages(b, all)
		}
	}
	i := sort.Search(len(s.ranges), func(i int) bool { return s.ranges[i].start >= r.start })
	if i < len(s.ranges) && s.ranges[i] == r {
		s.ranges = append(s.ranges[:i], s.ranges[i+1:]...)
	}
	delete(s.byID, r.id)
	if s.lastRange == r {
		s.lastRange = nil
	}
}

// discard is the server's session.discard: every location's copies of
// pages [addr, addr+pages) go, and their next touch is a first touch.
func (s *sim) discard(addr uint64, pages uint32) {
	for p := uint64(0); p < uint64(pages); {
		a := addr + p*core.PageSize
		r := s.lookup(a)
		if r == nil {
			p++
			continue
		}
		page := int((a - r.start) / core.PageSize)
		bi, first := page/core.PagesPerBlock, page%core.PagesPerBlock
		n := min(core.PagesPerBlock-first, r.pages-page, int(uint64(pages)-p))
		if b := r.blocks[bi]; b != nil {
			var gone core.PageMask
			gone.FillRange(first, first+n)
			s.dropPages(b, gone)
		}
		p += uint64(n)
	}
}

// dropPages drops every location's copies of b's pages of gone (a free,
// a discard), telling the eviction policies.
func (s *sim) dropPages(b *simBlock, gone core.PageMask) {
	for l := range b.resident {
		x := b.resident[l]
		x.And(&gone)
		if x.Empty() {
			continue
		}
		loc := core.DeviceAtSlot(l)
		s.used[l] -= int64(x.Count())
		b.resident[l].AndNot(&x)
		b.unmapped[l].AndNot(&x)
		s.departed(b, loc, x)
	}
	b.hostMapped.AndNot(&gone)
}

// mover is one operation on one block, as the server's mover is.
type mover struct {
	s     *sim
	b     *simBlock
	cause policy.Cause
	// fault is whether the move serves a fault (the thrashing policy
	// hears of it, and the host view maps what arrives).
	fault bool
	// via reports that what arrives is mapped by the destination's view
	// (a fault, a prefetch); an eviction leaves it unmapped.
	via bool
	// demand is the pages the fault asked for: the evidence of a
	// refault (workingset.go).
	demand core.PageMask
}

// sweep is the server's mover.sweep: whether location m's fault at page
// p continues a sweep; full says that m has no room to spare.
func (o *mover) sweep(m core.Device, p int, full bool) bool {
	st := &o.b.r.sweeps[m.Slot()]
	n, sweeping := policy.SweepStep(st.lo-1, st.hi-1, st.run, int64(o.b.firstPage()+p), full)
	st.run = n
	return sweeping
}

// noteFetch is the server's mover.noteFetch.
func (o *mover) noteFetch(m core.Device, pages core.PageMask) {
	first, last := pages.NextSet(0), pages.LastSet()
	if first >= 0 {
		st := &o.b.r.sweeps[m.Slot()]
		st.lo = int64(o.b.firstPage()+first) + 1
		st.hi = int64(o.b.firstPage()+last) + 1
	}
}

// folioBlock: a whole block, which a large folio can hold. The server
// also asks that the block be 2 MiB-aligned in its file; managed ranges
// start block-aligned in their files.
func (o *mover) folioBlock() bool { return o.s.largeFolios && o.b.pages == core.PagesPerBlock }

// largeElsewhere is the server's mover.largeElsewhere.
func (o *mover) largeElsewhere(m core.Device) bool {
	b := o.b
	if b.large == 0 || !o.folioBlock() || !o.wholeFits(m) {
		return false
	}
	holder, whole := core.Residency(b.resident[:]).SoleHolder(b.pages)
	return whole && holder != m && b.large&(1<<holder.Slot()) != 0
}

// wholeFits is the server's mover.wholeFits.
func (o *mover) wholeFits(m core.Device) bool {
	if o.s.roomFor(m, core.PagesPerBlock) {
		return true
	}
	if m != core.CPU {
		return false
	}
	_, ok := o.s.roomiestDevice(core.PagesPerBlock)
	return ok
}

// roomFor reports whether location l has room for n more pages without
// evicting: a device within its capacity, the host within its budget.
func (s *sim) roomFor(l core.Device, n int64) bool {
	if l == core.CPU {
		return s.hostBudget <= 0 || (s.used[l.Slot()]+n)*core.PageSize <= s.hostBudget
	}
	return s.used[l.Slot()]+n <= s.capacity
}

// roomiestDevice is the server's Server.roomiestDevice.
func (s *sim) roomiestDevice(n int64) (core.Device, bool) {
	best, room := core.Device(0), int64(0)
	for d := 0; d < s.devices; d++ {
		if free := s.capacity - s.used[core.Device(d).Slot()]; free >= n && free > room {
			best, room = core.Device(d), free
		}
	}
	return best, room > 0
}

// expand is the server's mover.expand: the prefetch policy's pages to
// bring to m with the faulted ones.
func (o *mover) expand(m core.Device, faulted core.PageMask) core.PageMask {
	b := o.b
	s := o.s
	ctx := &s.prefetchCtx
	full := !s.roomFor(m, policy.FullRoomBlocks*core.PagesPerBlock)
	elsewhere, here := core.Residency(b.resident[:]).Elsewhere(m), b.resident[m.Slot()]
	*ctx = policy.PrefetchContext{Block: b.ref, Processor: m, Now: s.now, Pages: b.pages, Faulted: faulted,
		ResidentOnDest: here, Populated: !elsewhere.Empty() || !here.Empty(),
		Elsewhere: elsewhere, Full: full,
		SourceLarge: o.largeElsewhere(m), Sweep: o.sweep(m, faulted.NextSet(0), full)}
	if s.thrashing != nil && b.thrash != nil {
		s.thrashing.Avoid(b.thrash, b.pages, s.now, &ctx.Thrashing)
	}
	extra, brought := policy.Expanded(s.prefetch, ctx)
	o.noteFetch(m, brought)
	return extra
}

// moveTo is the server's mover.moveTo: move, then keep the host within
// its budget.
func (o *mover) moveTo(dst core.Device, demand, speculative core.PageMask) bool {
	keep := demand
	keep.Or(&speculative)
	o.s.keep = keep
	moved, ok := o.move(dst, demand, speculative)
	if dst == core.CPU && moved > 0 {
		o.overBudget(keep)
	}
	return ok
}

// move is the server's mover.move: reserve room on a device (evicting
// there), then move run by run. It returns the pages moved, and false
// where a device had no room even for the demanded pages (the server
// fails the fault: SIGBUS).
func (o *mover) move(dst core.Device, demand, speculative core.PageMask) (int64, bool) {
	b := o.b
	want := demand
	want.Or(&speculative)
	want.AndNot(&b.resident[dst.Slot()])
	need := int64(want.Count())
	if need == 0 {
		return 0, true
	}
	if dst != core.CPU && !o.s.reserve(o, dst, need, want) {
		if speculative.Empty() {
			return 0, false
		}
		speculative = core.PageMask{}
		want = demand
		want.AndNot(&b.resident[dst.Slot()])
		if need = int64(want.Count()); need == 0 {
			return 0, true
		}
		if !o.s.reserve(o, dst, need, want) {
			return 0, false
		}
	}
	var moved int64
	for p := want.NextSet(0); p >= 0; {
		first := p
		src, populated := b.locationOfPage(p)
		for p++; p < b.pages && want.Test(p); p++ {
			if s, pop := b.locationOfPage(p); s != src || pop != populated {
				break
			}
		}
		moved += o.moveRun(first, p, src, populated, dst, &want, &speculative)
		if p >= b.pages {
			break
		}
		p = want.NextSet(p)
	}
	return moved, true
}

// moveRun moves pages [first, outer) of want, all at src (or nowhere:
// populated false), to dst, and accounts them (the server's moveRun and
// account).
func (o *mover) moveRun(first, outer int, src core.Device, populated bool, dst core.Device, want, speculative *core.PageMask) int64 {
	b := o.b
	s := o.s
	var done core.PageMask
	done.FillRange(first, outer)
	done.And(want)
	n := done.Count()
	whole := first == 0 && outer == core.PagesPerBlock && o.folioBlock()
	switch {
	case whole:
		// One folio leaves (where the source held one) and one arrives.
		if populated {
			b.large &^= 1 << src.Slot()
			s.res.WholeBlocks++
			if dst == core.CPU {
				s.res.WholeToHost++
			} else {
				s.res.WholeToDevice++
			}
		}
		b.large |= 1 << dst.Slot()
	case populated && b.large&(1<<src.Slot()) != 0:
		// A partial move out of a large folio rebuilds the rest of it in
		// 4 KiB folios first (whole.go, breakLarge).
		b.large &^= 1 << src.Slot()
		s.res.FoliosRebuilt++
	}
	for l := range b.resident {
		b.resident[l].AndNot(&done)
	}
	b.resident[dst.Slot()].Or(&done)
	if dst == core.CPU {
		if o.via {
			b.hostMapped.Or(&done)
		} else {
			b.hostMapped.AndNot(&done)
		}
	}
	s.used[dst.Slot()] += int64(n)
	if dst != core.CPU {
		if o.via {
			b.wpMarked[dst.Slot()].AndNot(&done) // installed afresh through its view
			b.unmapped[dst.Slot()].AndNot(&done)
		} else {
			b.unmapped[dst.Slot()].Or(&done)
		}
	}
	if populated {
		s.used[src.Slot()] -= int64(n)
		b.unmapped[src.Slot()].AndNot(&done)
		if src != core.CPU && !whole {
			// A whole move clears the markers it would leave
			// (the server's releaseWhole).
			b.wpMarked[src.Slot()].Or(&done)
		}
		if src == core.CPU {
			b.hostMapped.AndNot(&done)
		}
		s.departed(b, src, done)
	}
	o.arrived(dst, done)
	if !populated {
		s.res.Populated[dst.Slot()] += uint64(n)
	} else {
		s.res.addMoved(src, dst, o.cause, n)
		if o.fault && s.thrashing != nil {
			if b.thrash == nil {
				b.thrash = s.thrashing.NewState()
			}
			s.thrashing.Migrated(b.thrash, done, s.now)
		}
	}
	spec := done
	spec.And(speculative)
	if k := spec.Count(); k > 0 {
		s.res.Prefetched += uint64(k)
	}
	return int64(n)
}

// reserve makes room for need pages on device dst (the server's
// reserveOrEvict): evict from it until they fit.
func (s *sim) reserve(o *mover, dst core.Device, need int64, keep core.PageMask) bool {
	if s.roomFor(dst, need) {
		return true
	}
	s.releaseProtections(dst)
	want := s.used[dst.Slot()] + need - s.capacity
	if s.evict(o, dst, want) == 0 {
		// Nothing the policy offered: the server's last resort.
		s.lastResort(o, dst, want, keep)
	}
	return s.roomFor(dst, need)
}

// overBudget is the server's mover.overBudget: host pages over the
// budget leave for the roomiest device; where no other block can give
// enough, and some device has room for a block, the last resort.
func (o *mover) overBudget(keep core.PageMask) {
	s := o.s
	want := core.PagesOverBudget(s.used[core.CPU.Slot()], s.hostBudget)
	if want == 0 {
		return
	}
	s.releaseProtections(core.CPU)
	moved := s.evict(o, core.CPU, want)
	if moved >= want || s.devicesFull() {
		return
	}
	s.lastResort(o, core.CPU, want-moved, keep)
}

// devicesFull is the server's Server.devicesFull: no device has room
// for a block (on one smaller than two blocks, for half of it).
func (s *sim) devicesFull() bool {
	for d := 0; d < s.devices; d++ {
		if s.capacity-s.used[core.Device(d).Slot()] >= min(core.PagesPerBlock, s.capacity/2) {
			return false
		}
	}
	return true
}

// victims asks the eviction policy for victims (Server.victims).
func (s *sim) victims(from core.Device, want int64, out []policy.Victim) []policy.Victim {
	return policy.AskVictims(s.eviction, s.pageEviction, from, want, out)
}

// evict is the server's mover.evict: victims leave location from until
// want pages did, the mover's own block spared.
func (s *sim) evict(o *mover, from core.Device, want int64) (moved int64) {
	var buf [32]policy.Victim
	saved := s.serving
	s.serving = o.b
	defer func() { s.serving = saved }()
	for round := 0; moved < want && round < 64; round++ {
		victims := s.victims(from, want-moved, buf[:0])
		if len(victims) == 0 {
			break
		}
		progress, own := false, false
		for _, vic := range victims {
			v, ok := vic.Block.Owner().(*simBlock)
			if !ok || v.ref != vic.Block {
				s.res.BadVictims++
				continue
			}
			if moved >= want {
				break
			}
			pages := vic.Pages
			if v == o.b {
				if !s.evictsOwn {
					own = true
					continue
				}
				// The oracle may take the block being served, all but
				// the pages this move brings.
				pages.AndNot(&s.keep)
			}
			pages.And(&v.resident[from.Slot()])
			if pages.Empty() {
				if s.pageEviction != nil {
					s.pageEviction.LeftPages(v.ref, from, vic.Pages)
				}
				if v.resident[from.Slot()].Empty() {
					s.eviction.Left(vic.Block, from)
				}
				continue
			}
			if n := s.evictPages(v, from, pages, false); n > 0 {
				progress = true
				moved += n
			}
		}
		if !progress && (!own || s.pageEviction == nil) {
			break
		}
	}
	return moved
}

// evictPages is the server's evictPages: pages of b at from go to the
// host (from a device) or to the roomiest device (from the host), into
// the destination's file, unmapped, but for those protected there
// unless demote; those that left are stamped for their refaults.
func (s *sim) evictPages(b *simBlock, from core.Device, pages core.PageMask, demote bool) int64 {
	pages.And(&b.resident[from.Slot()])
	if !demote {
		protected := s.ws.Protected(&b.ws, from.Slot())
		pages.AndNot(&protected)
	}
	n := int64(pages.Count())
	if n == 0 {
		return 0
	}
	dst := core.CPU
	if from == core.CPU {
		var ok bool
		if dst, ok = s.roomiestDevice(n); !ok {
			return 0
		}
	}
	held := b.resident[from.Slot()]
	before := held.Count()
	op := mover{s: s, b: b, cause: policy.CauseEviction}
	op.move(dst, pages, core.PageMask{})
	evicted := int64(before - b.resident[from.Slot()].Count())
	gone := held
	gone.AndNot(&b.resident[from.Slot()])
	s.ws.Evicted(&b.ws, from.Slot(), maxLocs, gone)
	s.res.Evicted[from.Slot()] += uint64(evicted)
	if evicted > 0 {
		s.res.Evictions++
	}
	return evicted
}

// hintFaults is the server's policy.Observer (internal/server/watch.go)
// over the simulated page table: Watch unmaps a block's host pages, a
// reference maps them again (a MINOR fault where the host view registers
// them: the block's pages, or the touched page's 64 KiB region where a
// policy watches by region), and Touched returns those mapped. It sees
// only the references the trace holds: a touch that neither faulted nor
// was sampled by the access mode does not show, so a watched block looks
// less used than it was.
type hintFaults struct{ s *sim }

func (h hintFaults) Watchable(p policy.Processor) bool { return p == core.CPU }

func (h hintFaults) Watch(pb *policy.Block, p policy.Processor, regions bool) bool {
	b, ok := pb.Owner().(*simBlock)
	if !ok || b.ref != pb || p != core.CPU {
		return false
	}
	b.hostMapped = core.PageMask{}
	b.watchRegions = regions
	return true
}

func (h hintFaults) Touched(pb *policy.Block, p policy.Processor) core.PageMask {
	b, ok := pb.Owner().(*simBlock)
	if !ok || b.ref != pb || p != core.CPU {
		return core.PageMask{}
	}
	m := b.hostMapped
	m.And(&b.resident[core.CPU.Slot()])
	return m
}
