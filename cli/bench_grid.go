package cli

import (
	_ "embed"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"
	"unsafe"

	"github.com/softuvm/softuvm/libuvm"
	"github.com/softuvm/softuvm/policy"
	"github.com/softuvm/softuvm/uvm"
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

// gridReport is what `uvm bench grid --json` prints: for each runtime (C's
// fibers, Go's goroutines) the grid launch against the (tid, nthreads)
// launch, in the same run, medians over rounds whose two variants alternate
// which goes first.
type gridReport struct {
	Machine machineSummary `json:"machine"`
	Rounds  int            `json:"rounds"`
	C       *gridRuntime   `json:"c,omitempty"`
	Go      *gridRuntime   `json:"go,omitempty"`
}

type gridRuntime struct {
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
	Touch []gridTouchRow `json:"touch,omitempty"`
}

type gridTouchRow struct {
	KiB       int     `json:"kib"`
	GridUS    float64 `json:"grid_us"`
	ThreadsUS float64 `json:"threads_us"`
	Ratio     float64 `json:"ratio"`
	GoalMet   bool    `json:"goal_met"`
}

func benchGrid(args []string) error {
	fs := newFlagSet("bench grid", "[--json] [--rounds N] [--reduce-mib M] [--touch-kib 64,1024,...] [--runtime c,go]",
		"Time grid launches (CUDA's blocks, barriers, shared memory) against the (tid, nthreads) launch in the same run, in C (fibers) and Go (goroutines)")
	asJSON := fs.Bool("json", false, "print one JSON object")
	rounds := fs.Int("rounds", 9, "rounds of each measurement (median), the two variants alternating which goes first")
	reduceMiB := fs.Int("reduce-mib", 64, "MiB of floats the reductions sum")
	touchList := fs.String("touch-kib", "64,1024,16384", "buffer sizes of the launch-and-touch rows, in KiB (multiples of 4)")
	runtimes := fs.String("runtime", "c,go", "which runtimes: c (libuvm's fibers), go (goroutines), or both")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if *rounds < 1 || *reduceMiB < 1 {
		return fmt.Errorf("want --rounds >= 1 and --reduce-mib >= 1 (have %d, %d)", *rounds, *reduceMiB)
	}
	var touch []int
	for _, f := range strings.Split(*touchList, ",") {
		kib, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || kib < 4 || kib%4 != 0 {
			return fmt.Errorf("--touch-kib %q: %q is not a size in KiB, a multiple of 4", *touchList, f)
		}
		touch = append(touch, kib)
	}
	wantC, wantGo := false, false
	for _, r := range strings.Split(*runtimes, ",") {
		switch strings.TrimSpace(r) {
		case "c":
			wantC = true
		case "go":
			wantGo = true
		default:
			return fmt.Errorf("--runtime %q: want c, go or c,go", *runtimes)
		}
	}
	progress := func(format string, a ...any) { fmt.Fprintf(os.Stderr, "uvm bench: "+format+"\n", a...) }
	rep := gridReport{Machine: machineSummary{CPUs: cpus(), Kernel: kernelRelease(), Go: goVersion()}, Rounds: *rounds}
	arena := max(int64(256<<20), 2*int64(*reduceMiB)<<20, 2*int64(touch[len(touch)-1])<<10)
	if wantC {
		progress("C: building the benchmark against libuvm (once per version), then null launches, barriers, a %d MiB reduction, launch and touch of %v KiB", *reduceMiB, touch)
		self, err := os.Executable()
		if err != nil {
			return err
		}
		c, err := gridBenchC(self, *rounds, *reduceMiB, touch, arena)
		if err != nil {
			return err
		}
		rep.C = c
	}
	if wantGo {
		progress("Go: null launches, barriers, a %d MiB reduction, launch and touch of %v KiB", *reduceMiB, touch)
		g, err := gridBenchGo(*rounds, *reduceMiB, touch, arena)
		if err != nil {
			return err
		}
		rep.Go = g
	}
	if *asJSON {
		return writeJSON(os.Stdout, rep)
	}
	fmt.Printf("machine: %d CPUs, Linux %s, %s; medians of %d rounds\n", rep.Machine.CPUs, rep.Machine.Kernel, rep.Machine.Go, rep.Rounds)
	for _, rt := range []struct {
		name string
		r    *gridRuntime
	}{{"C (fibers)", rep.C}, {"Go (goroutines)", rep.Go}} {
		if rt.r != nil {
			printGridRuntime(rt.name, rt.r)
		}
	}
	return nil
}

func printGridRuntime(name string, r *gridRuntime) {
	met := func(ok bool) string {
		if ok {
			return "met"
		}
		return "NOT met"
	}
	fmt.Printf("\n%s, %d workers:\n", name, r.Workers)
	fmt.Printf("  null launch + synchronize: grid %.2f us, threads %.2f us, ratio %.2f (goal <= %.1f: %s)\n", r.NullGridUS, r.NullThreadsUS, r.NullRatio, gridNullGoal, met(r.NullGoalMet))
	fmt.Printf("  barrier, per barrier and thread:")
	for _, k := range []string{"32", "256", "1024"} {
		if v, ok := r.BarrierNSPerThread[k]; ok {
			fmt.Printf(" %s threads %.1f ns;", k, v)
		}
	}
	fmt.Printf("\n  reduction of %d MiB: %d blocks of 256 threads in shared memory %.2f ms, one thread a worker %.2f ms, ratio %.2f (goal <= %.1f: %s)\n",
		r.ReduceMiB, r.ReduceBlocks, r.ReduceGridMS, r.ReduceThreadsMS, r.ReduceRatio, gridReduceGoal, met(r.ReduceGoalMet))
	for _, t := range r.Touch {
		fmt.Printf("  launch and touch %6d KiB: grid %9.1f us, threads %9.1f us, ratio %.2f (goal <= %.1f: %s)\n", t.KiB, t.GridUS, t.ThreadsUS, t.Ratio, gridTouchGoal, met(t.GoalMet))
	}
}

// finish computes the ratios and whether each goal is met.
func (r *gridRuntime) finish() {
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
func gridBenchC(uvmBin string, rounds, reduceMiB int, touch []int, arena int64) (*gridRuntime, error) {
	lib, err := libuvm.StaticDir(libuvm.Options{Building: func(dir string) {
		fmt.Fprintf(os.Stderr, "uvm bench: building libuvm.a into %s (once per version)\n", dir)
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
		Touch           []gridTouchRow     `json:"touch"`
	}
	if err := json.Unmarshal(out, &raw); err != nil {
		return nil, fmt.Errorf("the grid benchmark's output %q: %v", out, err)
	}
	r := &gridRuntime{Workers: raw.Workers, NullGridUS: raw.NullGridUS, NullThreadsUS: raw.NullThreadsUS, BarrierNSPerThread: raw.Barrier,
		ReduceMiB: raw.ReduceMiB, ReduceBlocks: raw.ReduceBlocks, ReduceGridMS: raw.ReduceGridMS, ReduceThreadsMS: raw.ReduceThreadsMS, Touch: raw.Touch}
	r.finish()
	return r, nil
}

// The Go side's kernels: the same work as grid_bench.c's.
func init() {
	uvm.MustRegisterGridKernel("uvm-bench-grid-empty", func(uvm.Thread, []byte) {})
	uvm.MustRegisterGridKernel("uvm-bench-grid-barriers", func(t uvm.Thread, p []byte) {
		for range binary.LittleEndian.Uint32(p) {
			t.SyncThreads()
		}
	})
	// params: input address, floats, partial sums' address.
	uvm.MustRegisterGridKernel("uvm-bench-grid-reduce", func(t uvm.Thread, p []byte) {
		in, n, out := uintptr(binary.LittleEndian.Uint64(p)), int(binary.LittleEndian.Uint64(p[8:])), uintptr(binary.LittleEndian.Uint64(p[16:]))
		threads := int(t.GridDim().X * t.BlockDim().X)
		me := int(t.BlockIdx().X*t.BlockDim().X + t.ThreadIdx().X)
		var sum float64
		for _, v := range uvm.SliceAt[float32](in, n)[n*me/threads : n*(me+1)/threads] {
			sum += float64(v)
		}
		raw := t.Shared()
		s := unsafe.Slice((*float64)(unsafe.Pointer(&raw[0])), t.BlockDim().X)
		s[t.ThreadIdx().X] = sum
		t.SyncThreads()
		for k := t.BlockDim().X / 2; k > 0; k >>= 1 {
			if t.ThreadIdx().X < k {
				s[t.ThreadIdx().X] += s[t.ThreadIdx().X+k]
			}
			t.SyncThreads()
		}
		if t.ThreadIdx().X == 0 {
			uvm.SliceAt[float64](out, int(t.GridDim().X))[t.BlockIdx().X] = s[0]
		}
	})
	uvm.MustRegisterKernel("uvm-bench-grid-reduce-threads", func(tid, nthreads int, p []byte) {
		in, n, out := uintptr(binary.LittleEndian.Uint64(p)), int(binary.LittleEndian.Uint64(p[8:])), uintptr(binary.LittleEndian.Uint64(p[16:]))
		var sum float64
		for _, v := range uvm.SliceAt[float32](in, n)[n*tid/nthreads : n*(tid+1)/nthreads] {
			sum += float64(v)
		}
		uvm.SliceAt[float64](out, nthreads)[tid] = sum
	})
	// params: address, length (as touchKernel's).
	uvm.MustRegisterGridKernel("uvm-bench-grid-touch", func(t uvm.Thread, p []byte) {
		addr, length := uintptr(binary.LittleEndian.Uint64(p)), int64(binary.LittleEndian.Uint64(p[8:]))
		pages := (length + uvm.PageSize - 1) / uvm.PageSize
		threads, me := int64(t.GridDim().X*t.BlockDim().X), int64(t.BlockIdx().X*t.BlockDim().X+t.ThreadIdx().X)
		b := uvm.SliceAt[byte](addr, int(length))
		for pg := pages * me / threads; pg < pages*(me+1)/threads; pg++ {
			b[pg*uvm.PageSize]++
		}
	})
}

// gridBenchGo measures the Go runtime the same way, in this process.
func gridBenchGo(rounds, reduceMiB int, touch []int, arena int64) (*gridRuntime, error) {
	off, err := policy.ParseThrashingSpec("off")
	if err != nil {
		return nil, err
	}
	s, err := oneDeviceSession(arena, off)
	if err != nil {
		return nil, err
	}
	defer s.Close()
	workers, err := s.DeviceGetAttribute(uvm.AttrMultiProcessorCount, 0)
	if err != nil {
		return nil, err
	}
	r := &gridRuntime{Workers: int(workers), BarrierNSPerThread: map[string]float64{}}
	// Each measured step is a launch, its synchronize and what runs in
	// the same iteration (timed, in us), then what checks it (untimed).
	type step func() (float64, error)
	launched := func(launch func() error, during func(), after func() error) step {
		return func() (float64, error) {
			t0 := time.Now()
			if err := launch(); err != nil {
				return 0, err
			}
			if err := s.DeviceSynchronize(0); err != nil {
				return 0, err
			}
			if during != nil {
				during()
			}
			us := float64(time.Since(t0).Nanoseconds()) / 1e3
			if after != nil {
				return us, after()
			}
			return us, nil
		}
	}
	grid := func(name string, blocks, threads, shared int, params []byte) func() error {
		return func() error {
			return s.LaunchGrid(0, nil, name, uvm.LaunchConfig{Grid: uvm.Dim(blocks), Block: uvm.Dim(threads), SharedBytes: shared}, params)
		}
	}
	plain := func(name string, n int, params []byte) func() error {
		return func() error { return s.Launch(0, nil, name, n, params) }
	}
	// pair runs a and b in rounds, alternating which goes first, and
	// returns their medians (after one warm-up round).
	pair := func(a, b step) (float64, float64, error) {
		var ta, tb []float64
		for i := -1; i < rounds; i++ {
			x, y := 0.0, 0.0
			var err error
			if i%2 == 0 {
				if x, err = a(); err == nil {
					y, err = b()
				}
			} else if y, err = b(); err == nil {
				x, err = a()
			}
			if err != nil {
				return 0, 0, err
			}
			if i >= 0 {
				ta, tb = append(ta, x), append(tb, y)
			}
		}
		return median(ta), median(tb), nil
	}
	if r.NullGridUS, r.NullThreadsUS, err = pair(launched(grid("uvm-bench-grid-empty", 1, 1, 0, nil), nil, nil),
		launched(plain("uvm-bench-nothing", 1, nil), nil, nil)); err != nil {
		return nil, err
	}
	const count = 256
	for _, threads := range []int{32, 256, 1024} {
		with, without, err := pair(launched(grid("uvm-bench-grid-barriers", 1, threads, 0, binary.LittleEndian.AppendUint32(nil, count)), nil, nil),
			launched(grid("uvm-bench-grid-barriers", 1, threads, 0, binary.LittleEndian.AppendUint32(nil, 0)), nil, nil))
		if err != nil {
			return nil, err
		}
		r.BarrierNSPerThread[strconv.Itoa(threads)] = (with - without) * 1e3 / count / float64(threads)
	}

	n := reduceMiB << 20 / 4
	in, err := s.MallocManaged(int64(n) * 4)
	if err != nil {
		return nil, err
	}
	defer in.Free()
	blocks := 8 * int(workers)
	partial, err := s.MallocManaged(int64(8 * max(blocks, int(workers))))
	if err != nil {
		return nil, err
	}
	defer partial.Free()
	var want float64
	for i, f := 0, uvm.SliceAt[float32](in.Addr(), n); i < n; i++ {
		f[i] = float32(i%1000) * 0.5
		want += float64(f[i])
	}
	if err := in.Prefetch(0); err != nil {
		return nil, err
	}
	params := binary.LittleEndian.AppendUint64(binary.LittleEndian.AppendUint64(binary.LittleEndian.AppendUint64(nil, uint64(in.Addr())), uint64(n)), uint64(partial.Addr()))
	// check adds the partial sums, and puts them back on the device, as
	// the input is.
	check := func(parts int) func() error {
		return func() error {
			var got float64
			for _, v := range uvm.SliceAt[float64](partial.Addr(), parts) {
				got += v
			}
			if got != want {
				return fmt.Errorf("the reduction summed %v, want %v", got, want)
			}
			return partial.Prefetch(0)
		}
	}
	gridUS, threadsUS, err := pair(launched(grid("uvm-bench-grid-reduce", blocks, 256, 256*8, params), nil, check(blocks)),
		launched(plain("uvm-bench-grid-reduce-threads", int(workers), params), nil, check(int(workers))))
	if err != nil {
		return nil, err
	}
	r.ReduceMiB, r.ReduceBlocks, r.ReduceGridMS, r.ReduceThreadsMS = reduceMiB, blocks, gridUS/1e3, threadsUS/1e3

	for _, kib := range touch {
		buf, err := s.MallocManaged(int64(kib) << 10)
		if err != nil {
			return nil, err
		}
		b := buf.Bytes()
		p := binary.LittleEndian.AppendUint64(binary.LittleEndian.AppendUint64(nil, uint64(buf.Addr())), uint64(kib)<<10)
		// The host's touch is in the iteration's time, as the seed's.
		touchBack := func() {
			for pg := 0; pg < len(b); pg += uvm.PageSize {
				b[pg]++
			}
		}
		g, th, err := pair(launched(grid("uvm-bench-grid-touch", int(workers), 1, 0, p), touchBack, nil), launched(plain(touchKernel, int(workers), p), touchBack, nil))
		if err != nil {
			buf.Free()
			return nil, err
		}
		want := byte(4 * (rounds + 1))
		for pg := 0; pg < len(b); pg += uvm.PageSize {
			if b[pg] != want {
				buf.Free()
				return nil, fmt.Errorf("launch and touch of %d KiB: page %d was touched %d times, want %d", kib, pg/uvm.PageSize, b[pg], want)
			}
		}
		r.Touch = append(r.Touch, gridTouchRow{KiB: kib, GridUS: g, ThreadsUS: th})
		if err := buf.Free(); err != nil {
			return nil, err
		}
	}
	r.finish()
	return r, nil
}
