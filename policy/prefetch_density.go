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
// one 2 MiB folio elsewhere (PrefetchContext.SourceLarge) in a sweep, or
// on the block's first or last page, where a sweep enters it, brings the
// whole block, unless it thrashes: taking part of it would first cost
// the rest 512 page allocations at its source. So does a fault in a
// sweep (PrefetchContext.Sweep) into a block that lives wholly
// elsewhere in 4 KiB folios, where the processor has room: the block
// then moves as one folio, and from there on whole each way (launch
// and touch of 64 MiB, both sides sweeping: 112 ms an iteration in six
// faults a block, 47 in about one), where the tree took six faults a
// block and 4 KiB folios for ever. Out of a sweep (random
// access to more memory than the host's budget) every fault brought 2
// MiB and pushed a 2 MiB victim out (gawk at a quarter of its peak: 77
// GiB each way in 20 s, unfinished).
//
// Where the faulting processor is full (PrefetchContext.Full) and the
// faults do not sweep, it brings no page that has a copy elsewhere
// beyond the faulted ones: under oversubscription each such page costs a
// copy in, a victim and a copy out, and random access wants few of them
// (jq at three quarters of its peak: 23 GiB each way in 30 s, unfinished,
// against 0.7 GiB and 8 s with the faulted pages only). Pages resident
// nowhere are still brought: a zero fill, and a heap's next allocation.
type DensityPrefetch struct{ Threshold int }

func (d DensityPrefetch) Name() string {
	return PrefetchSpec{Policy: "density", Threshold: d.Threshold}.String()
}

func (d DensityPrefetch) Expand(c *PrefetchContext) (out PageMask) {
	// A sweep enters a block at its first page (or, descending, its
	// last); a random fault lands there one time in 512.
	sweeping := c.Sweep || c.Faulted.Test(0) || c.Faulted.Test(c.Pages-1)
	whole := c.SourceLarge && sweeping || c.Sweep && !c.Full && c.Elsewhere.Count() == c.Pages
	if (!c.Populated && c.DestIsPreferred) || (whole && c.Thrashing.Empty()) {
		out.FillRange(0, c.Pages)
		return out
	}
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
	for p := migrate.NextSet(0); p >= 0 && p < c.Pages; p = migrate.NextSet(p + 1) {
		first, outer := d.region(&tree, p, c.Pages)
		out.FillRange(first, outer)
		if first == 0 && outer == c.Pages {
			break // the whole block is coming already
		}
	}
	out.AndNot(&c.Thrashing)
	if c.Full && !sweeping {
		out.AndNot(&c.Elsewhere)
	}
	return out
}

// ReadsAhead reads the next block ahead of a sweep that brings this one
// whole (policy.ReadAhead): the sweep will want it next, and moving it
// while the processor works on this block takes the move off the
// processor's path. Only for the host: a device's kernel works on its
// part of a range, and the block past it is another device's (six
// devices each reading ahead into the next one's part pulled over the
// part after it too, which its own kernel then faulted back). Not where
// pages thrash (they are being left alone), nor on a full processor: the
// block read ahead would push out one that the eviction policy keeps (a
// sweep of three times the host's budget moved a fifth more each way).
func (d DensityPrefetch) ReadsAhead(c *PrefetchContext, brought PageMask) bool {
	return c.Processor == CPU && c.Sweep && !c.Full && c.Thrashing.Empty() && brought.CountRange(0, c.Pages) == c.Pages
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
