package bench

import (
	_ "embed"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"

	"github.com/softuvm/softuvm/libuvm"
)

// gridBenchSource is the C side of `uvm bench grid`, built at run time
// against libuvm (libuvm.StaticDir).
//
//go:embed csrc/grid_bench.c
var gridBenchSource string

// The goals of `uvm bench grid` (issue 50): a null grid launch plus
// synchronize at most 1.2 times the thread launch's, a 256-thread block's
// shared-memory reduction at most 1.5 times the same reduction without
// blocks, and launch-and-touch through the grid launch no slower than
// through the thread launch.
const (
	gridNullGoal   = 1.2
	gridReduceGoal = 1.5
	gridTouchGoal  = 1.0
)

// GridReport is what `uvm bench grid` measured, its JSON what --json
// prints: for each runtime (C's fibers, Go's goroutines) the grid launch
// against the (tid, nthreads) launch, in the same run, medians over
// rounds whose two variants alternate which goes first.
type GridReport struct {
	Machine Machine      `json:"machine"`
	Rounds  int          `json:"rounds"`
	C       *GridRuntime `json:"c,omitempty"`
	Go      *GridRuntime `json:"go,omitempty"`
}

// GridRuntime is one runtime's figures.
type GridRuntime struct {
	Workers int `json:"workers"`
	// An empty kernel as one block of one thread, and as one thread,
	// plus a synchronize.
	NullGridUS    float64 `json:"null_grid_us"`
	NullThreadsUS float64 `json:"null_threads_us"`
	NullRatio     float64 `json:"null_ratio"`
	NullGoalMet   bool    `json:"null_goal_met"`
	// One block waiting at 256 barriers, less the same block without
	// them, per barrier and thread, by block size.
	BarrierNSPerThread map[string]float64 `json:"barrier_ns_per_thread"`
	// The sum of ReduceMiB of floats on the device: blocks of 256
	// threads reducing in shared memory, against one thread per worker.
	ReduceMiB       int     `json:"reduce_mib"`
	ReduceBlocks    int     `json:"reduce_blocks"`
	ReduceGridMS    float64 `json:"reduce_grid_ms"`
	ReduceThreadsMS float64 `json:"reduce_threads_ms"`
	ReduceRatio     float64 `json:"reduce_ratio"`
	ReduceGoalMet   bool    `json:"reduce_goal_met"`
	// The seed's launch and touch, per iteration, both ways.
	Touch []GridTouchRow `json:"touch,omitempty"`
}

// GridTouchRow is the seed's launch and touch of one size, both ways.
type GridTouchRow struct {
	KiB       int     `json:"kib"`
	GridUS    float64 `json:"grid_us"`
	ThreadsUS float64 `json:"threads_us"`
	Ratio     float64 `json:"ratio"`
	GoalMet   bool    `json:"goal_met"`
}

// GridOptions are what `uvm bench grid` measures: its flags.
type GridOptions struct {
	Rounds    int   // rounds of each measurement, the two variants alternating which goes first
	ReduceMiB int   // MiB of floats the reductions sum
	TouchKiB  []int // buffer sizes of the launch-and-touch rows, in KiB, multiples of 4
	C, Go     bool  // which runtimes: libuvm's fibers, goroutines
	Progress  Progress
}

// Grid is `uvm bench grid`: grid launches (blocks, barriers, shared
// memory) against the (tid, nthreads) launch of the same work in the
// same run, in C (a program built at run time against libuvm) and in Go
// (in this process).
func Grid(o GridOptions) (*GridReport, error) {
	progress := o.Progress.orQuiet()
	rep := &GridReport{Machine: ThisMachine(), Rounds: o.Rounds}
	arena := max(int64(256<<20), 2*int64(o.ReduceMiB)<<20, 2*int64(o.TouchKiB[len(o.TouchKiB)-1])<<10)
	if o.C {
		progress("C: building the benchmark against libuvm (once per version), then null launches, barriers, a %d MiB reduction, launch and touch of %v KiB", o.ReduceMiB, o.TouchKiB)
		self, err := os.Executable()
		if err != nil {
			return nil, err
		}
		if rep.C, err = gridBenchC(self, o.Rounds, o.ReduceMiB, o.TouchKiB, arena, progress); err != nil {
			return nil, err
		}
	}
	if o.Go {
		progress("Go: null launches, barriers, a %d MiB reduction, launch and touch of %v KiB", o.ReduceMiB, o.TouchKiB)
		g, err := gridBenchGo(o.Rounds, o.ReduceMiB, o.TouchKiB, arena)
		if err != nil {
			return nil, err
		}
		rep.Go = g
	}
	return rep, nil
}

// Print writes the report: each runtime's figures against the goals.
func (r *GridReport) Print(w io.Writer) {
	fmt.Fprintf(w, "machine: %d CPUs, Linux %s, %s; medians of %d rounds\n", r.Machine.CPUs, r.Machine.Kernel, r.Machine.Go, r.Rounds)
	for _, rt := range []struct {
		name string
		r    *GridRuntime
	}{{"C (fibers)", r.C}, {"Go (goroutines)", r.Go}} {
		if rt.r != nil {
			rt.r.print(w, rt.name)
		}
	}
}

func (r *GridRuntime) print(w io.Writer, name string) {
	met := func(ok bool) string {
		if ok {
			return "met"
		}
		return "NOT met"
	}
	fmt.Fprintf(w, "\n%s, %d workers:\n", name, r.Workers)
	fmt.Fprintf(w, "  null launch + synchronize: grid %.2f us, threads %.2f us, ratio %.2f (goal <= %.1f: %s)\n", r.NullGridUS, r.NullThreadsUS, r.NullRatio, gridNullGoal, met(r.NullGoalMet))
	fmt.Fprintf(w, "  barrier, per barrier and thread:")
	for _, k := range []string{"32", "256", "1024"} {
		if v, ok := r.BarrierNSPerThread[k]; ok {
			fmt.Fprintf(w, " %s threads %.1f ns;", k, v)
		}
	}
	fmt.Fprintf(w, "\n  reduction of %d MiB: %d blocks of 256 threads in shared memory %.2f ms, one thread a worker %.2f ms, ratio %.2f (goal <= %.1f: %s)\n",
		r.ReduceMiB, r.ReduceBlocks, r.ReduceGridMS, r.ReduceThreadsMS, r.ReduceRatio, gridReduceGoal, met(r.ReduceGoalMet))
	for _, t := range r.Touch {
		fmt.Fprintf(w, "  launch and touch %6d KiB: grid %9.1f us, threads %9.1f us, ratio %.2f (goal <= %.1f: %s)\n", t.KiB, t.GridUS, t.ThreadsUS, t.Ratio, gridTouchGoal, met(t.GoalMet))
	}
}

// finish computes the ratios and whether each goal is met.
func (r *GridRuntime) finish() {
	r.NullRatio = r.NullGridUS / r.NullThreadsUS
	r.NullGoalMet = r.NullRatio <= gridNullGoal
	r.ReduceRatio = r.ReduceGridMS / r.ReduceThreadsMS
	r.ReduceGoalMet = r.ReduceRatio <= gridReduceGoal
	for i := range r.Touch {
		t := &r.Touch[i]
		t.Ratio = t.GridUS / t.ThreadsUS
		t.GoalMet = t.Ratio <= gridTouchGoal
	}
}

// gridBenchC builds csrc/grid_bench.c against libuvm and runs it on a
// private server of one device, started from the uvm binary uvmBin.
func gridBenchC(uvmBin string, rounds, reduceMiB int, touch []int, arena int64, progress Progress) (*GridRuntime, error) {
	lib, err := libuvm.StaticDir(libuvm.Options{Building: func(dir string) {
		progress("building libuvm.a into %s (once per version)", dir)
	}})
	if err != nil {
		return nil, fmt.Errorf("the grid benchmark's C side links with libuvm, built at run time: %w", err)
	}
	tmp, err := os.MkdirTemp("", "softuvm-bench-grid-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(tmp)
	src, prog := filepath.Join(tmp, "grid_bench.c"), filepath.Join(tmp, "grid_bench")
	if err := os.WriteFile(src, []byte(gridBenchSource), 0o644); err != nil {
		return nil, err
	}
	cc := os.Getenv("CC")
	if cc == "" {
		cc = "cc"
	}
	if out, err := exec.Command(cc, "-O2", "-std=gnu11", "-I", filepath.Join(lib, "include"), "-o", prog, src, filepath.Join(lib, "libuvm.a"), "-pthread", "-lm").CombinedOutput(); err != nil {
		return nil, fmt.Errorf("build the grid benchmark: %v\n%s", err, out)
	}
	args := []string{strconv.Itoa(rounds), strconv.Itoa(reduceMiB)}
	for _, kib := range touch {
		args = append(args, strconv.Itoa(kib))
	}
	cmd := exec.Command(prog, args...)
	cmd.Env = append(os.Environ(), "UVM_BIN="+uvmBin, "UVM_SERVER=private", "UVM_DEVICES=1", "UVM_ARENA_SIZE="+strconv.FormatInt(arena, 10), "UVM_THRASHING=off")
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("the grid benchmark: %v", err)
	}
	var raw struct {
		Workers         int                `json:"workers"`
		NullGridUS      float64            `json:"null_grid_us"`
		NullThreadsUS   float64            `json:"null_threads_us"`
		Barrier         map[string]float64 `json:"barrier_ns_per_thread"`
		ReduceMiB       int                `json:"reduce_mib"`
		ReduceBlocks    int                `json:"reduce_blocks"`
		ReduceGridMS    float64            `json:"reduce_grid_ms"`
		ReduceThreadsMS float64            `json:"reduce_threads_ms"`
		Touch           []GridTouchRow     `json:"touch"`
	}
	if err := json.Unmarshal(out, &raw); err != nil {
		return nil, fmt.Errorf("the grid benchmark's output %q: %v", out, err)
	}
	r := &GridRuntime{Workers: raw.Workers, NullGridUS: raw.NullGridUS, NullThreadsUS: raw.NullThreadsUS, BarrierNSPerThread: raw.Barrier,
		ReduceMiB: raw.ReduceMiB, ReduceBlocks: raw.ReduceBlocks, ReduceGridMS: raw.ReduceGridMS, ReduceThreadsMS: raw.ReduceThreadsMS, Touch: raw.Touch}
	r.finish()
	return r, nil
}
