package plot

import (
	"fmt"
	"maps"
	"math"
	"slices"
	"time"

	gplot "gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"

	"github.com/softuvm/softuvm/trace"
)

// targetBins is about how many bins the bandwidth's time axis has:
// BinWidth gives between 125 and 250.
const targetBins = 250

// BinWidth is the bandwidth figure's bin for a trace lasting d: the
// shortest whole number of nanoseconds of 1, 2, 2.5 and 5 times a power
// of ten that cuts d into at most targetBins bins (so, past a few
// microseconds, at least half as many). Round widths make the title's
// "bin: 2 ms" read.
func BinWidth(d time.Duration) time.Duration {
	want := float64(d) / targetBins
	if want <= 1 {
		return 1
	}
	for pow := 1.0; ; pow *= 10 {
		for _, m := range []float64{1, 2, 2.5, 5} {
			if w := m * pow; w >= want && w == math.Trunc(w) {
				return time.Duration(w)
			}
		}
	}
}

// direction is a way pages move: from one location to another.
type direction struct{ from, to int32 }

func (d direction) name() string {
	return trace.ProcessorName(d.from) + " -> " + trace.ProcessorName(d.to)
}

// Bandwidth draws migration bandwidth over time: for each direction
// pages moved in (From and To of KindMigration), the bytes moved in each
// bin of time (of BinWidth of the trace's length), in GB/s (10^9 bytes
// a second). A migration's bytes are spread evenly over its copy (Time
// to Time+Duration), so that a long copy across bins shows as the rate
// it ran at rather than a spike where it began; one without a Duration
// counts whole in the bin it began in.
//
// A line has its destination's colour (see Color), solid when the pages
// came from the cpu and dashed, in a pattern of the source device's,
// when from a device: "cpu -> device 0" solid orange, "device 0 -> cpu"
// dashed blue. Each bin is drawn as a flat step across it.
func Bandwidth(h trace.Header, events []trace.Event) *gplot.Plot {
	ps := pageBytes(h)
	end := span(events)
	unit, unitName := timeUnit(end)
	bin := BinWidth(end)
	nbins := int((end + bin - 1) / bin)

	moved := map[direction][]float64{}
	totals := map[direction]float64{}
	for i := range events {
		e := &events[i]
		if e.Kind != trace.KindMigration || e.Pages == 0 {
			continue
		}
		d := direction{e.From, e.To}
		b := moved[d]
		if b == nil {
			b = make([]float64, nbins)
			moved[d] = b
		}
		bytes := float64(uint64(e.Pages) * ps)
		totals[d] += bytes
		start := max(e.Time, 0)
		first := min(int(start/bin), nbins-1)
		if e.Duration <= 0 {
			b[first] += bytes
			continue
		}
		stop := start + e.Duration
		for k := first; k < nbins && time.Duration(k)*bin < stop; k++ {
			lo, hi := max(start, time.Duration(k)*bin), min(stop, time.Duration(k+1)*bin)
			b[k] += bytes * float64(hi-lo) / float64(e.Duration)
		}
	}

	binText := durationText(bin)
	title := "Migration bandwidth (bin: " + binText + ")"
	if len(moved) == 0 {
		title += "\n(no migrations in this trace)"
	}
	p := newPlot(title, timeLabel(unitName), "GB/s")
	dirs := slices.SortedFunc(maps.Keys(moved), func(a, b direction) int {
		if a.from != b.from {
			return int(a.from) - int(b.from)
		}
		return int(a.to) - int(b.to)
	})
	var top float64
	var names []string
	var thumbs []gplot.Thumbnailer
	for _, d := range dirs {
		xys := make(plotter.XYs, nbins+1)
		for k, bytes := range moved[d] {
			rate := bytes / bin.Seconds() / 1e9
			top = max(top, rate)
			xys[k] = plotter.XY{X: float64(time.Duration(k)*bin) / float64(unit), Y: rate}
		}
		// The last point closes the last bin's step.
		xys[nbins] = plotter.XY{X: float64(time.Duration(nbins)*bin) / float64(unit), Y: xys[nbins-1].Y}
		l, err := plotter.NewLine(xys)
		if err != nil { // only for NaN or infinite values, which counts of bytes are not
			panic(fmt.Sprintf("plot: bandwidth line: %v", err))
		}
		l.StepStyle = plotter.PostStep
		l.LineStyle.Color = Color(d.to)
		l.LineStyle.Width = vg.Points(1.5)
		l.LineStyle.Dashes = dashes(d.from)
		p.Add(l)
		names = append(names, fmt.Sprintf("%s: %s", d.name(), sizeText(totals[d])))
		thumbs = append(thumbs, l)
	}
	withLegend(p, names, thumbs)
	p.X.Min, p.X.Max = 0, float64(end)/float64(unit)
	// Headroom above the highest bin keeps a plateau off the frame.
	p.Y.Min, p.Y.Max = 0, 1.1*top
	if top == 0 {
		p.Y.Max = 1
	}
	return p
}

// dashes is the dash pattern of lines of pages from source: none from
// the cpu, a device's own from a device.
func dashes(source int32) []vg.Length {
	if source == trace.CPU {
		return nil
	}
	patterns := [][]vg.Length{
		{vg.Points(6), vg.Points(3)},
		{vg.Points(2), vg.Points(2)},
		{vg.Points(8), vg.Points(2), vg.Points(2), vg.Points(2)},
		{vg.Points(12), vg.Points(4)},
	}
	if source < 0 {
		source = 0
	}
	return patterns[int(source)%len(patterns)]
}

// durationText is a bin width as a title gives it: "2 ms", "250 µs".
func durationText(d time.Duration) string {
	switch {
	case d >= time.Second:
		return fmt.Sprintf("%g s", d.Seconds())
	case d >= time.Millisecond:
		return fmt.Sprintf("%g ms", float64(d)/float64(time.Millisecond))
	case d >= time.Microsecond:
		return fmt.Sprintf("%g µs", float64(d)/float64(time.Microsecond))
	}
	return fmt.Sprintf("%d ns", int64(d))
}
