package workingset

import (
	"cmp"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/softuvm/softuvm/internal/core"
)

// Stamps: the low 31 bits of a count, eviction stamps plain and arrival
// stamps with the top bit set, so that neither is read as the other.
const (
	arrivalStamp = 1 << 31
	stampMask    = arrivalStamp - 1
)

// Limits are what a processor's thrashing policy (policy.Refaulting)
// sets for its capacity, in pages.
type Limits struct {
	// Capacity is what the processor may hold: the host's budget, a
	// device's arena.
	Capacity int64
	// Recent is the longest refault distance that counts as too early
	// an eviction.
	Recent int64
	// Protect is the most pages protected at once.
	Protect int64
	// Age is the evictions a generation lasts: a protection ends at the
	// end of the generation after the one it began in.
	Age int64
}

// Set is the working-set state of every processor (by core.Device
// slot) of a server or a replay. O names a block to its owner (the
// server's block reference, the replay's block): the lists of blocks
// with protected pages hold them, for the owner to lock and release.
type Set[O comparable] struct {
	procs []proc[O]
}

type proc[O comparable] struct {
	// evictions is the processor's eviction clock: pages evicted.
	evictions atomic.Uint64
	// arrivals counts the arrivals on the processor (calls of Arrived),
	// for the order in which a block's pages arrived (OldestPages).
	arrivals atomic.Uint32
	// protected counts the pages protected now, those of a generation
	// that has ended taken off at its end (their blocks are released
	// later, under their locks).
	protected atomic.Int64
	// limits is nil until set: no protection (the stamps are kept, and
	// refaults measured, all the same).
	limits atomic.Pointer[Limits]

	// gen is the current generation: evictions / limits.Age, as last
	// advanced; written under mu, read without it on the fault path.
	gen atomic.Uint64

	mu sync.Mutex // guards what follows; a leaf
	// byGen[g%3] counts the pages protected in generation g that are
	// still protected, for the current generation and the one before.
	byGen [3]int64
	// joined[g%3] lists the blocks that protected pages in generation
	// g, each once.
	joined [3][]O
	// due lists blocks whose protections ended with their generation:
	// their owners release them (Release) under their locks.
	due []O
}

// NewSet makes the state of locations processors, none with limits.
func NewSet[O comparable](locations int) *Set[O] {
	return &Set[O]{procs: make([]proc[O], locations)}
}

// SetLimits sets processor slot's limits, before any page of it
// arrives. A processor with limits (a capacity, that is: one that may
// evict) keeps the order in which pages arrive (OldestPages) and tells
// refaults recent from far; one whose limits have Age or Protect 0
// protects nothing.
func (s *Set[O]) SetLimits(slot int, l Limits) {
	p := &s.procs[slot]
	if l.Age <= 0 || l.Protect <= 0 {
		l.Age, l.Protect = 0, 0
	}
	p.limits.Store(&l)
	if l.Age > 0 {
		p.mu.Lock()
		p.gen.Store(p.evictions.Load() / uint64(l.Age))
		p.mu.Unlock()
	}
}

// Limits returns processor slot's limits, and false where it protects
// nothing.
func (s *Set[O]) Limits(slot int) (Limits, bool) {
	if l := s.procs[slot].limits.Load(); l != nil && l.Protect > 0 {
		return *l, true
	}
	return Limits{}, false
}

// Evictions is processor slot's eviction clock.
func (s *Set[O]) Evictions(slot int) uint64 { return s.procs[slot].evictions.Load() }

// ProtectedPages is how many pages processor slot protects now.
func (s *Set[O]) ProtectedPages(slot int) int64 {
	p := &s.procs[slot]
	p.generation()
	return p.protected.Load()
}

// generation is processor p's current generation, advancing it (and
// ending the protections of the generation before the last) where its
// clock has moved on.
func (p *proc[O]) generation() uint64 {
	l := p.limits.Load()
	if l == nil || l.Age == 0 {
		return 0
	}
	now := p.evictions.Load() / uint64(l.Age)
	if g := p.gen.Load(); g >= now {
		return g // the common case, without the lock
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	for g := p.gen.Load(); g < now; g++ {
		// Generation g-1 ends: its pages are protected no more.
		old := (g + 2) % 3 // == (g-1)%3
		p.protected.Add(-p.byGen[old])
		p.byGen[old] = 0
		p.due = append(p.due, p.joined[old]...)
		clear(p.joined[old])
		p.joined[old] = p.joined[old][:0]
		p.gen.Store(g + 1)
	}
	return p.gen.Load()
}

// Block is one block's working-set state, by processor slot. The
// block's lock guards it; the zero value is ready.
type Block struct {
	procs []*blockProc
}

// blockProc is a block's state on one processor.
type blockProc struct {
	// stamp[i] is, for page i not on the processor, the eviction clock,
	// plus one, when it was last evicted from it (its low 31 bits), 0
	// where it has not been since it left; for page i on the processor,
	// the arrival count when it arrived (where the processor has
	// limits), with arrivalStamp set.
	stamp [core.PagesPerBlock]uint32
	// gen is the generation of protect[0]; protect[1] is gen-1's.
	gen     uint64
	protect [2]core.PageMask
	// expired holds pages whose protection ended that the owner has not
	// released yet.
	expired core.PageMask
	// listed is the generation, plus one, that last listed the block as
	// protecting pages (proc.joined).
	listed uint64
}

func (b *Block) on(slot, locations int) *blockProc {
	if b.procs == nil {
		b.procs = make([]*blockProc, locations)
	}
	bp := b.procs[slot]
	if bp == nil {
		bp = &blockProc{}
		b.procs[slot] = bp
	}
	return bp
}

// peek returns the block's state on slot without making it.
func (b *Block) peek(slot int) *blockProc {
	if slot < len(b.procs) {
		return b.procs[slot]
	}
	return nil
}

// sync brings bp to generation g: protections of generations before
// g-1 end, into expired.
func (bp *blockProc) sync(g uint64) {
	switch {
	case bp.gen == g:
	case bp.gen+1 == g:
		bp.expired.Or(&bp.protect[1])
		bp.protect[1], bp.protect[0] = bp.protect[0], core.PageMask{}
	default:
		bp.expired.Or(&bp.protect[0])
		bp.expired.Or(&bp.protect[1])
		bp.protect = [2]core.PageMask{}
	}
	bp.gen = g
}

// hidden is the pages the eviction policy does not see: protected, or
// whose protection ended and that the owner has not released.
func (bp *blockProc) hidden() core.PageMask {
	m := bp.protect[0]
	m.Or(&bp.protect[1])
	m.Or(&bp.expired)
	return m
}

// Protected returns the pages of b that slot protects now.
func (s *Set[O]) Protected(b *Block, slot int) core.PageMask {
	bp := b.peek(slot)
	if bp == nil {
		return core.PageMask{}
	}
	bp.sync(s.procs[slot].generation())
	m := bp.protect[0]
	m.Or(&bp.protect[1])
	return m
}

// Hidden returns the pages of b on slot that its eviction policy does
// not see: those protected, and those whose protection has ended and
// that have not been released (Release) yet.
func (s *Set[O]) Hidden(b *Block, slot int) core.PageMask {
	bp := b.peek(slot)
	if bp == nil {
		return core.PageMask{}
	}
	bp.sync(s.procs[slot].generation())
	return bp.hidden()
}

// unprotect ends the protection of pages of bp on p, counting them off
// the generations they were protected in (not those already ended), and
// returns the pages that were hidden.
func (p *proc[O]) unprotect(bp *blockProc, pages *core.PageMask) core.PageMask {
	g := bp.gen
	var was core.PageMask
	for i := range bp.protect {
		m := bp.protect[i]
		m.And(pages)
		if n := m.Count(); n > 0 && g >= uint64(i) {
			p.mu.Lock()
			// A generation that ended since bp was synced took its pages
			// off already.
			if g-uint64(i)+1 >= p.gen.Load() {
				p.byGen[(g-uint64(i))%3] -= int64(n)
				p.protected.Add(-int64(n))
			}
			p.mu.Unlock()
			bp.protect[i].AndNot(pages)
			was.Or(&m)
		}
	}
	m := bp.expired
	m.And(pages)
	bp.expired.AndNot(pages)
	was.Or(&m)
	return was
}

// Evicted records that pages of b left slot by eviction: each gets
// its stamp, and the clock advances by their count. Pages that were
// protected lose their protection (a demotion where nothing else could
// give room).
func (s *Set[O]) Evicted(b *Block, slot, locations int, pages core.PageMask) {
	n := pages.Count()
	if n == 0 {
		return
	}
	p := &s.procs[slot]
	bp := b.on(slot, locations)
	bp.sync(p.generation())
	p.unprotect(bp, &pages)
	stamp := (uint32(p.evictions.Add(uint64(n))) + 1) & stampMask
	if stamp == 0 {
		stamp = 1 // 0 means no stamp
	}
	for i := pages.NextSet(0); i >= 0; i = pages.NextSet(i + 1) {
		bp.stamp[i] = stamp
	}
	p.generation()
}

// Left records that pages of b left slot other than by eviction (a
// fault or a prefetch moved them, a discard, a free): their protection
// ends and their stamps are forgotten. It returns those that were
// hidden from the eviction policy, which must not hear of them.
func (s *Set[O]) Left(b *Block, slot int, pages core.PageMask) core.PageMask {
	bp := b.peek(slot)
	if bp == nil {
		return core.PageMask{}
	}
	p := &s.procs[slot]
	bp.sync(p.generation())
	for i := pages.NextSet(0); i >= 0; i = pages.NextSet(i + 1) {
		bp.stamp[i] = 0
	}
	return p.unprotect(bp, &pages)
}

// Refault is what Arrived measured of pages that came back.
type Refault struct {
	// Recent are the pages that came back within Limits.Recent
	// evictions, Far the others that had been evicted.
	Recent, Far core.PageMask
	// Distance is the shortest refault distance among them (0 where
	// none had been evicted).
	Distance uint64
}

// Arrived records that pages of b arrived on slot: their eviction
// stamps are read and replaced by the order of their arrival (where
// slot has limits). It returns the refaults among them (none where slot
// has no limits, for what is recent).
func (s *Set[O]) Arrived(b *Block, slot, locations int, pages core.PageMask) Refault {
	var r Refault
	p := &s.procs[slot]
	recent := int64(-1)
	bp := b.peek(slot)
	if l := p.limits.Load(); l != nil {
		recent = l.Recent
		bp = b.on(slot, locations)
		defer bp.arrive(&pages, p.arrivals.Add(1))
	}
	if bp == nil {
		return r
	}
	now := uint32(p.evictions.Load()) + 1
	first := true
	for i := pages.NextSet(0); i >= 0; i = pages.NextSet(i + 1) {
		st := bp.stamp[i]
		if st == 0 || st&arrivalStamp != 0 {
			continue
		}
		bp.stamp[i] = 0
		d := uint64((now - st) & stampMask)
		if first || d < r.Distance {
			r.Distance, first = d, false
		}
		if int64(d) <= recent {
			r.Recent.Set(i)
		} else {
			r.Far.Set(i)
		}
	}
	return r
}

// arrive stamps pages with their arrival, n.
func (bp *blockProc) arrive(pages *core.PageMask, n uint32) {
	st := n&stampMask | arrivalStamp
	for i := pages.NextSet(0); i >= 0; i = pages.NextSet(i + 1) {
		bp.stamp[i] = st
	}
}

// OldestPages returns up to n pages of candidates (pages of b on slot)
// that arrived there first: where the eviction policy has nothing else
// to offer, a block's own pages leave in the order they came, so that
// those a program brought back last, and uses now, stay. (Lowest first
// evicted a compressor's hash chains, low in its data segment, at every
// fault.)
func (s *Set[O]) OldestPages(b *Block, slot int, candidates core.PageMask, n int) core.PageMask {
	bp := b.peek(slot)
	if bp == nil || candidates.Count() <= n {
		return candidates.Lowest(n)
	}
	now := s.procs[slot].arrivals.Load()
	type aged struct {
		age  uint32
		page int
	}
	var buf [core.PagesPerBlock]aged
	all := buf[:0]
	for i := candidates.NextSet(0); i >= 0; i = candidates.NextSet(i + 1) {
		age := uint32(stampMask) // arrived before anything was stamped: the oldest
		if st := bp.stamp[i]; st&arrivalStamp != 0 {
			age = (now - st) & stampMask
		}
		all = append(all, aged{age, i})
	}
	slices.SortStableFunc(all, func(a, b aged) int { return cmp.Compare(b.age, a.age) })
	var out core.PageMask
	for _, a := range all[:n] {
		out.Set(a.page)
	}
	return out
}

// Protect protects pages of b (resident on slot, and not protected
// there already) on slot, in the current generation; owner names b in
// the lists of blocks with protected pages. The caller has checked the
// limits (Room).
func (s *Set[O]) Protect(b *Block, owner O, slot, locations int, pages core.PageMask) {
	n := pages.Count()
	if n == 0 {
		return
	}
	p := &s.procs[slot]
	g := p.generation()
	bp := b.on(slot, locations)
	bp.sync(g)
	bp.protect[0].Or(&pages)
	p.mu.Lock()
	if g+1 >= p.gen.Load() {
		// Generation g is current, or the one before (another eviction
		// moved the clock on meanwhile): it lives.
		p.byGen[g%3] += int64(n)
		p.protected.Add(int64(n))
		if bp.listed != g+1 {
			bp.listed = g + 1
			p.joined[g%3] = append(p.joined[g%3], owner)
		}
	} else {
		// Generation g ended as they joined it: they are released with
		// its others.
		p.due = append(p.due, owner)
	}
	p.mu.Unlock()
}

// Room reports how many more pages slot may protect.
func (s *Set[O]) Room(slot int) int64 {
	p := &s.procs[slot]
	l := p.limits.Load()
	if l == nil || l.Protect == 0 {
		return 0
	}
	p.generation()
	return max(l.Protect-p.protected.Load(), 0)
}

// Due appends to out the blocks of slot whose protections have ended,
// and forgets them: their owners lock each and release its pages
// (Release), or, where the lock is busy, hand it back (Requeue).
func (s *Set[O]) Due(slot int, out []O) []O {
	p := &s.procs[slot]
	p.generation()
	p.mu.Lock()
	defer p.mu.Unlock()
	out = append(out, p.due...)
	clear(p.due)
	p.due = p.due[:0]
	return out
}

// Requeue hands back blocks Due returned that their owners could not
// lock.
func (s *Set[O]) Requeue(slot int, owners []O) {
	if len(owners) == 0 {
		return
	}
	p := &s.procs[slot]
	p.mu.Lock()
	p.due = append(p.due, owners...)
	p.mu.Unlock()
}

// Release returns the pages of b on slot whose protection has ended,
// and forgets them: the owner reports them to the eviction policy as
// arriving (those still resident).
func (s *Set[O]) Release(b *Block, slot int) core.PageMask {
	bp := b.peek(slot)
	if bp == nil {
		return core.PageMask{}
	}
	bp.sync(s.procs[slot].generation())
	m := bp.expired
	bp.expired = core.PageMask{}
	return m
}

// Oldest appends to out the blocks of slot that protect pages, those of
// the older generation first: where nothing but protected pages is
// left to evict, the oldest protections give way first.
func (s *Set[O]) Oldest(slot int, out []O) []O {
	p := &s.procs[slot]
	p.generation()
	p.mu.Lock()
	defer p.mu.Unlock()
	g := p.gen.Load()
	out = append(out, p.joined[(g+2)%3]...)
	return append(out, p.joined[g%3]...)
}
