package policy

import (
	"container/list"
	"fmt"
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
	// not where the kernel would swap pages it is told to reclaim, not
	// for a device (its process maps its own file, which reclaim cannot
	// unmap from outside).
	Watchable(p Processor) bool
	// Watch unmaps b's pages on p from p's page table, leaving them
	// where they are, and reports whether it did (false for a block
	// freed, or of a range whose pages must stay mapped).
	Watch(b *Block, p Processor) bool
	// Touched reports how many of b's pages p has mapped again since
	// Watch: those it touched since, or that the server mapped for it.
	Touched(b *Block, p Processor) int
}

// Observing is an Eviction that watches use through the server's
// Observer.
type Observing interface {
	Eviction
	Observe(o Observer)
}

// HintClock ("clock") evicts whole blocks by their use, after the kernel's two lists
// (an inactive and an active list, as in its page reclaim) with the
// reference bit taken from hint faults (Observer):
//
//   - A block arriving on a processor goes to the back of the inactive
//     list, unwatched; one coming back soon after it was evicted (its
//     name still in the ghost list, which holds as many names as there
//     are blocks listed) goes to the back of the active list.
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
// It asks for clean eviction (CleanCopying): a page the host reads back
// keeps its device copy, and leaves the host again without a copy while
// the host has not written it. "clock:copy" is the same policy without.
type HintClock struct {
	// copyAlways ("clock:copy") turns clean eviction off: every page
	// the host reads back migrates, and leaves with a copy.
	copyAlways bool
	mu         sync.Mutex
	observer   Observer                 // set before use, then read-only
	procs      map[Processor]*clockProc // guarded by mu
}

type clockEntry struct {
	b          *Block
	active     bool
	watched    bool
	watchedAt  uint64 // clockProc.calls when the watch was set
	referenced bool   // touched once while watched on probation
	elem       *list.Element
}

type clockProc struct {
	entries  map[*Block]*clockEntry
	inactive list.List // of *clockEntry, front = next to judge
	active   list.List // of *clockEntry, front = next to demote
	ghost    list.List // of *Block, front = evicted longest ago
	ghosts   map[*Block]*list.Element
	// calls counts the calls of Victims begun: a call judges only the
	// blocks watched before it began (watchedAt below its own number),
	// so that the program has had the time between two calls to touch
	// them, and no call judges what it, or one running beside it, has
	// just unmapped.
	calls uint64
}

// NewHintClock makes an empty HintClock.
func NewHintClock() *HintClock { return &HintClock{procs: map[Processor]*clockProc{}} }

func (c *HintClock) Name() string {
	if c.copyAlways {
		return "clock:copy"
	}
	return "clock"
}

// CleanCopies: clock asks for clean eviction (CleanCopying), unless
// made as "clock:copy".
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

func (c *HintClock) Arrived(b *Block, p Processor, _ int, _ Cause) {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := c.proc(p)
	if e := s.entries[b]; e != nil {
		// More of a block arrived: something faulted on it, a touch
		// while watched, as the judge would count it.
		if e.watched && !e.active {
			if e.referenced {
				s.promote(e)
			} else {
				e.referenced, e.watched = true, false
				s.inactive.MoveToBack(e.elem)
			}
		}
		return
	}
	e := &clockEntry{b: b}
	if g := s.ghosts[b]; g != nil {
		s.ghost.Remove(g)
		delete(s.ghosts, b)
		e.active = true
		e.elem = s.active.PushBack(e)
	} else {
		e.elem = s.inactive.PushBack(e)
	}
	s.entries[b] = e
}

func (c *HintClock) Left(b *Block, p Processor) {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := c.procs[p]
	if s == nil {
		return
	}
	if e := s.entries[b]; e != nil {
		s.list(e).Remove(e.elem)
		delete(s.entries, b)
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
		s.ghost.MoveToBack(g)
	} else {
		s.ghosts[b] = s.ghost.PushBack(b)
	}
	for s.ghost.Len() > max(len(s.entries), 64) {
		f := s.ghost.Front()
		delete(s.ghosts, f.Value.(*Block))
		s.ghost.Remove(f)
	}
}

// Victims judges the front of the inactive list, watches the look-ahead
// and returns up to n untouched blocks, the longest listed first; where
// there are fewer, it adds the blocks that could not be judged in list
// order (so that a processor that must make room always can).
func (c *HintClock) Victims(p Processor, n int, out []*Block) []*Block {
	obs := c.observer
	if obs != nil && !obs.Watchable(p) {
		obs = nil
	}
	start := len(out)
	var judge, watch []*clockEntry
	var call uint64
	for round := 0; round < 8 && len(out)-start < n; round++ {
		c.mu.Lock()
		s := c.procs[p]
		if s == nil {
			c.mu.Unlock()
			return out
		}
		if round == 0 {
			s.calls++
			call = s.calls
		}
		s.balance()
		judge, watch = judge[:0], watch[:0]
		if obs != nil {
			lookAhead := max(s.inactive.Len()/2, 2*n)
			k := 0
			for el := s.inactive.Front(); el != nil && k < lookAhead; el, k = el.Next(), k+1 {
				if e := el.Value.(*clockEntry); e.watched {
					if len(judge) < 2*n && e.watchedAt < call {
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
		touched := make([]int, len(judge))
		for i, e := range judge {
			touched[i] = obs.Touched(e.b, p)
		}
		watchedOK := make([]bool, len(watch))
		for i, e := range watch {
			watchedOK[i] = obs.Watch(e.b, p)
		}
		c.mu.Lock()
		for i, e := range watch {
			if watchedOK[i] && s.entries[e.b] == e && !e.active {
				e.watched, e.watchedAt = true, s.calls
			}
		}
		promoted := false
		for i, e := range judge {
			if s.entries[e.b] != e || e.active || !e.watched {
				continue // left, or promoted by an arrival, meanwhile
			}
			if touched[i] > 0 {
				// The first touch seen keeps the block on probation
				// (a block that just arrived is still being filled,
				// or scanned); a second, a pass of the hand later,
				// makes it active.
				if e.referenced {
					s.promote(e)
				} else {
					e.referenced, e.watched = true, false
					s.inactive.MoveToBack(e.elem)
				}
				promoted = true
				continue
			}
			if len(out)-start < n && !contains(out[start:], e.b) {
				out = append(out, e.b)
				s.remember(e.b)
			}
		}
		c.mu.Unlock()
		if !promoted {
			break // what is left to judge was just watched
		}
	}
	if len(out)-start < n {
		// Nothing more judged untouched: the rest in list order,
		// inactive first.
		c.mu.Lock()
		if s := c.procs[p]; s != nil {
			for _, l := range [...]*list.List{&s.inactive, &s.active} {
				for el := l.Front(); el != nil && len(out)-start < n; el = el.Next() {
					if b := el.Value.(*clockEntry).b; !contains(out[start:], b) {
						out = append(out, b)
						s.remember(b)
					}
				}
			}
		}
		c.mu.Unlock()
	}
	return out
}

func contains(bs []*Block, b *Block) bool {
	for _, x := range bs {
		if x == b {
			return true
		}
	}
	return false
}

func init() {
	if err := evictionRegistry.register("clock", func(arg string) (Eviction, error) {
		c := NewHintClock()
		switch arg {
		case "":
		case "copy":
			c.copyAlways = true
		default:
			return nil, fmt.Errorf("%w: eviction policy \"clock:%s\": want clock, or clock:copy (no clean eviction)", core.ErrInvalidValue, arg)
		}
		return c, nil
	}, true); err != nil {
		panic(err)
	}
}
