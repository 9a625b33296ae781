package cli

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/softuvm/softuvm/internal/core"
	"github.com/softuvm/softuvm/lab"
	"github.com/softuvm/softuvm/libuvm"
)

// mapsDumperSource is preloaded into the program under valgrind: at exit
// it copies /proc/self/maps to $UVM_BOUND_MAPS and adds a line "stack
// ADDR", an address on the main thread's stack, whose mapping valgrind
// leaves unnamed. The maps say which references were to the heap.
const mapsDumperSource = `#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

__attribute__((destructor)) static void uvm_bound_dump_maps(void) {
	const char *to = getenv("UVM_BOUND_MAPS");
	if (!to)
		return;
	int in = open("/proc/self/maps", O_RDONLY);
	int out = open(to, O_WRONLY | O_CREAT | O_TRUNC, 0644);
	if (in < 0 || out < 0)
		return;
	char buf[65536];
	ssize_t n;
	while ((n = read(in, buf, sizeof buf)) > 0)
		if (write(out, buf, n) != n)
			break;
	volatile char here = 0;
	int len = snprintf(buf, sizeof buf, "stack %lx\n", (unsigned long)(uintptr_t)&here);
	if (write(out, buf, len) != len)
		(void)here;
	close(in);
	close(out);
}
`

// BoundReport is what uvm lab bound prints with --json.
type BoundReport struct {
	Command   []string `json:"command"`
	Allocator string   `json:"allocator"`
	// Loads and Stores are the data references lackey reported (a modify
	// counts as a store); HeapBytes the distinct 4 KiB pages of the heap
	// they touched.
	Loads     int64         `json:"loads"`
	Stores    int64         `json:"stores"`
	HeapBytes int64         `json:"heap_bytes"`
	FaultCost time.Duration `json:"fault_cost_ns,omitempty"`
	Granules  []BoundTable  `json:"granules"`
}

// BoundTable is one granule size's misses at each budget.
type BoundTable struct {
	GranuleBytes int64      `json:"granule_bytes"`
	References   int        `json:"references"` // to the heap, repeats collapsed
	Rows         []BoundRow `json:"rows"`
}

// BoundRow is one budget's misses (lab.Misses) and, with --fault-cost,
// the least time MIN's misses take.
type BoundRow struct {
	Budget        string  `json:"budget"`
	BudgetBytes   int64   `json:"budget_bytes"`
	Cold          int64   `json:"cold"`
	LRU           int64   `json:"lru"`
	OPT           int64   `json:"opt"`
	OPTWriteBacks int64   `json:"opt_write_backs"`
	LeastSeconds  float64 `json:"least_fault_seconds,omitempty"`
}

func runLabBound(args []string) error {
	fs := newFlagSet("lab bound", "[--budget LIST] [--granule LIST] [--fault-cost D] [--allocator jemalloc|system] [--json] [--] PROGRAM [ARGS...]",
		"Run PROGRAM once under valgrind's lackey tool, which reports every load and store it makes, and count the faults its heap would take at each host budget: with least-recently-used eviction, and with Belady's MIN, the eviction that knows the future (no policy takes fewer). This is the bound of eviction on the program's whole reference stream, where uvm lab score sees only what a trace recorded. The heap (what uvm run makes managed) is every page referenced outside the mappings of files, the kernel's and the main stack at the program's exit, so that memory it unmapped before (CPython's arenas) counts; the maps come from /proc/self/maps through a small library preloaded into the program (built at run time with $CC, cc or gcc). Every reference passes through valgrind and a pipe as a line of text, so a program runs thousands of times slower than plain (0.1 s plain took about 10 minutes on a 2-CPU VM): give it a small input. The program's standard input is this command's, its standard output is discarded, its standard error passed through. Cold faults (the first reference to each granule) are counted apart: every policy takes them")
	budgets := fs.String("budget", "25%,50%,75%", "host budgets, a comma list of sizes (4MiB) or percentages of the heap's footprint (25%)")
	granules := fs.String("granule", "4KiB,64KiB", "the units that move, a comma list of sizes (powers of two, at least 4KiB): a miss brings one granule")
	faultCost := fs.Duration("fault-cost", 0, "the least one fault costs (uvm bench faults' p50, say): adds the least time MIN's faults take")
	allocator := fs.String("allocator", "jemalloc", "the program's allocator: jemalloc (libjemalloc.so.2 preloaded, the allocator of uvm run's managed heap, so that the heap is laid out as under uvm run) or system (the C library's)")
	asJSON := fs.Bool("json", false, "print JSON")
	pos, err := parseArgs(fs, args)
	if err != nil {
		return err
	}
	if len(pos) == 0 {
		fmt.Fprintln(fs.Output(), "uvm lab bound: want a PROGRAM to run")
		fs.Usage()
		return errUsage
	}
	if *faultCost < 0 {
		return fmt.Errorf("--fault-cost %v: want a duration of at least 0", *faultCost)
	}
	granuleSizes, err := parseGranules(*granules)
	if err != nil {
		return err
	}
	budgetList, err := parseBudgets(*budgets)
	if err != nil {
		return err
	}
	if *allocator != "jemalloc" && *allocator != "system" {
		return fmt.Errorf("--allocator %q: want jemalloc or system", *allocator)
	}
	o := boundOptions{budgets: budgetList, granules: granuleSizes, faultCost: *faultCost, allocator: *allocator, stdin: os.Stdin}
	if isTerminal(os.Stderr) {
		// One line, rewritten in place, cleared at the end.
		o.progressEvery = 2 * time.Second
		o.progress = func(read int64, took time.Duration, done bool) {
			if done {
				fmt.Fprintf(os.Stderr, "\r%-72s\r", "")
				return
			}
			fmt.Fprintf(os.Stderr, "\r%-72s", fmt.Sprintf("uvm lab bound: %s under valgrind, %s of lackey output read (%v)",
				filepath.Base(pos[0]), core.FormatSize(read), took.Round(time.Second)))
		}
	}
	rep, err := measureBound(context.Background(), pos, o)
	if err != nil {
		return err
	}
	if *asJSON {
		return writeJSON(os.Stdout, rep)
	}
	printBound(os.Stdout, *rep)
	return nil
}

type boundOptions struct {
	budgets   []boundBudget
	granules  []int64
	faultCost time.Duration
	allocator string
	// How the program runs: its standard input (nil: none), working
	// directory ("": this one) and variables added to the environment.
	stdin io.Reader
	dir   string
	env   []string
	// progress, if set, is called every progressEvery while the program
	// runs, with the bytes of lackey output read so far, and once more
	// with done when it has ended.
	progress      func(read int64, took time.Duration, done bool)
	progressEvery time.Duration
}

// lookValgrind finds valgrind, which uvm lab bound runs programs under.
func lookValgrind() (string, error) { return exec.LookPath("valgrind") }

// measureBound runs argv under lackey and counts its misses. Cancelling
// ctx stops valgrind (SIGTERM, then SIGKILL 5 s later).
func measureBound(ctx context.Context, argv []string, o boundOptions) (*BoundReport, error) {
	valgrind, err := lookValgrind()
	if err != nil {
		return nil, fmt.Errorf("uvm lab bound runs the program under valgrind's lackey tool, and valgrind is not in PATH (Debian: apt-get install valgrind)")
	}
	preload := []string{}
	switch o.allocator {
	case "jemalloc":
		lib, err := findSharedLibrary("libjemalloc.so.2")
		if err != nil {
			return nil, fmt.Errorf("--allocator jemalloc: %w (Debian: apt-get install libjemalloc2), or --allocator system", err)
		}
		preload = append(preload, lib)
	case "system":
	default:
		return nil, fmt.Errorf("--allocator %q: want jemalloc or system", o.allocator)
	}
	dir, err := os.MkdirTemp("", "uvm-lab-bound-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	dumper := filepath.Join(dir, "libuvm-bound-maps.so")
	src := filepath.Join(dir, "maps.c")
	if err := os.WriteFile(src, []byte(mapsDumperSource), 0o644); err != nil {
		return nil, err
	}
	if err := libuvm.BuildLibrary(dumper, src); err != nil {
		return nil, fmt.Errorf("uvm lab bound reads the program's maps through a small library built at run time: %w", err)
	}
	preload = append(preload, dumper)
	mapsFile := filepath.Join(dir, "maps")

	stream, err := lackeyRun(ctx, valgrind, argv, preload, mapsFile, o)
	if err != nil {
		return nil, err
	}
	maps, err := os.ReadFile(mapsFile)
	if err != nil {
		return nil, fmt.Errorf("%s did not run its exit handlers (it ended through _exit or a signal?), so its heap's mappings are not known: %w", argv[0], err)
	}
	maps, stack, err := dumpedStack(maps)
	if err != nil {
		return nil, err
	}
	notHeap, err := lab.NotHeap(maps, stack)
	if err != nil {
		return nil, err
	}
	rep := BoundReport{Command: argv, Allocator: o.allocator, Loads: stream.Loads, Stores: stream.Stores, FaultCost: o.faultCost}
	pages, err := stream.Granules(notHeap, lab.PageSize)
	if err != nil {
		return nil, err
	}
	rep.HeapBytes = pages.Footprint()
	if rep.HeapBytes == 0 {
		return nil, fmt.Errorf("%s made no reference to its heap that valgrind saw: nothing to bound", argv[0])
	}
	for _, gb := range o.granules {
		g := pages
		if gb != lab.PageSize {
			if g, err = stream.Granules(notHeap, gb); err != nil {
				return nil, err
			}
		}
		table := BoundTable{GranuleBytes: gb, References: g.References()}
		for _, b := range o.budgets {
			bytes := b.bytes
			if b.fraction > 0 {
				bytes = int64(b.fraction * float64(rep.HeapBytes))
			}
			m := g.Misses(int(bytes / gb))
			row := BoundRow{Budget: b.text, BudgetBytes: bytes, Cold: m.Cold, LRU: m.LRU, OPT: m.OPT, OPTWriteBacks: m.OPTWriteBacks}
			if o.faultCost > 0 {
				row.LeastSeconds = float64(m.OPT) * o.faultCost.Seconds()
			}
			table.Rows = append(table.Rows, row)
		}
		rep.Granules = append(rep.Granules, table)
	}
	return &rep, nil
}

// lackeyRun runs argv under lackey with the libraries preloaded, as o
// says, and reads its references as they come (through a pipe: a
// second's run writes gigabytes), telling o.progress how far it got.
func lackeyRun(ctx context.Context, valgrind string, argv, preload []string, mapsFile string, o boundOptions) (*lab.RefStream, error) {
	r, w, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	cmd := exec.CommandContext(ctx, valgrind, append([]string{"--tool=lackey", "--trace-mem=yes", "--log-fd=3", "--"}, argv...)...)
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	cmd.WaitDelay = 5 * time.Second
	cmd.ExtraFiles = []*os.File{w}
	cmd.Stdin, cmd.Stderr, cmd.Dir = o.stdin, os.Stderr, o.dir
	ld := strings.Join(preload, ":")
	if old := os.Getenv("LD_PRELOAD"); old != "" {
		ld += ":" + old
	}
	cmd.Env = append(append(os.Environ(), o.env...), "LD_PRELOAD="+ld, "UVM_BOUND_MAPS="+mapsFile)
	if err := cmd.Start(); err != nil {
		r.Close()
		w.Close()
		return nil, fmt.Errorf("starting valgrind: %w", err)
	}
	w.Close()
	counted := &countingReader{r: r}
	stop := make(chan struct{})
	stopped := make(chan struct{})
	if o.progress != nil {
		started := time.Now()
		go func() {
			defer close(stopped)
			tick := time.NewTicker(o.progressEvery)
			defer tick.Stop()
			for {
				select {
				case <-stop:
					o.progress(counted.n.Load(), time.Since(started), true)
					return
				case <-tick.C:
					o.progress(counted.n.Load(), time.Since(started), false)
				}
			}
		}()
	} else {
		close(stopped)
	}
	stream, readErr := lab.ReadLackey(counted)
	if readErr != nil {
		// Drain, so that valgrind is not left blocked on the pipe.
		_, _ = io.Copy(io.Discard, r)
	}
	r.Close()
	waitErr := cmd.Wait()
	close(stop)
	<-stopped // its last word said before anything else is
	if readErr != nil {
		return nil, fmt.Errorf("reading lackey's references: %w", readErr)
	}
	if waitErr != nil {
		var exit *exec.ExitError
		if errors.As(waitErr, &exit) {
			if ws, ok := exit.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
				return nil, fmt.Errorf("%s under valgrind was killed by %v: its references are not a whole run", argv[0], ws.Signal())
			}
			return nil, fmt.Errorf("%s under valgrind exited with status %d: its references are not a whole run (valgrind's own errors are above)", argv[0], exit.ExitCode())
		}
		return nil, waitErr
	}
	return stream, nil
}

type countingReader struct {
	r io.Reader
	n atomic.Int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n.Add(int64(n))
	return n, err
}

// dumpedStack splits the dumper's file into the maps and the address of
// its last line, "stack ADDR".
func dumpedStack(dumped []byte) (maps []byte, stack uint64, err error) {
	text := strings.TrimRight(string(dumped), "\n")
	i := strings.LastIndexByte(text, '\n')
	last := text[i+1:]
	hex, ok := strings.CutPrefix(last, "stack ")
	if !ok {
		return nil, 0, fmt.Errorf("the program's maps end with %q, want the dumper's \"stack ADDR\" line", last)
	}
	if stack, err = strconv.ParseUint(hex, 16, 64); err != nil {
		return nil, 0, fmt.Errorf("the dumper's line %q: %w", last, err)
	}
	return dumped[:max(i, 0)], stack, nil
}

// findSharedLibrary finds a library by soname in the dynamic loader's
// cache (ldconfig -p), as the loader would.
func findSharedLibrary(soname string) (string, error) {
	out, err := exec.Command("ldconfig", "-p").Output()
	if err != nil {
		if p, perr := exec.LookPath("/sbin/ldconfig"); perr == nil {
			out, err = exec.Command(p, "-p").Output()
		}
	}
	if err != nil {
		return "", fmt.Errorf("looking %s up with ldconfig -p: %w", soname, err)
	}
	sc := bufio.NewScanner(strings.NewReader(string(out)))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		name, path, ok := strings.Cut(line, " => ")
		if ok && strings.HasPrefix(name, soname+" ") {
			return path, nil
		}
	}
	return "", fmt.Errorf("%s is not in the dynamic loader's cache (ldconfig -p)", soname)
}

type boundBudget struct {
	text     string
	bytes    int64
	fraction float64
}

func parseBudgets(list string) ([]boundBudget, error) {
	var out []boundBudget
	for _, item := range strings.Split(list, ",") {
		item = strings.TrimSpace(item)
		if pct, ok := strings.CutSuffix(item, "%"); ok {
			f, err := strconv.ParseFloat(pct, 64)
			if err != nil || f <= 0 || f > 100 {
				return nil, fmt.Errorf("--budget %q: want a percentage above 0 and at most 100", item)
			}
			out = append(out, boundBudget{text: item, fraction: f / 100})
			continue
		}
		n, err := core.ParseSize(item)
		if err != nil || n < lab.PageSize {
			return nil, fmt.Errorf("--budget %q: want a size of at least 4KiB or a percentage of the heap (25%%)", item)
		}
		out = append(out, boundBudget{text: item, bytes: n})
	}
	return out, nil
}

func parseGranules(list string) ([]int64, error) {
	var out []int64
	for _, item := range strings.Split(list, ",") {
		n, err := core.ParseSize(strings.TrimSpace(item))
		if err != nil || n < lab.PageSize || n&(n-1) != 0 {
			return nil, fmt.Errorf("--granule %q: want a power of two of at least 4KiB", item)
		}
		out = append(out, n)
	}
	return out, nil
}

func printBound(w io.Writer, rep BoundReport) {
	fmt.Fprintf(w, "%s (allocator %s): %d loads and %d stores; heap %s (%d pages of 4 KiB touched)\n",
		strings.Join(rep.Command, " "), rep.Allocator, rep.Loads, rep.Stores, core.FormatSize(rep.HeapBytes), rep.HeapBytes/lab.PageSize)
	for _, t := range rep.Granules {
		fmt.Fprintf(w, "\ngranule %s, %d references to the heap (repeats collapsed):\n", core.FormatSize(t.GranuleBytes), t.References)
		fmt.Fprintf(w, "  %-22s %10s %12s %12s %16s", "budget", "cold", "LRU faults", "MIN faults", "MIN write-backs")
		if rep.FaultCost > 0 {
			fmt.Fprintf(w, "  %s", fmt.Sprintf("MIN's faults at %v", rep.FaultCost))
		}
		fmt.Fprintln(w)
		for _, r := range t.Rows {
			budget := core.FormatSize(r.BudgetBytes)
			if strings.HasSuffix(r.Budget, "%") {
				budget += " (" + r.Budget + ")"
			}
			fmt.Fprintf(w, "  %-22s %10d %12d %12d %16d", budget, r.Cold, r.LRU, r.OPT, r.OPTWriteBacks)
			if rep.FaultCost > 0 {
				fmt.Fprintf(w, "  %.3f s", r.LeastSeconds)
			}
			fmt.Fprintln(w)
		}
	}
}
