package bench

import (
	"fmt"
	"slices"

	gplot "gonum.org/v1/plot"

	traceplot "github.com/softuvm/softuvm/trace/plot"
)

// The budget curve's figure (`uvm bench cliff --png`): three panels, one
// above the other, of cliffPlotWidth x cliffPlotHeight pixels in all.
const (
	cliffPlotWidth  = 1300
	cliffPlotHeight = 2000
)

// plotCliff draws `uvm bench cliff`'s curves into the PNG file path,
// against the budget (falling from left to right: the budget in percent
// of the program's managed peak, ticked at the budgets measured), each
// program in one colour in every panel. Above, each program's median
// time over its plain time (log scale), a budget that did not finish
// drawn at its limit as a hollow triangle, the goals at 90% and 50% as
// bars. In the middle, for the programs whose LRU is known, the
// server's faults over LRU's (solid) and MIN's over LRU's (dashed), the
// goal of at most LRU's dotted at 1. Below, the bytes the server brought
// back to the host over MIN's (solid) and LRU's over MIN's (dashed): 1 is
// the least any eviction brings back.
func plotCliff(path string, rep *CliffReport) error {
	var times, faults, back []traceplot.Series
	for i, p := range rep.Programs {
		if p.Skipped != "" {
			continue
		}
		c := traceplot.SeriesColor(i)
		ts := traceplot.Series{Name: p.Name, Color: c}
		ours := traceplot.Series{Name: p.Name + ": uvm run", Color: c}
		best := traceplot.Series{Name: p.Name + ": MIN", Color: c, Dashed: true}
		ourBack := traceplot.Series{Name: p.Name + ": uvm run", Color: c}
		lruBack := traceplot.Series{Name: p.Name + ": LRU", Color: c, Dashed: true}
		add := func(s *traceplot.Series, x, y float64) { s.X, s.Y = append(s.X, x), append(s.Y, y) }
		for _, pt := range p.Points {
			switch {
			case pt.ToPlain > 0:
				add(&ts, pt.Percent, pt.ToPlain)
				ts.AtLeast = append(ts.AtLeast, false)
			case pt.TimedOut && p.Plain.ok():
				add(&ts, pt.Percent, p.LimitSeconds/p.Plain.Seconds)
				ts.AtLeast = append(ts.AtLeast, true)
			}
			b := pt.Bound
			if b == nil || b.LRUFaults == 0 {
				continue
			}
			if b.FaultsToLRU != nil {
				add(&ours, pt.Percent, *b.FaultsToLRU)
			}
			add(&best, pt.Percent, float64(b.MINFaults)/float64(b.LRUFaults))
			if b.MINBackBytes > 0 {
				if b.BackToMIN != nil {
					add(&ourBack, pt.Percent, *b.BackToMIN)
				}
				add(&lruBack, pt.Percent, b.lruBackToMIN())
			}
		}
		times = append(times, ts)
		if len(best.X) > 0 {
			faults = append(faults, ours, best)
		}
		if len(lruBack.X) > 0 {
			back = append(back, ourBack, lruBack)
		}
	}
	lo, hi := slices.Min(rep.BudgetPercents), slices.Max(rep.BudgetPercents)
	for _, g := range []struct {
		pct, limit float64
	}{{90, cliffGoalAt90}, {50, cliffGoalAt50}} {
		if g.pct >= lo && g.pct <= hi {
			times = append(times, traceplot.Series{Name: fmt.Sprintf("goal: at %g%%, at most %gx plain", g.pct, g.limit), Goal: true,
				X: []float64{g.pct}, Y: []float64{g.limit}})
		}
	}
	times = append(times, traceplot.Series{Name: "plain: 1x", Reference: true, X: []float64{hi, lo}, Y: []float64{1, 1}})
	if len(faults) > 0 {
		faults = append(faults, traceplot.Series{Name: "goal: at most LRU's", Goal: true, X: []float64{hi, lo}, Y: []float64{1, 1}})
	}
	if len(back) > 0 {
		back = append(back, traceplot.Series{Name: "MIN: the least", Reference: true, X: []float64{hi, lo}, Y: []float64{1, 1}})
	}
	budget := traceplot.Axis{Label: "host budget, % of the program's managed peak (the most managed memory on the host at once, no budget)", Reverse: true, Ticks: rep.BudgetPercents}
	top := traceplot.Lines(
		fmt.Sprintf("Budget curve: time under uvm run --host-budget over the time plain (medians of %d run(s); %s)\n"+
			"%d CPUs, Linux %s; a triangle: did not finish within its limit, drawn at the limit", rep.Runs, rep.policies(), rep.Machine.CPUs, rep.Machine.Kernel),
		budget, traceplot.Axis{Label: "time over plain (log scale)", Log: true}, times)
	middle := traceplot.Lines(
		"Faults over LRU's faults on the same references, 4 KiB pages, first touches included\n"+
			"solid: uvm run (every kind of fault; one may bring many pages); dashed: Belady's MIN, the fewest any eviction takes",
		budget, traceplot.Axis{Label: "faults over LRU's (log scale)", Log: true}, faults)
	bottom := traceplot.Lines(
		"Bytes brought back to the host over MIN's (its faults but the first touches, 4 KiB each): 1 is the least any eviction brings back\n"+
			"solid: uvm run (every copy from a device to the host); dashed: LRU",
		budget, traceplot.Axis{Label: "brought back over MIN's (log scale)", Log: true}, back)
	if err := traceplot.SaveColumn([]*gplot.Plot{top, middle, bottom}, path, traceplot.Pixels(cliffPlotWidth), traceplot.Pixels(cliffPlotHeight)); err != nil {
		return fmt.Errorf("--png: %w", err)
	}
	return nil
}
