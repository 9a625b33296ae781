package policy

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/softuvm/softuvm/internal/core"
)

// Specs chooses a policy of every kind, and the mechanism's numbers:
// what a configuration, a command line or the environment holds, as
// plain data. Each kind has one parser (ParsePrefetchSpec,
// ValidateEviction for an eviction spec's name, ParseThrashingSpec,
// ParseAccessPolicy, ParseMechanism); NewSet is the one place policies
// are built from it.
type Specs struct {
	Prefetch PrefetchSpec
	// Eviction is "name[:arg]" ("" is DefaultEviction).
	Eviction  string
	Thrashing ThrashingSpec
	// Access is the access counters' policy; the zero value is
	// DefaultAccessPolicy.
	Access    AccessPolicy
	Mechanism Mechanism
}

// Set is the policies a fault server, or a replay of a trace, runs by:
// built once from Specs (NewSet) and handed to the block engine
// (internal/block), which asks them every question. A Set is not
// changed after NewSet returns; the policies in it are safe for
// concurrent use (each policy's interface says so).
type Set struct {
	Specs    Specs
	Prefetch PrefetchPolicy
	Eviction Eviction
	// PageEviction is Eviction where it chooses pages, nil where it
	// chooses blocks.
	PageEviction PageEviction
	// CleanCopies: Eviction asks for clean eviction (CleanCopying).
	CleanCopies bool
	// Thrashing is nil when thrashing detection is off; Refaulting is it
	// where it answers refaults.
	Thrashing       Thrashing
	Refaulting      Refaulting
	AccessMigration AccessMigration
	Mechanism       Mechanism
}

// NewSet builds the policies s names, defaults for what it leaves zero.
// Every error names the bad value.
func NewSet(s Specs) (*Set, error) {
	set := &Set{Specs: s}
	var err error
	if set.Prefetch, err = NewPrefetchPolicy(s.Prefetch); err != nil {
		return nil, err
	}
	if set.Eviction, err = NewEviction(s.Eviction); err != nil {
		return nil, err
	}
	set.UseEviction(set.Eviction)
	if err := s.Thrashing.Validate(); err != nil {
		return nil, err
	}
	if set.Thrashing, err = NewThrashing(s.Thrashing); err != nil {
		return nil, err
	}
	set.Refaulting, _ = set.Thrashing.(Refaulting)
	access := s.Access
	if access == (AccessPolicy{}) {
		access = DefaultAccessPolicy
	}
	if err := access.Validate(); err != nil {
		return nil, err
	}
	if set.AccessMigration, err = NewAccessMigration(access); err != nil {
		return nil, err
	}
	if set.Mechanism, err = s.Mechanism.WithDefaults(); err != nil {
		return nil, err
	}
	return set, nil
}

// UseEviction puts e in the set, with what it optionally implements:
// for a replay whose eviction is not built from a spec (the lab's
// oracle).
func (s *Set) UseEviction(e Eviction) {
	s.Eviction = e
	s.PageEviction, _ = e.(PageEviction)
	s.CleanCopies = false
	if c, ok := e.(CleanCopying); ok {
		s.CleanCopies = c.CleanCopies()
	}
}

// Validate reports the first bad choice of s. A registered policy's
// arguments are known only to its factory, so it builds the set and
// drops it: configurations call it where they are read, before any
// server runs.
func (s Specs) Validate() error {
	_, err := NewSet(s)
	return err
}

// Mechanism holds the numbers by which the block engine carries out
// what the policies decide: how far it reads ahead, when a fault's move
// counts as whole, how long a device's fault on a pinned page waits,
// and how eviction makes room. The zero value of each field means its
// default (DefaultMechanism), the values the server always had.
type Mechanism struct {
	// ReadAheads is how many read-aheads of one range may run at once
	// (policy.ReadAhead): the block being read ahead when the sweep
	// reaches it, and the next one, which starts then.
	ReadAheads int `json:"read_aheads,omitempty"`
	// WholeMovePercent: a fault's move is a move of the whole block
	// (clean eviction then keeps no copies: a sweep likely writes what
	// it reads) when it brings every page the block has elsewhere and
	// more than this percentage of the block.
	WholeMovePercent int `json:"whole_move_percent,omitempty"`
	// PinWaits bounds how many naps a device's fault on a page pinned in
	// host memory waits for the device to map the host copy before it
	// is served by migration after all: the device's mapping changes
	// only when its process runs, and the fault path never waits for it
	// without a bound.
	PinWaits int `json:"pin_waits,omitempty"`
	// EvictRounds bounds the rounds of victims one eviction asks the
	// eviction policy for.
	EvictRounds int `json:"evict_rounds,omitempty"`
	// EvictWait bounds how long a reservation waits for blocks that
	// other threads hold (busy only while they move) to be free to
	// evict, and EvictRetry is the pause between its tries.
	EvictWait  core.Duration `json:"evict_wait,omitempty"`
	EvictRetry core.Duration `json:"evict_retry,omitempty"`
}

// DefaultMechanism is the mechanism's numbers when none are given.
var DefaultMechanism = Mechanism{
	ReadAheads: 2, WholeMovePercent: 50, PinWaits: 20, EvictRounds: 64,
	EvictWait: core.Duration(time.Second), EvictRetry: core.Duration(50 * time.Microsecond),
}

// WithDefaults returns m with DefaultMechanism's value in each zero
// field, or an error naming a value out of range.
func (m Mechanism) WithDefaults() (Mechanism, error) {
	d := DefaultMechanism
	pick := func(v *int, def int) {
		if *v == 0 {
			*v = def
		}
	}
	pick(&m.ReadAheads, d.ReadAheads)
	pick(&m.WholeMovePercent, d.WholeMovePercent)
	pick(&m.PinWaits, d.PinWaits)
	pick(&m.EvictRounds, d.EvictRounds)
	if m.EvictWait == 0 {
		m.EvictWait = d.EvictWait
	}
	if m.EvictRetry == 0 {
		m.EvictRetry = d.EvictRetry
	}
	switch {
	case m.ReadAheads < 0 || m.ReadAheads > 64:
		return m, fmt.Errorf("%w: mechanism read-aheads %d: want 1 to 64 (or 0: %d)", core.ErrInvalidValue, m.ReadAheads, d.ReadAheads)
	case m.WholeMovePercent < 1 || m.WholeMovePercent > 99:
		return m, fmt.Errorf("%w: mechanism whole-move %d%%: want 1 to 99 (or 0: %d)", core.ErrInvalidValue, m.WholeMovePercent, d.WholeMovePercent)
	case m.PinWaits < 1 || m.PinWaits > 10000:
		return m, fmt.Errorf("%w: mechanism pin waits %d: want 1 to 10000 (or 0: %d)", core.ErrInvalidValue, m.PinWaits, d.PinWaits)
	case m.EvictRounds < 1 || m.EvictRounds > 1<<20:
		return m, fmt.Errorf("%w: mechanism eviction rounds %d: want 1 to %d (or 0: %d)", core.ErrInvalidValue, m.EvictRounds, 1<<20, d.EvictRounds)
	case m.EvictWait < 0 || m.EvictWait > core.Duration(time.Minute):
		return m, fmt.Errorf("%w: mechanism eviction wait %v: want up to 1m (or 0: %v)", core.ErrInvalidValue, time.Duration(m.EvictWait), time.Duration(d.EvictWait))
	case m.EvictRetry < 0 || m.EvictRetry > m.EvictWait:
		return m, fmt.Errorf("%w: mechanism eviction retry %v: want up to the wait, %v (or 0: %v)", core.ErrInvalidValue, time.Duration(m.EvictRetry), time.Duration(m.EvictWait), time.Duration(d.EvictRetry))
	}
	return m, nil
}

// ParseMechanism reads a comma list of key=value settings over the
// defaults: read-aheads, whole-move (a percentage), pin-waits,
// evict-rounds, evict-wait and evict-retry (durations as Go writes
// them); "" or "default" is the defaults.
func ParseMechanism(s string) (Mechanism, error) {
	var m Mechanism
	if t := strings.TrimSpace(s); t == "" || t == "default" {
		return m.WithDefaults()
	}
	want := "want read-aheads, whole-move, pin-waits, evict-rounds, evict-wait or evict-retry"
	for _, kv := range strings.Split(s, ",") {
		k, v, ok := strings.Cut(strings.TrimSpace(kv), "=")
		if !ok {
			return m, fmt.Errorf("%w: mechanism %q: setting %q: want key=value (%s)", core.ErrInvalidValue, s, kv, want)
		}
		k, v = strings.TrimSpace(k), strings.TrimSpace(v)
		var ip *int
		var dp *core.Duration
		switch k {
		case "read-aheads":
			ip = &m.ReadAheads
		case "whole-move":
			ip = &m.WholeMovePercent
		case "pin-waits":
			ip = &m.PinWaits
		case "evict-rounds":
			ip = &m.EvictRounds
		case "evict-wait":
			dp = &m.EvictWait
		case "evict-retry":
			dp = &m.EvictRetry
		default:
			return m, fmt.Errorf("%w: mechanism %q: unknown setting %q: %s", core.ErrInvalidValue, s, k, want)
		}
		if ip != nil {
			n, err := strconv.Atoi(strings.TrimSuffix(v, "%"))
			if err != nil || n <= 0 {
				return m, fmt.Errorf("%w: mechanism %q: %s=%q: want a positive whole number", core.ErrInvalidValue, s, k, v)
			}
			*ip = n
			continue
		}
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			return m, fmt.Errorf("%w: mechanism %q: %s=%q: want a positive duration such as 1s or 50us", core.ErrInvalidValue, s, k, v)
		}
		*dp = core.Duration(d)
	}
	return m.WithDefaults()
}

// String writes m as ParseMechanism reads it, the settings that differ
// from the defaults only ("default" where none does).
func (m Mechanism) String() string {
	m, _ = m.WithDefaults()
	d := DefaultMechanism
	var parts []string
	add := func(k string, v, def any) {
		if v != def {
			parts = append(parts, fmt.Sprintf("%s=%v", k, v))
		}
	}
	add("read-aheads", m.ReadAheads, d.ReadAheads)
	add("whole-move", m.WholeMovePercent, d.WholeMovePercent)
	add("pin-waits", m.PinWaits, d.PinWaits)
	add("evict-rounds", m.EvictRounds, d.EvictRounds)
	add("evict-wait", time.Duration(m.EvictWait), time.Duration(d.EvictWait))
	add("evict-retry", time.Duration(m.EvictRetry), time.Duration(d.EvictRetry))
	if len(parts) == 0 {
		return "default"
	}
	return strings.Join(parts, ",")
}

// WholeMove reports whether a fault's move of pages brings a block of
// pages pages whole: every page the block has elsewhere (elsewhere) and
// more than WholeMovePercent of the block.
func (m Mechanism) WholeMove(pages int, elsewhere, moving PageMask) bool {
	if moving.Count()*100 <= pages*m.WholeMovePercent {
		return false
	}
	elsewhere.AndNot(&moving)
	return elsewhere.Empty()
}
