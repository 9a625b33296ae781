package bench

import (
	"fmt"
	"image/color"
	"math"
	"strings"

	traceplot "github.com/softuvm/softuvm/trace/plot"
	"github.com/softuvm/softuvm/uvm"
)

// plotMemcpy draws `uvm bench memcpy`'s sizes sweeps into dir (nothing
// without one) as copy-sizes: GB/s against the copy's size, for the
// single-thread copy between host buffers and for Memcpy each way
// (host -> device solid, device -> host dashed) as calibrated and, where
// the report has them, with the engine forced off and forced on, each
// point the rate of a median time a sweep measured.
func plotMemcpy(dir string, rep *MemcpyReport, progress Progress) ([]string, error) {
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
		rows []SizeRow
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
	return saveBenchFigures(dir, []benchFigure{{"copy-sizes", sizes}}, progress)
}
