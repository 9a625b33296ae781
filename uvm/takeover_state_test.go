package uvm

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/softuvm/softuvm/internal/config"
	"github.com/softuvm/softuvm/trace"
)

// Session state a takeover keeps (the journal, internal/guard): each test
// here kills the server with SIGKILL at the moment a piece of state
// matters and checks that the program sees the same behaviour after the
// takeover as without it.

func init() {
	testRoles["launch-takeover"] = roleLaunchTakeover
	testRoles["peer-takeover"] = rolePeerTakeover
	testRoles["profiler-takeover"] = roleProfilerTakeover
	for _, name := range []string{"beforeKill", "afterKill", "afterStop"} {
		MustRegisterKernel(name, func(tid, n int, p []byte) {})
	}
}

// killAtEachReady runs role, which prints "guard N" first, then "ready"
// at each moment it wants the server killed, and waits for a line on its
// standard input before it goes on. At each "ready" the server is killed
// with SIGKILL, and the role told to go on once a new server has logged
// its takeover. It returns the role's standard error (where the server
// logs too) and how it exited. Standard error is a file: the private
// server and its guard outlive a role that dies, and would hold a pipe
// open.
func killAtEachReady(t *testing.T, role string, env ...string) (string, error) {
	t.Helper()
	cmd := child(t, role, env...)
	errFile, err := os.Create(filepath.Join(t.TempDir(), "stderr"))
	require.NoError(t, err)
	defer errFile.Close()
	cmd.Stderr = errFile
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	stdin, err := cmd.StdinPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { cmd.Process.Kill() })
	stderr := func() string { b, _ := os.ReadFile(errFile.Name()); return string(b) }
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	lines := make(chan string, 16)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			lines <- sc.Text()
		}
	}()
	guard, kills := 0, 0
	for {
		select {
		case line := <-lines:
			if _, err := fmt.Sscanf(line, "guard %d", &guard); err == nil {
				continue
			}
			require.Equal(t, "ready", line, "stderr: %s", stderr())
			require.Positive(t, guard, "no guard line before ready")
			pid := serverOf(t, cmd.Process.Pid, guard)
			require.NotZero(t, pid, "no server to kill; stderr: %s", stderr())
			require.NoError(t, syscall.Kill(pid, syscall.SIGKILL))
			kills++
			Eventually(t, 60*time.Second, func() bool { return len(pauses(stderr())) == kills },
				"kill %d: no takeover logged; stderr: %s", kills, stderr())
			_, err := fmt.Fprintln(stdin, "go")
			require.NoError(t, err)
		case err := <-exited:
			return stderr(), err
		case <-time.After(2 * time.Minute):
			t.Fatalf("%s: no progress for two minutes; stderr: %s", role, stderr())
		}
	}
}

// awaitGo says "ready" and waits for the test's word to go on.
func awaitGo(in *bufio.Reader) {
	fmt.Println("ready")
	in.ReadString('\n')
}

// roleLaunchTakeover is a launch-model client (TAKEOVER_DIRTY: its dirty
// tracking) with three allocations: held (attached globally), hostOnly
// (attached to the host) and single (attached to stream A). It starts a
// kernel on stream B that waits for its word, and is killed while the
// kernel runs. What it does after the takeover is TAKEOVER_STEP's:
//
//   - "held": it touches hostOnly and single, which stay the CPU's, then
//     held, which the kernel holds: the touch must be refused (SIGBUS),
//     as it would be without the takeover.
//   - "attached": it lets the kernel end, starts another on stream B and
//     touches hostOnly and single while it runs: their attachments keep
//     them the CPU's. Then it exits 0.
//
// It writes what it sees on standard error.
func roleLaunchTakeover() int {
	fail := func(format string, args ...any) int {
		fmt.Fprintf(os.Stderr, "launch-takeover: "+format+"\n", args...)
		return 1
	}
	s, err := Connect(Config{Server: "private", Private: launchConfig(os.Getenv("TAKEOVER_DIRTY"))})
	if err != nil {
		return fail("%v", err)
	}
	in, err := s.Info()
	if err != nil {
		return fail("%v", err)
	}
	fmt.Printf("guard %d\n", in.Restart.GuardPID)
	flagMem, err := s.HostAlloc(PageSize, HostAllocMapped)
	if err != nil {
		return fail("%v", err)
	}
	flag := (*atomic.Uint32)(flagMem.Pointer())
	held, err := s.MallocManaged(4 * PageSize)
	if err != nil {
		return fail("%v", err)
	}
	hostOnly, err := s.MallocManaged(4*PageSize, WithFlags(AttachHost))
	if err != nil {
		return fail("%v", err)
	}
	single, err := s.MallocManaged(4 * PageSize)
	if err != nil {
		return fail("%v", err)
	}
	stA, err := s.StreamCreate(0)
	if err != nil {
		return fail("%v", err)
	}
	stB, err := s.StreamCreate(0)
	if err != nil {
		return fail("%v", err)
	}
	if err := s.StreamAttachMemAsync(stA, single.Addr(), 0, AttachSingle); err != nil {
		return fail("%v", err)
	}
	fillBytes(held.Bytes(), 1)
	fillBytes(hostOnly.Bytes(), 2)
	fillBytes(single.Bytes(), 3)
	startWaiting := func() error {
		flag.Store(0)
		if err := s.Launch(0, stB, "waitFlag", 1, params(uint64(flagMem.Addr()))); err != nil {
			return err
		}
		for flag.Load() != 1 {
			time.Sleep(100 * time.Microsecond)
		}
		return nil
	}
	// touchFree checks and rewrites what stays the CPU's while a kernel
	// runs on stream B.
	touchFree := func(hostWas, singleWas byte) error {
		for i, v := range hostOnly.Bytes() {
			if v != hostWas {
				return fmt.Errorf("byte %d of host-attached memory is %d, want %d", i, v, hostWas)
			}
		}
		for i, v := range single.Bytes() {
			if v != singleWas {
				return fmt.Errorf("byte %d of memory attached to stream A is %d, want %d", i, v, singleWas)
			}
		}
		fillBytes(hostOnly.Bytes(), hostWas+10)
		fillBytes(single.Bytes(), singleWas+10)
		return nil
	}
	if err := startWaiting(); err != nil {
		return fail("%v", err)
	}
	stdin := bufio.NewReader(os.Stdin)
	awaitGo(stdin) // the server is killed while the kernel runs
	if in, err = s.Info(); err != nil || len(in.Sessions) != 1 {
		return fail("info after the takeover: %v (%d sessions)", err, len(in.Sessions))
	}
	fmt.Fprintf(os.Stderr, "model %s %s\n", in.Sessions[0].Coherence, in.Sessions[0].DirtyTracking)
	switch os.Getenv("TAKEOVER_STEP") {
	case "held":
		if err := touchFree(2, 3); err != nil {
			return fail("%v", err)
		}
		fmt.Fprintln(os.Stderr, "touching held")
		held.Bytes()[0] = 9 // refused: SIGBUS
		fmt.Fprintln(os.Stderr, "touched held")
		flag.Store(2)
		return 0
	case "attached":
		flag.Store(2)
		if err := s.StreamSynchronize(stB); err != nil {
			return fail("%v", err)
		}
		if err := startWaiting(); err != nil {
			return fail("%v", err)
		}
		if err := touchFree(2, 3); err != nil {
			return fail("%v", err)
		}
		flag.Store(2)
		if err := s.StreamSynchronize(stB); err != nil {
			return fail("%v", err)
		}
		fmt.Fprintln(os.Stderr, "attachments kept")
		s.Close()
		return 0
	}
	return fail("TAKEOVER_STEP=%q", os.Getenv("TAKEOVER_STEP"))
}

// TestTakeoverKeepsTheLaunchModel: the server of a launch-model client
// is killed while a kernel runs. After the takeover the session is still
// of the launch model, with the same dirty tracking (wp-fault too, whose
// userfaultfd shows nothing of the model); the kernel still holds what it
// held, so the CPU's touch is refused and names it, while memory attached
// to the host or to another stream stays the CPU's; and the attachments
// hold for the next launch.
func TestTakeoverKeepsTheLaunchModel(t *testing.T) {
	requireRoot(t)
	for _, tc := range []struct{ dirty, step string }{{"wp-async", "held"}, {"wp-fault", "held"}, {"wp-async", "attached"}} {
		t.Run(tc.dirty+"/"+tc.step, func(t *testing.T) {
			out, err := killAtEachReady(t, "launch-takeover", "TAKEOVER_DIRTY="+tc.dirty, "TAKEOVER_STEP="+tc.step)
			assert.Contains(t, out, "model launch "+tc.dirty+"\n")
			if tc.step == "attached" {
				require.NoError(t, err, "%s", out)
				assert.Contains(t, out, "attachments kept")
				return
			}
			require.Error(t, err, "the touch of held memory was let through: %s", out)
			assert.Contains(t, out, "touching held")
			assert.NotContains(t, out, "touched held")
			assert.Contains(t, out, "SIGBUS", "%s", out)
			assert.Regexp(t, `the CPU touched 0x[0-9a-f]+ in managed allocation 0x[0-9a-f]+ \(16 KiB, buffer [0-9]+\) while kernel "waitFlag" \(device 0 stream [0-9]+\) may use it`, out)
		})
	}
}

// rolePeerTakeover: two devices; device memory on device 1 filled by the
// host, and device 0 given peer access to it before device 0 has a
// process. The server is killed then. Afterwards device 0's first kernel
// (a new process, which maps what the table says) adds one to that
// memory, and enabling the access again says it is enabled already.
func rolePeerTakeover() int {
	fail := func(format string, args ...any) int {
		fmt.Fprintf(os.Stderr, "peer-takeover: "+format+"\n", args...)
		return 1
	}
	cfg := testServerConfig()
	cfg.Devices = config.DeviceSpecs(2, []int64{16 << 20}, cfg.Devices[0].Backend)
	s, err := Connect(Config{Server: "private", Private: cfg})
	if err != nil {
		return fail("%v", err)
	}
	in, err := s.Info()
	if err != nil {
		return fail("%v", err)
	}
	fmt.Printf("guard %d\n", in.Restart.GuardPID)
	const size = 64 << 10
	mem, err := s.Malloc(1, size)
	if err != nil {
		return fail("%v", err)
	}
	src := pattern(size, 7)
	if err := s.Memcpy(mem.Addr(), addr(src), size, MemcpyHostToDevice); err != nil {
		return fail("%v", err)
	}
	if err := s.DeviceEnablePeerAccess(0, 1, 0); err != nil {
		return fail("enable: %v", err)
	}
	awaitGo(bufio.NewReader(os.Stdin))
	if err := s.Launch(0, nil, "addOne", 2, rangeParams(mem.Addr(), size, 0)); err != nil {
		return fail("launch: %v", err)
	}
	if err := s.DeviceSynchronize(0); err != nil {
		return fail("device 0's kernel on device 1's memory: %v", err)
	}
	got := make([]byte, size)
	if err := s.Memcpy(addr(got), mem.Addr(), size, MemcpyDeviceToHost); err != nil {
		return fail("%v", err)
	}
	for i := range got {
		if got[i] != src[i]+1 {
			return fail("byte %d is %d, want %d", i, got[i], src[i]+1)
		}
	}
	err = s.DeviceEnablePeerAccess(0, 1, 0)
	fmt.Fprintf(os.Stderr, "enable again: %v\n", err)
	s.Close()
	return 0
}

// TestTakeoverKeepsPeerAccess: peer access enabled before the server dies
// is enabled after the takeover: a process of the device started then
// maps the peer's memory, and its kernel works on it.
func TestTakeoverKeepsPeerAccess(t *testing.T) {
	requireRoot(t)
	out, err := killAtEachReady(t, "peer-takeover")
	require.NoError(t, err, "%s", out)
	assert.Contains(t, out, "enable again: "+ErrPeerAccessAlreadyEnabled.Error())
}

// roleProfilerTakeover, started with UVM_TRACE. With PROFILE_STEP
// "recording" it stops the recording UVM_TRACE began and starts the
// profiler's (to PROFILE_TRACE), runs kernel "beforeKill" on device 0
// (whose process starts while it records, and so reports its launches),
// is killed, then runs "afterKill" and exits. With "stopped" it stops
// the recording UVM_TRACE began, is killed, then runs "afterStop" and
// exits.
func roleProfilerTakeover() int {
	fail := func(format string, args ...any) int {
		fmt.Fprintf(os.Stderr, "profiler-takeover: "+format+"\n", args...)
		return 1
	}
	s, err := Connect(Config{Server: "private", Private: testServerConfig()})
	if err != nil {
		return fail("%v", err)
	}
	in, err := s.Info()
	if err != nil {
		return fail("%v", err)
	}
	fmt.Printf("guard %d\n", in.Restart.GuardPID)
	run := func(kernel string) error {
		if err := s.Launch(0, nil, kernel, 1, nil); err != nil {
			return err
		}
		return s.DeviceSynchronize(0)
	}
	if err := s.ProfilerStop(); err != nil {
		return fail("%v", err)
	}
	after := "afterStop"
	if os.Getenv("PROFILE_STEP") == "recording" {
		os.Setenv(EnvTrace, os.Getenv("PROFILE_TRACE"))
		if err := s.ProfilerStart(); err != nil {
			return fail("%v", err)
		}
		if err := run("beforeKill"); err != nil {
			return fail("%v", err)
		}
		after = "afterKill"
	}
	awaitGo(bufio.NewReader(os.Stdin))
	if err := run(after); err != nil {
		return fail("%v", err)
	}
	s.Close() // the server records what the device reports until it exits
	return 0
}

// launchesIn counts the launch events of each kernel in the trace at
// path, which a killed server may have left without its end.
func launchesIn(t *testing.T, path string) map[string]int {
	t.Helper()
	if fi, err := os.Stat(path); err == nil && fi.Size() == 0 {
		return nil // its server was killed before it wrote anything
	}
	_, events, err := trace.ReadFile(path)
	if err != nil {
		require.ErrorIs(t, err, io.ErrUnexpectedEOF, "%s", path)
	}
	n := map[string]int{}
	for _, e := range events {
		if e.Kind == trace.KindLaunch {
			n[e.Name]++
		}
	}
	return n
}

// TestTakeoverKeepsTheTrace: a client's profiler recording goes on after
// the takeover, into FILE.pidN of the new server, with the launches its
// device process reports, whose report socket the guard kept; a
// recording stopped stays stopped after a takeover, though the client
// started with UVM_TRACE (which alone would record again).
func TestTakeoverKeepsTheTrace(t *testing.T) {
	requireRoot(t)
	t.Run("recording", func(t *testing.T) {
		dir := t.TempDir()
		prof := filepath.Join(dir, "prof.uvmtrace")
		out, err := killAtEachReady(t, "profiler-takeover", "PROFILE_STEP=recording", EnvTrace+"="+filepath.Join(dir, "env.uvmtrace"), "PROFILE_TRACE="+prof)
		require.NoError(t, err, "%s", out)
		taken, err := filepath.Glob(prof + ".pid*")
		require.NoError(t, err)
		require.Len(t, taken, 1, "the profiler records after the takeover: %v; stderr: %s", taken, out)
		// The new server is not the role's child: it completes the file
		// once it has seen the session end, after the role exited.
		Eventually(t, 60*time.Second, func() bool { _, _, err := trace.ReadFile(taken[0]); return err == nil },
			"%s is not complete; stderr: %s", taken[0], out)
		after := launchesIn(t, taken[0])
		assert.Equal(t, 1, after["afterKill"], "the launch after the takeover, reported by the device process: %v; stderr: %s", after, out)
		assert.LessOrEqual(t, after["beforeKill"]+launchesIn(t, prof)["beforeKill"], 1, "a launch is traced once at most")
	})
	t.Run("stopped", func(t *testing.T) {
		dir := t.TempDir()
		env := filepath.Join(dir, "env.uvmtrace")
		out, err := killAtEachReady(t, "profiler-takeover", "PROFILE_STEP=stopped", EnvTrace+"="+env)
		require.NoError(t, err, "%s", out)
		again, err := filepath.Glob(env + ".pid*")
		require.NoError(t, err)
		assert.Empty(t, again, "a recording stopped does not start again at a takeover")
		assert.Zero(t, launchesIn(t, env)["afterStop"])
	})
}
