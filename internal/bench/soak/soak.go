package soak

import (
	"context"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/softuvm/softuvm/internal/bench"
	"github.com/softuvm/softuvm/libuvm"
	"github.com/softuvm/softuvm/uvm"
)

//go:embed csrc/soak_client.c
var soakClientSource string

// Report is what `uvm bench soak --json` prints.
type Report struct {
	Machine         bench.Machine `json:"machine"`
	Seed            uint64        `json:"seed"`
	DurationSeconds float64       `json:"duration_seconds"`
	ElapsedSeconds  float64       `json:"elapsed_seconds"`
	// Daemon is the daemon's command line, less the socket.
	Daemon   []string            `json:"daemon"`
	Clients  []*soakClientReport `json:"clients"`
	Ops      map[string]uint64   `json:"ops"` // the Go and C clients' operations by kind
	OpsTotal uint64              `json:"ops_total"`
	// BytesChecked counts the bytes the clients compared with their
	// shadows (kernels' hashes count their ranges); RunOutputBytes the
	// output of programs under uvm run compared with a plain run's.
	BytesChecked   uint64 `json:"bytes_checked"`
	RunOutputBytes uint64 `json:"run_output_bytes_checked"`
	// LaunchesLost counts launches whose device process a kill ended.
	LaunchesLost uint64                   `json:"launches_lost"`
	Runs         map[string]*soakRunCount `json:"runs"`  // by program
	Kills        map[string]*soakKills    `json:"kills"` // by kind: server, device, guard
	KillLog      []soakKill               `json:"kill_log"`
	// KillsSkipped counts kills not made because nothing of the kind
	// was there to kill (no `uvm run` in progress, say).
	KillsSkipped map[string]int `json:"kills_skipped,omitempty"`
	Notes        []string       `json:"notes,omitempty"`
	Failures     []soakFailure  `json:"failures"`
	Interrupted  string         `json:"interrupted,omitempty"`
	// LogDir holds the daemon's, the clients' and the runs' logs: kept
	// when the soak fails, or when --log-dir names it.
	LogDir string `json:"log_dir,omitempty"`
	OK     bool   `json:"ok"`
}

type soakClientReport struct {
	Name string `json:"name"`
	Kind string `json:"kind"` // go, c, run
	// Go and C clients.
	Ops            uint64            `json:"ops,omitempty"`
	OpsByKind      map[string]uint64 `json:"ops_by_kind,omitempty"`
	BytesChecked   uint64            `json:"bytes_checked,omitempty"`
	LaunchesLost   uint64            `json:"launches_lost,omitempty"`
	ServerRestarts int               `json:"server_restarts,omitempty"` // takeovers a Go client saw
	Finished       bool              `json:"finished"`                  // ended well, every allocation checked whole
	// Clients under uvm run: programs run, and the restarts of their
	// servers that uvm run counted.
	Runs           uint64 `json:"runs,omitempty"`
	RunRestarts    uint64 `json:"run_server_restarts,omitempty"`
	RunOutputBytes uint64 `json:"run_output_bytes,omitempty"`
}

type soakRunCount struct {
	Runs     int     `json:"runs"`
	OK       int     `json:"ok"`
	Restarts uint64  `json:"server_restarts"`
	Seconds  float64 `json:"seconds"` // summed wall time
}

// soakKills counts one kind of kill: how many, how many were recovered
// from (a takeover logged, a new guard holding every session, a new
// device process), where, and the time from the kill to the recovery.
type soakKills struct {
	Kills         int     `json:"kills"`
	Survived      int     `json:"survived"`
	Daemon        int     `json:"daemon"`
	Run           int     `json:"run"`
	RecoveryP50MS float64 `json:"recovery_p50_ms"`
	RecoveryMaxMS float64 `json:"recovery_max_ms"`
	recoveries    []float64
}

type soakKill struct {
	AtSeconds float64 `json:"at_seconds"`
	Kind      string  `json:"kind"`  // server, device, guard
	Where     string  `json:"where"` // daemon, or the run client and its program
	PID       int     `json:"pid"`
	Client    string  `json:"client,omitempty"` // a device process's
	Recovery  string  `json:"recovery"`
	// RecoveredMS is the time from the kill until the recovery was seen
	// (polled every 20 ms; 100 ms for device processes).
	RecoveredMS float64 `json:"recovered_ms"`
	Survived    bool    `json:"survived"`
}

type soakFailure struct {
	// Kind: wrong-byte, hang, crash, error, kill (a kill not recovered
	// from), run (a program under uvm run failed or printed other
	// output), server (a server counted or logged a lost or poisoned
	// page, or a panic).
	Kind    string     `json:"kind"`
	Client  string     `json:"client,omitempty"`
	Message string     `json:"message"`
	Wrong   *soakWrong `json:"wrong,omitempty"`
	// Kills lists, for a wrong byte, the kills made while the
	// operations its history lists ran.
	Kills []soakKill `json:"kills,omitempty"`
}

// Options configure Soak, as `uvm bench soak`'s flags do.
type Options struct {
	Duration         time.Duration
	Clients          map[string]int  // go, c, run
	Seed             uint64          // 0: from the clock
	KillMin, KillMax time.Duration   // a random time between a recovery and the next kill; 0: no kills
	KillKinds        map[string]bool // server, device, guard
	HangAfter        time.Duration
	MaxAlloc         int64
	Slots            int
	Ops              []string // the operations the Go and C clients choose from
	Programs         []string
	DaemonArgs       []string // uvm serve's server flags
	RunArgs          []string // the server flags given, for uvm run
	LogDir           string
	UVM              string // the uvm binary
	Progress         func(format string, a ...any)
	Interruptions    <-chan os.Signal
}

// check refuses options the soak cannot run with, naming the flag.
func (o Options) check() error {
	switch {
	case o.Duration <= 0:
		return fmt.Errorf("--duration %v: want a positive duration", o.Duration)
	case o.HangAfter < 10*time.Second:
		return fmt.Errorf("--hang-after %v: want at least 10s (a takeover alone takes a fraction of a second, a program under uvm run seconds)", o.HangAfter)
	case o.Slots < 2:
		return fmt.Errorf("--slots %d: want at least 2 (kernels on two devices use two allocations)", o.Slots)
	case o.MaxAlloc < 1:
		return fmt.Errorf("--max-alloc %d: want at least 1 byte", o.MaxAlloc)
	case o.UVM == "":
		return fmt.Errorf("no uvm binary to run the daemon and the clients")
	}
	return nil
}

// ParseKills reads --kills, the kinds of process killed: some of
// server, device and guard. With kills off (on false) it keeps none.
func ParseKills(text string, on bool) (map[string]bool, error) {
	kinds := map[string]bool{}
	for _, k := range strings.Split(text, ",") {
		if k = strings.TrimSpace(k); k != "server" && k != "device" && k != "guard" {
			return nil, fmt.Errorf("--kills: unknown kind %q, want server, device or guard", k)
		}
		kinds[k] = true
	}
	if !on {
		clear(kinds)
	}
	return kinds, nil
}

// ParseOps reads --ops, the operations the clients choose from.
func ParseOps(text string) ([]string, error) {
	return parseSoakNames("--ops", "operation", text, OpNames())
}

// ParsePrograms reads --programs, the programs run under uvm run.
func ParsePrograms(text string) ([]string, error) {
	return parseSoakNames("--programs", "program", text, ProgramNames)
}

func parseSoakNames(flagName, what, text string, known []string) ([]string, error) {
	var out []string
	for _, n := range strings.Split(text, ",") {
		if n = strings.TrimSpace(n); !slices.Contains(known, n) {
			return nil, fmt.Errorf("%s: unknown %s %q, want some of %s", flagName, what, n, strings.Join(known, ", "))
		}
		out = append(out, n)
	}
	return out, nil
}

// ProgramNames are the programs --programs may name.
var ProgramNames = []string{"memtester", "sha256sum", "sort", "gzip"}

// ParseClients reads --clients: N (each kind), or go=N,c=N,run=N
// (a kind not named: none).
func ParseClients(text string) (map[string]int, error) {
	if n, err := strconv.Atoi(text); err == nil {
		if n < 1 {
			return nil, fmt.Errorf("--clients %d: want at least 1 of each kind, or go=N,c=N,run=N", n)
		}
		return map[string]int{"go": n, "c": n, "run": n}, nil
	}
	out := map[string]int{}
	for _, part := range strings.Split(text, ",") {
		k, v, ok := strings.Cut(strings.TrimSpace(part), "=")
		n, err := strconv.Atoi(v)
		if !ok || err != nil || n < 0 || (k != "go" && k != "c" && k != "run") {
			return nil, fmt.Errorf("--clients %q: want a count, or go=N,c=N,run=N", text)
		}
		out[k] = n
	}
	if out["go"]+out["c"]+out["run"] == 0 {
		return nil, fmt.Errorf("--clients %q: no client", text)
	}
	return out, nil
}

// ParseKillEvery reads --kill-every: MIN-MAX, one duration, or off (0, 0).
func ParseKillEvery(text string) (time.Duration, time.Duration, error) {
	if text == "off" {
		return 0, 0, nil
	}
	lo, hi, ranged := strings.Cut(text, "-")
	if !ranged {
		hi = lo
	}
	a, err1 := time.ParseDuration(lo)
	b, err2 := time.ParseDuration(hi)
	if err1 != nil || err2 != nil || a <= 0 || b < a {
		return 0, 0, fmt.Errorf("--kill-every %q: want MIN-MAX (2s-6s), one duration (3s) or off", text)
	}
	return a, b, nil
}

// soak is one run of the soak. mu guards rep and the clients' progress.
type soak struct {
	o        Options
	dir      string // logs and inputs
	sock     string
	env      []string // the clients' environment
	start    time.Time
	ended    chan struct{} // closed at a failure or an interruption
	endOnce  sync.Once
	mu       sync.Mutex
	rep      Report
	procs    []*soakProc
	runners  []*soakRunner
	killedDP map[int]bool // device processes the soak killed
	daemon   *exec.Cmd
	daemonLg string
	inputs   soakInputs
	// quit is set once a hang's report sent the daemon's server SIGQUIT
	// (for its goroutines): the end does not ask it anything more.
	quit atomic.Bool
}

// fail records a failure and ends the soak.
func (s *soak) fail(f soakFailure) {
	s.mu.Lock()
	s.rep.Failures = append(s.rep.Failures, f)
	s.mu.Unlock()
	s.progress("FAILURE (%s%s): %s", f.Kind, map[bool]string{true: ", " + f.Client}[f.Client != ""], strings.SplitN(f.Message, "\n", 2)[0])
	s.end()
}

func (s *soak) end() { s.endOnce.Do(func() { close(s.ended) }) }

func (s *soak) isEnded() bool {
	select {
	case <-s.ended:
		return true
	default:
		return false
	}
}

func (s *soak) progress(format string, a ...any) {
	if s.o.Progress != nil {
		s.o.Progress(format, a...)
	}
}

// Run runs the soak as o says and reports what happened. An error is
// one that kept it from running; what went wrong while it ran is in the
// report's failures.
func Run(o Options) (Report, error) {
	if err := o.check(); err != nil {
		return Report{}, err
	}
	if o.Seed == 0 {
		o.Seed = uint64(time.Now().UnixNano())
	}
	s := &soak{o: o, ended: make(chan struct{}), killedDP: map[int]bool{}}
	s.rep = Report{Machine: bench.ThisMachine(), Seed: o.Seed,
		DurationSeconds: o.Duration.Seconds(), Daemon: append([]string{"uvm", "serve"}, o.DaemonArgs...),
		Ops: map[string]uint64{}, Runs: map[string]*soakRunCount{}, Kills: map[string]*soakKills{}, KillsSkipped: map[string]int{},
		Failures: []soakFailure{}}
	sockDir, err := s.prepareDirs()
	if err != nil {
		return s.rep, err
	}
	defer os.RemoveAll(sockDir)
	cClient, progs, err := s.prepareClients()
	if err != nil {
		return s.rep, err
	}
	defer s.cleanup()
	if err := s.startDaemon(); err != nil {
		return s.rep, err
	}
	s.start = time.Now()
	seq := 0
	for _, kind := range []string{"go", "c"} {
		for i := 0; i < o.Clients[kind]; i++ {
			if err := s.startClient(kind, fmt.Sprintf("%s-%d", kind, i), cClient, clientSeed(o.Seed, seq)); err != nil {
				return s.rep, err
			}
			seq++
		}
	}
	var runWG sync.WaitGroup
	stopRuns := make(chan struct{})
	for i := 0; len(progs) > 0 && i < o.Clients["run"]; i++ {
		r := &soakRunner{s: s, name: fmt.Sprintf("run-%d", i), progs: progs, first: i, rep: &soakClientReport{Name: fmt.Sprintf("run-%d", i), Kind: "run"}}
		s.mu.Lock()
		s.runners = append(s.runners, r)
		s.rep.Clients = append(s.rep.Clients, r.rep)
		s.mu.Unlock()
		runWG.Add(1)
		go func() { defer runWG.Done(); r.loop(stopRuns) }()
	}
	stopKills := make(chan struct{})
	killerDone := make(chan struct{})
	go func() { defer close(killerDone); s.killer(stopKills) }()
	s.await()
	// The kill in progress is seen through; then the clients stop after
	// their operation in progress and check everything once more.
	close(stopKills)
	<-killerDone
	close(stopRuns)
	s.stopClients()
	runWG.Wait()
	s.finalChecks()
	s.rep.ElapsedSeconds = time.Since(s.start).Seconds()
	s.summarize()
	if s.rep.OK && o.LogDir == "" {
		os.RemoveAll(s.dir)
	} else {
		s.rep.LogDir = s.dir
	}
	return s.rep, nil
}

// prepareDirs makes the directory of the logs and inputs and that of the
// daemon's socket (returned: the caller removes it), and the clients'
// environment, which points them at the daemon.
func (s *soak) prepareDirs() (string, error) {
	var err error
	if s.o.LogDir != "" {
		if err := os.MkdirAll(s.o.LogDir, 0o755); err != nil {
			return "", fmt.Errorf("--log-dir: %w", err)
		}
		s.dir = s.o.LogDir
	} else if s.dir, err = os.MkdirTemp("", "uvm-soak-"); err != nil {
		return "", err
	}
	sockDir, err := os.MkdirTemp("", "uvm-soak-sock-") // 0700, and short: a socket path has at most 107 bytes
	if err != nil {
		return "", err
	}
	s.sock = filepath.Join(sockDir, "uvm.sock")
	for _, kv := range os.Environ() {
		if k, _, _ := strings.Cut(kv, "="); k != uvm.EnvSocket && k != uvm.EnvServer && k != "UVM_BIN" {
			s.env = append(s.env, kv)
		}
	}
	s.env = append(s.env, uvm.EnvSocket+"="+s.sock, uvm.EnvServer+"=daemon", "UVM_BIN="+s.o.UVM)
	s.progress("seed %d; logs in %s; the daemon's socket (uvm stat --socket) %s", s.o.Seed, s.dir, s.sock)
	return sockDir, nil
}

// prepareClients builds the C client (its path returned, "" without C
// clients) and the programs the uvm run clients take turns to run.
func (s *soak) prepareClients() (string, []*soakProgram, error) {
	cClient := ""
	if s.o.Clients["c"] > 0 {
		cClient = filepath.Join(s.dir, "soak_client")
		src := filepath.Join(s.dir, "soak_client.c")
		if err := os.WriteFile(src, []byte(soakClientSource), 0o644); err != nil {
			return "", nil, err
		}
		s.progress("building the C client with libuvm's sources")
		build := libuvm.Options{Building: func(dir string) { s.progress("building libuvm.a into %s (once per version)", dir) }}
		if err := libuvm.BuildProgramWithLibuvm(build, cClient, src); err != nil {
			return "", nil, fmt.Errorf("the C client is built at run time: %w", err)
		}
	}
	if s.o.Clients["run"] == 0 {
		return cClient, nil, nil
	}
	s.progress("writing the programs' input and running each plainly once")
	progs, err := s.preparePrograms()
	if err != nil {
		return "", nil, err
	}
	if len(progs) == 0 {
		s.rep.Notes = append(s.rep.Notes, "no client under uvm run: none of the programs is installed")
	}
	return cClient, progs, nil
}

// await waits for the soak's end (its duration, a failure, an
// interruption), watching for hangs and saying how it goes every 10 s.
func (s *soak) await() {
	kills := "no kills"
	if s.o.KillMax > 0 {
		kills = fmt.Sprintf("a kill %v to %v after each recovery", s.o.KillMin, s.o.KillMax)
	}
	s.progress("running for %v: %d Go, %d C and %d uvm run clients; %s", s.o.Duration, s.o.Clients["go"], s.o.Clients["c"], len(s.runners), kills)
	deadline := time.NewTimer(s.o.Duration)
	defer deadline.Stop()
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	lastLine := time.Now()
	for {
		select {
		case <-deadline.C:
			return
		case <-s.ended:
			return
		case sig := <-s.o.Interruptions:
			s.mu.Lock()
			s.rep.Interrupted = sig.String()
			s.mu.Unlock()
			s.end()
			return
		case <-tick.C:
			s.checkHangs()
			if time.Since(lastLine) >= 10*time.Second {
				s.progress("%s", s.statusLine())
				lastLine = time.Now()
			}
		}
	}
}

// clientSeed derives client i's seed from the soak's.
func clientSeed(seed uint64, i int) uint64 {
	return rand.New(rand.NewPCG(seed, uint64(i)+0xc11e)).Uint64() | 1
}

// startDaemon starts `uvm serve` on the soak's socket, its standard
// error (and its guard's, and every server's after it) in daemon.log,
// and waits for it to listen.
func (s *soak) startDaemon() error {
	s.daemonLg = filepath.Join(s.dir, "daemon.log")
	logf, err := os.Create(s.daemonLg)
	if err != nil {
		return err
	}
	defer logf.Close() // the daemon has its own copy
	cmd := exec.Command(s.o.UVM, append([]string{"serve", "--socket", s.sock}, s.o.DaemonArgs...)...)
	cmd.Env = s.env
	cmd.Stdout, cmd.Stderr = logf, logf
	// A process group of its own: a Ctrl-C at the terminal reaches the
	// soak, which stops everything in order.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start the daemon: %w", err)
	}
	s.daemon = cmd
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }() // reaped whenever it dies: a kill, or the end
	deadline := time.Now().Add(time.Minute)
	for !strings.Contains(readFile(s.daemonLg), "listening on") {
		select {
		case <-exited:
			return fmt.Errorf("the daemon exited before it listened: %s", lastBytesOf(readFile(s.daemonLg), 4096))
		default:
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the daemon did not listen within a minute: %s", lastBytesOf(readFile(s.daemonLg), 4096))
		}
		time.Sleep(20 * time.Millisecond)
	}
	return nil
}

func readFile(path string) string {
	b, _ := os.ReadFile(path)
	return string(b)
}

// lastBytesOf is the end of s, at most n bytes of it.
func lastBytesOf(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return "...\n" + s[len(s)-n:]
}

// daemonInfo asks the daemon's server for its Info, waiting at most
// timeout (a server taking over answers once it serves).
func (s *soak) daemonInfo(timeout time.Duration) (uvm.Info, error) {
	return s.monitorInfo(s.sock, timeout)
}

// monitorInfo asks the server listening at path (a daemon's socket, or
// a private server's monitor socket) for its Info, through `uvm stat`, as
// a user would, waiting at most timeout.
func (s *soak) monitorInfo(path string, timeout time.Duration) (uvm.Info, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, s.o.UVM, "stat", "--socket", path, "--count", "1", "--json")
	cmd.Env = s.env
	out, err := cmd.Output()
	if ctx.Err() != nil {
		return uvm.Info{}, fmt.Errorf("no answer from the server at %s within %v", path, timeout)
	}
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			err = fmt.Errorf("%v: %s", err, strings.TrimSpace(string(ee.Stderr)))
		}
		return uvm.Info{}, fmt.Errorf("uvm stat --socket %s: %w", path, err)
	}
	var frame struct {
		Info uvm.Info `json:"info"`
	}
	if err := json.Unmarshal(out, &frame); err != nil {
		return uvm.Info{}, fmt.Errorf("uvm stat --socket %s --json: %w", path, err)
	}
	return frame.Info, nil
}

// checkServerCounters fails the soak if a server counted a lost, stray
// or poisoned page (its counters start again at each takeover, so it is
// asked before each kill of it, and at the end).
func (s *soak) checkServerCounters(where string, in uvm.Info) {
	if in.LostPages+in.StrayPresentPages+in.PoisonedPage == 0 {
		return
	}
	s.fail(soakFailure{Kind: "server", Message: fmt.Sprintf("%s's server (pid %d) counts %d lost pages, %d stray present pages and %d poisoned pages (each must be 0; its log names them)",
		where, in.PID, in.LostPages, in.StrayPresentPages, in.PoisonedPage)})
}

// badLogLine is what no server, guard, device process or client may
// log: a poisoned page, a lost one, a panic, a runtime's fatal error, a
// takeover that failed.
var badLogLine = regexp.MustCompile(`(?i)poison|panic|fatal error|lost page|data is lost|no new server took over|no new one could start`)

// finalChecks asks the daemon for its counters, stops it, and reads
// every log for lines no run may write.
func (s *soak) finalChecks() {
	if s.quit.Load() {
		// A hang's report ended the daemon's server; what a new one
		// would answer says nothing of the soak.
		if in, err := s.daemonInfo(5 * time.Second); err == nil {
			s.stopDaemon(in)
		}
	} else if in, err := s.daemonInfo(30 * time.Second); err != nil {
		s.fail(soakFailure{Kind: "server", Message: fmt.Sprintf("the daemon does not answer at the end: %v; its log ends: %s", err, lastBytesOf(readFile(s.daemonLg), 4096))})
	} else {
		s.checkServerCounters("the daemon", in)
		s.stopDaemon(in)
	}
	logs, _ := filepath.Glob(filepath.Join(s.dir, "*.log"))
	for _, path := range logs {
		var bad []string
		for _, line := range strings.Split(readFile(path), "\n") {
			if badLogLine.MatchString(line) {
				bad = append(bad, line)
			}
		}
		if len(bad) > 0 {
			if len(bad) > 20 {
				bad = append(bad[:20], fmt.Sprintf("... and %d more", len(bad)-20))
			}
			s.fail(soakFailure{Kind: "server", Client: strings.TrimSuffix(filepath.Base(path), ".log"),
				Message: fmt.Sprintf("%s has lines no run may write:\n%s", filepath.Base(path), strings.Join(bad, "\n"))})
		}
	}
}

// stopDaemon ends the daemon serving now with SIGTERM, and waits for it
// and its guard to exit.
func (s *soak) stopDaemon(in uvm.Info) {
	syscall.Kill(in.PID, syscall.SIGTERM)
	deadline := time.Now().Add(30 * time.Second)
	for alive(in.PID) || (in.Restart.GuardPID != 0 && alive(in.Restart.GuardPID)) {
		if time.Now().After(deadline) {
			s.fail(soakFailure{Kind: "hang", Message: fmt.Sprintf("the daemon (pid %d) and its guard (pid %d) did not exit within 30s of SIGTERM:\n%s%s",
				in.PID, in.Restart.GuardPID, processStates(in.PID), processStates(in.Restart.GuardPID))})
			syscall.Kill(in.PID, syscall.SIGKILL)
			syscall.Kill(in.Restart.GuardPID, syscall.SIGKILL)
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// cleanup kills whatever is left after an error or a hang.
func (s *soak) cleanup() {
	s.mu.Lock()
	procs := slices.Clone(s.procs)
	runners := slices.Clone(s.runners)
	s.mu.Unlock()
	for _, p := range procs {
		select {
		case <-p.exited:
		default:
			p.cmd.Process.Kill()
		}
	}
	for _, r := range runners {
		r.mu.Lock()
		if r.active != nil {
			syscall.Kill(r.active.pid, syscall.SIGTERM)
		}
		r.mu.Unlock()
	}
	if s.daemon == nil {
		return
	}
	if in, err := s.daemonInfo(5 * time.Second); err == nil && alive(in.PID) {
		s.stopDaemon(in)
	} else if alive(s.daemon.Process.Pid) {
		s.daemon.Process.Kill()
	}
}

// statusLine is the progress line: time, operations, runs, bytes
// checked, kills.
func (s *soak) statusLine() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	ops := map[string]uint64{}
	var checked uint64
	runs := 0
	for _, c := range s.rep.Clients {
		ops[c.Kind] += c.Ops
		checked += c.BytesChecked
		runs += int(c.Runs)
	}
	var kills []string
	for _, k := range []string{"server", "device", "guard"} {
		if n := s.rep.Kills[k]; n != nil {
			kills = append(kills, fmt.Sprintf("%s %d", k, n.Kills))
		}
	}
	if len(kills) == 0 {
		kills = []string{"none yet"}
	}
	return fmt.Sprintf("%v of %v: operations go %d, c %d; %d runs under uvm run; %s checked; kills: %s",
		time.Since(s.start).Round(time.Second), s.o.Duration, ops["go"], ops["c"], runs, uvm.FormatSize(int64(checked)), strings.Join(kills, ", "))
}

// summarize adds up the clients' counts and the kills' recoveries.
func (s *soak) summarize() {
	s.mu.Lock()
	defer s.mu.Unlock()
	r := &s.rep
	for _, c := range r.Clients {
		for k, n := range c.OpsByKind {
			r.Ops[k] += n
		}
		r.OpsTotal += c.Ops
		r.BytesChecked += c.BytesChecked
		r.LaunchesLost += c.LaunchesLost
		r.RunOutputBytes += c.RunOutputBytes
	}
	for _, k := range r.Kills {
		if len(k.recoveries) > 0 {
			sorted := slices.Sorted(slices.Values(k.recoveries))
			k.RecoveryP50MS, k.RecoveryMaxMS = sorted[len(sorted)/2], sorted[len(sorted)-1]
		}
	}
	r.OK = len(r.Failures) == 0 && r.Interrupted == ""
}

// Print writes the report.
func (r *Report) Print(w io.Writer) {
	fmt.Fprintf(w, "soak of %.0f s (asked %.0f s), seed %d, on %d CPUs, Linux %s\n", r.ElapsedSeconds, r.DurationSeconds, r.Seed, r.Machine.CPUs, r.Machine.Kernel)
	fmt.Fprintf(w, "daemon: %s\n\n", strings.Join(r.Daemon, " "))
	fmt.Fprintf(w, "clients\n")
	for _, c := range r.Clients {
		switch c.Kind {
		case "run":
			fmt.Fprintf(w, "  %-8s under uvm run  %6d runs, %s of output compared, %d server restarts\n", c.Name, c.Runs, uvm.FormatSize(int64(c.RunOutputBytes)), c.RunRestarts)
		default:
			fmt.Fprintf(w, "  %-8s %-12s %8d operations, %s checked, %d launches lost to kills, finished %v\n", c.Name, map[string]string{"go": "Go", "c": "C"}[c.Kind], c.Ops, uvm.FormatSize(int64(c.BytesChecked)), c.LaunchesLost, c.Finished)
		}
	}
	fmt.Fprintf(w, "\noperations (Go and C clients): %d\n", r.OpsTotal)
	kinds := make([]string, 0, len(r.Ops))
	for k := range r.Ops {
		kinds = append(kinds, k)
	}
	sort.Strings(kinds)
	for _, k := range kinds {
		fmt.Fprintf(w, "  %-16s %10d\n", k, r.Ops[k])
	}
	fmt.Fprintf(w, "bytes checked against shadows: %s; program output compared: %s\n", uvm.FormatSize(int64(r.BytesChecked)), uvm.FormatSize(int64(r.RunOutputBytes)))
	if len(r.Runs) > 0 {
		fmt.Fprintf(w, "\nprograms under uvm run\n")
		names := make([]string, 0, len(r.Runs))
		for k := range r.Runs {
			names = append(names, k)
		}
		sort.Strings(names)
		for _, n := range names {
			c := r.Runs[n]
			fmt.Fprintf(w, "  %-10s %5d runs, %5d right, %4d server restarts, %.1f s each\n", n, c.Runs, c.OK, c.Restarts, c.Seconds/float64(max(1, c.Runs)))
		}
	}
	fmt.Fprintf(w, "\nkills (SIGKILL)         kills  survived  daemon's  uvm run's  recovery p50   max\n")
	for _, k := range []string{"server", "device", "guard"} {
		if c := r.Kills[k]; c != nil {
			fmt.Fprintf(w, "  %-20s %6d  %8d  %8d  %9d  %8.0f ms  %4.0f ms\n", k, c.Kills, c.Survived, c.Daemon, c.Run, c.RecoveryP50MS, c.RecoveryMaxMS)
		}
	}
	for k, n := range r.KillsSkipped {
		fmt.Fprintf(w, "  %s skipped %d times: nothing of the kind to kill\n", k, n)
	}
	for _, n := range r.Notes {
		fmt.Fprintf(w, "note: %s\n", n)
	}
	if len(r.Failures) == 0 && r.Interrupted == "" {
		fmt.Fprintf(w, "\nno wrong byte, no hang, no crash; every kill survived\n")
		return
	}
	if r.Interrupted != "" {
		fmt.Fprintf(w, "\ninterrupted by %s\n", r.Interrupted)
	}
	for _, f := range r.Failures {
		fmt.Fprintf(w, "\nFAILURE (%s) %s: %s\n", f.Kind, f.Client, f.Message)
		if f.Wrong != nil {
			if f.Wrong.HistoryOmitted > 0 {
				fmt.Fprintf(w, "  (%d earlier operations on the allocation not shown)\n", f.Wrong.HistoryOmitted)
			}
			fmt.Fprintf(w, "  the operations that touched its block (* the byte itself), at seconds into the soak:\n")
			for _, h := range f.Wrong.History {
				fmt.Fprintf(w, "    %s\n", h)
			}
			fmt.Fprintf(w, "  the kills from %.3fs to %.3fs, when it was found:\n", f.Wrong.SinceSeconds, f.Wrong.AtSeconds)
			for _, k := range f.Kills {
				fmt.Fprintf(w, "    %s\n", k)
			}
		}
	}
	fmt.Fprintf(w, "\nevery kill, at seconds into the soak:\n")
	for _, k := range r.KillLog {
		fmt.Fprintf(w, "  %s\n", k)
	}
	if r.LogDir != "" {
		fmt.Fprintf(w, "\nlogs: %s\n", r.LogDir)
	}
}

// ---- programs under uvm run ----
