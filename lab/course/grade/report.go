package grade

import (
	"fmt"
	"io"
	"math"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/softuvm/softuvm/trace"
	"github.com/softuvm/softuvm/uvm"
)

// Report is what a grading found, as --json prints it.
type Report struct {
	// Assignment is the assignment's name; File the student's file as
	// the grader was given it; Policy the name the student's policy
	// reports (its Name method).
	Assignment string `json:"assignment"`
	File       string `json:"file,omitempty"`
	Policy     string `json:"policy"`
	// Baseline is the policy to beat, References those shown beside it,
	// Oracle the bound ("" where the lab has none), as replay specs.
	Baseline   string   `json:"baseline"`
	References []string `json:"references,omitempty"`
	Oracle     string   `json:"oracle,omitempty"`
	// Metric says what the scores compare.
	Metric string `json:"metric"`
	// TraceDirs are where the traces came from; Traces, one score each.
	TraceDirs []string     `json:"trace_dirs"`
	Traces    []TraceScore `json:"traces"`
	// Live is the live run (nil with --no-live).
	Live *Live `json:"live,omitempty"`
	// Verdict sums it up.
	Verdict Verdict `json:"verdict"`
}

// The outcomes of a comparison with the baseline.
const (
	Beats = "beats"
	Ties  = "ties"
	Loses = "loses"
	// Failed: the student's policy panicked, or the run failed.
	Failed = "failed"
)

// How close two figures must be to tie. A replay is exact, but a policy
// that walks a map may not repeat itself to the page; two live runs of
// one policy differ by a percent or two (the server's threads, the
// scheduler).
const (
	tie     = 0.001
	liveTie = 0.03
)

// outcome compares the student's figure of a replay with the baseline's,
// lower being better.
func outcome(student, baseline float64) string { return outcomeWithin(student, baseline, tie) }

// outcomeWithin compares two figures, lower being better, as a tie when
// they are within the fraction band of each other.
func outcomeWithin(student, baseline, band float64) string {
	switch {
	case student < baseline*(1-band):
		return Beats
	case student > baseline*(1+band):
		return Loses
	}
	return Ties
}

// Run is one policy replayed over one trace.
type Run struct {
	// Role is "student", "baseline", "reference" or "oracle"; Spec the
	// replay's spec, Name what the policy calls itself.
	Role string `json:"role"`
	Spec string `json:"spec"`
	Name string `json:"name"`
	// What the replay counted, and its estimate (lab.Result).
	Faults        uint64        `json:"faults"`
	BytesMoved    uint64        `json:"bytes_moved"`
	EvictedPages  uint64        `json:"evicted_pages"`
	Prefetched    uint64        `json:"prefetched_pages"`
	Throttles     uint64        `json:"throttles"`
	Pins          uint64        `json:"pins"`
	NapTime       time.Duration `json:"nap_ns"`
	Refused       uint64        `json:"refused"`
	BadVictims    uint64        `json:"bad_victims"`
	EstimatedTime time.Duration `json:"estimated_ns"`
	Wall          time.Duration `json:"wall_ns"`
	// Error is what went wrong instead (a panic of the policy, with
	// where).
	Error string `json:"error,omitempty"`
}

// TraceScore is the student's policy against the others on one trace.
type TraceScore struct {
	Trace  string `json:"trace"`
	Events uint64 `json:"events"`
	// Runs: the student's, the baseline's, the references', the
	// oracle's, in that order.
	Runs []Run `json:"runs"`
	// Outcome compares the student's estimated time with the
	// baseline's.
	Outcome string `json:"outcome"`
	// VsBaseline and VsOracle are the student's estimated time divided
	// by theirs (0 where there is no oracle).
	VsBaseline float64 `json:"vs_baseline"`
	VsOracle   float64 `json:"vs_oracle,omitempty"`
	// GapClosed is how much of the way from the baseline to the oracle
	// the student's policy went: 1 is the oracle's time, 0 the
	// baseline's, below 0 worse than the baseline. Absent (NaN in Go)
	// without an oracle, or where the oracle does no better than the
	// baseline.
	GapClosed *float64 `json:"gap_closed,omitempty"`
	// Notes are remarks on the runs (victims not of the replay, faults
	// refused).
	Notes []string `json:"notes,omitempty"`
	// Error is set when the trace could not be replayed at all.
	Error string `json:"error,omitempty"`
}

// Live is the live run: the assignment's program, once with the
// baseline and once with the student's policy.
type Live struct {
	// Workload says what the program does, Metric what decides.
	Workload string `json:"workload"`
	Metric   string `json:"metric"`
	// Runs: the baseline's, then the student's.
	Runs []LiveRun `json:"runs,omitempty"`
	// Outcome compares the student's run with the baseline's by Metric;
	// Ratio is the student's figure divided by the baseline's.
	Outcome string  `json:"outcome,omitempty"`
	Ratio   float64 `json:"ratio,omitempty"`
	// Skipped says why there was no live run (no userfaultfd, say);
	// Error, why it failed.
	Skipped string `json:"skipped,omitempty"`
	Error   string `json:"error,omitempty"`
}

// LiveRun is one run of the live program, with the server's statistics.
type LiveRun struct {
	Role   string `json:"role"`
	Policy string `json:"policy"`
	// Faults, pages moved each way and evicted, throttles and pins, from
	// the server's statistics of the session.
	Faults        uint64 `json:"faults"`
	PagesToDevice uint64 `json:"pages_to_device"`
	PagesToHost   uint64 `json:"pages_to_host"`
	EvictedPages  uint64 `json:"evicted_pages"`
	Throttles     uint64 `json:"throttles"`
	Pins          uint64 `json:"pins"`
	RemoteMapped  uint64 `json:"remote_mapped_pages"`
	// Wall is the program's run time; Modeled, its faults and pages
	// priced at lab.DefaultCosts (steadier than the wall time on a busy
	// machine).
	Wall    time.Duration `json:"wall_ns"`
	Modeled time.Duration `json:"modeled_ns"`
	// Checked reports that the data the program wrote read back right.
	Checked bool `json:"checked"`
}

// BytesMoved is every byte the run moved.
func (r LiveRun) BytesMoved() uint64 { return (r.PagesToDevice + r.PagesToHost) * uvm.PageSize }

// Verdict sums the grading up.
type Verdict struct {
	// Traces is how many traces were scored; Beats, Ties, Loses and
	// Failed count their outcomes.
	Traces int `json:"traces"`
	Beats  int `json:"beats"`
	Ties   int `json:"ties"`
	Loses  int `json:"loses"`
	Failed int `json:"failed"`
	// Live is the live run's outcome ("" without one).
	Live string `json:"live,omitempty"`
	// MeanVsBaseline is the geometric mean of the traces' VsBaseline;
	// MeanGapClosed the mean of their GapClosed (absent without an
	// oracle).
	MeanVsBaseline float64  `json:"mean_vs_baseline"`
	MeanGapClosed  *float64 `json:"mean_gap_closed,omitempty"`
	// Pass: the student's policy beat the baseline somewhere (a trace or
	// the live run) and lost nowhere, and nothing failed.
	Pass bool `json:"pass"`
	// Line is the verdict as the text report prints it.
	Line string `json:"line"`
}

// sum fills the verdict from the traces and the live run.
func (r *Report) sum() {
	v := Verdict{Traces: len(r.Traces)}
	var logSum float64
	var logN int
	var gapSum float64
	var gapN int
	for _, t := range r.Traces {
		switch t.Outcome {
		case Beats:
			v.Beats++
		case Ties:
			v.Ties++
		case Loses:
			v.Loses++
		default:
			v.Failed++
		}
		if t.VsBaseline > 0 && !math.IsInf(t.VsBaseline, 0) {
			logSum += math.Log(t.VsBaseline)
			logN++
		}
		if t.GapClosed != nil {
			gapSum += *t.GapClosed
			gapN++
		}
	}
	if logN > 0 {
		v.MeanVsBaseline = math.Exp(logSum / float64(logN))
	}
	if gapN > 0 {
		g := gapSum / float64(gapN)
		v.MeanGapClosed = &g
	}
	if r.Live != nil {
		switch {
		case r.Live.Skipped != "":
			v.Live = "skipped"
		case r.Live.Error != "":
			v.Live = Failed
		default:
			v.Live = r.Live.Outcome
		}
	}
	beatSomewhere := v.Beats > 0 || v.Live == Beats
	v.Pass = beatSomewhere && v.Loses == 0 && v.Failed == 0 && v.Live != Loses && v.Live != Failed

	var b strings.Builder
	fmt.Fprintf(&b, "beats the baseline (%s) on %d of %d traces", r.Baseline, v.Beats, v.Traces)
	if v.Ties+v.Loses+v.Failed > 0 {
		fmt.Fprintf(&b, " (ties on %d, loses on %d, failed on %d)", v.Ties, v.Loses, v.Failed)
	}
	if v.MeanVsBaseline > 0 {
		fmt.Fprintf(&b, "; %.3f of its estimated time (geometric mean)", v.MeanVsBaseline)
	}
	if v.MeanGapClosed != nil {
		fmt.Fprintf(&b, "; %.0f%% of the way to the oracle (%s)", 100**v.MeanGapClosed, r.Oracle)
	}
	switch v.Live {
	case "":
	case "skipped":
		b.WriteString("; live run skipped")
	default:
		fmt.Fprintf(&b, "; live: %s", v.Live)
	}
	if v.Pass {
		b.WriteString(": PASS")
	} else {
		b.WriteString(": NOT YET (beat the baseline somewhere, and lose nowhere)")
	}
	v.Line = b.String()
	r.Verdict = v
}

// write prints the report as text.
func (r *Report) write(w io.Writer) {
	fmt.Fprintf(w, "Assignment %s: your policy %q", r.Assignment, r.Policy)
	if r.File != "" {
		fmt.Fprintf(w, " (%s)", r.File)
	}
	fmt.Fprintf(w, " against the baseline %s", r.Baseline)
	if len(r.References) > 0 {
		fmt.Fprintf(w, ", with %s for scale", strings.Join(r.References, " and "))
	}
	if r.Oracle != "" {
		fmt.Fprintf(w, ", and the bound %s", r.Oracle)
	}
	fmt.Fprintf(w, ".\nScored by %s; lower is better.\n", r.Metric)
	if len(r.Traces) == 0 {
		fmt.Fprintf(w, "\nNo traces in %s (*.uvmtrace, *.uvmtrace.gz): graded on the live run only.\n", strings.Join(r.TraceDirs, ", "))
	}
	for _, t := range r.Traces {
		fmt.Fprintf(w, "\ntrace %s", t.Trace)
		if t.Events > 0 {
			fmt.Fprintf(w, " (%d events)", t.Events)
		}
		fmt.Fprintln(w)
		if t.Error != "" {
			fmt.Fprintf(w, "  could not be replayed: %s\n", t.Error)
			continue
		}
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', tabwriter.AlignRight)
		oracleCol := r.Oracle != ""
		labels := make([]string, len(t.Runs))
		width := len("policy")
		for i, run := range t.Runs {
			labels[i] = runLabel(run)
			width = max(width, len(labels[i]))
		}
		// tabwriter aligns every column right: the names, padded to one
		// width, read left-aligned.
		fmt.Fprintf(tw, "  %-*s\tfaults\tmoved\tevicted\tthrottles\tpins\test. time\tvs %s\t", width, "policy", r.Baseline)
		if oracleCol {
			fmt.Fprintf(tw, "vs %s\t", r.Oracle)
		}
		fmt.Fprintln(tw)
		base, orc := t.find("baseline"), t.find("oracle")
		for i, run := range t.Runs {
			label := fmt.Sprintf("%-*s", width, labels[i])
			if run.Error != "" {
				fmt.Fprintf(tw, "  %s\tfailed\t-\t-\t-\t-\t-\t-\t", label)
				if oracleCol {
					fmt.Fprintf(tw, "-\t")
				}
				fmt.Fprintln(tw)
				continue
			}
			fmt.Fprintf(tw, "  %s\t%d\t%s\t%s\t%d\t%d\t%v\t%s\t", label, run.Faults, trace.HumanSize(run.BytesMoved),
				trace.HumanSize(run.EvictedPages*uvm.PageSize), run.Throttles, run.Pins, roundTime(run.EstimatedTime), ratioText(run, base))
			if oracleCol {
				fmt.Fprintf(tw, "%s\t", ratioText(run, orc))
			}
			fmt.Fprintln(tw)
		}
		tw.Flush()
		for _, run := range t.Runs {
			if run.Error != "" {
				fmt.Fprintf(w, "  %s failed: %s\n", run.Spec, indent(run.Error))
			}
		}
		for _, n := range t.Notes {
			fmt.Fprintf(w, "  note: %s\n", n)
		}
		fmt.Fprintf(w, "  → %s\n", t.line(r))
	}
	if r.Live != nil {
		r.Live.write(w, r.Baseline)
	}
	fmt.Fprintf(w, "\nScore: %s\n", r.Verdict.Line)
}

// runLabel is how the table names a run's policy.
func runLabel(run Run) string {
	switch run.Role {
	case "student":
		name := run.Name
		if name == "" {
			name = run.Spec
		}
		return "you (" + name + ")"
	case "baseline":
		return run.Spec + " (baseline)"
	case "oracle":
		return run.Spec + " (bound)"
	}
	return run.Spec
}

func (t *TraceScore) find(role string) *Run {
	for i := range t.Runs {
		if t.Runs[i].Role == role && t.Runs[i].Error == "" {
			return &t.Runs[i]
		}
	}
	return nil
}

// line is a trace's outcome in words.
func (t *TraceScore) line(r *Report) string {
	if t.Outcome == Failed {
		return "failed: your policy did not complete the replay"
	}
	s := fmt.Sprintf("%s %s: %.3f of its estimated time", t.Outcome, r.Baseline, t.VsBaseline)
	if t.GapClosed != nil {
		s += fmt.Sprintf(", %.0f%% of the way to %s", 100**t.GapClosed, r.Oracle)
	}
	return s
}

func ratioText(run Run, to *Run) string {
	if to == nil || to.EstimatedTime <= 0 {
		return "-"
	}
	return fmt.Sprintf("%.3f", float64(run.EstimatedTime)/float64(to.EstimatedTime))
}

func roundTime(d time.Duration) time.Duration {
	switch {
	case d >= 10*time.Second:
		return d.Round(10 * time.Millisecond)
	case d >= time.Second:
		return d.Round(time.Millisecond)
	case d >= time.Millisecond:
		return d.Round(10 * time.Microsecond)
	}
	return d.Round(time.Microsecond)
}

func indent(s string) string { return strings.ReplaceAll(strings.TrimRight(s, "\n"), "\n", "\n    ") }

func (l *Live) write(w io.Writer, baseline string) {
	fmt.Fprintf(w, "\nlive: %s\n", l.Workload)
	if l.Skipped != "" {
		fmt.Fprintf(w, "  skipped: %s\n", l.Skipped)
		return
	}
	if len(l.Runs) > 0 {
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', tabwriter.AlignRight)
		labels := make([]string, len(l.Runs))
		width := len("policy")
		for i, run := range l.Runs {
			labels[i] = run.Policy + " (baseline)"
			if run.Role == "student" {
				labels[i] = "you (" + run.Policy + ")"
			}
			width = max(width, len(labels[i]))
		}
		fmt.Fprintf(tw, "  %-*s\tfaults\tmoved\tevicted\tthrottles\tpins\tremote\tmodeled\twall\t", width, "policy")
		fmt.Fprintf(tw, "data\t\n")
		for i, run := range l.Runs {
			label := fmt.Sprintf("%-*s", width, labels[i])
			data := "wrong"
			if run.Checked {
				data = "ok"
			}
			fmt.Fprintf(tw, "  %s\t%d\t%s\t%s\t%d\t%d\t%d\t%v\t%v\t", label, run.Faults, trace.HumanSize(run.BytesMoved()),
				trace.HumanSize(run.EvictedPages*uvm.PageSize), run.Throttles, run.Pins, run.RemoteMapped, roundTime(run.Modeled), roundTime(run.Wall))
			fmt.Fprintf(tw, "%s\t\n", data)
		}
		tw.Flush()
	}
	if l.Error != "" {
		fmt.Fprintf(w, "  failed: %s\n", indent(l.Error))
		return
	}
	fmt.Fprintf(w, "  → %s %s by %s: %.3f of its figure\n", l.Outcome, baseline, l.Metric, l.Ratio)
}
