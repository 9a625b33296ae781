package policy

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/softuvm/softuvm/internal/core"
)

// AccessPolicy configures what the access counters drive: hint faults on
// remotely mapped memory, delayed migration of the regions a processor
// keeps reaching remotely, the decay of the counts, and how often a fault
// is sampled for the fault anatomy.
//
// Once a device maps a page remotely it takes no more faults on it, so
// nothing would see its accesses. As Linux's NUMA balancing does with its
// hinting faults, the server drops, every Period, the page-table entries
// of up to Sample bytes of each device's remote mappings (the file keeps
// the pages): the device's next access to each page is a minor fault the
// kernel resolves, and the counters see it. A 64 KiB region whose count
// for a processor reaches Threshold migrates to it.
type AccessPolicy struct {
	// Migration names the policy that decides which counted pages
	// migrate: "threshold" (the default, also "") or a policy given to
	// RegisterAccessMigration.
	Migration string `json:"migration,omitempty"`
	// Hints arms hint faults and migrates on threshold crossings; off,
	// the counters only count.
	Hints bool `json:"hints"`
	// Threshold is the count at which a region migrates: 256, the
	// default of NVIDIA's driver (uvm_perf_access_counters.c).
	Threshold int `json:"threshold"`
	// Period is the time between two rounds of hint faults: 1 s, the
	// shortest scan period of Linux's NUMA balancing
	// (kernel.numa_balancing_scan_period_min_ms).
	Period core.Duration `json:"period"`
	// Sample is how many bytes of each device's remote mappings one round
	// drops: 256 MiB, the scan size of Linux's NUMA balancing
	// (kernel.numa_balancing_scan_size_mb).
	Sample int64 `json:"sample"`
	// Decay is the time after which counts halve, so that an old burst
	// does not add up with new accesses to a migration. Linux's NUMA
	// balancing halves its per-task fault statistics at every placement
	// (task_numa_placement); here a region touched on every round gets
	// 16 samples a round (one per page), so it reaches 256 in 16 rounds,
	// and the default, 32 rounds, lets it get there before its first
	// halving.
	Decay core.Duration `json:"decay"`
	// AnatomyEvery samples one fault in this many for the fault anatomy
	// (0: none). Each sampled fault costs two map syscalls in the
	// handler; 64 keeps that under 0.1 us a fault on average.
	AnatomyEvery int `json:"anatomy_every"`
}

// DefaultAccessPolicy: NVIDIA's threshold, Linux NUMA balancing's period
// and sample size.
var DefaultAccessPolicy = AccessPolicy{
	Hints: true, Threshold: 256, Period: core.Duration(time.Second), Sample: 256 << 20,
	Decay: core.Duration(32 * time.Second), AnatomyEvery: 64,
}

// ParseAccessPolicy reads "on" (the defaults), "off" (count only: no hint
// faults, no migration), or a comma list of key=value settings over the
// defaults: migration (a policy's name), hints (on/off), threshold, period, sample (a size), decay,
// anatomy (one fault in N sampled; 0 none).
func ParseAccessPolicy(s string) (AccessPolicy, error) {
	a := DefaultAccessPolicy
	switch s {
	case "", "on", "default":
		return a, nil
	case "off":
		a.Hints = false
		return a, nil
	}
	for _, kv := range strings.Split(s, ",") {
		k, v, ok := strings.Cut(kv, "=")
		if !ok {
			return a, fmt.Errorf("%w: access policy setting %q: want key=value (migration, hints, threshold, period, sample, decay, anatomy), on or off", core.ErrInvalidValue, kv)
		}
		var err error
		switch k {
		case "migration":
			if _, ok := accessRegistry.lookup(v); !ok {
				err = accessRegistry.unknown(v)
			}
			a.Migration = v
		case "hints":
			switch v {
			case "on":
				a.Hints = true
			case "off":
				a.Hints = false
			default:
				err = fmt.Errorf("want on or off")
			}
		case "threshold":
			a.Threshold, err = strconv.Atoi(v)
		case "anatomy":
			a.AnatomyEvery, err = strconv.Atoi(v)
		case "sample":
			a.Sample, err = core.ParseSize(v)
		case "period", "decay":
			var d time.Duration
			if d, err = time.ParseDuration(v); err == nil {
				if k == "period" {
					a.Period = core.Duration(d)
				} else {
					a.Decay = core.Duration(d)
				}
			}
		default:
			return a, fmt.Errorf("%w: access policy setting %q: unknown key %q (want migration, hints, threshold, period, sample, decay or anatomy)", core.ErrInvalidValue, kv, k)
		}
		if err != nil {
			return a, fmt.Errorf("%w: access policy setting %q: %w", core.ErrInvalidValue, kv, err)
		}
	}
	return a, a.Validate()
}

func (a AccessPolicy) String() string {
	hints := "on"
	if !a.Hints {
		hints = "off"
	}
	prefix := ""
	if a.Migration != "" && a.Migration != DefaultAccessMigration {
		prefix = "migration=" + a.Migration + ","
	}
	return prefix + fmt.Sprintf("hints=%s,threshold=%d,period=%v,sample=%s,decay=%v,anatomy=%d",
		hints, a.Threshold, time.Duration(a.Period), core.FormatSize(a.Sample), time.Duration(a.Decay), a.AnatomyEvery)
}

// Validate names the first setting out of range.
func (a AccessPolicy) Validate() error {
	switch {
	case a.Threshold < 1 || a.Threshold > 1<<20:
		return fmt.Errorf("%w: access counter threshold %d: want 1 to %d accesses", core.ErrInvalidValue, a.Threshold, 1<<20)
	case a.Period < core.Duration(time.Millisecond) || time.Duration(a.Period) > time.Hour:
		return fmt.Errorf("%w: hint-fault period %v: want 1ms to 1h", core.ErrInvalidValue, time.Duration(a.Period))
	case a.Sample < core.PageSize:
		return fmt.Errorf("%w: hint-fault sample %d bytes: want at least a page (%d)", core.ErrInvalidValue, a.Sample, core.PageSize)
	case a.Decay < a.Period || time.Duration(a.Decay) > 24*time.Hour:
		return fmt.Errorf("%w: access counter decay %v: want at least the period (%v) and at most 24h", core.ErrInvalidValue, time.Duration(a.Decay), time.Duration(a.Period))
	case a.AnatomyEvery < 0:
		return fmt.Errorf("%w: fault anatomy sampling 1 in %d: want 0 (none) or more", core.ErrInvalidValue, a.AnatomyEvery)
	}
	return nil
}

// AccessPage is a page of a region whose access count for a processor
// reached the threshold, with what the server knows of it.
type AccessPage struct {
	// Processor is the processor whose count crossed the threshold.
	Processor Processor
	// Block and Page locate the page.
	Block *Block
	Page  int
	// Resident reports that the page is on the processor already.
	Resident bool
	// Remote reports that the processor maps the page where it lies,
	// another processor's memory (accessed-by advice, or a pin).
	Remote bool
	// Pinned reports that a thrashing pin holds the page in host memory.
	Pinned bool
	// PreferredElsewhere reports that the page's preferred location is
	// another processor.
	PreferredElsewhere bool
	// Now is the server's clock.
	Now Clock
}

// AccessMigration decides which pages the access counters migrate: when
// a processor's count for a 64 KiB region reaches the threshold
// (AccessPolicy.Threshold), the server asks about each page of the region
// of managed memory and migrates those the policy wants to that
// processor (delayed migration).
//
// Concurrency: one instance serves the whole server; Movable is called
// from the access loop, with the page's block locked, for several blocks
// at once. It must be safe for concurrent use, must not block, and must
// not call back into the server.
type AccessMigration interface {
	// Name identifies the policy in the server's info.
	Name() string
	// Movable reports whether the page migrates to the processor.
	Movable(p AccessPage) bool
}

var accessRegistry = newRegistry[func(spec AccessPolicy) (AccessMigration, error)](KindAccessMigration, "threshold")

// DefaultAccessMigration names the policy used when a spec names none.
const DefaultAccessMigration = "threshold"

func init() {
	if err := accessRegistry.register(DefaultAccessMigration, func(AccessPolicy) (AccessMigration, error) {
		return ThresholdMigration{}, nil
	}, true); err != nil {
		panic(err)
	}
}

// RegisterAccessMigration makes an access-counter migration policy
// available by name: an access policy "migration=NAME,..." selects it
// (--access-policy, UVM_ACCESS_POLICY), and factory gets the spec.
// Register it from an init function (see RegisterPrefetchPolicy for why).
func RegisterAccessMigration(name string, factory func(spec AccessPolicy) (AccessMigration, error)) error {
	return accessRegistry.register(name, factory, false)
}

// AccessMigrationNames lists the policies that can be chosen by name.
func AccessMigrationNames() []string { return accessRegistry.names() }

// NewAccessMigration builds the policy spec names.
func NewAccessMigration(spec AccessPolicy) (AccessMigration, error) {
	name := spec.Migration
	if name == "" {
		name = DefaultAccessMigration
	}
	f, ok := accessRegistry.lookup(name)
	if !ok {
		return nil, accessRegistry.unknown(name)
	}
	return f(spec)
}
