package bench

import (
	"fmt"
	"image/color"

	traceplot "github.com/softuvm/softuvm/trace/plot"
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

// plotLaunch draws `uvm bench launch`'s tables into dir (nothing without
// one): launch-touch, us per iteration against the size touched for each
// coherence model run, beside the H200's and the seed's GM200 and GP100
// figures at the sizes of this run; and launch-null, the null launch
// under each schedule flag against the pipe round trip, the 0 KiB rows
// and the reference GPUs' 0 KiB figures.
func plotLaunch(dir string, rep *LaunchReport, progress Progress) ([]string, error) {
	if dir == "" {
		return nil, nil
	}
	lo, hi := 0, 0
	var series []traceplot.Series
	for _, m := range []struct {
		name string
		rows []LaunchRow
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
		rows []LaunchRow
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
	return saveBenchFigures(dir, []benchFigure{{"launch-touch", touch}, {"launch-null", null}}, progress)
}
