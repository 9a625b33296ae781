package bench

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/softuvm/softuvm/internal/bench/workloads"
	"github.com/softuvm/softuvm/uvm"
)

// The benchmarks that time real programs (`uvm bench run`, `uvm bench
// cliff`) run each program several ways, its variants, alternating, and
// take medians: alternateVariants.

// benchTiming is what alternateVariants measures of one variant: the
// wall times of its measured runs and their median, and why it was
// dropped if it was.
type benchTiming struct {
	Name    string    `json:"name"`
	Seconds float64   `json:"seconds"`
	Runs    []float64 `json:"seconds_runs"`
	// Failed: the variant was dropped (timed out, failed, or its output
	// differed from the reference run's), with the reason; its figures
	// are those of the runs before.
	Failed   string `json:"failed,omitempty"`
	TimedOut bool   `json:"timed_out,omitempty"`
}

func (t *benchTiming) ok() bool { return t.Failed == "" && len(t.Runs) > 0 }

// serverFigures is what the server of a run under uvm run did, from its
// --stats-json report: faults served (every kind), pages evicted, bytes
// copied each way.
type serverFigures struct {
	Faults            uint64 `json:"faults,omitempty"`
	EvictedPages      uint64 `json:"evicted_pages,omitempty"`
	HostToDeviceBytes uint64 `json:"host_to_device_bytes,omitempty"`
	DeviceToHostBytes uint64 `json:"device_to_host_bytes,omitempty"`
}

func (f *serverFigures) read(st *workloads.RunStats) {
	*f = serverFigures{Faults: st.Faults(), EvictedPages: st.EvictedPages, HostToDeviceBytes: st.HostToDeviceBytes, DeviceToHostBytes: st.DeviceToHostBytes}
}

// benchVariant runs one variant once into a fresh directory.
type benchVariant struct {
	t   *benchTiming
	run func(ctx context.Context, dir string) (*workloads.Run, error)
	// after reads the variant's own figures of a run: of each run that
	// finished, and of one cut short by its limit (what it did until
	// then, where its Stats were written). May be nil.
	after func(r *workloads.Run)
	// warmedUp: the variant's warm-up run was made before (the plain
	// run that every output is checked against, say).
	warmedUp bool
}

// alternateVariants warms every variant up once (round 0, but those
// warmedUp), then runs rounds of every variant, each variant taking each
// place in turn, each run limited to limit and its output checked
// (Check) and compared with ref's (Compare). A variant that fails, times
// out or differs is dropped, with the reason in its Failed. The
// variants' Seconds are the medians of their measured runs. The error is
// for an interruption (ctx) only.
func alternateVariants(ctx context.Context, dir, name string, w *workloads.Workload, ref *workloads.Run, limit time.Duration, runs int,
	variants []benchVariant, progress Progress) error {
	for r := 0; r <= runs; r++ {
		for i := range variants {
			vs := variants[(i+r)%len(variants)]
			if vs.t.Failed != "" || (r == 0 && vs.warmedUp) {
				continue
			}
			rdir := filepath.Join(dir, fmt.Sprintf("%s-%d", strings.NewReplacer(" ", "_", "/", "_").Replace(vs.t.Name), r))
			rctx, cancel := context.WithTimeout(ctx, limit)
			res, err := vs.run(rctx, rdir)
			timedOut := rctx.Err() == context.DeadlineExceeded
			cancel()
			if ctx.Err() != nil {
				return fmt.Errorf("interrupted: %w", ctx.Err())
			}
			what := "warm-up"
			if r > 0 {
				what = fmt.Sprintf("run %d", r)
			}
			fail := func(reason string) {
				vs.t.Failed = reason
				progress("%s %s %s: dropped: %s", name, what, vs.t.Name, reason)
			}
			switch {
			case timedOut:
				vs.t.TimedOut = true
				until := ""
				if res != nil && res.Stats != nil {
					if vs.after != nil {
						vs.after(res) // what it did until then
					}
					until = fmt.Sprintf(": until then host to device %s, back %s", humanSize(res.Stats.HostToDeviceBytes), humanSize(res.Stats.DeviceToHostBytes))
				}
				fail(fmt.Sprintf("did not finish within %v (%s)%s", limit.Round(time.Second), what, until))
			case err != nil:
				fail(err.Error())
			default:
				err = w.Check(res)
				if err == nil {
					err = w.Compare(ref, res)
				}
				if err != nil {
					fail(err.Error())
					break
				}
				if vs.after != nil {
					vs.after(res)
				}
				if r > 0 {
					vs.t.Runs = append(vs.t.Runs, res.Wall.Seconds())
				}
				extra := ""
				if res.Stats != nil {
					extra = fmt.Sprintf(": host to device %s, back %s", humanSize(res.Stats.HostToDeviceBytes), humanSize(res.Stats.DeviceToHostBytes))
				}
				progress("%s %s %-26s %.3fs%s", name, what, vs.t.Name, res.Wall.Seconds(), extra)
			}
			os.RemoveAll(rdir)
		}
	}
	for _, vs := range variants {
		if len(vs.t.Runs) > 0 {
			vs.t.Seconds = median(vs.t.Runs)
		}
	}
	return nil
}

// printProgramHead starts a program's block of a benchmark's table: its
// name and command line, and why it was skipped where it was (then
// false: there is nothing more to print of it).
func printProgramHead(out io.Writer, name, commandLine, skipped string) bool {
	fmt.Fprintf(out, "\n%s: %s\n", name, commandLine)
	if skipped != "" {
		fmt.Fprintf(out, "  skipped: %s\n", skipped)
		return false
	}
	return true
}

// benchLimit is the limit of each run of a program: timeout where
// given, else factor times its plain warm-up run, at least floor.
func benchLimit(timeout time.Duration, factor float64, floor, plain time.Duration) time.Duration {
	if timeout > 0 {
		return timeout
	}
	return max(floor, time.Duration(factor*float64(plain)))
}

// limitText says what benchLimit made of a report's timeout fields.
func limitText(timeoutSeconds, factor, floorSeconds float64) string {
	if timeoutSeconds > 0 {
		return fmt.Sprintf("%gs", timeoutSeconds)
	}
	return fmt.Sprintf("%gx the plain warm-up run, at least %gs", factor, floorSeconds)
}

// ParseRunSizes reads `uvm bench run`'s --size: a comma list of
// NAME=SIZE, a real program's name and its input's size.
func ParseRunSizes(list string) (map[string]int64, error) {
	return parseProgramSizes(list, workloads.Names(), nil)
}

// parseProgramSizes reads a --size list of NAME=SIZE, each NAME one of
// names, each SIZE above 0 and, where check is given, as it wants.
func parseProgramSizes(list string, names []string, check func(kv, name string, n int64) error) (map[string]int64, error) {
	out := map[string]int64{}
	for _, kv := range strings.Split(list, ",") {
		if kv = strings.TrimSpace(kv); kv == "" {
			continue
		}
		name, text, ok := strings.Cut(kv, "=")
		if !ok || !slices.Contains(names, name) {
			return nil, fmt.Errorf("--size %q: want NAME=SIZE, NAME one of %s", kv, strings.Join(names, ", "))
		}
		n, err := uvm.ParseSize(text)
		if err != nil || n <= 0 {
			return nil, fmt.Errorf("--size %s: want a size above 0 (%v)", kv, err)
		}
		if check != nil {
			if err := check(kv, name, n); err != nil {
				return nil, err
			}
		}
		out[name] = n
	}
	return out, nil
}
