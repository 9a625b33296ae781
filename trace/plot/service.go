package plot

import (
	"fmt"
	"image/color"
	"math"
	"slices"

	gplot "gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"

	"github.com/softuvm/softuvm/trace"
)

// BinsPerDecade is the service time histogram's resolution: its bins
// are this many to a power of ten, of equal width on its log axis.
const BinsPerDecade = 10

// fillAlpha is the opacity of the area under a processor's histogram:
// faint enough that another's shows through where they overlap.
const fillAlpha = 0x40

// ServiceTimes draws the distribution of fault service times (the
// Duration of KindFault: from the server reading the fault to the
// ioctl that resolved it returning) as a histogram for each processor
// that faulted: a count of faults (y) in each bin of service time (x,
// µs, on a log scale; BinsPerDecade bins to a power of ten, the axis
// running from the power of ten below the shortest time to the one
// above the longest). Histograms rather than CDFs, because the shape
// (one mode or two, a tail) is what tells fault paths apart, and counts
// rather than fractions, so that a processor with few faults does not
// look as weighty as one with many.
//
// Each processor's histogram is an outline in its colour (see Color)
// over a faint fill of it, the outlines drawn after every fill so that
// no fill dims another's outline. The legend gives each processor's
// count and median. Faults without a service time (Duration 0, which a
// log axis cannot place) are left out, and the title says how many.
func ServiceTimes(h trace.Header, events []trace.Event) *gplot.Plot {
	us := map[int32][]float64{}
	var untimed int
	lo, hi := math.Inf(1), math.Inf(-1)
	for i := range events {
		e := &events[i]
		if e.Kind != trace.KindFault {
			continue
		}
		if e.Duration <= 0 {
			untimed++
			continue
		}
		x := float64(e.Duration) / 1e3
		us[e.Processor] = append(us[e.Processor], x)
		lo, hi = min(lo, x), max(hi, x)
	}

	title := fmt.Sprintf("Fault service times (histogram, %d bins a decade)", BinsPerDecade)
	switch {
	case len(us) == 0 && untimed == 0:
		title += "\n(no faults in this trace)"
	case len(us) == 0:
		title += fmt.Sprintf("\n(no fault in this trace has a service time: %d without)", untimed)
	case untimed > 0:
		title += fmt.Sprintf("\n(%d faults without a service time left out)", untimed)
	}
	p := newPlot(title, "service time (µs)", "faults")
	p.X.Scale = gplot.LogScale{}
	p.X.Tick.Marker = gplot.LogTicks{Prec: -1}
	if len(us) == 0 {
		p.X.Min, p.X.Max = 1, 1000
		p.Y.Min, p.Y.Max = 0, 1
		return p
	}

	decLo, decHi := math.Floor(math.Log10(lo)), math.Ceil(math.Log10(hi))
	if decHi <= decLo {
		decHi = decLo + 1
	}
	nbins := int(decHi-decLo) * BinsPerDecade
	edge := func(i int) float64 { return math.Pow(10, decLo+float64(i)/BinsPerDecade) }

	var top float64
	var fills, outlines []gplot.Plotter
	var names []string
	var thumbs []gplot.Thumbnailer
	for _, proc := range processors(us) {
		xs := us[proc]
		counts := make([]float64, nbins)
		for _, x := range xs {
			counts[binOf((math.Log10(x)-decLo)/(decHi-decLo), nbins)]++
		}
		// The outline rises from the axis at the first edge, steps
		// across each bin at its count and falls back at the last edge.
		xys := make(plotter.XYs, 0, nbins+3)
		xys = append(xys, plotter.XY{X: edge(0), Y: 0})
		for i, n := range counts {
			xys = append(xys, plotter.XY{X: edge(i), Y: n})
			top = max(top, n)
		}
		xys = append(xys, plotter.XY{X: edge(nbins), Y: counts[nbins-1]}, plotter.XY{X: edge(nbins), Y: 0})

		c := Color(proc)
		fill, err := plotter.NewLine(xys)
		if err != nil { // only for NaN or infinite values, which these are not
			panic(fmt.Sprintf("plot: service time histogram: %v", err))
		}
		fill.StepStyle = plotter.PostStep
		fill.LineStyle.Width = 0
		fill.FillColor = color.NRGBA{R: c.R, G: c.G, B: c.B, A: fillAlpha}
		outline, _ := plotter.NewLine(xys)
		outline.StepStyle = plotter.PostStep
		outline.LineStyle.Color = c
		outline.LineStyle.Width = vg.Points(1.5)
		fills, outlines = append(fills, fill), append(outlines, outline)

		slices.Sort(xs)
		names = append(names, fmt.Sprintf("%s: %d faults, median %s", trace.ProcessorName(proc), len(xs), usText(median(xs))))
		thumbs = append(thumbs, thumbnails{fill, outline})
	}
	p.Add(fills...)
	p.Add(outlines...)
	withLegend(p, names, thumbs)
	p.X.Min, p.X.Max = edge(0), edge(nbins)
	p.Y.Min, p.Y.Max = 0, 1.05*top
	return p
}

// median is the middle of sorted xs.
func median(xs []float64) float64 {
	n := len(xs)
	if n%2 == 1 {
		return xs[n/2]
	}
	return (xs[n/2-1] + xs[n/2]) / 2
}

// usText is a time in µs to three figures.
func usText(us float64) string {
	if us >= 1e6 {
		return fmt.Sprintf("%.3g s", us/1e6)
	}
	if us >= 1000 {
		return fmt.Sprintf("%.3g ms", us/1000)
	}
	return fmt.Sprintf("%.3g µs", us)
}

// thumbnails draws several thumbnails in one legend entry.
type thumbnails []gplot.Thumbnailer

func (ts thumbnails) Thumbnail(c *draw.Canvas) {
	for _, t := range ts {
		t.Thumbnail(c)
	}
}
