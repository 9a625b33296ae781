package cli

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/softuvm/softuvm/internal/core"
	"github.com/softuvm/softuvm/lab"
)

func runLabBound(args []string) error {
	fs := newFlagSet("lab bound", "[--budget LIST] [--granule LIST] [--fault-cost D] [--allocator jemalloc|system] [--json] [--] PROGRAM [ARGS...]",
		"Run PROGRAM once under valgrind's lackey tool, which reports every load and store it makes, and count the faults its heap would take at each host budget: with least-recently-used eviction, with Belady's MIN, the eviction that knows the future (no policy takes fewer), and, at the 4 KiB granule, with the server's default eviction policy, replayed page by page through the server's own block engine with demand fetching (so that a regression of the default shows against both without a live run). This is the bound of eviction on the program's whole reference stream, where uvm lab score sees only what a trace recorded. The heap (what uvm run makes managed) is every page referenced outside the mappings of files, the kernel's and the main stack at the program's exit, so that memory it unmapped before (CPython's arenas) counts; the maps come from /proc/self/maps through a small library preloaded into the program (built at run time with $CC, cc or gcc). Every reference passes through valgrind and a pipe as a line of text, so a program runs thousands of times slower than plain (0.1 s plain took about 10 minutes on a 2-CPU VM): give it a small input. The program's standard input is this command's, its standard output is discarded, its standard error passed through. Cold faults (the first reference to each granule) are counted apart: every policy takes them")
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
	o := lab.BoundOptions{Budgets: budgetList, Granules: granuleSizes, FaultCost: *faultCost, Allocator: *allocator, Stdin: os.Stdin}
	if isTerminal(os.Stderr) {
		// One line, rewritten in place, cleared at the end.
		o.ProgressEvery = 2 * time.Second
		o.Progress = func(read int64, took time.Duration, done bool) {
			if done {
				fmt.Fprintf(os.Stderr, "\r%-72s\r", "")
				return
			}
			fmt.Fprintf(os.Stderr, "\r%-72s", fmt.Sprintf("uvm lab bound: %s under valgrind, %s of lackey output read (%v)",
				filepath.Base(pos[0]), core.FormatSize(read), took.Round(time.Second)))
		}
	}
	rep, err := lab.MeasureBound(context.Background(), pos, o)
	if err != nil {
		return err
	}
	if *asJSON {
		return writeJSON(os.Stdout, rep)
	}
	printBound(os.Stdout, *rep)
	return nil
}

func parseBudgets(list string) ([]lab.BoundBudget, error) {
	var out []lab.BoundBudget
	for _, item := range strings.Split(list, ",") {
		item = strings.TrimSpace(item)
		if pct, ok := strings.CutSuffix(item, "%"); ok {
			f, err := strconv.ParseFloat(pct, 64)
			if err != nil || f <= 0 || f > 100 {
				return nil, fmt.Errorf("--budget %q: want a percentage above 0 and at most 100", item)
			}
			out = append(out, lab.BoundBudget{Text: item, Fraction: f / 100})
			continue
		}
		n, err := core.ParseSize(item)
		if err != nil || n < lab.PageSize {
			return nil, fmt.Errorf("--budget %q: want a size of at least 4KiB or a percentage of the heap (25%%)", item)
		}
		out = append(out, lab.BoundBudget{Text: item, Bytes: n})
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

func printBound(w io.Writer, rep lab.BoundReport) {
	fmt.Fprintf(w, "%s (allocator %s): %d loads and %d stores; heap %s (%d pages of 4 KiB touched)\n",
		strings.Join(rep.Command, " "), rep.Allocator, rep.Loads, rep.Stores, core.FormatSize(rep.HeapBytes), rep.HeapBytes/lab.PageSize)
	for _, t := range rep.Granules {
		fmt.Fprintf(w, "\ngranule %s, %d references to the heap (repeats collapsed):\n", core.FormatSize(t.GranuleBytes), t.References)
		fmt.Fprintf(w, "  %-22s %10s %12s %12s %16s", "budget", "cold", "LRU faults", "MIN faults", "MIN write-backs")
		if t.GranuleBytes == lab.PageSize {
			fmt.Fprintf(w, " %18s %10s %10s", rep.DefaultEviction+" faults", "/ LRU's", "/ MIN's")
		}
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
			if r.Default != nil {
				fmt.Fprintf(w, " %18d %10s %10s", *r.Default, faultRatio(*r.Default, r.LRU), faultRatio(*r.Default, r.OPT))
			}
			if rep.FaultCost > 0 {
				fmt.Fprintf(w, "  %.3f s", r.LeastSeconds)
			}
			fmt.Fprintln(w)
		}
	}
}

// faultRatio is a over b as the bound's table prints it: 1 where both
// are 0, "inf" where only b is.
func faultRatio(a, b int64) string {
	switch {
	case b == 0 && a == 0:
		return "1.000"
	case b == 0:
		return "inf"
	}
	return fmt.Sprintf("%.3f", float64(a)/float64(b))
}
