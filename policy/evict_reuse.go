package policy

import (
	"container/list"
	"fmt"
	"math"
	"sync"

	"github.com/softuvm/softuvm/internal/core"
)

// Reuse ("reuse") evicts 4 KiB pages by their predicted next use, the
// way Belady's MIN evicts by the known one, from what a fault server
// hears: pages arriving and leaving, never a touch of a page in place.
// Those are misses only, which is why ARC, LIRS and CLOCK-Pro, whose
// lists move on hits, do not apply as written: a page they would keep for
// its hits looks, to the server, like a page that arrived once.
//
// What the arrivals do show is how long a page stayed away: each
// processor counts the pages that arrive there (its clock), and
// remembers, for pages that left, when they last arrived (a ghost, at
// most four times the processor's resident pages). A page that arrives
// while its ghost is remembered gets an interval, the arrivals between
// its two arrivals, and is predicted to be used again an interval after
// each arrival (a page used in place does not arrive again, so every
// interval after the last arrival counts as a use). A victim is the page
// whose next use is predicted furthest, so:
//
//   - A loop over more memory than fits keeps most of its pages: the page
//     that just came back is next needed a whole loop later, further than
//     any page the loop kept, which it used in place since (MIN's choice:
//     the most recent).
//   - A page that arrived once, with no interval to predict by (a scan, a
//     sweep, first-touch zeros), is predicted never: such pages leave
//     before any page with an interval, which a scan therefore does not
//     push out.
//   - Among the pages that arrived once, the rule adapts, as ARC adapts
//     its lists, to which of two choices the program punishes: the newest
//     first (keeping a hot set that arrived before a scan) or the oldest
//     first (for a program whose working set slides). A victim that
//     comes back while its ghost is remembered was the wrong choice; the
//     rule leans away from the choice that made it.
//   - A page with an interval that has not arrived again for 64
//     intervals is predicted never too: a loop that ended does not hold
//     its pages for ever.
//
// The pages that arrived once are kept in a list by arrival, and leave
// from its end the rule chooses. Newest first, in a sweep, the newest
// are the block being served, which the server never takes for itself:
// it asks again (a page offered by the call before is not offered at
// once again, so the next call goes further back) and, where the
// policy's offers run out, takes that block's oldest pages (its last
// resort), so a sweep gives up what it passed and keeps what came
// before it. The pages with an interval are judged by sampling (32 for
// each page asked for, as Redis samples for its LRU), since their
// predictions move with the clock and no order holds still to keep a
// list in; the sample comes from a generator seeded per processor, so a
// replay is repeatable.
type Reuse struct {
	mu    sync.Mutex
	procs map[Processor]*reuseProc // guarded by mu
}

// pageKey names one page: its block and its index there.
type pageKey struct {
	b *Block
	i int
}

type reusePage struct {
	key      pageKey
	arrived  uint64 // the processor's clock at its arrival
	interval uint64 // arrivals between its last two arrivals; 0: none known
	slot     int    // index in reuseProc.pages
	// elem is its place in reuseProc.once, nil for a page with an
	// interval.
	elem *list.Element
	// offered is the call of VictimPages that last offered it, and
	// newest whether that call took it as the newest of the pages that
	// arrived once (else the oldest, or by prediction).
	offered uint64
	newest  bool
}

// reuseGhost is a page that left after a call offered it: when it
// arrived last, and which rule chose it.
type reuseGhost struct {
	arrived uint64
	newest  bool // chosen as the newest page that arrived once
	once    bool // it had no interval when chosen
	left    uint64
}

type reuseProc struct {
	clock uint64 // pages arrived
	pages []*reusePage
	// once lists the pages without an interval, by arrival (front:
	// oldest): the order the rule for them takes victims in.
	once   list.List
	byKey  map[pageKey]*reusePage
	ghosts map[pageKey]reuseGhost
	// ghostOrder holds the ghosts' keys in the order they left, from
	// ghostHead on; a key whose ghost was taken or replaced since is
	// skipped (its left differs).
	ghostOrder []ghostRef
	ghostHead  int
	departed   uint64 // ghosts made: their left
	calls      uint64
	// lean is the rule for pages that arrived once: at 0 or above the
	// newest leaves first, below 0 the oldest. A returning victim of the
	// newest-first rule lowers it, one of the oldest-first rule raises
	// it, within ±reuseLeanLimit.
	lean int
	rng  uint64
}

type ghostRef struct {
	key  pageKey
	left uint64
}

const (
	reuseSamples     = 32
	reuseLeanLimit   = 16
	reuseGhostFactor = 4
	reuseMaxPeriods  = 64
)

// NewReuse makes an empty Reuse.
func NewReuse() *Reuse { return &Reuse{procs: map[Processor]*reuseProc{}} }

func (r *Reuse) Name() string { return "reuse" }

func (r *Reuse) proc(p Processor) *reuseProc {
	s := r.procs[p]
	if s == nil {
		s = &reuseProc{byKey: map[pageKey]*reusePage{}, ghosts: map[pageKey]reuseGhost{}, rng: 0x9e3779b97f4a7c15 ^ uint64(int64(p))}
		r.procs[p] = s
	}
	return s
}

// Arrived: the server calls ArrivedPages instead, with the pages.
func (r *Reuse) Arrived(*Block, Processor, int, Cause) {}

func (r *Reuse) ArrivedPages(b *Block, p Processor, pages PageMask, _ Cause) {
	r.mu.Lock()
	defer r.mu.Unlock()
	s := r.proc(p)
	for i := pages.NextSet(0); i >= 0; i = pages.NextSet(i + 1) {
		s.clock++
		k := pageKey{b, i}
		if s.byKey[k] != nil {
			continue // told twice (a copy made again): nothing moved
		}
		e := &reusePage{key: k, arrived: s.clock, slot: len(s.pages)}
		if g, ok := s.ghosts[k]; ok {
			delete(s.ghosts, k)
			e.interval = s.clock - g.arrived
			// Back while remembered: the choice that sent it away was
			// wrong, where it had no interval to go by.
			if g.once {
				if g.newest {
					s.lean = max(s.lean-1, -reuseLeanLimit)
				} else {
					s.lean = min(s.lean+1, reuseLeanLimit)
				}
			}
		}
		if e.interval == 0 {
			e.elem = s.once.PushBack(e)
		}
		s.pages = append(s.pages, e)
		s.byKey[k] = e
	}
}

func (r *Reuse) LeftPages(b *Block, p Processor, pages PageMask) {
	r.mu.Lock()
	defer r.mu.Unlock()
	s := r.procs[p]
	if s == nil {
		return
	}
	for i := pages.NextSet(0); i >= 0; i = pages.NextSet(i + 1) {
		if e := s.byKey[pageKey{b, i}]; e != nil {
			s.remove(e, e.offered != 0)
		}
	}
}

// Left forgets every page of b on p: the block left (it was freed, or
// its pages moved away); only pages a call offered leave a ghost.
func (r *Reuse) Left(b *Block, p Processor) { r.LeftPages(b, p, wholeBlock) }

// remove drops e, remembering it as a ghost where a call offered it (it
// was evicted, not freed).
func (s *reuseProc) remove(e *reusePage, ghost bool) {
	last := s.pages[len(s.pages)-1]
	s.pages[e.slot] = last
	last.slot = e.slot
	s.pages = s.pages[:len(s.pages)-1]
	delete(s.byKey, e.key)
	if e.elem != nil {
		s.once.Remove(e.elem)
	}
	if !ghost {
		return
	}
	s.departed++
	s.ghosts[e.key] = reuseGhost{arrived: e.arrived, newest: e.newest, once: e.interval == 0, left: s.departed}
	s.ghostOrder = append(s.ghostOrder, ghostRef{e.key, s.departed})
	limit := max(reuseGhostFactor*len(s.pages), 1024)
	for len(s.ghosts) > limit && s.ghostHead < len(s.ghostOrder) {
		g := s.ghostOrder[s.ghostHead]
		s.ghostHead++
		if cur, ok := s.ghosts[g.key]; ok && cur.left == g.left {
			delete(s.ghosts, g.key)
		}
	}
	// Drop the consumed front of the order once it is half the slice.
	if s.ghostHead > len(s.ghostOrder)/2 {
		s.ghostOrder = append(s.ghostOrder[:0], s.ghostOrder[s.ghostHead:]...)
		s.ghostHead = 0
	}
}

// next is e's predicted next use, on the processor's clock: the first
// interval after its arrival that is not past; never (the most) for a
// page with no interval, or none used for more than reuseMaxPeriods
// intervals (a loop that ended does not hold its pages for ever).
func (s *reuseProc) next(e *reusePage) uint64 {
	if e.interval == 0 || s.clock-e.arrived > reuseMaxPeriods*e.interval {
		return math.MaxUint64
	}
	periods := (s.clock-e.arrived)/e.interval + 1
	return e.arrived + periods*e.interval
}

func (s *reuseProc) random() uint64 {
	// xorshift64*: cheap, and repeatable from the seed.
	s.rng ^= s.rng >> 12
	s.rng ^= s.rng << 25
	s.rng ^= s.rng >> 27
	return s.rng * 2685821657736338717
}

// offerable reports whether e may be offered by the call under way:
// never offered, or not by it, nor by the call before (its block was busy, or is the
// one being served), so that the server's next round finds others.
func (s *reuseProc) offerable(e *reusePage) bool {
	return e.offered == 0 || e.offered != s.calls && e.offered != s.calls-1
}

// VictimPages offers pages that arrived once first, newest or oldest
// first as the rule leans, then, for each page still asked for, the page
// with the furthest predicted use of a sample of the resident pages.
func (r *Reuse) VictimPages(p Processor, want int, out []Victim) []Victim {
	r.mu.Lock()
	defer r.mu.Unlock()
	s := r.procs[p]
	if s == nil || len(s.pages) == 0 {
		return out
	}
	s.calls++
	first := len(out)
	newest := s.lean >= 0
	offer := func(e *reusePage) {
		e.offered, e.newest = s.calls, newest
		out = appendVictimPage(out, first, e.key)
	}
	n := 0
	e := s.once.Front()
	if newest {
		e = s.once.Back()
	}
	for ; e != nil && n < want; n++ {
		pg := e.Value.(*reusePage)
		if newest {
			e = e.Prev()
		} else {
			e = e.Next()
		}
		if !s.offerable(pg) {
			n--
			continue
		}
		offer(pg)
	}
	for ; n < want; n++ {
		var best *reusePage
		for tries := 0; tries < reuseSamples; tries++ {
			c := s.pages[s.random()%uint64(len(s.pages))]
			if s.offerable(c) && (best == nil || s.next(c) > s.next(best)) {
				best = c
			}
		}
		if best == nil {
			break
		}
		offer(best)
	}
	return out
}

// appendVictimPage adds page k to out, in the victim of its block if
// out[first:] has one.
func appendVictimPage(out []Victim, first int, k pageKey) []Victim {
	for i := first; i < len(out); i++ {
		if out[i].Block == k.b {
			out[i].Pages.Set(k.i)
			return out
		}
	}
	var m PageMask
	m.Set(k.i)
	return append(out, Victim{Block: k.b, Pages: m})
}

// Victims: for a server that asks for blocks, the blocks of VictimPages'
// pages.
func (r *Reuse) Victims(p Processor, n int, out []*Block) []*Block {
	var buf [16]Victim
	for _, v := range r.VictimPages(p, n*core.PagesPerBlock, buf[:0]) {
		if n == 0 {
			break
		}
		out = append(out, v.Block)
		n--
	}
	return out
}

func init() {
	if err := evictionRegistry.register("reuse", func(arg string) (Eviction, error) {
		if arg != "" {
			return nil, fmt.Errorf("%w: eviction policy \"reuse:%s\": reuse takes no argument", core.ErrInvalidValue, arg)
		}
		return NewReuse(), nil
	}, true); err != nil {
		panic(err)
	}
}
