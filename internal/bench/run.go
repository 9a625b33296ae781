package bench

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/softuvm/softuvm/internal/bench/workloads"
)

// The goals, on median wall times: under `uvm run` at most 3 times
// plain, and faster than the cgroup with zram swap.
const runBenchGoalRatio = 3.0

// RunReport is what `uvm bench run` measured, its JSON what --json
// prints.
type RunReport struct {
	Machine        Machine  `json:"machine"`
	Runs           int      `json:"runs"`
	BudgetFraction float64  `json:"budget_fraction"`
	Evictions      []string `json:"evictions"`
	// Timeout is the limit of each run: TimeoutFactor times the plain
	// warm-up run, at least TimeoutFloorSeconds, or --timeout.
	TimeoutFactor       float64      `json:"timeout_factor,omitempty"`
	TimeoutFloorSeconds float64      `json:"timeout_floor_seconds,omitempty"`
	TimeoutSeconds      float64      `json:"timeout_seconds,omitempty"`
	CgroupSkipped       string       `json:"cgroup_skipped,omitempty"`
	Programs            []RunProgram `json:"programs"`
}

// RunProgram is one program's variants.
type RunProgram struct {
	Name        string `json:"name"`
	CommandLine string `json:"command_line"`
	Checker     bool   `json:"checker,omitempty"`
	SizeBytes   int64  `json:"size_bytes"`
	Skipped     string `json:"skipped,omitempty"` // not installed, or failed plain
	// PeakRSSBytes is the plain warm-up run's peak RSS; BudgetBytes the
	// host budget and cgroup limit made of it.
	PeakRSSBytes  int64        `json:"peak_rss_bytes"`
	BudgetBytes   int64        `json:"budget_bytes"`
	LimitSeconds  float64      `json:"limit_seconds"`
	Plain         RunVariant   `json:"plain"`
	Managed       []RunVariant `json:"managed"` // one per eviction policy, in --eviction's order
	Cgroup        *RunVariant  `json:"cgroup"`
	CgroupSetup   string       `json:"cgroup_setup,omitempty"`
	CgroupSkipped string       `json:"cgroup_skipped,omitempty"`
	CgroupToPlain float64      `json:"cgroup_to_plain,omitempty"`
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

// RunVariant is one way of running a program: the median wall time
// of its measured runs, and what went wrong if one did.
type RunVariant struct {
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

// RunOptions are what `uvm bench run` measures: its flags.
type RunOptions struct {
	Programs  []workloads.Program
	Fraction  float64  // the host budget (and the cgroup's limit) as a fraction of the plain run's peak RSS
	Evictions []string // uvm run's --eviction of each managed variant
	Runs      int
	Size      map[string]int64 // inputs by program; absent: its default
	UVMBin    string           // runs the managed variants
	NoCgroup  bool
	TraceDir  string // "": no traces
	// Timeout limits each run; 0: TimeoutFactor times the plain warm-up
	// run, at least TimeoutFloor.
	Timeout       time.Duration
	TimeoutFactor float64
	TimeoutFloor  time.Duration
	Progress      Progress
}

// Run is `uvm bench run`: the real programs of package workloads, each
// three ways in alternation after a warm-up run of each way: plain,
// under uvm run with a host budget of a fraction of the plain run's peak
// RSS (once per eviction policy), and in a memory cgroup of the budget
// with zram swap; every run's output checked against the plain run's.
// Cancelling ctx stops the program running and ends the benchmark.
func Run(ctx context.Context, o RunOptions) (*RunReport, error) {
	rep := &RunReport{Machine: ThisMachine(), Runs: o.Runs, BudgetFraction: o.Fraction, Evictions: o.Evictions}
	if o.Timeout > 0 {
		rep.TimeoutSeconds = o.Timeout.Seconds()
	} else {
		rep.TimeoutFactor, rep.TimeoutFloorSeconds = o.TimeoutFactor, o.TimeoutFloor.Seconds()
	}
	switch {
	case o.NoCgroup:
		rep.CgroupSkipped = "--no-cgroup given"
	case os.Geteuid() != 0:
		rep.CgroupSkipped = "not root: setting up a memory cgroup and a swap device needs root"
	}
	dir, err := os.MkdirTemp("", "uvm-bench-run-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	// Budgets are fractions of each program's own peak, which only a
	// wrapper outside this process can measure.
	peakWrapper, err := workloads.BuildPeakWrapper(dir)
	if err != nil {
		return nil, err
	}
	for _, p := range o.Programs {
		if err := ctx.Err(); err != nil {
			return nil, fmt.Errorf("interrupted: %w", err)
		}
		pdir := filepath.Join(dir, p.Name)
		if err := os.Mkdir(pdir, 0o755); err != nil {
			return nil, err
		}
		pr, err := measureRunProgram(ctx, o, p, pdir, peakWrapper, rep.CgroupSkipped)
		os.RemoveAll(pdir)
		if err != nil {
			return nil, err
		}
		rep.Programs = append(rep.Programs, pr)
	}
	return rep, nil
}

// measureRunProgram measures one program; an error is fatal to the
// whole benchmark (an interruption, a failure to set up), a variant's
// failure is recorded in it.
func measureRunProgram(ctx context.Context, o RunOptions, p workloads.Program, dir, peakWrapper, cgroupSkipped string) (pr RunProgram, err error) {
	progress := o.Progress.orQuiet()
	pr = RunProgram{Name: p.Name, Checker: p.Checker, Plain: RunVariant{benchTiming: benchTiming{Name: "plain"}}}
	if _, err := p.Path(); err != nil {
		pr.Skipped = err.Error()
		progress("%s: skipped: %v", p.Name, err)
		return pr, nil
	}
	w, err := p.Prepare(dir, o.Size[p.Name])
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
	pr.PeakRSSBytes = warm.MaxRSS
	pr.BudgetBytes = workloads.Budget(warm.MaxRSS, o.Fraction, 4<<20)
	limit := benchLimit(o.Timeout, o.TimeoutFactor, o.TimeoutFloor, warm.Wall)
	pr.LimitSeconds = limit.Seconds()
	progress("%s: %s; plain warm-up %.2fs, peak RSS %s: host budget and cgroup limit %s, each run limited to %v",
		p.Name, pr.CommandLine, warm.Wall.Seconds(), humanSize(uint64(warm.MaxRSS)), humanSize(uint64(pr.BudgetBytes)), limit.Round(time.Second))

	variants := append([]benchVariant{{t: &pr.Plain.benchTiming, run: w.RunPlain, warmedUp: true}}, pr.managedVariants(o, w)...)
	cg := pr.cgroupVariant(p, cgroupSkipped, max(warm.MaxRSS, pr.BudgetBytes+1<<20), progress)
	if cg != nil {
		defer cg.tearDownAfter(&err, progress)
		variants = append(variants, pr.cgroupRun(cg, w))
	}
	// The warm-up run is the output every later run must match.
	if err := alternateVariants(ctx, dir, p.Name, w, warm, limit, o.Runs, variants, progress); err != nil {
		return pr, err
	}
	pr.judge()
	return pr, nil
}

// managedVariants are the program under uvm run, once per eviction
// policy, each recording a trace where TraceDir asks.
func (pr *RunProgram) managedVariants(o RunOptions, w *workloads.Workload) []benchVariant {
	var variants []benchVariant
	pr.Managed = make([]RunVariant, len(o.Evictions))
	for i, ev := range o.Evictions {
		v := &pr.Managed[i]
		*v = RunVariant{benchTiming: benchTiming{Name: "uvm run --eviction " + ev}, Eviction: ev}
		opts := workloads.UVMOptions{Bin: o.UVMBin, HostBudget: pr.BudgetBytes, Flags: []string{"--eviction", ev}}
		if o.TraceDir != "" {
			v.Trace = filepath.Join(o.TraceDir, pr.Name+"-"+strings.ReplaceAll(ev, ":", "_")+".uvmtrace")
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
	return variants
}

// cgroupVariant sets the program's cgroup up for touched bytes, unless
// the benchmark or the program skips it, or the machine does not allow
// it (then the program's report says why).
func (pr *RunProgram) cgroupVariant(p workloads.Program, cgroupSkipped string, touched int64, progress Progress) *memoryCgroup {
	switch {
	case cgroupSkipped != "":
		pr.CgroupSkipped = cgroupSkipped
		return nil
	case p.NoCgroup != "":
		pr.CgroupSkipped = p.NoCgroup
		progress("%s: cgroup variant skipped: %s", p.Name, p.NoCgroup)
		return nil
	}
	cg, skip := setUpMemoryCgroup(pr.BudgetBytes, touched)
	if cg == nil {
		pr.CgroupSkipped = skip
		progress("%s: cgroup variant skipped: %s", p.Name, skip)
		return nil
	}
	pr.CgroupSetup = cg.describe()
	pr.Cgroup = &RunVariant{benchTiming: benchTiming{Name: "cgroup"}}
	return cg
}

// cgroupRun runs the program in cg, a run the cgroup's OOM killer ended
// reported as such: not a failure of the program.
func (pr *RunProgram) cgroupRun(cg *memoryCgroup, w *workloads.Workload) benchVariant {
	v := pr.Cgroup
	prefix := cg.runIn()
	return benchVariant{t: &v.benchTiming,
		run: func(ctx context.Context, dir string) (*workloads.Run, error) {
			cg.resetPeaks()
			kills := cg.oomKills()
			r, err := w.RunWrapped(ctx, dir, prefix)
			if n := cg.oomKills(); err == nil && n > kills {
				if r.Signal != "" {
					err = fmt.Errorf("killed by the cgroup's OOM killer (%s) after %.1fs: the kernel gave up reclaiming", r.Signal, r.Wall.Seconds())
				} else { // one of its processes: stress-ng restarts its stressor
					err = fmt.Errorf("the cgroup's OOM killer killed one of its processes (the kernel gave up reclaiming); it exited with status %d after %.1fs",
						r.ExitStatus, r.Wall.Seconds())
				}
			}
			return r, err
		},
		after: func(*workloads.Run) { v.PeakMemoryBytes, v.PeakMemorySwapBytes, v.PeakSwapBytes = cg.peaks() }}
}

// judge computes each managed variant's ratios to plain and to the
// cgroup, and the goals.
func (pr *RunProgram) judge() {
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
}

// Print writes the report: a block of each program.
func (r *RunReport) Print(out io.Writer) {
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
		row := func(v *RunVariant, ratio string) {
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
