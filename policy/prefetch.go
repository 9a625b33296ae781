package policy

import (
	"fmt"
	"sort"
	"strconv"
	"strings"
	"sync"

	"github.com/softuvm/softuvm/internal/core"
)

// PrefetchContext is what a prefetch policy sees of one fault: the block
// the fault landed in, seen from the processor that faulted.
type PrefetchContext struct {
	// Pages is the number of pages in the block: 512, or fewer for the
	// last block of a range that does not end on a 2 MiB boundary.
	Pages int
	// Faulted holds the pages being migrated because they faulted.
	Faulted core.PageMask
	// ResidentOnDest holds the pages already resident on the faulting
	// processor.
	ResidentOnDest core.PageMask
	// Populated reports whether any page of the block is resident
	// anywhere: false on the first touch of the block.
	Populated bool
	// DestIsPreferred reports that the faulting processor is the
	// preferred location of the range.
	DestIsPreferred bool
	// Thrashing holds pages the thrashing detector wants left alone.
	Thrashing core.PageMask
}

// PrefetchPolicy decides which pages of a block to bring to the faulting
// processor along with the pages that faulted. It runs on the fault path
// with the block locked: it must not block and should not allocate.
type PrefetchPolicy interface {
	// Name identifies the policy in statistics, as its spec string.
	Name() string
	// Expand returns the extra pages to migrate. Pages already resident
	// on the destination and the faulted pages themselves may be
	// included; the caller removes them.
	Expand(c *PrefetchContext) core.PageMask
}

// PrefetchSpec selects a prefetch policy. It is plain data: it can be
// printed, compared, parsed from a flag and sent to the server.
type PrefetchSpec struct {
	// Policy is "density" (the default), "window", "none", or a name
	// given to RegisterPrefetchPolicy.
	Policy string
	// Threshold is the density policy's percentage (1-100): a region is
	// prefetched when more than Threshold percent of it is resident or
	// faulted. 0 means NVIDIA's default, 51.
	Threshold int
	// Window is the window policy's page count.
	Window int
}

// DefaultDensityThreshold is NVIDIA's UVM_PREFETCH_THRESHOLD_DEFAULT
// (kernel-open/nvidia-uvm/uvm_perf_prefetch.c).
const DefaultDensityThreshold = 51

// DefaultPrefetch is the policy used when none is chosen.
var DefaultPrefetch = PrefetchSpec{Policy: "density", Threshold: DefaultDensityThreshold}

// ParsePrefetchSpec parses "density", "density:PERCENT", "window:PAGES",
// "none", or the name of a registered policy.
func ParsePrefetchSpec(text string) (PrefetchSpec, error) {
	name, arg, hasArg := strings.Cut(strings.TrimSpace(text), ":")
	switch name {
	case "", "density":
		spec := PrefetchSpec{Policy: "density", Threshold: DefaultDensityThreshold}
		if hasArg {
			t, err := strconv.Atoi(arg)
			if err != nil || t < 1 || t > 100 {
				return PrefetchSpec{}, fmt.Errorf("%w: prefetch policy %q: density threshold %q: want a percentage from 1 to 100", core.ErrInvalidValue, text, arg)
			}
			spec.Threshold = t
		}
		return spec, nil
	case "window":
		n, err := strconv.Atoi(arg)
		if !hasArg || err != nil || n < 1 || n > core.PagesPerBlock {
			return PrefetchSpec{}, fmt.Errorf("%w: prefetch policy %q: want window:PAGES with PAGES from 1 to %d", core.ErrInvalidValue, text, core.PagesPerBlock)
		}
		return PrefetchSpec{Policy: "window", Window: n}, nil
	case "none":
		if hasArg {
			return PrefetchSpec{}, fmt.Errorf("%w: prefetch policy %q: \"none\" takes no argument", core.ErrInvalidValue, text)
		}
		return PrefetchSpec{Policy: "none"}, nil
	}
	if _, ok := lookupPrefetchFactory(name); ok {
		return PrefetchSpec{Policy: text}, nil
	}
	return PrefetchSpec{}, fmt.Errorf("%w: prefetch policy %q: want one of %s", core.ErrInvalidValue, text, strings.Join(PrefetchPolicyNames(), ", "))
}

// NewPrefetchPolicy builds the policy a spec names.
func NewPrefetchPolicy(spec PrefetchSpec) (PrefetchPolicy, error) {
	switch spec.Policy {
	case "", "density":
		t := spec.Threshold
		if t == 0 {
			t = DefaultDensityThreshold
		}
		if t < 1 || t > 100 {
			return nil, fmt.Errorf("%w: density threshold %d: want 1 to 100", core.ErrInvalidValue, t)
		}
		return DensityPrefetch{Threshold: t}, nil
	case "window":
		if spec.Window < 1 || spec.Window > core.PagesPerBlock {
			return nil, fmt.Errorf("%w: prefetch window %d pages: want 1 to %d", core.ErrInvalidValue, spec.Window, core.PagesPerBlock)
		}
		return WindowPrefetch{Pages: spec.Window}, nil
	case "none":
		return NoPrefetch{}, nil
	}
	name, arg, _ := strings.Cut(spec.Policy, ":")
	factory, ok := lookupPrefetchFactory(name)
	if !ok {
		return nil, fmt.Errorf("%w: prefetch policy %q: want one of %s", core.ErrInvalidValue, spec.Policy, strings.Join(PrefetchPolicyNames(), ", "))
	}
	return factory(arg)
}

var prefetchRegistry struct {
	sync.RWMutex
	factories map[string]func(arg string) (PrefetchPolicy, error)
}

// RegisterPrefetchPolicy makes a policy available by name to
// ParsePrefetchSpec, flags and environment variables, so that a course
// can plug in its own. Register it from an init function: the fault
// server is a re-execution of the same program and must know it too.
func RegisterPrefetchPolicy(name string, factory func(arg string) (PrefetchPolicy, error)) error {
	switch name {
	case "", "density", "window", "none":
		return fmt.Errorf("%w: prefetch policy name %q is reserved", core.ErrInvalidValue, name)
	}
	if strings.ContainsAny(name, ": \t") {
		return fmt.Errorf("%w: prefetch policy name %q: must not contain ':' or spaces", core.ErrInvalidValue, name)
	}
	prefetchRegistry.Lock()
	defer prefetchRegistry.Unlock()
	if prefetchRegistry.factories == nil {
		prefetchRegistry.factories = map[string]func(string) (PrefetchPolicy, error){}
	}
	if _, dup := prefetchRegistry.factories[name]; dup {
		return fmt.Errorf("%w: prefetch policy %q registered twice", core.ErrInvalidValue, name)
	}
	prefetchRegistry.factories[name] = factory
	return nil
}

func lookupPrefetchFactory(name string) (func(string) (PrefetchPolicy, error), bool) {
	prefetchRegistry.RLock()
	defer prefetchRegistry.RUnlock()
	f, ok := prefetchRegistry.factories[name]
	return f, ok
}

// PrefetchPolicyNames lists the policies that can be chosen by name.
func PrefetchPolicyNames() []string {
	names := []string{"density[:PERCENT]", "window:PAGES", "none"}
	prefetchRegistry.RLock()
	var extra []string
	for n := range prefetchRegistry.factories {
		extra = append(extra, n)
	}
	prefetchRegistry.RUnlock()
	sort.Strings(extra)
	return append(names, extra...)
}

// NoPrefetch migrates only the pages that faulted.
type NoPrefetch struct{}

// WindowPrefetch brings the Pages pages that follow each faulted page,
// within its block: the sequential read-ahead of a page cache.
type WindowPrefetch struct{ Pages int }

// DensityPrefetch is NVIDIA's tree-based prefetcher
// (kernel-open/nvidia-uvm/uvm_perf_prefetch.c, compute_prefetch_region):
// the pages of a 2 MiB block are the leaves of a binary tree; walking up
// from a faulted page, the largest subtree in which more than Threshold
// percent of the pages are resident on the faulting processor or faulted
// is brought in whole. Before that, every 64 KiB big page that holds a
// fault counts as fully faulted, so the smallest migration is a big page.
// On the first touch of a block by its preferred location the whole block
// is populated.
type DensityPrefetch struct{ Threshold int }

// String renders the spec in the syntax ParsePrefetchSpec accepts.
func (s PrefetchSpec) String() string {
	switch s.Policy {
	case "density":
		if s.Threshold != 0 && s.Threshold != DefaultDensityThreshold {
			return "density:" + strconv.Itoa(s.Threshold)
		}
		return "density"
	case "window":
		return "window:" + strconv.Itoa(s.Window)
	case "":
		return DefaultPrefetch.String()
	}
	return s.Policy
}

func (NoPrefetch) Name() string { return "none" }

func (NoPrefetch) Expand(*PrefetchContext) (m core.PageMask) { return m }

func (w WindowPrefetch) Name() string { return "window:" + strconv.Itoa(w.Pages) }

func (w WindowPrefetch) Expand(c *PrefetchContext) (m core.PageMask) {
	for p := c.Faulted.NextSet(0); p >= 0; p = c.Faulted.NextSet(p + 1) {
		m.FillRange(p+1, min(p+1+w.Pages, c.Pages))
	}
	return m
}

func (d DensityPrefetch) Name() string {
	return PrefetchSpec{Policy: "density", Threshold: d.Threshold}.String()
}

func (d DensityPrefetch) Expand(c *PrefetchContext) (out core.PageMask) {
	if !c.Populated && c.DestIsPreferred {
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
	return out
}

// region walks from leaf page up to the root and returns the last (that
// is, largest) subtree dense enough to prefetch, clamped to the block.
func (d DensityPrefetch) region(tree *core.PageMask, page, pages int) (first, outer int) {
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
