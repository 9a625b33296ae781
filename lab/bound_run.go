package lab

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

	"github.com/softuvm/softuvm/libuvm"
	"github.com/softuvm/softuvm/policy"
)

// MeasureBound is `uvm lab bound` (and `uvm bench cliff --bound`): a
// program run once under valgrind's lackey tool, its heap's references
// read as they come (ReadLackey) and LRU's and MIN's misses counted at
// each budget and granule. Its errors name uvm lab bound's flags.

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
	// DefaultEviction is the server's default eviction policy, whose
	// faults the rows of the 4 KiB granule count (BoundRow.Default).
	DefaultEviction string       `json:"default_eviction"`
	Granules        []BoundTable `json:"granules"`
}

// BoundTable is one granule size's misses at each budget.
type BoundTable struct {
	GranuleBytes int64      `json:"granule_bytes"`
	References   int        `json:"references"` // to the heap, repeats collapsed
	Rows         []BoundRow `json:"rows"`
}

// BoundRow is one budget's misses (Misses) and, with --fault-cost,
// the least time MIN's misses take.
type BoundRow struct {
	Budget        string `json:"budget"`
	BudgetBytes   int64  `json:"budget_bytes"`
	Cold          int64  `json:"cold"`
	LRU           int64  `json:"lru"`
	OPT           int64  `json:"opt"`
	OPTWriteBacks int64  `json:"opt_write_backs"`
	// Default is the default eviction policy's faults but the cold ones,
	// replayed page by page with demand fetching (RefStream.PolicyFaults):
	// for the 4 KiB granule only, which is the unit the replay moves.
	Default      *int64  `json:"default,omitempty"`
	LeastSeconds float64 `json:"least_fault_seconds,omitempty"`
}

// BoundOptions say how MeasureBound runs the program and what it
// counts.
type BoundOptions struct {
	Budgets  []BoundBudget
	Granules []int64 // the units that move, powers of two of at least PageSize
	// FaultCost, if above 0, is the least one fault costs: each row then
	// says the least time MIN's misses take.
	FaultCost time.Duration
	Allocator string // "jemalloc" (preloaded, as uvm run's managed heap) or "system"
	// How the program runs: its standard input (nil: none), working
	// directory ("": this one) and variables added to the environment.
	Stdin io.Reader
	Dir   string
	Env   []string
	// Progress, if set, is called every ProgressEvery while the program
	// runs, with the bytes of lackey output read so far, and once more
	// with done when it has ended.
	Progress      func(read int64, took time.Duration, done bool)
	ProgressEvery time.Duration
}

// BoundBudget is one budget to count misses at: Bytes, or Fraction of
// the heap's footprint where that is above 0, named Text in the report.
type BoundBudget struct {
	Text     string
	Bytes    int64
	Fraction float64
}

// LookValgrind finds valgrind, which MeasureBound runs programs under
// (uvm doctor says where it found it).
func LookValgrind() (string, error) { return exec.LookPath("valgrind") }

// MeasureBound runs argv under lackey and counts its misses. Cancelling
// ctx stops valgrind (SIGTERM, then SIGKILL 5 s later).
func MeasureBound(ctx context.Context, argv []string, o BoundOptions) (*BoundReport, error) {
	valgrind, err := LookValgrind()
	if err != nil {
		return nil, fmt.Errorf("uvm lab bound runs the program under valgrind's lackey tool, and valgrind is not in PATH (Debian: apt-get install valgrind)")
	}
	preload := []string{}
	switch o.Allocator {
	case "jemalloc":
		lib, err := findSharedLibrary("libjemalloc.so.2")
		if err != nil {
			return nil, fmt.Errorf("--allocator jemalloc: %w (Debian: apt-get install libjemalloc2), or --allocator system", err)
		}
		preload = append(preload, lib)
	case "system":
	default:
		return nil, fmt.Errorf("--allocator %q: want jemalloc or system", o.Allocator)
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
	notHeap, err := NotHeap(maps, stack)
	if err != nil {
		return nil, err
	}
	rep := BoundReport{Command: argv, Allocator: o.Allocator, Loads: stream.Loads, Stores: stream.Stores, FaultCost: o.FaultCost,
		DefaultEviction: policy.DefaultEviction}
	pages, err := stream.Granules(notHeap, PageSize)
	if err != nil {
		return nil, err
	}
	rep.HeapBytes = pages.Footprint()
	if rep.HeapBytes == 0 {
		return nil, fmt.Errorf("%s made no reference to its heap that valgrind saw: nothing to bound", argv[0])
	}
	for _, gb := range o.Granules {
		g := pages
		if gb != PageSize {
			if g, err = stream.Granules(notHeap, gb); err != nil {
				return nil, err
			}
		}
		table := BoundTable{GranuleBytes: gb, References: g.References()}
		for _, b := range o.Budgets {
			bytes := b.Bytes
			if b.Fraction > 0 {
				bytes = int64(b.Fraction * float64(rep.HeapBytes))
			}
			m := g.Misses(int(bytes / gb))
			row := BoundRow{Budget: b.Text, BudgetBytes: bytes, Cold: m.Cold, LRU: m.LRU, OPT: m.OPT, OPTWriteBacks: m.OPTWriteBacks}
			if o.FaultCost > 0 {
				row.LeastSeconds = float64(m.OPT) * o.FaultCost.Seconds()
			}
			if gb == PageSize {
				n, err := stream.PolicyFaults(notHeap, policy.DefaultEviction, bytes)
				if err != nil {
					return nil, err
				}
				row.Default = &n
			}
			table.Rows = append(table.Rows, row)
		}
		rep.Granules = append(rep.Granules, table)
	}
	return &rep, nil
}

// lackeyRun runs argv under lackey with the libraries preloaded, as o
// says, and reads its references as they come (through a pipe: a
// second's run writes gigabytes), telling o.Progress how far it got.
func lackeyRun(ctx context.Context, valgrind string, argv, preload []string, mapsFile string, o BoundOptions) (*RefStream, error) {
	r, w, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	cmd := exec.CommandContext(ctx, valgrind, append([]string{"--tool=lackey", "--trace-mem=yes", "--log-fd=3", "--"}, argv...)...)
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	cmd.WaitDelay = 5 * time.Second
	cmd.ExtraFiles = []*os.File{w}
	cmd.Stdin, cmd.Stderr, cmd.Dir = o.Stdin, os.Stderr, o.Dir
	ld := strings.Join(preload, ":")
	if old := os.Getenv("LD_PRELOAD"); old != "" {
		ld += ":" + old
	}
	cmd.Env = append(append(os.Environ(), o.Env...), "LD_PRELOAD="+ld, "UVM_BOUND_MAPS="+mapsFile)
	if err := cmd.Start(); err != nil {
		r.Close()
		w.Close()
		return nil, fmt.Errorf("starting valgrind: %w", err)
	}
	w.Close()
	counted := &countingReader{r: r}
	stop := make(chan struct{})
	stopped := make(chan struct{})
	if o.Progress != nil {
		started := time.Now()
		go func() {
			defer close(stopped)
			tick := time.NewTicker(o.ProgressEvery)
			defer tick.Stop()
			for {
				select {
				case <-stop:
					o.Progress(counted.n.Load(), time.Since(started), true)
					return
				case <-tick.C:
					o.Progress(counted.n.Load(), time.Since(started), false)
				}
			}
		}()
	} else {
		close(stopped)
	}
	stream, readErr := ReadLackey(counted)
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
