package lab

import (
	"container/heap"
	"errors"
	"io"
	"math"
	"sort"

	"github.com/softuvm/softuvm/internal/block"
	"github.com/softuvm/softuvm/internal/core"
	"github.com/softuvm/softuvm/policy"
	"github.com/softuvm/softuvm/trace"
)

// The oracles: policies that know the trace's future. A replay with one
// reads the trace twice: first to list every reference (scanFuture), in
// the order the replay serves them, then to replay.

// pageKey names a page as one processor uses it: the processor's slot,
// the range's id in the trace, the page's index in the range.
type pageKey struct {
	slot int
	rng  uint64
	page int
}

// never is the next use of a page never used again.
const never = math.MaxInt

// future is the trace's references, by page: uses[k] lists the indices
// of the references to k, ascending.
type future struct {
	uses  map[pageKey][]int
	total int
}

// nextUse is the first reference to k after index after.
func (f *future) nextUse(k pageKey, after int) int {
	u := f.uses[k]
	i := sort.SearchInts(u, after+1)
	if i == len(u) {
		return never
	}
	return u[i]
}

// scanFuture lists the references of src as a replay numbers them.
func scanFuture(src source) (*future, error) {
	f := &future{uses: map[pageKey][]int{}}
	src = &reorder{src: src}
	s := &sim{byID: map[uint64]*simRange{}, res: &Result{}} // ranges only: no engine
	add := func(p core.Device, addr uint64, _ bool) {
		if r := s.lookup(addr); r != nil {
			k := pageKey{slot: p.Slot(), rng: r.id, page: int((addr - r.start) / core.PageSize)}
			f.uses[k] = append(f.uses[k], f.total)
		}
		f.total++
	}
	var e trace.Event
	for {
		err := src.Next(&e)
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			return f, nil
		}
		if err != nil {
			return nil, err
		}
		if !s.allocation(&e) {
			eachReference(&e, add)
		}
	}
}

// keyOf is the key of page x of block v at location l.
func keyOf(v block.Ref, l core.Device, x int) pageKey {
	return pageKey{slot: l.Slot(), rng: v.R.ID, page: v.I*core.PagesPerBlock + x}
}

// opt is Belady's MIN (OPT): the pages evicted are those whose next use
// where they are lies furthest ahead (never used there again first). It
// chooses pages, so a full location gives up exactly what it must. With
// demand fetching (prefetch "none") no policy moves fewer pages into a
// location: it is the bound the scoreboard measures eviction against.
//
// Each location keeps a max-heap of its resident pages by next use. An
// entry is exact while its page stays there and its next use is ahead:
// a page's next use changes only when that use happens, and the replay
// then pushes the new one (Touched); entries passed by (next use behind
// the replay) or of pages gone are dropped when they come up.
type opt struct {
	s     *sim
	heaps [maxLocs]optHeap
}

type optEntry struct {
	next int
	v    block.Ref
	page int
}

type optHeap []optEntry

func (h optHeap) Len() int           { return len(h) }
func (h optHeap) Less(i, j int) bool { return h[i].next > h[j].next }
func (h optHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *optHeap) Push(x any)        { *h = append(*h, x.(optEntry)) }
func (h *optHeap) Pop() any {
	old := *h
	e := old[len(old)-1]
	*h = old[:len(old)-1]
	return e
}

func newOPT(s *sim) *opt { return &opt{s: s} }

func (o *opt) Name() string { return OracleEviction }

func (o *opt) push(v block.Ref, l core.Device, x int, next int) {
	heap.Push(&o.heaps[l.Slot()], optEntry{next: next, v: v, page: x})
}

func (o *opt) Arrived(*policy.Block, policy.Processor, int, policy.Cause) {}
func (o *opt) Left(*policy.Block, policy.Processor)                       {}
func (o *opt) Victims(policy.Processor, int, []*policy.Block) []*policy.Block {
	return nil // VictimPages is what the replay asks
}

func (o *opt) ArrivedPages(pb *policy.Block, l policy.Processor, pages policy.PageMask, _ policy.Cause) {
	v, _ := block.RefOf(pb)
	for x := pages.NextSet(0); x >= 0; x = pages.NextSet(x + 1) {
		o.push(v, l, x, o.s.future.nextUse(keyOf(v, l, x), o.s.ref))
	}
}

func (o *opt) LeftPages(*policy.Block, policy.Processor, policy.PageMask) {}

// Touched: the page's next use is now the one after this reference.
func (o *opt) Touched(pb *policy.Block, l policy.Processor, x int, _ bool, _ policy.Clock) {
	v, _ := block.RefOf(pb)
	if v.B.Resident[l.Slot()].Test(x) {
		o.push(v, l, x, o.s.future.nextUse(keyOf(v, l, x), o.s.ref))
	}
}

// VictimPages pops the furthest-used pages of l until want, and puts
// them back: they stay listed until they leave, and a victim the replay
// skips (the block being served) is offered again.
func (o *opt) VictimPages(l policy.Processor, want int, out []policy.Victim) []policy.Victim {
	h := &o.heaps[l.Slot()]
	var taken []optEntry
	byBlock := map[*block.Block]int{}
	serving, keep := o.s.eng.Sparing()
	for n := 0; n < want && h.Len() > 0; {
		e := heap.Pop(h).(optEntry)
		if !e.v.B.Resident[l.Slot()].Test(e.page) || (e.next <= o.s.ref && e.next != never) {
			continue // gone, or passed by: a newer entry stands for it
		}
		if e.v.B == serving && keep.Test(e.page) {
			taken = append(taken, e) // what the move brings stays
			continue
		}
		i, ok := byBlock[e.v.B]
		if !ok {
			i = len(out)
			byBlock[e.v.B] = i
			out = append(out, policy.Victim{Block: e.v.B.Ref})
		}
		if out[i].Pages.Test(e.page) {
			continue // a duplicate entry
		}
		out[i].Pages.Set(e.page)
		taken = append(taken, e)
		n++
	}
	for _, e := range taken {
		heap.Push(h, e)
	}
	return out
}

// oraclePrefetch brings, with each fault, every page of the faulted block
// that the faulting processor touches within the next window of
// references (as many as its memory holds pages), and nothing else: no
// page it brings is wasted, and no page of the block needed soon faults
// alone. It is the bound prefetch policies are measured against.
type oraclePrefetch struct{ s *sim }

func (p *oraclePrefetch) Name() string { return OraclePrefetch }

func (p *oraclePrefetch) Expand(c *policy.PrefetchContext) (out policy.PageMask) {
	s := p.s
	v, ok := block.RefOf(c.Block)
	if !ok {
		return out
	}
	window := s.capacity
	if c.Processor == core.CPU {
		window = 1 << 40
		if s.hostBudget > 0 {
			window = s.hostBudget / core.PageSize
		}
	}
	horizon := s.ref + int(min(window, 1<<40))
	for x := 0; x < c.Pages; x++ {
		if c.ResidentOnDest.Test(x) || c.Faulted.Test(x) || c.Thrashing.Test(x) {
			continue
		}
		if n := s.future.nextUse(keyOf(v, c.Processor, x), s.ref); n != never && n <= horizon {
			out.Set(x)
		}
	}
	return out
}
