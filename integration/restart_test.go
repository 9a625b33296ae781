package integration

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/softuvm/softuvm/internal/config"
	"github.com/softuvm/softuvm/internal/wire"
	"github.com/softuvm/softuvm/uvm"
)

// sweepByte is what the Go sweeper writes at byte i of pass gen.
func sweepByte(gen, i int) byte { return byte(i*31 + gen*7 + i>>12) }

// sweeper sweeps and checks 48 MiB through the daemon at UVM_SOCKET, half
// of it prefetched to device 0 each pass, until its standard input
// closes; it prints "pass N" after each pass whose every byte was right.
func sweeper() int {
	const size = 48 << 20
	a, err := uvm.MallocManaged(size)
	if err != nil {
		fmt.Fprintln(os.Stderr, "sweeper:", err)
		return 1
	}
	b := a.Bytes()
	var mu sync.Mutex
	stop := false
	go func() {
		io.Copy(io.Discard, os.Stdin)
		mu.Lock()
		stop = true
		mu.Unlock()
	}()
	for gen := 1; ; gen++ {
		mu.Lock()
		done := stop
		mu.Unlock()
		if done {
			break
		}
		for i := range b {
			b[i] = sweepByte(gen, i)
		}
		if err := uvm.Prefetch(a.Addr(), size/2, 0); err != nil {
			fmt.Fprintf(os.Stderr, "sweeper: pass %d: prefetch: %v\n", gen, err)
			return 1
		}
		for i := range b {
			if want := sweepByte(gen, i); b[i] != want {
				fmt.Fprintf(os.Stderr, "sweeper: pass %d: byte %#x is %#x, want %#x\n", gen, i, b[i], want)
				return 1
			}
		}
		fmt.Printf("pass %d\n", gen)
	}
	if err := a.Free(); err != nil {
		fmt.Fprintln(os.Stderr, "sweeper: free:", err)
		return 1
	}
	return 0
}

// passer is a program printing "pass N" lines.
type passer struct {
	name   string
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	passes chan int
	stderr *bytes.Buffer
	mu     *sync.Mutex
}

func startPasser(t *testing.T, name string, cmd *exec.Cmd) *passer {
	t.Helper()
	p := &passer{name: name, cmd: cmd, passes: make(chan int, 4096), stderr: &bytes.Buffer{}, mu: &sync.Mutex{}}
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	p.stdin, err = cmd.StdinPipe()
	require.NoError(t, err)
	cmd.Stderr = lockedWriter{p.mu, p.stderr}
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { cmd.Process.Kill() })
	go func() {
		r := bufio.NewReader(stdout)
		for {
			line, err := r.ReadString('\n')
			if err != nil {
				close(p.passes)
				return
			}
			var n int
			if _, err := fmt.Sscanf(line, "pass %d", &n); err == nil {
				p.passes <- n
			}
		}
	}()
	return p
}

type lockedWriter struct {
	mu *sync.Mutex
	w  io.Writer
}

func (l lockedWriter) Write(b []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(b)
}

func (p *passer) errText() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.stderr.String()
}

// pass waits for the next pass: every byte of it was checked.
func (p *passer) pass(t *testing.T) {
	t.Helper()
	select {
	case _, ok := <-p.passes:
		require.True(t, ok, "%s ended: %s", p.name, p.errText())
	case <-time.After(90 * time.Second):
		t.Fatalf("%s: no pass within 90s: %s", p.name, p.errText())
	}
}

// finish ends the program after its pass in progress.
func (p *passer) finish(t *testing.T) {
	t.Helper()
	closeAndWait(t, p.name, p.stdin, p.cmd, 90*time.Second, p.errText)
}

// closeAndWait closes a program's standard input, which tells it to end,
// and wants it to exit successfully within timeout; errText is what it
// wrote to its standard error, shown if it does not.
func closeAndWait(t *testing.T, name string, stdin io.Closer, cmd *exec.Cmd, timeout time.Duration, errText func() string) {
	t.Helper()
	stdin.Close()
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		require.NoError(t, err, "%s: %s", name, errText())
	case <-time.After(timeout):
		t.Fatalf("%s did not finish: %s", name, errText())
	}
}

// daemonInfo reads the daemon's Info through `uvm stat`.
func daemonInfo(t *testing.T, sock string) uvm.Info {
	t.Helper()
	out, errOut, err := uvmCmd(t, nil, "stat", "--socket", sock, "--count", "1", "--json")
	require.NoError(t, err, errOut)
	var frame struct {
		Info uvm.Info `json:"info"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &frame), out)
	return frame.Info
}

// TestDaemonReplaced: `uvm serve --replace`, and SIGUSR2 to the daemon
// that took over, replace the daemon twice under a Go client and a C
// client sweeping and checking 48 MiB each under a 16 MiB host budget
// (the C one with a kernel writing part of it); then the daemon is
// killed with SIGKILL. Both finish with every byte right, and the last
// daemon counts three restarts.
func TestDaemonReplaced(t *testing.T) {
	requireRoot(t)
	dir, err := os.MkdirTemp("", "uvm-replace-")
	require.NoError(t, err)
	defer os.RemoveAll(dir)
	sock := filepath.Join(dir, "uvm.sock")
	daemon := exec.Command(filepath.Join(binDir, "uvm"), "serve", "--socket", sock, "--arena-size", "256MiB", "--host-budget", "32MiB", "--device-workers", "2")
	// Files, not pipes: the guard and the daemons that follow inherit
	// them, and a pipe would keep Wait waiting for them.
	derr := logFile(t, dir, "daemon")
	daemon.Stderr = derr.f
	require.NoError(t, daemon.Start())
	defer daemon.Process.Kill()
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(derr.String(), "listening on") {
		require.True(t, time.Now().Before(deadline), "daemon did not start: %s", derr.String())
		time.Sleep(10 * time.Millisecond)
	}
	exe, err := os.Executable()
	require.NoError(t, err)
	goClient := exec.Command(exe)
	goClient.Env = append(os.Environ(), roleEnv+"=sweeper", uvm.EnvSocket+"="+sock, uvm.EnvServer+"=daemon")
	cClient := exec.Command(buildC(t, "sweep", "testdata/restart/sweep.c"), "48")
	cClient.Env = append(os.Environ(), "UVM_BIN="+filepath.Join(binDir, "uvm"), uvm.EnvSocket+"="+sock, uvm.EnvServer+"=daemon")
	clients := []*passer{startPasser(t, "Go client", goClient), startPasser(t, "C client", cClient)}
	for _, c := range clients {
		c.pass(t)
	}

	repl := logFile(t, dir, "replacement")
	defer func() {
		// Before the directory goes: what every server said (the one
		// SIGUSR2 starts, and the guard's, write to these too).
		if t.Failed() {
			t.Logf("the daemon's log:\n%s\nthe replacement's log:\n%s", lastBytes(derr.String(), 16<<10), lastBytes(repl.String(), 16<<10))
		}
	}()
	replacement := exec.Command(filepath.Join(binDir, "uvm"), "serve", "--replace", "--socket", sock)
	replacement.Stderr = repl.f
	require.NoError(t, replacement.Start())
	defer replacement.Process.Kill()
	waitRetired(t, "the old daemon", daemon)
	for _, c := range clients {
		c.pass(t)
		c.pass(t) // one begun after the replacement, whole
	}
	in := daemonInfo(t, sock)
	assert.Equal(t, replacement.Process.Pid, in.PID, "the replacement serves: %s", repl.String())
	assert.Equal(t, uint64(1), in.Restart.Restarts)

	// SIGUSR2: the daemon starts its own replacement from its binary.
	require.NoError(t, replacement.Process.Signal(syscall.SIGUSR2))
	waitRetired(t, "the replacement", replacement)
	for _, c := range clients {
		c.pass(t)
		c.pass(t)
	}
	in = daemonInfo(t, sock)
	assert.NotEqual(t, replacement.Process.Pid, in.PID)
	assert.Equal(t, uint64(2), in.Restart.Restarts)

	// SIGKILL, mid-pass: the guard starts a daemon that takes over both
	// clients, the C one's device process included.
	killed := in.PID
	require.NoError(t, syscall.Kill(killed, syscall.SIGKILL))
	for _, c := range clients {
		c.pass(t)
		c.pass(t)
	}
	in = daemonInfo(t, sock)
	assert.NotEqual(t, killed, in.PID)
	assert.Equal(t, uint64(3), in.Restart.Restarts)
	for _, c := range clients {
		c.finish(t)
	}
	require.NoError(t, syscall.Kill(in.PID, syscall.SIGTERM))
	eventually(t, 10*time.Second, func() bool { _, err := os.Stat(sock); return os.IsNotExist(err) }, "the last daemon removes its socket on SIGTERM")
	eventually(t, 10*time.Second, func() bool { return !running(in.Restart.GuardPID) }, "the guard exits with the daemon")
}

// TestRunSurvivesServerKills: memtester, which checks its own patterns,
// runs under `uvm run` with a quarter of its memory on the host while the
// server is killed three times; it reports no error, and the summary
// counts the restarts.
func TestRunSurvivesServerKills(t *testing.T) {
	requireRoot(t)
	tester, err := exec.LookPath("memtester")
	if err != nil {
		t.Skip("memtester is not installed (apt-get install memtester; .ci/run installs it)")
	}
	var out syncBuf
	cmd := exec.Command(filepath.Join(binDir, "uvm"), "run", "--host-budget", "2MiB", "--stats-json", filepath.Join(t.TempDir(), "stats.json"), "--", tester, "8M", "1")
	cmd.Stdout, cmd.Stderr = &out, &out
	require.NoError(t, cmd.Start())
	defer cmd.Process.Kill()
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	killed := 0
	for killed < 3 {
		select {
		case err := <-done:
			t.Fatalf("memtester ended after %d kills, before the test could kill 3 times (%v): %s", killed, err, out.String())
		case <-time.After(1500 * time.Millisecond):
		}
		pid := runServerPID(cmd.Process.Pid)
		if pid == 0 {
			continue
		}
		require.NoError(t, syscall.Kill(pid, syscall.SIGKILL))
		killed++
		eventually(t, 30*time.Second, func() bool { return strings.Count(out.String(), "took over from") == killed }, "no server took over after kill %d: %s", killed, out.String())
	}
	select {
	case err := <-done:
		require.NoError(t, err, "memtester: %s", out.String())
	case <-time.After(5 * time.Minute):
		t.Fatalf("memtester did not finish: %s", out.String())
	}
	assert.NotContains(t, out.String(), "FAIL")
	assert.Contains(t, out.String(), "server restarts      3")
}

// logFileT is a file a child writes its standard error to.
type logFileT struct{ f *os.File }

// waitRetired wants a replaced daemon to retire and exit 0 within 30 s
// (a server that did not retire once hung the test until go test's
// timeout).
func waitRetired(t *testing.T, name string, cmd *exec.Cmd) {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		require.NoError(t, err, "%s retires and exits 0", name)
	case <-time.After(30 * time.Second):
		t.Fatalf("%s (pid %d) did not retire within 30s", name, cmd.Process.Pid)
	}
}

// lastBytes is the end of s, at most n bytes of it.
func lastBytes(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return "...\n" + s[len(s)-n:]
}

func logFile(t *testing.T, dir, name string) logFileT {
	f, err := os.Create(filepath.Join(dir, name+".log"))
	require.NoError(t, err)
	t.Cleanup(func() { f.Close() })
	return logFileT{f}
}

func (l logFileT) String() string {
	b, _ := os.ReadFile(l.f.Name())
	return string(b)
}

// runServerPID asks the fault server of `uvm run` pid, at its monitor
// socket, for its pid: whichever server serves now.
func runServerPID(runPID int) int {
	m, err := wire.ConnectMonitor(config.PrivateServerSocketPath(runPID))
	if err != nil {
		return 0
	}
	defer m.Close()
	return m.ServerPID()
}

// running reports whether process pid runs (it exists and is not a
// zombie that nobody reaped yet).
func running(pid int) bool {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	f := strings.Fields(string(stat[bytes.LastIndexByte(stat, ')')+1:]))
	return len(f) > 0 && f[0] != "Z"
}

// syncBuf is a buffer a child writes while the test reads it.
type syncBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuf) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuf) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// eventually polls cond until it holds or timeout passes.
func eventually(t *testing.T, timeout time.Duration, cond func() bool, msg string, args ...any) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf(msg, args...)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
