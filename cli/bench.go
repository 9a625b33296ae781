package cli

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/softuvm/softuvm/internal/bench"
	"github.com/softuvm/softuvm/internal/bench/workloads"
	"github.com/softuvm/softuvm/internal/config"
	"github.com/softuvm/softuvm/policy"
	"github.com/softuvm/softuvm/uvm"
)

// `uvm bench NAME`: each benchmark's flags, read into its options
// (internal/bench measures), and its report printed, as one JSON object
// with --json.

func runBench(args []string) error {
	if len(args) == 0 || strings.HasPrefix(args[0], "-") {
		fmt.Fprintln(os.Stderr, "Usage: uvm bench faults|launch|grid|memcpy|access|restart|oversub|run|cliff|soak [flags]\n\nBenchmarks: faults, launch, grid, memcpy, access, restart, oversub, run, cliff, soak.")
		if len(args) > 0 && (args[0] == "-h" || args[0] == "--help" || args[0] == "-help") {
			return nil
		}
		return errUsage
	}
	switch args[0] {
	case "faults":
		return benchFaults(args[1:])
	case "launch":
		return benchLaunch(args[1:])
	case "grid":
		return benchGrid(args[1:])
	case "memcpy":
		return benchMemcpy(args[1:])
	case "access":
		return benchAccess(args[1:])
	case "restart":
		return benchRestart(args[1:])
	case "oversub":
		return benchOversub(args[1:])
	case "run":
		return benchRun(args[1:])
	case "cliff":
		return benchCliff(args[1:])
	case "soak":
		return benchSoak(args[1:])
	}
	return fmt.Errorf("unknown benchmark %q: want faults, launch, grid, memcpy, access, restart, oversub, run, cliff or soak", args[0])
}

// benchProgress is every benchmark's progress: a line on standard
// error, so that --json's object is alone on standard output.
func benchProgress(format string, a ...any) { fmt.Fprintf(os.Stderr, "uvm bench: "+format+"\n", a...) }

// printReport prints a benchmark's report: as JSON with --json, else its
// table.
func printReport(asJSON bool, rep interface{ Print(io.Writer) }) error {
	if asJSON {
		return writeJSON(os.Stdout, rep)
	}
	rep.Print(os.Stdout)
	return nil
}

func benchFaults(args []string) error {
	fs := newFlagSet("bench faults", "[--json] [--runs N] [--pages N] [--size SIZE] [--cfloor PATH]",
		"Measure one-page fault latency (against a minimal C handler), first-touch cost (against anonymous memory) and device-to-host copy bandwidth (a copy out of managed memory on a device, against the same copy from a warm buffer). Figures are medians over runs, after a warm-up")
	asJSON := fs.Bool("json", false, "print one JSON object")
	runs := fs.Int("runs", 7, "measured runs of each experiment")
	pages := fs.Int("pages", 4096, "pages touched per fault-latency run")
	sizeText := fs.String("size", "256MiB", "memory per first-touch and device-to-host run")
	cfloor := fs.String("cfloor", "", "the uvm-cfloor program (default: next to this binary, then $PATH)")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	size, err := uvm.ParseSize(*sizeText)
	if err != nil {
		return fmt.Errorf("--size: %w", err)
	}
	if *runs < 1 || *pages < 100 || size < 16*uvm.PageSize {
		return fmt.Errorf("want --runs >= 1, --pages >= 100 and --size >= 64KiB")
	}
	rep, err := bench.Faults(bench.FaultsOptions{Runs: *runs, Pages: *pages, Size: size, CFloor: *cfloor, Progress: benchProgress})
	if err != nil {
		return err
	}
	return printReport(*asJSON, rep)
}

func benchLaunch(args []string) error {
	fs := newFlagSet("bench launch", "[--json] [--max-kb N] [--seconds S] [--schedule auto,spin,yield,blocking] [--plot DIR]",
		"Reproduce the launch-and-touch experiment (a kernel touches a managed buffer, the host touches it back), and time a null launch under each schedule flag against a pipe round trip")
	asJSON := fs.Bool("json", false, "print one JSON object")
	schedule := fs.String("schedule", "auto,spin,yield,blocking", "schedule flags (SetDeviceFlags) to time the null launch under, a row each: a list of auto, spin, yield and blocking; the launch-and-touch rows run under auto, the default")
	rounds := fs.Int("rounds", 5, "rounds of the null launch and pipe round trip, taken in turn (median of all)")
	coherence := fs.String("coherence", "fault", "coherence models to run the launch-and-touch rows under: fault, launch, or fault,launch (then side by side, with the seed's GM200 and GP100 figures and the cost of dirty tracking)")
	dirtySize := fs.String("dirty-size", "64MiB", "memory the dirty-tracking measurement writes (with --coherence launch)")
	maxKB := fs.Int("max-kb", 65536, "largest buffer, in KiB")
	seconds := fs.Float64("seconds", 0.3, "time spent on each size")
	oversubArena := fs.String("oversub-arena", "64MiB", "arena of the oversubscription run, which streams through twice as much")
	runs := fs.Int("runs", 5, "runs of the oversubscription stream (median)")
	thrashing := fs.String("thrashing", "off", "thrashing detection of the server (on, off, or settings); off measures migration every iteration, as the experiment means to")
	plotDir := fs.String("plot", "", "also draw the tables into `DIR` (created if missing), as PNG and SVG: launch-touch (us per iteration against the size touched, log-log, each coherence model run beside the H200 and the seed's GM200 and GP100 at the sizes run) and launch-null (the null launch under each schedule against the pipe round trip and the reference GPUs)")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	thrash, err := policy.ParseThrashingSpec(*thrashing)
	if err != nil {
		return fmt.Errorf("--thrashing: %w", err)
	}
	arena, err := uvm.ParseSize(*oversubArena)
	if err != nil || arena < uvm.BlockSize || *runs < 1 {
		return fmt.Errorf("want --oversub-arena of at least 2 MiB and --runs >= 1 (have %q, %d)", *oversubArena, *runs)
	}
	if *maxKB < 4 || *seconds <= 0 || *rounds < 1 {
		return fmt.Errorf("want --max-kb >= 4, --seconds > 0 and --rounds >= 1")
	}
	schedules, err := bench.ParseSchedules(*schedule)
	if err != nil {
		return err
	}
	models, err := bench.ParseModels(*coherence)
	if err != nil {
		return err
	}
	dirtyBytes, err := uvm.ParseSize(*dirtySize)
	if err != nil || dirtyBytes < uvm.PageSize {
		return fmt.Errorf("--dirty-size %q: want a size of at least a page", *dirtySize)
	}
	rep, err := bench.Launch(bench.LaunchOptions{Schedules: schedules, Rounds: *rounds, Models: models, DirtySize: dirtyBytes,
		MaxKB: *maxKB, PerSize: time.Duration(*seconds * float64(time.Second)), OversubArena: arena, Runs: *runs, Thrashing: thrash,
		PlotDir: *plotDir, Progress: benchProgress})
	if err != nil {
		return err
	}
	return printReport(*asJSON, rep)
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
	rep, err := bench.Grid(bench.GridOptions{Rounds: *rounds, ReduceMiB: *reduceMiB, TouchKiB: touch, C: wantC, Go: wantGo, Progress: benchProgress})
	if err != nil {
		return err
	}
	return printReport(*asJSON, rep)
}

func benchMemcpy(args []string) error {
	fs := newFlagSet("bench memcpy", "[--json] [--size SIZE] [--runs N] [--producers LIST] [--plot DIR]",
		"Measure the copy engine: Memcpy to device memory and back and Prefetch both ways against plain memcpy, how the copy scales with producer threads, and from which size the engine wins")
	asJSON := fs.Bool("json", false, "print one JSON object")
	sizeText := fs.String("size", "1GiB", "bytes per transfer")
	runs := fs.Int("runs", 5, "measured runs of each transfer (median)")
	producersText := fs.String("producers", "", "comma list of producer counts to time (default: 1, 2, 4, ... up to the CPUs)")
	plotDir := fs.String("plot", "", "also draw the sizes sweep (a single-thread copy between host buffers and Memcpy each way, each timed at 64 KiB, 256 KiB, ... up to --size) into `DIR` (created if missing) as copy-sizes.png and copy-sizes.svg, GB/s against the copy's size; it also sweeps Memcpy with the engine forced off (one thread) and forced on (from 1 byte, a producer per CPU), drawn beside the calibration's choice and given in --json as sizes_one_thread and sizes_engine_forced")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	size, err := uvm.ParseSize(*sizeText)
	if err != nil {
		return fmt.Errorf("--size: %w", err)
	}
	if size < 4<<20 || *runs < 1 {
		return fmt.Errorf("want --size of at least 4 MiB and --runs >= 1 (have %q, %d)", *sizeText, *runs)
	}
	producers, err := parseProducers(*producersText)
	if err != nil {
		return err
	}
	rep, err := bench.Memcpy(bench.MemcpyOptions{Size: size, Runs: *runs, Producers: producers, PlotDir: *plotDir, Progress: benchProgress})
	if err != nil {
		return err
	}
	return printReport(*asJSON, rep)
}

func benchAccess(args []string) error {
	fs := newFlagSet("bench access", "[--json] [--runs N] [--size SIZE] [--period D] [--access-counting MODE]",
		"Measure the access counters: their cost per fault, a kernel streaming over remotely mapped memory before and after delayed migration, and the anatomy of a fault")
	asJSON := fs.Bool("json", false, "print one JSON object")
	runs := fs.Int("runs", 7, "launches timed after migration (median)")
	faultRounds := fs.Int("fault-rounds", 21, "rounds of each fault-cost condition (median)")
	sizeText := fs.String("size", "256MiB", "the remotely mapped range")
	period := fs.Duration("period", 50*time.Millisecond, "hint-fault period of the streaming run (the server's default is 1s)")
	mode := fs.String("access-counting", config.AccessCountingAuto, "access counting of the streaming run: auto, ebpf or user")
	faultPages := fs.Int("fault-pages", 65536, "minor faults per fault-cost round")
	timeout := fs.Duration("timeout", 2*time.Minute, "give up waiting for delayed migration after this long")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	size, err := uvm.ParseSize(*sizeText)
	if err != nil {
		return fmt.Errorf("--size: %w", err)
	}
	if *runs < 1 || *faultRounds < 1 || size < 64<<10 || *faultPages < 64 || *period < time.Millisecond {
		return fmt.Errorf("want --runs >= 1, --fault-rounds >= 1, --size >= 64KiB, --fault-pages >= 64 and --period >= 1ms")
	}
	if *mode != config.AccessCountingAuto && *mode != config.AccessCountingEBPF && *mode != config.AccessCountingUser {
		return fmt.Errorf("--access-counting %q: want auto, ebpf or user", *mode)
	}
	rep, err := bench.Access(bench.AccessOptions{Runs: *runs, FaultRounds: *faultRounds, FaultPages: *faultPages, Size: size,
		Period: *period, AccessCounting: *mode, Timeout: *timeout, Progress: benchProgress})
	if err != nil {
		return err
	}
	return printReport(*asJSON, rep)
}

func benchRestart(args []string) error {
	fs := newFlagSet("bench restart", "[--json] [--kills N] [--size SIZE]",
		"Kill a private server N times under a client holding SIZE of managed memory (half on the host, half on device 0): the pause a client sees from the kill to an answer, the new server's rebuild of residency from the files, and every byte checked after")
	asJSON := fs.Bool("json", false, "print one JSON object")
	kills := fs.Int("kills", 20, "servers killed")
	sizeText := fs.String("size", "512MiB", "managed memory the servers hold")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	size, err := uvm.ParseSize(*sizeText)
	if err != nil {
		return fmt.Errorf("--size: %w", err)
	}
	if *kills < 1 || size < 1<<20 {
		return fmt.Errorf("want --kills >= 1 and --size >= 1MiB")
	}
	rep, err := bench.Restart(bench.RestartOptions{Kills: *kills, Size: size, Progress: benchProgress})
	if err != nil {
		return err
	}
	return printReport(*asJSON, rep)
}

func benchOversub(args []string) error {
	fs := newFlagSet("bench oversub", "[--json] [--budget SIZE] [--size SIZE] [--sweeps N] [--runs N] [--no-cgroup] [--uvm PATH]",
		"Sweep an array larger than a host budget (by default three times it) with a C program, three ways in alternation: plain, under `uvm run --host-budget BUDGET`, "+
			"and plain in a memory cgroup (v1 or v2) limited to BUDGET with zram swap, which the benchmark sets up and tears down where the machine allows it (root, a memory controller, zram). "+
			"Each run checks every word of the array. Reports medians of each variant's sweep and wall times and the ratios managed/unmanaged (goal at most 2.5) and managed/cgroup (goal below 1)")
	asJSON := fs.Bool("json", false, "print one JSON object")
	budgetText := fs.String("budget", "16MiB", "the host budget of the managed variant, and the memory limit of the cgroup")
	sizeText := fs.String("size", "", "the array (default: three times --budget)")
	sweeps := fs.Int("sweeps", 30, "sweeps over the array, each reading and writing every 8-byte word")
	runs := fs.Int("runs", 3, "measured runs of each variant (median), after a warm-up run of each")
	noCgroup := fs.Bool("no-cgroup", false, "skip the cgroup variant (it adds a swap device to the machine while it runs)")
	uvmBin := fs.String("uvm", "", "the uvm binary that runs the managed variant (default: this one)")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	budget, err := uvm.ParseSize(*budgetText)
	if err != nil {
		return fmt.Errorf("--budget: %w", err)
	}
	if budget < 1<<20 {
		return fmt.Errorf("--budget %s: want at least 1MiB (smaller allocations are not managed by uvm run)", *budgetText)
	}
	size := 3 * budget
	if *sizeText != "" {
		if size, err = uvm.ParseSize(*sizeText); err != nil {
			return fmt.Errorf("--size: %w", err)
		}
		if size <= budget {
			return fmt.Errorf("--size %s: want more than --budget %s, or nothing is oversubscribed", *sizeText, *budgetText)
		}
	}
	if *sweeps < 1 {
		return fmt.Errorf("--sweeps %d: want at least 1", *sweeps)
	}
	if *runs < 1 {
		return fmt.Errorf("--runs %d: want at least 1", *runs)
	}
	self, err := managedVariantsBinary(*uvmBin, func() error { return nil })
	if err != nil {
		return err
	}
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
	defer signal.Stop(sigs)
	rep, err := bench.Oversub(bench.OversubOptions{Budget: budget, Size: size, Sweeps: *sweeps, Runs: *runs, UVMBin: self, NoCgroup: *noCgroup,
		Progress: benchProgress, Interruptions: sigs})
	if err != nil {
		return err
	}
	return printReport(*asJSON, rep)
}

func benchRun(args []string) error {
	fs := newFlagSet("bench run", "[--json] [--programs LIST] [--budget-fraction F] [--eviction LIST] [--runs N] [--size NAME=SIZE,...] [--timeout D] [--no-cgroup] [--uvm PATH] [--trace DIR]",
		"Run the real programs of internal/bench/workloads ("+strings.Join(workloads.Names(), ", ")+") three ways, alternating, after a warm-up run of each way: "+
			"plain; under `uvm run --host-budget B`, where B is --budget-fraction of the plain run's peak RSS (the program's own, measured through a small C wrapper built at run time with $CC, cc or gcc; rounded up to a MiB, at least 4 MiB), once per eviction policy of --eviction; "+
			"and plain in a memory cgroup (v1 or v2) limited to B with zram swap, set up and torn down as `uvm bench oversub` does (root). Every run's output is checked against the plain run's. "+
			"Reports the median wall times, their ratios to plain (goal: at most 3) and to the cgroup (goal: below 1), and the bytes moved each way")
	asJSON := fs.Bool("json", false, "print one JSON object")
	programs := fs.String("programs", "all", "the programs to run, a comma list of "+strings.Join(workloads.Names(), ", "))
	fraction := fs.Float64("budget-fraction", 0.25, "the host budget (and the cgroup's limit) as a fraction of the plain run's peak RSS")
	evictions := fs.String("eviction", "lru,"+policy.DefaultEviction, "eviction policies, a comma list: each runs the programs under uvm run --eviction POLICY, a variant of its own (by default the old default, lru, against the new)")
	runs := fs.Int("runs", 3, "measured runs of each variant (median), after a warm-up run of each")
	timeout := fs.Duration("timeout", 0, "the limit of each run (default: 10 times the plain warm-up run, at least 20s); a variant that passes it is dropped for that program")
	noCgroup := fs.Bool("no-cgroup", false, "skip the cgroup variant (it adds a swap device to the machine while it runs)")
	uvmBin := fs.String("uvm", "", "the uvm binary that runs the managed variants (default: this one)")
	traceDir := fs.String("trace", "", "record the managed variants' runs to DIR/PROGRAM-EVICTION.uvmtrace (the last run's stays; a run cut short by its limit leaves a trace cut short, which still replays), for uvm trace replay and uvm lab score; recording adds a few percent to the managed times")
	sizes := fs.String("size", "", "input sizes of some programs, a comma list of NAME=SIZE (default: each program's own, 0.5-3 s plain)")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	progs, err := workloads.Select(*programs)
	if err != nil {
		return fmt.Errorf("--programs: %w", err)
	}
	if *fraction <= 0 || *fraction > 1 {
		return fmt.Errorf("--budget-fraction %v: want more than 0 and at most 1", *fraction)
	}
	if *runs < 1 {
		return fmt.Errorf("--runs %d: want at least 1", *runs)
	}
	if *timeout < 0 {
		return fmt.Errorf("--timeout %v: want a positive duration", *timeout)
	}
	var evs []string
	for _, e := range strings.Split(*evictions, ",") {
		if e = strings.TrimSpace(e); e != "" {
			evs = append(evs, e)
		}
	}
	if len(evs) == 0 {
		return fmt.Errorf("--eviction %q: want at least one policy", *evictions)
	}
	self, err := managedVariantsBinary(*uvmBin, func() error {
		for _, e := range evs {
			if err := policy.ValidateEviction(e); err != nil {
				return fmt.Errorf("--eviction %s: %w", e, policyHint(err))
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	sizeOf, err := bench.ParseRunSizes(*sizes)
	if err != nil {
		return err
	}
	if *traceDir, err = writableTraceDir(*traceDir); err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
	defer stop()
	rep, err := bench.Run(ctx, bench.RunOptions{
		Programs: progs, Fraction: *fraction, Evictions: evs, Runs: *runs, Size: sizeOf, UVMBin: self, NoCgroup: *noCgroup, TraceDir: *traceDir,
		Timeout: *timeout, TimeoutFactor: 10, TimeoutFloor: 20 * time.Second, Progress: benchProgress,
	})
	if err != nil {
		return err
	}
	return printReport(*asJSON, rep)
}

func benchCliff(args []string) error {
	fs := newFlagSet("bench cliff", "[--json] [--png FILE|DIR] [--programs LIST] [--budgets LIST] [--runs N] [--bound] [--thrashing SPEC] [--eviction POLICY] [--size NAME=SIZE,...] [--timeout D] [--uvm PATH]",
		"Draw the budget curve: each program's time and faults under `uvm run --host-budget B` for B at each of --budgets percent of its managed peak "+
			"(the most managed memory the host held at once in an unconstrained `uvm run` of it), against the program run plain and against the faults LRU and Belady's MIN "+
			"(the fewest any eviction can take) take on the same references with room for B in 4 KiB pages. "+
			"The programs: loop (a C program sweeping an array in order), walk (a C program making random read-modify-writes over an array), both built at run time with $CC, cc or gcc, "+
			"whose references are computed exactly here; and the real programs of uvm bench run and gzip and xz -0 ("+strings.Join(workloads.AllNames(), ", ")+"), "+
			"whose references --bound reads from a run under valgrind's lackey tool, as uvm lab bound does. "+
			"Each variant (plain, uvm run with no budget, each budget) runs once to warm up, then --runs times, alternating; every output is checked against the plain run's. "+
			"Reports median times, their ratios to plain, faults, bytes moved each way and pages the resident core protected, and checks the goals: "+
			"at 90% at most 1.5 times plain, at 50% at most 3 times, no step between neighbouring budgets above 3 times, and faults at most LRU's")
	asJSON := fs.Bool("json", false, "print one JSON object")
	pngPath := fs.String("png", "", "also draw the curve into this PNG file (a directory: cliff.png in it): time over plain, faults over LRU's and bytes brought back over MIN's, against the budget")
	programs := fs.String("programs", bench.CliffDefaultPrograms, "the programs, a comma list of "+strings.Join(bench.CliffProgramNames(), ", ")+", or all")
	budgets := fs.String("budgets", bench.CliffDefaultBudgets, "host budgets in percent of each program's managed peak, a comma list (each above 0 and at most 100), measured from the largest down")
	runs := fs.Int("runs", 3, "measured runs of each variant (median), after a warm-up run of each")
	bound := fs.Bool("bound", false, "also count LRU's and MIN's faults for the real programs, from every load and store of a run under valgrind's lackey tool (thousands of times slower than plain: 2-17 minutes a program at the inputs --bound chooses, which are small, about 0.1 s plain, so that uvm run's own start weighs in their times); the synthetic programs' are always counted, from their exact reference strings")
	thrashing := fs.String("thrashing", "", "uvm run's --thrashing for every managed run (default: uvm run's own, "+policy.DefaultThrashing.String()+"); refault=off draws the curve without the resident core")
	eviction := fs.String("eviction", "", "uvm run's --eviction for every managed run (default: uvm run's own, "+policy.DefaultEviction+")")
	sizes := fs.String("size", "", "input sizes, a comma list of NAME=SIZE: the array of loop and walk (default 128MiB), the input of a real program (default: its own, 0.5-3 s plain; with --bound a small one)")
	timeout := fs.Duration("timeout", 0, "the limit of each run (default: 10 times the plain warm-up run, at least 20s); a budget that passes it is reported as not finished, with what it did until then")
	uvmBin := fs.String("uvm", "", "the uvm binary that runs the managed variants (default: this one)")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	names, err := bench.ParseCliffPrograms(*programs)
	if err != nil {
		return err
	}
	percents, err := bench.ParseCliffBudgets(*budgets)
	if err != nil {
		return err
	}
	if *runs < 1 {
		return fmt.Errorf("--runs %d: want at least 1", *runs)
	}
	if *timeout < 0 {
		return fmt.Errorf("--timeout %v: want a positive duration", *timeout)
	}
	sizeOf, err := bench.ParseCliffSizes(*sizes)
	if err != nil {
		return err
	}
	self, err := managedVariantsBinary(*uvmBin, func() error {
		if *eviction != "" {
			if err := policy.ValidateEviction(*eviction); err != nil {
				return fmt.Errorf("--eviction %s: %w", *eviction, policyHint(err))
			}
		}
		if *thrashing != "" {
			if _, err := policy.ParseThrashingSpec(*thrashing); err != nil {
				return fmt.Errorf("--thrashing %s: %w", *thrashing, policyHint(err))
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
	defer stop()
	rep, err := bench.Cliff(ctx, bench.CliffOptions{
		Programs: names, Percents: percents, Runs: *runs, Size: sizeOf, Bound: *bound, Eviction: *eviction, Thrashing: *thrashing, UVMBin: self,
		PNG: *pngPath, Timeout: *timeout, TimeoutFactor: 10, TimeoutFloor: 20 * time.Second, Progress: benchProgress,
	})
	if err != nil {
		return err
	}
	return printReport(*asJSON, rep)
}

// parseProducers reads --producers: a comma list of producer counts.
func parseProducers(text string) ([]int, error) {
	if text == "" {
		return nil, nil
	}
	var out []int
	for _, part := range strings.Split(text, ",") {
		part = strings.TrimSpace(part)
		var n int
		if _, err := fmt.Sscanf(part, "%d", &n); err != nil || n < 1 || n > 1024 {
			return nil, fmt.Errorf("--producers: %q is not a count from 1 to 1024", part)
		}
		out = append(out, n)
	}
	return out, nil
}

// managedVariantsBinary is the uvm binary that runs a benchmark's
// managed variants: --uvm's, else this one. check checks the policies
// asked for against this binary's, only where it is the one: another
// binary may link other policies.
func managedVariantsBinary(flag string, check func() error) (string, error) {
	if flag != "" {
		return flag, nil
	}
	self, err := os.Executable()
	if err != nil {
		return "", fmt.Errorf("the path of this uvm binary, for uvm run: %w", err)
	}
	return self, check()
}

// writableTraceDir makes `uvm bench run --trace DIR` absolute (the
// programs run in directories of their own) and checks that it can be
// written, creating it where missing; "" stays "" (no traces).
func writableTraceDir(dir string) (string, error) {
	if dir == "" {
		return "", nil
	}
	dir, err := filepath.Abs(dir)
	if err != nil {
		return "", fmt.Errorf("--trace: %w", err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("--trace: %w", err)
	}
	probe, err := os.CreateTemp(dir, ".probe-*")
	if err != nil {
		return "", fmt.Errorf("--trace %s: the directory cannot be written: %w", dir, err)
	}
	probe.Close()
	os.Remove(probe.Name())
	return dir, nil
}
