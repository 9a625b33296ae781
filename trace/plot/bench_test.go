package plot

import (
	"bytes"
	"image/color"
	"math"
	"os"
	"path/filepath"
	"slices"
	"testing"

	gplot "gonum.org/v1/plot"
	"gonum.org/v1/plot/vg"
)

// The series colours SeriesColor documents after blue and orange
// (wantCPU, wantDev0), written out here.
var (
	wantGreen = color.RGBA{R: 44, G: 160, B: 44, A: 255}
	wantRed   = color.RGBA{R: 214, G: 39, B: 40, A: 255}
)

// at is the pixel of the fractions (fx, fy) of the way across the data
// area from its left and bottom edges: positions worked out here from
// the axis ranges Lines documents, not from the figure's transforms.
func (f *figure) at(fx, fy float64) (x, y int) {
	d := f.data
	return f.px(d.Min.X + vg.Length(fx)*(d.Max.X-d.Min.X)), f.py(d.Min.Y + vg.Length(fy)*(d.Max.Y-d.Min.Y))
}

// around counts the pixels of colour c (opacity at least minA) within r
// pixels of (x, y).
func (f *figure) around(c color.RGBA, minA float64, x, y, r int) int {
	n, _ := f.count(c, minA, x-r, x+r+1, y-r, y+r+1)
	return n
}

func TestLinesDrawsEachSeriesWhereItsPointsAre(t *testing.T) {
	// A log x axis from 1 to 1000 (the data's extent: three decades) and
	// a linear y axis from 0 to 33 (a tenth above the greatest value).
	// Blue lies along y = 10 and orange along y = 30 across the whole
	// width; red along y = 5 from x = 10 to 100 only, which on a log axis
	// is the middle third of the width; green is one point, at x = 10^1.5
	// (the middle) and y = 20.
	series := []Series{
		{Name: "blue", X: []float64{1, 1000}, Y: []float64{10, 10}},
		{Name: "orange", X: []float64{1, 1000}, Y: []float64{30, 30}},
		{Name: "green, one point", X: []float64{math.Pow(10, 1.5)}, Y: []float64{20}, Dashed: true},
		{Name: "red", X: []float64{10, 100}, Y: []float64{5, 5}},
		{Name: "drawn nowhere", X: []float64{0, -1}, Y: []float64{math.NaN(), 3}}, // not on a log axis, and NaN
	}
	p := Lines("lines", Axis{Label: "x", Log: true}, Axis{Label: "y"}, series)
	f := render(t, p, "lines", 1200, 800)
	fx := func(x float64) float64 { return math.Log10(x) / 3 }
	fy := func(y float64) float64 { return y / 33 }

	for _, x := range []float64{1.5, 4, 31.6, 250, 700} {
		bx, by := f.at(fx(x), fy(10))
		ox, oy := f.at(fx(x), fy(30))
		if n := f.around(wantCPU, 0.5, bx, by, 3); n < 3 {
			t.Errorf("x %v: %d blue pixels around (%d, %d), want its line at y = 10", x, n, bx, by)
		}
		if n := f.around(wantDev0, 0.2, bx, by, 3); n > 0 {
			t.Errorf("x %v: %d orange pixels on the blue line", x, n)
		}
		if n := f.around(wantDev0, 0.5, ox, oy, 3); n < 3 {
			t.Errorf("x %v: %d orange pixels around (%d, %d), want its line at y = 30", x, n, ox, oy)
		}
		if n := f.around(wantCPU, 0.2, ox, oy, 3); n > 0 {
			t.Errorf("x %v: %d blue pixels on the orange line", x, n)
		}
	}
	// Red: in the middle third of the width, not in the outer thirds.
	for _, c := range []struct {
		x    float64
		want bool
	}{{13, true}, {31.6, true}, {80, true}, {3, false}, {6, false}, {170, false}, {500, false}} {
		x, y := f.at(fx(c.x), fy(5))
		n := f.around(wantRed, 0.3, x, y, 4)
		if c.want && n < 3 || !c.want && n > 0 {
			t.Errorf("x %v: %d red pixels around (%d, %d); want the red line there: %v", c.x, n, x, y, c.want)
		}
	}
	// Green: its mark at the middle of the width, a hollow ring of about
	// 10 pixels across, and no line from it.
	gx, gy := f.at(0.5, fy(20))
	if n := f.around(wantGreen, 0.5, gx, gy, 8); n < 10 {
		t.Errorf("%d green pixels around (%d, %d), want the point's mark", n, gx, gy)
	}
	for _, x := range []float64{3, 300} {
		x, y := f.at(fx(x), fy(20))
		if n := f.around(wantGreen, 0.2, x, y, 20); n > 0 {
			t.Errorf("%d green pixels around (%d, %d): a series of one point has no line", n, x, y)
		}
	}
	// Nothing drawn where no series is: between y = 12 and 18.
	x0, y0 := f.at(0.05, fy(18))
	x1, y1 := f.at(0.95, fy(12))
	for _, c := range []color.RGBA{wantCPU, wantDev0, wantGreen, wantRed} {
		if n, _ := f.count(c, 0.2, x0, x1, y0, y1); n > 0 {
			t.Errorf("%d pixels of %v between y = 12 and 18", n, c)
		}
	}
	// The legend names every series, the one with nothing to draw
	// saying so.
	var svg bytes.Buffer
	if err := Render(&svg, p, "svg", Pixels(1200), Pixels(800)); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{">blue<", ">orange<", ">green, one point<", ">red<", ">drawn nowhere (no data)<"} {
		if !bytes.Contains(svg.Bytes(), []byte(name)) {
			t.Errorf("the figure has no text %s", name)
		}
	}
}

func TestLinesLogYAndByteTicks(t *testing.T) {
	// A log y axis from 10 to 1000: y = 100 lies at mid-height.
	series := []Series{
		{Name: "low", X: []float64{4 << 10, 64 << 20}, Y: []float64{10, 10}},
		{Name: "middle", X: []float64{4 << 10, 64 << 20}, Y: []float64{100, 100}},
		{Name: "high", X: []float64{4 << 10, 64 << 20}, Y: []float64{1000, 1000}},
	}
	p := Lines("log y", Axis{Label: "bytes", Log: true, Bytes: true}, Axis{Label: "µs", Log: true}, series)
	f := render(t, p, "lines-logy", 800, 600)
	x, y := f.at(0.5, 0.5)
	if n := f.around(wantDev0, 0.5, x, y, 3); n < 3 {
		t.Errorf("%d orange pixels around (%d, %d), want the middle series at mid-height", n, x, y)
	}
	for _, fy := range []float64{0.25, 0.75} {
		x, y := f.at(0.5, fy)
		if n := f.around(wantDev0, 0.2, x, y, 20); n > 0 {
			t.Errorf("%d orange pixels around (%d, %d), a quarter of the height off its line", n, x, y)
		}
	}
	// Ticks at every power of two from 4 KiB to 64 MiB (2^12..2^26),
	// every second labelled: 8 labels.
	var labels []string
	ticks := p.X.Tick.Marker.Ticks(p.X.Min, p.X.Max)
	for _, tk := range ticks {
		if tk.Label != "" {
			labels = append(labels, tk.Label)
		}
	}
	want := []string{"4 KiB", "16 KiB", "64 KiB", "256 KiB", "1 MiB", "4 MiB", "16 MiB", "64 MiB"}
	if len(ticks) != 15 || !slices.Equal(labels, want) {
		t.Errorf("%d ticks labelled %q, want 15 labelled %q", len(ticks), labels, want)
	}
}

func TestBarsDrawEachValue(t *testing.T) {
	// Three bars over a linear axis from 0 to 1.15 times the greatest
	// (40: 46); bar i is centred at (i+0.5)/3 of the width.
	bars := []Bar{{Name: "ten", Value: 10}, {Name: "forty", Value: 40, Color: wantDev0}, {Name: "twenty", Value: 20, Color: wantGreen}}
	p := Bars("bars", "µs", bars)
	f := render(t, p, "bars", 900, 600)
	for i, c := range []struct {
		v   float64
		col color.RGBA
	}{{10, wantCPU}, {40, wantDev0}, {20, wantGreen}} {
		cx := (float64(i) + 0.5) / 3
		x, y := f.at(cx, c.v/46/2) // halfway up the bar
		if n := f.around(c.col, 0.9, x, y, 5); n < 100 {
			t.Errorf("bar %d: %d pixels of its colour around (%d, %d), want it filled", i, n, x, y)
		}
		x, y = f.at(cx, (c.v+3)/46) // above it
		if n := f.around(c.col, 0.2, x, y, 5); n > 0 {
			t.Errorf("bar %d: %d pixels of its colour above its value", i, n)
		}
	}
}

func TestSaveBothWritesPNGAndSVG(t *testing.T) {
	p := Lines("save", Axis{Label: "x"}, Axis{Label: "y"}, []Series{{Name: "a", X: []float64{1, 2}, Y: []float64{1, 2}}})
	base := filepath.Join(t.TempDir(), "fig")
	paths, err := SaveBoth(p, base, 640, 480)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(paths, []string{base + ".png", base + ".svg"}) {
		t.Fatalf("wrote %q", paths)
	}
	decodePNG(t, base+".png", 640, 480)
	svg, err := os.ReadFile(base + ".svg")
	if err != nil || !bytes.Contains(svg, []byte(`width="480pt" height="360pt"`)) { // 640 x 480 pixels at 96 an inch
		t.Fatalf("SVG: %v %.300q", err, svg)
	}
	if _, err := SaveBoth(p, filepath.Join(t.TempDir(), "no", "such", "dir", "fig"), 640, 480); err == nil {
		t.Fatal("SaveBoth into a missing directory: no error")
	}
}

func TestLinesReversedAxisGoalsAndLowerBounds(t *testing.T) {
	// A reversed linear x axis from 100 (left) to 20 (right), ticked at
	// the values given; a log y axis from 1 to 100. Blue lies along
	// y = 10; orange is one lower bound at (80, 40), a hollow triangle;
	// the goal is one bar at (40, 3); the reference a dotted level at 1.
	series := []Series{
		{Name: "blue", X: []float64{100, 20}, Y: []float64{10, 10}},
		{Name: "orange, a lower bound", X: []float64{80}, Y: []float64{40}, AtLeast: []bool{true}},
		{Name: "goal", X: []float64{40}, Y: []float64{3}, Goal: true},
		{Name: "level", X: []float64{100, 20}, Y: []float64{1, 1}, Reference: true},
		{Name: "top", X: []float64{100}, Y: []float64{100}, Color: wantGreen},
	}
	p := Lines("reversed", Axis{Label: "budget", Reverse: true, Ticks: []float64{100, 80, 40, 20}}, Axis{Label: "ratio", Log: true}, series)
	f := render(t, p, "lines-reversed", 1000, 700)
	fx := func(x float64) float64 { return (100 - x) / 80 } // 100 on the left
	fy := func(y float64) float64 { return math.Log10(y) / 2 }

	// The orange triangle: its outline around (80, 40), its middle
	// hollow; nothing orange where 80 would be on a forward axis.
	x, y := f.at(fx(80), fy(40))
	if n := f.around(wantDev0, 0.5, x, y, 9); n < 15 {
		t.Errorf("%d orange pixels around (%d, %d), want the triangle at x = 80 (left of the middle)", n, x, y)
	}
	if n := f.around(wantDev0, 0.3, x, y, 1); n > 0 {
		t.Errorf("%d orange pixels at the triangle's middle: want it hollow", n)
	}
	if rx, ry := f.at(1-fx(80), fy(40)); f.around(wantDev0, 0.2, rx, ry, 9) > 0 {
		t.Errorf("orange at x = 80 of a forward axis: the axis is not reversed")
	}
	// The goal: a horizontal bar, grey, wider than high, at (40, 3).
	x, y = f.at(fx(40), fy(3))
	grey := color.RGBA{R: 64, G: 64, B: 64, A: 255}
	wide, _ := f.count(grey, 0.8, x-10, x+11, y-1, y+2)
	high, _ := f.count(grey, 0.8, x-1, x+2, y-10, y+11)
	if wide < 30 || high > 12 {
		t.Errorf("goal at (%d, %d): %d grey pixels across, %d up and down: want a horizontal bar", x, y, wide, high)
	}
	// The level at 1: dotted grey along the bottom, with no marks.
	lx, ly := f.at(0.5, 0)
	if n, _ := f.count(grey, 0.3, lx-40, lx+40, ly-2, ly+3); n < 10 || n > 80*5/2 {
		t.Errorf("%d grey pixels along y = 1 around x %d: want a dotted line", n, lx)
	}
	// The blue line at 10 across the width.
	for _, v := range []float64{90, 60, 30} {
		x, y := f.at(fx(v), fy(10))
		if n := f.around(wantCPU, 0.5, x, y, 3); n < 3 {
			t.Errorf("x %v: %d blue pixels at (%d, %d)", v, n, x, y)
		}
	}
	var values []float64
	for _, tk := range p.X.Tick.Marker.Ticks(p.X.Min, p.X.Max) {
		values = append(values, tk.Value)
	}
	if !slices.Equal(values, []float64{100, 80, 40, 20}) {
		t.Errorf("x ticks at %v, want the values given", values)
	}
}

func TestSaveColumnStacksThePanels(t *testing.T) {
	// Two panels, blue above orange: each colour in its half only, and
	// the gap between them white.
	top := Lines("top", Axis{Label: "x"}, Axis{Label: "y"}, []Series{{Name: "blue", X: []float64{0, 1}, Y: []float64{1, 1}}})
	bottom := Lines("bottom", Axis{Label: "x"}, Axis{Label: "y"}, []Series{{Name: "orange", X: []float64{0, 1}, Y: []float64{1, 1}, Color: wantDev0}})
	path := filepath.Join(t.TempDir(), "column.png")
	if err := SaveColumn([]*gplot.Plot{top, bottom}, path, Pixels(800), Pixels(1000)); err != nil {
		t.Fatal(err)
	}
	img, _ := decodePNG(t, path, 800, 1000)
	f := &figure{img: img, h: 1000}
	blueTop, _ := f.count(wantCPU, 0.6, 0, 800, 0, 500)
	blueBottom, _ := f.count(wantCPU, 0.6, 0, 800, 500, 1000)
	orangeTop, _ := f.count(wantDev0, 0.6, 0, 800, 0, 500)
	orangeBottom, _ := f.count(wantDev0, 0.6, 0, 800, 500, 1000)
	if blueTop < 500 || blueBottom > 0 || orangeBottom < 500 || orangeTop > 0 {
		t.Errorf("blue %d above, %d below; orange %d above, %d below: want blue above only, orange below only", blueTop, blueBottom, orangeTop, orangeBottom)
	}
	if n := f.white(0, 800, 0, 1000); n < 800*1000/2 {
		t.Errorf("%d white pixels of 800000: the background is not white", n)
	}
	if err := SaveColumn(nil, path, Pixels(800), Pixels(1000)); err == nil {
		t.Error("SaveColumn of no plots: no error")
	}
}
