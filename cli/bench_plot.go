package cli

import (
	"fmt"
	"image/color"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"

	gplot "gonum.org/v1/plot"

	traceplot "github.com/softuvm/softuvm/trace/plot"
	"github.com/softuvm/softuvm/uvm"
)

// The figures of `uvm bench ... --plot DIR`, each written as NAME.png and
// NAME.svg, of benchPlotWidth x benchPlotHeight pixels.
const (
	benchPlotWidth  = 1200
	benchPlotHeight = 800
)

// h200LaunchUS is NVIDIA's UVM on an H200 in the launch-and-touch
// experiment, us per iteration against the KiB touched, as
// docs/benchmarks.md gives it (`uvm bench launch`, measured with
// NVIDIA's driver on the 16-core machine, 2026-11-21). It measured these
// sizes only.
var h200LaunchUS = []struct {
	KB int
	US float64
}{
	{0, 8.18}, {4, 242}, {8, 363}, {16, 495}, {32, 480}, {64, 467}, {128, 588},
	{256, 677}, {512, 876}, {1024, 1265}, {4096, 1794}, {65536, 16757},
}

// The colours of the series, the same in each figure: this run's fault
// model blue, launch model orange; the H200 green, the seed's GM200 red
// and GP100 purple; the pipe round trip grey.
var (
	colorFault  = traceplot.SeriesColor(0)
	colorLaunch = traceplot.SeriesColor(1)
	colorH200   = traceplot.SeriesColor(2)
	colorGM200  = traceplot.SeriesColor(3)
	colorGP100  = traceplot.SeriesColor(4)
	colorPipe   = color.RGBA{R: 127, G: 127, B: 127, A: 255}
)

// checkPlotDir makes sure the figures of --plot can be written into dir,
// before a benchmark runs: it creates dir if missing and writes (and
// removes) a file in it. An empty dir (no --plot) is fine.
func checkPlotDir(dir string) error {
	if dir == "" {
		return nil
	}
	if fi, err := os.Stat(dir); err == nil && !fi.IsDir() {
		return fmt.Errorf("--plot %s: not a directory", dir)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("--plot %s: cannot create the directory: %w", dir, err)
	}
	f, err := os.CreateTemp(dir, ".uvm-bench-plot-*")
	if err != nil {
		return fmt.Errorf("--plot %s: cannot write there: %w", dir, err)
	}
	f.Close()
	if err := os.Remove(f.Name()); err != nil {
		return fmt.Errorf("--plot %s: %w", dir, err)
	}
	return nil
}

// saveBenchFigures writes each figure into dir as NAME.png and NAME.svg,
// prints the paths on standard error, and returns them.
func saveBenchFigures(dir string, figures []benchFigure) ([]string, error) {
	var paths []string
	for _, f := range figures {
		got, err := traceplot.SaveBoth(f.plot, filepath.Join(dir, f.name), benchPlotWidth, benchPlotHeight)
		paths = append(paths, got...)
		for _, p := range got {
			fmt.Fprintf(os.Stderr, "uvm bench: wrote %s\n", p)
		}
		if err != nil {
			return paths, fmt.Errorf("--plot: %w", err)
		}
	}
	return paths, nil
}

// benchFigure is a figure and the name of its files.
type benchFigure struct {
	name string
	plot *gplot.Plot
}

// plotLaunch draws `uvm bench launch`'s tables into dir (nothing without
// one): launch-touch, us per iteration against the size touched for each
// coherence model run, beside the H200's and the seed's GM200 and GP100
// figures at the sizes of this run; and launch-null, the null launch
// under each schedule flag against the pipe round trip, the 0 KiB rows
// and the reference GPUs' 0 KiB figures.
func plotLaunch(dir string, rep launchReport) ([]string, error) {
	if dir == "" {
		return nil, nil
	}
	lo, hi := 0, 0
	var series []traceplot.Series
	for _, m := range []struct {
		name string
		rows []launchRow
		c    color.Color
	}{
		{"softuvm, fault model (this run)", rep.Rows, colorFault},
		{"softuvm, launch model (this run)", rep.LaunchRows, colorLaunch},
	} {
		if len(m.rows) == 0 {
			continue
		}
		s := traceplot.Series{Name: m.name, Color: m.c}
		for _, r := range m.rows {
			if r.KB <= 0 {
				continue // 0 KiB is in the null-launch figure: a log axis has no zero
			}
			s.X, s.Y = append(s.X, kbBytes(r.KB)), append(s.Y, r.USPerIter)
			if lo == 0 || r.KB < lo {
				lo = r.KB
			}
			hi = max(hi, r.KB)
		}
		series = append(series, s)
	}
	// The reference figures at the sizes this run measured, so that a
	// short run (--max-kb 64) is not drawn on the references' axis.
	within := func(kb int) bool { return kb > 0 && kb >= lo && kb <= hi }
	h200 := traceplot.Series{Name: "NVIDIA H200 (docs/benchmarks.md)", Color: colorH200, Dashed: true}
	for _, r := range h200LaunchUS {
		if within(r.KB) {
			h200.X, h200.Y = append(h200.X, kbBytes(r.KB)), append(h200.Y, r.US)
		}
	}
	gm := traceplot.Series{Name: "GM200, the seed's (Windows 7)", Color: colorGM200, Dashed: true}
	gp := traceplot.Series{Name: "GP100, the seed's (Windows 7)", Color: colorGP100, Dashed: true}
	for _, r := range seedLaunchUS {
		if within(r.KB) {
			gm.X, gm.Y = append(gm.X, kbBytes(r.KB)), append(gm.Y, r.GM200)
			gp.X, gp.Y = append(gp.X, kbBytes(r.KB)), append(gp.Y, r.GP100)
		}
	}
	series = append(series, h200, gm, gp)
	touch := traceplot.Lines(
		fmt.Sprintf("Launch and touch: a kernel on device 0 writes a byte of each 4 KiB page, synchronize, then the host does\n"+
			"this run: %d CPUs, Linux %s, device 0 with %d workers, thrashing detection %s",
			rep.Machine.CPUs, rep.Machine.Kernel, rep.Workers, rep.Thrashing),
		traceplot.Axis{Label: "managed buffer touched each iteration (log scale)", Log: true, Bytes: true},
		traceplot.Axis{Label: "µs per iteration (log scale)", Log: true},
		series)

	var bars []traceplot.Bar
	for _, sc := range rep.Schedules {
		bars = append(bars, traceplot.Bar{Name: sc.Schedule, Value: sc.NullLaunchUS, Color: colorFault})
	}
	if rep.PipeRTTUS > 0 {
		bars = append(bars, traceplot.Bar{Name: "pipe RTT", Value: rep.PipeRTTUS, Color: colorPipe})
	}
	for _, m := range []struct {
		name string
		rows []launchRow
		c    color.Color
	}{{"fault 0 KiB", rep.Rows, colorFault}, {"launch 0 KiB", rep.LaunchRows, colorLaunch}} {
		for _, r := range m.rows {
			if r.KB == 0 {
				bars = append(bars, traceplot.Bar{Name: m.name, Value: r.USPerIter, Color: m.c})
			}
		}
	}
	bars = append(bars, traceplot.Bar{Name: "H200", Value: h200LaunchUS[0].US, Color: colorH200})
	if gm200, gp100, ok := seedRow(0); ok {
		bars = append(bars, traceplot.Bar{Name: "GM200", Value: gm200, Color: colorGM200},
			traceplot.Bar{Name: "GP100", Value: gp100, Color: colorGP100})
	}
	null := traceplot.Bars(
		fmt.Sprintf("Null launch + synchronize, µs: this run under each schedule flag (blue), a pipe round trip from CPU %d (grey),\n"+
			"the launch-and-touch 0 KiB rows, and the H200's and the seed's 0 KiB figures", rep.MeasureCPU),
		"µs", bars)
	return saveBenchFigures(dir, []benchFigure{{"launch-touch", touch}, {"launch-null", null}})
}

// plotMemcpy draws `uvm bench memcpy`'s sizes sweeps into dir (nothing
// without one) as copy-sizes: GB/s against the copy's size, for the
// single-thread copy between host buffers and for Memcpy each way
// (host -> device solid, device -> host dashed) as calibrated and, where
// the report has them, with the engine forced off and forced on, each
// point the rate of a median time a sweep measured.
func plotMemcpy(dir string, rep memcpyReport) ([]string, error) {
	if dir == "" {
		return nil, nil
	}
	gbps := func(bytes int64, us float64) float64 {
		if us <= 0 {
			return 0 // too fast to time: no rate
		}
		return float64(bytes) / us / 1e3
	}
	add := func(s *traceplot.Series, bytes int64, us float64) {
		if v := gbps(bytes, us); v > 0 {
			s.X, s.Y = append(s.X, float64(bytes)), append(s.Y, v)
		}
	}
	host := traceplot.Series{Name: "copy between host buffers, one thread", Color: colorPipe}
	for _, r := range rep.Sizes {
		add(&host, r.Bytes, r.SingleThreadUS)
	}
	series := []traceplot.Series{host}
	for _, way := range []struct {
		name string
		rows []sizeRow
		c    color.Color
	}{
		{"as calibrated", rep.Sizes, colorLaunch},
		{"engine off (one thread)", rep.SizesOneThread, colorH200},
		{fmt.Sprintf("engine forced on (%d producers)", rep.SizesEngineProducers), rep.SizesEngineForced, colorGP100},
	} {
		if len(way.rows) == 0 {
			continue
		}
		h2d := traceplot.Series{Name: "Memcpy " + way.name + ", host -> device", Color: way.c}
		d2h := traceplot.Series{Name: "Memcpy " + way.name + ", device -> host", Color: way.c, Dashed: true}
		for _, r := range way.rows {
			add(&h2d, r.Bytes, r.H2DUS)
			add(&d2h, r.Bytes, r.D2HUS)
		}
		series = append(series, h2d, d2h)
	}
	e := rep.Engine
	calib := e.Source
	switch {
	case calib == "":
		calib = "calibration"
	case strings.HasPrefix(calib, "kept "):
		calib = "kept calibration"
	}
	from := "the engine from " + uvm.FormatSize(e.CopyDirectBelow)
	if e.CopyDirectBelow == math.MaxInt64 {
		from = "one thread at every size"
	}
	sizes := traceplot.Lines(
		fmt.Sprintf("Copy engine: rate against copy size (medians of %d runs)\n"+
			"%d CPUs, Linux %s; %s: copy producers %d, Memcpy on %s",
			rep.Runs, rep.Machine.CPUs, rep.Machine.Kernel, calib, e.CopyProducers, from),
		traceplot.Axis{Label: "bytes per copy (log scale)", Log: true, Bytes: true},
		traceplot.Axis{Label: "GB/s (10^9 bytes a second)"},
		series)
	return saveBenchFigures(dir, []benchFigure{{"copy-sizes", sizes}})
}

// kbBytes is kb KiB in bytes, for a size axis.
func kbBytes(kb int) float64 { return float64(kb) * 1024 }

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
func plotCliff(path string, rep cliffReport) error {
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
