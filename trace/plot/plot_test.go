package plot

import (
	"bytes"
	"image"
	"image/color"
	"image/png"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	gplot "gonum.org/v1/plot"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"

	"github.com/softuvm/softuvm/trace"
)

// The colours the package documents, written out here rather than taken
// from Color, so that a figure drawn in the wrong colours fails.
var (
	wantCPU  = color.RGBA{R: 31, G: 119, B: 180, A: 255}
	wantDev0 = color.RGBA{R: 255, G: 127, B: 14, A: 255}
)

// The synthetic trace. It lasts traceLen (a session end marks the end);
// its address space is two allocations of allocLen far apart, lowAlloc
// then highAlloc. The cpu faults only in the first half of the time and
// only in the low allocation, device 0 only in the second half and only
// in the high one. Device 0 gives pages back to the cpu (back to back,
// copies of toCPUBytes lasting a millisecond each, in the low
// allocation) only in toCPUWindow; the cpu sends pages to device 0 (of
// toDevBytes) only in toDevWindow, in the high allocation. CPU faults
// take cpuService, device 0's devService.
const (
	traceLen   = time.Second
	lowAlloc   = uint64(0x7f00_0000_0000)
	highAlloc  = uint64(0x7f80_0000_0000)
	allocLen   = 64 << 20
	nFaults    = 40000
	toCPUBytes = 2 << 20
	toDevBytes = 1 << 20
	copyTime   = time.Millisecond
)

var (
	toCPUWindow = [2]time.Duration{100 * time.Millisecond, 200 * time.Millisecond}
	toDevWindow = [2]time.Duration{600 * time.Millisecond, 700 * time.Millisecond}
	cpuService  = [2]time.Duration{8 * time.Microsecond, 12 * time.Microsecond}
	devService  = [2]time.Duration{150 * time.Microsecond, 250 * time.Microsecond}
)

// synthetic records the trace described above through a Recorder and
// reads it back, so that the figures see what a real trace gives.
func synthetic(t *testing.T) (trace.Header, []trace.Event) {
	t.Helper()
	rng := rand.New(rand.NewPCG(1, 2))
	var evs []trace.Event
	evs = append(evs,
		trace.Event{Kind: trace.KindAlloc, Time: time.Microsecond, Range: 1, Addr: lowAlloc, Bytes: allocLen},
		trace.Event{Kind: trace.KindAlloc, Time: time.Microsecond, Range: 2, Addr: highAlloc, Bytes: allocLen})
	between := func(lo, hi time.Duration) time.Duration { return lo + time.Duration(rng.Int64N(int64(hi-lo))) }
	page := func(base uint64) uint64 { return base + uint64(rng.IntN(allocLen/trace.PageSize))*trace.PageSize }
	// Faults end a few milliseconds short of the end, so that their
	// service times do not stretch the trace past traceLen.
	for range nFaults {
		evs = append(evs, trace.Event{Kind: trace.KindFault, Processor: trace.CPU, Range: 1,
			Time: between(time.Microsecond, traceLen/2), Addr: page(lowAlloc), Duration: between(cpuService[0], cpuService[1])})
		evs = append(evs, trace.Event{Kind: trace.KindFault, Processor: 0, Range: 2,
			Time: between(traceLen/2, traceLen-5*time.Millisecond), Addr: page(highAlloc), Duration: between(devService[0], devService[1])})
	}
	migrate := func(w [2]time.Duration, from, to int32, base uint64, bytes int) {
		for i, at := 0, w[0]; at < w[1]; i, at = i+1, at+copyTime {
			addr := base + uint64(i*bytes)%allocLen
			evs = append(evs, trace.Event{Kind: trace.KindMigration, Time: at, From: from, To: to, Cause: trace.CauseFault,
				Addr: addr, Pages: uint32(bytes / trace.PageSize), Duration: copyTime})
		}
	}
	migrate(toCPUWindow, 0, trace.CPU, lowAlloc, toCPUBytes)
	migrate(toDevWindow, trace.CPU, 0, highAlloc, toDevBytes)
	evs = append(evs, trace.Event{Kind: trace.KindSessionEnd, Time: traceLen, PID: 1})

	path := filepath.Join(t.TempDir(), "synthetic.uvmtrace")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	r, err := trace.NewRecorder(f, trace.Header{Devices: 1})
	if err != nil {
		t.Fatal(err)
	}
	for i := range evs {
		r.Emit(&evs[i])
	}
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	h, got, err := trace.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(evs) {
		t.Fatalf("read back %d events, wrote %d", len(got), len(evs))
	}
	return h, got
}

// figure is a figure drawn as a PNG and decoded again, with what is
// needed to find data coordinates in it.
type figure struct {
	p    *gplot.Plot
	img  image.Image
	h    int // pixels
	trX  func(float64) vg.Length
	trY  func(float64) vg.Length
	data draw.Canvas // the data area, in points
}

// render saves p as a PNG of w x h pixels through Save, decodes it, and
// checks that it is that size and not blank. The data area is located
// the way gonum locates it when it draws: p.DataCanvas of a canvas of
// the same size (it accounts for the title, the axes, the legend's
// margin and the padding around lines); p.Transforms of it maps data
// coordinates to points, and a point (x, y) is the pixel (x, h-y) at
// DPI dots an inch, since images count rows from the top.
func render(t *testing.T, p *gplot.Plot, name string, w, h int) *figure {
	t.Helper()
	path := filepath.Join(t.TempDir(), name+".png")
	if err := Save(p, path, Pixels(w), Pixels(h)); err != nil {
		t.Fatal(err)
	}
	img, raw := decodePNG(t, path, w, h)
	colours := map[color.RGBA]bool{}
	for y := 0; y < h; y += 3 {
		for x := 0; x < w; x += 3 {
			colours[rgba(img.At(x, y))] = true
		}
	}
	if len(colours) < 10 {
		t.Fatalf("%s: only %d colours: blank?", name, len(colours))
	}
	if os.Getenv("PLOT_TEST_KEEP") != "" { // to look at them: PLOT_TEST_KEEP=dir
		os.WriteFile(filepath.Join(os.Getenv("PLOT_TEST_KEEP"), name+".png"), raw, 0o644)
	}
	c := draw.New(vgimg.New(Pixels(w), Pixels(h)))
	f := &figure{p: p, img: img, h: h, data: p.DataCanvas(c)}
	f.trX, f.trY = p.Transforms(&f.data)
	if w >= 600 && (f.data.Max.X-f.data.Min.X < Pixels(w)/2 || f.data.Max.Y-f.data.Min.Y < Pixels(h)/2) {
		t.Fatalf("%s: data area %v is under half the figure", name, f.data.Rectangle)
	}
	return f
}

// decodePNG reads and decodes the PNG file path, and checks that it is w
// x h pixels.
func decodePNG(t *testing.T, path string, w, h int) (img image.Image, raw []byte) {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	img, err = png.Decode(bytes.NewReader(raw))
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	if b := img.Bounds(); b.Dx() != w || b.Dy() != h {
		t.Fatalf("%s: image is %d x %d pixels, want %d x %d", path, b.Dx(), b.Dy(), w, h)
	}
	return img, raw
}

func rgba(c color.Color) color.RGBA {
	r, g, b, a := c.RGBA()
	return color.RGBA{R: uint8(r >> 8), G: uint8(g >> 8), B: uint8(b >> 8), A: uint8(a >> 8)}
}

func (f *figure) px(x vg.Length) int { return int(math.Round(x.Dots(DPI))) }
func (f *figure) py(y vg.Length) int { return f.h - int(math.Round(y.Dots(DPI))) }

// col and row are the pixel column and row of data coordinates.
func (f *figure) col(x float64) int { return f.px(f.trX(x)) }
func (f *figure) row(y float64) int { return f.py(f.trY(y)) }

// shade says what a pixel is a tint of: base drawn with opacity a over
// white. ok is false for white-ish pixels, and for colours that are no
// tint of base (black text, another processor's colour).
func shade(p, base color.RGBA) (a float64, ok bool) {
	d := [3]float64{255 - float64(p.R), 255 - float64(p.G), 255 - float64(p.B)}
	b := [3]float64{255 - float64(base.R), 255 - float64(base.G), 255 - float64(base.B)}
	var num, den float64
	for i := range d {
		num += d[i] * b[i]
		den += b[i] * b[i]
	}
	a = num / den
	var res float64
	for i := range d {
		res += (d[i] - a*b[i]) * (d[i] - a*b[i])
	}
	return a, a > 0.15 && a < 1.1 && math.Sqrt(res/3) < 14
}

// count is the pixels in the rectangle of columns [x0, x1) and rows
// [y0, y1) that are a tint of base with opacity at least minA, and the
// mean row of those.
func (f *figure) count(base color.RGBA, minA float64, x0, x1, y0, y1 int) (n int, meanRow float64) {
	var sum int
	for y := y0; y < y1; y++ {
		for x := x0; x < x1; x++ {
			if a, ok := shade(rgba(f.img.At(x, y)), base); ok && a >= minA {
				n++
				sum += y
			}
		}
	}
	if n > 0 {
		meanRow = float64(sum) / float64(n)
	}
	return n, meanRow
}

func (f *figure) white(x0, x1, y0, y1 int) int {
	n := 0
	for y := y0; y < y1; y++ {
		for x := x0; x < x1; x++ {
			c := rgba(f.img.At(x, y))
			if c.R >= 250 && c.G >= 250 && c.B >= 250 {
				n++
			}
		}
	}
	return n
}

func TestHeatmapPutsEachProcessorWhereItFaulted(t *testing.T) {
	h, evs := synthetic(t)
	p := Heatmap(h, evs)
	// The axes are known from the trace alone: a second is 1000 ms; two
	// allocations of 64 MiB side by side are 128 MiB, however far apart
	// their addresses.
	if !strings.Contains(p.X.Label.Text, "(ms)") || p.X.Min != 0 || p.X.Max != 1000 {
		t.Fatalf("x axis %q %v..%v, want ms 0..1000", p.X.Label.Text, p.X.Min, p.X.Max)
	}
	if p.Y.Label.Text != "offset in managed memory (MiB)" || p.Y.Min != 0 || p.Y.Max != 128 {
		t.Fatalf("y axis %q %v..%v, want offset in managed memory (MiB) 0..128", p.Y.Label.Text, p.Y.Min, p.Y.Max)
	}
	f := render(t, p, "heatmap", 1200, 800)

	// Regions well inside each quadrant of the data (a tenth of the
	// data's range from each edge and from the middle), in pixels.
	region := func(t0, t1, mib0, mib1 float64) (x0, x1, y0, y1 int) {
		return f.col(t0), f.col(t1), f.row(mib1), f.row(mib0)
	}
	type quadrant struct {
		name                 string
		t0, t1, mib0, mib1   float64
		cpu, dev0, minFilled float64 // least fractions of the region's pixels
		maxFilled            float64
	}
	for _, q := range []quadrant{
		{name: "cpu's (first half, low allocation)", t0: 50, t1: 450, mib0: 6.4, mib1: 57.6, cpu: 0.9, minFilled: 0.9, maxFilled: 1},
		{name: "device 0's (second half, high allocation)", t0: 550, t1: 950, mib0: 70.4, mib1: 121.6, dev0: 0.9, minFilled: 0.9, maxFilled: 1},
		{name: "empty (first half, high allocation)", t0: 50, t1: 450, mib0: 70.4, mib1: 121.6, maxFilled: 0.02},
		{name: "empty (second half, low allocation)", t0: 550, t1: 950, mib0: 6.4, mib1: 57.6, maxFilled: 0.02},
	} {
		x0, x1, y0, y1 := region(q.t0, q.t1, q.mib0, q.mib1)
		all := float64((x1 - x0) * (y1 - y0))
		if all < 10000 {
			t.Fatalf("%s region %d..%d x %d..%d: too small to judge", q.name, x0, x1, y0, y1)
		}
		cpu, _ := f.count(wantCPU, 0.2, x0, x1, y0, y1)
		dev0, _ := f.count(wantDev0, 0.2, x0, x1, y0, y1)
		filled := 1 - float64(f.white(x0, x1, y0, y1))/all
		t.Logf("%s: pixels %d..%d x %d..%d: cpu %.3f, device 0 %.3f, not white %.3f", q.name, x0, x1, y0, y1, float64(cpu)/all, float64(dev0)/all, filled)
		if float64(cpu)/all < q.cpu || float64(dev0)/all < q.dev0 {
			t.Errorf("%s: cpu colour %.3f (want >= %.2f), device 0 colour %.3f (want >= %.2f)", q.name, float64(cpu)/all, q.cpu, float64(dev0)/all, q.dev0)
		}
		if q.cpu == 0 && float64(cpu)/all > 0.01 || q.dev0 == 0 && float64(dev0)/all > 0.01 {
			t.Errorf("%s: cpu colour %.3f, device 0 colour %.3f: want none of the one that did not fault there", q.name, float64(cpu)/all, float64(dev0)/all)
		}
		if filled < q.minFilled || filled > q.maxFilled {
			t.Errorf("%s: %.3f of it is not white, want %.2f..%.2f", q.name, filled, q.minFilled, q.maxFilled)
		}
	}
}

func TestHeatmapWithoutAllocationsUsesTheBlocksFaultsLieIn(t *testing.T) {
	// Two faults a gigabyte apart and no allocation: each brings its
	// 2 MiB block, so the axis is 4 MiB, not a gigabyte of nothing.
	evs := []trace.Event{
		{Kind: trace.KindFault, Time: time.Millisecond, Processor: trace.CPU, Addr: 0x7f00_0010_0000},
		{Kind: trace.KindFault, Time: 2 * time.Millisecond, Processor: 0, Addr: 0x7f00_0010_0000 + 1<<30},
	}
	p := Heatmap(trace.Header{}, evs)
	if p.Y.Min != 0 || p.Y.Max != 4 {
		t.Fatalf("y axis %v..%v MiB, want 0..4", p.Y.Min, p.Y.Max)
	}
	render(t, p, "heatmap-noalloc", 400, 300)
}

func TestBandwidthShowsEachDirectionInItsWindowAtItsRate(t *testing.T) {
	h, evs := synthetic(t)
	p := Bandwidth(h, evs)
	if !strings.Contains(p.Title.Text, "bin: 5 ms") || p.X.Min != 0 || p.X.Max != 1000 {
		t.Fatalf("title %q, x axis %v..%v: want 5 ms bins over 0..1000 ms", p.Title.Text, p.X.Min, p.X.Max)
	}
	f := render(t, p, "bandwidth", 1200, 800)

	// Back-to-back copies of b bytes a millisecond each move b bytes a
	// millisecond: in GB/s, b*1000/1e9.
	rateToCPU := float64(toCPUBytes) * 1000 / 1e9
	rateToDev := float64(toDevBytes) * 1000 / 1e9
	// Above the axis only: a direction with nothing moving draws its
	// line along y = 0.
	base := f.row(0) - 5
	top := f.py(f.data.Max.Y)
	ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
	inner := func(w [2]time.Duration) (int, int) { // the window less its edge bins
		return f.col(ms(w[0]) + 10), f.col(ms(w[1]) - 10)
	}
	check := func(what string, x0, x1 int, line color.RGBA, rate float64, other color.RGBA) {
		t.Helper()
		n, mean := f.count(line, 0.4, x0, x1, top, base)
		if n < (x1-x0)/3 {
			t.Errorf("%s: %d pixels of the line's colour in columns %d..%d, want a line across them", what, n, x0, x1)
		}
		if want := float64(f.row(rate)); math.Abs(mean-want) > 3 {
			t.Errorf("%s: the line lies at row %.1f, want %.0f (%.3f GB/s)", what, mean, want, rate)
		}
		if m, _ := f.count(other, 0.2, x0, x1, top, base); m > 0 {
			t.Errorf("%s: %d pixels of the other direction's colour above the axis", what, m)
		}
	}
	x0, x1 := inner(toCPUWindow)
	check("device 0 -> cpu (blue) in its window", x0, x1, wantCPU, rateToCPU, wantDev0)
	x0, x1 = inner(toDevWindow)
	check("cpu -> device 0 (orange) in its window", x0, x1, wantDev0, rateToDev, wantCPU)
	for _, quiet := range [][2]float64{{250, 550}, {750, 990}, {10, 90}} {
		x0, x1 := f.col(quiet[0]), f.col(quiet[1])
		for _, c := range []color.RGBA{wantCPU, wantDev0} {
			if n, _ := f.count(c, 0.2, x0, x1, top, base); n > 0 {
				t.Errorf("%v..%v ms, no migrations: %d pixels of %v above the axis", quiet[0], quiet[1], n, c)
			}
		}
	}
}

func TestServiceTimesHistogramsEachProcessor(t *testing.T) {
	h, evs := synthetic(t)
	p := ServiceTimes(h, evs)
	// 8 µs to 250 µs: the decades from 1 µs to 1000 µs.
	if p.X.Min != 1 || math.Abs(p.X.Max-1000) > 1e-9 {
		t.Fatalf("x axis %v..%v µs, want 1..1000", p.X.Min, p.X.Max)
	}
	f := render(t, p, "service", 1200, 800)

	// The histogram, counted here: bins of a tenth of a decade from
	// 1 µs, so bin k is [10^(k/10), 10^((k+1)/10)) µs.
	counts := map[int32]map[int]float64{trace.CPU: {}, 0: {}}
	for _, e := range evs {
		if e.Kind == trace.KindFault {
			counts[e.Processor][int(math.Floor(10*math.Log10(float64(e.Duration)/1e3)))]++
		}
	}
	// Each processor's outline crosses the middle of a bin it fills at
	// the bin's count, and the other's colour is nowhere above the axis
	// there.
	base := f.row(0) - 5
	top := f.py(f.data.Max.Y)
	for _, c := range []struct {
		name        string
		proc        int32
		us          float64
		line, other color.RGBA
	}{
		{"cpu at 9 µs", trace.CPU, 9, wantCPU, wantDev0},
		{"cpu at 11 µs", trace.CPU, 11, wantCPU, wantDev0},
		{"device 0 at 180 µs", 0, 180, wantDev0, wantCPU},
		{"device 0 at 225 µs", 0, 225, wantDev0, wantCPU},
	} {
		k := int(math.Floor(10 * math.Log10(c.us)))
		lo, hi := math.Pow(10, float64(k)/10), math.Pow(10, float64(k+1)/10)
		mid := math.Sqrt(lo * hi)
		x0, x1 := f.col(mid)-4, f.col(mid)+4
		n, mean := f.count(c.line, 0.6, x0, x1, top, base)
		want := f.row(counts[c.proc][k])
		t.Logf("%s: bin %d (%.3g..%.3g µs) has %v faults: row %d; %d pixels of the colour, mean row %.1f", c.name, k, lo, hi, counts[c.proc][k], want, n, mean)
		if n < 4 || math.Abs(mean-float64(want)) > 3 {
			t.Errorf("%s: %d pixels of the outline's colour at mean row %.1f, want a line at row %d (%v faults)", c.name, n, mean, want, counts[c.proc][k])
		}
		if m, _ := f.count(c.other, 0.2, x0, x1, top, base); m > 0 {
			t.Errorf("%s: %d pixels of the other processor's colour", c.name, m)
		}
	}
}

func TestFiguresOfATraceWithNothingToDraw(t *testing.T) {
	for _, evs := range [][]trace.Event{nil, {{Kind: trace.KindSession, Time: time.Second, PID: 1, Name: "x"}}} {
		for name, fig := range map[string]func(trace.Header, []trace.Event) *gplot.Plot{
			"heatmap": Heatmap, "bandwidth": Bandwidth, "service": ServiceTimes,
		} {
			p := fig(trace.Header{}, evs)
			if !strings.Contains(p.Title.Text, "(no ") {
				t.Errorf("%s of %d events: title %q says nothing of the missing data", name, len(evs), p.Title.Text)
			}
			var buf bytes.Buffer
			if err := Render(&buf, p, "svg", Pixels(300), Pixels(200)); err != nil || !bytes.Contains(buf.Bytes(), []byte("<svg")) {
				t.Errorf("%s as SVG: %v", name, err)
			}
			render(t, p, name+"-empty", 300, 200)
		}
	}
}

func TestSaveSizesAndFormats(t *testing.T) {
	p := Bandwidth(trace.Header{}, []trace.Event{{Kind: trace.KindMigration, Time: time.Millisecond, From: -1, To: 1, Pages: 1}})
	for _, sz := range [][2]int{{1200, 800}, {333, 217}, {97, 61}} {
		render(t, p, "size", sz[0], sz[1])
	}
	dir := t.TempDir()
	if err := Save(p, filepath.Join(dir, "f.svg"), Pixels(300), Pixels(200)); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "f.svg")); !bytes.Contains(b, []byte("<svg")) {
		t.Fatalf("f.svg is no SVG: %.100q", b)
	}
	bad := filepath.Join(dir, "f.bmp")
	if err := Save(p, bad, Pixels(300), Pixels(200)); err == nil || !strings.Contains(err.Error(), `"bmp"`) {
		t.Fatalf("Save .bmp: %v, want an error naming the format", err)
	}
	if _, err := os.Stat(bad); !os.IsNotExist(err) {
		t.Fatalf("Save .bmp left a file: %v", err)
	}
	if err := Save(p, filepath.Join(dir, "f.png"), 0, Pixels(200)); err == nil {
		t.Fatal("Save at zero width: no error")
	}
}

func TestBinWidthGivesAHundredOrSoBins(t *testing.T) {
	for _, c := range []struct{ d, want time.Duration }{
		{time.Second, 5 * time.Millisecond},
		{10 * time.Second, 50 * time.Millisecond},
		{3 * time.Millisecond, 20 * time.Microsecond},
		{time.Minute, 250 * time.Millisecond},
		{100, 1},
	} {
		if got := BinWidth(c.d); got != c.want {
			t.Errorf("BinWidth(%v) = %v, want %v", c.d, got, c.want)
		}
	}
	for d := 10 * time.Microsecond; d < time.Hour; d = d*3/2 + 7 {
		w := BinWidth(d)
		if n := (d + w - 1) / w; n < 100 || n > 250 {
			t.Errorf("BinWidth(%v) = %v: %d bins", d, w, n)
		}
	}
}

func TestColorPalette(t *testing.T) {
	if Color(trace.CPU) != wantCPU || Color(0) != wantDev0 || Color(1) != (color.RGBA{R: 44, G: 160, B: 44, A: 255}) {
		t.Fatalf("cpu %v, device 0 %v, device 1 %v: not the documented colours", Color(trace.CPU), Color(0), Color(1))
	}
	if Color(8) != Color(0) {
		t.Fatalf("device 8 %v, device 0 %v: want the palette to start again", Color(8), Color(0))
	}
}
