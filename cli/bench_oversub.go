package cli

import (
	"bytes"
	_ "embed"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
	"unsafe"

	"github.com/softuvm/softuvm/libuvm"
	"github.com/softuvm/softuvm/uvm"
)

// oversubSweepSource is the swept program, built at run time with the C
// compiler: it must be an ordinary C program whose malloc libuvm-preload.so
// interposes under `uvm run`.
//
//go:embed csrc/oversub_sweep.c
var oversubSweepSource string

// oversubReport is what `uvm bench oversub --json` prints. Times are
// medians over runs, after a warm-up run of each variant that is not
// counted; the variants alternate within each round.
type oversubReport struct {
	Machine     machineSummary `json:"machine"`
	Runs        int            `json:"runs"`
	BudgetBytes int64          `json:"budget_bytes"`
	SizeBytes   int64          `json:"size_bytes"`
	Sweeps      int            `json:"sweeps"`

	// The same program three ways: plain, under `uvm run --host-budget
	// BUDGET`, and plain in a memory cgroup limited to BUDGET with zram
	// swap (nil, with the reason in CgroupSkipped, where the machine does
	// not allow it).
	Unmanaged     oversubVariant  `json:"unmanaged"`
	Managed       oversubVariant  `json:"managed"`
	Cgroup        *oversubVariant `json:"cgroup"`
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

type oversubVariant struct {
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

type oversubOptions struct {
	budget, size  int64
	sweeps, runs  int
	uvmBin        string // runs the managed variant: `uvmBin run ...`
	noCgroup      bool
	progress      func(format string, a ...any)
	interruptions <-chan os.Signal // nil: none
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
	self := *uvmBin
	if self == "" {
		if self, err = os.Executable(); err != nil {
			return fmt.Errorf("the path of this uvm binary, for uvm run: %w", err)
		}
	}
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
	defer signal.Stop(sigs)
	rep, err := oversubBench(oversubOptions{
		budget: budget, size: size, sweeps: *sweeps, runs: *runs, uvmBin: self, noCgroup: *noCgroup,
		progress:      func(format string, a ...any) { fmt.Fprintf(os.Stderr, "uvm bench: "+format+"\n", a...) },
		interruptions: sigs,
	})
	if err != nil {
		return err
	}
	if *asJSON {
		return writeJSON(os.Stdout, rep)
	}
	printOversubReport(rep)
	return nil
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

func oversubBench(o oversubOptions) (rep oversubReport, err error) {
	progress := o.progress
	if progress == nil {
		progress = func(string, ...any) {}
	}
	rep = oversubReport{Machine: machineSummary{CPUs: cpus(), Kernel: kernelRelease(), Go: goVersion()},
		Runs: o.runs, BudgetBytes: o.budget, SizeBytes: o.size, Sweeps: o.sweeps}

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
	if o.interruptions != nil {
		go runner.watch(o.interruptions, done)
	}

	var cg *oversubCgroup
	if o.noCgroup {
		rep.CgroupSkipped = "--no-cgroup given"
	} else {
		var skip string
		cg, skip = setupOversubCgroup(o.budget, o.size)
		if cg == nil {
			rep.CgroupSkipped = skip
			progress("cgroup variant skipped: %s", skip)
		} else {
			rep.CgroupSetup = cg.describe()
			progress("cgroup variant: %s", rep.CgroupSetup)
			defer func() {
				if terr := cg.teardown(); terr != nil {
					fmt.Fprintf(os.Stderr, "uvm bench: tearing down the cgroup variant: %v\n", terr)
					if err == nil {
						err = terr
					}
				}
			}()
		}
	}

	args := []string{strconv.FormatInt(o.size, 10), strconv.Itoa(o.sweeps)}
	stats := filepath.Join(dir, "stats.json")
	type variant struct {
		name string
		v    *oversubVariant
		cmd  func() *exec.Cmd
		// after reads what the variant's own counters say of the run.
		after func(v *oversubVariant) error
	}
	variants := []variant{
		{name: "unmanaged", v: &rep.Unmanaged, cmd: func() *exec.Cmd { return exec.Command(prog, args...) }},
		{name: "managed", v: &rep.Managed,
			cmd: func() *exec.Cmd {
				return exec.Command(o.uvmBin, append([]string{"run", "--quiet", "--stats-json", stats, "--host-budget", strconv.FormatInt(o.budget, 10), "--", prog}, args...)...)
			},
			after: func(v *oversubVariant) error { return readOversubStats(stats, o.size, v) }},
	}
	if cg != nil {
		rep.Cgroup = &oversubVariant{}
		variants = append(variants, variant{name: "cgroup", v: rep.Cgroup,
			cmd: func() *exec.Cmd {
				cg.resetPeaks()
				// The shell moves itself into the cgroup, then becomes
				// the program.
				return exec.Command("/bin/sh", append([]string{"-c", `echo $$ > "$1" && shift && exec "$@"`, "sh", cg.procs(), prog}, args...)...)
			},
			after: func(v *oversubVariant) error {
				v.PeakMemoryBytes, v.PeakMemorySwapBytes, v.PeakSwapBytes = cg.peaks()
				return nil
			}})
	}
	progress("%d runs of each of %d variants after a warm-up of each: %d sweeps of %s, host budget %s", o.runs, len(variants), o.sweeps, uvm.FormatSize(o.size), uvm.FormatSize(o.budget))
	inits := make([][]float64, len(variants))
	dropped := make([]bool, len(variants))
	for r := 0; r <= o.runs; r++ { // round 0 warms up
		for i := range variants {
			k := (i + r) % len(variants) // each variant takes each place in turn
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
				return rep, err
			}
			if vr.after != nil {
				if err := vr.after(vr.v); err != nil {
					return rep, fmt.Errorf("%s variant: %w", vr.name, err)
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
func readOversubStats(path string, size int64, v *oversubVariant) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	var r runReport
	if err := json.Unmarshal(b, &r); err != nil {
		return fmt.Errorf("uvm run --stats-json %s: %w", path, err)
	}
	if r.AllocatedBytes < uint64(size) {
		return fmt.Errorf("uvm run managed %d bytes in %d allocations, want the whole array of %d bytes: the figure would time unmanaged memory", r.AllocatedBytes, r.Allocations, size)
	}
	v.ManagedBytes, v.EvictedPages, v.HostToDeviceBytes, v.DeviceToHostBytes = r.AllocatedBytes, r.EvictedPages, r.HostToDeviceBytes, r.DeviceToHostBytes
	v.Faults = 0
	for _, f := range r.Faults {
		v.Faults += f.Total()
	}
	return nil
}

// oversubCgroup is the cgroup variant's setup: a memory cgroup (v1, or
// v2 where the memory controller is on the unified hierarchy, as on most
// machines now) limited to the budget, and a zram swap device. teardown
// undoes what was done, in reverse.
type oversubCgroup struct {
	dir       string // the cgroup
	v2        bool   // on the unified hierarchy: memory.max, memory.swap.max, memory.peak
	limit     int64
	memsw     bool // swap is accounted: v1 memory.memsw.*, v2 memory.swap.*
	zram      int  // the zram device's number
	hotAdded  bool // zram device added by us: removed again
	swapDev   string
	algorithm string
	diskSize  int64
	undo      []func() error // in the order done
	// v2: memory.peak and memory.swap.peak kept open from resetPeaks to
	// peaks, since a write resets the peak only as that open file reads
	// it (Linux 6.12 and later; before, the write fails and the peak is
	// the cgroup's since it was made).
	peakFiles [2]*os.File
}

func (c *oversubCgroup) procs() string { return filepath.Join(c.dir, "cgroup.procs") }

func (c *oversubCgroup) describe() string {
	swap := "swap not accounted"
	switch {
	case c.memsw && c.v2:
		swap = fmt.Sprintf("swap limit %s", uvm.FormatSize(c.diskSize))
	case c.memsw:
		swap = fmt.Sprintf("memory+swap limit %s", uvm.FormatSize(c.limit+c.diskSize))
	}
	version := "v1"
	if c.v2 {
		version = "v2"
	}
	// Swap readahead (pages read per swap-in: 2^page-cluster) changes
	// what a swap-in costs; the benchmark leaves it as the machine has it.
	cluster, _ := os.ReadFile("/proc/sys/vm/page-cluster")
	return fmt.Sprintf("memory cgroup %s %s, limit %s, %s; swap on zram%d (%s, %s), vm.page-cluster %s", version, c.dir, uvm.FormatSize(c.limit), swap, c.zram, c.algorithm,
		uvm.FormatSize(c.diskSize), strings.TrimSpace(string(cluster)))
}

func (c *oversubCgroup) teardown() error {
	c.closePeakFiles()
	var errs []error
	for i := len(c.undo) - 1; i >= 0; i-- {
		if err := c.undo[i](); err != nil {
			errs = append(errs, err)
		}
	}
	c.undo = nil
	return errors.Join(errs...)
}

func (c *oversubCgroup) closePeakFiles() {
	for i, f := range c.peakFiles {
		if f != nil {
			f.Close()
			c.peakFiles[i] = nil
		}
	}
}

// resetPeaks starts the peaks that peaks then reads afresh.
func (c *oversubCgroup) resetPeaks() {
	if !c.v2 {
		os.WriteFile(filepath.Join(c.dir, "memory.max_usage_in_bytes"), []byte("0"), 0)
		if c.memsw {
			os.WriteFile(filepath.Join(c.dir, "memory.memsw.max_usage_in_bytes"), []byte("0"), 0)
		}
		return
	}
	c.closePeakFiles()
	for i, name := range []string{"memory.peak", "memory.swap.peak"} {
		f, err := os.OpenFile(filepath.Join(c.dir, name), os.O_RDWR, 0)
		if err != nil {
			continue // a kernel before 5.19 (memory.peak) or 6.5 (memory.swap.peak)
		}
		f.WriteString("reset\n")
		c.peakFiles[i] = f
	}
}

// peaks reads the peaks since resetPeaks: of memory, and on v1 of memory
// plus swap (memsw), on v2 of swap alone.
func (c *oversubCgroup) peaks() (mem, memsw, swap int64) {
	parse := func(b []byte) int64 {
		n, _ := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
		return n
	}
	if c.v2 {
		read := func(f *os.File) int64 {
			if f == nil {
				return 0
			}
			b := make([]byte, 32)
			n, _ := f.ReadAt(b, 0)
			return parse(b[:n])
		}
		return read(c.peakFiles[0]), 0, read(c.peakFiles[1])
	}
	read := func(name string) int64 {
		b, _ := os.ReadFile(filepath.Join(c.dir, name))
		return parse(b)
	}
	mem = read("memory.max_usage_in_bytes")
	if c.memsw {
		memsw = read("memory.memsw.max_usage_in_bytes")
	}
	return mem, memsw, 0
}

// oomKills is how many processes the cgroup's OOM killer has killed.
func (c *oversubCgroup) oomKills() int64 {
	name := "memory.oom_control"
	if c.v2 {
		name = "memory.events"
	}
	b, _ := os.ReadFile(filepath.Join(c.dir, name))
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "oom_kill "); ok {
			n, _ := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			return n
		}
	}
	return 0
}

// cgroupPeaks says a cgroup variant's peaks, "" where none was read.
func cgroupPeaks(mem, memsw, swap int64) string {
	switch {
	case memsw > 0:
		return fmt.Sprintf("peak memory %s, memory+swap %s", humanSize(uint64(mem)), humanSize(uint64(memsw)))
	case swap > 0:
		return fmt.Sprintf("peak memory %s, swap %s", humanSize(uint64(mem)), humanSize(uint64(swap)))
	case mem > 0:
		return fmt.Sprintf("peak memory %s", humanSize(uint64(mem)))
	}
	return ""
}

func writeSys(path, value string) error {
	if err := os.WriteFile(path, []byte(value), 0); err != nil {
		return fmt.Errorf("writing %q to %s: %w", value, path, err)
	}
	return nil
}

// setupOversubCgroup sets the cgroup variant up: a memory cgroup (v1)
// limited to budget, and a zram swap device big enough for the rest of
// the array. Where the machine does not allow it, it undoes what it did
// and says why.
func setupOversubCgroup(budget, size int64) (*oversubCgroup, string) {
	if os.Geteuid() != 0 {
		return nil, "not root: setting up a memory cgroup and a swap device needs root"
	}
	c := &oversubCgroup{limit: budget}
	fail := func(format string, a ...any) (*oversubCgroup, string) {
		if err := c.teardown(); err != nil {
			format += " (and undoing the setup: %v)"
			a = append(a, err)
		}
		return nil, fmt.Sprintf(format, a...)
	}

	// The memory controller: on a mounted v1 hierarchy, on the unified
	// (v2) one, or on a v1 hierarchy mounted here.
	mount, v2, err := memoryCgroupMount()
	if err != nil {
		return fail("%v", err)
	}
	c.v2 = v2
	if mount == "" {
		dir, err := os.MkdirTemp("", "uvm-bench-memcg-")
		if err != nil {
			return fail("%v", err)
		}
		if err := syscall.Mount("cgroup", dir, "cgroup", 0, "memory"); err != nil {
			os.Remove(dir)
			return fail("the memory controller is on no mounted hierarchy, and mounting a v1 one at %s failed: %v", dir, err)
		}
		mount = dir
		c.undo = append(c.undo, func() error {
			if err := syscall.Unmount(dir, 0); err != nil {
				return fmt.Errorf("unmount %s: %w", dir, err)
			}
			return os.Remove(dir)
		})
	}
	if v2 {
		// A v2 cgroup has the memory controller only where its parent
		// hands it down.
		control := filepath.Join(mount, "cgroup.subtree_control")
		b, err := os.ReadFile(control)
		if err != nil {
			return fail("%v", err)
		}
		if !slices.Contains(strings.Fields(string(b)), "memory") {
			if err := writeSys(control, "+memory"); err != nil {
				return fail("%v", err)
			}
			c.undo = append(c.undo, func() error { return writeSys(control, "-memory") })
		}
	}

	// A zram device of our own: hot-added, else zram0 if unused.
	if _, err := zramPresent(true); err != nil {
		return fail("no zram: %v", err)
	}
	if b, err := os.ReadFile("/sys/class/zram-control/hot_add"); err == nil {
		n, err := strconv.Atoi(strings.TrimSpace(string(b)))
		if err != nil {
			return fail("/sys/class/zram-control/hot_add said %q", b)
		}
		c.zram, c.hotAdded = n, true
		c.undo = append(c.undo, func() error {
			return writeSys("/sys/class/zram-control/hot_remove", strconv.Itoa(n))
		})
	} else {
		b, err := os.ReadFile("/sys/block/zram0/disksize")
		if err != nil {
			return fail("no zram device: neither /sys/class/zram-control/hot_add nor /sys/block/zram0 (%v)", err)
		}
		if strings.TrimSpace(string(b)) != "0" {
			return fail("zram0 is in use (disksize %s) and no other zram device can be added", strings.TrimSpace(string(b)))
		}
		c.zram = 0
	}
	zdir := fmt.Sprintf("/sys/block/zram%d", c.zram)
	c.undo = append(c.undo, func() error { return writeSys(zdir+"/reset", "1") })
	algs, _ := os.ReadFile(zdir + "/comp_algorithm")
	c.algorithm = thpSetting(zdir + "/comp_algorithm") // the one in brackets
	if strings.Contains(" "+strings.NewReplacer("[", " ", "]", " ").Replace(string(algs))+" ", " lz4 ") {
		if err := writeSys(zdir+"/comp_algorithm", "lz4"); err != nil {
			return fail("%v", err)
		}
		c.algorithm = "lz4"
	}
	c.diskSize = (2*size + 1<<20 - 1) &^ (1<<20 - 1)
	if err := writeSys(zdir+"/disksize", strconv.FormatInt(c.diskSize, 10)); err != nil {
		return fail("%v", err)
	}
	dev, err := zramNode(c.zram)
	if err != nil {
		return fail("%v", err)
	}
	if dev.tmp != "" {
		c.undo = append(c.undo, func() error { return os.Remove(dev.tmp) })
	}
	c.swapDev = dev.path
	if mkswap, err := exec.LookPath("mkswap"); err == nil {
		if out, err := exec.Command(mkswap, dev.path).CombinedOutput(); err != nil {
			return fail("%s %s: %v: %s", mkswap, dev.path, err, strings.TrimSpace(string(out)))
		}
	} else if err := writeSwapHeader(dev.path, c.diskSize); err != nil {
		return fail("%v", err)
	}
	if err := swapOn(dev.path); err != nil {
		return fail("%v", err)
	}
	c.undo = append(c.undo, func() error { return swapOff(dev.path) })

	// The cgroup.
	c.dir = filepath.Join(mount, fmt.Sprintf("uvm-bench-oversub-%d", os.Getpid()))
	if err := os.Mkdir(c.dir, 0o755); err != nil {
		return fail("%v", err)
	}
	cgDir := c.dir
	c.undo = append(c.undo, func() error { return removeCgroup(cgDir) })
	if c.v2 {
		if err := writeSys(filepath.Join(c.dir, "memory.max"), strconv.FormatInt(budget, 10)); err != nil {
			return fail("%v", err)
		}
		// Swap: room for the whole array (memory.swap.max exists where
		// the kernel accounts swap).
		if _, err := os.Stat(filepath.Join(c.dir, "memory.swap.max")); err == nil {
			c.memsw = true
			if err := writeSys(filepath.Join(c.dir, "memory.swap.max"), strconv.FormatInt(c.diskSize, 10)); err != nil {
				return fail("%v", err)
			}
		}
		return c, ""
	}
	if err := writeSys(filepath.Join(c.dir, "memory.limit_in_bytes"), strconv.FormatInt(budget, 10)); err != nil {
		return fail("%v", err)
	}
	// Memory plus swap: room for the whole array in swap (the limit of
	// memory alone is the budget).
	if _, err := os.Stat(filepath.Join(c.dir, "memory.memsw.limit_in_bytes")); err == nil {
		c.memsw = true
		if err := writeSys(filepath.Join(c.dir, "memory.memsw.limit_in_bytes"), strconv.FormatInt(budget+c.diskSize, 10)); err != nil {
			return fail("%v", err)
		}
	}
	return c, ""
}

// zramPresent says how this machine offers zram devices: loaded, with
// devices added on demand (/sys/class/zram-control) or a zram0, or as a
// module, which load loads (modprobe) and which is otherwise only looked
// for (modprobe --dry-run), as `uvm doctor` asks, changing nothing. The
// error says why there is none; it wraps exec.ErrNotFound where modprobe
// itself is missing.
func zramPresent(load bool) (string, error) {
	if _, err := os.Stat("/sys/class/zram-control"); err == nil {
		return "zram loaded; devices are added on demand (/sys/class/zram-control)", nil
	}
	if _, err := os.Stat("/sys/block/zram0"); err == nil {
		return "zram loaded (/sys/block/zram0)", nil
	}
	args := []string{"zram"}
	if !load {
		args = []string{"--dry-run", "zram"}
	}
	out, err := exec.Command("modprobe", args...).CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("/sys/block/zram0 does not exist and modprobe %s failed: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	if load {
		return "zram module loaded", nil
	}
	return "zram module available (the benchmarks load it)", nil
}

// memoryCgroupMount finds where a cgroup with the memory controller can
// be made: the mount of a v1 hierarchy that has it; else the unified (v2)
// hierarchy's mount, where the controller is on it (v2 true); else "" if
// the controller is enabled but on no mounted hierarchy, free to mount.
func memoryCgroupMount() (mount string, v2 bool, err error) {
	mounts, err := os.ReadFile("/proc/mounts")
	if err != nil {
		return "", false, err
	}
	unified := ""
	for _, line := range strings.Split(string(mounts), "\n") {
		f := strings.Fields(line)
		if len(f) < 4 {
			continue
		}
		switch f[2] {
		case "cgroup":
			if slices.Contains(strings.Split(f[3], ","), "memory") {
				return f[1], false, nil
			}
		case "cgroup2":
			if unified == "" {
				unified = f[1]
			}
		}
	}
	if unified != "" {
		b, err := os.ReadFile(filepath.Join(unified, "cgroup.controllers"))
		if err == nil && slices.Contains(strings.Fields(string(b)), "memory") {
			return unified, true, nil
		}
	}
	cgroups, err := os.ReadFile("/proc/cgroups")
	if err != nil {
		return "", false, fmt.Errorf("no cgroups here: %v", err)
	}
	for _, line := range strings.Split(string(cgroups), "\n") {
		f := strings.Fields(line)
		if len(f) == 4 && f[0] == "memory" {
			if f[3] != "1" {
				return "", false, fmt.Errorf("the memory cgroup controller is disabled (/proc/cgroups)")
			}
			return "", false, nil
		}
	}
	return "", false, fmt.Errorf("the kernel has no memory cgroup controller (/proc/cgroups)")
}

type zramDevice struct{ path, tmp string }

// zramNode is /dev/zramN, or a node made for it in a temporary place
// where /dev has none.
func zramNode(n int) (zramDevice, error) {
	p := fmt.Sprintf("/dev/zram%d", n)
	for i := 0; i < 50; i++ { // devtmpfs adds a hot-added device's node shortly
		if _, err := os.Stat(p); err == nil {
			return zramDevice{path: p}, nil
		}
		time.Sleep(10 * time.Millisecond)
	}
	b, err := os.ReadFile(fmt.Sprintf("/sys/block/zram%d/dev", n))
	if err != nil {
		return zramDevice{}, fmt.Errorf("no %s and no device number for it: %v", p, err)
	}
	var major, minor uint32
	if _, err := fmt.Sscanf(strings.TrimSpace(string(b)), "%d:%d", &major, &minor); err != nil {
		return zramDevice{}, fmt.Errorf("/sys/block/zram%d/dev: %q", n, b)
	}
	tmp := filepath.Join(os.TempDir(), fmt.Sprintf("uvm-bench-zram%d-%d", n, os.Getpid()))
	dev := int((major << 8) | (minor & 0xff) | ((minor &^ 0xff) << 12))
	if err := syscall.Mknod(tmp, syscall.S_IFBLK|0o600, dev); err != nil {
		return zramDevice{}, fmt.Errorf("no %s, and mknod %s: %v", p, tmp, err)
	}
	return zramDevice{path: tmp, tmp: tmp}, nil
}

// swapHeader is a version 1 swap area's first page, as mkswap writes it:
// the version, the last usable page and no bad pages after 1024 bytes
// of boot block, and the magic at the end of the page.
func swapHeader(size int64) []byte {
	const page = 4096
	h := make([]byte, page)
	binary.LittleEndian.PutUint32(h[1024:], 1)                           // version
	binary.LittleEndian.PutUint32(h[1028:], uint32(size/page-1))         // last_page
	binary.LittleEndian.PutUint32(h[1032:], 0)                           // nr_badpages
	copy(h[1036:1052], []byte(fmt.Sprintf("uvmbench%08x", os.Getpid()))) // uuid: any 16 bytes
	copy(h[page-10:], "SWAPSPACE2")
	return h
}

func writeSwapHeader(path string, size int64) error {
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	_, err = f.WriteAt(swapHeader(size), 0)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("writing a swap header to %s: %w", path, err)
	}
	return nil
}

func swapOn(path string) error {
	p, err := syscall.BytePtrFromString(path)
	if err != nil {
		return err
	}
	// Preferred over any other swap (priority 100), so that the cgroup
	// swaps to this device.
	const swapFlagPrefer = 0x8000
	if _, _, e := syscall.Syscall(syscall.SYS_SWAPON, uintptr(unsafe.Pointer(p)), swapFlagPrefer|100, 0); e != 0 {
		return fmt.Errorf("swapon %s: %w", path, e)
	}
	return nil
}

func swapOff(path string) error {
	p, err := syscall.BytePtrFromString(path)
	if err != nil {
		return err
	}
	if _, _, e := syscall.Syscall(syscall.SYS_SWAPOFF, uintptr(unsafe.Pointer(p)), 0, 0); e != 0 {
		return fmt.Errorf("swapoff %s: %w", path, e)
	}
	return nil
}

// removeCgroup removes an empty cgroup; its last task may take a moment
// to leave after exiting.
func removeCgroup(dir string) error {
	var err error
	for i := 0; i < 100; i++ {
		if err = syscall.Rmdir(dir); err == nil || errors.Is(err, syscall.ENOENT) {
			return nil
		}
		time.Sleep(20 * time.Millisecond)
	}
	return fmt.Errorf("rmdir %s: %w", dir, err)
}

func printOversubReport(r oversubReport) {
	fmt.Printf("machine: %d CPUs, Linux %s, %s; medians of %d run(s) after a warm-up, variants alternating\n", r.Machine.CPUs, r.Machine.Kernel, r.Machine.Go, r.Runs)
	fmt.Printf("%d sweeps (read and write every word) of a %s array, host budget %s; every run checked every word: %v\n\n",
		r.Sweeps, uvm.FormatSize(r.SizeBytes), uvm.FormatSize(r.BudgetBytes), r.Checked)
	row := func(name string, v *oversubVariant) {
		fmt.Printf("  %-36s sweeps %7.3f s  wall %7.3f s  (first write %.3f s)\n", name, v.SweepSeconds, v.WallSeconds, v.InitSeconds)
	}
	row("unmanaged", &r.Unmanaged)
	row("uvm run --host-budget "+uvm.FormatSize(r.BudgetBytes), &r.Managed)
	fmt.Printf("    %d faults, %d pages evicted, host -> device %s, device -> host %s\n", r.Managed.Faults, r.Managed.EvictedPages,
		humanSize(r.Managed.HostToDeviceBytes), humanSize(r.Managed.DeviceToHostBytes))
	if r.Cgroup != nil {
		row("memory cgroup of "+uvm.FormatSize(r.BudgetBytes)+", zram swap", r.Cgroup)
		fmt.Printf("    %s\n", r.CgroupSetup)
		if peaks := cgroupPeaks(r.Cgroup.PeakMemoryBytes, r.Cgroup.PeakMemorySwapBytes, r.Cgroup.PeakSwapBytes); peaks != "" {
			fmt.Printf("    %s\n", peaks)
		}
	} else {
		fmt.Printf("  memory cgroup variant skipped: %s\n", r.CgroupSkipped)
	}
	met := map[bool]string{true: "met", false: "NOT met"}
	fmt.Printf("\n  managed / unmanaged  %6.2f (wall %.2f)  goal at most %.1f: %s\n", r.ManagedToUnmanaged, r.ManagedToUnmanagedWall, oversubGoalRatio, met[r.GoalUnmanagedMet])
	if r.ManagedToCgroup != nil {
		fmt.Printf("  managed / cgroup     %6.2f (wall %.2f)  goal below 1: %s\n", *r.ManagedToCgroup, *r.ManagedToCgroupWall, met[*r.GoalCgroupMet])
	}
}
