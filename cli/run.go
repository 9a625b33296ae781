package cli

import (
	"debug/elf"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
	"unsafe"

	"github.com/softuvm/softuvm/internal/bench/workloads"
	"github.com/softuvm/softuvm/internal/config"
	"github.com/softuvm/softuvm/internal/server"
	"github.com/softuvm/softuvm/libuvm"
	"github.com/softuvm/softuvm/trace"
	"github.com/softuvm/softuvm/uvm"
)

// `uvm run` runs an unmodified program on managed memory: a fault server
// in this process, on a socket of its own, and the program under
// libuvm-preload.so, which turns its large allocations (malloc and its
// family, anonymous mmap) into managed memory served by that server.

// Exit statuses of `uvm run` itself, as shells and env(1) use them, so
// that they are not taken for the program's own.
const (
	runStatusFailed      = 125 // uvm run could not run the program: no preload library, no server
	runStatusNotRunnable = 126 // the program is not executable
	runStatusNotFound    = 127 // the program does not exist
)

const preloadName = libuvm.PreloadName

// runReport is what --stats-json writes: the program, how it ended, the
// figures of the summary, and the server's full counters.
type runReport struct {
	Program     []string `json:"program"`
	ExitStatus  int      `json:"exit_status"`
	Signal      string   `json:"signal,omitempty"`
	WallSeconds float64  `json:"wall_seconds"`
	MinSize     int64    `json:"min_size"`
	// Heap is where allocations below MinSize came from: managed or
	// system. HeapUnavailable says why the managed heap could not be had
	// where it was wanted (--heap not given) and the run went on without.
	Heap            string `json:"heap"`
	HeapUnavailable string `json:"heap_unavailable,omitempty"`
	HostBudget      int64  `json:"host_budget,omitempty"`
	Devices         int    `json:"devices"`

	Allocations    uint64                `json:"allocations"`
	AllocatedBytes uint64                `json:"allocated_bytes"`
	Faults         []uvm.ProcessorFaults `json:"faults"`
	// HostToDeviceBytes and DeviceToHostBytes are the bytes copied each
	// way: migrations, and copies that kept their source (clean
	// eviction's, read duplication's).
	HostToDeviceBytes uint64 `json:"host_to_device_bytes"`
	DeviceToHostBytes uint64 `json:"device_to_host_bytes"`
	EvictedPages      uint64 `json:"evicted_pages"`
	// HostPeakBytes is the most managed memory the host held at once
	// (the server's high-water mark of host-resident pages, every
	// process of the run): without --host-budget, the managed peak a
	// budget would constrain; with one, about the budget (eviction runs
	// after pages arrive, and the budget is soft: busy blocks leave next
	// time).
	HostPeakBytes     int64 `json:"host_peak_bytes"`
	FaultServiceP50NS int64 `json:"fault_service_p50_ns"`
	FaultServiceP99NS int64 `json:"fault_service_p99_ns"`
	// ServerRestarts counts the servers that died under the program and
	// were replaced; the counters are those of the last one, since it
	// took over.
	ServerRestarts uint64    `json:"server_restarts"`
	Stats          uvm.Stats `json:"stats"`
}

func runRun(args []string) error {
	o, err := parseRunFlags(args)
	if err != nil {
		return err
	}
	path, err := findProgram(o.argv[0])
	if err != nil {
		return err
	}
	if staticallyLinked(path) {
		// Not refused: the program still runs, as it would without uvm
		// run, but a silent summary of nothing would mislead.
		fmt.Fprintf(os.Stderr, "uvm run: warning: %s is statically linked (no ELF interpreter), so %s cannot be loaded into it: it runs, but none of its memory is managed or measured\n",
			path, preloadName)
	}
	lib, err := findPreload(o.preload)
	if err != nil {
		fmt.Fprintf(os.Stderr, "uvm run: %v\n", err)
		return exitStatus(runStatusFailed)
	}
	self, err := os.Executable()
	if err != nil {
		fmt.Fprintf(os.Stderr, "uvm run: the path of this uvm binary, for the program's libuvm: %v\n", err)
		return exitStatus(runStatusFailed)
	}
	heapUnavailable, err := o.probeHeap(lib, self)
	if err != nil {
		return err
	}
	var jsonOut *os.File
	if o.statsJSON != "" {
		// Created now: a path that cannot be written fails before a long run.
		if jsonOut, err = os.Create(o.statsJSON); err != nil {
			fmt.Fprintf(os.Stderr, "uvm run: --stats-json: %v\n", err)
			return exitStatus(runStatusFailed)
		}
		defer jsonOut.Close() // closed after writing; this covers the early returns
	}

	srv, sock, cleanup, err := startRunServer(o.cfg)
	if err != nil {
		fmt.Fprintf(os.Stderr, "uvm run: cannot start the fault server: %v\n", err)
		if jsonOut != nil {
			os.Remove(o.statsJSON) // no report: the program never ran
		}
		return exitStatus(runStatusFailed)
	}
	defer cleanup()
	cmd := exec.Command(path, o.argv[1:]...)
	cmd.Args = o.argv
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	cmd.Env = runEnv(os.Environ(), sock, o.minBytes, o.heap, o.statics, lib, self)
	ws, wall, err := runProgram(cmd)
	if err != nil {
		return err
	}
	st, in, err := serverStats(srv)
	if err != nil {
		fmt.Fprintf(os.Stderr, "uvm run: the fault server's counters: %v\n", err)
	}
	rep := makeRunReport(o.argv, ws, wall, o.minBytes, o.cfg, st)
	rep.ServerRestarts, rep.HostPeakBytes = in.Restart.Restarts, in.HostPeakBytes
	rep.Heap, rep.HeapUnavailable = o.heap, heapUnavailable
	o.report(rep, jsonOut)
	return exitStatus(rep.ExitStatus)
}

// runOptions are uvm run's flags, read and checked.
type runOptions struct {
	argv       []string // the program and its arguments
	cfg        uvm.ServerConfig
	minBytes   int64
	heap       string // managed or system
	heapChosen bool   // --heap given
	statics    bool
	preload    string
	statsJSON  string
	quiet      bool
}

// parseRunFlags reads uvm run's flags. A bad one is a usage error, said
// with where to read the flags.
func parseRunFlags(args []string) (*runOptions, error) {
	flags := newFlagSet("run", "[flags] [--] PROGRAM [ARGS...]",
		"Run an unmodified program with its large allocations in managed memory. A fault server runs in this process; the program runs with "+preloadName+
			" preloaded, which makes each malloc, calloc, realloc, aligned allocation and anonymous private mmap of at least --min-size bytes managed memory "+
			"(smaller ones, and everything the server cannot serve, go to the system allocator). At exit a summary of what the server did goes to standard error. "+
			"The exit status is the program's (128+N if signal N killed it); 127 if the program is not found, 126 if it cannot be executed, 2 for bad flags, "+
			"125 if uvm run itself failed. "+
			"The library is --preload, else $UVM_PRELOAD, else "+preloadName+" next to the uvm binary, else in ../lib from it, else one this uvm builds from the C sources "+
			"built into it with the C compiler ($CC, cc or gcc) into $XDG_CACHE_HOME/softuvm (~/.cache/softuvm) on first use, and reuses after")
	var sf serverFlags
	sf.register(flags)
	minSize := flags.String("min-size", config.SettingOf(config.EnvMinSize).Default, "the smallest allocation that becomes a managed allocation of its own; smaller ones come from the heap (--heap). Given alone, it also sets --heap system: only allocations of at least this size are managed")
	heapKind := flags.String("heap", config.SettingOf(config.EnvHeap).Default, "where allocations below --min-size come from: managed (jemalloc arenas whose memory is managed, so the whole heap is) or system (glibc's allocator, unmanaged)")
	statics := flags.Bool("statics", config.SettingOf(config.EnvStatics).Default == "1", "also make the program's own static arrays managed where its writable data segment holds at least --min-size bytes (gzip's buffers, say, are static)")
	preload := flags.String("preload", "", "path of "+preloadName+" (default: $UVM_PRELOAD, else next to the uvm binary, else ../lib from it, else built from the sources in this uvm into the user's cache directory on first use, which needs a C compiler); a path given here or in UVM_PRELOAD must exist")
	statsJSON := flags.String("stats-json", "", "also write the summary and the server's counters as JSON to this file")
	quiet := flags.Bool("quiet", false, "print no summary on standard error")
	if err := flags.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil, err
		}
		return nil, errUsage
	}
	usageErr := func(format string, a ...any) error {
		fmt.Fprintf(flags.Output(), "uvm run: "+format+"\n", a...)
		fmt.Fprintf(flags.Output(), "Run 'uvm help run' for the flags.\n")
		return errUsage
	}
	o := &runOptions{argv: flags.Args(), statics: *statics, preload: *preload, statsJSON: *statsJSON, quiet: *quiet}
	if len(o.argv) == 0 {
		return nil, usageErr("no program given: want uvm run [flags] -- PROGRAM [ARGS...]")
	}
	var err error
	if o.minBytes, err = uvm.ParseSize(*minSize); err != nil {
		return nil, usageErr("--min-size: %v", err)
	}
	if o.minBytes < 1 {
		return nil, usageErr("--min-size %q: want at least 1 byte", *minSize)
	}
	if o.heap, o.heapChosen, err = runHeap(flags, *heapKind); err != nil {
		return nil, usageErr("%v", err)
	}
	if o.cfg, err = sf.config(); err != nil {
		return nil, usageErr("%v", err)
	}
	return o, nil
}

// findProgram looks the program up as a shell would; where it is not
// found or cannot run, it says so as a shell does, and the error is the
// exit status a shell gives.
func findProgram(name string) (string, error) {
	path, err := exec.LookPath(name)
	if errors.Is(err, exec.ErrDot) {
		err = nil // found in a relative PATH entry: a shell runs it too
	}
	if err == nil {
		return path, nil
	}
	status := runStatusNotFound
	what := "command not found"
	switch {
	case strings.Contains(name, "/") && errors.Is(err, fs.ErrNotExist):
		what = "no such file or directory"
	case errors.Is(err, fs.ErrPermission):
		status, what = runStatusNotRunnable, "permission denied"
	}
	fmt.Fprintf(os.Stderr, "uvm run: %s: %s\n", name, what)
	return "", exitStatus(status)
}

// probeHeap asks, where the heap is to be managed, whether it can be,
// once before the program starts, so that a run of many processes (a
// shell, a build) hears once that its heap is not managed, and each of
// them is told to use glibc's quietly. Where it cannot, --heap managed
// fails the run; the default heap falls back to the system's, and the
// reason is returned.
func (o *runOptions) probeHeap(lib, self string) (unavailable string, err error) {
	if o.heap != "managed" {
		return "", nil
	}
	switch p, err := libuvm.ProbeHeap(runEnv(os.Environ(), "", o.minBytes, o.heap, false, lib, self)); {
	case err != nil:
		// Not known here: each process's library says so if it fails.
		fmt.Fprintf(os.Stderr, "uvm run: warning: %v; each process of the program says so itself if its heap cannot be managed\n", err)
	case !p.Managed && o.heapChosen:
		fmt.Fprintf(os.Stderr, "uvm run: --heap managed: the managed heap cannot be had: %s (%s), or run with --heap system\n", p.Why, p.Fix)
		return "", exitStatus(runStatusFailed)
	case !p.Managed:
		fmt.Fprintf(os.Stderr, "uvm run: the managed heap cannot be had: %s, so allocations below %s come from glibc's allocator, unmanaged, in every process of this run; to fix: %s (or give --heap system to run without it)\n",
			p.Why, humanSize(uint64(o.minBytes)), p.Fix)
		o.heap = "system"
		return p.Why, nil
	}
	return "", nil
}

// runProgram runs cmd to its end, passing on the signals uvm run gets,
// and returns how it ended and how long it took.
func runProgram(cmd *exec.Cmd) (syscall.WaitStatus, time.Duration, error) {
	// Caught before the program starts, so that none is lost between
	// its start and the forwarding.
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGQUIT)
	defer signal.Stop(sigs)
	start := time.Now()
	if err := cmd.Start(); err != nil {
		status := runStatusNotRunnable
		if errors.Is(err, fs.ErrNotExist) {
			status = runStatusNotFound
		}
		fmt.Fprintf(os.Stderr, "uvm run: %s: %v\n", cmd.Args[0], err)
		return 0, 0, exitStatus(status)
	}
	done := make(chan struct{})
	go forwardSignals(cmd.Process, sigs, done)
	waitErr := cmd.Wait()
	close(done)
	wall := time.Since(start)
	ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus)
	if !ok {
		fmt.Fprintf(os.Stderr, "uvm run: %s: %v\n", cmd.Args[0], waitErr)
		return 0, 0, exitStatus(runStatusFailed)
	}
	return ws, wall, nil
}

// report prints the run's summary on standard error (but with --quiet)
// and writes it to --stats-json's file, if given.
func (o *runOptions) report(rep runReport, jsonOut *os.File) {
	if !o.quiet {
		var b strings.Builder
		renderRunSummary(&b, filepath.Base(o.argv[0]), rep)
		os.Stderr.WriteString(b.String())
	}
	if jsonOut == nil {
		return
	}
	err := writeJSON(jsonOut, rep)
	if cerr := jsonOut.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "uvm run: --stats-json %s: %v\n", o.statsJSON, err)
	}
}

// startRunServer starts a fault server in a process of its own (so that
// it can die and be replaced by its guard while the program runs),
// listening on a socket in a fresh private directory and on the monitor
// socket of a private server named after this process, so that `uvm stat
// --pid` and `uvm info` find it. cleanup stops the server and removes
// both sockets.
func startRunServer(cfg uvm.ServerConfig) (*server.ServerProcess, string, func(), error) {
	dir, err := os.MkdirTemp("", "uvm-run-") // 0700
	if err != nil {
		return nil, "", nil, err
	}
	sock := filepath.Join(dir, "uvm.sock")
	monitor := config.PrivateServerSocketPath(os.Getpid())
	proc, err := server.StartServerProcess(cfg, sock, monitor)
	if err != nil {
		os.RemoveAll(dir)
		return nil, "", nil, err
	}
	cleanup := func() {
		proc.Close()
		os.Remove(monitor)
		os.RemoveAll(dir)
	}
	return proc, sock, cleanup, nil
}

// serverStats reads the run server's counters and its state (how many
// times it was restarted, its host peak).
func serverStats(proc *server.ServerProcess) (uvm.Stats, uvm.Info, error) {
	m, err := proc.Monitor()
	if err != nil {
		return uvm.Stats{}, uvm.Info{}, err
	}
	defer m.Close()
	st, err := m.ServerStats()
	if err != nil {
		return st, uvm.Info{}, err
	}
	in, err := m.Info()
	return st, in, err
}

// staticallyLinked says whether path is an ELF executable with no
// interpreter (PT_INTERP): the dynamic loader never runs for it, so
// LD_PRELOAD means nothing there (a static C program, most Go programs).
// A script or anything that is not ELF is not: its interpreter is what
// runs.
func staticallyLinked(path string) bool {
	f, err := elf.Open(path)
	if err != nil {
		return false
	}
	defer f.Close()
	if f.Type != elf.ET_EXEC && f.Type != elf.ET_DYN {
		return false
	}
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return false
		}
	}
	return true
}

// findPreload finds libuvm-preload.so: the flag, $UVM_PRELOAD, next to
// this executable, or in ../lib from it (an installed prefix); else the
// library built from the sources in this binary (package libuvm) in the
// user's cache directory, building it there on first use. A flag or
// variable that names a missing file is an error, not a reason to build.
func findPreload(flagPath string) (string, error) {
	check := func(p, from string) (string, error) {
		abs, err := filepath.Abs(p)
		if err != nil {
			return "", fmt.Errorf("%s %s: %v", from, p, err)
		}
		fi, err := os.Stat(abs)
		if err != nil {
			return "", fmt.Errorf("%s %s: %v", from, p, err)
		}
		if fi.IsDir() {
			return "", fmt.Errorf("%s %s: a directory, want the path of %s", from, p, preloadName)
		}
		return abs, nil
	}
	if flagPath != "" {
		return check(flagPath, "--preload")
	}
	if env := os.Getenv(config.EnvPreload); env != "" {
		return check(env, config.EnvPreload)
	}
	var looked []string
	if exe, err := os.Executable(); err == nil {
		if real, err := filepath.EvalSymlinks(exe); err == nil {
			exe = real
		}
		dir := filepath.Dir(exe)
		for _, p := range []string{filepath.Join(dir, preloadName), filepath.Join(filepath.Dir(dir), "lib", preloadName)} {
			if fi, err := os.Stat(p); err == nil && !fi.IsDir() {
				return p, nil
			}
			looked = append(looked, p)
		}
	}
	lib, err := libuvm.Preload(libuvm.Options{Building: func(dir string) {
		fmt.Fprintf(os.Stderr, "uvm run: building %s into %s (first use of this uvm build) ...\n", preloadName, dir)
	}})
	if err == nil {
		return lib, nil
	}
	what := "building it from the sources in this uvm failed"
	if errors.Is(err, libuvm.ErrNoCompiler) {
		what = "it cannot be built from the sources in this uvm"
	}
	return "", fmt.Errorf("cannot find %s: not at %s, neither --preload nor UVM_PRELOAD names it, and %s: %v\n"+
		"Install a C compiler (apt-get install gcc, or set CC), or build the library with `make lib` in a softuvm checkout "+
		"and pass --preload PATH or set UVM_PRELOAD=PATH", preloadName, strings.Join(looked, " or "), what, err)
}

// runHeap is the heap --heap names: "managed" or "system", and whether
// --heap chose it. --min-size given without --heap asks for large
// allocations only, as it did before the heap was managed.
func runHeap(flags *flag.FlagSet, heap string) (string, bool, error) {
	set := map[string]bool{}
	flags.Visit(func(f *flag.Flag) { set[f.Name] = true })
	switch {
	case heap != "managed" && heap != "system":
		return "", false, fmt.Errorf("--heap %q: want managed or system", heap)
	case set["min-size"] && !set["heap"]:
		return "system", false, nil
	}
	return heap, set["heap"], nil
}

// runEnv is the program's environment: the server's socket, the
// threshold, the preload library ahead of any the caller preloads, and
// this binary (self) as UVM_BIN. The program's libuvm talks to this
// server; should it ever start a private server of its own (a child
// that sets UVM_SERVER=private, say), that server must be this binary
// too, with the policies linked into it, not whatever uvm is on PATH.
func runEnv(env []string, sock string, minSize int64, heap string, statics bool, lib, self string) []string {
	out := make([]string, 0, len(env)+8)
	preload, tunables := lib, ""
	for _, kv := range env {
		k, v, _ := strings.Cut(kv, "=")
		switch k {
		case "LD_PRELOAD":
			if strings.TrimSpace(v) != "" {
				preload = lib + ":" + v
			}
			continue
		case uvm.EnvSocket, uvm.EnvServer, config.EnvMinSize, config.EnvHeap, config.EnvStatics, config.EnvBin:
			continue
		case "GLIBC_TUNABLES":
			tunables = v
			continue
		}
		out = append(out, kv)
	}
	if heap == "managed" {
		// The managed heap loads jemalloc with dlopen: room for its TLS.
		tunables = libuvm.HeapTunables(tunables)
	}
	if tunables != "" {
		out = append(out, "GLIBC_TUNABLES="+tunables)
	}
	return append(out,
		uvm.EnvSocket+"="+sock,
		uvm.EnvServer+"=daemon", // this server, never a private one of its own
		config.EnvBin+"="+self,
		config.EnvMinSize+"="+strconv.FormatInt(minSize, 10),
		config.EnvHeap+"="+heap,
		config.EnvStatics+"="+map[bool]string{true: "1", false: "0"}[statics],
		"LD_PRELOAD="+preload)
}

// forwardSignals passes the signals uvm run receives on to the program
// until done. A SIGINT or SIGQUIT typed at the terminal already went to
// the whole foreground process group, the program included (it shares
// uvm run's group, so that job control stops and resumes both): while
// uvm run is in the terminal's foreground, those two are not sent a
// second time.
func forwardSignals(p *os.Process, sigs <-chan os.Signal, done <-chan struct{}) {
	for {
		select {
		case <-done:
			return
		case sig := <-sigs:
			if (sig == syscall.SIGINT || sig == syscall.SIGQUIT) && inForeground() {
				continue
			}
			p.Signal(sig)
		}
	}
}

// inForeground says whether this process's group is the foreground group
// of the terminal on its standard input, output or error.
func inForeground() bool {
	me := syscall.Getpgrp()
	for fd := 0; fd <= 2; fd++ {
		var pgrp int32
		if _, _, e := syscall.Syscall(syscall.SYS_IOCTL, uintptr(fd), syscall.TIOCGPGRP, uintptr(unsafe.Pointer(&pgrp))); e == 0 {
			return int(pgrp) == me
		}
	}
	return false
}

func makeRunReport(argv []string, ws syscall.WaitStatus, wall time.Duration, minSize int64, cfg uvm.ServerConfig, st uvm.Stats) runReport {
	rep := runReport{
		Program: argv, WallSeconds: wall.Seconds(), MinSize: minSize, HostBudget: cfg.HostBudget, Devices: len(cfg.Devices),
		Allocations: st.Allocations, AllocatedBytes: st.AllocatedBytes, Faults: st.Faults,
		FaultServiceP50NS: int64(st.FaultService.Quantile(0.5)), FaultServiceP99NS: int64(st.FaultService.Quantile(0.99)),
		Stats: st,
	}
	if rep.Faults == nil {
		rep.Faults = []uvm.ProcessorFaults{}
	}
	switch {
	case ws.Signaled():
		rep.ExitStatus = 128 + int(ws.Signal())
		rep.Signal = workloads.SignalName(ws.Signal())
	default:
		rep.ExitStatus = ws.ExitStatus()
	}
	for _, m := range st.Migrations {
		switch {
		case m.From == uvm.CPU && m.To != uvm.CPU:
			rep.HostToDeviceBytes += m.Bytes
		case m.From != uvm.CPU && m.To == uvm.CPU:
			rep.DeviceToHostBytes += m.Bytes
		}
	}
	// Copies that kept their source are bytes moved too: clean
	// eviction's copies to the host come from devices, and read
	// duplication's to a device from the host where it is the only
	// other holder, as under uvm run.
	for _, d := range st.ReadDuplicated {
		if d.Processor == uvm.CPU {
			rep.DeviceToHostBytes += d.Pages * uvm.PageSize
		} else {
			rep.HostToDeviceBytes += d.Pages * uvm.PageSize
		}
	}
	for _, e := range st.Evicted {
		rep.EvictedPages += e.Pages
	}
	return rep
}

// renderRunSummary writes the summary uvm run prints at exit.
func renderRunSummary(w io.Writer, name string, r runReport) {
	how := fmt.Sprintf("exited with status %d", r.ExitStatus)
	if r.Signal != "" {
		how = fmt.Sprintf("was killed by %s (status %d)", r.Signal, r.ExitStatus)
	}
	fmt.Fprintf(w, "uvm run: %s %s after %.2fs\n", name, how, r.WallSeconds)
	fmt.Fprintf(w, "  %-20s %d (%s), threshold %s\n", "managed allocations", r.Allocations, humanSize(r.AllocatedBytes), humanSize(uint64(r.MinSize)))
	switch {
	case r.Heap == "managed":
		fmt.Fprintf(w, "  %-20s managed: smaller allocations from jemalloc arenas over managed memory (counted above as their chunks)\n", "heap")
	case r.HeapUnavailable != "":
		fmt.Fprintf(w, "  %-20s system: smaller allocations were glibc's, unmanaged (the managed heap could not be had, as said at the start)\n", "heap")
	default:
		fmt.Fprintf(w, "  %-20s system: smaller allocations were glibc's, unmanaged\n", "heap")
	}
	var faults []string
	for _, f := range r.Faults {
		faults = append(faults, fmt.Sprintf("%v %d (missing %d, minor %d, write-protect %d)", f.Processor, f.Total(), f.Missing, f.Minor, f.WriteProtect))
	}
	if len(faults) == 0 {
		faults = []string{"none"}
	}
	fmt.Fprintf(w, "  %-20s %s\n", "faults", strings.Join(faults, "; "))
	fmt.Fprintf(w, "  %-20s host -> device %s, device -> host %s\n", "copied", humanSize(r.HostToDeviceBytes), humanSize(r.DeviceToHostBytes))
	for _, m := range r.Stats.Migrations {
		fmt.Fprintf(w, "  %-20s %d pages (%s)\n", fmt.Sprintf("  %v -> %v", m.From, m.To), m.Pages, humanSize(m.Bytes))
	}
	for _, d := range r.Stats.ReadDuplicated {
		fmt.Fprintf(w, "  %-20s %d pages (%s), the other copy kept\n", fmt.Sprintf("  read copies on %v", d.Processor), d.Pages, humanSize(d.Pages*uvm.PageSize))
	}
	fmt.Fprintf(w, "  %-20s %d pages (%s)", "evicted", r.EvictedPages, humanSize(r.EvictedPages*uvm.PageSize))
	if n := r.Stats.EvictedCleanPages; n > 0 {
		fmt.Fprintf(w, ", %d of them clean (no copy: the device's was current)", n)
	}
	if r.HostBudget > 0 {
		fmt.Fprintf(w, ", host budget %s", humanSize(uint64(r.HostBudget)))
	}
	fmt.Fprintln(w)
	if r.HostPeakBytes > 0 {
		fmt.Fprintf(w, "  %-20s %s of managed memory on the host at once\n", "host peak", humanSize(uint64(r.HostPeakBytes)))
	}
	for _, rf := range r.Stats.Refaults {
		fmt.Fprintf(w, "  %-20s %d pages, %s\n", fmt.Sprintf("refaults on %v", rf.Processor), rf.Pages, refaultDetail(rf))
	}
	if n := r.Stats.DiscardedPages; n > 0 {
		fmt.Fprintf(w, "  %-20s %d pages (%s) dropped without a copy: freed heap memory, uvmMemDiscard\n", "discarded", n, humanSize(n*uvm.PageSize))
	}
	h := r.Stats.FaultService
	if h.Count > 0 {
		fmt.Fprintf(w, "  %-20s %d faults: p50 %v, p99 %v, max %v\n", "fault service", h.Count, time.Duration(r.FaultServiceP50NS), time.Duration(r.FaultServiceP99NS), time.Duration(h.MaxNS))
	} else {
		fmt.Fprintf(w, "  %-20s no faults\n", "fault service")
	}
	if r.ServerRestarts > 0 {
		fmt.Fprintf(w, "  %-20s %d: the server died and was replaced; the figures above count since the last takeover\n", "server restarts", r.ServerRestarts)
	}
}

// humanSize is trace.HumanSize, the reports' way of writing bytes.
func humanSize(n uint64) string { return trace.HumanSize(n) }
