package bench

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/softuvm/softuvm/internal/bench/workloads"
	"github.com/softuvm/softuvm/lab"
	"github.com/softuvm/softuvm/libuvm"
	"github.com/softuvm/softuvm/uvm"
)

// `uvm bench cliff` draws the budget curve: each program's time and
// faults under `uvm run --host-budget` at budgets falling from its whole
// managed peak to a quarter of it, against its plain time and against
// the faults that LRU and Belady's MIN take on the same references. The
// programs are two synthetic ones, a loop and a random walk over an
// array (C, built at run time), whose page reference string is known
// exactly and computed here, and the real programs of internal/bench/workloads,
// whose references `uvm lab bound`'s valgrind run gives (--bound).

// The goals of the budget curve (issue: no cliff near the budget).
const (
	cliffGoalAt90 = 1.5 // at 90% of the peak, at most 1.5 times plain
	cliffGoalAt50 = 3.0 // at 50%, at most 3 times plain
	cliffGoalStep = 3.0 // between neighbouring budgets, at most 3 times
	// The budgets and programs of `uvm bench cliff` without --budgets
	// and --programs.
	CliffDefaultBudgets  = "100,95,90,80,65,50,25"
	CliffDefaultPrograms = "loop,walk,gzip,xz,zstd,sort,perl"
)

// cliffPeakMeaning is what "peak" means in the report.
const cliffPeakMeaning = "the managed peak: the most managed memory the host held at once (the server's high-water mark of host-resident pages) " +
	"in a run under uvm run with no budget, with the program's own uvm run flags; what a host budget constrains, not the RSS"

// CliffReport is what `uvm bench cliff` measured, its JSON what --json
// prints.
type CliffReport struct {
	Machine Machine `json:"machine"`
	Runs    int     `json:"runs"`
	// BudgetPercents are the budgets, in percent of each program's
	// managed peak, in the order measured (falling).
	BudgetPercents []float64 `json:"budget_percents"`
	Peak           string    `json:"peak"` // what the peak is
	// Eviction and Thrashing are uvm run's --eviction and --thrashing
	// ("" where not given: uvm run's defaults).
	Eviction  string `json:"eviction,omitempty"`
	Thrashing string `json:"thrashing,omitempty"`
	// Bound: --bound was given (MIN and LRU of the real programs from
	// uvm lab bound). BoundNote says why the real programs have none
	// (no --bound, no valgrind).
	Bound     bool   `json:"bound"`
	BoundNote string `json:"bound_note,omitempty"`
	// The limit of each run: TimeoutFactor times the plain warm-up run,
	// at least TimeoutFloorSeconds, or --timeout.
	TimeoutFactor       float64 `json:"timeout_factor,omitempty"`
	TimeoutFloorSeconds float64 `json:"timeout_floor_seconds,omitempty"`
	TimeoutSeconds      float64 `json:"timeout_seconds,omitempty"`
	// The goals, checked for each program (CliffProgram.Goals).
	GoalAt90   float64        `json:"goal_at_90_at_most_x_plain"`
	GoalAt50   float64        `json:"goal_at_50_at_most_x_plain"`
	GoalStep   float64        `json:"goal_step_at_most_x"`
	Programs   []CliffProgram `json:"programs"`
	PNG        string         `json:"png,omitempty"`
	AllGoalMet bool           `json:"all_goals_met"`
}

// CliffProgram is one program's curve.
type CliffProgram struct {
	Name        string   `json:"name"`
	Synthetic   bool     `json:"synthetic,omitempty"`
	Summary     string   `json:"summary"`
	CommandLine string   `json:"command_line"`
	SizeBytes   int64    `json:"size_bytes"`
	UVMFlags    []string `json:"uvm_flags,omitempty"`
	Skipped     string   `json:"skipped,omitempty"` // not installed, failed, nothing managed
	// PeakBytes is the managed peak (CliffReport.Peak) the budgets are
	// percentages of. Notes say what may make the curve mean less than
	// it seems: a synthetic program's peak that is not its array, what
	// uvm run's preload library warned of (a managed heap it does not
	// have, say).
	PeakBytes    int64       `json:"peak_bytes"`
	Notes        []string    `json:"notes,omitempty"`
	LimitSeconds float64     `json:"limit_seconds"`
	Plain        benchTiming `json:"plain"`
	// Unbounded is uvm run with no budget: uvm run's own cost.
	Unbounded CliffPoint   `json:"unbounded"`
	Points    []CliffPoint `json:"points"` // one per budget, in the report's order
	// Where MIN's and LRU's faults come from ("computed from the exact
	// page reference string", "uvm lab bound"), or why there are none.
	BoundSource   string      `json:"bound_source,omitempty"`
	BoundNote     string      `json:"bound_note,omitempty"`
	BoundHeap     int64       `json:"bound_heap_bytes,omitempty"` // the pages the references touched
	BoundSeconds  float64     `json:"bound_seconds,omitempty"`    // what counting them took
	BoundRefCount int         `json:"bound_references,omitempty"` // after collapsing repeats
	Goals         []CliffGoal `json:"goals"`
}

// CliffPoint is one budget's figures: the median time of its runs, and
// what the server did in the last run (or, for a run cut short by its
// limit, until then).
type CliffPoint struct {
	benchTiming
	Percent     float64 `json:"percent,omitempty"` // 0: no budget
	BudgetBytes int64   `json:"budget_bytes,omitempty"`
	ToPlain     float64 `json:"to_plain,omitempty"`     // median over plain's; 0 unknown
	ToUnbounded float64 `json:"to_unbounded,omitempty"` // over uvm run's with no budget
	// The server's faults of every kind, pages evicted and bytes
	// moved, and the missing faults (first touches and pages brought
	// back) among the faults.
	serverFigures
	MissingFaults uint64 `json:"missing_faults"`
	// RecentRefaults and ProtectedPages are the host's refaults within
	// its capacity and the pages its resident core protected for them
	// (uvm.Stats Refaults).
	RecentRefaults uint64 `json:"recent_refaults"`
	ProtectedPages uint64 `json:"protected_pages"`
	HostPeakBytes  int64  `json:"host_peak_bytes"`
	// Bound is the budget against LRU and MIN, where known.
	Bound *CliffVsBound `json:"bound,omitempty"`
}

// CliffVsBound is a budget against LRU's and MIN's faults on the same
// references with room for the budget's 4 KiB pages.
type CliffVsBound struct {
	// LRU's and MIN's faults, first touches included (every policy
	// takes those, ColdFaults, and the server counts them as faults).
	LRUFaults  int64 `json:"lru_faults"`
	MINFaults  int64 `json:"min_faults"`
	ColdFaults int64 `json:"cold_faults"`
	// MINBackBytes is what MIN brings back to the host, its faults but
	// the first touches in bytes: the least any eviction with demand
	// paging brings back.
	MINBackBytes int64 `json:"min_back_bytes"`
	// The server's faults over LRU's, and the bytes it brought back
	// (DeviceToHostBytes) over MIN's, which compares what was paid
	// better where one fault brings many pages; nil for a run that did
	// not finish.
	FaultsToLRU *float64 `json:"faults_to_lru,omitempty"`
	BackToMIN   *float64 `json:"back_to_min,omitempty"`
}

// lruBackToMIN is what LRU brings back over what MIN does, 0 where MIN
// brings nothing back.
func (b *CliffVsBound) lruBackToMIN() float64 {
	if b.MINBackBytes == 0 {
		return 0
	}
	return float64((b.LRUFaults-b.ColdFaults)*lab.PageSize) / float64(b.MINBackBytes)
}

// CliffGoal is one goal checked on one program.
type CliffGoal struct {
	Goal   string `json:"goal"`
	Met    bool   `json:"met"`
	Detail string `json:"detail"`
}

// CliffOptions are what `uvm bench cliff` measures: its flags.
type CliffOptions struct {
	Programs []string  // names of CliffProgramNames (ParseCliffPrograms)
	Percents []float64 // the budgets in percent of each program's managed peak, falling (ParseCliffBudgets)
	Runs     int
	Size     map[string]int64 // inputs (arrays) by program; absent: its default (ParseCliffSizes)
	// Bound counts LRU's and MIN's faults for the real programs too,
	// from a run under valgrind.
	Bound               bool
	Eviction, Thrashing string // uvm run's flags ("": its defaults)
	UVMBin              string // runs the managed variants
	PNG                 string // "": no picture; a directory: cliff.png in it
	// Timeout limits each run; 0: TimeoutFactor times the plain warm-up
	// run, at least TimeoutFloor.
	Timeout       time.Duration
	TimeoutFactor float64
	TimeoutFloor  time.Duration
	Progress      Progress
}

// ParseCliffPrograms reads --programs: a comma list of
// CliffProgramNames, or all.
func ParseCliffPrograms(list string) ([]string, error) {
	if strings.TrimSpace(list) == "all" {
		return CliffProgramNames(), nil
	}
	known := CliffProgramNames()
	var out []string
	for _, n := range strings.Split(list, ",") {
		n = strings.TrimSpace(n)
		if n == "" {
			continue
		}
		if !slices.Contains(known, n) {
			return nil, fmt.Errorf("--programs: unknown program %q: want a comma list of %s, or all", n, strings.Join(known, ", "))
		}
		if !slices.Contains(out, n) {
			out = append(out, n)
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("--programs %q: want at least one of %s, or all", list, strings.Join(known, ", "))
	}
	return out, nil
}

// ParseCliffBudgets reads --budgets: it parses the percentages, and orders them from the
// largest down: neighbours in that order are the steps the goal checks.
func ParseCliffBudgets(list string) ([]float64, error) {
	var out []float64
	for _, item := range strings.Split(list, ",") {
		item = strings.TrimSpace(item)
		if item == "" {
			continue
		}
		f, err := strconv.ParseFloat(strings.TrimSuffix(item, "%"), 64)
		if err != nil || !(f > 0 && f <= 100) {
			return nil, fmt.Errorf("--budgets: %q is not a percentage of the peak: want a number above 0 and at most 100 (90, or 90%%)", item)
		}
		if !slices.Contains(out, f) {
			out = append(out, f)
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("--budgets %q: want at least one percentage, such as %s", list, CliffDefaultBudgets)
	}
	slices.SortFunc(out, func(a, b float64) int { return -cmpFloat(a, b) })
	return out, nil
}

func cmpFloat(a, b float64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// ParseCliffSizes reads --size: a comma list of NAME=SIZE, the array of
// a synthetic program (a multiple of 4KiB, at least 1MiB) or the input
// of a real one.
func ParseCliffSizes(list string) (map[string]int64, error) {
	return parseProgramSizes(list, CliffProgramNames(), func(kv, name string, n int64) error {
		if _, synthetic := syntheticNamed(name); synthetic && (n < 1<<20 || n%lab.PageSize != 0) {
			return fmt.Errorf("--size %s: the array of %s must be a multiple of 4KiB and at least 1MiB (uvm run manages allocations of 1MiB and more)", kv, name)
		}
		return nil
	})
}

// cliffPNGPath is where --png writes: the file named, or cliff.png in
// the directory named. It checks that the file can be written before
// the benchmark runs.
func cliffPNGPath(arg string) (string, error) {
	path := arg
	if fi, err := os.Stat(arg); (err == nil && fi.IsDir()) || strings.HasSuffix(arg, "/") {
		if err := os.MkdirAll(arg, 0o755); err != nil {
			return "", fmt.Errorf("--png %s: cannot create the directory: %w", arg, err)
		}
		path = filepath.Join(arg, "cliff.png")
	} else if !strings.EqualFold(filepath.Ext(arg), ".png") {
		return "", fmt.Errorf("--png %s: want a file name ending in .png, or a directory", arg)
	}
	existed := true
	if _, err := os.Stat(path); err != nil {
		existed = false
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE, 0o644)
	if err != nil {
		return "", fmt.Errorf("--png %s: cannot write there: %w", arg, err)
	}
	f.Close()
	if !existed {
		os.Remove(path)
	}
	return path, nil
}

// Cliff is `uvm bench cliff`, the budget curve: each program's time and
// faults under `uvm run --host-budget` at each budget, in percent of its
// managed peak, against its plain time and against the faults LRU and
// Belady's MIN take on the same references; with a PNG, the curve drawn
// there. Cancelling ctx stops the program running and ends the
// benchmark.
func Cliff(ctx context.Context, o CliffOptions) (*CliffReport, error) {
	png := ""
	if o.PNG != "" {
		var err error
		if png, err = cliffPNGPath(o.PNG); err != nil {
			return nil, err
		}
	}
	progress := o.Progress.orQuiet()
	rep := &CliffReport{Machine: ThisMachine(),
		Runs: o.Runs, BudgetPercents: o.Percents, Peak: cliffPeakMeaning, Eviction: o.Eviction, Thrashing: o.Thrashing, Bound: o.Bound,
		GoalAt90: cliffGoalAt90, GoalAt50: cliffGoalAt50, GoalStep: cliffGoalStep}
	if o.Timeout > 0 {
		rep.TimeoutSeconds = o.Timeout.Seconds()
	} else {
		rep.TimeoutFactor, rep.TimeoutFloorSeconds = o.TimeoutFactor, o.TimeoutFloor.Seconds()
	}
	if !o.Bound {
		rep.BoundNote = "not counted: give --bound (each then runs once under valgrind's lackey tool, thousands of times slower than plain)"
	} else if _, err := lab.LookValgrind(); err != nil {
		rep.BoundNote = "NOT COUNTED: --bound runs them under valgrind's lackey tool, and valgrind is not installed (Debian: apt-get install valgrind)"
	}
	if err := rep.measure(ctx, o); err != nil {
		return nil, err
	}
	if png != "" {
		if err := plotCliff(png, rep); err != nil {
			return nil, err
		}
		rep.PNG = png
		progress("wrote %s", png)
	}
	return rep, nil
}

// measure draws each program's curve into the report, in a temporary
// directory of its own.
func (rep *CliffReport) measure(ctx context.Context, o CliffOptions) error {
	dir, err := os.MkdirTemp("", "uvm-bench-cliff-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	rep.AllGoalMet = true
	for _, name := range o.Programs {
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("interrupted: %w", err)
		}
		pdir := filepath.Join(dir, name)
		if err := os.Mkdir(pdir, 0o755); err != nil {
			return err
		}
		pr, err := measureCliffProgram(ctx, o, rep.BoundNote, name, pdir)
		os.RemoveAll(pdir)
		if err != nil {
			return err
		}
		for _, g := range pr.Goals {
			rep.AllGoalMet = rep.AllGoalMet && g.Met
		}
		if pr.Skipped != "" {
			rep.AllGoalMet = false
		}
		rep.Programs = append(rep.Programs, pr)
	}
	return nil
}

// cliffWorkload prepares a program of the curve in dir: a synthetic one
// built there, or a real one's input written there. synth is set for a
// synthetic one.
func cliffWorkload(o CliffOptions, name, dir string) (w *workloads.Workload, synth *cliffSynthetic, skip string, err error) {
	if s, ok := syntheticNamed(name); ok {
		src, bin := filepath.Join(dir, s.file), filepath.Join(dir, strings.TrimSuffix(s.file, ".c"))
		if err := os.WriteFile(src, []byte(s.source), 0o644); err != nil {
			return nil, nil, "", err
		}
		if err := libuvm.BuildProgram(bin, src); err != nil {
			return nil, nil, "", fmt.Errorf("%s is a C program built at run time: %w", name, err)
		}
		size := s.defaultSize
		if n, ok := o.Size[name]; ok {
			size = n
		}
		// --min-size alone makes the array (a malloc of at least 1 MiB)
		// the only managed memory, so that the references counted here
		// are all the server sees.
		w := workloads.Synthetic(name, s.summary, append([]string{bin}, s.args(size)...), []string{"--min-size", "1MiB"}, size,
			func(out string) error { return s.check(size, out) })
		return w, &s, "", nil
	}
	p, _ := workloads.Lookup(name)
	if _, err := p.Path(); err != nil {
		return nil, nil, err.Error(), nil
	}
	size := p.DefaultSize
	if o.Bound && p.BoundSize > 0 {
		size = p.BoundSize
	}
	if n, ok := o.Size[name]; ok {
		size = n
	}
	w, err = p.Prepare(dir, size)
	return w, nil, "", err
}

// measureCliffProgram measures one program's curve; an error is fatal to
// the whole benchmark (an interruption, a failure to set up), a run's
// failure is recorded in its point.
func measureCliffProgram(ctx context.Context, o CliffOptions, boundNote, name, dir string) (pr CliffProgram, err error) {
	progress := o.Progress.orQuiet()
	pr = CliffProgram{Name: name, Plain: benchTiming{Name: "plain"}}
	w, synth, skip, err := cliffWorkload(o, name, dir)
	if err != nil {
		return pr, err
	}
	if skip != "" {
		pr.Skipped = skip
		progress("%s: skipped: %s", name, skip)
		return pr, nil
	}
	pr.Synthetic, pr.Summary, pr.SizeBytes, pr.CommandLine, pr.UVMFlags = synth != nil, w.Program.Summary, w.Size, w.CommandLine(), w.Program.UVMFlags

	// The plain warm-up run: the output every later run must match,
	// and the limit.
	ref, err := w.RunPlain(ctx, filepath.Join(dir, "plain-warmup"))
	if err != nil {
		return pr, err
	}
	if err := w.Check(ref); err != nil {
		pr.Skipped = "failed plain: " + err.Error()
		progress("%s: skipped: %v", name, err)
		return pr, nil
	}
	limit := benchLimit(o.Timeout, o.TimeoutFactor, o.TimeoutFloor, ref.Wall)
	pr.LimitSeconds = limit.Seconds()
	managed := cliffManaged(o, w)
	peakRun, err := pr.measurePeak(ctx, w, ref, limit, managed(0), filepath.Join(dir, "peak"), o.UVMBin)
	if err != nil || pr.Skipped != "" {
		if pr.Skipped != "" {
			progress("%s: skipped: %s", name, pr.Skipped)
		}
		return pr, err
	}
	pr.notePeak(o, w, synth, peakRun)
	progress("%s: %s; plain warm-up %.2fs, under uvm run with no budget %.2fs, managed peak %s; each run limited to %v",
		name, pr.CommandLine, ref.Wall.Seconds(), peakRun.Wall.Seconds(), humanSize(uint64(pr.PeakBytes)), limit.Round(time.Second))

	variants := []benchVariant{
		{t: &pr.Plain, run: w.RunPlain, warmedUp: true},
		{t: &pr.Unbounded.benchTiming, run: managed(0), warmedUp: true, after: func(r *workloads.Run) { pr.Unbounded.record(r.Stats) }},
	}
	pr.Points = make([]CliffPoint, len(o.Percents))
	for i, pct := range o.Percents {
		pt := &pr.Points[i]
		// Whole pages, at least one: the budget counts pages.
		budget := max(int64(float64(pr.PeakBytes)*pct/100)/lab.PageSize, 1) * lab.PageSize
		*pt = CliffPoint{benchTiming: benchTiming{Name: fmt.Sprintf("%g%% (%s)", pct, humanSize(uint64(budget)))}, Percent: pct, BudgetBytes: budget}
		variants = append(variants, benchVariant{t: &pt.benchTiming, run: managed(budget), after: func(r *workloads.Run) { pt.record(r.Stats) }})
	}
	if err := alternateVariants(ctx, dir, name, w, ref, limit, o.Runs, variants, progress); err != nil {
		return pr, err
	}
	pr.ratios()
	if err := cliffBound(ctx, o, boundNote, w, synth, &pr); err != nil {
		return pr, err
	}
	pr.Goals = cliffGoals(&pr)
	return pr, nil
}

// cliffManaged runs the workload under uvm run with a host budget (0:
// none) and the policies asked for.
func cliffManaged(o CliffOptions, w *workloads.Workload) func(budget int64) func(ctx context.Context, dir string) (*workloads.Run, error) {
	var flags []string
	if o.Eviction != "" {
		flags = append(flags, "--eviction", o.Eviction)
	}
	if o.Thrashing != "" {
		flags = append(flags, "--thrashing", o.Thrashing)
	}
	return func(budget int64) func(ctx context.Context, dir string) (*workloads.Run, error) {
		opts := workloads.UVMOptions{Bin: o.UVMBin, HostBudget: budget, Flags: flags}
		return func(ctx context.Context, dir string) (*workloads.Run, error) { return w.RunUVM(ctx, dir, opts) }
	}
}

// measurePeak runs the program under uvm run with no budget once, within
// limit and checked against ref: its host peak is the managed peak the
// budgets are percentages of, and the run the warm-up of the variant with
// no budget. A program that fails there, or whose memory uvm run did not
// manage, is skipped (Skipped says why); the error is an interruption.
func (pr *CliffProgram) measurePeak(ctx context.Context, w *workloads.Workload, ref *workloads.Run, limit time.Duration,
	unbounded func(ctx context.Context, dir string) (*workloads.Run, error), dir, uvmBin string) (*workloads.Run, error) {
	pr.Unbounded = CliffPoint{benchTiming: benchTiming{Name: "no budget"}}
	pctx, cancel := context.WithTimeout(ctx, limit)
	peakRun, err := unbounded(pctx, dir)
	timedOut := pctx.Err() == context.DeadlineExceeded
	cancel()
	if ctx.Err() != nil {
		return nil, fmt.Errorf("interrupted: %w", ctx.Err())
	}
	if timedOut {
		err = fmt.Errorf("did not finish within %v", limit.Round(time.Second))
	}
	if err == nil {
		if err = w.Check(peakRun); err == nil {
			err = w.Compare(ref, peakRun)
		}
	}
	if err != nil {
		pr.Skipped = "failed under uvm run with no budget: " + err.Error()
		return nil, nil
	}
	pr.PeakBytes = peakRun.Stats.HostPeakBytes
	switch {
	case pr.PeakBytes <= 0 && peakRun.Stats.PopulatedBytes() > 0:
		pr.Skipped = fmt.Sprintf("the uvm run of %s reports no host peak (host_peak_bytes in its --stats-json) though the program touched %s of managed memory: "+
			"a uvm from before the host peak was counted? The budgets are percentages of it", uvmBin, humanSize(peakRun.Stats.PopulatedBytes()))
	case pr.PeakBytes <= 0:
		pr.Skipped = fmt.Sprintf("uvm run managed none of its memory (%d allocations, host peak 0): no host budget constrains it", peakRun.Stats.Allocations)
	}
	return peakRun, nil
}

// notePeak notes what may make the curve mean less than it seems (a
// synthetic program's peak that is not its array, what uvm run's preload
// library warned of), and records the peak run as the unbounded point's.
func (pr *CliffProgram) notePeak(o CliffOptions, w *workloads.Workload, synth *cliffSynthetic, peakRun *workloads.Run) {
	if synth != nil && pr.PeakBytes != w.Size {
		pr.Notes = append(pr.Notes, fmt.Sprintf("the managed peak is not the array's %s: the reference string counted here may not be all the server saw", humanSize(uint64(w.Size))))
	}
	for _, line := range strings.Split(peakRun.Stderr, "\n") {
		if strings.Contains(line, "libuvm-preload") {
			pr.Notes = append(pr.Notes, "under uvm run: "+strings.TrimSpace(line))
		}
	}
	pr.Unbounded.record(peakRun.Stats)
}

// ratios computes each point's time over plain's and over the unbounded
// run's, where both finished.
func (pr *CliffProgram) ratios() {
	for _, pt := range append([]*CliffPoint{&pr.Unbounded}, pointers(pr.Points)...) {
		if pt.ok() && pr.Plain.ok() {
			pt.ToPlain = pt.Seconds / pr.Plain.Seconds
		}
		if pt.ok() && pr.Unbounded.ok() {
			pt.ToUnbounded = pt.Seconds / pr.Unbounded.Seconds
		}
	}
}

func pointers(pts []CliffPoint) []*CliffPoint {
	out := make([]*CliffPoint, len(pts))
	for i := range pts {
		out[i] = &pts[i]
	}
	return out
}

// record keeps what the server of a run did.
func (p *CliffPoint) record(st *workloads.RunStats) {
	if st == nil {
		return
	}
	p.serverFigures.read(st)
	p.MissingFaults, p.HostPeakBytes = 0, st.HostPeakBytes
	for _, f := range st.Stats.Faults {
		p.MissingFaults += f.Missing
	}
	p.RecentRefaults, p.ProtectedPages = 0, 0
	for _, r := range st.Stats.Refaults {
		if r.Processor == uvm.CPU {
			p.RecentRefaults, p.ProtectedPages = r.Recent, r.Protected
		}
	}
}

// cliffBound counts LRU's and MIN's faults at each budget: from the
// synthetic program's reference string, computed; from a real program's
// run under valgrind with --bound.
func cliffBound(ctx context.Context, o CliffOptions, boundNote string, w *workloads.Workload, synth *cliffSynthetic, pr *CliffProgram) error {
	progress := o.Progress.orQuiet()
	start := time.Now()
	var misses func(budget int64) lab.Misses
	switch {
	case synth != nil:
		stream, err := lab.PageRefs(synth.refs(w.Size))
		if err != nil {
			return fmt.Errorf("%s's reference string: %w", pr.Name, err)
		}
		g, err := stream.Granules(nil, lab.PageSize)
		if err != nil {
			return err
		}
		pr.BoundSource = "computed from the program's exact page reference string"
		pr.BoundHeap, pr.BoundRefCount = g.Footprint(), g.References()
		misses = func(budget int64) lab.Misses { return g.Misses(int(budget / lab.PageSize)) }
	case boundNote != "":
		pr.BoundNote = boundNote
		return nil
	default:
		var budgets []lab.BoundBudget
		for _, pt := range pr.Points {
			budgets = append(budgets, lab.BoundBudget{Text: pt.Name, Bytes: pt.BudgetBytes})
		}
		rep, err := cliffLackey(ctx, o, w, budgets)
		if err != nil {
			if ctx.Err() != nil {
				return fmt.Errorf("interrupted: %w", ctx.Err())
			}
			pr.BoundNote = "uvm lab bound failed: " + err.Error()
			progress("%s: %s", pr.Name, pr.BoundNote)
			return nil
		}
		pr.BoundSource = "uvm lab bound (every load and store of a run under valgrind's lackey tool; the heap is every page outside files' mappings and the main stack, allocator " + rep.Allocator + ")"
		pr.BoundHeap, pr.BoundRefCount = rep.HeapBytes, rep.Granules[0].References
		rows := rep.Granules[0].Rows
		misses = func(budget int64) lab.Misses {
			for _, r := range rows {
				if r.BudgetBytes == budget {
					return lab.Misses{Cold: r.Cold, LRU: r.LRU, OPT: r.OPT}
				}
			}
			panic("cliffBound: a budget uvm lab bound was not asked for")
		}
	}
	pr.BoundSeconds = time.Since(start).Seconds()
	for i := range pr.Points {
		pt := &pr.Points[i]
		m := misses(pt.BudgetBytes)
		b := &CliffVsBound{LRUFaults: m.Cold + m.LRU, MINFaults: m.Cold + m.OPT, ColdFaults: m.Cold, MINBackBytes: m.OPT * lab.PageSize}
		pt.Bound = b
		if pt.Failed != "" {
			continue // what it did until then: no ratio
		}
		if b.LRUFaults > 0 {
			x := float64(pt.Faults) / float64(b.LRUFaults)
			b.FaultsToLRU = &x
		}
		if b.MINBackBytes > 0 {
			x := float64(pt.DeviceToHostBytes) / float64(b.MINBackBytes)
			b.BackToMIN = &x
		}
	}
	return nil
}

// cliffLackey runs the workload once under valgrind's lackey, as uvm lab
// bound does, and counts LRU's and MIN's faults at the budgets, in 4 KiB
// pages, with a progress line every 30 s.
func cliffLackey(ctx context.Context, o CliffOptions, w *workloads.Workload, budgets []lab.BoundBudget) (*lab.BoundReport, error) {
	progress := o.Progress.orQuiet()
	// uvm run's managed heap is jemalloc's, but where the program's flags
	// give --min-size alone (the system allocator's heap, large
	// allocations managed).
	allocator := "jemalloc"
	if slices.Contains(w.Program.UVMFlags, "--min-size") && !slices.Contains(w.Program.UVMFlags, "--heap") {
		allocator = "system"
	}
	bo := lab.BoundOptions{Budgets: budgets, Granules: []int64{lab.PageSize}, Allocator: allocator, Env: w.Env, ProgressEvery: 30 * time.Second}
	rdir := filepath.Join(w.Dir, "bound")
	if err := os.MkdirAll(rdir, 0o755); err != nil {
		return nil, err
	}
	defer os.RemoveAll(rdir)
	bo.Dir = rdir
	in, err := w.OpenStdin()
	if err != nil {
		return nil, err
	}
	defer in.Close()
	bo.Stdin = in
	name := w.Program.Name
	progress("%s: counting LRU's and MIN's faults: %s once under valgrind's lackey tool (thousands of times slower than plain)", name, w.CommandLine())
	bo.Progress = func(read int64, took time.Duration, done bool) {
		if !done {
			progress("%s under valgrind: %s of lackey output read in %v", name, humanSize(uint64(read)), took.Round(time.Second))
		} else {
			progress("%s under valgrind: done in %v (%s of lackey output)", name, took.Round(time.Second), humanSize(uint64(read)))
		}
	}
	return lab.MeasureBound(ctx, w.Argv, bo)
}
