package policy

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/softuvm/softuvm/internal/core"
)

// PrefetchContext is what a prefetch policy sees of one fault: the block
// the fault landed in, seen from the processor that faulted.
type PrefetchContext struct {
	// Block is the block the fault landed in.
	Block *Block
	// Processor is the processor that faulted, and the destination.
	Processor Processor
	// Write reports that the first faulted page faulted on a write.
	Write bool
	// Now is the server's clock at the fault.
	Now Clock
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
	// Elsewhere holds the pages with a copy at another location only:
	// bringing one is a copy, where a page resident nowhere is a fresh
	// zero-filled page.
	Elsewhere core.PageMask
	// Full reports that the faulting processor has room for fewer than
	// FullRoomBlocks blocks without evicting (the host at its budget, a
	// device's arena full): every page brought beyond the faulted ones
	// pushes a page out, which may be wanted sooner than the one brought.
	Full bool
	// DestIsPreferred reports that the faulting processor is the
	// preferred location of the range.
	DestIsPreferred bool
	// Thrashing holds pages the thrashing detector wants left alone.
	Thrashing core.PageMask
	// SourceLarge reports that every page of the block lives at one
	// other location, in one 2 MiB folio: moving the whole block then
	// costs one folio allocated and one freed, while moving part of it
	// first rebuilds the rest of that folio in 4 KiB pages (512
	// allocations).
	SourceLarge bool
	// Sweep reports that the processor's last three faults on the range
	// each landed just past (within four big pages of) what the one
	// before brought, on the same side: it is walking the memory, and
	// will likely want the rest of the block.
	Sweep bool
	// Descending reports that the sweep runs toward lower addresses.
	Descending bool
}

// PrefetchPolicy decides which pages of a block to bring to the faulting
// processor along with the pages that faulted.
//
// Concurrency: the server makes one instance per range (WithPrefetch) or
// one for the whole server, and calls Expand from every fault handler at
// once, each with the lock of the context's block held, so two calls for
// the same block never overlap but calls for different blocks do. Expand
// must be safe for concurrent use (keep no state, or lock it yourself),
// must not block, must not call back into the server, and should not
// allocate: it is on the path of every fault.
type PrefetchPolicy interface {
	// Name identifies the policy in statistics, as its spec string.
	Name() string
	// Expand returns the extra pages to migrate. Pages already resident
	// on the destination and the faulted pages themselves may be
	// included; the caller removes them.
	Expand(c *PrefetchContext) core.PageMask
}

// ReadAhead is implemented by a PrefetchPolicy that also asks for the
// block after the faulted one, in the sweep's direction, to be brought to
// the host in the background while it still works on this one: the page
// cache's read-ahead, a block at a time. The server moves that block on
// another thread, and the next one each time the host first faults on a
// block it read ahead (a sweep then finds each block waiting, and its
// fault only maps it), up to Mechanism.ReadAheads of one range at once.
// Which processors are read ahead for is the policy's choice
// (PrefetchContext.Processor): density reads ahead only for the host.
// The server brings a block only where all of it lives where
// the faulted block came from (a block never touched is left to its
// first toucher, which places it, and one that lives elsewhere to the
// processor using it), the range has no advice there, and the host has
// room to spare (a read-ahead never evicts).
//
// ReadsAhead is called after Expand, with the same context, with the
// pages the fault brings (faulted and prefetched); the same rules of
// concurrency apply. The lab's replay runs it as the server does, the
// block read ahead at once rather than on another thread.
type ReadAhead interface {
	ReadsAhead(c *PrefetchContext, brought core.PageMask) bool
}

// ReadsAhead asks p, where it implements ReadAhead, whether the fault of
// c, which brings brought, reads the next block ahead.
func ReadsAhead(p PrefetchPolicy, c *PrefetchContext, brought core.PageMask) bool {
	ra, ok := p.(ReadAhead)
	return ok && ra.ReadsAhead(c, brought)
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
	return PrefetchSpec{}, prefetchRegistry.unknown(text)
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
		return nil, prefetchRegistry.unknown(spec.Policy)
	}
	return factory(arg)
}

var prefetchRegistry = newRegistry[func(arg string) (PrefetchPolicy, error)](KindPrefetch, "density[:PERCENT]", "window:PAGES", "none")

// RegisterPrefetchPolicy makes a policy available by name to
// ParsePrefetchSpec, the --prefetch flag, UVM_PREFETCH and WithPrefetch,
// so that a course can plug in its own; factory gets what follows
// "name:" in the spec. Register it from an init function: a private
// fault server is a re-execution of the same program and must know it
// too, and a daemon or a C program's server must be a binary that
// registers it (see the policy package's documentation).
func RegisterPrefetchPolicy(name string, factory func(arg string) (PrefetchPolicy, error)) error {
	return prefetchRegistry.register(name, factory, false)
}

func lookupPrefetchFactory(name string) (func(string) (PrefetchPolicy, error), bool) {
	return prefetchRegistry.lookup(name)
}

// PrefetchPolicyNames lists the policies that can be chosen by name.
func PrefetchPolicyNames() []string { return prefetchRegistry.names() }

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

// FullRoomBlocks is the room, in blocks, below which a processor is full
// (PrefetchContext.Full): two, since eviction frees whole blocks, and
// right after one a block's worth is free and soon gone.
const FullRoomBlocks = 2

// Expanded asks p which pages to bring with c's faulted ones. extra is
// what it chose less the pages already at the destination and the
// faulted ones; brought is everything the fault brings, faulted pages
// included (what the sweep test remembers). The server and the lab's
// replay both call it.
func Expanded(p PrefetchPolicy, c *PrefetchContext) (extra, brought core.PageMask) {
	extra = p.Expand(c)
	extra.TrimTo(c.Pages)
	brought = extra
	brought.Or(&c.Faulted)
	extra.AndNot(&c.ResidentOnDest)
	extra.AndNot(&c.Faulted)
	return extra, brought
}

// How the server tells a sweep (PrefetchContext.Sweep): SweepWindow is
// how far, in pages, past either end of what its processor's last fault
// on the range brought a fault must land to continue a sweep (four big
// pages); SweepRun is how many faults in a row, each so landing on the
// same side, make one.
const (
	SweepWindow = 4 * core.BigPagePages
	SweepRun    = 3
)

// SweepStep is the sweep test of one fault. lo and hi are the pages of
// the range that the processor's last fault brought, first and last (lo
// negative: none yet); run counts the faults in a row that landed just
// past them, up while they ascend, down while they descend; page is the
// new fault's page in the range. It returns the new run and whether the
// fault continues a sweep. Under random access one fault in twenty lands
// near the one before (gawk at a quarter of its peak), and each taken
// for a sweep brought a whole block; three in a row, one way, are rare.
//
// Where the processor is full (PrefetchContext.Full) a sweep must be
// dense: each fault on the very page after what the last brought. A
// walk that strides through the heap (jq's over its records) lands
// within the window often enough to be taken for a sweep, and the whole
// blocks it then brought pushed out what it came back for: 46 GiB moved
// each way in 40 s at three quarters of jq's peak, unfinished, against
// 1.6 GiB and 11 s with dense sweeps only. The server and the lab's
// replay both call it.
func SweepStep(lo, hi int64, run int32, page int64, full bool) (int32, bool) {
	window := int64(SweepWindow)
	if full {
		window = 1
	}
	switch {
	case lo >= 0 && page > hi && page-hi <= window:
		run = max(run, 0) + 1
	case lo >= 0 && page < lo && lo-page <= window:
		run = min(run, 0) - 1
	default:
		run = 0
	}
	return run, run >= SweepRun || run <= -SweepRun
}
