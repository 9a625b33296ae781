package plot

import (
	"fmt"
	"image/color"
	"math"
	"strconv"

	gplot "gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
)

// This file draws figures of tables (a benchmark's, say) rather than of
// traces: Lines, a line for each series of (x, y) points, and Bars, a
// bar for each named value. Both take their data as plain numbers, so
// that they know nothing of where the numbers come from.

// Series is one line of a Lines figure: the points (X[i], Y[i]), joined
// in the order given, each marked. A point that cannot be drawn (NaN,
// infinite, or not above zero on a logarithmic axis) is left out. A
// series of one point is that point's mark alone.
type Series struct {
	Name string
	X, Y []float64
	// Dashed draws the series as a dashed line with hollow marks, where
	// the others are solid lines with filled marks: figures measured
	// elsewhere (another machine, a paper) beside this run's, or a
	// second kind of the same colour.
	Dashed bool
	// Color is the series' colour; nil for SeriesColor of its place in
	// the list (for a Goal, goalColor).
	Color color.Color
	// Goal draws the series as a limit the others are measured against
	// (a goal): each point a short horizontal bar, the points joined by
	// a dotted line where there are several.
	Goal bool
	// Reference draws the series as a level to read the others against
	// (plain's time, say): a thin dotted line through its points, no
	// marks, in its colour (goalColor where none is given).
	Reference bool
	// AtLeast, where set for a point (its length is X's), says that its
	// value is only a lower bound (a run stopped at its limit): the
	// point is a hollow upward triangle rather than a dot.
	AtLeast []bool
}

// goalColor is a Goal series' colour where it has none of its own.
var goalColor = color.RGBA{R: 64, G: 64, B: 64, A: 255}

// Axis is one axis of a Lines figure.
type Axis struct {
	Label string
	// Log puts the axis on a logarithmic scale, spanning exactly the
	// least to the greatest value drawn on it. A linear x axis spans the
	// same; a linear y axis spans 0 (or the least value, if negative) to
	// a tenth above the greatest.
	Log bool
	// Bytes says the values are byte counts: ticks at powers of two
	// (on a logarithmic axis), labelled in binary units: "64 KiB".
	Bytes bool
	// Reverse runs the axis from its greatest value to its least, left
	// to right (or bottom to top): a budget falling from 100% to 25%.
	Reverse bool
	// Ticks, where set, are the values ticked and labelled on a linear
	// axis (the budgets measured, say), in place of gonum's choice.
	Ticks []float64
}

// SeriesColor is the colour of the i-th series of a figure: Tableau's
// ten without its grey, in order (the processors' palette of Color):
// blue (31,119,180), orange (255,127,14), green (44,160,44), red
// (214,39,40), purple (148,103,189), brown (140,86,75), pink
// (227,119,194), olive (188,189,34), cyan (23,190,207), then blue again.
func SeriesColor(i int) color.RGBA {
	return palette[((i%len(palette))+len(palette))%len(palette)]
}

// lineWidth is the width of every series' line.
var lineWidth = vg.Points(2)

// Lines draws series as lines over the axes x and y, with a legend
// naming each series in a margin right of the data. A figure with no
// point to draw still gives one, whose title says so.
func Lines(title string, x, y Axis, series []Series) *gplot.Plot {
	type kept struct {
		s   Series
		xys plotter.XYs
		// lower are the points of xys that are lower bounds, the others
		// dots.
		lower, dots plotter.XYs
	}
	var drawn []kept
	xr, yr := newExtent(), newExtent()
	for _, s := range series {
		k := kept{s: s}
		for i := range min(len(s.X), len(s.Y)) {
			px, py := s.X[i], s.Y[i]
			if !drawable(px, x.Log) || !drawable(py, y.Log) {
				continue
			}
			pt := plotter.XY{X: px, Y: py}
			k.xys = append(k.xys, pt)
			if i < len(s.AtLeast) && s.AtLeast[i] {
				k.lower = append(k.lower, pt)
			} else {
				k.dots = append(k.dots, pt)
			}
			xr.add(px)
			yr.add(py)
		}
		drawn = append(drawn, k)
	}
	if xr.empty() {
		title += "\n(nothing to draw)"
	}
	p := newPlot(title, x.Label, y.Label)
	p.Add(plotter.NewGrid()) // first, so that the lines lie over it
	var names []string
	var thumbs []gplot.Thumbnailer
	for i, k := range drawn {
		c := k.s.Color
		if c == nil {
			c = SeriesColor(i)
			if k.s.Goal || k.s.Reference {
				c = goalColor
			}
		}
		var th multiThumb
		if len(k.xys) > 1 {
			l, err := plotter.NewLine(k.xys)
			if err != nil { // only for NaN or infinite values, left out above
				panic(fmt.Sprintf("plot: line %q: %v", k.s.Name, err))
			}
			l.LineStyle.Color = c
			l.LineStyle.Width = lineWidth
			switch {
			case k.s.Reference:
				l.LineStyle.Width = lineWidth / 2
				l.LineStyle.Dashes = []vg.Length{vg.Points(1), vg.Points(3)}
			case k.s.Goal:
				l.LineStyle.Width = lineWidth * 3 / 4
				l.LineStyle.Dashes = []vg.Length{vg.Points(2), vg.Points(3)}
			case k.s.Dashed:
				l.LineStyle.Dashes = []vg.Length{vg.Points(7), vg.Points(4)}
			}
			p.Add(l)
			th = append(th, l)
		}
		// The legend shows a series' dots, or its triangles where it
		// has no dots.
		marks := func(xys plotter.XYs, sty draw.GlyphStyle, legend bool) {
			if len(xys) == 0 {
				return
			}
			sc, err := plotter.NewScatter(xys)
			if err != nil {
				panic(fmt.Sprintf("plot: marks %q: %v", k.s.Name, err))
			}
			sc.GlyphStyle = sty
			p.Add(sc)
			if legend {
				th = append(th, sc)
			}
		}
		dot := draw.GlyphStyle{Color: c, Radius: vg.Points(3.5), Shape: draw.CircleGlyph{}}
		switch {
		case k.s.Goal:
			dot = draw.GlyphStyle{Color: c, Radius: vg.Points(9), Shape: barGlyph{}}
		case k.s.Dashed:
			dot.Shape, dot.Radius = thickRing{}, vg.Points(4.5)
		}
		if !k.s.Reference {
			marks(k.dots, dot, true)
		}
		marks(k.lower, draw.GlyphStyle{Color: c, Radius: vg.Points(6), Shape: thickTriangle{}}, len(k.dots) == 0)
		name := k.s.Name
		if len(k.xys) == 0 {
			name += " (no data)"
		}
		names = append(names, name)
		thumbs = append(thumbs, th)
	}
	withLegend(p, names, thumbs)
	setAxis(&p.X, x, xr, false)
	setAxis(&p.Y, y, yr, true)
	return p
}

// drawable says whether v can be drawn on an axis.
func drawable(v float64, log bool) bool {
	return !math.IsNaN(v) && !math.IsInf(v, 0) && (!log || v > 0)
}

// extent is the least and greatest of some values.
type extent struct{ lo, hi float64 }

func newExtent() extent         { return extent{math.Inf(1), math.Inf(-1)} }
func (e *extent) add(v float64) { e.lo, e.hi = min(e.lo, v), max(e.hi, v) }
func (e extent) empty() bool    { return e.lo > e.hi }

// setAxis sets a's scale, range and ticks as Axis describes; vertical
// is the y axis, whose linear range starts at zero.
func setAxis(a *gplot.Axis, spec Axis, e extent, vertical bool) {
	switch {
	case e.empty() && spec.Log:
		e = extent{1, 10}
	case e.empty():
		e = extent{0, 1}
	}
	if spec.Reverse {
		defer func() { a.Scale = gplot.InvertedScale{Normalizer: a.Scale} }()
	}
	if spec.Log {
		if e.lo == e.hi {
			e.lo, e.hi = e.lo/2, e.hi*2
		}
		a.Scale = gplot.LogScale{}
		a.Min, a.Max = e.lo, e.hi
		a.Tick.Marker = logTicks{bytes: spec.Bytes}
		return
	}
	if vertical {
		e.lo = min(e.lo, 0)
		e.hi += 0.1 * (e.hi - e.lo)
	}
	if e.lo == e.hi {
		e.lo, e.hi = e.lo-1, e.hi+1
	}
	a.Min, a.Max = e.lo, e.hi
	if len(spec.Ticks) > 0 {
		var ticks gplot.ConstantTicks
		for _, v := range spec.Ticks {
			ticks = append(ticks, gplot.Tick{Value: v, Label: strconv.FormatFloat(v, 'g', -1, 64)})
		}
		a.Tick.Marker = ticks
	}
	if spec.Bytes {
		a.Tick.Marker = gplot.TickerFunc(func(lo, hi float64) []gplot.Tick {
			ticks := gplot.DefaultTicks{}.Ticks(lo, hi)
			for i := range ticks {
				if ticks[i].Label != "" {
					ticks[i].Label = sizeLabel(ticks[i].Value)
				}
			}
			return ticks
		})
	}
}

// logTicks are the ticks of a logarithmic axis: at powers of ten, and
// also at 2 and 5 times them where fewer than three powers of ten fall
// in the range; with bytes, at powers of two instead, labelled every
// first, second, fifth or tenth power so that about eight are.
type logTicks struct{ bytes bool }

func (t logTicks) Ticks(lo, hi float64) []gplot.Tick {
	if lo <= 0 || hi <= 0 {
		return nil
	}
	var ticks []gplot.Tick
	if t.bytes {
		e0, e1 := int(math.Floor(math.Log2(lo))), int(math.Ceil(math.Log2(hi)))
		step := 1
		for _, s := range []int{1, 2, 5, 10} {
			step = s
			if (e1-e0)/s+1 <= 9 {
				break
			}
		}
		for e := e0; e <= e1; e++ {
			v := math.Ldexp(1, e)
			tk := gplot.Tick{Value: v}
			if e%step == 0 {
				tk.Label = sizeLabel(v)
			}
			ticks = append(ticks, tk)
		}
		return ticks
	}
	d0, d1 := int(math.Floor(math.Log10(lo))), int(math.Ceil(math.Log10(hi)))
	powers := 0
	for d := d0; d <= d1; d++ {
		if v := math.Pow10(d); v >= lo && v <= hi {
			powers++
		}
	}
	for d := d0; d <= d1; d++ {
		for m := 1; m < 10; m++ {
			v := float64(m) * math.Pow10(d)
			tk := gplot.Tick{Value: v}
			if m == 1 || powers < 3 && (m == 2 || m == 5) {
				tk.Label = strconv.FormatFloat(v, 'g', -1, 64)
			}
			ticks = append(ticks, tk)
		}
	}
	return ticks
}

// sizeLabel is a byte count as a tick gives it: "512 B", "64 KiB",
// "1.5 MiB".
func sizeLabel(b float64) string {
	units := []string{"B", "KiB", "MiB", "GiB", "TiB"}
	i := 0
	for math.Abs(b) >= 1024 && i < len(units)-1 {
		b /= 1024
		i++
	}
	return strconv.FormatFloat(b, 'g', 4, 64) + " " + units[i]
}

// multiThumb draws several thumbnails in one legend entry: a line with
// its mark.
type multiThumb []gplot.Thumbnailer

func (m multiThumb) Thumbnail(c *draw.Canvas) {
	for _, t := range m {
		t.Thumbnail(c)
	}
}

// thickRing is a hollow circle whose outline is a third of its radius
// wide: a reference point's mark, visible beside a line of its colour.
type thickRing struct{}

func (thickRing) DrawGlyph(c *draw.Canvas, sty draw.GlyphStyle, pt vg.Point) {
	c.SetLineStyle(draw.LineStyle{Color: sty.Color, Width: sty.Radius / 3})
	var p vg.Path
	r := sty.Radius * 5 / 6
	p.Move(vg.Point{X: pt.X + r, Y: pt.Y})
	p.Arc(pt, r, 0, 2*math.Pi)
	p.Close()
	c.Stroke(p)
}

// barGlyph is a short horizontal bar, two radii wide: a goal's mark.
type barGlyph struct{}

func (barGlyph) DrawGlyph(c *draw.Canvas, sty draw.GlyphStyle, pt vg.Point) {
	c.SetLineStyle(draw.LineStyle{Color: sty.Color, Width: vg.Points(3)})
	var p vg.Path
	p.Move(vg.Point{X: pt.X - sty.Radius, Y: pt.Y})
	p.Line(vg.Point{X: pt.X + sty.Radius, Y: pt.Y})
	c.Stroke(p)
}

// thickTriangle is a hollow upward triangle with a thick outline: a
// point that is only a lower bound.
type thickTriangle struct{}

func (thickTriangle) DrawGlyph(c *draw.Canvas, sty draw.GlyphStyle, pt vg.Point) {
	c.SetLineStyle(draw.LineStyle{Color: sty.Color, Width: sty.Radius / 3})
	r := sty.Radius
	var p vg.Path
	p.Move(vg.Point{X: pt.X, Y: pt.Y + r})
	p.Line(vg.Point{X: pt.X - r*0.866, Y: pt.Y - r/2})
	p.Line(vg.Point{X: pt.X + r*0.866, Y: pt.Y - r/2})
	p.Close()
	c.Stroke(p)
}

// Bar is one bar of a Bars figure.
type Bar struct {
	Name  string
	Value float64
	// Color is the bar's colour; nil for SeriesColor(0), blue.
	Color color.Color
}

// Bars draws a bar for each value, left to right in the order given,
// named under it and with its value written above it, over a linear
// axis from zero labelled yLabel. A value that is NaN, infinite or
// negative draws no bar; its name stays, with no value above.
func Bars(title, yLabel string, bars []Bar) *gplot.Plot {
	var top float64
	for _, b := range bars {
		if barDrawable(b.Value) {
			top = max(top, b.Value)
		}
	}
	if top == 0 {
		top = 1
	}
	if len(bars) == 0 {
		title += "\n(nothing to draw)"
	}
	p := newPlot(title, "", yLabel)
	p.Add(&plotter.Grid{Horizontal: plotter.DefaultGridLineStyle}, barPlotter(bars))
	p.X.Min, p.X.Max = -0.5, float64(max(len(bars), 1))-0.5
	p.Y.Min, p.Y.Max = 0, 1.15*top
	var ticks gplot.ConstantTicks
	for i, b := range bars {
		ticks = append(ticks, gplot.Tick{Value: float64(i), Label: b.Name})
	}
	p.X.Tick.Marker = ticks
	p.X.Tick.Length = 0
	return p
}

func barDrawable(v float64) bool { return !math.IsNaN(v) && !math.IsInf(v, 0) && v >= 0 }

// barWidth is a bar's width, as a fraction of the space of one.
const barWidth = 0.7

// barPlotter draws Bars' bars in data coordinates: bar i covers x from
// i-barWidth/2 to i+barWidth/2 and y from 0 to its value.
type barPlotter []Bar

func (bs barPlotter) Plot(c draw.Canvas, p *gplot.Plot) {
	trX, trY := p.Transforms(&c)
	font := p.Y.Tick.Label.Font
	font.Size = vg.Points(10)
	sty := p.Y.Tick.Label
	sty.Font = font
	sty.XAlign, sty.YAlign = draw.XCenter, draw.YBottom
	for i, b := range bs {
		if !barDrawable(b.Value) {
			continue
		}
		col := b.Color
		if col == nil {
			col = SeriesColor(0)
		}
		x0, x1 := trX(float64(i)-barWidth/2), trX(float64(i)+barWidth/2)
		y0, y1 := trY(0), trY(b.Value)
		c.FillPolygon(col, []vg.Point{{X: x0, Y: y0}, {X: x1, Y: y0}, {X: x1, Y: y1}, {X: x0, Y: y1}})
		c.FillText(sty, vg.Point{X: (x0 + x1) / 2, Y: y1 + vg.Points(3)}, strconv.FormatFloat(b.Value, 'g', 3, 64))
	}
}

// SaveBoth writes p as base.png and base.svg, widthPx by heightPx
// pixels (the SVG at DPI pixels an inch), through Save, and returns the
// paths written.
func SaveBoth(p *gplot.Plot, base string, widthPx, heightPx int) ([]string, error) {
	var paths []string
	for _, ext := range []string{".png", ".svg"} {
		path := base + ext
		if err := Save(p, path, Pixels(widthPx), Pixels(heightPx)); err != nil {
			return paths, err
		}
		paths = append(paths, path)
	}
	return paths, nil
}
