package policy

import (
	"container/list"
	"fmt"
	"math/bits"
	"sync"

	"github.com/softuvm/softuvm/internal/core"
)

// RegionPages is the granularity of TwoQ: 16 pages, 64 KiB, the size the
// density prefetch brings on a fault.
const RegionPages = 16

const regionsPerBlock = core.PagesPerBlock / RegionPages

// TwoQ is a scan-resistant eviction of 64 KiB regions, after Johnson and
// Shasha's 2Q (VLDB 1994), for a server that sees arrivals, not accesses:
// a page used in place where it lives raises nothing, so the one sign of
// use is a region arriving again soon after it was evicted.
//
//   - A region that arrives on a processor goes to the back of a FIFO, the
//     probation queue ("A1in").
//   - Victims come from the front of the probation queue: a region brought
//     once and not asked for again (a scan, a sweep, a random access that
//     does not repeat) leaves first.
//   - An evicted region's name is kept in a ghost queue ("A1out") twice as
//     long as the processor's resident regions. A region that arrives while
//     its name is there was needed again soon after it left: it is admitted
//     to the protected queue ("Am"), while that holds less than three
//     quarters of the processor's resident regions (else it goes on
//     probation again).
//   - The protected queue is evicted from only when probation is empty;
//     and, so that a working set that moves on does not stay protected for
//     ever, one protected region goes back on probation for every eight
//     evicted from there.
//
// A loop over more memory than fits is where least-recently-migrated
// eviction (LRU here) fails worst: every page is evicted just before it
// is used again. Here the protected regions stay, and are used in place on
// every pass.
type TwoQ struct {
	mu    sync.Mutex
	procs map[Processor]*twoQProc // guarded by mu
}

type regionKey struct {
	b *Block
	r int // region index in the block
}

type twoQRegion struct {
	key       regionKey
	pages     uint16 // of the region's pages, those resident
	protected bool
	elem      *list.Element // in probation or protected
}

type twoQProc struct {
	regions   map[regionKey]*twoQRegion
	probation list.List // of *twoQRegion, front = oldest arrival
	protected list.List // of *twoQRegion, front = least recently arrived
	ghost     list.List // of regionKey, front = evicted longest ago
	ghosts    map[regionKey]*list.Element
	// fromProbation counts victims from probation since the last demotion.
	fromProbation int
}

// NewTwoQ makes an empty TwoQ.
func NewTwoQ() *TwoQ { return &TwoQ{procs: map[Processor]*twoQProc{}} }

func (q *TwoQ) Name() string { return "2q" }

func (q *TwoQ) proc(p Processor) *twoQProc {
	s := q.procs[p]
	if s == nil {
		s = &twoQProc{regions: map[regionKey]*twoQRegion{}, ghosts: map[regionKey]*list.Element{}}
		q.procs[p] = s
	}
	return s
}

// regionBits are the bits of region r of m, as a 16-bit set.
func regionBits(m *PageMask, r int) uint16 {
	return uint16(m[r/4] >> (uint(r%4) * RegionPages))
}

// Arrived: the server calls ArrivedPages instead, with the pages.
func (q *TwoQ) Arrived(*Block, Processor, int, Cause) {}

func (q *TwoQ) ArrivedPages(b *Block, p Processor, pages PageMask, _ Cause) {
	q.mu.Lock()
	defer q.mu.Unlock()
	s := q.proc(p)
	for r := 0; r < regionsPerBlock; r++ {
		got := regionBits(&pages, r)
		if got == 0 {
			continue
		}
		k := regionKey{b, r}
		if reg := s.regions[k]; reg != nil {
			reg.pages |= got
			if reg.protected {
				s.protected.MoveToBack(reg.elem)
			}
			continue
		}
		reg := &twoQRegion{key: k, pages: got}
		if g := s.ghosts[k]; g != nil {
			// Back soon after it was evicted: protect it, where there is
			// room.
			s.ghost.Remove(g)
			delete(s.ghosts, k)
			reg.protected = 4*(s.protected.Len()+1) <= 3*(len(s.regions)+1)
		}
		if reg.protected {
			reg.elem = s.protected.PushBack(reg)
		} else {
			reg.elem = s.probation.PushBack(reg)
		}
		s.regions[k] = reg
	}
}

func (q *TwoQ) LeftPages(b *Block, p Processor, pages PageMask) {
	q.mu.Lock()
	defer q.mu.Unlock()
	s := q.procs[p]
	if s == nil {
		return
	}
	for r := 0; r < regionsPerBlock; r++ {
		if gone := regionBits(&pages, r); gone != 0 {
			if reg := s.regions[regionKey{b, r}]; reg != nil {
				reg.pages &^= gone
				if reg.pages == 0 {
					s.remove(reg)
				}
			}
		}
	}
}

// Left forgets every region of b on p.
func (q *TwoQ) Left(b *Block, p Processor) { q.LeftPages(b, p, wholeBlock) }

// wholeBlock is every page of a block.
var wholeBlock = func() (m PageMask) {
	m.FillRange(0, core.PagesPerBlock)
	return m
}()

func (s *twoQProc) remove(reg *twoQRegion) {
	if reg.protected {
		s.protected.Remove(reg.elem)
	} else {
		s.probation.Remove(reg.elem)
	}
	delete(s.regions, reg.key)
}

// VictimPages takes regions from the front of probation (or of the
// protected queue when probation is empty) until they hold want pages.
// Each goes to the back of its queue and its name into the ghost queue:
// the server evicts it (then LeftPages removes it), or, where its block
// is busy, leaves it, and the next call offers others first.
func (q *TwoQ) VictimPages(p Processor, want int, out []Victim) []Victim {
	q.mu.Lock()
	defer q.mu.Unlock()
	s := q.procs[p]
	if s == nil {
		return out
	}
	offered := 0
	for n := len(s.regions); offered < want && n > 0; n-- {
		var e *list.Element
		if s.probation.Len() > 0 {
			e = s.probation.Front()
			if s.fromProbation++; s.fromProbation >= 8 && s.protected.Len() > 0 {
				s.fromProbation = 0
				d := s.protected.Front().Value.(*twoQRegion)
				s.protected.Remove(d.elem)
				d.protected = false
				d.elem = s.probation.PushBack(d)
			}
		} else {
			e = s.protected.Front()
		}
		reg := e.Value.(*twoQRegion)
		if reg.protected {
			s.protected.MoveToBack(e)
		} else {
			s.probation.MoveToBack(e)
		}
		var m PageMask
		m[reg.key.r/4] = uint64(reg.pages) << (uint(reg.key.r%4) * RegionPages)
		out = append(out, Victim{Block: reg.key.b, Pages: m})
		offered += bits.OnesCount16(reg.pages)
		s.remember(reg.key)
	}
	return out
}

// remember puts k at the back of the ghost queue, which holds twice as
// many names as there are resident regions (at least 1024).
func (s *twoQProc) remember(k regionKey) {
	if g := s.ghosts[k]; g != nil {
		s.ghost.MoveToBack(g)
	} else {
		s.ghosts[k] = s.ghost.PushBack(k)
	}
	limit := max(2*len(s.regions), 1024)
	for s.ghost.Len() > limit {
		f := s.ghost.Front()
		delete(s.ghosts, f.Value.(regionKey))
		s.ghost.Remove(f)
	}
}

// Victims: for a server that asks for blocks, the blocks of VictimPages'
// regions.
func (q *TwoQ) Victims(p Processor, n int, out []*Block) []*Block {
	var buf [16]Victim
	seen := map[*Block]bool{}
	for _, v := range q.VictimPages(p, n*core.PagesPerBlock, buf[:0]) {
		if !seen[v.Block] && len(seen) < n {
			seen[v.Block] = true
			out = append(out, v.Block)
		}
	}
	return out
}

func init() {
	if err := evictionRegistry.register("2q", func(arg string) (Eviction, error) {
		if arg != "" {
			return nil, fmt.Errorf("%w: eviction policy \"2q:%s\": 2q takes no argument", core.ErrInvalidValue, arg)
		}
		return NewTwoQ(), nil
	}, true); err != nil {
		panic(err)
	}
}
