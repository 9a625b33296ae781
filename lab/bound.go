package lab

import (
	"bufio"
	"bytes"
	"container/heap"
	"fmt"
	"io"
	"iter"
	"math"
	"slices"
	"strconv"
)

// A replay sees only the references a trace holds: what faulted under
// the recorded policies, and the access mode's samples. The bound below
// sees every load and store a program made (valgrind's lackey tool
// reports each), so it says what any eviction policy could do with the
// program's whole reference stream, not only with what one server saw.

// PageSize is the bound's unit of reference: a 4 KiB page.
const PageSize = 4096

// storeBit marks a reference that wrote its page, in RefStream.seq.
const storeBit = 1 << 31

// RefStream is a program's data references at page granularity: the
// pages in order of reference, consecutive references to one page
// collapsed into one (a store among them makes it a store).
type RefStream struct {
	pages []uint64 // page number (address / PageSize) of each page id
	seq   []uint32 // page ids in order of reference; storeBit: a store
	// Loads and Stores count the references read, before collapsing
	// (a modify, lackey's "M", counts as a store).
	Loads, Stores int64
}

// References is the number of references after collapsing.
func (r *RefStream) References() int { return len(r.seq) }

// refBuilder appends references to a RefStream, collapsing repeats.
type refBuilder struct {
	r         *RefStream
	ids       map[uint64]uint32
	last      uint32
	lastStore bool
}

func newRefBuilder() *refBuilder {
	return &refBuilder{r: &RefStream{}, ids: map[uint64]uint32{}, last: math.MaxUint32}
}

// add appends one reference to page (a page number, address /
// PageSize), without counting it in Loads or Stores.
func (b *refBuilder) add(page uint64, store bool) error {
	r := b.r
	id, ok := b.ids[page]
	if !ok {
		if len(r.pages) >= storeBit-1 {
			return fmt.Errorf("more than %d distinct pages referenced: too many for the bound", storeBit-1)
		}
		id = uint32(len(r.pages))
		b.ids[page] = id
		r.pages = append(r.pages, page)
	}
	if id == b.last && (b.lastStore || !store) {
		return nil
	}
	if len(r.seq) == math.MaxInt32 {
		return fmt.Errorf("more than %d page references after collapsing repeats: run a smaller input", math.MaxInt32)
	}
	b.last, b.lastStore = id, store
	if store {
		id |= storeBit
	}
	r.seq = append(r.seq, id)
	return nil
}

// PageRefs makes a RefStream of a reference string known page by page
// (a synthetic program's, computed rather than traced): refs yields each
// reference's page number (address / PageSize) and whether it stores.
// Each counts once in Loads or Stores; repeats collapse as ReadLackey's.
func PageRefs(refs iter.Seq2[uint64, bool]) (*RefStream, error) {
	b := newRefBuilder()
	for page, store := range refs {
		if store {
			b.r.Stores++
		} else {
			b.r.Loads++
		}
		if err := b.add(page, store); err != nil {
			return nil, err
		}
	}
	return b.r, nil
}

// ReadLackey reads the output of valgrind --tool=lackey --trace-mem=yes:
// lines " L ADDR,SIZE", " S ADDR,SIZE" and " M ADDR,SIZE" are the data
// references (load, store, modify), hexadecimal; instruction fetches
// ("I") and valgrind's own messages ("==PID== ...") are skipped. A
// reference that crosses a page boundary references both pages.
func ReadLackey(in io.Reader) (*RefStream, error) {
	b := newRefBuilder()
	r := b.r
	br := bufio.NewReaderSize(in, 1<<20)
	for lineNo := 1; ; lineNo++ {
		line, err := br.ReadSlice('\n')
		if err == bufio.ErrBufferFull {
			return nil, fmt.Errorf("lackey output line %d: longer than %d bytes", lineNo, br.Size())
		}
		if len(line) >= 4 && line[0] == ' ' && line[2] == ' ' && (line[1] == 'L' || line[1] == 'S' || line[1] == 'M') {
			addr, size, perr := parseLackeyRef(bytes.TrimRight(line[3:], "\r\n"))
			if perr != nil {
				return nil, fmt.Errorf("lackey output line %d %q: %w", lineNo, bytes.TrimSpace(line), perr)
			}
			store := line[1] != 'L'
			if store {
				r.Stores++
			} else {
				r.Loads++
			}
			first, end := addr/PageSize, (addr+max(size, 1)-1)/PageSize
			for p := first; p <= end; p++ {
				if aerr := b.add(p, store); aerr != nil {
					return nil, aerr
				}
			}
		}
		if err == io.EOF {
			return r, nil
		}
		if err != nil {
			return nil, err
		}
	}
}

// parseLackeyRef parses "ADDR,SIZE" (hexadecimal address, decimal size).
func parseLackeyRef(text []byte) (addr, size uint64, err error) {
	a, s, ok := bytes.Cut(text, []byte{','})
	if !ok {
		return 0, 0, fmt.Errorf("want ADDR,SIZE")
	}
	if addr, err = strconv.ParseUint(string(a), 16, 64); err != nil {
		return 0, 0, fmt.Errorf("address: %w", err)
	}
	if size, err = strconv.ParseUint(string(s), 10, 64); err != nil {
		return 0, 0, fmt.Errorf("size: %w", err)
	}
	return addr, size, nil
}

// Span is a range of addresses [Start, End).
type Span struct{ Start, End uint64 }

// NotHeap picks from a /proc/PID/maps text, read at a program's exit,
// the mappings that are not its heap: those of files (its executable and
// libraries, their data segments, locale files), the kernel's ([stack],
// [vdso], [vvar]) but [heap], and the one holding stack (an address on
// the main thread's stack, whose mapping valgrind leaves unnamed).
// Everything else the program referenced is heap: malloc's arenas and
// brk heap, anonymous mmaps (CPython's arenas, threads' stacks), and
// those it unmapped before its exit, which the maps no longer show. This
// is what `uvm run` makes managed (but a data segment of at least
// --min-size, which --statics makes managed and this counts as not heap).
func NotHeap(maps []byte, stack uint64) ([]Span, error) {
	var out []Span
	for i, line := range bytes.Split(maps, []byte{'\n'}) {
		fields := bytes.Fields(line)
		if len(fields) == 0 {
			continue
		}
		if len(fields) < 5 {
			return nil, fmt.Errorf("maps line %d %q: want ADDRESSES PERMS OFFSET DEV INODE [PATH]", i+1, line)
		}
		lo, hi, ok := bytes.Cut(fields[0], []byte{'-'})
		start, err1 := strconv.ParseUint(string(lo), 16, 64)
		end, err2 := strconv.ParseUint(string(hi), 16, 64)
		if !ok || err1 != nil || err2 != nil || end <= start {
			return nil, fmt.Errorf("maps line %d %q: bad address range", i+1, line)
		}
		named := len(fields) > 5 && string(fields[5]) != "[heap]"
		if named || (stack >= start && stack < end) {
			out = append(out, Span{start, end})
		}
	}
	return out, nil
}

// Granules is the stream of one granule size: the references to
// granules (GranuleBytes of aligned address space) outside some spans,
// collapsed as RefStream's pages are.
type Granules struct {
	GranuleBytes int64
	seq          []uint32 // granule ids; storeBit: a store
	count        int      // distinct granules
	// lruFaults[d] counts the references whose LRU stack distance (the
	// distinct granules referenced since the granule's previous
	// reference) is d; cold references are not counted.
	lruFaults []int64
}

// Granules restricts the stream to the references outside exclude (all
// of them where exclude is nil) and groups their pages into granules of
// granuleBytes, a power of two multiple of PageSize.
func (r *RefStream) Granules(exclude []Span, granuleBytes int64) (*Granules, error) {
	if granuleBytes < PageSize || granuleBytes&(granuleBytes-1) != 0 {
		return nil, fmt.Errorf("granule %d bytes: want a power of two of at least %d", granuleBytes, PageSize)
	}
	shift := uint(0)
	for PageSize<<shift < granuleBytes {
		shift++
	}
	// granuleOf[id]: the granule id of page id, or -1 where excluded.
	granuleOf := make([]int32, len(r.pages))
	ids := map[uint64]int32{}
	for i, p := range r.pages {
		if excludedPage(exclude, p) {
			granuleOf[i] = -1
			continue
		}
		g, ok := ids[p>>shift]
		if !ok {
			g = int32(len(ids))
			ids[p>>shift] = g
		}
		granuleOf[i] = g
	}
	g := &Granules{GranuleBytes: granuleBytes, count: len(ids)}
	last := int32(-1)
	for _, v := range r.seq {
		x := granuleOf[v&^storeBit]
		if x < 0 {
			continue
		}
		if x == last {
			if v&storeBit != 0 {
				g.seq[len(g.seq)-1] |= storeBit
			}
			continue
		}
		last = x
		g.seq = append(g.seq, uint32(x)|v&storeBit)
	}
	g.lruFaults = g.stackDistances()
	return g, nil
}

// Footprint is the bytes of the distinct granules referenced.
func (g *Granules) Footprint() int64 { return int64(g.count) * g.GranuleBytes }

// References is the number of references after collapsing.
func (g *Granules) References() int { return len(g.seq) }

// stackDistances histograms the LRU stack distance of every reference
// but the first to each granule: a Fenwick tree over positions in the
// stream marks each granule's latest reference, so the distinct
// granules since a granule's previous reference are the marks after it.
func (g *Granules) stackDistances() []int64 {
	n := len(g.seq)
	tree := make([]int32, n+1)
	add := func(i int, d int32) {
		for i++; i <= n; i += i & -i {
			tree[i] += d
		}
	}
	prefix := func(i int) (s int32) { // marks in [0, i)
		for ; i > 0; i -= i & -i {
			s += tree[i]
		}
		return s
	}
	prev := make([]int32, g.count)
	for i := range prev {
		prev[i] = -1
	}
	hist := make([]int64, g.count)
	for i, v := range g.seq {
		x := v &^ storeBit
		if p := prev[x]; p >= 0 {
			hist[prefix(i)-prefix(int(p)+1)]++
			add(int(p), -1)
		}
		add(i, 1)
		prev[x] = int32(i)
	}
	return hist
}

// Misses is what a memory of capacity granules misses on the stream.
type Misses struct {
	Capacity int   // granules
	Cold     int64 // first references: every policy takes these
	// LRU and OPT are the misses but the cold ones of least recently
	// used eviction and of Belady's MIN (evict the granule used furthest
	// in the future: no policy misses fewer).
	LRU, OPT int64
	// OPTWriteBacks is how many of MIN's evictions took a granule written
	// since it arrived: its bytes must be copied out, whatever the policy
	// keeps of clean copies. (Granules left at the end are not counted.)
	OPTWriteBacks int64
}

// Misses counts LRU's and MIN's misses with room for capacity granules
// (at least one).
func (g *Granules) Misses(capacity int) Misses {
	capacity = max(capacity, 1)
	m := Misses{Capacity: capacity, Cold: int64(g.count)}
	for d := capacity; d < len(g.lruFaults); d++ {
		m.LRU += g.lruFaults[d]
	}
	m.OPT, m.OPTWriteBacks = g.belady(capacity)
	return m
}

// belady runs MIN: on a miss with the memory full, evict the resident
// granule whose next reference is furthest away (never, first). The
// candidates sit in a max-heap keyed by next reference; an entry whose
// granule has been referenced again since is stale and skipped.
func (g *Granules) belady(capacity int) (misses, writeBacks int64) {
	n := len(g.seq)
	const never = math.MaxInt32
	next := make([]int32, n)
	upcoming := make([]int32, g.count)
	for i := range upcoming {
		upcoming[i] = never
	}
	for i := n - 1; i >= 0; i-- {
		x := g.seq[i] &^ storeBit
		next[i] = upcoming[x]
		upcoming[x] = int32(i)
	}
	resident := make([]bool, g.count)
	seen := make([]bool, g.count)
	dirty := make([]bool, g.count)
	nextOf := make([]int32, g.count) // the live heap entry's key
	h := &optHeap{}                  // the replay's MIN heap; entries name a granule by page, b unused
	size := 0
	for i, v := range g.seq {
		x := v &^ storeBit
		if !resident[x] {
			if seen[x] {
				misses++
			}
			seen[x] = true
			if size == capacity {
				for {
					e := heap.Pop(h).(optEntry)
					if resident[e.page] && int(nextOf[e.page]) == e.next {
						resident[e.page] = false
						if dirty[e.page] {
							writeBacks++
							dirty[e.page] = false
						}
						break
					}
				}
				size--
			}
			resident[x] = true
			size++
		}
		if v&storeBit != 0 {
			dirty[x] = true
		}
		nextOf[x] = next[i]
		heap.Push(h, optEntry{next: int(next[i]), page: int(x)})
		if h.Len() > 4*capacity+1024 {
			// Drop the stale entries, so that the heap stays a few times
			// the capacity however long the stream.
			*h = slices.DeleteFunc(*h, func(e optEntry) bool { return !resident[e.page] || int(nextOf[e.page]) != e.next })
			heap.Init(h)
		}
	}
	return misses, writeBacks
}
