package cli

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/softuvm/softuvm/devmem"
	"github.com/softuvm/softuvm/internal/bench"
	"github.com/softuvm/softuvm/internal/bench/soak"
	"github.com/softuvm/softuvm/internal/config"
	"github.com/softuvm/softuvm/policy"
	"github.com/softuvm/softuvm/uvm"
)

type command struct {
	name, args, summary string
	run                 func(args []string) error
}

var commands []command

func init() {
	commands = []command{
		{"serve", "[flags]", "run a fault server daemon on a Unix socket", runServe},
		{"run", "[flags] [--] PROGRAM [ARGS...]", "run an unmodified program with its large allocations in managed memory, served by a fault server of its own", runRun},
		{"info", "[--json]", "show the kernel's userfaultfd features, NUMA nodes, what the environment configures and running servers", runInfo},
		{"doctor", "[--json]", "say what this machine gives softuvm and what it lacks, each lack with its cost and its fix (exit status 1: something uvm run needs is missing)", runDoctor},
		{"stat", "[--pid PID] [--interval D] [--count N] [--json]", "show a running server's counters, refreshed in place", runStat},
		{"demo", "[--size SIZE]", "allocate managed memory, touch it, prefetch it to a device and back, run a kernel on it, and show what it cost", runDemo},
		{"bench", "faults|launch|grid|oversub|run|cliff|soak [flags]", "measure faults, first touch and device-to-host bandwidth (faults); kernel launches (launch); grid launches, barriers and shared memory against the thread launch, in C and Go (grid); a program sweeping thrice its host budget against no budget and a memory cgroup with zram swap (oversub); real programs under uvm run at a fraction of their peak memory against plain and a cgroup (run); the budget curve, time and faults from 100% to 25% of each program's managed peak against plain, LRU and MIN (cliff); Go and C clients and programs under uvm run checked byte by byte while servers, device processes and guards are killed (soak)", runBench},
		{"trace", "record|export|plot|summary|replay [flags]", "record every fault and migration of a program (or of a server's clients) to a file; export it for Perfetto or as CSV, draw it, sum it up, or replay other policies over it", runTrace},
		{"lab", "grade ASSIGNMENT FILE.go | score ... | bound ... -- PROGRAM", "grade a course assignment's policy (lab/course): replayed on the shipped traces against its baseline and oracle, and run live; score every policy over traces; or bound what any eviction can do on a program's every reference (valgrind)", runLab},
		{"help", "[COMMAND]", "show help", nil},
	}
}

// Main runs the uvm command with this process's arguments and exits with
// its status. It calls uvm.Main first: the fault servers, guards and
// devices the command starts are re-executions of this binary, and wait
// for it when the policies they need are registered by packages that
// initialize after package uvm. A binary whose main calls Main is a
// complete uvm, with every policy its packages register.
func Main() {
	uvm.Main()
	os.Exit(mainErr(os.Args[1:], os.Stdout, os.Stderr))
}

func mainErr(args []string, stdout, stderr io.Writer) int {
	if len(args) == 2 && args[0] == bench.PingPongCommand { // the child of `uvm bench launch`'s pipe round trip
		return bench.PingPong(args[1])
	}
	if len(args) > 0 && args[0] == soak.ClientArg { // a Go client of `uvm bench soak`
		return soak.ClientMain(args[1:])
	}
	if len(args) == 0 {
		usage(stderr)
		return 2
	}
	name := args[0]
	if name == "help" || name == "-h" || name == "--help" || name == "-help" {
		if len(args) > 1 {
			return mainErr([]string{args[1], "-h"}, stdout, stderr)
		}
		usage(stdout)
		return 0
	}
	for _, c := range commands {
		if c.name == name && c.run != nil {
			err := c.run(args[1:])
			var status exitStatus
			switch {
			case errors.As(err, &status): // `uvm run`: the program's status
				return int(status)
			case err == nil:
				return 0
			case errors.Is(err, flag.ErrHelp):
				return 0
			case errors.Is(err, errUsage):
				return 2
			}
			fmt.Fprintf(stderr, "uvm %s: %v\n", name, err)
			return 1
		}
	}
	fmt.Fprintf(stderr, "uvm: unknown command %q\n\n", name)
	usage(stderr)
	return 2
}

var errUsage = errors.New("usage error")

// exitStatus is an error that makes uvm exit with that status and print
// nothing more: `uvm run` passes the program's status on.
type exitStatus int

func (e exitStatus) Error() string { return fmt.Sprintf("exit status %d", int(e)) }

func usage(w io.Writer) {
	fmt.Fprintf(w, `uvm: CUDA-style unified memory for CPU devices, served by a userfaultfd fault server.

Usage: uvm COMMAND [ARGS]

Commands:
`)
	for _, c := range commands {
		fmt.Fprintf(w, "  %-6s %-40s %s\n", c.name, c.args, c.summary)
	}
	fmt.Fprintf(w, "\nEnvironment (read by programs using softuvm, their private servers and %s; the flags of the same names override it):\n", preloadName)
	for _, s := range config.Settings {
		fmt.Fprintln(w, settingLine(s))
	}
	fmt.Fprintf(w, `
Policies this uvm knows, by kind (a uvm built with package cli also knows
those its packages register):
`)
	for _, k := range policyKinds() {
		fmt.Fprintf(w, "  %-18s %s (%s)\n", k.Kind, strings.Join(k.Names, ", "), k.Choose)
	}
	fmt.Fprintf(w, "\nRun 'uvm help COMMAND' for a command's flags.\n")
}

// settingLine is a variable's line in `uvm help`: its name, what it
// takes, and its default from config.Settings.
func settingLine(s config.Setting) string {
	line := fmt.Sprintf("  %-20s %s", s.Env, s.Values)
	if s.Default != "" {
		line += " (default: " + s.Default + ")"
	}
	return line
}

// policyKind is what this binary offers of one kind of policy.
type policyKind struct {
	Kind   string   `json:"kind"`
	Names  []string `json:"names"`
	Choose string   `json:"choose"` // the flag and the variable that choose one
}

// policyKinds lists the policies this binary knows: the built-in ones and
// those its packages registered, which is why a binary built with this
// package shows its own.
func policyKinds() []policyKind {
	return []policyKind{
		{policy.KindPrefetch, policy.PrefetchPolicyNames(), "--prefetch NAME[:ARG], " + config.EnvPrefetch},
		{policy.KindEviction, policy.EvictionNames(), "--eviction NAME[:ARG], " + config.EnvEviction},
		{policy.KindThrashing, policy.ThrashingNames(), "--thrashing policy=NAME, " + config.EnvThrashing},
		{policy.KindAccessMigration, policy.AccessMigrationNames(), "--access-policy migration=NAME, " + config.EnvAccessPolicy},
	}
}

// policyHint adds to an error about a policy name that nothing
// registered how to make a policy of one's own known to this command.
func policyHint(err error) error {
	var u *policy.UnknownError
	if !errors.As(err, &u) {
		return err
	}
	self, _ := os.Executable()
	return fmt.Errorf("%w (this uvm is %s; for a policy of your own, build a uvm whose main imports the policy's package and calls cli.Main, see package cli)", err, self)
}

// writeJSON writes v to w as indented JSON: what every command's --json
// prints.
func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// newFlagSet makes a flag set whose usage names the command.
func newFlagSet(name, args, summary string) *flag.FlagSet {
	fs := flag.NewFlagSet("uvm "+name, flag.ContinueOnError)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "Usage: uvm %s %s\n\n%s.\n\nFlags:\n", name, args, summary)
		fs.PrintDefaults()
	}
	return fs
}

// parseArgs parses the flags before the operands and returns the
// operands: help asked for is flag.ErrHelp, a bad flag (which the flag
// set has already described) errUsage.
func parseArgs(fs *flag.FlagSet, args []string) ([]string, error) {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil, err
		}
		return nil, errUsage
	}
	return fs.Args(), nil
}

// parseFlags parses a command that takes flags only.
func parseFlags(fs *flag.FlagSet, args []string) error {
	if _, err := parseArgs(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(fs.Output(), "uvm: unexpected argument %q\n", fs.Arg(0))
		fs.Usage()
		return errUsage
	}
	return nil
}

// serverFlags are the flags that configure a server: `uvm serve`, and the
// private servers of `uvm demo` and `uvm bench`.
type serverFlags struct {
	devices       int
	arenaSize     string
	arenaBackend  string
	prefetch      string
	eviction      string
	handlers      string
	track         bool
	workers       int
	hostBudget    string
	thrashing     string
	copyThreads   int
	access        string
	accessPolicy  string
	restarts      string
	coherence     string
	dirtyTracking string
	largeFolios   string
	trace         string
	traceAccess   string
}

func (f *serverFlags) register(fs *flag.FlagSet) {
	base, err := uvm.ServerConfigFromEnv()
	if err != nil {
		base = uvm.DefaultServerConfig()
	}
	// What the environment (or its absence) configures, with empty
	// fields written out as the server reads them: the flags' defaults.
	base = base.Resolved()
	size := int64(config.DefaultArenaSize)
	backend := devmem.BackendAuto
	if len(base.Devices) > 0 {
		size, backend = base.Devices[0].Capacity, base.Devices[0].Backend
	}
	fs.IntVar(&f.devices, "devices", len(base.Devices), "number of devices")
	fs.StringVar(&f.arenaSize, "arena-size", uvm.FormatSize(size), "arena size of each device, or a comma list, one per device")
	fs.StringVar(&f.arenaBackend, "arena-backend", backend.String(), "arena backend: auto, memfd or numa, or a comma list, one per device")
	fs.StringVar(&f.prefetch, "prefetch", base.Prefetch.String(), "fault prefetch policy: "+strings.Join(policy.PrefetchPolicyNames(), ", "))
	fs.StringVar(&f.eviction, "eviction", base.Eviction, "eviction policy, which blocks leave a full device or the host over its budget: "+strings.Join(policy.EvictionNames(), ", "))
	fs.StringVar(&f.handlers, "handlers", string(base.Handlers), "handler threads: follow (a handler waits only on CPUs the client faults on), per-cpu or single")
	fs.BoolVar(&f.track, "track-prefetch", base.TrackPrefetchUse, "record which prefetched pages get used (costs a minor fault per prefetched page)")
	fs.IntVar(&f.workers, "device-workers", base.DeviceWorkers, "threads that run each device's kernels (0: one per CPU)")
	budget := ""
	if base.HostBudget > 0 {
		budget = uvm.FormatSize(base.HostBudget)
	}
	fs.StringVar(&f.hostBudget, "host-budget", budget, "managed memory kept on the host; above it, pages go to the device with the most room (empty: unbounded)")
	fs.StringVar(&f.thrashing, "thrashing", base.Thrashing.String(), "thrashing detection: on, off, or settings such as threshold=3,lapse=500us,nap=500us,pin-threshold=10,pin=150ms (pages bouncing between processors) and refault=on,refault-distance=100,core=97,core-age=4 (a processor over its capacity: a resident core of the pages it evicted too early)")
	fs.IntVar(&f.copyThreads, "copy-threads", base.CopyProducers, "the copy engine's producer threads per bulk move (0: calibrated at start)")
	fs.StringVar(&f.access, "access-counting", base.AccessCounting, "access counters: auto (eBPF where it loads, else user space), ebpf (or fail), user (MINOR-mode faults counted by the server), off")
	fs.StringVar(&f.accessPolicy, "access-policy", base.AccessPolicy.String(), "what the access counters drive: on, off (count only), or settings such as hints=on,threshold=256,period=1s,sample=256MiB,decay=32s,anatomy=64")
	fs.StringVar(&f.coherence, "coherence", base.Coherence, "how host and devices share managed memory: fault (pages move on faults, anyone may touch them any time) or launch (a launch hands a kernel's memory to its device; the CPU may not touch it until a synchronize), for clients that do not choose (UVM_COHERENCE)")
	fs.StringVar(&f.dirtyTracking, "dirty-tracking", base.DirtyTracking, "how the launch model finds the pages the CPU wrote: auto (wp-async where the kernel has it), wp-async or wp-fault")
	fs.StringVar(&f.largeFolios, "large-folios", base.LargeFolios, "location files of 2 MiB folios, so that a block moving whole costs one page allocation and one free instead of 512: auto (where the server may make a tmpfs: as root; uvm doctor says why not elsewhere) or off (UVM_LARGE_FOLIOS)")
	fs.StringVar(&f.trace, "trace", base.Trace, "record every fault, migration, eviction, allocation and free the server sees to this file (uvm trace export, plot and summary read it; UVM_TRACE=FILE in a client's environment records that client alone)")
	fs.StringVar(&f.traceAccess, "trace-access", base.TraceAccess.String(), "the trace's access mode: off, or PERIOD[,SAMPLE] (e.g. 100ms,64MiB; on: 100ms): every PERIOD, unmap up to SAMPLE of each processor's managed pages, leaving them where they are, and record which it touched again, faulting or not (UVM_TRACE_ACCESS for a client recording its own trace)")
	fs.StringVar(&f.restarts, "restarts", config.FormatRestarts(base.Restarts), "when the server dies, how many new servers in a row the guard starts to take over (on: 5), or off (then every page not on the host is poisoned: SIGBUS)")
}

func (f *serverFlags) config() (uvm.ServerConfig, error) {
	cfg := uvm.DefaultServerConfig()
	var sizes []int64
	for _, part := range strings.Split(f.arenaSize, ",") {
		n, err := uvm.ParseSize(part)
		if err != nil {
			return cfg, fmt.Errorf("--arena-size: %w", err)
		}
		sizes = append(sizes, n)
	}
	backends, err := config.ParseBackends(f.arenaBackend)
	if err != nil {
		return cfg, fmt.Errorf("--arena-backend: %w", err)
	}
	if f.devices < 0 {
		return cfg, fmt.Errorf("--devices %d: want 0 or more", f.devices)
	}
	cfg.Devices = config.DeviceSpecsEach(f.devices, sizes, backends)
	if cfg.Prefetch, err = uvm.ParsePrefetchSpec(f.prefetch); err != nil {
		return cfg, fmt.Errorf("--prefetch: %w", policyHint(err))
	}
	if err := policy.ValidateEviction(f.eviction); err != nil {
		return cfg, fmt.Errorf("--eviction: %w", policyHint(err))
	}
	cfg.Eviction = f.eviction
	cfg.Handlers = config.HandlerPlacement(f.handlers)
	cfg.TrackPrefetchUse = f.track
	cfg.DeviceWorkers = f.workers
	cfg.CopyProducers = f.copyThreads
	cfg.AccessCounting = f.access
	if f.hostBudget != "" {
		if cfg.HostBudget, err = uvm.ParseSize(f.hostBudget); err != nil {
			return cfg, fmt.Errorf("--host-budget: %w", err)
		}
	}
	if cfg.Thrashing, err = policy.ParseThrashingSpec(f.thrashing); err != nil {
		return cfg, fmt.Errorf("--thrashing: %w", policyHint(err))
	}
	if cfg.AccessPolicy, err = policy.ParseAccessPolicy(f.accessPolicy); err != nil {
		return cfg, fmt.Errorf("--access-policy: %w", policyHint(err))
	}
	if cfg.Restarts, err = config.ParseRestarts(f.restarts); err != nil {
		return cfg, fmt.Errorf("--restarts: %w", err)
	}
	cfg.Coherence = f.coherence
	if f.dirtyTracking != "auto" {
		cfg.DirtyTracking = f.dirtyTracking
	}
	cfg.LargeFolios = f.largeFolios
	if f.trace != "" {
		// The server may run in another process, with another working
		// directory.
		if cfg.Trace, err = filepath.Abs(f.trace); err != nil {
			return cfg, fmt.Errorf("--trace %s: %w", f.trace, err)
		}
	}
	if cfg.TraceAccess, err = config.ParseTraceAccess(f.traceAccess); err != nil {
		return cfg, fmt.Errorf("--trace-access: %w", err)
	}
	if cfg.TraceAccess.On() && cfg.Trace == "" {
		return cfg, fmt.Errorf("--trace-access %s records into the server's trace: give --trace FILE too (a client recording its own trace with UVM_TRACE takes UVM_TRACE_ACCESS)", f.traceAccess)
	}
	return cfg, cfg.Validate()
}

// privateServers lists the private servers whose monitor sockets exist.
func privateServers() []int {
	entries, err := os.ReadDir(config.PrivateServerSocketDir())
	if err != nil {
		return nil
	}
	var pids []int
	for _, e := range entries {
		var pid int
		if _, err := fmt.Sscanf(e.Name(), "uvm-%d.sock", &pid); err == nil {
			if _, err := os.Stat(fmt.Sprintf("/proc/%d", pid)); err == nil {
				pids = append(pids, pid)
			}
		}
	}
	sort.Ints(pids)
	return pids
}
