package plot

import (
	"image/color"
	"math"
	"slices"
	"sort"

	gplot "gonum.org/v1/plot"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"

	"github.com/softuvm/softuvm/trace"
)

// HeatmapColumns and HeatmapRows are the heatmap's grid: time, from 0
// to the trace's end, in HeatmapColumns bins; the managed address
// space in HeatmapRows.
const (
	HeatmapColumns = 200
	HeatmapRows    = 150
)

// blockAlign is what an address outside every allocation the trace
// records is rounded out to, to give it a band of the y axis: softuvm's
// 2 MiB blocks, so that the pages of one block share a band.
const blockAlign = 2 << 20

// minTint is the intensity of a cell with one fault: light enough to
// tell from a full one, dark enough to tell from white.
const minTint = 0.3

// Heatmap draws the faults and migrated pages of a trace over time (x)
// and address (y). Time and address are binned into a grid of
// HeatmapColumns x HeatmapRows cells. A fault counts one for the
// processor that faulted, in the cell of its time and page; a migration
// counts one a page for the processor the pages went to (To), in the
// cell of its start and of each page; so does an access the access mode
// saw (KindAccess), for the processor that touched them. A cell with any is filled with
// the colour (see Color) of the processor with the most there (on a
// tie, the cpu, then the lowest device), its intensity the log of the
// cell's count of all processors against the fullest cell's: from the
// colour at 30% on white for one to the full colour for the fullest.
//
// The y axis is the concatenation of the address ranges of the trace's
// allocations (KindAlloc's Addr and Bytes), in address order, so that
// allocations far apart in the address space stand next to each other
// rather than squashed to the edges of a mostly empty axis; thin grey
// lines mark where one range ends and the next begins (when there are
// at most 64). Faults and migrations outside every recorded allocation
// (a trace that began after the program allocated, or one without
// allocations) bring the 2 MiB blocks they lie in, runs of adjacent
// blocks becoming one range.
func Heatmap(h trace.Header, events []trace.Event) *gplot.Plot {
	ps := pageBytes(h)
	end := span(events)
	unit, unitName := timeUnit(end)
	am := newAddressMap(events, ps)

	counts := map[int32][]float64{}
	add := func(proc int32, col, row int, n float64) {
		c := counts[proc]
		if c == nil {
			c = make([]float64, HeatmapColumns*HeatmapRows)
			counts[proc] = c
		}
		c[row*HeatmapColumns+col] += n
	}
	accesses := false
	for i := range events {
		e := &events[i]
		var proc int32
		var pages uint64
		switch e.Kind {
		case trace.KindFault:
			proc, pages = e.Processor, 1
		case trace.KindMigration:
			proc, pages = e.To, uint64(max(e.Pages, 1))
		case trace.KindAccess:
			proc, pages = e.Processor, uint64(max(e.Pages, 1))
			accesses = true
		default:
			continue
		}
		col := binOf(float64(e.Time)/float64(end), HeatmapColumns)
		am.eachPage(e.Addr, pages, ps, func(off uint64) {
			add(proc, col, binOf(float64(off)/float64(am.total), HeatmapRows), 1)
		})
	}

	title := "Faults and migrated pages by time and address"
	if accesses {
		title = "Faults, accesses and migrated pages by time and address"
	}
	if len(counts) == 0 {
		title += "\n(no faults or migrations in this trace)"
	} else if accesses {
		// Short lines: a title does not wrap, and figures may be narrow.
		title += "\ncolour: processor with most faults + accesses + pages moved to it\ndarker: more of them (log scale)"
	} else {
		title += "\ncolour: processor with most faults + pages moved to it\ndarker: more of them (log scale)"
	}
	p := newPlot(title, timeLabel(unitName), "offset in managed memory (MiB)")
	p.X.Padding, p.Y.Padding = 0, 0

	const mib = 1 << 20
	cells := &heatCells{xmax: float64(end) / float64(unit), ymax: float64(am.total) / mib}
	if am.total == 0 {
		cells.ymax = 1
	}
	if len(am.segs) <= 64 {
		for _, s := range am.segs[min(1, len(am.segs)):] {
			cells.seams = append(cells.seams, float64(s.off)/mib)
		}
	}
	procs := processors(counts)
	total := make([]float64, HeatmapColumns*HeatmapRows)
	var fullest float64
	for _, proc := range procs {
		for i, n := range counts[proc] {
			total[i] += n
		}
	}
	for _, n := range total {
		fullest = max(fullest, n)
	}
	cw, rh := cells.xmax/HeatmapColumns, cells.ymax/HeatmapRows
	for row := range HeatmapRows {
		var run *heatRect
		for col := range HeatmapColumns {
			i := row*HeatmapColumns + col
			if total[i] == 0 {
				run = nil
				continue
			}
			// procs is in legend order, so the first with the most
			// wins a tie: the cpu, then the lowest device.
			win, most := procs[0], -1.0
			for _, proc := range procs {
				if n := counts[proc][i]; n > most {
					win, most = proc, n
				}
			}
			a := 1.0
			if fullest > 1 {
				a = minTint + (1-minTint)*math.Log1p(total[i]-1)/math.Log1p(fullest-1)
			}
			c := tint(Color(win), a)
			// Cells of a row that look alike become one rectangle: fewer
			// shapes for SVG, and no seams between them.
			if run != nil && run.c == c {
				run.x1 = float64(col+1) * cw
				continue
			}
			cells.rects = append(cells.rects, heatRect{x0: float64(col) * cw, x1: float64(col+1) * cw,
				y0: float64(row) * rh, y1: float64(row+1) * rh, c: c})
			run = &cells.rects[len(cells.rects)-1]
		}
	}
	p.Add(cells)
	var names []string
	var thumbs []gplot.Thumbnailer
	for _, proc := range procs {
		names = append(names, trace.ProcessorName(proc))
		thumbs = append(thumbs, swatchThumb{Color(proc)})
	}
	withLegend(p, names, thumbs)
	p.X.Min, p.X.Max = 0, cells.xmax
	p.Y.Min, p.Y.Max = 0, cells.ymax
	return p
}

// binOf is the bin, of n over [0,1), that the fraction f falls in;
// fractions out of range go to the end bins.
func binOf(f float64, n int) int {
	if !(f > 0) { // NaN too
		return 0
	}
	return min(int(f*float64(n)), n-1)
}

// segment is the addresses [start, end), at offset off of the y axis.
type segment struct{ start, end, off uint64 }

// addressMap maps the address ranges the heatmap shows, one after
// another, onto its y axis.
type addressMap struct {
	segs  []segment
	total uint64
}

func newAddressMap(events []trace.Event, pageSize uint64) addressMap {
	var allocs []segment
	for i := range events {
		if e := &events[i]; e.Kind == trace.KindAlloc && e.Bytes > 0 {
			allocs = append(allocs, segment{start: e.Addr, end: e.Addr + alignUp(e.Bytes, pageSize)})
		}
	}
	allocs = union(allocs)
	covered := func(a uint64) bool {
		i := sort.Search(len(allocs), func(i int) bool { return allocs[i].end > a })
		return i < len(allocs) && allocs[i].start <= a
	}
	segs := slices.Clone(allocs)
	for i := range events {
		e := &events[i]
		var pages uint64
		switch e.Kind {
		case trace.KindFault:
			pages = 1
		case trace.KindMigration, trace.KindAccess:
			pages = uint64(max(e.Pages, 1))
		default:
			continue
		}
		last := e.Addr + (pages-1)*pageSize
		if !covered(e.Addr) || !covered(last) {
			segs = append(segs, segment{start: e.Addr &^ (blockAlign - 1), end: alignUp(last+pageSize, blockAlign)})
		}
	}
	m := addressMap{segs: union(segs)}
	for i := range m.segs {
		m.segs[i].off = m.total
		m.total += m.segs[i].end - m.segs[i].start
	}
	return m
}

// eachPage calls f with the offset of each of the pages pages from
// addr, that the map has.
func (m *addressMap) eachPage(addr, pages, pageSize uint64, f func(off uint64)) {
	for pages > 0 {
		i := sort.Search(len(m.segs), func(i int) bool { return m.segs[i].end > addr })
		if i == len(m.segs) {
			return
		}
		s := m.segs[i]
		if addr < s.start { // in a gap: skip to the next range
			skip := (s.start - addr + pageSize - 1) / pageSize
			if skip >= pages {
				return
			}
			addr, pages = addr+skip*pageSize, pages-skip
		}
		for ; pages > 0 && addr < s.end; addr, pages = addr+pageSize, pages-1 {
			f(s.off + addr - s.start)
		}
	}
}

// union merges the overlapping and adjacent ranges of segs, in address
// order.
func union(segs []segment) []segment {
	slices.SortFunc(segs, func(a, b segment) int {
		switch {
		case a.start < b.start:
			return -1
		case a.start > b.start:
			return 1
		}
		return 0
	})
	var out []segment
	for _, s := range segs {
		if n := len(out); n > 0 && s.start <= out[n-1].end {
			out[n-1].end = max(out[n-1].end, s.end)
			continue
		}
		out = append(out, s)
	}
	return out
}

func alignUp(n, a uint64) uint64 { return (n + a - 1) &^ (a - 1) }

// heatRect is a run of cells of one colour, in data coordinates.
type heatRect struct {
	x0, x1, y0, y1 float64
	c              color.RGBA
}

// heatCells is the heatmap's plotter: its cells, and lines where one
// address range meets the next.
type heatCells struct {
	rects      []heatRect
	seams      []float64
	xmax, ymax float64
}

func (h *heatCells) DataRange() (xmin, xmax, ymin, ymax float64) { return 0, h.xmax, 0, h.ymax }

// overlap is how far a cell is drawn past its right and top edges:
// antialiased edges of cells side by side would otherwise let white
// through as faint lines between them.
const overlap = vg.Length(0.5)

func (h *heatCells) Plot(c draw.Canvas, p *gplot.Plot) {
	trX, trY := p.Transforms(&c)
	for _, r := range h.rects {
		x0, x1 := trX(r.x0), min(trX(r.x1)+overlap, c.Max.X)
		y0, y1 := trY(r.y0), min(trY(r.y1)+overlap, c.Max.Y)
		c.FillPolygon(r.c, []vg.Point{{X: x0, Y: y0}, {X: x1, Y: y0}, {X: x1, Y: y1}, {X: x0, Y: y1}})
	}
	seam := draw.LineStyle{Color: color.RGBA{R: 160, G: 160, B: 160, A: 255}, Width: vg.Points(0.5)}
	for _, y := range h.seams {
		c.StrokeLine2(seam, c.Min.X, trY(y), c.Max.X, trY(y))
	}
}
