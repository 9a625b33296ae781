package workloads

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/softuvm/softuvm/uvm"
)

// StdoutName is the file in a run's directory that holds its standard
// output; StatsName the `uvm run --stats-json` report of RunUVM.
const (
	StdoutName = "stdout"
	StatsName  = "uvm-stats.json"
)

// Run is one finished run of a workload.
type Run struct {
	Dir        string // the run's working directory: StdoutName and the outputs
	ExitStatus int    // 128+N if signal N killed it, as a shell says
	Signal     string // the signal that killed it, or ""
	Wall       time.Duration
	// MaxRSS is a peak resident set in bytes. For RunPlain and
	// RunWrapped with the workload's PeakWrapper set, the program's own
	// (its ru_maxrss, measured by the wrapper; 0 if the wrapper was
	// killed before it could say). Otherwise, and under `uvm run`, the
	// rusage of the process waited for: the program's, uvm's and this
	// process's peak at the program's start, whichever is larger.
	MaxRSS int64
	Stderr string // its standard error (the last 64 KiB)
	// Stats is RunUVM's report from `uvm run --stats-json`; nil for the
	// other runs.
	Stats *RunStats
}

// StdoutPath is the file that holds the run's standard output.
func (r *Run) StdoutPath() string { return filepath.Join(r.Dir, StdoutName) }

// RunStats is the part of `uvm run --stats-json` the harness reads. Its
// fields are those of the report (cli's runReport); fields added to the
// report later are ignored.
type RunStats struct {
	ExitStatus  int     `json:"exit_status"`
	Signal      string  `json:"signal"`
	WallSeconds float64 `json:"wall_seconds"`
	MinSize     int64   `json:"min_size"`
	HostBudget  int64   `json:"host_budget"`
	// Allocations and AllocatedBytes: the managed allocations made and
	// the bytes they asked for, freed or not.
	Allocations    uint64 `json:"allocations"`
	AllocatedBytes uint64 `json:"allocated_bytes"`
	// Bytes migrated from the host to the devices and back.
	HostToDeviceBytes uint64 `json:"host_to_device_bytes"`
	DeviceToHostBytes uint64 `json:"device_to_host_bytes"`
	// EvictedPages: pages evicted from every location (from the host
	// over its budget, from a full device).
	EvictedPages uint64 `json:"evicted_pages"`
	// HostPeakBytes is the most managed memory the host held at once.
	HostPeakBytes  int64     `json:"host_peak_bytes"`
	ServerRestarts uint64    `json:"server_restarts"`
	Stats          uvm.Stats `json:"stats"`
}

// PopulatedBytes is the managed memory the program touched: the pages
// created zero-filled in managed memory (by a first touch, or a prefetch
// of never-touched memory), on every processor, in bytes. Like
// AllocatedBytes it counts over the whole run: memory freed and
// allocated again counts again.
func (s *RunStats) PopulatedBytes() uint64 {
	var pages uint64
	for _, p := range s.Stats.Populated {
		pages += p.Pages
	}
	return pages * uvm.PageSize
}

// ManagedBytes is the figure the managed-share check compares with a
// plain run's peak RSS: the managed memory the program both asked for
// and touched, the smaller of allocated_bytes (what its managed
// allocations asked for: a reservation it never touches counts in full)
// and the populated pages (what it touched of managed memory). There is
// no peak of managed memory in the report; both figures count over the
// whole run.
func (s *RunStats) ManagedBytes() uint64 { return min(s.AllocatedBytes, s.PopulatedBytes()) }

// Faults is the number of faults the server served, every processor.
func (s *RunStats) Faults() uint64 { return s.Stats.TotalFaults() }

// HostEvictedPages are the pages evicted from the host over its budget.
func (s *RunStats) HostEvictedPages() uint64 {
	for _, e := range s.Stats.Evicted {
		if e.Processor == uvm.CPU {
			return e.Pages
		}
	}
	return 0
}

// ReadStats reads a `uvm run --stats-json` report.
func ReadStats(path string) (*RunStats, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var s RunStats
	if err := json.Unmarshal(b, &s); err != nil {
		return nil, fmt.Errorf("uvm run --stats-json %s: %w", path, err)
	}
	return &s, nil
}

// RunPlain runs the workload as it is, in dir (created; it must not
// hold an earlier run's files).
func (w *Workload) RunPlain(ctx context.Context, dir string) (*Run, error) {
	return w.RunWrapped(ctx, dir, nil)
}

// peakName is the file in a run's directory where the peak wrapper
// writes the program's peak RSS.
const peakName = "peak-rss-kib"

// UVMOptions say how RunUVM runs `uvm run`.
type UVMOptions struct {
	Bin        string   // the uvm binary
	HostBudget int64    // --host-budget in bytes; 0: none
	Flags      []string // more flags of `uvm run` (--eviction lru, --arena-size 2GiB, ...)
}

// UVMArgs is the command line that runs the workload under `uvm run`
// with its report written to statsPath (the program's argv follows).
func (o UVMOptions) UVMArgs(statsPath string) []string {
	args := []string{o.Bin, "run", "--quiet", "--stats-json", statsPath}
	if o.HostBudget > 0 {
		args = append(args, "--host-budget", strconv.FormatInt(o.HostBudget, 10))
	}
	return append(append(args, o.Flags...), "--")
}

// RunUVM runs the workload under `uvm run` in dir, with the program's
// UVMFlags before o's own, and reads its report into the run's Stats. A
// run whose report is missing or unreadable is an error; one whose
// program failed is not (see Check). A cancelled run is an error with
// the run, and its Stats where uvm run wrote them.
func (w *Workload) RunUVM(ctx context.Context, dir string, o UVMOptions) (*Run, error) {
	if o.Bin == "" {
		return nil, fmt.Errorf("RunUVM: no uvm binary")
	}
	stats := filepath.Join(dir, StatsName)
	o.Flags = append(append([]string(nil), w.Program.UVMFlags...), o.Flags...)
	r, err := w.run(ctx, dir, o.UVMArgs(stats), false)
	if err != nil {
		if r != nil {
			// Cancelled: uvm run passed SIGTERM on to the program and
			// wrote what its server did until then, if it could.
			r.Stats, _ = ReadStats(stats)
		}
		return r, err
	}
	if r.Stats, err = ReadStats(stats); err != nil {
		return r, fmt.Errorf("%s under uvm run (exit status %d): %w; stderr:\n%s", w.Program.Name, r.ExitStatus, err, tail(r.Stderr, 4000))
	}
	if r.Stats.ExitStatus != r.ExitStatus {
		return r, fmt.Errorf("%s under uvm run exited with status %d, but its report says %d", w.Program.Name, r.ExitStatus, r.Stats.ExitStatus)
	}
	return r, nil
}

// RunWrapped runs prefix followed by the workload's command line in dir
// (created): prefix is nil for a plain run, or a command that runs its
// arguments, ending by exec'ing them (a memory cgroup's shell, say). With
// a PeakWrapper, the wrapper comes between prefix and the program. A
// cancelled ctx sends SIGTERM (so that `uvm run` stops its server), then
// SIGKILL 5 s later. The error is for a run that could not start or was
// cancelled; the program's own failure is in ExitStatus.
func (w *Workload) RunWrapped(ctx context.Context, dir string, prefix []string) (*Run, error) {
	return w.run(ctx, dir, prefix, true)
}

// run is RunWrapped, through the PeakWrapper only where peak is set:
// under `uvm run` the wrapper would run under its preload library too.
func (w *Workload) run(ctx context.Context, dir string, prefix []string, peak bool) (*Run, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	peak = peak && w.PeakWrapper != ""
	peakFile := filepath.Join(dir, peakName)
	out, err := os.Create(filepath.Join(dir, StdoutName))
	if err != nil {
		return nil, err
	}
	defer out.Close()
	argv := append([]string(nil), prefix...)
	if peak {
		argv = append(argv, w.PeakWrapper, peakFile)
	}
	argv = append(argv, w.Argv...)
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), w.Env...)
	// Through a pipe, copied by this process: the program's output
	// then takes no page cache of its own (charged to a memory cgroup
	// it runs in).
	cmd.Stdout = struct{ io.Writer }{out}
	errBuf := &tailBuffer{max: 64 << 10}
	cmd.Stderr = errBuf
	if cmd.Stdin, err = w.OpenStdin(); err != nil {
		return nil, err
	}
	defer cmd.Stdin.(*os.File).Close()
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	cmd.WaitDelay = 5 * time.Second
	start := time.Now()
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("%s: %w", w.Program.Name, err)
	}
	waitErr := cmd.Wait()
	r := &Run{Dir: dir, Wall: time.Since(start), Stderr: errBuf.String()}
	var peakErr error
	if cmd.ProcessState != nil {
		if peak {
			r.MaxRSS, peakErr = readPeak(peakFile)
		} else if ru, ok := cmd.ProcessState.SysUsage().(*syscall.Rusage); ok {
			r.MaxRSS = ru.Maxrss << 10 // kilobytes on Linux
		}
		if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			r.ExitStatus, r.Signal = 128+int(ws.Signal()), SignalName(ws.Signal())
		} else {
			r.ExitStatus = cmd.ProcessState.ExitCode()
		}
	}
	if ctx.Err() != nil {
		return r, fmt.Errorf("%s: %w after %v; stderr:\n%s", w.Program.Name, ctx.Err(), r.Wall.Round(time.Millisecond), tail(r.Stderr, 4000))
	}
	if cmd.ProcessState == nil {
		return r, fmt.Errorf("%s: %w", w.Program.Name, waitErr)
	}
	if peakErr != nil {
		return r, fmt.Errorf("%s: its peak RSS: %v (the wrapper exited with status %d); stderr:\n%s", w.Program.Name, peakErr, r.ExitStatus, tail(r.Stderr, 4000))
	}
	return r, nil
}

// OpenStdin opens the workload's standard input: its Stdin file, or the
// null device where it has none. The caller closes it.
func (w *Workload) OpenStdin() (*os.File, error) {
	if w.Stdin == "" {
		return os.Open(os.DevNull)
	}
	return os.Open(w.Stdin)
}

// SignalName is a signal's name as kill -l gives it, SIG prefix included.
func SignalName(s syscall.Signal) string {
	names := map[syscall.Signal]string{
		syscall.SIGHUP: "SIGHUP", syscall.SIGINT: "SIGINT", syscall.SIGQUIT: "SIGQUIT", syscall.SIGILL: "SIGILL",
		syscall.SIGTRAP: "SIGTRAP", syscall.SIGABRT: "SIGABRT", syscall.SIGBUS: "SIGBUS", syscall.SIGFPE: "SIGFPE",
		syscall.SIGKILL: "SIGKILL", syscall.SIGUSR1: "SIGUSR1", syscall.SIGSEGV: "SIGSEGV", syscall.SIGUSR2: "SIGUSR2",
		syscall.SIGPIPE: "SIGPIPE", syscall.SIGALRM: "SIGALRM", syscall.SIGTERM: "SIGTERM", syscall.SIGXCPU: "SIGXCPU",
		syscall.SIGXFSZ: "SIGXFSZ", syscall.SIGSYS: "SIGSYS",
	}
	if n, ok := names[s]; ok {
		return n
	}
	return fmt.Sprintf("signal %d", int(s))
}

// Check checks one run: exit status 0 and, for a checker, no error in
// what it printed.
func (w *Workload) Check(r *Run) error {
	if r.ExitStatus != 0 {
		how := fmt.Sprintf("exited with status %d", r.ExitStatus)
		if r.Signal != "" {
			how = "was killed by " + r.Signal
		}
		return fmt.Errorf("%s %s; stderr:\n%s", w.Program.Name, how, tail(r.Stderr, 4000))
	}
	if w.check == nil {
		return nil
	}
	out, err := os.ReadFile(r.StdoutPath())
	if err != nil {
		return err
	}
	return w.check(string(out) + "\n" + r.Stderr)
}

// Compare checks that got's standard output and output files are byte
// for byte want's. Checkers' outputs are not compared (they hold times
// and pids): only their Check.
func (w *Workload) Compare(want, got *Run) error {
	if w.Program.Checker {
		return nil
	}
	var errs []error
	for _, name := range append([]string{StdoutName}, w.Outputs...) {
		if err := compareFiles(filepath.Join(want.Dir, name), filepath.Join(got.Dir, name)); err != nil {
			errs = append(errs, fmt.Errorf("%s's %s: %w", w.Program.Name, name, err))
		}
	}
	return errors.Join(errs...)
}

// compareFiles compares two files byte for byte and describes the first
// difference.
func compareFiles(wantPath, gotPath string) error {
	wf, err := os.Open(wantPath)
	if err != nil {
		return err
	}
	defer wf.Close()
	gf, err := os.Open(gotPath)
	if err != nil {
		return err
	}
	defer gf.Close()
	ws, _ := wf.Stat()
	gs, _ := gf.Stat()
	wr, gr := bufio.NewReaderSize(wf, 1<<20), bufio.NewReaderSize(gf, 1<<20)
	wb, gb := make([]byte, 1<<20), make([]byte, 1<<20)
	for off := int64(0); ; {
		wn, werr := io.ReadFull(wr, wb)
		gn, gerr := io.ReadFull(gr, gb)
		n := min(wn, gn)
		if i := firstDiff(wb[:n], gb[:n]); i >= 0 {
			at := off + int64(i)
			return fmt.Errorf("differs at byte %d of %d (want %d bytes): want %q, got %q", at, gs.Size(), ws.Size(),
				excerpt(wb[:wn], i), excerpt(gb[:gn], i))
		}
		if wn != gn {
			return fmt.Errorf("%d bytes, want %d: the same up to byte %d", gs.Size(), ws.Size(), off+int64(n))
		}
		off += int64(n)
		wEnd := errors.Is(werr, io.EOF) || errors.Is(werr, io.ErrUnexpectedEOF)
		gEnd := errors.Is(gerr, io.EOF) || errors.Is(gerr, io.ErrUnexpectedEOF)
		switch {
		case werr != nil && !wEnd:
			return werr
		case gerr != nil && !gEnd:
			return gerr
		case wEnd && gEnd:
			return nil
		}
	}
}

func firstDiff(a, b []byte) int {
	if bytes.Equal(a, b) {
		return -1
	}
	for i := range a {
		if a[i] != b[i] {
			return i
		}
	}
	return -1
}

// excerpt is up to 40 bytes of b around i.
func excerpt(b []byte, i int) string {
	return string(b[max(i-20, 0):min(i+20, len(b))])
}

// tailBuffer keeps the last max bytes written to it.
type tailBuffer struct {
	buf     []byte
	max     int
	dropped bool
}

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.buf = append(t.buf, p...)
	if len(t.buf) > t.max {
		t.buf = append(t.buf[:0], t.buf[len(t.buf)-t.max:]...)
		t.dropped = true
	}
	return len(p), nil
}

func (t *tailBuffer) String() string {
	if t.dropped {
		return "..." + string(t.buf)
	}
	return string(t.buf)
}

// Budget is the host budget for a fraction of a peak: rounded up
// to a MiB multiple, at least min.
func Budget(peak int64, fraction float64, least int64) int64 {
	b := int64(math.Ceil(float64(peak) * fraction))
	b = (b + 1<<20 - 1) &^ (1<<20 - 1)
	return max(b, least)
}

// Describe is a run's one-line summary for logs.
func (r *Run) Describe() string {
	s := fmt.Sprintf("%.3fs, peak RSS %.1f MiB, exit %d", r.Wall.Seconds(), float64(r.MaxRSS)/(1<<20), r.ExitStatus)
	if st := r.Stats; st != nil {
		var b strings.Builder
		fmt.Fprintf(&b, "%s; %d managed allocations (%.1f MiB), %.1f MiB populated, %d faults, %d pages evicted, host->device %.1f MiB, device->host %.1f MiB",
			s, st.Allocations, float64(st.AllocatedBytes)/(1<<20), float64(st.PopulatedBytes())/(1<<20), st.Faults(), st.EvictedPages,
			float64(st.HostToDeviceBytes)/(1<<20), float64(st.DeviceToHostBytes)/(1<<20))
		return b.String()
	}
	return s
}
