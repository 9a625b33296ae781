package cli

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/softuvm/softuvm/cli/workloads"
	"github.com/softuvm/softuvm/policy"
	"github.com/softuvm/softuvm/uvm"
)

// `uvm bench run` times the real programs of cli/workloads three ways:
// plain, under `uvm run` with a host budget of a fraction of the plain
// run's peak RSS (once per eviction policy asked for), and plain in a
// memory cgroup of the same size with zram swap (the oversub bench's
// setup). Every run's output is checked against the plain run's.

// The goals, on median wall times: under `uvm run` at most 3 times
// plain, and faster than the cgroup with zram swap.
const runBenchGoalRatio = 3.0

// runBenchReport is what `uvm bench run --json` prints.
type runBenchReport struct {
	Machine        machineSummary `json:"machine"`
	Runs           int            `json:"runs"`
	BudgetFraction float64        `json:"budget_fraction"`
	Evictions      []string       `json:"evictions"`
	// Timeout is the limit of each run: TimeoutFactor times the plain
	// warm-up run, at least TimeoutFloorSeconds, or --timeout.
	TimeoutFactor       float64           `json:"timeout_factor,omitempty"`
	TimeoutFloorSeconds float64           `json:"timeout_floor_seconds,omitempty"`
	TimeoutSeconds      float64           `json:"timeout_seconds,omitempty"`
	CgroupSkipped       string            `json:"cgroup_skipped,omitempty"`
	Programs            []runBenchProgram `json:"programs"`
}

type runBenchProgram struct {
	Name        string `json:"name"`
	CommandLine string `json:"command_line"`
	Checker     bool   `json:"checker,omitempty"`
	SizeBytes   int64  `json:"size_bytes"`
	Skipped     string `json:"skipped,omitempty"` // not installed, or failed plain
	// PeakRSSBytes is the plain warm-up run's peak RSS; BudgetBytes the
	// host budget and cgroup limit made of it.
	PeakRSSBytes  int64             `json:"peak_rss_bytes"`
	BudgetBytes   int64             `json:"budget_bytes"`
	LimitSeconds  float64           `json:"limit_seconds"`
	Plain         runBenchVariant   `json:"plain"`
	Managed       []runBenchVariant `json:"managed"` // one per eviction policy, in --eviction's order
	Cgroup        *runBenchVariant  `json:"cgroup"`
	CgroupSetup   string            `json:"cgroup_setup,omitempty"`
	CgroupSkipped string            `json:"cgroup_skipped,omitempty"`
	CgroupToPlain float64           `json:"cgroup_to_plain,omitempty"`
	// By eviction policy: the managed variant's median over plain's and
	// over the cgroup's, and the goals (at most 3 times plain, faster
	// than the cgroup). The cgroup goal is met too where the managed
	// variant finished and the cgroup's did not (its OOM killer, the
	// limit); a managed variant that did not finish meets neither.
	ManagedToPlain  map[string]float64 `json:"managed_to_plain,omitempty"`
	ManagedToCgroup map[string]float64 `json:"managed_to_cgroup,omitempty"`
	GoalPlainMet    map[string]bool    `json:"goal_managed_at_most_3x_plain"`
	GoalCgroupMet   map[string]bool    `json:"goal_managed_faster_than_cgroup,omitempty"`
}

// runBenchVariant is one way of running a program: the median wall time
// of its measured runs, and what went wrong if one did.
type runBenchVariant struct {
	benchTiming        // Name: plain, uvm run --eviction lru, ..., cgroup
	Eviction    string `json:"eviction,omitempty"` // the managed variants' --eviction
	// Trace is where --trace recorded the variant's runs (the last
	// one's stays).
	Trace string `json:"trace,omitempty"`
	// Managed variants: from `uvm run --stats-json` of the last run.
	Allocations    uint64 `json:"allocations,omitempty"`
	AllocatedBytes uint64 `json:"allocated_bytes,omitempty"`
	PopulatedBytes uint64 `json:"populated_bytes,omitempty"`
	serverFigures
	// Cgroup: the peaks of the last run of memory, and of memory plus
	// swap (v1) or swap (v2).
	PeakMemoryBytes     int64 `json:"peak_memory_bytes,omitempty"`
	PeakMemorySwapBytes int64 `json:"peak_memory_swap_bytes,omitempty"`
	PeakSwapBytes       int64 `json:"peak_swap_bytes,omitempty"`
}

type runBenchOptions struct {
	programs      []workloads.Program
	fraction      float64
	evictions     []string
	runs          int
	size          map[string]int64 // by program; absent: its default
	uvmBin        string
	noCgroup      bool
	traceDir      string        // "": no traces
	timeout       time.Duration // 0: factor times plain, at least floor
	timeoutFactor float64
	timeoutFloor  time.Duration
	progress      func(format string, a ...any)
}

func benchRun(args []string) error {
	fs := newFlagSet("bench run", "[--json] [--programs LIST] [--budget-fraction F] [--eviction LIST] [--runs N] [--size NAME=SIZE,...] [--timeout D] [--no-cgroup] [--uvm PATH] [--trace DIR]",
		"Run the real programs of cli/workloads ("+strings.Join(workloads.Names(), ", ")+") three ways, alternating, after a warm-up run of each way: "+
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
	self := *uvmBin
	if self == "" {
		if self, err = os.Executable(); err != nil {
			return fmt.Errorf("the path of this uvm binary, for uvm run: %w", err)
		}
		// Another binary may link other policies: only this one's
		// are checked here.
		for _, e := range evs {
			if err := policy.ValidateEviction(e); err != nil {
				return fmt.Errorf("--eviction %s: %w", e, policyHint(err))
			}
		}
	}
	sizeOf := map[string]int64{}
	for _, kv := range strings.Split(*sizes, ",") {
		if kv = strings.TrimSpace(kv); kv == "" {
			continue
		}
		name, text, ok := strings.Cut(kv, "=")
		if _, err := workloads.Select(name); !ok || err != nil {
			return fmt.Errorf("--size %q: want NAME=SIZE, NAME one of %s", kv, strings.Join(workloads.Names(), ", "))
		}
		n, err := uvm.ParseSize(text)
		if err != nil || n <= 0 {
			return fmt.Errorf("--size %s: want a size above 0 (%v)", kv, err)
		}
		sizeOf[name] = n
	}
	if *traceDir != "" {
		// The programs run in directories of their own.
		if *traceDir, err = filepath.Abs(*traceDir); err != nil {
			return fmt.Errorf("--trace: %w", err)
		}
		if err := os.MkdirAll(*traceDir, 0o755); err != nil {
			return fmt.Errorf("--trace: %w", err)
		}
		probe, err := os.CreateTemp(*traceDir, ".probe-*")
		if err != nil {
			return fmt.Errorf("--trace %s: the directory cannot be written: %w", *traceDir, err)
		}
		probe.Close()
		os.Remove(probe.Name())
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
	defer stop()
	rep, err := runBenchAll(ctx, runBenchOptions{
		programs: progs, fraction: *fraction, evictions: evs, runs: *runs, size: sizeOf, uvmBin: self, noCgroup: *noCgroup, traceDir: *traceDir,
		timeout: *timeout, timeoutFactor: 10, timeoutFloor: 20 * time.Second,
		progress: func(format string, a ...any) { fmt.Fprintf(os.Stderr, "uvm bench: "+format+"\n", a...) },
	})
	if err != nil {
		return err
	}
	if *asJSON {
		return writeJSON(os.Stdout, rep)
	}
	printRunBenchReport(os.Stdout, rep)
	return nil
}

func runBenchAll(ctx context.Context, o runBenchOptions) (runBenchReport, error) {
	rep := runBenchReport{Machine: machineSummary{CPUs: cpus(), Kernel: kernelRelease(), Go: goVersion()},
		Runs: o.runs, BudgetFraction: o.fraction, Evictions: o.evictions}
	if o.timeout > 0 {
		rep.TimeoutSeconds = o.timeout.Seconds()
	} else {
		rep.TimeoutFactor, rep.TimeoutFloorSeconds = o.timeoutFactor, o.timeoutFloor.Seconds()
	}
	switch {
	case o.noCgroup:
		rep.CgroupSkipped = "--no-cgroup given"
	case os.Geteuid() != 0:
		rep.CgroupSkipped = "not root: setting up a memory cgroup and a swap device needs root"
	}
	dir, err := os.MkdirTemp("", "uvm-bench-run-")
	if err != nil {
		return rep, err
	}
	defer os.RemoveAll(dir)
	// Budgets are fractions of each program's own peak, which only a
	// wrapper outside this process can measure.
	peakWrapper, err := workloads.BuildPeakWrapper(dir)
	if err != nil {
		return rep, err
	}
	for _, p := range o.programs {
		if err := ctx.Err(); err != nil {
			return rep, fmt.Errorf("interrupted: %w", err)
		}
		pdir := filepath.Join(dir, p.Name)
		if err := os.Mkdir(pdir, 0o755); err != nil {
			return rep, err
		}
		pr, err := measureRunBenchProgram(ctx, o, p, pdir, peakWrapper, rep.CgroupSkipped)
		os.RemoveAll(pdir)
		if err != nil {
			return rep, err
		}
		rep.Programs = append(rep.Programs, pr)
	}
	return rep, nil
}

// measureRunBenchProgram measures one program; an error is fatal to the
// whole benchmark (an interruption, a failure to set up), a variant's
// failure is recorded in it.
func measureRunBenchProgram(ctx context.Context, o runBenchOptions, p workloads.Program, dir, peakWrapper, cgroupSkipped string) (pr runBenchProgram, err error) {
	progress := o.progress
	pr = runBenchProgram{Name: p.Name, Checker: p.Checker, Plain: runBenchVariant{benchTiming: benchTiming{Name: "plain"}}}
	if _, err := p.Path(); err != nil {
		pr.Skipped = err.Error()
		progress("%s: skipped: %v", p.Name, err)
		return pr, nil
	}
	w, err := p.Prepare(dir, o.size[p.Name])
	if err != nil {
		return pr, err
	}
	w.PeakWrapper = peakWrapper
	pr.SizeBytes, pr.CommandLine = w.Size, w.CommandLine()

	// The plain warm-up run sets the budget and the limit.
	warm, err := w.RunPlain(ctx, filepath.Join(dir, "plain-warmup"))
	if err != nil {
		return pr, err
	}
	if err := w.Check(warm); err != nil {
		pr.Skipped = "failed plain: " + err.Error()
		progress("%s: skipped: %v", p.Name, err)
		return pr, nil
	}
	ref := warm // the output every later run must match
	pr.PeakRSSBytes = warm.MaxRSS
	pr.BudgetBytes = workloads.Budget(warm.MaxRSS, o.fraction, 4<<20)
	limit := benchLimit(o.timeout, o.timeoutFactor, o.timeoutFloor, warm.Wall)
	pr.LimitSeconds = limit.Seconds()
	progress("%s: %s; plain warm-up %.2fs, peak RSS %s: host budget and cgroup limit %s, each run limited to %v",
		p.Name, pr.CommandLine, warm.Wall.Seconds(), humanSize(uint64(warm.MaxRSS)), humanSize(uint64(pr.BudgetBytes)), limit.Round(time.Second))

	variants := []benchVariant{{t: &pr.Plain.benchTiming, run: w.RunPlain, warmedUp: true}}
	pr.Managed = make([]runBenchVariant, len(o.evictions))
	for i, ev := range o.evictions {
		v := &pr.Managed[i]
		*v = runBenchVariant{benchTiming: benchTiming{Name: "uvm run --eviction " + ev}, Eviction: ev}
		opts := workloads.UVMOptions{Bin: o.uvmBin, HostBudget: pr.BudgetBytes, Flags: []string{"--eviction", ev}}
		if o.traceDir != "" {
			v.Trace = filepath.Join(o.traceDir, p.Name+"-"+strings.ReplaceAll(ev, ":", "_")+".uvmtrace")
			opts.Flags = append(opts.Flags, "--trace", v.Trace)
		}
		variants = append(variants, benchVariant{t: &v.benchTiming,
			run: func(ctx context.Context, dir string) (*workloads.Run, error) { return w.RunUVM(ctx, dir, opts) },
			after: func(r *workloads.Run) {
				st := r.Stats
				v.Allocations, v.AllocatedBytes, v.PopulatedBytes = st.Allocations, st.AllocatedBytes, st.PopulatedBytes()
				v.serverFigures.read(st)
			}})
	}
	switch {
	case cgroupSkipped != "":
		pr.CgroupSkipped = cgroupSkipped
	case p.NoCgroup != "":
		pr.CgroupSkipped = p.NoCgroup
		progress("%s: cgroup variant skipped: %s", p.Name, p.NoCgroup)
	default:
		cg, skip := setupOversubCgroup(pr.BudgetBytes, max(warm.MaxRSS, pr.BudgetBytes+1<<20))
		if cg == nil {
			pr.CgroupSkipped = skip
			progress("%s: cgroup variant skipped: %s", p.Name, skip)
			break
		}
		pr.CgroupSetup = cg.describe()
		defer func() {
			if terr := cg.teardown(); terr != nil {
				fmt.Fprintf(os.Stderr, "uvm bench: tearing down the cgroup variant: %v\n", terr)
				if err == nil {
					err = terr
				}
			}
		}()
		pr.Cgroup = &runBenchVariant{benchTiming: benchTiming{Name: "cgroup"}}
		v := pr.Cgroup
		// The shell moves itself into the cgroup, then becomes the
		// program.
		prefix := []string{"/bin/sh", "-c", `echo $$ > "$1" && shift && exec "$@"`, "sh", cg.procs()}
		variants = append(variants, benchVariant{t: &v.benchTiming,
			run: func(ctx context.Context, dir string) (*workloads.Run, error) {
				cg.resetPeaks()
				kills := cg.oomKills()
				r, err := w.RunWrapped(ctx, dir, prefix)
				if n := cg.oomKills(); err == nil && n > kills {
					// Reported as such: not a failure of the program.
					if r.Signal != "" {
						err = fmt.Errorf("killed by the cgroup's OOM killer (%s) after %.1fs: the kernel gave up reclaiming", r.Signal, r.Wall.Seconds())
					} else { // one of its processes: stress-ng restarts its stressor
						err = fmt.Errorf("the cgroup's OOM killer killed one of its processes (the kernel gave up reclaiming); it exited with status %d after %.1fs",
							r.ExitStatus, r.Wall.Seconds())
					}
				}
				return r, err
			},
			after: func(*workloads.Run) { v.PeakMemoryBytes, v.PeakMemorySwapBytes, v.PeakSwapBytes = cg.peaks() }})
	}

	if err := alternateVariants(ctx, dir, p.Name, w, ref, limit, o.runs, variants, progress); err != nil {
		return pr, err
	}
	pr.ManagedToPlain, pr.GoalPlainMet = map[string]float64{}, map[string]bool{}
	cgOK := pr.Cgroup != nil && pr.Cgroup.ok() && pr.Plain.ok()
	if cgOK {
		pr.CgroupToPlain = pr.Cgroup.Seconds / pr.Plain.Seconds
	}
	if pr.Cgroup != nil {
		pr.ManagedToCgroup, pr.GoalCgroupMet = map[string]float64{}, map[string]bool{}
	}
	for _, m := range pr.Managed {
		if !m.ok() || !pr.Plain.ok() {
			pr.GoalPlainMet[m.Eviction] = false
			if pr.Cgroup != nil {
				pr.GoalCgroupMet[m.Eviction] = false
			}
			continue
		}
		ratio := m.Seconds / pr.Plain.Seconds
		pr.ManagedToPlain[m.Eviction] = ratio
		pr.GoalPlainMet[m.Eviction] = ratio <= runBenchGoalRatio
		switch {
		case cgOK:
			pr.ManagedToCgroup[m.Eviction] = m.Seconds / pr.Cgroup.Seconds
			pr.GoalCgroupMet[m.Eviction] = m.Seconds < pr.Cgroup.Seconds
		case pr.Cgroup != nil:
			// The cgroup did not finish (its OOM killer, the limit):
			// uvm run did what it could not.
			pr.GoalCgroupMet[m.Eviction] = true
		}
	}
	return pr, nil
}

func printRunBenchReport(out io.Writer, r runBenchReport) {
	fmt.Fprintf(out, "machine: %d CPUs, Linux %s, %s; medians of %d run(s) after a warm-up, variants alternating; each run limited to %s\n",
		r.Machine.CPUs, r.Machine.Kernel, r.Machine.Go, r.Runs, limitText(r.TimeoutSeconds, r.TimeoutFactor, r.TimeoutFloorSeconds))
	fmt.Fprintf(out, "host budget and cgroup limit: %g of the plain run's peak RSS; every run's output checked against the plain run's\n", r.BudgetFraction)
	if r.CgroupSkipped != "" {
		fmt.Fprintf(out, "memory cgroup variant skipped: %s\n", r.CgroupSkipped)
	}
	met := map[bool]string{true: "met", false: "NOT met"}
	for _, p := range r.Programs {
		if !printProgramHead(out, p.Name, p.CommandLine, p.Skipped) {
			continue
		}
		fmt.Fprintf(out, "  peak RSS %s, budget %s\n", humanSize(uint64(p.PeakRSSBytes)), humanSize(uint64(p.BudgetBytes)))
		row := func(v *runBenchVariant, ratio string) {
			if v.Failed != "" {
				fmt.Fprintf(out, "  %-28s dropped: %s\n", v.Name, firstLine(v.Failed))
				return
			}
			fmt.Fprintf(out, "  %-28s %8.3f s %s\n", v.Name, v.Seconds, ratio)
		}
		row(&p.Plain, "")
		for i := range p.Managed {
			m := &p.Managed[i]
			ratio := ""
			if x, ok := p.ManagedToPlain[m.Eviction]; ok {
				ratio = fmt.Sprintf("%6.2fx plain (goal at most %g: %s)", x, runBenchGoalRatio, met[p.GoalPlainMet[m.Eviction]])
				if c, ok := p.ManagedToCgroup[m.Eviction]; ok {
					ratio += fmt.Sprintf(", %.2fx the cgroup (goal below 1: %s)", c, met[p.GoalCgroupMet[m.Eviction]])
				} else if p.GoalCgroupMet[m.Eviction] {
					ratio += ", the cgroup did not finish (goal: met)"
				}
			}
			row(m, ratio)
			if m.Failed == "" || m.AllocatedBytes > 0 {
				fmt.Fprintf(out, "  %-28s host to device %s, back %s; %d pages evicted, %d faults; managed %s asked, %s touched\n", "",
					humanSize(m.HostToDeviceBytes), humanSize(m.DeviceToHostBytes), m.EvictedPages, m.Faults, humanSize(m.AllocatedBytes), humanSize(m.PopulatedBytes))
			}
			if m.Trace != "" {
				fmt.Fprintf(out, "  %-28s trace %s\n", "", m.Trace)
			}
		}
		if p.Cgroup != nil {
			ratio := ""
			if p.CgroupToPlain > 0 {
				ratio = fmt.Sprintf("%6.2fx plain", p.CgroupToPlain)
			}
			row(p.Cgroup, ratio)
			if peaks := cgroupPeaks(p.Cgroup.PeakMemoryBytes, p.Cgroup.PeakMemorySwapBytes, p.Cgroup.PeakSwapBytes); peaks != "" {
				fmt.Fprintf(out, "  %-28s %s\n", "", peaks)
			}
		} else if p.CgroupSkipped != "" && r.CgroupSkipped == "" {
			fmt.Fprintf(out, "  cgroup variant skipped: %s\n", p.CgroupSkipped)
		}
	}
}

func firstLine(s string) string {
	line, _, _ := strings.Cut(s, "\n")
	return line
}
