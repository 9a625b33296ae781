package policy

import (
	"fmt"
	"strings"

	"github.com/softuvm/softuvm/internal/core"
)

// Eviction chooses which blocks leave a processor's memory when it is
// full (a device's arena, or the host over its budget). The server tells
// it where blocks' pages arrive and when a processor holds none of a
// block any more; when it needs room on a processor it asks for victims,
// best first, and moves every page of each victim away (a device's to the
// host, the host's to the roomiest device) until it has enough.
//
// Concurrency: one instance serves the whole server. Arrived and Left are
// called from every fault handler and mover at once, each with the lock
// of the block in question held; Victims is called with the lock of the
// block that needs the room held (that block is never evicted for itself,
// and victims whose lock is held elsewhere are skipped). Every method must
// be safe for concurrent use, must not block on anything but its own
// short locks, and must not call back into the server.
type Eviction interface {
	// Name identifies the policy in the server's info, as its spec.
	Name() string
	// Arrived notes that pages of b now live on processor p, moved there
	// for cause (or populated by a first touch, with CauseFault). Only
	// managed memory is reported: device memory (Malloc) and pinned host
	// memory are never evicted.
	Arrived(b *Block, p Processor, pages int, cause Cause)
	// Left notes that processor p holds no page of b any more (they moved
	// away, or the block was freed: then Left is called for every
	// processor that held some).
	Left(b *Block, p Processor)
	// Victims appends to out up to n blocks that have pages on processor
	// p, the best victim first, and returns it. The blocks stay the
	// policy's to track: the server calls Left for those it empties.
	Victims(p Processor, n int, out []*Block) []*Block
}

// PageEviction is an Eviction that chooses pages rather than whole
// blocks. The server tells it which pages arrive and leave (instead of
// Arrived; Left still says that a processor holds none of a block), and,
// when it needs room, asks VictimPages instead of Victims, and moves the
// victims' pages away (those still resident there).
//
// Concurrency is Eviction's.
type PageEviction interface {
	Eviction
	// ArrivedPages notes that pages of b now live on processor p, moved
	// there for cause (or populated by a first touch, with CauseFault).
	ArrivedPages(b *Block, p Processor, pages PageMask, cause Cause)
	// LeftPages notes that pages of b are no longer on processor p.
	LeftPages(b *Block, p Processor, pages PageMask)
	// VictimPages appends to out victims on processor p, best first,
	// whose pages add up to want or more where the processor holds that
	// many, and returns it.
	VictimPages(p Processor, want int, out []Victim) []Victim
}

// CleanCopying is an Eviction that asks for clean eviction. When the
// host reads back a page whose only copy is on a device, the server then
// duplicates it instead of migrating it: the device keeps its copy, and
// every mapping of both copies is write-protected (read duplication). So
// long as the host does not write it, the page leaves the host again
// without a copy: the host's copy is dropped, the device's is current. A
// host write costs a write-protect fault that drops the device's copy
// and marks the page written; a written page migrates from then on,
// since a program that wrote it once likely writes it again.
type CleanCopying interface {
	Eviction
	// CleanCopies reports whether the policy wants clean eviction.
	CleanCopies() bool
}

// AskVictims is how the fault server (and the lab's replay) asks ev for
// victims on processor from worth want pages: pev's pages where the
// policy chooses pages (pev is ev as a PageEviction, or nil), else whole
// blocks. A block policy is asked for enough whole blocks and two more,
// for a victim that is busy or is the block being served (never its own
// victim), at most 16: asking for no more than that matters to a policy
// that judges its candidates (HintClock), whose further offers are in
// list order.
func AskVictims(ev Eviction, pev PageEviction, from Processor, want int64, out []Victim) []Victim {
	if pev != nil {
		return pev.VictimPages(from, int(want), out)
	}
	var refs [16]*Block
	n := int(min((want+PagesPerBlock-1)/PagesPerBlock+2, int64(len(refs))))
	for _, b := range ev.Victims(from, n, refs[:0]) {
		out = append(out, Victim{Block: b, Pages: wholeBlock})
	}
	return out
}

// Victim is pages of a block that PageEviction would have leave.
type Victim struct {
	Block *Block
	Pages PageMask
}

var evictionRegistry = newRegistry[func(arg string) (Eviction, error)](KindEviction, "lru", "2q", "clock[:regions|copy]", "reuse")

// DefaultEviction is the policy used when none is chosen: "clock"
// (HintClock), whole blocks chosen by the use the server watches with
// hint faults, which moved fewer bytes than NVIDIA's least recently
// migrated blocks ("lru", the default before it) on every program of
// `uvm bench run` (docs/benchmarks.md). "2q" (TwoQ) evicts 64 KiB regions
// and resists loops, but splits the 2 MiB folios that whole-block moves
// rely on.
const DefaultEviction = "clock"

func init() {
	if err := evictionRegistry.register("lru", func(arg string) (Eviction, error) {
		if arg != "" {
			return nil, fmt.Errorf("%w: eviction policy \"lru:%s\": lru takes no argument", core.ErrInvalidValue, arg)
		}
		return NewLRU(), nil
	}, true); err != nil {
		panic(err)
	}
}

// RegisterEviction makes an eviction policy available by name to the
// --eviction flag, UVM_EVICTION and ServerConfig.Eviction; factory gets
// what follows "name:" in the spec. Register it from an init function
// (see RegisterPrefetchPolicy for why).
func RegisterEviction(name string, factory func(arg string) (Eviction, error)) error {
	return evictionRegistry.register(name, factory, false)
}

// EvictionNames lists the eviction policies that can be chosen by name.
func EvictionNames() []string { return evictionRegistry.names() }

// ValidateEviction checks that spec ("name" or "name:arg") names a known
// policy, without building it.
func ValidateEviction(spec string) error {
	name, _, _ := strings.Cut(spec, ":")
	if name == "" {
		return nil
	}
	if _, ok := evictionRegistry.lookup(name); !ok {
		return evictionRegistry.unknown(spec)
	}
	return nil
}

// NewEviction builds the eviction policy spec names ("" is the default).
func NewEviction(spec string) (Eviction, error) {
	if spec == "" {
		spec = DefaultEviction
	}
	name, arg, _ := strings.Cut(spec, ":")
	f, ok := evictionRegistry.lookup(name)
	if !ok {
		return nil, evictionRegistry.unknown(spec)
	}
	return f(arg)
}
