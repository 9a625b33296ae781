package grade

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"strings"
	"time"

	"github.com/softuvm/softuvm/lab"
	"github.com/softuvm/softuvm/lab/course"
	"github.com/softuvm/softuvm/policy"
	"github.com/softuvm/softuvm/uvm"
)

// The live programs. Each runs on a private server of its own, once with
// the baseline and once with the student's policy, and checks what it
// wrote. They are small (a second or two each on a 2-CPU machine) and
// sized so that the policy under test decides something on every pass:
// a host budget below the data for prefetch and eviction (the host's
// pages over it are evicted to the device, and fault back), the host
// and a device writing the same pages in turn for thrashing.
type workload struct {
	// what says what the program does, for the report.
	what string
	// metric says what decides (lower is better).
	metric string
	// config sets the private server up, with spec the policy under
	// test.
	config func(spec string) (uvm.ServerConfig, error)
	// run runs the program and reports whether its data read back
	// right.
	run func(s *uvm.Session) (checked bool, err error)
}

const (
	// The prefetch program's data and host budget.
	prefetchBytes  = 48 << 20
	prefetchBudget = 16 << 20
	// The eviction program's: a hot set touched at random among a
	// stream through cold data.
	evictionHot    = 10 << 20
	evictionCold   = 48 << 20
	evictionBudget = 16 << 20
	// The thrashing program's: pages the host and device 0 write in
	// turn, for pingpongRounds rounds.
	pingpongPages  = 4
	pingpongRounds = 200
	// pingpongSettings are the thrashing settings of the live run: on a
	// machine of few CPUs the host's and the device's faults on a page
	// are further apart than NVIDIA's 500 us lapse (the fault server, the
	// device and the host share the CPUs), so that the default settings
	// would find nothing thrashing.
	pingpongSettings = "lapse=20ms,nap=200us,pin=1s,epoch=10s"
	// The device of the live runs (prefetch and eviction: the host's
	// evicted pages go there).
	liveArena = 256 << 20
)

func workloadOf(a course.Assignment) workload {
	switch a.Kind {
	case policy.KindPrefetch:
		return workload{
			what: fmt.Sprintf("writes %s in order, then reads it back twice, in order, under a %s host budget (the rest is evicted to device 0 and faults back)",
				uvm.FormatSize(prefetchBytes), uvm.FormatSize(prefetchBudget)),
			metric: "modeled time (faults and pages moved, priced at the lab's default costs)",
			config: func(spec string) (uvm.ServerConfig, error) {
				cfg := hostBudgetConfig(prefetchBudget)
				ps, err := policy.ParsePrefetchSpec(spec)
				cfg.Prefetch = ps
				return cfg, err
			},
			run: sweeps,
		}
	case policy.KindEviction:
		return workload{
			what: fmt.Sprintf("touches a %s hot set at random while streaming through %s of cold data, three times, under a %s host budget",
				uvm.FormatSize(evictionHot), uvm.FormatSize(evictionCold), uvm.FormatSize(evictionBudget)),
			metric: "modeled time (faults and pages moved, priced at the lab's default costs)",
			config: func(spec string) (uvm.ServerConfig, error) {
				cfg := hostBudgetConfig(evictionBudget)
				cfg.Eviction = spec
				// The resident core hides the pages it protects from
				// the eviction policy, and keeps this program's hot set
				// whatever the policy: graded with it, every policy
				// ties lru. The assignment grades the policy alone, as
				// the replays of the shipped traces do (recorded
				// before the core, they replay without it).
				cfg.Thrashing.Refault = false
				return cfg, policy.ValidateEviction(spec)
			},
			run: hotAndCold,
		}
	}
	return workload{
		what: fmt.Sprintf("the host and a kernel on device 0 write the same %d pages in turn, %d rounds (ping-pong)",
			pingpongPages, pingpongRounds),
		metric: "modeled time (faults, pages moved and naps, priced at the lab's default costs)",
		config: func(spec string) (uvm.ServerConfig, error) {
			cfg := uvm.DefaultServerConfig()
			cfg.Devices[0].Capacity = liveArena
			cfg.DeviceWorkers = 1
			if spec != "off" {
				spec += "," + pingpongSettings
			}
			ts, err := policy.ParseThrashingSpec(spec)
			cfg.Thrashing = ts
			return cfg, err
		},
		run: pingpong,
	}
}

// hostBudgetConfig is one device, and a host budget.
func hostBudgetConfig(budget int64) uvm.ServerConfig {
	cfg := uvm.DefaultServerConfig()
	cfg.Devices[0].Capacity = liveArena
	cfg.HostBudget = budget
	return cfg
}

// errEnvironment marks a live run that could not start for reasons of
// the machine (no userfaultfd, no root), not of the policy.
var errEnvironment = errors.New("environment")

// runLive runs the assignment's program with the baseline, then with the
// student's policy, each in a child process of this binary (liveChild):
// a policy that panics in the server kills it, and the program's next
// touch of memory the server held is a SIGBUS, which must not take the
// report down with it.
func runLive(a course.Assignment, name string) *Live {
	w := workloadOf(a)
	l := &Live{Workload: w.what, Metric: w.metric}
	base, err := liveChild("baseline", a.Baseline)
	if err != nil {
		if errors.Is(err, errEnvironment) {
			l.Skipped = strings.TrimPrefix(err.Error(), errEnvironment.Error()+": ")
		} else {
			l.Error = fmt.Sprintf("the baseline's run: %v", err)
		}
		return l
	}
	l.Runs = append(l.Runs, base)
	student, err := liveChild("student", name)
	if err != nil {
		l.Error = fmt.Sprintf("your policy's run: %v", err)
		return l
	}
	l.Runs = append(l.Runs, student)
	if !student.Checked {
		l.Error = "the program read back wrong data with your policy"
		return l
	}
	s, b := float64(student.Modeled), float64(base.Modeled)
	if b > 0 {
		l.Ratio = s / b
	}
	l.Outcome = outcomeWithin(s, b, liveTie)
	return l
}

// The flags of a live run's child: its role ("baseline" or "student"),
// the policy's name for the report, and the file the server logs to.
const (
	liveRunFlag  = "live-run"
	liveNameFlag = "live-name"
	liveLogFlag  = "live-log"
	// liveTimeout bounds a live run: the programs take a second or two,
	// and a policy that loops must not hang the grader.
	liveTimeout = 3 * time.Minute
	// exitEnvironment is a child's status when no server could start.
	exitEnvironment = 3
)

// liveChild runs one live run in a child process of this binary, which
// prints its LiveRun as JSON (liveMain).
func liveChild(role, name string) (LiveRun, error) {
	var run LiveRun
	exe, err := os.Executable()
	if err != nil {
		return run, err
	}
	log, err := os.CreateTemp("", "uvm-grade-server-*.log")
	if err != nil {
		return run, err
	}
	log.Close()
	defer os.Remove(log.Name())
	ctx, cancel := context.WithTimeout(context.Background(), liveTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, exe, "--"+liveRunFlag, role, "--"+liveNameFlag, name, "--"+liveLogFlag, log.Name())
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	// A process the child leaves behind (a server's guard) must not keep
	// the pipes, and this wait, open.
	cmd.WaitDelay = 10 * time.Second
	err = cmd.Run()
	if err == nil {
		if err := json.Unmarshal(stdout.Bytes(), &run); err != nil {
			return run, fmt.Errorf("the live run's report: %w", err)
		}
		return run, nil
	}
	var exit *exec.ExitError
	if errors.As(err, &exit) && exit.ExitCode() == exitEnvironment {
		return run, fmt.Errorf("%w: %s", errEnvironment, strings.TrimPrefix(strings.TrimSpace(stderr.String()), errEnvironment.Error()+": "))
	}
	var b strings.Builder
	switch {
	case ctx.Err() != nil:
		fmt.Fprintf(&b, "it did not finish in %v", liveTimeout)
	case exit != nil:
		fmt.Fprintf(&b, "the program failed (%v)", exit.ProcessState)
	default:
		fmt.Fprintf(&b, "%v", err)
	}
	if text := firstParagraph(stderr.String(), 1500); text != "" {
		fmt.Fprintf(&b, ":\n%s", text)
	}
	if text := lastPanic(readFile(log.Name()), 30); text != "" {
		fmt.Fprintf(&b, "\nthe server's log:\n%s", text)
	}
	return run, errors.New(b.String())
}

// liveMain is a live run's child: it runs the program with the policy
// of role and prints what it did as JSON. It returns the exit status.
func liveMain(a course.Assignment, role, name, logPath string, stdout, stderr io.Writer) int {
	spec := a.Baseline
	if role == "student" {
		spec = a.StudentSpec()
	}
	run, err := liveOnce(workloadOf(a), role, spec, name, "", logPath)
	if err != nil {
		fmt.Fprintln(stderr, err)
		if errors.Is(err, errEnvironment) {
			return exitEnvironment
		}
		return 1
	}
	if err := json.NewEncoder(stdout).Encode(run); err != nil {
		fmt.Fprintln(stderr, err)
		return 1
	}
	return 0
}

func readFile(path string) string {
	b, _ := os.ReadFile(path)
	return strings.TrimSpace(string(b))
}

// firstParagraph is s up to its first empty line (a Go program's crash
// message, before the goroutines' stacks), at most about n bytes.
func firstParagraph(s string, n int) string {
	s = strings.TrimSpace(s)
	if i := strings.Index(s, "\n\n"); i >= 0 {
		s = s[:i]
	}
	if len(s) > n {
		s = s[:n] + "..."
	}
	return s
}

// lastPanic is the last panic of a server's log with the first lines of
// its stack (lines in all), or else the end of the log.
func lastPanic(log string, lines int) string {
	if i := strings.LastIndex(log, "panic: "); i >= 0 {
		if j := strings.LastIndexByte(log[:i], '\n'); j >= 0 {
			i = j + 1
		}
		ls := strings.Split(log[i:], "\n")
		if len(ls) > lines {
			ls = append(ls[:lines], "...")
		}
		return strings.Join(ls, "\n")
	}
	return tail(log, 2000)
}

// tail keeps about n bytes of the end of s, in whole lines.
func tail(s string, n int) string {
	if len(s) <= n {
		return s
	}
	s = s[len(s)-n:]
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		s = s[i+1:]
	}
	return "...\n" + s
}

// liveOnce runs the program on a private server of its own, with the
// policy spec names (called name in the report), recording a trace to
// record if it is not "", the server logging to logPath (or to a
// temporary file, if "").
func liveOnce(w workload, role, spec, name, record, logPath string) (run LiveRun, err error) {
	run = LiveRun{Role: role, Policy: name}
	cfg, err := w.config(spec)
	if err != nil {
		return run, err
	}
	if record != "" {
		cfg.Trace = record
		cfg.TraceCommand = []string{"uvm lab grade (live program): " + w.what}
	}
	var log *os.File
	if logPath != "" {
		log, err = os.OpenFile(logPath, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	} else {
		log, err = os.CreateTemp("", "uvm-grade-server-*.log")
		if err == nil {
			defer os.Remove(log.Name())
		}
	}
	if err != nil {
		return run, err
	}
	defer log.Close()
	s, err := uvm.Connect(uvm.Config{Server: "private", Private: cfg, Log: log})
	if err != nil {
		if role == "baseline" {
			return run, fmt.Errorf("%w: no fault server could start here (%v); the live run needs userfaultfd, which is root-only on many machines", errEnvironment, err)
		}
		return run, withLog(err, log)
	}
	defer func() {
		if cerr := s.Close(); cerr != nil && err == nil {
			err = withLog(cerr, log)
		}
	}()
	start := time.Now()
	checked, err := w.run(s)
	run.Wall = time.Since(start)
	if err != nil {
		return run, withLog(err, log)
	}
	run.Checked = checked
	st, err := s.Stats()
	if err != nil {
		return run, withLog(err, log)
	}
	run.Faults = st.TotalFaults()
	for _, m := range st.Migrations {
		switch {
		case m.From == uvm.CPU:
			run.PagesToDevice += m.Pages
		case m.To == uvm.CPU:
			run.PagesToHost += m.Pages
		}
	}
	for _, e := range st.Evicted {
		run.EvictedPages += e.Pages
	}
	for _, c := range st.Throttles {
		run.Throttles += c.Count
	}
	for _, c := range st.Pins {
		run.Pins += c.Count
	}
	for _, p := range st.RemoteMapped {
		run.RemoteMapped += p.Pages
	}
	c := lab.DefaultCosts
	run.Modeled = time.Duration(run.Faults)*c.Fault + time.Duration(run.PagesToDevice)*c.PageToDevice + time.Duration(run.PagesToHost)*c.PageToHost +
		time.Duration(run.Throttles)*time.Duration(cfg.Thrashing.Nap)
	return run, nil
}

// withLog adds the end of the server's log to an error.
func withLog(err error, log *os.File) error {
	if text := tail(readFile(log.Name()), 2000); text != "" {
		return fmt.Errorf("%w\nthe server's log:\n%s", err, text)
	}
	return err
}

// wordAt is the value the programs write at word i: anything that a page
// left unwritten, or swapped with another, does not hold.
func wordAt(i int) uint64 { return uint64(i)*0x9e3779b97f4a7c15 + 1 }

// sweeps is the prefetch program: it writes the data in order, one word
// in every 512 bytes, then reads it back in order, twice.
func sweeps(s *uvm.Session) (bool, error) {
	a, err := s.MallocManaged(prefetchBytes)
	if err != nil {
		return false, err
	}
	words := uvm.SliceAt[uint64](a.Addr(), prefetchBytes/8)
	const step = 512 / 8
	for i := 0; i < len(words); i += step {
		words[i] = wordAt(i)
	}
	ok := true
	for range 2 {
		for i := 0; i < len(words); i += step {
			if words[i] != wordAt(i) {
				ok = false
			}
		}
	}
	return ok, nil
}

// hotAndCold is the eviction program: three rounds; in each, it streams
// through the cold data, writing a word of every page, and between two
// cold pages touches four hot pages chosen at random (the same sequence
// each run). A policy that keeps the hot set while the stream goes
// through faults less than one that lets the stream push it out.
func hotAndCold(s *uvm.Session) (bool, error) {
	hot, err := s.MallocManaged(evictionHot)
	if err != nil {
		return false, err
	}
	cold, err := s.MallocManaged(evictionCold)
	if err != nil {
		return false, err
	}
	const pageWords = uvm.PageSize / 8
	h := uvm.SliceAt[uint64](hot.Addr(), evictionHot/8)
	c := uvm.SliceAt[uint64](cold.Addr(), evictionCold/8)
	hotPages, coldPages := evictionHot/uvm.PageSize, evictionCold/uvm.PageSize
	counts := make([]uint64, hotPages)
	rng := rand.New(rand.NewPCG(1, 2))
	for round := range 3 {
		for p := range coldPages {
			c[p*pageWords] = wordAt(p) + uint64(round)
			for range 4 {
				q := rng.IntN(hotPages)
				h[q*pageWords]++
				counts[q]++
			}
		}
	}
	ok := true
	for p := range coldPages {
		ok = ok && c[p*pageWords] == wordAt(p)+2
	}
	for q := range hotPages {
		ok = ok && h[q*pageWords] == counts[q]
	}
	return ok, nil
}

// pingpongKernel is the name of the thrashing program's kernel.
const pingpongKernel = "softuvm.lab.course.pingpong"

func init() {
	// params: the pages' address and their count; it adds one to the
	// second word of each page (the host adds to the first).
	uvm.MustRegisterKernel(pingpongKernel, func(tid, n int, p []byte) {
		if tid != 0 {
			return
		}
		addr, pages := binary.LittleEndian.Uint64(p), int(binary.LittleEndian.Uint64(p[8:]))
		words := uvm.SliceAt[uint64](uintptr(addr), pages*uvm.PageSize/8)
		for i := range pages {
			words[i*uvm.PageSize/8+1]++
		}
	})
}

// pingpong is the thrashing program: in each round the host writes the
// pages, then a kernel on device 0 writes them, and the host waits for
// it. Without a thrashing policy every round moves every page there and
// back, two faults each; a policy that pins them in host memory, where
// the device then maps them, moves nothing more.
func pingpong(s *uvm.Session) (bool, error) {
	a, err := s.MallocManaged(pingpongPages * uvm.PageSize)
	if err != nil {
		return false, err
	}
	words := uvm.SliceAt[uint64](a.Addr(), pingpongPages*uvm.PageSize/8)
	params := make([]byte, 16)
	binary.LittleEndian.PutUint64(params, uint64(a.Addr()))
	binary.LittleEndian.PutUint64(params[8:], pingpongPages)
	for range pingpongRounds {
		for i := range pingpongPages {
			words[i*uvm.PageSize/8]++
		}
		if err := s.Launch(0, nil, pingpongKernel, 1, params); err != nil {
			return false, err
		}
		if err := s.DeviceSynchronize(0); err != nil {
			return false, err
		}
	}
	ok := true
	for i := range pingpongPages {
		ok = ok && words[i*uvm.PageSize/8] == pingpongRounds && words[i*uvm.PageSize/8+1] == pingpongRounds
	}
	return ok, nil
}
