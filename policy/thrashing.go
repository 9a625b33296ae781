package policy

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/softuvm/softuvm/internal/core"
)

// ThrashingSpec configures thrashing detection. The zero value is
// disabled; DefaultThrashing is NVIDIA's defaults.
type ThrashingSpec struct {
	Enabled bool `json:"enabled"`
	// Policy names the detector: "nvidia" (the default, also "") or a
	// policy given to RegisterThrashing, which reads the settings below
	// as it likes.
	Policy       string        `json:"policy,omitempty"`
	Threshold    int           `json:"threshold"`     // consecutive close migrations that make a page thrash
	Lapse        core.Duration `json:"lapse"`         // how close two migrations must be
	Nap          core.Duration `json:"nap"`           // how long a throttled fault waits
	PinThreshold int           `json:"pin_threshold"` // throttles of a page before it is pinned
	Pin          core.Duration `json:"pin"`           // how long a pin lasts
	Epoch        core.Duration `json:"epoch"`         // quiet time after which a page's throttles are forgotten

	// Refaults: pages evicted from a processor that a fault brings back
	// soon after (policy.Refaulting, package internal/workingset).
	// Refault turns their detection's answer on: a recent refault's
	// pages are protected from eviction, a resident core of at most
	// Core percent of what the processor may hold; a refault is recent
	// when fewer pages were evicted since than RefaultDistance percent
	// of what it may hold; a protection lasts between CoreAge and twice
	// CoreAge times that many evictions.
	Refault         bool `json:"refault"`
	RefaultDistance int  `json:"refault_distance,omitempty"`
	Core            int  `json:"core,omitempty"`
	CoreAge         int  `json:"core_age,omitempty"`
}

// DefaultThrashing is the default of NVIDIA's driver: threshold 3, lapse
// 500 us, nap one lapse, pin threshold 10, pin 300 lapses, epoch 2000
// lapses; and refaults answered with a core of 97% of a processor
// (refault-distance=100, core=97, core-age=4).
var DefaultThrashing = ThrashingSpec{
	Enabled: true, Threshold: 3, Lapse: core.Duration(500 * time.Microsecond), Nap: core.Duration(500 * time.Microsecond),
	PinThreshold: 10, Pin: core.Duration(150 * time.Millisecond), Epoch: core.Duration(time.Second),
	Refault: true, RefaultDistance: 100, Core: 97, CoreAge: 4,
}

// ParseThrashingSpec reads "off", "on" (the defaults), or a comma list of
// key=value settings over the defaults: policy (a detector's name),
// threshold, lapse, nap,
// pin-threshold, pin, epoch (durations as Go writes them: 500us, 2ms);
// refault (on or off), refault-distance, core (percentages of what a
// processor may hold) and core-age (a multiple of it).
func ParseThrashingSpec(s string) (ThrashingSpec, error) {
	switch s {
	case "off", "none":
		return ThrashingSpec{}, nil
	case "", "on", "default":
		return DefaultThrashing, nil
	}
	t := DefaultThrashing
	for _, kv := range strings.Split(s, ",") {
		k, v, ok := strings.Cut(kv, "=")
		if !ok {
			return t, fmt.Errorf("%w: thrashing setting %q: want key=value (%s), on or off", core.ErrInvalidValue, kv, thrashingKeys)
		}
		var err error
		switch k {
		case "policy":
			if _, ok := thrashingRegistry.lookup(v); !ok {
				err = thrashingRegistry.unknown(v)
			}
			t.Policy = v
		case "threshold":
			t.Threshold, err = strconv.Atoi(v)
		case "refault":
			switch v {
			case "on":
				t.Refault = true
			case "off":
				t.Refault = false
			default:
				err = fmt.Errorf("want on or off")
			}
		case "refault-distance":
			t.RefaultDistance, err = strconv.Atoi(v)
		case "core":
			t.Core, err = strconv.Atoi(v)
		case "core-age":
			t.CoreAge, err = strconv.Atoi(v)
		case "pin-threshold":
			t.PinThreshold, err = strconv.Atoi(v)
		case "lapse", "nap", "pin", "epoch":
			var d time.Duration
			if d, err = time.ParseDuration(v); err == nil {
				*t.duration(k) = core.Duration(d)
			}
		default:
			return t, fmt.Errorf("%w: thrashing setting %q: unknown key %q (want %s)", core.ErrInvalidValue, kv, k, thrashingKeys)
		}
		if err != nil {
			return t, fmt.Errorf("%w: thrashing setting %q: %w", core.ErrInvalidValue, kv, err)
		}
	}
	return t, t.Validate()
}

func (t ThrashingSpec) String() string {
	if !t.Enabled {
		return "off"
	}
	prefix := ""
	if t.Policy != "" && t.Policy != DefaultThrashingPolicy {
		prefix = "policy=" + t.Policy + ","
	}
	refault := "refault=off"
	if t.Refault {
		refault = fmt.Sprintf("refault=on,refault-distance=%d,core=%d,core-age=%d", t.RefaultDistance, t.Core, t.CoreAge)
	}
	return prefix + fmt.Sprintf("threshold=%d,lapse=%v,nap=%v,pin-threshold=%d,pin=%v,epoch=%v,%s",
		t.Threshold, time.Duration(t.Lapse), time.Duration(t.Nap), t.PinThreshold, time.Duration(t.Pin), time.Duration(t.Epoch), refault)
}

// thrashingKeys lists the keys ParseThrashingSpec takes, for its errors.
const thrashingKeys = "policy, threshold, lapse, nap, pin-threshold, pin, epoch, refault, refault-distance, core, core-age"

// duration returns the setting a duration key names.
func (t *ThrashingSpec) duration(key string) *core.Duration {
	switch key {
	case "lapse":
		return &t.Lapse
	case "nap":
		return &t.Nap
	case "pin":
		return &t.Pin
	}
	return &t.Epoch
}

// Validate checks the settings of an enabled spec.
func (t ThrashingSpec) Validate() error {
	if !t.Enabled {
		return nil
	}
	switch {
	case t.Threshold < 2 || t.Threshold > 255:
		return fmt.Errorf("%w: thrashing threshold %d: want 2 to 255 migrations", core.ErrInvalidValue, t.Threshold)
	case t.PinThreshold < 1 || t.PinThreshold > 255:
		return fmt.Errorf("%w: thrashing pin threshold %d: want 1 to 255 throttles", core.ErrInvalidValue, t.PinThreshold)
	case t.Lapse <= 0 || time.Duration(t.Lapse) > time.Second:
		return fmt.Errorf("%w: thrashing lapse %v: want more than 0 and at most 1s", core.ErrInvalidValue, time.Duration(t.Lapse))
	case t.Nap <= 0 || time.Duration(t.Nap) > time.Second:
		return fmt.Errorf("%w: thrashing nap %v: want more than 0 and at most 1s", core.ErrInvalidValue, time.Duration(t.Nap))
	case t.Pin <= 0 || time.Duration(t.Pin) > time.Hour:
		return fmt.Errorf("%w: thrashing pin %v: want more than 0 and at most 1h", core.ErrInvalidValue, time.Duration(t.Pin))
	case t.Epoch < t.Lapse || time.Duration(t.Epoch) > time.Hour:
		return fmt.Errorf("%w: thrashing epoch %v: want at least the lapse (%v) and at most 1h", core.ErrInvalidValue, time.Duration(t.Epoch), time.Duration(t.Lapse))
	}
	if !t.Refault {
		return nil
	}
	switch {
	case t.RefaultDistance < 1 || t.RefaultDistance > 1000:
		return fmt.Errorf("%w: thrashing refault-distance %d: want 1 to 1000 (percent of what a processor may hold)", core.ErrInvalidValue, t.RefaultDistance)
	case t.Core < 1 || t.Core > 99:
		return fmt.Errorf("%w: thrashing core %d: want 1 to 99 (percent of what a processor may hold)", core.ErrInvalidValue, t.Core)
	case t.CoreAge < 1 || t.CoreAge > 1000:
		return fmt.Errorf("%w: thrashing core-age %d: want 1 to 1000 (times what a processor may hold, in evictions)", core.ErrInvalidValue, t.CoreAge)
	}
	return nil
}

// ThrashHint is what a thrashing policy says about a fault that would
// move a page away from where it is.
type ThrashHint int

const (
	ThrashNone     ThrashHint = iota // serve the fault: migrate
	ThrashThrottle                   // make the faulting processor wait a nap, then serve it without asking again
	ThrashPin                        // the page is pinned in host memory from now on: devices map it there
	ThrashPinned                     // the page was pinned already
)

// ThrashFault is a fault that would migrate a page a fault moved recently.
type ThrashFault struct {
	// Processor is the processor that faulted.
	Processor Processor
	// Page is the page's index in its block.
	Page int
	// HostPreferred reports that the page may be pinned in host memory:
	// its preferred location is the host or none.
	HostPreferred bool
	// Now is the server's clock.
	Now Clock
}

// Thrashing detects pages that migrate back and forth between processors
// and says what to do with their faults: throttle the faulting processor,
// or pin the page in host memory where every device maps it.
//
// A policy keeps its state per block: NewState makes it when a fault
// first moves a page of the block, and the server hands it back at every
// call about that block. Concurrency: calls about one block are made with
// the block's lock held, so they never overlap, and a state needs no lock
// of its own; calls about different blocks run at once, so what a policy
// keeps outside the states must be safe for concurrent use. No method may
// block or call back into the server.
type Thrashing interface {
	// Name identifies the policy in the server's info.
	Name() string
	// NewState makes a block's state.
	NewState() any
	// Migrated notes that a fault moved pages of the block (prefetches,
	// evictions and counters' migrations are not reported).
	Migrated(state any, pages PageMask, now Clock)
	// Check decides about a fault that would move a page of the block
	// away from where it is. Returning ThrashPin starts a pin of
	// PinDuration; the server then remaps devices to the host copy and
	// counts the pin.
	Check(state any, f ThrashFault) ThrashHint
	// Pinned reports whether the page is pinned in host memory now.
	Pinned(state any, page int, now Clock) bool
	// PinnedUntil is when the last pin of the block ends (0: none ever).
	PinnedUntil(state any) Clock
	// Avoid adds to out the pages a prefetch should not bring along:
	// those pinned, and those about to be found thrashing.
	Avoid(state any, pages int, now Clock, out *PageMask)
	// Nap is how long a throttled fault waits.
	Nap() time.Duration
	// PinDuration is how long a pin lasts.
	PinDuration() time.Duration
}

// Refaulting is a Thrashing policy that also answers thrashing under
// memory pressure, where a processor (the host over its budget, a
// device's full arena) evicts the pages a program needs next. The server
// counts the pages each processor evicts, stamps each page it evicts
// with that count, and on a fault that brings pages back measures their
// refault distance: the pages evicted from the processor in between (as
// Linux's mm/workingset.c does). A page back within a distance shorter
// than what the processor holds was evicted too early. The policy says
// what counts as recent and what to do: the server protects the pages
// it says to protect from eviction (a resident core, hidden from the
// eviction policy) up to the limit it sets, for as long as it sets.
// What is left to evict then turns over the excess of a loop larger
// than the processor, rather than all of it. Calls are made with the
// block's lock held, from many blocks at once.
type Refaulting interface {
	Thrashing
	// RefaultLimits gives processor p's limits, in pages, for what it
	// may hold (capacity): zero Protect or Age answers nothing.
	RefaultLimits(p Processor, capacity int64) RefaultLimits
	// Refaulted decides about pages that came back recently.
	Refaulted(f Refault) RefaultHint
}

// RefaultLimits are a processor's limits for its refaults, in pages.
type RefaultLimits struct {
	// Recent is the longest refault distance (pages evicted from the
	// processor between a page's eviction and its return) that counts
	// as an eviction too early.
	Recent int64
	// Protect is the most pages protected at once.
	Protect int64
	// Age is how many evictions a generation lasts: a page protected in
	// one stays protected until the next one ends, so that a program
	// whose working set moves on gets the room back.
	Age int64
}

// Refault is pages of a block that a fault brought back to a processor
// soon after they were evicted from it.
type Refault struct {
	Block     *Block
	Processor Processor
	// Pages came back within RefaultLimits.Recent evictions: the pages
	// the fault demanded, and where the block came back whole, all of
	// it (pages prefetched with a fault are not evidence of use).
	Pages PageMask
	// Distance is the shortest of their refault distances.
	Distance int64
	// Capacity is what the processor may hold, Protected what it
	// protects now (Pages not counted), both in pages.
	Capacity, Protected int64
	Limits              RefaultLimits
}

// RefaultHint is what a Refaulting policy says about a refault.
type RefaultHint int

const (
	RefaultNone    RefaultHint = iota // nothing: the pages stay evictable
	RefaultProtect                    // protect the pages: they join the processor's resident core
)

var thrashingRegistry = newRegistry[func(spec ThrashingSpec) (Thrashing, error)](KindThrashing, "nvidia")

// DefaultThrashingPolicy names the detector used when a spec names none.
const DefaultThrashingPolicy = "nvidia"

func init() {
	if err := thrashingRegistry.register(DefaultThrashingPolicy, func(spec ThrashingSpec) (Thrashing, error) {
		if err := spec.Validate(); err != nil {
			return nil, err
		}
		return &NvidiaThrashing{Spec: spec}, nil
	}, true); err != nil {
		panic(err)
	}
}

// RegisterThrashing makes a thrashing policy available by name: a spec
// "policy=NAME,..." selects it (--thrashing, UVM_THRASHING), and factory
// gets the spec's settings. Register it from an init function (see
// RegisterPrefetchPolicy for why).
func RegisterThrashing(name string, factory func(spec ThrashingSpec) (Thrashing, error)) error {
	return thrashingRegistry.register(name, factory, false)
}

// ThrashingNames lists the thrashing policies that can be chosen by name.
func ThrashingNames() []string { return thrashingRegistry.names() }

// NewThrashing builds the policy spec names; nil when the spec is
// disabled.
func NewThrashing(spec ThrashingSpec) (Thrashing, error) {
	if !spec.Enabled {
		return nil, nil
	}
	name := spec.Policy
	if name == "" {
		name = DefaultThrashingPolicy
	}
	f, ok := thrashingRegistry.lookup(name)
	if !ok {
		return nil, thrashingRegistry.unknown(name)
	}
	return f(spec)
}
