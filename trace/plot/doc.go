// Package plot draws a trace (package trace) as figures made with
// gonum.org/v1/plot:
//
//   - Heatmap: faults and migrated pages over time (x) and address (y),
//     each cell of a grid coloured by the processor with the most of
//     them there and darker the more there are (on a log scale);
//   - Bandwidth: migration bandwidth over time, a line for each
//     direction (source and destination) pages moved in;
//   - ServiceTimes: the distribution of fault service times, a
//     histogram for each processor on a logarithmic time axis.
//
// Each returns a *plot.Plot of gonum's, which Save writes in the format
// its file name's extension names:
//
//	h, events, err := trace.ReadFile("run.uvmtrace")
//	...
//	p := plot.Heatmap(h, events)
//	err = plot.Save(p, "heatmap.png", plot.Pixels(1200), plot.Pixels(800))
//
// A processor has the same colour in every figure (see Color): the cpu
// blue, device 0 orange, device 1 green, and so on through a fixed
// palette, so that a reader learns it once. Legends stand in a margin
// right of the data, not over it, so that nothing the trace shows is
// hidden. A trace with nothing to draw in a figure still gives one,
// whose title says so.
//
// Lines and Bars draw tables rather than traces (the benchmarks'
// figures): lines of (x, y) series, with goals, reference levels and
// lower bounds marked as such (Series), on axes that may be logarithmic
// or reversed (Axis); bars of named values. SaveColumn stacks several
// figures into one image, their data areas lined up.
//
// Raster images are drawn at DPI dots an inch; Pixels turns a size in
// pixels into the length that gives exactly that many.
package plot
