package bench

import (
	"fmt"
	"image/color"
	"os"
	"path/filepath"

	gplot "gonum.org/v1/plot"

	traceplot "github.com/softuvm/softuvm/trace/plot"
)

// The figures of `uvm bench ... --plot DIR`, each written as NAME.png and
// NAME.svg, of benchPlotWidth x benchPlotHeight pixels.
const (
	benchPlotWidth  = 1200
	benchPlotHeight = 800
)

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
// says each path written (progress), and returns them.
func saveBenchFigures(dir string, figures []benchFigure, progress Progress) ([]string, error) {
	var paths []string
	for _, f := range figures {
		got, err := traceplot.SaveBoth(f.plot, filepath.Join(dir, f.name), benchPlotWidth, benchPlotHeight)
		paths = append(paths, got...)
		for _, p := range got {
			progress.orQuiet()("wrote %s", p)
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

// kbBytes is kb KiB in bytes, for a size axis.
func kbBytes(kb int) float64 { return float64(kb) * 1024 }
