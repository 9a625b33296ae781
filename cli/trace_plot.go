package cli

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	gplot "gonum.org/v1/plot"

	"github.com/softuvm/softuvm/trace"
	traceplot "github.com/softuvm/softuvm/trace/plot"
)

// The sizes `uvm trace plot` accepts, in pixels: below the least, the
// title, the axes and the heatmap's long y label (whose glyphs gonum
// makes room for) leave little or no room for data; above the most, one
// PNG takes hundreds of megabytes to draw.
const (
	tracePlotMinPx = 400
	tracePlotMaxPx = 10000
)

// runTracePlot is `uvm trace plot`: the figures of package trace/plot,
// written as files.
func runTracePlot(args []string) error {
	fs := newFlagSet("trace plot", "[--out DIR] [--format png|svg|both] [--width PX] [--height PX] TRACE",
		"Draw a trace: heatmap (faults and migrated pages by time and address, coloured by processor), bandwidth (migration bandwidth over time, each direction a line) and service (the fault service times of each processor, a histogram on a log axis), written to DIR as heatmap.png, bandwidth.png and service.png (or .svg)")
	out := fs.String("out", "", "the directory to write the figures to (default: the trace's path without its extension, and -plots: run.uvmtrace gives run-plots)")
	format := fs.String("format", "png", "png, svg or both")
	width := fs.Int("width", 1200, "width of each figure in pixels (SVG: at 96 pixels an inch)")
	height := fs.Int("height", 800, "height of each figure in pixels (SVG: at 96 pixels an inch)")
	path, err := tracePlotArgs(fs, args)
	if err != nil {
		return err
	}
	var exts []string
	switch *format {
	case "png", "svg":
		exts = []string{*format}
	case "both":
		exts = []string{"png", "svg"}
	default:
		return fmt.Errorf("--format %q: want png, svg or both", *format)
	}
	for _, d := range []struct {
		name string
		px   int
	}{{"--width", *width}, {"--height", *height}} {
		if d.px < tracePlotMinPx || d.px > tracePlotMaxPx {
			return fmt.Errorf("%s %d: want a number of pixels from %d to %d", d.name, d.px, tracePlotMinPx, tracePlotMaxPx)
		}
	}
	dir := *out
	if dir == "" {
		dir = strings.TrimSuffix(path, filepath.Ext(path)) + "-plots"
	}

	h, events, err := trace.ReadFile(path)
	if err != nil {
		if len(events) == 0 {
			return err
		}
		// A trace cut short (its recorder killed) is still worth drawing
		// up to where it stops.
		fmt.Fprintf(os.Stderr, "uvm trace plot: %v; drawing the %d events before it\n", err, len(events))
	}
	var faults, migrations int
	for i := range events {
		switch events[i].Kind {
		case trace.KindFault:
			faults++
		case trace.KindMigration:
			migrations++
		}
	}
	if faults == 0 && migrations == 0 {
		fmt.Fprintf(os.Stderr, "uvm trace plot: %s has no faults or migrations (%d events): the figures say so\n", path, len(events))
	}

	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("--out: %w", err)
	}
	w, ht := traceplot.Pixels(*width), traceplot.Pixels(*height)
	for _, fig := range []struct {
		name string
		draw func(trace.Header, []trace.Event) *gplot.Plot
	}{
		{"heatmap", traceplot.Heatmap},
		{"bandwidth", traceplot.Bandwidth},
		{"service", traceplot.ServiceTimes},
	} {
		p := fig.draw(h, events)
		for _, ext := range exts {
			file := filepath.Join(dir, fig.name+"."+ext)
			if err := traceplot.Save(p, file, w, ht); err != nil {
				return err
			}
			fmt.Fprintln(os.Stderr, file)
		}
	}
	return nil
}

// tracePlotArgs parses flags given before and after the one TRACE
// argument, so that both `uvm trace plot --out d run.uvmtrace` and
// `uvm trace plot run.uvmtrace --out d` work.
func tracePlotArgs(fs *flag.FlagSet, args []string) (string, error) {
	if _, err := parseArgs(fs, args); err != nil {
		return "", err
	}
	if fs.NArg() == 0 {
		fmt.Fprintln(fs.Output(), "uvm trace plot: want a TRACE file to draw")
		fs.Usage()
		return "", errUsage
	}
	path := fs.Arg(0)
	// parseFlags refuses a second argument.
	if err := parseFlags(fs, fs.Args()[1:]); err != nil {
		return "", err
	}
	return path, nil
}
