package soak

import (
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"hash"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/softuvm/softuvm/internal/bench/workloads"
	"github.com/softuvm/softuvm/internal/config"
)

// The clients of `uvm bench soak` that run unmodified programs under uvm
// run in turn, each output compared with a plain run's.

// soakInputs are the files the programs read.
type soakInputs struct {
	lines, gz string
}

// soakProgram is one program a client under uvm run runs.
type soakProgram struct {
	name  string
	argv  []string
	flags []string // uvm run's: its threshold and budget
	env   []string
	// want is the SHA-256 of the output a plain run printed; "" for
	// memtester, which checks its own patterns.
	want string
}

// preparePrograms writes the input (4 MB of text from the seed), runs
// each program plainly once for the output to compare with, and returns
// those installed.
func (s *soak) preparePrograms() ([]*soakProgram, error) {
	s.inputs = soakInputs{lines: filepath.Join(s.dir, "lines.txt"), gz: filepath.Join(s.dir, "lines.txt.gz")}
	if err := writeSoakLines(s.inputs.lines, 4e6, s.o.Seed); err != nil {
		return nil, err
	}
	var progs []*soakProgram
	for _, name := range s.o.Programs {
		tool := name
		if _, err := exec.LookPath(tool); err != nil {
			s.rep.Notes = append(s.rep.Notes, fmt.Sprintf("%s is not installed: not run", tool))
			continue
		}
		switch name {
		case "memtester":
			// It checks its own patterns; 1 MB under a budget of half,
			// every pass over it a refault of every page: 27 s on this
			// VM, loaded. 2 MB took 56 s, and over the two minutes of
			// --hang-after with a few kills on a loaded machine.
			progs = append(progs, &soakProgram{name: name, argv: []string{"memtester", "1M", "1"}, flags: []string{"--host-budget", "512KiB"}})
		case "sha256sum":
			// Its 32 KiB read buffer managed, each page faulting alone
			// under a 16 KiB budget (docs/benchmarks.md).
			progs = append(progs, &soakProgram{name: name, argv: []string{"sha256sum", s.inputs.lines}, flags: []string{"--min-size", "4KiB", "--prefetch", "none", "--host-budget", "16KiB"}})
		case "sort":
			progs = append(progs, &soakProgram{name: name, argv: []string{"sort", s.inputs.lines}, flags: []string{"--host-budget", "3MiB"}, env: []string{"LC_ALL=C"}})
		case "gzip":
			// Its buffers are static arrays: managed from 512 KiB.
			flags := []string{"--min-size", "512KiB", "--host-budget", "640KiB"}
			progs = append(progs, &soakProgram{name: "gzip", argv: []string{"gzip", "-c", "-n", s.inputs.lines}, flags: flags},
				&soakProgram{name: "gunzip", argv: []string{"gzip", "-d", "-c", s.inputs.gz}, flags: flags})
		}
	}
	for _, p := range progs {
		if p.name == "memtester" {
			continue
		}
		var out io.Writer
		h := sha256.New()
		out = h
		var gz *os.File
		if p.name == "gzip" {
			var err error
			if gz, err = os.Create(s.inputs.gz); err != nil {
				return nil, err
			}
			out = io.MultiWriter(h, gz)
		}
		if p.name == "gunzip" {
			// The round trip gives the input back.
			b, err := os.ReadFile(s.inputs.lines)
			if err != nil {
				return nil, err
			}
			sum := sha256.Sum256(b)
			p.want = hex.EncodeToString(sum[:])
			continue
		}
		cmd := exec.Command(p.argv[0], p.argv[1:]...)
		cmd.Env = append(os.Environ(), p.env...)
		var errOut strings.Builder
		cmd.Stdout, cmd.Stderr = out, &errOut
		err := cmd.Run()
		if gz != nil {
			gz.Close()
		}
		if err != nil {
			return nil, fmt.Errorf("%s, plainly: %v: %s", strings.Join(p.argv, " "), err, errOut.String())
		}
		p.want = hex.EncodeToString(h.Sum(nil))
	}
	return progs, nil
}

// programCPU is the CPU time (clock ticks) of what uvm run pid runs: its
// descendants but its servers and guards, whose time is not the
// program's progress.
func programCPU(pid int) uint64 {
	var ticks uint64
	for _, p := range descendants(pid) {
		st := readFile(fmt.Sprintf("/proc/%d/stat", p))
		i := strings.LastIndexByte(st, ')')
		if i < 0 || strings.Contains(st[:i], "(softuvm-") {
			continue
		}
		f := strings.Fields(st[i+1:]) // from field 3, the state
		if len(f) > 12 {
			u, _ := strconv.ParseUint(f[11], 10, 64) // utime, field 14
			k, _ := strconv.ParseUint(f[12], 10, 64) // stime, field 15
			ticks += u + k
		}
	}
	return ticks
}

// writeSoakLines writes about size bytes of lines, a hexadecimal key and
// a repeated word each: what sort sorts and gzip compresses.
func writeSoakLines(path string, size int, seed uint64) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	w := bufio.NewWriterSize(f, 1<<20)
	rng := rand.New(rand.NewPCG(seed, 0x11e5))
	for n := 0; n < size; {
		word := "abcdefgh"[:1+rng.IntN(8)]
		line := fmt.Sprintf("%016x %s\n", rng.Uint64(), strings.Repeat(word, 1+rng.IntN(8)))
		w.WriteString(line)
		n += len(line)
	}
	if err := w.Flush(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// soakRunner is a client that runs the programs under uvm run in turn
// until the soak ends.
type soakRunner struct {
	s     *soak
	name  string
	progs []*soakProgram
	first int
	rep   *soakClientReport // guarded by soak.mu
	mu    sync.Mutex
	// active is the run in progress, nil between runs. Guarded by mu.
	active *soakActiveRun
}

// soakActiveRun is a uvm run in progress: the killer kills its server
// and its guard.
type soakActiveRun struct {
	pid     int // uvm run's
	program string
	stderr  *syncBuffer
	done    chan struct{} // closed when it ended; ok is set before
	ok      bool
}

// syncBuffer is a buffer a child writes while the soak reads it.
type syncBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// soakOutput hashes a program's output and keeps its first 64 KiB.
type soakOutput struct {
	h    hash.Hash
	head []byte
	n    uint64
}

func (o *soakOutput) Write(p []byte) (int, error) {
	o.h.Write(p)
	o.n += uint64(len(p))
	if room := 64<<10 - len(o.head); room > 0 {
		o.head = append(o.head, p[:min(room, len(p))]...)
	}
	return len(p), nil
}

func (r *soakRunner) loop(stop <-chan struct{}) {
	logf, err := os.Create(filepath.Join(r.s.dir, r.name+".log"))
	if err != nil {
		r.s.fail(soakFailure{Kind: "error", Client: r.name, Message: err.Error()})
		return
	}
	defer logf.Close()
	stats := filepath.Join(r.s.dir, r.name+"-stats.json")
	for i := r.first; ; i++ {
		select {
		case <-stop:
			return
		case <-r.s.ended:
			return
		default:
		}
		if !r.runOnce(r.progs[i%len(r.progs)], logf, stats) {
			return
		}
	}
}

// runOnce runs one program under uvm run and checks it; false if the
// soak must end.
func (r *soakRunner) runOnce(p *soakProgram, logf *os.File, stats string) bool {
	s := r.s
	args := append([]string{"run", "--quiet", "--stats-json", stats}, s.o.RunArgs...)
	args = append(append(args, p.flags...), "--")
	cmd := exec.Command(s.o.UVM, append(args, p.argv...)...)
	cmd.Env = append(slices.Clone(s.env), p.env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	out := &soakOutput{h: sha256.New()}
	errOut := &syncBuffer{}
	cmd.Stdout, cmd.Stderr = out, errOut
	// Its server writes to our buffer through a pipe that the guard and
	// the servers after it inherit: once uvm run exited, whatever still
	// holds it open does not hold the run up.
	cmd.WaitDelay = 5 * time.Second
	start := time.Now()
	if err := cmd.Start(); err != nil {
		s.fail(soakFailure{Kind: "run", Client: r.name, Message: fmt.Sprintf("start %s: %v", p.name, err)})
		return false
	}
	run := &soakActiveRun{pid: cmd.Process.Pid, program: p.name, stderr: errOut, done: make(chan struct{})}
	r.mu.Lock()
	r.active = run
	r.mu.Unlock()
	ended, err := r.await(cmd, p, logf)
	if ended != "" {
		r.finish(run, logf, p, errOut, start, ended)
		return false
	}
	elapsed := time.Since(start)
	var problems []string
	if err != nil {
		problems = append(problems, "uvm run: "+err.Error())
	}
	got := hex.EncodeToString(out.h.Sum(nil))
	if p.want != "" && got != p.want {
		problems = append(problems, fmt.Sprintf("its output (%d bytes, SHA-256 %s) is not the plain run's (SHA-256 %s)", out.n, got, p.want))
	}
	if p.name == "memtester" && (strings.Contains(string(out.head), "FAILURE") || strings.Contains(errOut.String(), "FAILURE")) {
		problems = append(problems, "memtester reported a FAILURE")
	}
	var restarts uint64
	if st, err := workloads.ReadStats(stats); err == nil {
		restarts = st.ServerRestarts
	}
	s.mu.Lock()
	c := s.rep.Runs[p.name]
	if c == nil {
		c = &soakRunCount{}
		s.rep.Runs[p.name] = c
	}
	c.Runs++
	c.Seconds += elapsed.Seconds()
	c.Restarts += restarts
	r.rep.Runs++
	r.rep.RunRestarts += restarts
	if len(problems) == 0 {
		c.OK++
		if p.want != "" {
			r.rep.RunOutputBytes += out.n
		}
	}
	s.mu.Unlock()
	run.ok = len(problems) == 0
	r.finish(run, logf, p, errOut, start, fmt.Sprintf("%d restarts, %s", restarts, map[bool]string{true: "right", false: strings.Join(problems, "; ")}[run.ok]))
	if !run.ok {
		s.fail(soakFailure{Kind: "run", Client: r.name, Message: fmt.Sprintf("%s under uvm run (%s): %s; what uvm run and its servers wrote:\n%s",
			strings.Join(p.argv, " "), strings.Join(p.flags, " "), strings.Join(problems, "; "), lastBytesOf(errOut.String()+string(out.head), 8192))})
		return false
	}
	return true
}

// await waits for the end of uvm run cmd, running p, and returns why it
// was ended ("hung" or "stopped: the soak ended"), or "" and its error. A hang
// is a program that makes no progress: its CPU time stands still for
// --hang-after. A program that only runs long (each kill of its server a
// pause of seconds on a loaded machine) is none.
func (r *soakRunner) await(cmd *exec.Cmd, p *soakProgram, logf *os.File) (string, error) {
	s := r.s
	waited := make(chan error, 1)
	go func() { waited <- cmd.Wait() }()
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	cpu, moved := programCPU(cmd.Process.Pid), time.Now()
	for {
		select {
		case err := <-waited:
			return "", err
		case <-tick.C:
			if now := programCPU(cmd.Process.Pid); now != cpu {
				cpu, moved = now, time.Now()
				continue
			}
			if time.Since(moved) < s.o.HangAfter {
				continue
			}
			s.hang(r.name, cmd.Process.Pid, false, fmt.Sprintf("%s under uvm run (pid %d) made no progress (no CPU time) for %v", strings.Join(p.argv, " "), cmd.Process.Pid, s.o.HangAfter), "",
				config.PrivateServerSocketPath(cmd.Process.Pid), logf.Name())
			syscall.Kill(cmd.Process.Pid, syscall.SIGKILL)
			<-waited
			return "hung", nil
		case <-s.ended:
			syscall.Kill(cmd.Process.Pid, syscall.SIGTERM)
			<-waited
			return "stopped: the soak ended", nil
		}
	}
}

// finish logs a run and tells the killer it ended.
func (r *soakRunner) finish(run *soakActiveRun, logf *os.File, p *soakProgram, errOut *syncBuffer, start time.Time, result string) {
	fmt.Fprintf(logf, "=== %s %s (%s %s): %.1fs, %s\n%s", time.Now().Format(time.TimeOnly), strings.Join(p.argv, " "), "uvm run", strings.Join(p.flags, " "), time.Since(start).Seconds(), result, errOut.String())
	r.mu.Lock()
	r.active = nil
	r.mu.Unlock()
	close(run.done)
}

// ---- the kills ----
