package bench

import (
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/softuvm/softuvm/internal/config"
	"github.com/softuvm/softuvm/policy"
	"github.com/softuvm/softuvm/uvm"
)

// seedLaunchUS is the launch time in microseconds against the memory
// touched, in KiB, of "Managed Memory: Belated Comments on
// Implementation" (Tables 1 and 2: a GTX 970, GM200, and a Titan X,
// GP100, on Windows 7), which `uvm bench launch` prints beside its own.
var seedLaunchUS = []struct {
	KB           int
	GM200, GP100 float64
}{
	{0, 47, 39}, {4, 105, 47.15}, {8, 104, 49.86}, {16, 115, 57.84}, {32, 134, 59.04}, {64, 213, 64.73},
	{128, 381, 79.08}, {256, 649, 98.41}, {512, 1247, 137.15}, {1024, 2221, 205.56}, {2048, 4712, 391.91},
	{4096, 8458, 745.81}, {8192, 17041, 1543.91}, {16384, 33992, 3114.83},
}

// seedRow returns the seed's figures for kb, if it measured that size.
func seedRow(kb int) (gm200, gp100 float64, ok bool) {
	for _, r := range seedLaunchUS {
		if r.KB == kb {
			return r.GM200, r.GP100, true
		}
	}
	return 0, 0, false
}

// coherenceSession starts a private server with one device of the given
// arena and a client of the given coherence model and dirty tracking.
func coherenceSession(arena int64, thrash policy.ThrashingSpec, coherence, dirty string) (*uvm.Session, error) {
	cfg := uvm.DefaultServerConfig()
	cfg.Devices = config.DeviceSpecs(1, []int64{arena}, cfg.Devices[0].Backend)
	cfg.Thrashing = thrash
	cfg.Coherence = coherence
	cfg.DirtyTracking = dirty
	return uvm.Connect(uvm.Config{Server: "private", Private: cfg})
}

// DirtyRow is the cost of finding the pages the CPU wrote: one pass of
// writes over pages the host holds, as GB/s.
type DirtyRow struct {
	Tracking string  `json:"tracking"`
	GBps     float64 `json:"gbps"`
	Ratio    float64 `json:"ratio_to_untracked"`
}

// dirtyTrackingCost times one pass of 8-byte writes over size bytes of
// managed memory that the host holds, in three sessions: the fault model
// (nothing tracks writes: the baseline), and the launch model with each
// way of tracking them, where the pages came back from the device after a
// launch and so are write-protected until their first write (wp-async: a
// minor fault the kernel resolves itself; wp-fault: a write-protect fault
// the server serves). Each figure is the median of runs.
func dirtyTrackingCost(size int64, runs int, thrash policy.ThrashingSpec) ([]DirtyRow, error) {
	var rows []DirtyRow
	for _, mode := range []struct{ coherence, dirty, name string }{
		{"fault", "", "none (fault model)"}, {"launch", "wp-async", "wp-async"}, {"launch", "wp-fault", "wp-fault"},
	} {
		s, err := coherenceSession(max(config.DefaultArenaSize, 2*size), thrash, mode.coherence, mode.dirty)
		if err != nil {
			return nil, err
		}
		var rates []float64
		for r := 0; r <= runs && err == nil; r++ { // run 0 warms up
			var gbps float64
			gbps, err = dirtyPass(s, size)
			if r > 0 {
				rates = append(rates, gbps)
			}
		}
		if cerr := s.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return nil, fmt.Errorf("dirty tracking %s: %w", mode.name, err)
		}
		rows = append(rows, DirtyRow{Tracking: mode.name, GBps: median(rates)})
	}
	for i := range rows {
		rows[i].Ratio = rows[i].GBps / rows[0].GBps
	}
	return rows, nil
}

// dirtyPass allocates size bytes, writes them, launches an empty kernel
// and synchronizes (under the launch model the pages go to the device),
// reads every page back (under the launch model each comes back as a
// write-protected copy), and then times one pass of writes.
func dirtyPass(s *uvm.Session, size int64) (float64, error) {
	a, err := s.MallocManaged(size)
	if err != nil {
		return 0, err
	}
	defer a.Free()
	words, err := uvm.Slice[uint64](a)
	if err != nil {
		return 0, err
	}
	for i := range words {
		words[i] = uint64(i)
	}
	if err := s.Launch(0, nil, "uvm-bench-nothing", 1, nil); err != nil {
		return 0, err
	}
	if err := s.DefaultStreamSynchronize(0); err != nil {
		return 0, err
	}
	var sum uint64
	for i := 0; i < len(words); i += uvm.PageSize / 8 {
		sum += words[i]
	}
	streamSink.Add(sum)
	t0 := time.Now()
	for i := range words {
		words[i] = uint64(i) * 3
	}
	return float64(size) / time.Since(t0).Seconds() / 1e9, nil
}

// ParseModels reads --coherence: fault, launch, or both.
func ParseModels(list string) ([]string, error) {
	var models []string
	for _, m := range strings.Split(list, ",") {
		m = strings.TrimSpace(m)
		if m != "fault" && m != "launch" {
			return nil, fmt.Errorf("--coherence %q: unknown model %q; want fault, launch, or fault,launch", list, m)
		}
		if slices.Contains(models, m) {
			return nil, fmt.Errorf("--coherence %q: %s twice", list, m)
		}
		models = append(models, m)
	}
	return models, nil
}

// printRows prints the launch-and-touch table: each model run, and the
// seed's figures at the sizes it measured.
func (rep *LaunchReport) printRows(w io.Writer) {
	both := len(rep.Rows) > 0 && len(rep.LaunchRows) > 0
	rows := rep.Rows
	if len(rows) == 0 {
		rows = rep.LaunchRows
	}
	if !both {
		model := "fault"
		if len(rep.Rows) == 0 {
			model = "launch"
		}
		fmt.Fprintf(w, "launch and touch, %s coherence model, beside the seed's (us per iteration, Windows 7)\n", model)
		fmt.Fprintf(w, "%10s %12s %14s %10s %10s\n", "KB", "us/iter", "MB/s (back)", "GM200", "GP100")
	} else {
		fmt.Fprintf(w, "launch and touch under both coherence models, beside the seed's (us per iteration, Windows 7)\n")
		fmt.Fprintf(w, "%10s %12s %12s %14s %10s %10s\n", "KB", "fault us", "launch us", "launch MB/s", "GM200", "GP100")
	}
	for i, r := range rows {
		gm, gp := "-", "-"
		if a, b, ok := seedRow(r.KB); ok {
			gm, gp = fmt.Sprintf("%.0f", a), fmt.Sprintf("%.1f", b)
		}
		if !both {
			fmt.Fprintf(w, "%10d %12.2f %14s %10s %10s\n", r.KB, r.USPerIter, mbps(r.MBps), gm, gp)
			continue
		}
		l := rep.LaunchRows[i]
		fmt.Fprintf(w, "%10d %12.2f %12.2f %14s %10s %10s\n", r.KB, r.USPerIter, l.USPerIter, mbps(l.MBps), gm, gp)
	}
	if len(rep.DirtyTracking) > 0 {
		fmt.Fprintf(w, "\ndirty tracking: one pass of 8-byte writes over pages the host got back from the device\n")
		for _, d := range rep.DirtyTracking {
			fmt.Fprintf(w, "%22s %8.2f GB/s  %.2f of untracked\n", d.Tracking, d.GBps, d.Ratio)
		}
	}
}

func mbps(v *float64) string {
	if v == nil {
		return "-"
	}
	return fmt.Sprintf("%.1f", *v)
}
