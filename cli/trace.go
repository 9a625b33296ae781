package cli

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/softuvm/softuvm/trace"
	"github.com/softuvm/softuvm/uvm"
)

const traceUsage = `Usage: uvm trace record|export|plot|summary|replay [flags]

  record [--out FILE] [RUN FLAGS] -- PROGRAM [ARGS...]
                 run a program as uvm run does, recording every fault,
                 migration, eviction, allocation and free to FILE
                 (default PROGRAM.uvmtrace)
  record [--out FILE] [SERVE FLAGS]
                 run a fault server daemon as uvm serve does, recording
                 every client's events until it is stopped
                 (default uvm-serve.uvmtrace)
  export [--format perfetto|csv] [--out FILE] TRACE
                 Chrome trace-event JSON that ui.perfetto.dev opens, or CSV
  plot [--out DIR] [--format png|svg|both] TRACE
                 a heatmap of faults over address and time, migration
                 bandwidth over time, and the fault service times
  summary [--json] TRACE
                 what a trace holds: events by kind, faults by processor,
                 pages moved by direction and cause
  replay [--prefetch P] [--eviction E] [--thrashing T] [--host-budget B]
         [--arena-size S] [--json] TRACE
                 replay policies over the trace in memory (no root): faults,
                 pages moved, evictions, an estimated time; "opt" and
                 "oracle" are the eviction and prefetch bounds

A client started with UVM_TRACE=FILE in its environment has its own events
recorded there by whichever server serves it. docs/traces.md describes the
format.`

func runTrace(args []string) error {
	if len(args) == 0 || strings.HasPrefix(args[0], "-") {
		fmt.Fprintln(os.Stderr, traceUsage)
		if len(args) > 0 && (args[0] == "-h" || args[0] == "--help" || args[0] == "-help") {
			return nil
		}
		return errUsage
	}
	switch args[0] {
	case "record":
		return runTraceRecord(args[1:])
	case "export":
		return runTraceExport(args[1:])
	case "plot":
		return runTracePlot(args[1:])
	case "summary":
		return runTraceSummary(args[1:])
	case "replay":
		return runTraceReplay(args[1:])
	}
	fmt.Fprintf(os.Stderr, "uvm trace: unknown subcommand %q: want record, export, plot, summary or replay\n", args[0])
	return errUsage
}

// runTraceRecord is uvm run (with a program after "--") or uvm serve
// (without) with --trace set to --out.
func runTraceRecord(args []string) error {
	out, rest, err := cutOutFlag(args)
	if err != nil {
		fmt.Fprintf(os.Stderr, "uvm trace record: %v\n", err)
		return errUsage
	}
	dash := slices.Index(rest, "--")
	flags := rest
	if dash >= 0 {
		flags = rest[:dash]
	}
	if slices.ContainsFunc(flags, func(a string) bool {
		name, _, _ := strings.Cut(strings.TrimLeft(a, "-"), "=")
		return strings.HasPrefix(a, "-") && name == "trace"
	}) {
		fmt.Fprintln(os.Stderr, "uvm trace record: --trace is what --out sets: give --out FILE")
		return errUsage
	}
	if dash < 0 {
		if out == "" {
			out = "uvm-serve.uvmtrace"
		}
		fmt.Fprintf(os.Stderr, "uvm trace record: no program after --: serving as uvm serve does, recording every client to %s until stopped\n", out)
		return runServe(append([]string{"--trace", out}, rest...))
	}
	if dash == len(rest)-1 {
		fmt.Fprintln(os.Stderr, "uvm trace record: no program after --: want uvm trace record [--out FILE] [RUN FLAGS] -- PROGRAM [ARGS...]")
		return errUsage
	}
	if out == "" {
		out = filepath.Base(rest[dash+1]) + ".uvmtrace"
	}
	runErr := runRun(append([]string{"--trace", out}, rest...))
	if errors.Is(runErr, errUsage) || errors.Is(runErr, flag.ErrHelp) {
		return runErr
	}
	if s, err := trace.Summarize(out); err == nil {
		fi, _ := os.Stat(out)
		size := int64(0)
		if fi != nil {
			size = fi.Size()
		}
		fmt.Fprintf(os.Stderr, "uvm trace record: %d events (%d faults, %d migrations) in %s, %s\n", s.Events, s.TotalFaults(), s.TotalMigrations(), out, uvm.FormatSize(size))
	} else if !os.IsNotExist(errors.Unwrap(err)) {
		fmt.Fprintf(os.Stderr, "uvm trace record: %v\n", err)
	}
	return runErr
}

// cutOutFlag takes --out FILE (or --out=FILE, -out) out of the arguments
// before "--".
func cutOutFlag(args []string) (out string, rest []string, err error) {
	for i := 0; i < len(args); i++ {
		a := args[i]
		if a == "--" {
			rest = append(rest, args[i:]...)
			break
		}
		name, val, hasVal := strings.Cut(strings.TrimLeft(a, "-"), "=")
		if strings.HasPrefix(a, "-") && name == "out" {
			if !hasVal {
				if i+1 >= len(args) {
					return "", nil, fmt.Errorf("--out wants a file name")
				}
				i++
				val = args[i]
			}
			if val == "" {
				return "", nil, fmt.Errorf("--out wants a file name, not an empty one")
			}
			out = val
			continue
		}
		rest = append(rest, a)
	}
	return out, rest, nil
}

func runTraceSummary(args []string) error {
	fs := newFlagSet("trace summary", "[--json] TRACE", "Sum up what a trace holds: its header, events by kind, faults by processor with their service times, pages moved by direction and cause with the copies' rate, evictions")
	asJSON := fs.Bool("json", false, "print JSON")
	if _, err := parseArgs(fs, args); err != nil {
		return err
	}
	if fs.NArg() != 1 {
		fmt.Fprintf(fs.Output(), "uvm trace summary: want one TRACE file, got %d arguments\n", fs.NArg())
		return errUsage
	}
	s, err := trace.Summarize(fs.Arg(0))
	if err != nil {
		return err
	}
	if *asJSON {
		return writeJSON(os.Stdout, s)
	}
	w := tabwriter.NewWriter(os.Stdout, 2, 8, 2, ' ', 0)
	h := s.Header
	fmt.Fprintf(w, "trace\t%s (%s, started %s)\n", s.File, uvm.FormatSize(s.Bytes), h.Started.Format(time.RFC3339))
	if len(h.Command) > 0 {
		fmt.Fprintf(w, "command\t%s\n", strings.Join(h.Command, " "))
	}
	fmt.Fprintf(w, "scope\t%s, %d devices, host budget %s, policies %v\n", h.Scope, h.Devices, budgetText(h.HostBudget), h.Policies)
	fmt.Fprintf(w, "events\t%d over %v (dropped: %d)\n", s.Events, s.Span.Round(time.Microsecond), s.Dropped)
	if s.CutShort != "" {
		fmt.Fprintf(w, "cut short\t%s; these are the events before it\n", s.CutShort)
	}
	kinds := make([]string, 0, len(s.ByKind))
	for _, k := range trace.Kinds() {
		if n := s.ByKind[k.String()]; n > 0 {
			kinds = append(kinds, fmt.Sprintf("%s %d", k, n))
		}
	}
	fmt.Fprintf(w, "by kind\t%s\n", strings.Join(kinds, ", "))
	for _, f := range s.Faults {
		fmt.Fprintf(w, "faults on %s\t%d missing, %d minor, %d write-protect; service p50 %.1f us, p99 %.1f us\n", f.Processor, f.Missing, f.Minor, f.WriteProtect, f.P50US, f.P99US)
	}
	for _, m := range s.Moves {
		fmt.Fprintf(w, "%s -> %s (%s)\t%d pages, %s in %d runs, %.2f GB/s while copying\n", m.From, m.To, m.Cause, m.Pages, uvm.FormatSize(int64(m.Bytes)), m.Runs, m.GBps)
	}
	for p, n := range s.Evicted {
		fmt.Fprintf(w, "evicted from %s\t%d pages\n", p, n)
	}
	for p, n := range s.Populate {
		fmt.Fprintf(w, "populated on %s\t%d pages\n", p, n)
	}
	if h.AccessPeriod > 0 {
		fmt.Fprintf(w, "access mode\tevery %v, up to %s a processor\n", h.AccessPeriod, uvm.FormatSize(h.AccessSample))
	}
	for _, a := range s.Access {
		fmt.Fprintf(w, "accesses on %s\t%d rounds armed %d pages; %d of them touched by the next round (%.1f%%)\n", a.Processor, a.Rounds, a.Armed, a.Accessed, 100*a.Touched)
	}
	if s.BytesPerMillionFaults > 0 {
		fmt.Fprintf(w, "size\t%s per million faults\n", uvm.FormatSize(int64(s.BytesPerMillionFaults)))
	}
	return w.Flush()
}

func budgetText(b int64) string {
	if b <= 0 {
		return "none"
	}
	return uvm.FormatSize(b)
}
