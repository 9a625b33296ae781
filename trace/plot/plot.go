package plot

import (
	"fmt"
	"image/color"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	gplot "gonum.org/v1/plot"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"

	"github.com/softuvm/softuvm/trace"
)

// DPI is the resolution raster images (PNG, JPEG, TIFF) are drawn at:
// gonum's, which its file formats use and Pixels counts in.
const DPI = vgimg.DefaultDPI

// Pixels is the length that comes out as n pixels in an image drawn at
// DPI: a figure saved as PNG at Pixels(1200) x Pixels(800) is 1200 x 800
// pixels. In SVG and PDF it is n/DPI inches.
func Pixels(n int) vg.Length { return vg.Length(n) * vg.Inch / DPI }

// Save writes p, width by height, to the file path in the format its
// extension names: .png or .svg, or another gonum knows (.pdf, .eps,
// .jpg, .tif, .tex).
func Save(p *gplot.Plot, path string, width, height vg.Length) error {
	return save(path, func(format string) (io.WriterTo, error) { return writerTo(p, format, width, height) })
}

// SaveColumn writes plots stacked from top to bottom in one figure,
// width by height, to path in the format its extension names, as Save
// does. gonum's Align gives their data areas the same size and lines
// them up, so that panels sharing an x axis read down the page.
func SaveColumn(plots []*gplot.Plot, path string, width, height vg.Length) error {
	return save(path, func(format string) (io.WriterTo, error) {
		if len(plots) == 0 {
			return nil, fmt.Errorf("no plots to draw")
		}
		if width <= 0 || height <= 0 {
			return nil, fmt.Errorf("size %v x %v: want a positive width and height", width, height)
		}
		c, err := draw.NewFormattedCanvas(width, height, format)
		if err != nil {
			return nil, fmt.Errorf("format %q: want png or svg (or pdf, eps, jpg, tif, tex)", format)
		}
		column := make([][]*gplot.Plot, len(plots))
		for i, p := range plots {
			column[i] = []*gplot.Plot{p}
		}
		dc := draw.New(c)
		// The space between the panels is the figure's too: white, as
		// each panel's own background.
		dc.FillPolygon(color.White, []vg.Point{dc.Min, {X: dc.Max.X, Y: dc.Min.Y}, dc.Max, {X: dc.Min.X, Y: dc.Max.Y}})
		tiles := draw.Tiles{Rows: len(plots), Cols: 1, PadTop: vg.Points(4), PadBottom: vg.Points(4), PadY: vg.Points(16)}
		for i, cs := range gplot.Align(column, tiles, dc) {
			plots[i].Draw(cs[0])
		}
		return c, nil
	})
}

// save renders a figure in the format path's extension names and writes
// it to path.
func save(path string, render func(format string) (io.WriterTo, error)) error {
	format := strings.ToLower(strings.TrimPrefix(filepath.Ext(path), "."))
	if format == "" {
		return fmt.Errorf("plot: %s: no extension to name a format (want .png or .svg)", path)
	}
	// Render before creating the file, so that an unknown format leaves
	// no empty file behind.
	wt, err := render(format)
	if err != nil {
		return fmt.Errorf("plot: %s: %w", path, err)
	}
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("plot: %w", err)
	}
	if _, err := wt.WriteTo(f); err != nil {
		f.Close()
		return fmt.Errorf("plot: %s: %w", path, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("plot: %w", err)
	}
	return nil
}

// Render writes p, width by height, to w in format ("png", "svg", ...).
func Render(w io.Writer, p *gplot.Plot, format string, width, height vg.Length) error {
	wt, err := writerTo(p, strings.ToLower(format), width, height)
	if err != nil {
		return fmt.Errorf("plot: %w", err)
	}
	_, err = wt.WriteTo(w)
	return err
}

func writerTo(p *gplot.Plot, format string, width, height vg.Length) (io.WriterTo, error) {
	if width <= 0 || height <= 0 {
		return nil, fmt.Errorf("size %v x %v: want a positive width and height", width, height)
	}
	wt, err := p.WriterTo(width, height, format)
	if err != nil {
		return nil, fmt.Errorf("format %q: want png or svg (or pdf, eps, jpg, tif, tex)", format)
	}
	return wt, nil
}

// palette is the processors' colours: the cpu's, then the devices' in
// turn (Tableau's ten without its grey, which would read as "nothing").
var palette = []color.RGBA{
	{R: 31, G: 119, B: 180, A: 255},  // cpu: blue
	{R: 255, G: 127, B: 14, A: 255},  // device 0: orange
	{R: 44, G: 160, B: 44, A: 255},   // device 1: green
	{R: 214, G: 39, B: 40, A: 255},   // device 2: red
	{R: 148, G: 103, B: 189, A: 255}, // device 3: purple
	{R: 140, G: 86, B: 75, A: 255},   // device 4: brown
	{R: 227, G: 119, B: 194, A: 255}, // device 5: pink
	{R: 188, G: 189, B: 34, A: 255},  // device 6: olive
	{R: 23, G: 190, B: 207, A: 255},  // device 7: cyan
}

// Color is processor's colour in every figure: the cpu (trace.CPU)
// blue (31,119,180), device 0 orange (255,127,14), device 1 green
// (44,160,44), device 2 red (214,39,40), device 3 purple (148,103,189),
// device 4 brown (140,86,75), device 5 pink (227,119,194), device 6
// olive (188,189,34), device 7 cyan (23,190,207); device 8 on takes the
// devices' colours again from device 0's. A processor number below
// trace.CPU, which no trace should have, is grey.
func Color(processor int32) color.RGBA {
	switch {
	case processor == trace.CPU:
		return palette[0]
	case processor < 0:
		return color.RGBA{R: 127, G: 127, B: 127, A: 255}
	}
	return palette[1+int(processor)%(len(palette)-1)]
}

// tint is c as if drawn with opacity a on white, but opaque: raster and
// vector outputs then agree, whatever a viewer makes of transparency.
func tint(c color.RGBA, a float64) color.RGBA {
	mix := func(v uint8) uint8 { return uint8(255 - a*(255-float64(v)) + 0.5) }
	return color.RGBA{R: mix(c.R), G: mix(c.G), B: mix(c.B), A: 255}
}

// legendMargin reserves room right of the data for the legend, which
// gonum would otherwise draw over the data's top right corner. It is a
// plotter that draws nothing but claims, as a glyph at the right edge,
// the width of the widest legend entry; gonum pads the data area by
// it, and the legend, drawn at the right edge of the whole figure,
// lands in the room it leaves.
type legendMargin struct{ names []string }

// legendGap is the space between the data and the legend, and between
// the legend and the figure's edge.
const legendGap = vg.Length(8)

func (legendMargin) Plot(draw.Canvas, *gplot.Plot) {}

func (m legendMargin) GlyphBoxes(p *gplot.Plot) []gplot.GlyphBox {
	if len(m.names) == 0 {
		return nil
	}
	var w vg.Length
	for _, n := range m.names {
		w = max(w, p.Legend.TextStyle.Rectangle(" "+n).Max.X)
	}
	w += p.Legend.ThumbnailWidth + 2*legendGap
	return []gplot.GlyphBox{{X: 1, Y: 0.5, Rectangle: vg.Rectangle{Max: vg.Point{X: w}}}}
}

// withLegend puts p's legend, of these entries, in a margin right of
// the data, at the top.
func withLegend(p *gplot.Plot, names []string, thumbs []gplot.Thumbnailer) {
	for i, n := range names {
		p.Legend.Add(n, thumbs[i])
	}
	p.Legend.Top = true
	p.Legend.XOffs = -legendGap
	p.Legend.TextStyle.Font.Size = vg.Points(10)
	p.Legend.Padding = vg.Points(3)
	p.Add(legendMargin{names})
}

// swatchThumb is a legend thumbnail: a square of a colour.
type swatchThumb struct{ c color.Color }

func (s swatchThumb) Thumbnail(c *draw.Canvas) {
	side := min(c.Max.X-c.Min.X, c.Max.Y-c.Min.Y)
	x := c.Max.X - side
	c.FillPolygon(s.c, []vg.Point{{X: x, Y: c.Min.Y}, {X: c.Max.X, Y: c.Min.Y}, {X: c.Max.X, Y: c.Min.Y + side}, {X: x, Y: c.Min.Y + side}})
}

// newPlot is a figure with the title and axis labels every one has.
func newPlot(title, xLabel, yLabel string) *gplot.Plot {
	p := gplot.New()
	p.Title.Text = title
	p.Title.Padding = vg.Points(6)
	p.X.Label.Text = xLabel
	p.Y.Label.Text = yLabel
	return p
}

// span is how long the trace lasts: to the end of the last fault,
// migration or wait it records. Never zero, so that axes have a range.
func span(events []trace.Event) time.Duration {
	var end time.Duration
	for i := range events {
		e := &events[i]
		end = max(end, e.Time+max(e.Duration, 0))
	}
	if end <= 0 {
		end = time.Millisecond
	}
	return end
}

// timeUnit is the unit a time axis of this span reads best in: its
// numbers stay between about 1 and 10,000.
func timeUnit(d time.Duration) (time.Duration, string) {
	switch {
	case d >= 10*time.Second:
		return time.Second, "s"
	case d >= 10*time.Millisecond:
		return time.Millisecond, "ms"
	}
	return time.Microsecond, "µs"
}

func timeLabel(unit string) string { return "time since the trace began (" + unit + ")" }

// sizeText is a byte count the way people read one: 1.5 GiB.
func sizeText(b float64) string {
	units := []string{"B", "KiB", "MiB", "GiB", "TiB"}
	i := 0
	for b >= 1024 && i < len(units)-1 {
		b /= 1024
		i++
	}
	if i == 0 {
		return fmt.Sprintf("%.0f B", b)
	}
	return fmt.Sprintf("%.3g %s", b, units[i])
}

// pageBytes is the size of the pages that Pages counts.
func pageBytes(h trace.Header) uint64 {
	if h.PageSize > 0 {
		return uint64(h.PageSize)
	}
	return trace.PageSize
}

// processors lists the processors of the keys of m in the order legends
// give them: the cpu, then the devices by number.
func processors[V any](m map[int32]V) []int32 { return slices.Sorted(maps.Keys(m)) }
