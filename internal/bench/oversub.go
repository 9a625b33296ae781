package bench

import (
	"bytes"
	_ "embed"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/softuvm/softuvm/internal/bench/workloads"
	"github.com/softuvm/softuvm/libuvm"
	"github.com/softuvm/softuvm/uvm"
)

// oversubSweepSource is the swept program, built at run time with the C
// compiler: it must be an ordinary C program whose malloc libuvm-preload.so
// interposes under `uvm run`.
//
//go:embed csrc/oversub_sweep.c
var oversubSweepSource string

// OversubReport is what `uvm bench oversub` measured, its JSON what
// --json prints. Times are medians over runs, after a warm-up run of each
// variant that is not counted; the variants alternate within each round.
type OversubReport struct {
	Machine     Machine `json:"machine"`
	Runs        int     `json:"runs"`
	BudgetBytes int64   `json:"budget_bytes"`
	SizeBytes   int64   `json:"size_bytes"`
	Sweeps      int     `json:"sweeps"`

	// The same program three ways: plain, under `uvm run --host-budget
	// BUDGET`, and plain in a memory cgroup limited to BUDGET with zram
	// swap (nil, with the reason in CgroupSkipped, where the machine does
	// not allow it).
	Unmanaged     OversubVariant  `json:"unmanaged"`
	Managed       OversubVariant  `json:"managed"`
	Cgroup        *OversubVariant `json:"cgroup"`
	CgroupSetup   string          `json:"cgroup_setup,omitempty"`
	CgroupSkipped string          `json:"cgroup_skipped,omitempty"`

	// Ratios of the sweep times (the program's own timing of its sweeps),
	// and of the wall times (start to exit, `uvm run`'s server included).
	ManagedToUnmanaged     float64  `json:"managed_to_unmanaged"`
	ManagedToUnmanagedWall float64  `json:"managed_to_unmanaged_wall"`
	ManagedToCgroup        *float64 `json:"managed_to_cgroup"`
	ManagedToCgroupWall    *float64 `json:"managed_to_cgroup_wall"`
	// The goals, on sweep times: managed at most 2.5 times unmanaged,
	// and faster than the cgroup.
	GoalUnmanagedMet bool  `json:"goal_managed_at_most_2_5x_unmanaged"`
	GoalCgroupMet    *bool `json:"goal_managed_faster_than_cgroup"`
	// Checked: every run, warm-ups included, exited 0 after the program
	// found every word of its array right.
	Checked bool `json:"checked"`
}

const oversubGoalRatio = 2.5

// OversubVariant is one way of running the program: its medians and
// runs, and what its server or cgroup saw of the last run.
type OversubVariant struct {
	SweepSeconds float64   `json:"sweep_seconds"`
	WallSeconds  float64   `json:"wall_seconds"`
	InitSeconds  float64   `json:"init_seconds"` // the first write of the array
	SweepRuns    []float64 `json:"sweep_seconds_runs"`
	WallRuns     []float64 `json:"wall_seconds_runs"`
	// Managed: what the server did in the last measured run.
	ManagedBytes uint64 `json:"managed_bytes,omitempty"`
	serverFigures
	// Cgroup: the peaks in the last measured run of memory, and of
	// memory plus swap (v1) or swap (v2).
	PeakMemoryBytes     int64 `json:"peak_memory_bytes,omitempty"`
	PeakMemorySwapBytes int64 `json:"peak_memory_swap_bytes,omitempty"`
	PeakSwapBytes       int64 `json:"peak_swap_bytes,omitempty"`
}

// OversubOptions are what `uvm bench oversub` measures: its flags.
type OversubOptions struct {
	Budget, Size  int64 // the managed variant's host budget (and the cgroup's limit), the array
	Sweeps, Runs  int
	UVMBin        string // runs the managed variant: `UVMBin run ...`
	NoCgroup      bool
	Progress      Progress
	Interruptions <-chan os.Signal // each kills the variant running and fails the benchmark; nil: none
}

// oversubRunner runs the variants' programs; an interruption kills the
// one running and fails every later run.
type oversubRunner struct {
	mu          sync.Mutex
	cur         *os.Process
	interrupted os.Signal
}

func (r *oversubRunner) watch(sigs <-chan os.Signal, done <-chan struct{}) {
	select {
	case <-done:
	case sig := <-sigs:
		r.mu.Lock()
		r.interrupted = sig
		p := r.cur
		r.mu.Unlock()
		if p == nil {
			return
		}
		// SIGTERM first: uvm run passes it to the program and then
		// stops its server, which a SIGKILL would leave running.
		p.Signal(syscall.SIGTERM)
		time.Sleep(3 * time.Second)
		r.mu.Lock()
		if r.cur == p {
			p.Kill()
		}
		r.mu.Unlock()
	}
}

func (r *oversubRunner) wasInterrupted() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.interrupted != nil
}

var sweepLine = regexp.MustCompile(`oversub_sweep: bytes=\d+ sweeps=\d+ init_seconds=([0-9.]+) sweep_seconds=([0-9.]+) ok`)

// run runs cmd to its end and returns the program's figures.
func (r *oversubRunner) run(name string, cmd *exec.Cmd) (initS, sweepS, wallS float64, err error) {
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	cmd.WaitDelay = 2 * time.Second // should anything it started hold its output open
	r.mu.Lock()
	if r.interrupted != nil {
		r.mu.Unlock()
		return 0, 0, 0, fmt.Errorf("interrupted (%v)", r.interrupted)
	}
	start := time.Now()
	err = cmd.Start()
	if err == nil {
		r.cur = cmd.Process
	}
	r.mu.Unlock()
	if err != nil {
		return 0, 0, 0, fmt.Errorf("%s: %w", name, err)
	}
	err = cmd.Wait()
	wallS = time.Since(start).Seconds()
	r.mu.Lock()
	r.cur = nil
	sig := r.interrupted
	r.mu.Unlock()
	if sig != nil {
		return 0, 0, 0, fmt.Errorf("interrupted (%v)", sig)
	}
	if err != nil {
		return 0, 0, 0, fmt.Errorf("%s: %v: %s", name, err, strings.TrimSpace(errOut.String()))
	}
	m := sweepLine.FindStringSubmatch(out.String())
	if m == nil {
		return 0, 0, 0, fmt.Errorf("%s printed %q, want a line ending in ok (the program's check of every word): %s", name, out.String(), strings.TrimSpace(errOut.String()))
	}
	initS, _ = strconv.ParseFloat(m[1], 64)
	sweepS, _ = strconv.ParseFloat(m[2], 64)
	return initS, sweepS, wallS, nil
}

// Oversub is `uvm bench oversub`: a C program sweeping an array larger
// than a host budget, three ways in alternation: plain, under `uvm run
// --host-budget`, and plain in a memory cgroup limited to the budget
// with zram swap, where the machine allows it. Every run checks every
// word of the array.
func Oversub(o OversubOptions) (rep *OversubReport, err error) {
	progress := o.Progress.orQuiet()
	rep = &OversubReport{Machine: ThisMachine(), Runs: o.Runs, BudgetBytes: o.Budget, SizeBytes: o.Size, Sweeps: o.Sweeps}
	dir, err := os.MkdirTemp("", "uvm-bench-oversub-")
	if err != nil {
		return rep, err
	}
	defer os.RemoveAll(dir)
	prog, err := buildOversubSweep(dir)
	if err != nil {
		return rep, err
	}
	runner := &oversubRunner{}
	done := make(chan struct{})
	defer close(done)
	if o.Interruptions != nil {
		go runner.watch(o.Interruptions, done)
	}
	cg := oversubCgroup(o, progress, rep)
	if cg != nil {
		defer cg.tearDownAfter(&err, progress)
	}
	variants := OversubVariants(o, prog, filepath.Join(dir, "stats.json"), cg, rep)
	progress("%d runs of each of %d variants after a warm-up of each: %d sweeps of %s, host budget %s", o.Runs, len(variants), o.Sweeps, uvm.FormatSize(o.Size), uvm.FormatSize(o.Budget))
	if err := alternateOversub(runner, o.Runs, variants, progress, rep); err != nil {
		return rep, err
	}
	rep.Checked = true
	rep.ManagedToUnmanaged = rep.Managed.SweepSeconds / rep.Unmanaged.SweepSeconds
	rep.ManagedToUnmanagedWall = rep.Managed.WallSeconds / rep.Unmanaged.WallSeconds
	rep.GoalUnmanagedMet = rep.ManagedToUnmanaged <= oversubGoalRatio
	if rep.Cgroup != nil {
		ratio, wall := rep.Managed.SweepSeconds/rep.Cgroup.SweepSeconds, rep.Managed.WallSeconds/rep.Cgroup.WallSeconds
		met := ratio < 1
		rep.ManagedToCgroup, rep.ManagedToCgroupWall, rep.GoalCgroupMet = &ratio, &wall, &met
	}
	return rep, nil
}

// oversubCgroup sets the cgroup variant up, unless NoCgroup says not to
// or the machine does not allow it (then the report says why).
func oversubCgroup(o OversubOptions, progress Progress, rep *OversubReport) *memoryCgroup {
	if o.NoCgroup {
		rep.CgroupSkipped = "--no-cgroup given"
		return nil
	}
	cg, skip := setUpMemoryCgroup(o.Budget, o.Size)
	if cg == nil {
		rep.CgroupSkipped = skip
		progress("cgroup variant skipped: %s", skip)
		return nil
	}
	rep.CgroupSetup = cg.describe()
	progress("cgroup variant: %s", rep.CgroupSetup)
	return cg
}

// oversubRun is one way of running the swept program.
type oversubRun struct {
	name string
	v    *OversubVariant
	cmd  func() *exec.Cmd
	// after reads what the variant's own counters say of the run.
	after func(v *OversubVariant) error
}

// OversubVariants are the ways the program runs: plain, under uvm run
// (its --stats-json written to stats), and in the cgroup where there is
// one.
func OversubVariants(o OversubOptions, prog, stats string, cg *memoryCgroup, rep *OversubReport) []oversubRun {
	args := []string{strconv.FormatInt(o.Size, 10), strconv.Itoa(o.Sweeps)}
	variants := []oversubRun{
		{name: "unmanaged", v: &rep.Unmanaged, cmd: func() *exec.Cmd { return exec.Command(prog, args...) }},
		{name: "managed", v: &rep.Managed,
			cmd: func() *exec.Cmd {
				return exec.Command(o.UVMBin, append([]string{"run", "--quiet", "--stats-json", stats, "--host-budget", strconv.FormatInt(o.Budget, 10), "--", prog}, args...)...)
			},
			after: func(v *OversubVariant) error { return readOversubStats(stats, o.Size, v) }},
	}
	if cg == nil {
		return variants
	}
	rep.Cgroup = &OversubVariant{}
	return append(variants, oversubRun{name: "cgroup", v: rep.Cgroup,
		cmd: func() *exec.Cmd {
			cg.resetPeaks()
			argv := cg.runIn(append([]string{prog}, args...)...)
			return exec.Command(argv[0], argv[1:]...)
		},
		after: func(v *OversubVariant) error {
			v.PeakMemoryBytes, v.PeakMemorySwapBytes, v.PeakSwapBytes = cg.peaks()
			return nil
		}})
}

// alternateOversub runs a warm-up round and runs rounds of the
// variants, each variant taking each place in turn, and takes the
// medians. The cgroup variant failing drops it (the report says why);
// any other failure ends the benchmark.
func alternateOversub(runner *oversubRunner, runs int, variants []oversubRun, progress Progress, rep *OversubReport) error {
	inits := make([][]float64, len(variants))
	dropped := make([]bool, len(variants))
	for r := 0; r <= runs; r++ { // round 0 warms up
		for i := range variants {
			k := (i + r) % len(variants)
			vr := variants[k]
			if dropped[k] {
				continue
			}
			initS, sweepS, wallS, err := runner.run(vr.name+" variant", vr.cmd())
			if err != nil {
				if vr.name == "cgroup" && !runner.wasInterrupted() {
					// Reported, not fatal: the other variants still run.
					rep.CgroupSkipped = "failed: " + err.Error()
					progress("cgroup variant dropped: %v", err)
					rep.Cgroup, dropped[k] = nil, true
					continue
				}
				return err
			}
			if vr.after != nil {
				if err := vr.after(vr.v); err != nil {
					return fmt.Errorf("%s variant: %w", vr.name, err)
				}
			}
			what := "warm-up"
			if r > 0 {
				what = fmt.Sprintf("run %d", r)
				vr.v.SweepRuns = append(vr.v.SweepRuns, sweepS)
				vr.v.WallRuns = append(vr.v.WallRuns, wallS)
				inits[k] = append(inits[k], initS)
			}
			progress("%s %-9s sweeps %.3fs, wall %.3fs", what, vr.name, sweepS, wallS)
		}
	}
	for k, vr := range variants {
		if !dropped[k] {
			vr.v.SweepSeconds, vr.v.WallSeconds, vr.v.InitSeconds = median(vr.v.SweepRuns), median(vr.v.WallRuns), median(inits[k])
		}
	}
	return nil
}

// buildOversubSweep writes the swept program's source into dir and
// builds it with the C compiler (libuvm.BuildProgram: $CC, else cc,
// else gcc).
func buildOversubSweep(dir string) (string, error) {
	src, prog := filepath.Join(dir, "oversub_sweep.c"), filepath.Join(dir, "oversub_sweep")
	if err := os.WriteFile(src, []byte(oversubSweepSource), 0o644); err != nil {
		return "", err
	}
	if err := libuvm.BuildProgram(prog, src); err != nil {
		return "", fmt.Errorf("the swept program is C, built at run time: %w", err)
	}
	return prog, nil
}

// readOversubStats reads `uvm run --stats-json` and checks that the
// array was managed memory.
func readOversubStats(path string, size int64, v *OversubVariant) error {
	st, err := workloads.ReadStats(path)
	if err != nil {
		return err
	}
	if st.AllocatedBytes < uint64(size) {
		return fmt.Errorf("uvm run managed %d bytes in %d allocations, want the whole array of %d bytes: the figure would time unmanaged memory", st.AllocatedBytes, st.Allocations, size)
	}
	v.ManagedBytes = st.AllocatedBytes
	v.serverFigures.read(st)
	return nil
}

// Print writes the report.
func (r *OversubReport) Print(w io.Writer) {
	fmt.Fprintf(w, "machine: %d CPUs, Linux %s, %s; medians of %d run(s) after a warm-up, variants alternating\n", r.Machine.CPUs, r.Machine.Kernel, r.Machine.Go, r.Runs)
	fmt.Fprintf(w, "%d sweeps (read and write every word) of a %s array, host budget %s; every run checked every word: %v\n\n",
		r.Sweeps, uvm.FormatSize(r.SizeBytes), uvm.FormatSize(r.BudgetBytes), r.Checked)
	row := func(name string, v *OversubVariant) {
		fmt.Fprintf(w, "  %-36s sweeps %7.3f s  wall %7.3f s  (first write %.3f s)\n", name, v.SweepSeconds, v.WallSeconds, v.InitSeconds)
	}
	row("unmanaged", &r.Unmanaged)
	row("uvm run --host-budget "+uvm.FormatSize(r.BudgetBytes), &r.Managed)
	fmt.Fprintf(w, "    %d faults, %d pages evicted, host -> device %s, device -> host %s\n", r.Managed.Faults, r.Managed.EvictedPages,
		humanSize(r.Managed.HostToDeviceBytes), humanSize(r.Managed.DeviceToHostBytes))
	if r.Cgroup != nil {
		row("memory cgroup of "+uvm.FormatSize(r.BudgetBytes)+", zram swap", r.Cgroup)
		fmt.Fprintf(w, "    %s\n", r.CgroupSetup)
		if peaks := cgroupPeaks(r.Cgroup.PeakMemoryBytes, r.Cgroup.PeakMemorySwapBytes, r.Cgroup.PeakSwapBytes); peaks != "" {
			fmt.Fprintf(w, "    %s\n", peaks)
		}
	} else {
		fmt.Fprintf(w, "  memory cgroup variant skipped: %s\n", r.CgroupSkipped)
	}
	met := map[bool]string{true: "met", false: "NOT met"}
	fmt.Fprintf(w, "\n  managed / unmanaged  %6.2f (wall %.2f)  goal at most %.1f: %s\n", r.ManagedToUnmanaged, r.ManagedToUnmanagedWall, oversubGoalRatio, met[r.GoalUnmanagedMet])
	if r.ManagedToCgroup != nil {
		fmt.Fprintf(w, "  managed / cgroup     %6.2f (wall %.2f)  goal below 1: %s\n", *r.ManagedToCgroup, *r.ManagedToCgroupWall, met[*r.GoalCgroupMet])
	}
}
