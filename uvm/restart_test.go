package uvm

import (
	"bufio"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/softuvm/softuvm/devmem"
	"github.com/softuvm/softuvm/internal/config"
	"github.com/softuvm/softuvm/internal/proctest"
	"github.com/softuvm/softuvm/internal/wire"
)

func init() {
	testRoles["restart-sweeper"] = roleRestartSweeper
	testRoles["staged-crash"] = roleStagedCrash
	testRoles["whole-move-crash"] = roleWholeMoveCrash
}

// sweepPattern is what the host writes at byte i of pass gen: computed
// here, never read back from the code under test.
func sweepPattern(gen, i int) byte { return byte(i*31 + gen*7 + i>>12) }

// roleRestartSweeper sweeps and checks 48 MiB under a 16 MiB host budget,
// with a kernel on device 0 writing the last 16 MiB of each pass, until
// its standard input closes. It prints the guard's pid, then "pass N"
// after each pass whose every byte was right, and exits 1 at the first
// wrong byte.
func roleRestartSweeper() int {
	fail := func(format string, args ...any) int {
		fmt.Fprintf(os.Stderr, "sweeper: "+format+"\n", args...)
		return 1
	}
	cfg := testServerConfig()
	cfg.HostBudget = 16 << 20
	if v := os.Getenv("UVM_TEST_RESTARTS"); v != "" {
		cfg.Restarts, _ = strconv.Atoi(v)
	}
	s, err := Connect(Config{Server: "private", Private: cfg})
	if err != nil {
		return fail("%v", err)
	}
	in, err := s.Info()
	if err != nil {
		return fail("%v", err)
	}
	fmt.Printf("guard %d\n", in.Restart.GuardPID)
	const size, devicePart = 48 << 20, 16 << 20
	a, err := s.MallocManaged(size)
	if err != nil {
		return fail("%v", err)
	}
	b := a.Bytes()
	var stop atomic.Bool
	go func() { io.Copy(io.Discard, os.Stdin); stop.Store(true) }()
	hostPart := size - devicePart
	for gen := 1; !stop.Load(); gen++ {
		for i := 0; i < hostPart; i++ {
			b[i] = sweepPattern(gen, i)
		}
		if err := s.Launch(0, nil, "fill", 4, rangeParams(a.Addr()+uintptr(hostPart), devicePart, byte(gen))); err != nil {
			return fail("pass %d: launch: %v", gen, err)
		}
		if err := s.DeviceSynchronize(0); err != nil {
			return fail("pass %d: synchronize: %v", gen, err)
		}
		for i := 0; i < hostPart; i++ {
			if want := sweepPattern(gen, i); b[i] != want {
				return fail("pass %d: byte %#x is %#x, want %#x", gen, i, b[i], want)
			}
		}
		for i := 0; i < devicePart; i++ {
			if want := byte(gen) + byte(i>>12); b[hostPart+i] != want {
				return fail("pass %d: byte %#x (written by the kernel) is %#x, want %#x", gen, hostPart+i, b[hostPart+i], want)
			}
		}
		fmt.Printf("pass %d\n", gen)
	}
	fmt.Printf("restarts %d\n", s.ServerRestarts())
	return 0
}

// serverOf returns the fault server now serving the client clientPID: its
// private server (a child of the client), or one the guard started.
func serverOf(t testing.TB, clientPID, guardPID int) int {
	t.Helper()
	pid, err := proctest.ServerChild(clientPID, guardPID)
	require.NoError(t, err)
	return pid
}

// sweeper runs roleRestartSweeper and reads its lines.
type sweeper struct {
	t      *testing.T
	cmd    *childProc
	guard  int
	passes chan int
	stderr *syncBuffer
}

type childProc struct {
	pid   int
	stdin io.WriteCloser
	wait  chan error
}

func startSweeper(t *testing.T, env ...string) *sweeper {
	return startRole(t, "restart-sweeper", env...)
}

// startRole runs a role that prints its guard's pid, then "pass N"
// lines, as roleRestartSweeper does, and reads its lines.
func startRole(t *testing.T, role string, env ...string) *sweeper {
	cmd := child(t, role, env...)
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	stdin, err := cmd.StdinPipe()
	require.NoError(t, err)
	sw := &sweeper{t: t, passes: make(chan int, 1024), stderr: &syncBuffer{}}
	cmd.Stderr = sw.stderr
	require.NoError(t, cmd.Start())
	sw.cmd = &childProc{pid: cmd.Process.Pid, stdin: stdin, wait: make(chan error, 1)}
	go func() { sw.cmd.wait <- cmd.Wait() }()
	t.Cleanup(func() { cmd.Process.Kill() })
	r := bufio.NewReader(stdout)
	line, _ := r.ReadString('\n')
	_, err = fmt.Sscanf(line, "guard %d", &sw.guard)
	require.NoError(t, err, "sweeper said %q; stderr: %s", line, sw.stderr.String())
	require.Positive(t, sw.guard)
	go func() {
		for {
			line, err := r.ReadString('\n')
			if err != nil {
				close(sw.passes)
				return
			}
			var n int
			if _, err := fmt.Sscanf(line, "pass %d", &n); err == nil {
				sw.passes <- n
			}
		}
	}()
	return sw
}

var tookOver = regexp.MustCompile(`took over from a server that ended ([0-9.]+m?s) ago`)

// pauses are the takeover pauses the new servers logged.
func pauses(log string) []time.Duration {
	var out []time.Duration
	for _, m := range tookOver.FindAllStringSubmatch(log, -1) {
		if d, err := time.ParseDuration(m[1]); err == nil {
			out = append(out, d)
		}
	}
	return out
}

// TestServerKilledUnderLoad: the server of a program sweeping and checking
// 48 MiB under a 16 MiB host budget, with a device kernel writing part
// of it, is killed with SIGKILL every 0.5 to 2 seconds, 20 times. Every
// pass checks every byte; the program finishes.
func TestServerKilledUnderLoad(t *testing.T) {
	requireRoot(t)
	sw := startSweeper(t)
	sw.nextPass(60 * time.Second)
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 12))
	const kills = 20
	for k := 0; k < kills; k++ {
		time.Sleep(500*time.Millisecond + time.Duration(rng.Int64N(int64(1500*time.Millisecond))))
		pid := serverOf(t, sw.cmd.pid, sw.guard)
		require.NotZero(t, pid, "kill %d: no server found; stderr: %s", k+1, sw.stderr.String())
		require.NoError(t, syscall.Kill(pid, syscall.SIGKILL))
		// Service resumed: a pass begun before or after the kill ends,
		// every byte right.
		sw.nextPass(60 * time.Second)
		// And the new server took over before the next kill: a pass that
		// began before this kill may end before then, and a kill of a
		// server still taking over is a kill of no server in service
		// (the guard starts another; one takeover for two kills).
		require.Eventually(t, func() bool { return len(pauses(sw.stderr.String())) == k+1 }, 60*time.Second, 10*time.Millisecond,
			"kill %d: no takeover logged; stderr: %s", k+1, sw.stderr.String())
	}
	sw.finish()
	ps := pauses(sw.stderr.String())
	require.Len(t, ps, kills, "one takeover per kill; stderr: %s", sw.stderr.String())
	slices.Sort(ps)
	t.Logf("pause from kill to service: median %v, max %v", ps[len(ps)/2], ps[len(ps)-1])
	assert.NotContains(t, sw.stderr.String(), "poison")
}

// TestGuardKilled: a guard that dies is replaced by the server, which
// sends the new one everything; the server killed afterwards is taken
// over through the new guard, and nothing is lost.
func TestGuardKilled(t *testing.T) {
	requireRoot(t)
	sw := startSweeper(t)
	sw.nextPass(60 * time.Second)
	server := serverOf(t, sw.cmd.pid, sw.guard)
	require.NotZero(t, server)
	require.NoError(t, syscall.Kill(sw.guard, syscall.SIGKILL))
	var guard int
	Eventually(t, 10*time.Second, func() bool {
		m, err := wire.ConnectMonitor(config.PrivateServerSocketPath(server))
		if err != nil {
			return false
		}
		defer m.Close()
		in, err := m.Info()
		guard = in.Restart.GuardPID
		return err == nil && guard != 0 && guard != sw.guard
	}, "the server did not start a new guard; stderr: %s", sw.stderr.String())
	sw.nextPass(60 * time.Second)
	require.NoError(t, syscall.Kill(server, syscall.SIGKILL))
	sw.nextPass(60 * time.Second)
	Eventually(t, 10*time.Second, func() bool { return serverOf(t, sw.cmd.pid, guard) != 0 }, "no server after the kill")
	sw.nextPass(60 * time.Second)
	sw.finish()
	assert.Len(t, pauses(sw.stderr.String()), 1)
}

// roleStagedCrash fills 4 MiB on the host and prefetches it to device 0
// with a server that kills itself right after the first chunk's source is
// punched, before it is installed: those pages are then only in the
// staging file. It prints the server that took over, then checks every
// byte.
func roleStagedCrash() int {
	cfg := testServerConfig()
	cfg.CopyDirectBelow = 1 << 40 // one goroutine: the crash comes at a known point
	// 4 KiB folios: a whole block moving between files of large folios
	// carries no page through the staging file (TestCrashInWholeMove).
	cfg.LargeFolios = config.LargeFoliosOff
	s, a, ok := patterned(cfg, 4<<20, func(i int) byte { return sweepPattern(3, i) })
	if !ok {
		return 1
	}
	b := a.Bytes()
	if err := a.Prefetch(0); err != nil {
		fmt.Fprintln(os.Stderr, "prefetch:", err)
		return 1
	}
	fmt.Printf("restarts %d\n", s.ServerRestarts())
	return checkSweepPattern(b, 3)
}

// TestCrashWithPagesInFlight: a server dies between taking pages out of
// their source and putting them at their destination. The pages are in
// the staging file; the new server puts them back, and no byte is lost.
func TestCrashWithPagesInFlight(t *testing.T) {
	requireRoot(t)
	cmd := child(t, "staged-crash", config.CrashAfterPunchEnv+"=1")
	var stderr syncBuffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	require.NoError(t, err, "child: %s; stderr: %s", out, stderr.String())
	assert.Equal(t, "restarts 1\n", string(out), "the prefetch was sent again to the new server")
	assert.Regexp(t, `[1-9][0-9]* put back from the staging file`, stderr.String())
}

// roleWholeMoveCrash fills 4 MiB on the host, prefetches it to device 0,
// and back, with a server that kills itself in the first whole move
// that writes its destination straight from its source (with large
// folios and nothing mapping a destination by itself, each is one), at
// the step
// SOFTUVM_TEST_CRASH_IN_MOVE names. It prints the restarts and what its
// location files hold, then checks every byte.
func roleWholeMoveCrash() int {
	cfg := testServerConfig()
	cfg.LargeFolios = config.LargeFoliosAuto
	cfg.CopyDirectBelow = 1 << 40 // one goroutine: the crash comes at a known point
	s, a, ok := patterned(cfg, 4<<20, func(i int) byte { return sweepPattern(5, i) })
	if !ok {
		return 1
	}
	b := a.Bytes()
	for _, to := range []Device{0, CPU} {
		if err := a.Prefetch(to); err != nil {
			fmt.Fprintf(os.Stderr, "prefetch to %v: %v\n", to, err)
			return 1
		}
	}
	fmt.Printf("restarts %d\n", s.ServerRestarts())
	in, err := s.Info()
	if err != nil {
		fmt.Fprintln(os.Stderr, "info:", err)
		return 1
	}
	for _, si := range in.Sessions {
		if si.PID == os.Getpid() && si.Role == "client" {
			fmt.Printf("file bytes %d\n", si.FileBytes)
		}
	}
	return checkSweepPattern(b, 5)
}

// checkSweepPattern wants b to hold pass gen's sweepPattern; it returns a
// role's exit code, naming the first wrong byte.
func checkSweepPattern(b []byte, gen int) int {
	for i := range b {
		if want := sweepPattern(gen, i); b[i] != want {
			fmt.Fprintf(os.Stderr, "byte %#x is %#x, want %#x\n", i, b[i], want)
			return 1
		}
	}
	return 0
}

// TestCrashInWholeMove: a server dies in a whole block's move that
// writes the destination from the source before it punches the source:
// with the destination written but not yet recorded as whole (the new
// server drops the destination's copy and keeps the source's), the same
// with the destination's second half spoiled (a write cut short: keeping
// that copy would lose the bytes), and recorded as whole (it drops the
// source's). Either way the move's intent settles it, the prefetch is
// sent again, no byte is lost, and the files hold one copy, 4 MiB (a
// move left unsettled holds two).
func TestCrashInWholeMove(t *testing.T) {
	requireRoot(t)
	if err := devmem.LargeFoliosAvailable(); err != nil {
		t.Skipf("no large folios here: %v", err)
	}
	for _, step := range []string{"written", "torn", "copied"} {
		t.Run(step, func(t *testing.T) {
			cmd := child(t, "whole-move-crash", config.CrashInMoveEnv+"="+step+":1")
			var stderr syncBuffer
			cmd.Stderr = &stderr
			out, err := cmd.Output()
			require.NoError(t, err, "child: %s; stderr: %s", out, stderr.String())
			assert.Equal(t, "restarts 1\nfile bytes 4194304\n", string(out), "the prefetch was sent again to the new server, and one copy is left")
			assert.Regexp(t, ` [1-9][0-9]* whole-block moves settled`, stderr.String())
		})
	}
}

// TestRapidKills: servers killed as soon as they have taken over are not
// servers failing by themselves: the guard keeps starting new ones (its
// bounded retries count only exits without a signal).
func TestRapidKills(t *testing.T) {
	requireRoot(t)
	sw := startSweeper(t)
	sw.nextPass(60 * time.Second)
	pid := serverOf(t, sw.cmd.pid, sw.guard)
	for k := 0; k < 2*config.DefaultRestartAttempts; k++ {
		require.NotZero(t, pid)
		require.NoError(t, syscall.Kill(pid, syscall.SIGKILL))
		old := pid
		Eventually(t, 30*time.Second, func() bool {
			pid = serverOf(t, sw.cmd.pid, sw.guard)
			return pid != 0 && pid != old && strings.Count(sw.stderr.String(), "took over from") == k+1
		}, "no server took over after kill %d: %s", k+1, sw.stderr.String())
	}
	sw.nextPass(60 * time.Second)
	sw.finish()
	assert.NotContains(t, sw.stderr.String(), "no new server took over")
}

// nextPass waits for the sweeper to finish a pass, checked byte by byte.
func (sw *sweeper) nextPass(timeout time.Duration) int {
	sw.t.Helper()
	select {
	case n, ok := <-sw.passes:
		require.True(sw.t, ok, "the sweeper ended; stderr: %s", sw.stderr.String())
		return n
	case <-time.After(timeout):
		sw.t.Fatalf("no pass within %v; stderr: %s", timeout, sw.stderr.String())
		return 0
	}
}

// finish stops the sweeper after its current pass and checks it ended well.
func (sw *sweeper) finish() {
	sw.t.Helper()
	sw.cmd.stdin.Close()
	select {
	case err := <-sw.cmd.wait:
		require.NoError(sw.t, err, "sweeper: %s", sw.stderr.String())
	case <-time.After(60 * time.Second):
		sw.t.Fatalf("the sweeper did not finish; stderr: %s", sw.stderr.String())
	}
}
