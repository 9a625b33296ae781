package policy

import (
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/softuvm/softuvm/internal/core"
)

// Processor names a processor: CPU (-1) for the host, or a device index
// from 0. It is the one encoding of a processor everywhere: in the public
// API (uvm.Device), in the server and on the wire.
type Processor = core.Device

// CPU is the host processor.
const CPU = core.CPU

// PageMask is a set of pages of one block, a bit per page.
type PageMask = core.PageMask

// PagesPerBlock is the number of pages of a full block (2 MiB of 4 KiB
// pages); the last block of a range may have fewer.
const PagesPerBlock = core.PagesPerBlock

// Block is one 2 MiB block of a session's managed memory, as the server
// shows it to a policy. The server makes one Block per block and passes
// the same pointer for it until the block is freed, so a policy may use
// *Block as a map key.
type Block struct {
	// Session is the id of the client session the block belongs to.
	Session uint64
	// Addr is the block's first address in the client's address space.
	Addr uintptr
	// Pages is the number of pages of the block (PagesPerBlock, or fewer
	// at the end of a range).
	Pages int
	owner any
}

// NewBlock is for the server: it makes the Block of one of its blocks.
func NewBlock(session uint64, addr uintptr, pages int, owner any) *Block {
	return &Block{Session: session, Addr: addr, Pages: pages, owner: owner}
}

// Owner is for the server: the block this Block stands for.
func (b *Block) Owner() any { return b.owner }

func (b *Block) String() string { return fmt.Sprintf("session %d block %#x", b.Session, b.Addr) }

// Cause says why pages moved (core.Cause: the statistics count
// migrations by it too).
type Cause = core.Cause

const (
	CauseFault    = core.CauseFault    // a fault on one of them
	CausePrefetch = core.CausePrefetch // a prefetch (cudaMemPrefetchAsync)
	CauseEviction = core.CauseEviction // room was made on their location
	CauseCounters = core.CauseCounters // access counters crossed the threshold
	CauseAdvice   = core.CauseAdvice   // advice (read duplication, a pin)
	CauseLaunch   = core.CauseLaunch   // a launch under the launch coherence model handed them to its device
)

// Clock is the server's clock as policies see it: time since the server
// started, never 0.
type Clock = time.Duration

// The kinds of policy, as Ref and UnknownError name them.
const (
	KindPrefetch        = "prefetch"
	KindEviction        = "eviction"
	KindThrashing       = "thrashing"
	KindAccessMigration = "access migration"
)

// Ref names one policy: its kind and its name, without argument.
type Ref struct {
	Kind string
	Name string
}

func (r Ref) String() string { return fmt.Sprintf("%s policy %q", r.Kind, r.Name) }

// Registered lists every policy that can be chosen by name now, the
// built-in ones included. What it returns depends on when it is asked:
// a policy registered by an init function exists only once that function
// has run, which is why package uvm compares what a server needs with
// what was registered when its own initialization ran.
func Registered() []Ref {
	var out []Ref
	out = prefetchRegistry.refs(out)
	out = evictionRegistry.refs(out)
	out = thrashingRegistry.refs(out)
	return accessRegistry.refs(out)
}

// Builtin reports whether r is one of package policy's own policies
// (lru, clock, density, nvidia...), not one a program registered.
func Builtin(r Ref) bool {
	switch r.Kind {
	case KindPrefetch:
		return prefetchRegistry.reserved[r.Name]
	case KindEviction:
		return evictionRegistry.reserved[r.Name]
	case KindThrashing:
		return thrashingRegistry.reserved[r.Name]
	case KindAccessMigration:
		return accessRegistry.reserved[r.Name]
	}
	return false
}

// registry maps policy names to factories, for one kind of policy.
type registry[F any] struct {
	kind     string
	builtin  []string // names with their argument syntax, listed first
	mu       sync.RWMutex
	byName   map[string]F
	reserved map[string]bool
}

func newRegistry[F any](kind string, builtin ...string) *registry[F] {
	r := &registry[F]{kind: kind, builtin: builtin, byName: map[string]F{}, reserved: map[string]bool{}}
	for _, b := range builtin {
		name, _, _ := strings.Cut(b, "[")
		name, _, _ = strings.Cut(name, ":")
		r.reserved[name] = true
	}
	return r
}

func (r *registry[F]) register(name string, f F, builtin bool) error {
	if name == "" || strings.ContainsAny(name, ":,= \t") {
		return fmt.Errorf("%w: %s policy name %q: want a non-empty name without ':', ',', '=' or spaces", core.ErrInvalidValue, r.kind, name)
	}
	if !builtin && r.reserved[name] {
		return fmt.Errorf("%w: %s policy name %q is reserved", core.ErrInvalidValue, r.kind, name)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, dup := r.byName[name]; dup {
		return fmt.Errorf("%w: %s policy %q registered twice", core.ErrInvalidValue, r.kind, name)
	}
	r.byName[name] = f
	return nil
}

func (r *registry[F]) lookup(name string) (F, bool) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	f, ok := r.byName[name]
	return f, ok
}

// names lists the built-in policies (with their argument syntax), then
// the registered ones, sorted.
func (r *registry[F]) names() []string {
	r.mu.RLock()
	var extra []string
	for n := range r.byName {
		if !r.reserved[n] {
			extra = append(extra, n)
		}
	}
	r.mu.RUnlock()
	sort.Strings(extra)
	return append(append([]string(nil), r.builtin...), extra...)
}

// refs appends the names that can be chosen: the reserved built-in ones
// (some of which are built without a factory) and the registered ones.
func (r *registry[F]) refs(out []Ref) []Ref {
	r.mu.RLock()
	defer r.mu.RUnlock()
	for name := range r.reserved {
		if _, ok := r.byName[name]; !ok {
			out = append(out, Ref{Kind: r.kind, Name: name})
		}
	}
	for name := range r.byName {
		out = append(out, Ref{Kind: r.kind, Name: name})
	}
	return out
}

func (r *registry[F]) unknown(text string) error {
	return &UnknownError{Kind: r.kind, Name: text, Known: r.names()}
}

// UnknownError is the error for a policy name that nothing registered in
// this process, by the time it was asked for. It is a type of its own so
// that a program's runtime and the uvm command can add how to make a
// policy known where they are (package uvm's Main, a binary built with
// package cli), which this package cannot tell.
type UnknownError struct {
	// Kind is one of the Kind constants.
	Kind string
	// Name is the spec asked for, with its argument if it had one.
	Name string
	// Known lists what could have been chosen: the built-in policies
	// with their argument syntax, then the registered ones.
	Known []string
}

func (e *UnknownError) Error() string {
	return fmt.Sprintf("%v: %s policy %q: want one of %s", core.ErrInvalidValue, e.Kind, e.Name, strings.Join(e.Known, ", "))
}

// Unwrap makes errors.Is(err, core.ErrInvalidValue) hold, as for every
// other bad value.
func (e *UnknownError) Unwrap() error { return core.ErrInvalidValue }
