package policy

import (
	"container/list"
	"fmt"
	"strings"
	"sync"

	"github.com/softuvm/softuvm/internal/core"
)

// Observer is how the server lets an eviction policy see use it cannot
// see from migrations: pages used in place where they live. The server
// hands one to a policy that implements Observing before the first call
// of any other method.
//
// Watching is a hint fault, as the kernel's NUMA balancing takes them:
// Watch takes the block's pages out of the processor's page table and
// leaves them resident where they are, so that the next touch maps them
// again (a minor fault, which the kernel or the server serves without
// moving anything), and Touched reads the page table back. Both are
// system calls on another process's page table, with no lock of the
// server held: call them without holding a lock that Arrived or Left
// take.
type Observer interface {
	// Watchable reports whether processor p's use can be watched at all:
	// not where the kernel would swap pages it is told to reclaim. The
	// host and devices alike (a device's process is unmapped from
	// outside, as the client is); Watch still says no for a device with
	// no process.
	Watchable(p Processor) bool
	// Watch unmaps b's pages on p from p's page table, leaving them
	// where they are, and reports whether it did (false for a block
	// freed, or of a range whose pages must stay mapped). Where
	// unmapping every page would cost a reclaim pass per page (a block
	// held in 4 KiB folios) and regions is false, it unmaps a sample
	// instead: one page of each 64 KiB region, a page further on at each
	// watch. With regions,
	// the policy will ask which 64 KiB regions were touched, not only
	// whether any page was: where the server itself maps pages again on
	// their hint fault (a host view registered for MINOR faults), it
	// maps one region a fault until Touched, rather than the whole
	// block at the first, so that the block's other regions still show
	// whether they are used (more faults, for a finer sight).
	Watch(b *Block, p Processor, regions bool) bool
	// Touched returns the pages of b that Watch unmapped and p has
	// mapped again since: those it touched, or that the server mapped
	// for it on a touch (every unmapped page of the touched region,
	// where Watch asked for regions; else every unmapped page of the
	// block, where the server maps pages on their hint fault). So a
	// region reads as touched where any of its pages does.
	Touched(b *Block, p Processor) PageMask
}

// Observing is an Eviction that watches use through the server's
// Observer.
type Observing interface {
	Eviction
	Observe(o Observer)
}

// HintClock ("clock") evicts by use, after the kernel's two lists (an
// inactive and an active list, as in its page reclaim) of blocks, with
// the reference bit taken from hint faults (Observer):
//
//   - A block arriving on a processor goes to the back of the inactive
//     list, unwatched; one coming back soon after it was evicted (its
//     name still in the ghost list, no more blocks left since than are
//     listed) goes to the back of the active list, and so does one
//     coming back from further while the active list has room (near).
//   - Blocks in the front half of the inactive list (the look-ahead),
//     and at least twice the victims asked for, are watched: their pages
//     are unmapped, so that a touch shows.
//   - Victims come from the front of the inactive list. A watched block
//     the processor did not touch since is a victim; it is judged no
//     sooner than the call of Victims after the one that watched it, so
//     that the program has run between the two. One it touched goes
//     to the back of the inactive list, to be watched again (a block
//     that just arrived is touched while it is filled or scanned); one
//     touched on two passes in a row goes to the back of the active
//     list. So a block used once (a scan, a sweep, first-touch zeros, a
//     buffer freed) leaves before one used again, however long ago
//     either arrived, and the blocks a program keeps using stay however
//     often others arrive.
//   - The active list is kept to three quarters of the blocks: its
//     front goes back to the inactive list, unwatched, to be judged
//     again.
//
// Where use cannot be watched (no observer, a device, swap on), HintClock
// orders by arrival like LRU, with the ghost list's second chance.
//
// What leaves is whole blocks ("clock:blocks") or 64 KiB regions
// ("clock:regions", a PageEviction): there a watched block that was
// touched still gives up the regions of it that were not, so that a
// program using a few pages of many blocks keeps those pages rather
// than a few whole blocks. A block nothing of which was touched leaves
// whole either way, so that sweeps keep their whole-block moves.
// Regions do not resist scans as blocks do: asked for the few pages
// each fault needs, a call comes a fault after the last, its watches are
// mostly too young to judge, and its guesses from them take blocks in
// use that the program has not come back to yet (docs/benchmarks-log.md);
// so "clock" judges blocks.
//
// It asks for clean eviction (CleanCopying): a page the host reads back
// keeps its device copy, and leaves the host again without a copy while
// the host has not written it. ":copy" turns that off.
type HintClock struct {
	// copyAlways (":copy") turns clean eviction off: every page the
	// host reads back migrates, and leaves with a copy.
	copyAlways bool
	// regions: victims are the untouched 64 KiB regions of touched
	// blocks too, not only untouched blocks (regionClock).
	regions  bool
	mu       sync.Mutex
	observer Observer                 // set before use, then read-only
	procs    map[Processor]*clockProc // guarded by mu
}

// regionClock is HintClock choosing 64 KiB regions: a PageEviction, so
// that the server tells it the pages that arrive and leave and asks it
// for pages.
type regionClock struct{ *HintClock }

type clockEntry struct {
	b         *Block
	active    bool
	watched   bool
	watchedAt uint64 // clockProc.calls when the watch was set
	// watchedTurn is clockProc.asked when the watch was set (regions).
	watchedTurn uint64
	referenced  bool // touched once while watched on probation
	// offeredAt is clockProc.calls of the last call that offered the
	// block in list order (regions; 0: none did, calls count from 1).
	offeredAt uint64
	elem      *list.Element
	// pages is the block's pages on the processor, as ArrivedPages and
	// LeftPages tell (every page where only Arrived tells).
	pages PageMask
}

// clockGhost is a name in the ghost list: a block evicted, and the
// count of blocks departed when it was chosen.
type clockGhost struct {
	b        *Block
	departed uint64
}

type clockProc struct {
	entries  map[*Block]*clockEntry
	inactive list.List // of *clockEntry, front = next to judge
	active   list.List // of *clockEntry, front = next to demote
	ghost    list.List // of clockGhost, front = evicted longest ago
	ghosts   map[*Block]*list.Element
	// departed counts the blocks that left: how far back a name in the
	// ghost list went (clockGhost.departed).
	departed uint64
	// calls counts the calls of Victims and VictimPages begun: a call
	// judges only the blocks watched before it began (watchedAt below
	// its own number), so that the program has had the time between two
	// calls to touch them, and no call judges what it, or one running
	// beside it, has just unmapped.
	calls uint64
	// asked counts the pages asked for by VictimPages (regions): the
	// processor's turnover, by which a watch grows old enough to judge
	// (mature).
	asked uint64
	// pages is the sum of the entries' pages.
	pages int
}

// mature reports whether e, watched, has been watched long enough to
// judge by region: since its watch, pages worth an eighth of those
// listed (at least a region) were asked to leave, or 32 calls of
// VictimPages began. A call comes with every fault that brings pages
// over a full processor, so the call after the watch, as blocks are
// judged, may come one fault later, too soon for a region used now and
// then to show. The count of calls bounds the wait where each call asks
// for little and the list is long: there the watched blocks at the front
// would otherwise be taken whole, in list order, before any watch of
// them grew old enough (perl at three quarters of its peak moved 2.5
// times the bytes of clock without it).
func (s *clockProc) mature(e *clockEntry) bool {
	return s.asked-e.watchedTurn >= uint64(max(s.pages/8, RegionPages)) || s.calls-e.watchedAt >= 32
}

// NewHintClock makes an empty HintClock that evicts whole blocks
// ("clock:blocks").
func NewHintClock() *HintClock { return &HintClock{procs: map[Processor]*clockProc{}} }

// Name is the policy's spec: "clock", with the options that differ
// from the defaults.
func (c *HintClock) Name() string {
	var opts []string
	if c.regions != clockRegionsByDefault {
		granularity := "blocks"
		if c.regions {
			granularity = "regions"
		}
		opts = append(opts, granularity)
	}
	if c.copyAlways {
		opts = append(opts, "copy")
	}
	if len(opts) == 0 {
		return "clock"
	}
	return "clock:" + strings.Join(opts, ",")
}

// CleanCopies: clock asks for clean eviction (CleanCopying), unless
// made with ":copy".
func (c *HintClock) CleanCopies() bool { return !c.copyAlways }

// Observe sets the observer the server provides.
func (c *HintClock) Observe(o Observer) { c.observer = o }

func (c *HintClock) proc(p Processor) *clockProc {
	s := c.procs[p]
	if s == nil {
		s = &clockProc{entries: map[*Block]*clockEntry{}, ghosts: map[*Block]*list.Element{}}
		c.procs[p] = s
	}
	return s
}

func (c *HintClock) Arrived(b *Block, p Processor, _ int, _ Cause) { c.arrive(b, p, wholeBlock) }

// ArrivedPages: as Arrived, with the pages.
func (c regionClock) ArrivedPages(b *Block, p Processor, pages PageMask, _ Cause) {
	c.arrive(b, p, pages)
}

// LeftPages: the pages no longer count toward the block's share.
func (c regionClock) LeftPages(b *Block, p Processor, pages PageMask) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if s := c.procs[p]; s != nil {
		if e := s.entries[b]; e != nil {
			s.pages -= e.pages.Count()
			e.pages.AndNot(&pages)
			s.pages += e.pages.Count()
		}
	}
}

func (c *HintClock) arrive(b *Block, p Processor, pages PageMask) {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := c.proc(p)
	if e := s.entries[b]; e != nil {
		s.pages -= e.pages.Count()
		e.pages.Or(&pages)
		s.pages += e.pages.Count()
		// More of a block arrived: something faulted on it, a touch
		// while watched, as the judge would count it. (Judging regions,
		// the watch stays: the pages a fault brings are mapped, so they
		// show as touched, and the block's other regions still show
		// whether they are used.)
		if e.watched && !e.active && !c.regions {
			if e.referenced {
				s.promote(e)
			} else {
				e.referenced, e.watched = true, false
				s.inactive.MoveToBack(e.elem)
			}
		}
		return
	}
	e := &clockEntry{b: b, pages: pages}
	s.pages += pages.Count()
	if g := s.ghosts[b]; g != nil {
		s.ghost.Remove(g)
		delete(s.ghosts, b)
		e.active = s.near(g.Value.(clockGhost)) || s.activeHasRoom()
	}
	if e.active {
		e.elem = s.active.PushBack(e)
	} else {
		e.elem = s.inactive.PushBack(e)
	}
	s.entries[b] = e
}

// near reports whether a block coming back, not listed yet, came back
// soon: no more blocks left since it was chosen than are listed with
// it. One that comes back from further than the processor holds (a
// sweep over more than fits, its every block back a whole sweep later)
// would push out an active block for one that leaves again before it
// is used: it goes on probation, unless the active list has room, so
// that the blocks the active list holds stay, as the optimum would keep
// any of them, and the others miss, rather than every block of every
// sweep.
func (s *clockProc) near(g clockGhost) bool {
	return s.departed-g.departed <= uint64(len(s.entries)+1)
}

// activeHasRoom reports whether one more block in the active list keeps
// it within three quarters of the blocks listed before it arrives, so
// that balance demotes none for it: a block that came from far and took
// the place of the active list's oldest would leave a sweep to miss
// every block again. (Counted with the block arriving, a processor
// briefly over its share, two blocks arriving at once, let one more in,
// and balance then sent the oldest active block out.)
func (s *clockProc) activeHasRoom() bool { return 4*(s.active.Len()+1) <= 3*len(s.entries) }

func (c *HintClock) Left(b *Block, p Processor) {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := c.procs[p]
	if s == nil {
		return
	}
	if e := s.entries[b]; e != nil {
		s.list(e).Remove(e.elem)
		s.pages -= e.pages.Count()
		delete(s.entries, b)
		s.departed++
	}
}

func (s *clockProc) list(e *clockEntry) *list.List {
	if e.active {
		return &s.active
	}
	return &s.inactive
}

// promote moves e to the back of the active list, unwatched.
func (s *clockProc) promote(e *clockEntry) {
	s.list(e).Remove(e.elem)
	e.active, e.watched, e.referenced = true, false, false
	e.elem = s.active.PushBack(e)
}

// balance demotes the active list's front while it holds more than three
// quarters of the blocks.
func (s *clockProc) balance() {
	for 4*s.active.Len() > 3*len(s.entries) {
		e := s.active.Front().Value.(*clockEntry)
		s.active.Remove(e.elem)
		e.active, e.watched = false, false
		e.elem = s.inactive.PushBack(e)
	}
}

// remember puts b's name at the back of the ghost list, which holds as
// many names as there are blocks listed (at least 64).
func (s *clockProc) remember(b *Block) {
	if g := s.ghosts[b]; g != nil {
		g.Value = clockGhost{b: b, departed: s.departed}
		s.ghost.MoveToBack(g)
	} else {
		s.ghosts[b] = s.ghost.PushBack(clockGhost{b: b, departed: s.departed})
	}
	for s.ghost.Len() > max(len(s.entries), 64) {
		f := s.ghost.Front()
		delete(s.ghosts, f.Value.(clockGhost).b)
		s.ghost.Remove(f)
	}
}

// Victims returns up to n whole blocks, the best first (choose).
func (c *HintClock) Victims(p Processor, n int, out []*Block) []*Block {
	var buf [16]Victim
	for _, v := range c.choose(p, n, n, false, buf[:0]) {
		out = append(out, v.Block)
	}
	return out
}

// VictimPages returns victims worth want pages where p holds that many:
// untouched blocks whole and the untouched regions of touched ones
// (choose).
func (c regionClock) VictimPages(p Processor, want int, out []Victim) []Victim {
	c.mu.Lock()
	n := 2
	if s := c.procs[p]; s != nil && len(s.entries) > 0 {
		// As many blocks as hold want pages on average, and two more.
		n = min((want*len(s.entries)+s.pages-1)/max(s.pages, 1)+2, 16)
	}
	c.mu.Unlock()
	return c.choose(p, n, want, true, out)
}

// choose judges the front of the inactive list, watches the look-ahead
// and appends victims worth want (pages where regions, else blocks),
// for up to n blocks judged at a time: untouched blocks, the longest
// listed first, and with regions the untouched regions of touched
// blocks too. Where there are fewer, it adds blocks that could not be
// judged, in list order (so that a processor that must make room always
// can; with regions, and a spare after a block offered so by the call
// before).
func (c *HintClock) choose(p Processor, n, want int, regions bool, out []Victim) []Victim {
	obs := c.observer
	if obs != nil && !obs.Watchable(p) {
		obs = nil
	}
	start, got := len(out), 0
	var offered []*clockEntry
	var call uint64
	// repeated stays true while every block offered (not as a spare)
	// was offered by the call before too, by whichever rule.
	repeated := true
	// take offers pages of e, and reports whether it did (not where e
	// is offered already, or holds none of them). With regions, e goes
	// to the back of its list afterwards unless it is a spare.
	take := func(e *clockEntry, pages PageMask, spare bool) bool {
		for _, v := range out[start:] {
			if v.Block == e.b {
				return false
			}
		}
		if regions {
			pages.And(&e.pages)
			if pages.Empty() {
				return false
			}
			got += pages.Count()
			if !spare {
				offered = append(offered, e)
				repeated = repeated && e.offeredAt != 0 && e.offeredAt == call-1
				e.offeredAt = call
			}
		} else {
			got++
		}
		out = append(out, Victim{Block: e.b, Pages: pages})
		return true
	}
	var judge, watch, young []*clockEntry
	// What the observer said of them, reused by every round (a call
	// comes with every fault over a full processor).
	var touched []PageMask
	var watchedOK []bool
	for round := 0; round < 8 && got < want; round++ {
		c.mu.Lock()
		s := c.procs[p]
		if s == nil {
			c.mu.Unlock()
			return out
		}
		if round == 0 {
			s.calls++
			call = s.calls
			if regions {
				s.asked += uint64(want)
			}
		}
		s.balance()
		judge, watch, young = judge[:0], watch[:0], young[:0]
		if obs != nil {
			lookAhead := max(s.inactive.Len()/2, 2*n)
			k := 0
			for el := s.inactive.Front(); el != nil && k < lookAhead; el, k = el.Next(), k+1 {
				if e := el.Value.(*clockEntry); e.watched {
					switch {
					case e.watchedAt >= call:
					case regions && !s.mature(e):
						young = append(young, e)
					case len(judge) < 2*n:
						judge = append(judge, e)
					}
				} else {
					watch = append(watch, e)
				}
			}
		}
		c.mu.Unlock()
		if len(judge) == 0 && len(watch) == 0 {
			break
		}
		touched = touched[:0]
		for _, e := range judge {
			touched = append(touched, obs.Touched(e.b, p))
		}
		watchedOK = watchedOK[:0]
		for _, e := range watch {
			watchedOK = append(watchedOK, obs.Watch(e.b, p, c.regions))
		}
		c.mu.Lock()
		for i, e := range watch {
			if watchedOK[i] && s.entries[e.b] == e && !e.active {
				e.watched, e.watchedAt, e.watchedTurn = true, s.calls, s.asked
			}
		}
		promoted := false
		for i, e := range judge {
			if s.entries[e.b] != e || e.active || !e.watched {
				continue // left, or promoted by an arrival, meanwhile
			}
			if touched[i].Empty() {
				if got < want {
					take(e, wholeBlock, false)
					s.remember(e.b)
				}
				continue
			}
			if regions && got < want {
				// The regions the program did not touch leave; those
				// it did stay with the block.
				take(e, untouchedRegions(&touched[i]), false)
			}
			// The first touch seen keeps the block on probation (a
			// block that just arrived is still being filled, or
			// scanned); a second, a pass of the hand later, makes it
			// active.
			if e.referenced {
				s.promote(e)
			} else {
				e.referenced, e.watched = true, false
				s.inactive.MoveToBack(e.elem)
			}
			promoted = true
		}
		c.mu.Unlock()
		if !promoted {
			break // what is left to judge was just watched
		}
	}
	if got < want && len(young) > 0 {
		// Judging regions: the best guess next is the blocks watched
		// too recently to judge that were not touched yet, whole, then
		// the untouched regions of those that were, in list order.
		touched = touched[:0]
		for _, e := range young {
			touched = append(touched, obs.Touched(e.b, p))
		}
		c.mu.Lock()
		if s := c.procs[p]; s != nil {
			for _, whole := range [...]bool{true, false} {
				for i, e := range young {
					if got < want && s.entries[e.b] == e && e.watched && touched[i].Empty() == whole {
						take(e, untouchedRegions(&touched[i]), false)
					}
				}
			}
		}
		c.mu.Unlock()
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	// A block offered by the call before and still listed is likely one
	// the server cannot take (the block it is serving): sent to the back
	// of its list, it may be the only one there, ahead of the active
	// blocks, and be offered alone again and again, judged or in list
	// order. So where every block offered was offered by the call
	// before, one more block follows, a spare, which keeps its place and
	// is not remembered, as AskVictims asks a block policy for more
	// blocks than it needs. (Only the list order had the spare once; a
	// block judged each call, alone on probation while the others were
	// active, still failed a prefetch to a full device about one run in
	// ten of TestConcurrentFaultsUnderEveryEviction.)
	needSpare := regions && len(out) > start && repeated
	if got < want || needSpare {
		// Nothing more judged untouched: the rest in list order,
		// inactive first, and the spare.
		if s := c.procs[p]; s != nil {
			spared := false
			for _, l := range [...]*list.List{&s.inactive, &s.active} {
				for el := l.Front(); el != nil && (got < want || needSpare && !spared); el = el.Next() {
					e := el.Value.(*clockEntry)
					isSpare := got >= want
					if !take(e, wholeBlock, isSpare) {
						continue
					}
					if isSpare {
						spared = true
						continue
					}
					s.remember(e.b)
					needSpare = regions && repeated
				}
			}
		}
	}
	if s := c.procs[p]; s != nil {
		// Offered pages go to the back of their list, so that where the
		// server cannot take them (the block it serves, or one busy) it
		// is offered others when it asks again; those it takes leave
		// (LeftPages), with the block where nothing of it is left.
		for _, e := range offered {
			if s.entries[e.b] == e {
				s.list(e).MoveToBack(e.elem)
			}
		}
	}
	return out
}

// RegionOf is the pages of the 64 KiB region (RegionPages) of a block
// that holds page: what the server maps on a hint fault in a block
// watched by region (Observer.Watch).
func RegionOf(page int) PageMask {
	var m PageMask
	first := page &^ (RegionPages - 1)
	m.FillRange(first, first+RegionPages)
	return m
}

// untouchedRegions is every page of the 64 KiB regions of a block that
// hold no page of touched.
func untouchedRegions(touched *PageMask) PageMask {
	var m PageMask
	for r := 0; r < regionsPerBlock; r++ {
		if regionBits(touched, r) == 0 {
			m.FillRange(r*RegionPages, (r+1)*RegionPages)
		}
	}
	return m
}

// clockRegionsByDefault is what "clock" without a granularity evicts.
const clockRegionsByDefault = false

func init() {
	if err := evictionRegistry.register("clock", func(arg string) (Eviction, error) {
		c := NewHintClock()
		c.regions = clockRegionsByDefault
		if arg != "" {
			for _, opt := range strings.Split(arg, ",") {
				switch opt {
				case "copy":
					c.copyAlways = true
				case "blocks":
					c.regions = false
				case "regions":
					c.regions = true
				default:
					return nil, fmt.Errorf("%w: eviction policy \"clock:%s\": want clock, or clock: with a comma list of copy (no clean eviction) and blocks or regions (what leaves: whole 2 MiB blocks, or 64 KiB regions)", core.ErrInvalidValue, arg)
				}
			}
		}
		if c.regions {
			return regionClock{c}, nil
		}
		return c, nil
	}, true); err != nil {
		panic(err)
	}
}
