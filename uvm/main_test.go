package uvm

import (
	"bytes"
	"fmt"
	"github.com/softuvm/softuvm/devmem"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/softuvm/softuvm/internal/config"
	"github.com/softuvm/softuvm/internal/fdleak"
	"github.com/softuvm/softuvm/internal/server"
)

// Tests run the real thing: private fault servers (re-executions of this
// test binary, which this package's init turns into servers), client
// subprocesses (re-executions with testRoleEnv set), and in-process
// servers whose clients are subprocesses. Only root may use
// /dev/userfaultfd here, so without root most tests skip and say so.
const testRoleEnv = "UVM_TEST_ROLE"

func TestMain(m *testing.M) {
	Main()
	if role := os.Getenv(testRoleEnv); role != "" {
		os.Exit(runTestRole(role))
	}
	_ = devmem.LargeFoliosAvailable() // a process-long descriptor, opened before the leak check looks
	os.Exit(fdleak.Run(m.Run))
}

var testRoles = map[string]func() int{}

func runTestRole(role string) int {
	f, ok := testRoles[role]
	if !ok {
		fmt.Fprintf(os.Stderr, "unknown %s=%q\n", testRoleEnv, role)
		return 2
	}
	return f()
}

func requireRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: /dev/userfaultfd is root-only here and vm.unprivileged_userfaultfd=0")
	}
}

// testServerConfig is a small, fast configuration: one 64 MiB device.
func testServerConfig() ServerConfig {
	c := DefaultServerConfig()
	c.Devices = config.DeviceSpecs(1, []int64{64 << 20}, c.Devices[0].Backend)
	return c
}

// newSession connects to a private server with cfg, closed at the end of
// the test.
func newSession(t testing.TB, cfg ServerConfig) *Session {
	t.Helper()
	requireRoot(t)
	log, err := os.CreateTemp(t.TempDir(), "server-*.log")
	require.NoError(t, err)
	s, err := Connect(Config{Server: "private", Private: cfg, Log: log})
	require.NoError(t, err)
	t.Cleanup(func() {
		defer log.Close()
		// A device process that exits badly when stopped fails Close.
		if err := s.Close(); err != nil {
			t.Errorf("close the session: %v", err)
		}
		// A server that crashed, or did not exit when its client left,
		// fails the test even if the client saw nothing. Under the race
		// detector a process's exit alone (racefini) outlasts the two
		// seconds Close waits, so a kill is only reported without it.
		if ps := s.private; ps != nil && ps.cmd.ProcessState != nil && !ps.cmd.ProcessState.Success() {
			if ws, ok := ps.cmd.ProcessState.Sys().(syscall.WaitStatus); !(ok && ws.Signaled() && ws.Signal() == syscall.SIGKILL && slowdown > 1) {
				t.Errorf("the private server ended badly: %v", ps.cmd.ProcessState)
			}
		}
		checkServerLog(t, log)
	})
	return s
}

// badLogLines are what a private server, its guard or a device process
// writes when something went wrong that a client may never notice.
var badLogLines = []string{"poisoned", "panic:", "fatal error:", "WARNING: DATA RACE", "stray page", "lost page"}

// poisonExpected names the tests whose server poisons a page on purpose
// (a fault on memory freed under it).
var poisonExpected sync.Map

// checkServerLog fails t if the log of its private server, guard and
// device processes has a bad line the test did not provoke on purpose,
// and shows the log when t failed.
func checkServerLog(t testing.TB, log *os.File) {
	t.Helper()
	b, err := os.ReadFile(log.Name())
	if err != nil {
		t.Errorf("read the server's log: %v", err)
		return
	}
	text := string(b)
	for _, bad := range badLogLines {
		if _, ok := poisonExpected.Load(t.Name()); ok && bad == "poisoned" {
			continue
		}
		if strings.Contains(text, bad) {
			t.Errorf("the server's log has %q", bad)
		}
	}
	if t.Failed() && text != "" {
		t.Logf("the server's log:\n%s", text)
	}
}

// startServer runs a server in this process, listening on a socket in a
// temporary directory. Its clients must be other processes.
func startServer(t testing.TB, cfg ServerConfig) (*server.Server, string) {
	t.Helper()
	requireRoot(t)
	srv, err := server.NewServer(cfg)
	require.NoError(t, err)
	path := filepath.Join(t.TempDir(), "uvm.sock")
	l, err := server.ListenUnix(path)
	require.NoError(t, err)
	go srv.Serve(l)
	t.Cleanup(func() { srv.Close() })
	return srv, path
}

// child runs this test binary in a role, with extra environment.
func child(t testing.TB, role string, env ...string) *exec.Cmd {
	t.Helper()
	exe, err := os.Executable()
	require.NoError(t, err)
	cmd := exec.Command(exe)
	cmd.Env = append(append(os.Environ(), testRoleEnv+"="+role), env...)
	return cmd
}

// eventually polls cond until it holds or timeout passes.
func Eventually(t testing.TB, timeout time.Duration, cond func() bool, msg string, args ...any) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf(msg, args...)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// fdCount is the number of descriptors this process holds.
func FdCount(t testing.TB) int {
	fds, err := fdleak.Snapshot()
	require.NoError(t, err)
	return len(fds)
}

// exitDescription renders how a child ended.
func exitDescription(err error) string {
	if ee, ok := err.(*exec.ExitError); ok {
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			return "killed by " + ws.Signal().String()
		}
		return fmt.Sprintf("exit status %d", ee.ExitCode())
	}
	if err == nil {
		return "exit status 0"
	}
	return err.Error()
}

func lines(s string) []string { return strings.Split(strings.TrimSpace(s), "\n") }

func killPID(pid int) error { return syscall.Kill(pid, syscall.SIGKILL) }

// syncBuffer is a bytes.Buffer a child process writes to while the test
// reads it.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
