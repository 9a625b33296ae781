package bench

import (
	"fmt"
	"io"
	"strconv"
	"strings"
)

// cliffGoals checks the goals on a program's curve.
func cliffGoals(pr *CliffProgram) []CliffGoal {
	if pr.Skipped != "" {
		return nil
	}
	var goals []CliffGoal
	at := func(pct, limit float64) {
		for i := range pr.Points {
			pt := &pr.Points[i]
			if pt.Percent != pct {
				continue
			}
			g := CliffGoal{Goal: fmt.Sprintf("at %g%% of the peak at most %gx plain", pct, limit)}
			switch {
			case !pt.ok() || pt.ToPlain == 0:
				switch {
				case pt.TimedOut:
					g.Detail = firstLine(pt.Failed) // "did not finish within ..."
				case pt.Failed != "":
					g.Detail = "failed: " + firstLine(pt.Failed)
				default:
					g.Detail = "no time measured"
				}
			default:
				g.Met, g.Detail = pt.ToPlain <= limit, fmt.Sprintf("%.2fx", pt.ToPlain)
			}
			goals = append(goals, g)
		}
	}
	at(90, cliffGoalAt90)
	at(50, cliffGoalAt50)

	step := CliffGoal{Goal: fmt.Sprintf("no step between neighbouring budgets above %gx", cliffGoalStep), Met: true}
	worst := 0.0
	for i := 1; i < len(pr.Points); i++ {
		a, b := &pr.Points[i-1], &pr.Points[i]
		if !a.ok() {
			// The steps below a budget that did not finish are not
			// known; the step to it was reported.
			if i == 1 {
				step.Met, step.Detail = false, fmt.Sprintf("%g%% did not finish: the steps below it are not known", a.Percent)
			}
			break
		}
		if !b.ok() {
			step.Met = false
			step.Detail = fmt.Sprintf("%g%% -> %g%%: %g%% did not finish within %.0fs (%.1fx %g%%'s time)", a.Percent, b.Percent, b.Percent, pr.LimitSeconds, pr.LimitSeconds/a.Seconds, a.Percent)
			break
		}
		if x := b.Seconds / a.Seconds; x > worst {
			worst = x
			step.Detail = fmt.Sprintf("largest %.2fx, %g%% -> %g%%", x, a.Percent, b.Percent)
			step.Met = x <= cliffGoalStep
		}
	}
	if len(pr.Points) < 2 {
		step.Detail = "one budget: no step"
	}
	goals = append(goals, step)

	fl := CliffGoal{Goal: "faults at most LRU's at every budget", Met: true}
	known, worstX, worstAt := 0, 0.0, 0.0
	for i := range pr.Points {
		pt := &pr.Points[i]
		b := pt.Bound
		if b == nil {
			continue
		}
		known++
		if b.FaultsToLRU == nil {
			if pt.Failed != "" {
				fl.Met = false
				fl.Detail = fmt.Sprintf("%g%% did not finish", pt.Percent)
			}
			continue
		}
		if *b.FaultsToLRU > worstX {
			worstX, worstAt = *b.FaultsToLRU, pt.Percent
		}
		if int64(pt.Faults) > b.LRUFaults {
			fl.Met = false
		}
	}
	if known == 0 {
		return goals // LRU unknown: not checked
	}
	if fl.Detail == "" {
		fl.Detail = fmt.Sprintf("at most %.3gx LRU's, at %g%%", worstX, worstAt)
	}
	return append(goals, fl)
}

// Print writes the report: a table of each program's curve, and its
// goals.
func (r *CliffReport) Print(out io.Writer) {
	fmt.Fprintf(out, "machine: %d CPUs, Linux %s, %s; medians of %d run(s) after a warm-up, variants alternating; each run limited to %s\n",
		r.Machine.CPUs, r.Machine.Kernel, r.Machine.Go, r.Runs, limitText(r.TimeoutSeconds, r.TimeoutFactor, r.TimeoutFloorSeconds))
	fmt.Fprintf(out, "budgets: percent of each program's peak, %s; under uvm run with %s; every output checked against the plain run's\n", r.Peak, r.policies())
	fmt.Fprintf(out, "LRU and MIN: the faults of least-recently-used eviction and of Belady's MIN (the fewest any eviction takes) on the same references with room for the budget in 4 KiB pages, first touches included; "+
		"x LRU: the server's faults (one may bring many pages) over LRU's; back/MIN: the bytes it brought back to the host over MIN's (MIN's faults but the first touches, 4 KiB each)")
	if r.BoundNote != "" {
		fmt.Fprintf(out, "; of the real programs %s", r.BoundNote)
	}
	fmt.Fprintln(out)
	met := map[bool]string{true: "met", false: "NOT met"}
	for _, p := range r.Programs {
		if !printProgramHead(out, p.Name, p.CommandLine, p.Skipped) {
			continue
		}
		fmt.Fprintf(out, "  %s\n", p.Summary)
		flags := ""
		if len(p.UVMFlags) > 0 {
			flags = " (uvm run " + strings.Join(p.UVMFlags, " ") + ")"
		}
		fmt.Fprintf(out, "  managed peak %s%s; plain %s; each run limited to %.0fs\n", humanSize(uint64(p.PeakBytes)), flags, cliffSeconds(&p.Plain), p.LimitSeconds)
		for _, n := range p.Notes {
			fmt.Fprintf(out, "  note: %s\n", n)
		}
		switch {
		case p.BoundSource != "":
			fmt.Fprintf(out, "  LRU and MIN: %s; %s touched, %d references (repeats collapsed)\n", p.BoundSource, humanSize(uint64(p.BoundHeap)), p.BoundRefCount)
		case p.BoundNote != "" && p.BoundNote != r.BoundNote:
			fmt.Fprintf(out, "  LRU and MIN: %s\n", p.BoundNote)
		}
		fmt.Fprintf(out, "  %-18s %10s %8s %9s %9s %9s %9s %9s %9s %9s %9s %8s %9s\n",
			"budget", "time", "x plain", "x no bgt", "faults", "missing", "to device", "back", "protected", "LRU", "MIN", "x LRU", "back/MIN")
		row := func(pt *CliffPoint) {
			name := pt.Name
			if pt.Failed != "" && !pt.TimedOut {
				fmt.Fprintf(out, "  %-18s failed: %s\n", name, firstLine(pt.Failed))
				return
			}
			ratio, toUnbounded := "-", "-"
			switch {
			case pt.ToPlain > 0:
				ratio = fmt.Sprintf("%.2fx", pt.ToPlain)
			case pt.TimedOut && p.Plain.ok():
				ratio = fmt.Sprintf(">%.1fx", p.LimitSeconds/p.Plain.Seconds) // at least its limit
			}
			if pt.ToUnbounded > 0 && pt != &p.Unbounded {
				toUnbounded = fmt.Sprintf("%.2fx", pt.ToUnbounded)
			}
			lru, opt, toLRU, backToMIN := "-", "-", "-", "-"
			if b := pt.Bound; b != nil {
				lru, opt = strconv.FormatInt(b.LRUFaults, 10), strconv.FormatInt(b.MINFaults, 10)
				if b.FaultsToLRU != nil {
					toLRU = fmt.Sprintf("%.3g", *b.FaultsToLRU)
				}
				if b.BackToMIN != nil {
					backToMIN = fmt.Sprintf("%.3g", *b.BackToMIN)
				}
			}
			fmt.Fprintf(out, "  %-18s %10s %8s %9s %9d %9d %9s %9s %9d %9s %9s %8s %9s\n", name, cliffSeconds(&pt.benchTiming), ratio, toUnbounded, pt.Faults, pt.MissingFaults,
				humanSize(pt.HostToDeviceBytes), humanSize(pt.DeviceToHostBytes), pt.ProtectedPages, lru, opt, toLRU, backToMIN)
		}
		row(&p.Unbounded)
		for i := range p.Points {
			row(&p.Points[i])
		}
		for _, pt := range append([]*CliffPoint{&p.Unbounded}, pointers(p.Points)...) {
			if pt.TimedOut {
				fmt.Fprintf(out, "  %s: %s; its figures are what it did until then\n", pt.Name, firstLine(pt.Failed))
			}
		}
		for _, g := range p.Goals {
			fmt.Fprintf(out, "  goal: %-48s %-8s %s\n", g.Goal+":", met[g.Met], g.Detail)
		}
	}
	fmt.Fprintf(out, "\nevery goal of every program: %s\n", met[r.AllGoalMet])
}

// policies says which policies the managed runs had: the flags given to
// uvm run, or its defaults.
func (r *CliffReport) policies() string {
	var flags []string
	if r.Eviction != "" {
		flags = append(flags, "--eviction "+r.Eviction)
	}
	if r.Thrashing != "" {
		flags = append(flags, "--thrashing "+r.Thrashing)
	}
	if len(flags) == 0 {
		return "uvm run's default policies"
	}
	return strings.Join(flags, " ")
}

// cliffSeconds is a variant's median time, or what became of it.
func cliffSeconds(t *benchTiming) string {
	switch {
	case t.TimedOut:
		return "unfinished"
	case t.Failed != "":
		return "failed"
	case len(t.Runs) == 0:
		return "-"
	}
	return fmt.Sprintf("%.3fs", t.Seconds)
}
