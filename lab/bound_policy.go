package lab

import (
	"fmt"
	"io"
	"time"

	"github.com/softuvm/softuvm/internal/core"
	"github.com/softuvm/softuvm/trace"
)

// PolicyFaults replays the stream's references outside exclude, page by
// page, through the block engine with eviction policy spec (the server's
// own, as a trace's replay runs it), demand fetching (prefetch none) and
// no thrashing policy, under a host budget of budgetBytes, and returns
// the faults it takes but the cold ones (each page's first reference),
// as Misses counts LRU's and MIN's at a granule of a page: the three
// side by side are what the policy gives up on the program's every
// reference. Each 2 MiB block the stream references is an allocation at
// its own address, so that the policy sees the program's blocks.
func (r *RefStream) PolicyFaults(exclude []Span, spec string, budgetBytes int64) (int64, error) {
	if spec == OracleEviction {
		return 0, fmt.Errorf("%w: eviction %q: MIN is the bound's own count (Misses), not a policy to replay here", core.ErrInvalidValue, spec)
	}
	src := &refSource{r: r, exclude: exclude}
	src.h = trace.Header{Devices: 1, HostBudget: max(budgetBytes, PageSize),
		Policies: map[string]string{"prefetch": "none", "eviction": spec, "thrashing": "off"}}
	seen := map[uint64]bool{}
	cold := int64(0)
	for _, page := range r.pages {
		if excludedPage(exclude, page) {
			continue
		}
		cold++
		if block := page / core.PagesPerBlock; !seen[block] {
			seen[block] = true
			src.blocks = append(src.blocks, block)
		}
	}
	res, err := replay(src, Config{}, nil)
	if err != nil {
		return 0, err
	}
	return int64(res.Replayed.Faults) - cold, nil
}

// excludedPage reports whether page (a page number) lies in a span of
// exclude.
func excludedPage(exclude []Span, page uint64) bool {
	a := page * PageSize
	for _, s := range exclude {
		if a >= s.Start && a < s.End {
			return true
		}
	}
	return false
}

// refSource is a RefStream as a trace's events, made as they are read:
// an allocation for each block, then a fault for each reference.
type refSource struct {
	h       trace.Header
	r       *RefStream
	exclude []Span
	blocks  []uint64 // block numbers (address / 2 MiB) to allocate
	next    int      // events made
	ref     int      // the next reference of r.seq
}

func (s *refSource) Header() trace.Header { return s.h }

func (s *refSource) Next(e *trace.Event) error {
	s.next++
	if i := s.next - 1; i < len(s.blocks) {
		*e = trace.Event{Kind: trace.KindAlloc, Time: time.Duration(s.next), Range: uint64(i + 1),
			Addr: s.blocks[i] * core.BlockSize, Bytes: core.BlockSize}
		return nil
	}
	for s.ref < len(s.r.seq) {
		v := s.r.seq[s.ref]
		s.ref++
		page := s.r.pages[v&^storeBit]
		if excludedPage(s.exclude, page) {
			continue
		}
		*e = trace.Event{Kind: trace.KindFault, Time: time.Duration(s.next), Processor: trace.CPU,
			Addr: page * PageSize, Write: v&storeBit != 0}
		return nil
	}
	return io.EOF
}
