package lab

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/softuvm/softuvm/internal/core"
	"github.com/softuvm/softuvm/policy"
	"github.com/softuvm/softuvm/trace"
)

// Loaded is a trace read into memory once, to replay many times.
type Loaded struct {
	Path     string
	Header   trace.Header
	Events   []trace.Event
	CutShort bool
	fut      *future
}

// Load reads the trace at path (plain or gzip-compressed) into memory.
func Load(path string) (*Loaded, error) {
	h, events, err := trace.ReadFile(path)
	cut := errors.Is(err, io.ErrUnexpectedEOF)
	if err != nil && !cut {
		return nil, err
	}
	return &Loaded{Path: path, Header: h, Events: events, CutShort: cut}, nil
}

// Replay replays the loaded trace with cfg.
func (l *Loaded) Replay(cfg Config) (*Result, error) {
	var fut *future
	if needsFuture(cfg) {
		if l.fut == nil {
			var err error
			if l.fut, err = scanFuture(&sliceSource{h: l.Header, events: l.Events}); err != nil {
				return nil, err
			}
		}
		fut = l.fut
	}
	res, err := replay(&sliceSource{h: l.Header, events: l.Events}, cfg, fut)
	if res != nil {
		res.Trace = l.Path
		res.CutShort = res.CutShort || l.CutShort
	}
	return res, err
}

// Score is one policy's line of the scoreboard: what it did on one
// trace, the other kinds of policy being the trace's own. The eviction
// lines end with "opt" (opt with the trace's prefetch policy) and
// "opt+none" (opt with demand fetching: the bound).
type Score struct {
	Trace  string `json:"trace"`
	Kind   string `json:"kind"`   // policy.KindPrefetch, KindEviction or KindThrashing
	Policy string `json:"policy"` // its spec
	// Oracle names the bound it is measured against ("" for thrashing,
	// measured against "off").
	Oracle        string        `json:"oracle,omitempty"`
	Faults        uint64        `json:"faults"`
	BytesMoved    uint64        `json:"bytes_moved"`
	EvictedPages  uint64        `json:"evicted_pages"`
	EstimatedTime time.Duration `json:"estimated_ns"`
	// VsOracle is bytes moved over the bound's for eviction (opt with the
	// same prefetch policy), faults over the bound's for prefetch (the
	// oracle with the same eviction policy), and estimated time over
	// "off"'s for thrashing: 1 is as good as the bound.
	VsOracle float64 `json:"vs_oracle"`
	// VsBound, for eviction: bytes moved over opt's with demand fetching
	// (prefetch none), the least any policy pair can move. A ratio to a
	// bound of 0 is +Inf here, and null (vs_bound: left out) in JSON.
	VsBound float64 `json:"vs_bound,omitempty"`
	// FaultsVsLRU and FaultsVsOPT, for eviction: faults over lru's and
	// over opt's, each with the same prefetch policy, on the same trace:
	// what a fault costs is the trace's, so a policy that takes more
	// faults than lru shows here without a live run. (An infinite ratio
	// is null in JSON.)
	FaultsVsLRU float64 `json:"faults_vs_lru,omitempty"`
	FaultsVsOPT float64 `json:"faults_vs_opt,omitempty"`
	// Default marks the default eviction policy's line
	// (policy.DefaultEviction), which the eviction lines always have.
	Default bool `json:"default,omitempty"`
	// Wall is how long the replay took.
	Wall time.Duration `json:"wall_ns"`
}

// Scoreboard replays every policy named in policies ("kind:spec", kind
// prefetch, eviction or thrashing; empty: every registered policy of
// each kind, with the built-in ones' usual arguments) on every trace,
// with the oracles, and returns the scores in trace order, each kind's
// policies in the order given. Where eviction is scored, the default
// eviction policy is too (after those given, where they do not name
// it), and each eviction line has its faults against lru's and opt's. progress, if not nil, hears of each
// replay as it ends.
func Scoreboard(traces []string, policies []string, progress func(s Score)) ([]Score, error) {
	byKind, err := scorePolicies(policies)
	if err != nil {
		return nil, err
	}
	var out []Score
	for _, path := range traces {
		l, err := Load(path)
		if err != nil {
			return nil, err
		}
		name := strings.TrimSuffix(strings.TrimSuffix(filepath.Base(path), ".gz"), ".uvmtrace")
		run := func(cfg Config) (*Result, error) {
			r, err := l.Replay(cfg)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", path, err)
			}
			return r, nil
		}
		add := func(kind, spec, oracle string, r *Result, vs, bound float64, adjust ...func(*Score)) {
			s := Score{Trace: name, Kind: kind, Policy: spec, Oracle: oracle, Faults: r.Replayed.Faults,
				BytesMoved: r.Replayed.BytesMoved(), EvictedPages: r.Replayed.EvictedPages,
				EstimatedTime: r.EstimatedTime, VsOracle: vs, VsBound: bound, Wall: r.Wall}
			for _, f := range adjust {
				f(&s)
			}
			out = append(out, s)
			if progress != nil {
				progress(s)
			}
		}
		// Eviction, against opt with the trace's prefetch, and the
		// bound: opt with demand fetching.
		if evs := byKind[policy.KindEviction]; len(evs) > 0 {
			opt, err := run(Config{Eviction: OracleEviction})
			if err != nil {
				return nil, err
			}
			bound, err := run(Config{Eviction: OracleEviction, Prefetch: "none"})
			if err != nil {
				return nil, err
			}
			if !slices.Contains(evs, policy.DefaultEviction) {
				evs = append(slices.Clip(evs), policy.DefaultEviction)
			}
			runs := map[string]*Result{}
			for _, spec := range append([]string{"lru"}, evs...) {
				if runs[spec] != nil {
					continue
				}
				if runs[spec], err = run(Config{Eviction: spec}); err != nil {
					return nil, err
				}
			}
			lru := runs["lru"]
			againstFaults := func(r *Result) func(*Score) {
				return func(s *Score) {
					s.FaultsVsLRU = ratio(r.Replayed.Faults, lru.Replayed.Faults)
					s.FaultsVsOPT = ratio(r.Replayed.Faults, opt.Replayed.Faults)
				}
			}
			for _, spec := range evs {
				r := runs[spec]
				add(policy.KindEviction, spec, OracleEviction, r, ratio(r.Replayed.BytesMoved(), opt.Replayed.BytesMoved()),
					ratio(r.Replayed.BytesMoved(), bound.Replayed.BytesMoved()), againstFaults(r),
					func(s *Score) { s.Default = spec == policy.DefaultEviction })
			}
			add(policy.KindEviction, OracleEviction, OracleEviction, opt, 1, ratio(opt.Replayed.BytesMoved(), bound.Replayed.BytesMoved()), againstFaults(opt))
			add(policy.KindEviction, OracleEviction+"+none", OracleEviction, bound, ratio(bound.Replayed.BytesMoved(), opt.Replayed.BytesMoved()), 1)
		}
		// Prefetch, against the oracle with the trace's eviction.
		if pfs := byKind[policy.KindPrefetch]; len(pfs) > 0 {
			oracle, err := run(Config{Prefetch: OraclePrefetch})
			if err != nil {
				return nil, err
			}
			for _, spec := range pfs {
				r, err := run(Config{Prefetch: spec})
				if err != nil {
					return nil, err
				}
				add(policy.KindPrefetch, spec, OraclePrefetch, r, ratio(r.Replayed.Faults, oracle.Replayed.Faults), 0)
			}
			add(policy.KindPrefetch, OraclePrefetch, OraclePrefetch, oracle, 1, 0)
		}
		// Thrashing, against none.
		if ths := byKind[policy.KindThrashing]; len(ths) > 0 {
			off, err := run(Config{Thrashing: "off"})
			if err != nil {
				return nil, err
			}
			for _, spec := range ths {
				r, err := run(Config{Thrashing: spec})
				if err != nil {
					return nil, err
				}
				add(policy.KindThrashing, spec, "", r, durRatio(r.EstimatedTime, off.EstimatedTime), 0)
			}
		}
	}
	return out, nil
}

// MarshalJSON writes a ratio whose bound is 0 (infinite) as null: JSON
// has no infinity.
func (s Score) MarshalJSON() ([]byte, error) {
	type plain Score
	finite := func(v float64) *float64 {
		if math.IsInf(v, 0) || math.IsNaN(v) {
			return nil
		}
		return &v
	}
	out := struct {
		plain
		VsOracle    *float64 `json:"vs_oracle"`
		VsBound     *float64 `json:"vs_bound,omitempty"`
		FaultsVsLRU *float64 `json:"faults_vs_lru,omitempty"`
		FaultsVsOPT *float64 `json:"faults_vs_opt,omitempty"`
	}{plain: plain(s), VsOracle: finite(s.VsOracle)}
	if s.VsBound != 0 {
		out.VsBound = finite(s.VsBound)
	}
	if s.FaultsVsLRU != 0 {
		out.FaultsVsLRU = finite(s.FaultsVsLRU)
	}
	if s.FaultsVsOPT != 0 {
		out.FaultsVsOPT = finite(s.FaultsVsOPT)
	}
	return json.Marshal(out)
}

func durRatio(a, b time.Duration) float64 {
	if b <= 0 {
		if a <= 0 {
			return 1
		}
		return math.Inf(1)
	}
	return float64(a) / float64(b)
}

// scorePolicies sorts "kind:spec" entries by kind, checking each; none
// means every registered one.
func scorePolicies(entries []string) (map[string][]string, error) {
	out := map[string][]string{}
	if len(entries) == 0 {
		out[policy.KindEviction] = EvictionSpecs()
		out[policy.KindPrefetch] = PrefetchSpecs()
		out[policy.KindThrashing] = []string{"off", "on"}
		return out, nil
	}
	for _, e := range entries {
		kind, spec, ok := strings.Cut(e, ":")
		if !ok || spec == "" {
			return nil, fmt.Errorf("%w: policy %q: want KIND:SPEC, KIND prefetch, eviction or thrashing (eviction:lru, prefetch:window:16, thrashing:off)", core.ErrInvalidValue, e)
		}
		var err error
		switch kind {
		case policy.KindPrefetch:
			_, err = policy.ParsePrefetchSpec(spec)
		case policy.KindEviction:
			err = policy.ValidateEviction(spec)
		case policy.KindThrashing:
			_, err = policy.ParseThrashingSpec(spec)
		default:
			return nil, fmt.Errorf("%w: policy %q: kind %q: want prefetch, eviction or thrashing", core.ErrInvalidValue, e, kind)
		}
		if err != nil && spec != OracleEviction && spec != OraclePrefetch {
			return nil, err
		}
		out[kind] = append(out[kind], spec)
	}
	return out, nil
}

// EvictionSpecs lists every eviction policy registered now, by name.
func EvictionSpecs() []string {
	var out []string
	for _, n := range policy.EvictionNames() {
		name, _, _ := strings.Cut(n, "[")
		name, _, _ = strings.Cut(name, ":")
		out = append(out, name)
	}
	return out
}

// PrefetchSpecs lists every prefetch policy registered now; those that
// need an argument get a usual one (window:16).
func PrefetchSpecs() []string {
	var out []string
	for _, n := range policy.PrefetchPolicyNames() {
		switch {
		case strings.HasPrefix(n, "density"):
			out = append(out, "density")
		case strings.HasPrefix(n, "window"):
			out = append(out, "window:16")
		default:
			out = append(out, n)
		}
	}
	return out
}
