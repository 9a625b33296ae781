package policy

import "github.com/softuvm/softuvm/internal/core"

// DensityPrefetch is NVIDIA's tree-based prefetcher
// (kernel-open/nvidia-uvm/uvm_perf_prefetch.c, compute_prefetch_region):
// the pages of a 2 MiB block are the leaves of a binary tree; walking up
// from a faulted page, the largest subtree in which more than Threshold
// percent of the pages are resident on the faulting processor or faulted
// is brought in whole. Before that, every 64 KiB big page that holds a
// fault counts as fully faulted, so the smallest migration is a big page.
// On the first touch of a block by its preferred location the whole block
// is populated. Unlike NVIDIA's, a fault into a block that lives whole in
// one 2 MiB folio elsewhere (PrefetchContext.SourceLarge) in a sweep
// brings the whole block, unless it thrashes: taking part of it would
// first cost the rest 512 page allocations at its source. And where the
// destination is full and the faults do not sweep (random access to more
// memory than fits), a fault brings its big page and no more: every page
// more would push out one that may be in use, and under random access
// the tree is dense only because most of memory fits, not because the
// rest of the block is wanted (gawk at a quarter of its peak moved 145
// KiB each way per fault, and 15 GiB in 25 s, until this).
type DensityPrefetch struct{ Threshold int }

func (d DensityPrefetch) Name() string {
	return PrefetchSpec{Policy: "density", Threshold: d.Threshold}.String()
}

func (d DensityPrefetch) Expand(c *PrefetchContext) (out PageMask) {
	if (!c.Populated && c.DestIsPreferred) || (c.SourceLarge && c.Sweep && c.Thrashing.Empty()) {
		out.FillRange(0, c.Pages)
		return out
	}
	faultedOnly := c.Full && !c.Sweep
	tree := c.ResidentOnDest
	tree.Or(&c.Faulted)
	// Grow the fault granularity to big pages unless they thrash.
	for first := 0; first < c.Pages; first += core.BigPagePages {
		outer := min(first+core.BigPagePages, c.Pages)
		if c.Faulted.CountRange(first, outer) > 0 && c.Thrashing.CountRange(first, outer) == 0 {
			tree.FillRange(first, outer)
		}
	}
	migrate := c.Faulted
	migrate.AndNot(&c.Thrashing)
	if faultedOnly {
		return migrate
	}
	for p := migrate.NextSet(0); p >= 0 && p < c.Pages; p = migrate.NextSet(p + 1) {
		first, outer := d.region(&tree, p, c.Pages)
		out.FillRange(first, outer)
		if first == 0 && outer == c.Pages {
			break // the whole block is coming already
		}
	}
	out.AndNot(&c.Thrashing)
	return out
}

// region walks from leaf page up to the root and returns the last (that
// is, largest) subtree dense enough to prefetch, clamped to the block.
func (d DensityPrefetch) region(tree *PageMask, page, pages int) (first, outer int) {
	first, outer = page, page+1
	for size := 1; size <= core.PagesPerBlock; size <<= 1 {
		lo := page &^ (size - 1)
		hi := min(lo+size, pages)
		if lo >= hi {
			break
		}
		// NVIDIA's tree is sized to a power of two; its subregions are
		// clamped to the real leaves, as here.
		if tree.CountRange(lo, hi)*100 > (hi-lo)*d.Threshold {
			first, outer = lo, hi
		}
	}
	return first, outer
}
