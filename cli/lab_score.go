package cli

import (
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/softuvm/softuvm/lab"
	"github.com/softuvm/softuvm/policy"
	"github.com/softuvm/softuvm/trace/plot"
)

// runLabScore is `uvm lab score`: every policy on every trace, against
// the oracles.
func runLabScore(args []string) error {
	fs := newFlagSet("lab score", "[--policies KIND:SPEC,...] [--json] [--plot DIR] TRACE...",
		"Replay every registered policy (or those of --policies) on every trace, the other kinds of policy being the trace's own, and print a table: faults, bytes moved, estimated time, and the ratio to the bound: for eviction, bytes moved over opt's (Belady's MIN) with the same prefetch policy, and over opt's with demand fetching, the least any pair of policies can move, and faults over lru's and opt's with the same prefetch policy (the default eviction policy, marked, is always scored: a regression shows without a live run); for prefetch, faults over the oracle's (exactly the pages of the block needed soon); for thrashing, estimated time over that with none")
	policies := fs.String("policies", "", "comma-separated KIND:SPEC (eviction:lru,eviction:2q,prefetch:density,prefetch:window:16,thrashing:off); default: every registered policy of each kind")
	asJSON := fs.Bool("json", false, "print JSON")
	plotDir := fs.String("plot", "", "also draw the ratios to the bounds as bar charts in this directory (lab-eviction, lab-prefetch, lab-thrashing .png and .svg)")
	if _, err := parseArgs(fs, args); err != nil {
		return err
	}
	if fs.NArg() == 0 {
		fmt.Fprintln(fs.Output(), "uvm lab score: want one or more TRACE files (lab/traces/*.uvmtrace.gz are the shipped ones)")
		return errUsage
	}
	var entries []string
	if *policies != "" {
		// A spec may hold a colon (window:16) but no comma, so split on
		// commas, then on the first colon.
		entries = strings.Split(*policies, ",")
	}
	started := time.Now()
	// Progress goes to a terminal only, on one line rewritten in place.
	tty := isTerminal(os.Stderr)
	scores, err := lab.Scoreboard(fs.Args(), entries, func(s lab.Score) {
		if tty {
			fmt.Fprintf(os.Stderr, "\r%-70s", fmt.Sprintf("replayed %s: %s %s (%v)", s.Trace, s.Kind, s.Policy, time.Since(started).Round(time.Millisecond)))
		}
	})
	if tty {
		fmt.Fprintf(os.Stderr, "\r%-70s\r", "")
	}
	if err != nil {
		return err
	}
	if *plotDir != "" {
		if err := plotScores(*plotDir, scores); err != nil {
			return err
		}
	}
	if *asJSON {
		return writeJSON(os.Stdout, scores)
	}
	writeScores(scores)
	return nil
}

func writeScores(scores []lab.Score) {
	w := tabwriter.NewWriter(os.Stdout, 2, 8, 2, ' ', tabwriter.AlignRight)
	kind := ""
	for _, s := range scores {
		if s.Kind != kind {
			kind = s.Kind
			fmt.Fprintln(w)
			switch kind {
			case policy.KindEviction:
				fmt.Fprintln(w, "EVICTION\ttrace\tpolicy\tfaults\tmoved\tevicted pages\testimated\tbytes / opt's\tbytes / bound\tfaults / lru's\tfaults / opt's\t")
			case policy.KindPrefetch:
				fmt.Fprintln(w, "PREFETCH\ttrace\tpolicy\tfaults\tmoved\tevicted pages\testimated\tfaults / oracle's\t\t\t\t")
			default:
				fmt.Fprintln(w, "THRASHING\ttrace\tpolicy\tfaults\tmoved\tevicted pages\testimated\ttime / off's\t\t\t\t")
			}
		}
		bound, vsLRU, vsOPT := "", "", ""
		if s.Kind == policy.KindEviction {
			bound = ratioText(s.VsBound)
			if s.FaultsVsLRU != 0 {
				vsLRU, vsOPT = ratioText(s.FaultsVsLRU), ratioText(s.FaultsVsOPT)
			}
		}
		name := s.Policy
		if s.Default {
			name += " (default)"
		}
		fmt.Fprintf(w, "\t%s\t%s\t%d\t%s\t%d\t%v\t%s\t%s\t%s\t%s\t\n", s.Trace, name, s.Faults, humanSize(s.BytesMoved), s.EvictedPages,
			s.EstimatedTime.Round(time.Millisecond), ratioText(s.VsOracle), bound, vsLRU, vsOPT)
	}
	w.Flush()
}

func ratioText(v float64) string {
	if math.IsInf(v, 1) {
		return "inf"
	}
	return fmt.Sprintf("%.3f", v)
}

// plotScores draws, per kind, a bar per trace and policy: its ratio to
// the bound.
func plotScores(dir string, scores []lab.Score) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	titles := map[string]string{
		policy.KindEviction:  "Eviction: bytes moved over opt's (1 = the bound)",
		policy.KindPrefetch:  "Prefetch: faults over the oracle's (1 = the bound)",
		policy.KindThrashing: "Thrashing: estimated time over none's",
	}
	for _, kind := range []string{policy.KindEviction, policy.KindPrefetch, policy.KindThrashing} {
		var bars []plot.Bar
		traces := map[string]int{}
		for _, s := range scores {
			if s.Kind != kind || s.Policy == lab.OracleEviction || s.Policy == lab.OraclePrefetch {
				continue
			}
			if _, ok := traces[s.Trace]; !ok {
				traces[s.Trace] = len(traces)
			}
			bars = append(bars, plot.Bar{Name: s.Trace + "\n" + s.Policy, Value: s.VsOracle, Color: plot.SeriesColor(traces[s.Trace])})
		}
		if len(bars) == 0 {
			continue
		}
		width := max(800, 85*len(bars))
		if _, err := plot.SaveBoth(plot.Bars(titles[kind], "ratio", bars), filepath.Join(dir, "lab-"+strings.ReplaceAll(kind, " ", "-")), width, 500); err != nil {
			return err
		}
	}
	return nil
}
