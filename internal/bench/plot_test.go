package bench

import (
	"bytes"
	"image/png"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/softuvm/softuvm/internal/config"
)

// The size every figure of --plot has, written out here rather than
// taken from the constants, so that a change of size fails.
const wantPlotW, wantPlotH = 1200, 800

// checkFigures checks that paths are exactly the PNG and SVG of each
// name in dir, that each PNG is wantPlotW x wantPlotH pixels and not of
// one colour, and that each SVG is an SVG of that size. The SVGs
// together must have every text of texts (legend entries, bar names),
// and none may say it has no data.
func checkFigures(t *testing.T, dir string, paths []string, names []string, texts ...string) {
	t.Helper()
	var want []string
	for _, n := range names {
		want = append(want, filepath.Join(dir, n+".png"), filepath.Join(dir, n+".svg"))
	}
	require.Equal(t, want, paths)
	var svgs string
	for _, p := range paths {
		raw, err := os.ReadFile(p)
		require.NoError(t, err)
		if strings.HasSuffix(p, ".svg") {
			svg := string(raw)
			svgs += svg
			// gonum writes the size in points: 1200 x 800 px at 96 an
			// inch is 900 x 600 pt.
			assert.True(t, strings.HasPrefix(svg, "<?xml") && strings.Contains(svg[:min(len(svg), 300)], `<svg width="900pt" height="600pt"`),
				"%s: want an SVG of 900 x 600 pt, have %.200q", p, svg)
			assert.False(t, strings.Contains(svg, "no data") || strings.Contains(svg, "nothing to draw"), "%s: says it has nothing to draw", p)
			continue
		}
		img, err := png.Decode(bytes.NewReader(raw))
		require.NoError(t, err, p)
		b := img.Bounds()
		assert.Equal(t, [2]int{wantPlotW, wantPlotH}, [2]int{b.Dx(), b.Dy()}, "%s: size in pixels", p)
		colours := map[[4]uint32]bool{}
		for y := b.Min.Y; y < b.Max.Y; y += 4 {
			for x := b.Min.X; x < b.Max.X; x += 4 {
				r, g, bl, a := img.At(x, y).RGBA()
				colours[[4]uint32{r, g, bl, a}] = true
			}
		}
		assert.Greater(t, len(colours), 10, "%s: blank?", p)
		if keep := os.Getenv("PLOT_TEST_KEEP"); keep != "" { // to look at them
			os.WriteFile(filepath.Join(keep, filepath.Base(p)), raw, 0o644)
		}
	}
	for _, text := range texts {
		assert.True(t, strings.Contains(svgs, ">"+text+"<"), "no text %q in the figures", text)
	}
}

func TestBenchLaunchPlot(t *testing.T) {
	f := func(v float64) *float64 { return &v }
	rep := &LaunchReport{
		Machine: Machine{CPUs: 2, Kernel: "6.18", Go: "go1.26"}, Workers: 2, Thrashing: "off",
		Rows: []LaunchRow{{KB: 0, USPerIter: 13.6}, {KB: 4, USPerIter: 148, MBps: f(28)}, {KB: 8, USPerIter: 177, MBps: f(46)},
			{KB: 16, USPerIter: 189, MBps: f(87)}, {KB: 32, USPerIter: 223, MBps: f(147)}, {KB: 64, USPerIter: 290, MBps: f(226)}},
		LaunchRows: []LaunchRow{{KB: 0, USPerIter: 68}, {KB: 4, USPerIter: 198}, {KB: 8, USPerIter: 331},
			{KB: 16, USPerIter: 408}, {KB: 32, USPerIter: 545}, {KB: 64, USPerIter: 891}},
		Schedules: []ScheduleRow{{Schedule: "auto", NullLaunchUS: 8.84}, {Schedule: "spin", NullLaunchUS: 8.82},
			{Schedule: "yield", NullLaunchUS: 15.15}, {Schedule: "blocking", NullLaunchUS: 14.97}},
		PipeRTTUS: 5.58,
	}
	dir := filepath.Join(t.TempDir(), "new", "plots") // created
	require.NoError(t, checkPlotDir(dir))
	paths, err := plotLaunch(dir, rep, t.Logf)
	require.NoError(t, err)
	checkFigures(t, dir, paths, []string{"launch-touch", "launch-null"},
		"softuvm, fault model (this run)", "softuvm, launch model (this run)", "NVIDIA H200 (docs/benchmarks.md)",
		"GM200, the seed&#39;s (Windows 7)", "GP100, the seed&#39;s (Windows 7)", // SVG escapes the apostrophe
		"auto", "spin", "yield", "blocking", "pipe RTT", "fault 0 KiB", "launch 0 KiB", "H200", "GM200", "GP100",
		"4 KiB", "64 KiB")
	// The references (the H200's and the seed's go to 64 MiB and 16 MiB)
	// do not stretch the size axis past the sizes of this run.
	svg, err := os.ReadFile(filepath.Join(dir, "launch-touch.svg"))
	require.NoError(t, err)
	assert.NotContains(t, string(svg), ">1 MiB<", "a size axis past 64 KiB")

	// No --plot: nothing drawn, nothing written.
	paths, err = plotLaunch("", rep, t.Logf)
	assert.NoError(t, err)
	assert.Empty(t, paths)
}

func TestBenchMemcpyPlot(t *testing.T) {
	rep := &MemcpyReport{
		Machine: Machine{CPUs: 2, Kernel: "6.18", Go: "go1.26"}, Runs: 3, SizeBytes: 16 << 20,
		Engine: config.CopyCalibration{CopyProducers: 2, CopyDirectBelow: 2 << 20, Source: "measured"},
		Sizes: []SizeRow{
			{Bytes: 64 << 10, SingleThreadUS: 3, H2DUS: 7, D2HUS: 6},
			{Bytes: 256 << 10, SingleThreadUS: 12, H2DUS: 20, D2HUS: 15},
			{Bytes: 1 << 20, SingleThreadUS: 50, H2DUS: 46, D2HUS: 44},
			{Bytes: 4 << 20, SingleThreadUS: 200, H2DUS: 218, D2HUS: 190},
			{Bytes: 16 << 20, SingleThreadUS: 900, H2DUS: 560, D2HUS: 720},
		},
		SizesOneThread: []SizeRow{
			{Bytes: 64 << 10, H2DUS: 4, D2HUS: 4}, {Bytes: 256 << 10, H2DUS: 14, D2HUS: 13},
			{Bytes: 1 << 20, H2DUS: 55, D2HUS: 52}, {Bytes: 4 << 20, H2DUS: 230, D2HUS: 210}, {Bytes: 16 << 20, H2DUS: 990, D2HUS: 900},
		},
		SizesEngineProducers: 2,
		SizesEngineForced: []SizeRow{
			{Bytes: 64 << 10, H2DUS: 9, D2HUS: 8}, {Bytes: 256 << 10, H2DUS: 21, D2HUS: 17},
			{Bytes: 1 << 20, H2DUS: 47, D2HUS: 45}, {Bytes: 4 << 20, H2DUS: 215, D2HUS: 188}, {Bytes: 16 << 20, H2DUS: 0, D2HUS: 700}, // 0: not timed, left out
		},
	}
	dir := t.TempDir()
	paths, err := plotMemcpy(dir, rep, t.Logf)
	require.NoError(t, err)
	checkFigures(t, dir, paths, []string{"copy-sizes"},
		"copy between host buffers, one thread", "Memcpy as calibrated, host -&gt; device", "Memcpy as calibrated, device -&gt; host",
		"Memcpy engine off (one thread), host -&gt; device", "Memcpy engine forced on (2 producers), device -&gt; host", "64 KiB", "16 MiB")
}

func TestBenchPlotDirErrors(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "a-file")
	require.NoError(t, os.WriteFile(file, nil, 0o644))
	for _, bad := range []string{file, filepath.Join(file, "below")} {
		err := checkPlotDir(bad)
		require.Error(t, err, bad)
		assert.Contains(t, err.Error(), bad, "the error names the path")
		assert.Contains(t, err.Error(), "--plot", "the error names the flag")
	}
	assert.NoError(t, checkPlotDir(""), "no --plot")
	assert.NoError(t, checkPlotDir(dir), "an existing directory")
	left, err := os.ReadDir(dir)
	require.NoError(t, err)
	assert.Len(t, left, 1, "the check leaves nothing behind")
	if os.Geteuid() != 0 { // root writes anywhere
		ro := filepath.Join(dir, "read-only")
		require.NoError(t, os.Mkdir(ro, 0o555))
		err := checkPlotDir(ro)
		require.Error(t, err)
		assert.Contains(t, err.Error(), ro)
	}
}
