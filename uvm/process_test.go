package uvm

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/softuvm/softuvm/internal/config"
	"github.com/softuvm/softuvm/internal/core"
	"github.com/softuvm/softuvm/internal/device"
	"github.com/softuvm/softuvm/internal/wire"
)

func init() {
	testRoles["gc-copy"] = roleGCCopy
	testRoles["client-exit"] = roleClientExit
	testRoles["blocked-reader"] = roleBlockedReader
	testRoles["poison-reader"] = rolePoisonReader
	testRoles["connect"] = roleConnect
}

// roleGCCopy copies into fresh managed memory at GOMAXPROCS=1 while the
// garbage collector runs back to back: with the fault server in this
// process it would deadlock (a goroutine blocked in a fault inside
// memmove cannot be preempted, so stop-the-world waits forever).
func roleGCCopy() int {
	runtime.GOMAXPROCS(1)
	debug.SetGCPercent(1)
	stop := make(chan struct{})
	var garbage [][]byte
	go func() {
		for {
			select {
			case <-stop:
				return
			default:
			}
			garbage = append(garbage, make([]byte, 64<<10))
			if len(garbage) > 64 {
				garbage = nil
				runtime.GC()
			}
			runtime.Gosched()
		}
	}()
	s, err := Connect(Config{Server: "private", Private: testServerConfig()})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	src := pattern(16<<20, 11)
	for i := 0; i < 8; i++ {
		a, err := s.MallocManaged(int64(len(src)))
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		copy(a.Bytes(), src)
		if !bytes.Equal(a.Bytes(), src) {
			fmt.Fprintln(os.Stderr, "data differs")
			return 1
		}
		if i%2 == 1 {
			if err := a.Prefetch(0); err != nil {
				fmt.Fprintln(os.Stderr, err)
				return 1
			}
			if !bytes.Equal(a.Bytes(), src) {
				fmt.Fprintln(os.Stderr, "data differs after a round trip")
				return 1
			}
		}
		a.Free()
	}
	close(stop)
	s.Close()
	fmt.Println("ok")
	return 0
}

func TestNoDeadlockWithGCAtGOMAXPROCS1(t *testing.T) {
	requireRoot(t)
	cmd := child(t, "gc-copy")
	done := make(chan error, 1)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	require.NoError(t, cmd.Start())
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		require.NoError(t, err, "child: %s", out.String())
		assert.Equal(t, "ok", strings.TrimSpace(out.String()))
	case <-time.After(120 * time.Second):
		cmd.Process.Kill()
		t.Fatalf("copy() into managed memory with GC running at GOMAXPROCS=1 hung; output: %s", out.String())
	}
}

// TestFreeWhileBlockedInFault: one goroutine is held inside a fault (the
// server stalls every fault), another frees the allocation. Free returns
// promptly and the blocked goroutine gets a fault it can see (SIGSEGV or
// SIGBUS), not zeros and not a hang.
func TestFreeWhileBlockedInFault(t *testing.T) {
	// A goroutine blocked in a fault cannot be preempted, so a garbage
	// collection in this process would wait for the stalled fault (the
	// very reason the server is another process): keep it out of the way.
	defer debug.SetGCPercent(debug.SetGCPercent(-1))
	poisonExpected.Store(t.Name(), true) // the fault, served after Free, finds no allocation
	cfg := testServerConfig()
	cfg.FaultDelay = core.Duration(time.Second)
	s := newSession(t, cfg)
	a, err := s.MallocManaged(1 << 20)
	require.NoError(t, err)
	b := a.Bytes()
	result := make(chan any, 1)
	tid := make(chan int, 1)
	go func() {
		runtime.LockOSThread()
		tid <- syscall.Gettid()
		debug.SetPanicOnFault(true)
		defer func() { result <- recover() }()
		v := b[5*PageSize]
		result <- fmt.Sprintf("read %d", v)
	}()
	// The read is blocked inside the fault, as its thread's wchan shows.
	wchan := fmt.Sprintf("/proc/self/task/%d/wchan", <-tid)
	Eventually(t, 5*time.Second, func() bool { w, _ := os.ReadFile(wchan); return string(w) == "handle_userfault" }, "the read never blocked in the fault")
	t0 := time.Now()
	require.NoError(t, a.Free())
	assert.Less(t, time.Since(t0), 500*time.Millisecond, "Free does not wait for the stalled fault")
	select {
	case r := <-result:
		// SetPanicOnFault turns SIGSEGV and SIGBUS into a runtime error
		// that carries the faulting address.
		fault, ok := r.(interface{ Addr() uintptr })
		require.True(t, ok, "the blocked access must fail with a memory fault, got %v", r)
		assert.Equal(t, a.Addr()+5*PageSize, fault.Addr())
	case <-time.After(5 * time.Second):
		t.Fatal("the goroutine blocked in the fault never returned")
	}
	in, err := s.Info()
	require.NoError(t, err)
	assert.Zero(t, in.Sessions[0].Allocations)
	assert.Zero(t, in.Sessions[0].HostBytes)
}

// roleClientExit connects to the daemon at UVM_SOCKET, allocates, puts
// data on the host and the device, reports, and then exits or waits to be
// killed.
func roleClientExit() int {
	s, err := Connect(Config{Server: "daemon", Socket: os.Getenv(EnvSocket)})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	for i := 0; i < 3; i++ {
		a, err := s.MallocManaged(4 << 20)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		fill(a.Bytes(), byte(i))
		if i > 0 {
			if err := s.Prefetch(a.Addr(), 2<<20, 0); err != nil {
				fmt.Fprintln(os.Stderr, err)
				return 1
			}
		}
	}
	fmt.Println("ready")
	if os.Getenv("UVM_TEST_WAIT") != "" {
		time.Sleep(time.Hour)
	}
	// Until the parent has looked (it closes our standard input).
	io.Copy(io.Discard, os.Stdin)
	return 0 // exits without freeing or closing
}

// TestClientExitLeavesNothing: a client that exits, or is killed, with
// allocations on the host and a device leaves no session, no arena usage
// and no descriptors in the server.
func TestClientExitLeavesNothing(t *testing.T) {
	srv, path := startServer(t, testServerConfig())
	baseline := FdCount(t)
	for _, kill := range []bool{false, true} {
		cmd := child(t, "client-exit", EnvSocket+"="+path)
		if kill {
			cmd.Env = append(cmd.Env, "UVM_TEST_WAIT=1")
		}
		stdout, err := cmd.StdoutPipe()
		require.NoError(t, err)
		stdin, err := cmd.StdinPipe()
		require.NoError(t, err)
		var stderr syncBuffer
		cmd.Stderr = &stderr
		require.NoError(t, cmd.Start())
		line, _ := bufio.NewReader(stdout).ReadString('\n')
		require.Equal(t, "ready\n", line, "child stderr: %s", stderr.String())
		in := srv.Info()
		require.Len(t, in.Sessions, 1)
		assert.Equal(t, 3, in.Sessions[0].Allocations)
		assert.Equal(t, int64(4<<20), in.Devices[0].UsedBytes, "two 2 MiB prefetches are on the device")
		if kill {
			require.NoError(t, cmd.Process.Kill())
		}
		stdin.Close() // the child exits now
		cmd.Wait()
		Eventually(t, 5*time.Second, func() bool { return srv.SessionCount() == 0 }, "the session outlived its client (killed=%v)", kill)
		in = srv.Info()
		assert.Zero(t, in.Devices[0].UsedBytes, "arena accounting (killed=%v)", kill)
		assert.Zero(t, in.Devices[0].FileBytes, "arena files (killed=%v)", kill)
		Eventually(t, 5*time.Second, func() bool { return FdCount(t) <= baseline }, "the server kept descriptors of the client (killed=%v): %d > %d", kill, FdCount(t), baseline)
	}
	st := srv.Stats()
	assert.Positive(t, st.MigratedPages(CPU, 0))
}

// roleBlockedReader puts data on device 0, tells the parent its server's
// pid, then reads it back on the host: with a fault delay of a minute, it
// stays blocked in that fault until something happens.
func roleBlockedReader() int {
	cfg := testServerConfig()
	cfg.FaultDelay = core.Duration(time.Minute)
	cfg.Restarts = -1 // no takeover: the guard poisons
	if os.Getenv(config.AdoptFailEnv) != "" {
		cfg.Restarts = 3 // every attempt fails
	}
	s, err := Connect(Config{Server: "private", Private: cfg})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	a, err := s.MallocManaged(1 << 20)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	// Populate and move to the device without faulting: a prefetch to
	// the device creates the pages there.
	if err := a.Prefetch(0); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	fmt.Printf("server %d\n", s.ServerPID())
	v := a.Bytes()[12345]
	fmt.Printf("read %d\n", v) // must never be printed: the data is gone
	return 0
}

// reporter is a child role that prints "server PID" first.
type reporter struct {
	cmd       *exec.Cmd
	stdout    *bufio.Reader
	stdin     io.WriteCloser
	stderr    *syncBuffer
	serverPID int
}

// startReporter runs role and reads the pid of its server.
func startReporter(t *testing.T, role string, env ...string) reporter {
	t.Helper()
	c := reporter{cmd: child(t, role, env...), stderr: &syncBuffer{}}
	stdout, err := c.cmd.StdoutPipe()
	require.NoError(t, err)
	c.stdin, err = c.cmd.StdinPipe()
	require.NoError(t, err)
	c.cmd.Stderr = c.stderr
	require.NoError(t, c.cmd.Start())
	c.stdout = bufio.NewReader(stdout)
	line, _ := c.stdout.ReadString('\n')
	_, err = fmt.Sscanf(line, "server %d", &c.serverPID)
	require.NoError(t, err, "child said %q; stderr: %s", line, c.stderr.String())
	return c
}

// killBlockedReader runs roleBlockedReader, waits until its read is
// blocked in the fault (seen in its threads' wchan), kills its server, and
// returns how long after the kill the client ended, what it printed
// after, its standard error, and how it ended.
func killBlockedReader(t *testing.T, limit time.Duration, env ...string) (elapsed time.Duration, rest, stderr string, err error) {
	t.Helper()
	c := startReporter(t, "blocked-reader", env...)
	cmd, r, errBuf, serverPID := c.cmd, c.stdout, c.stderr, c.serverPID
	waitInFault(t, cmd.Process.Pid)
	require.NoError(t, syscall.Kill(serverPID, syscall.SIGKILL))
	killed := time.Now()
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err = <-done:
		elapsed = time.Since(killed)
		b, _ := io.ReadAll(r)
		return elapsed, string(b), errBuf.String(), err
	case <-time.After(limit):
		cmd.Process.Kill()
		t.Fatalf("the client hung after its server died; stderr: %s", errBuf.String())
		return 0, "", "", nil
	}
}

// TestServerDeathFailsClientFast: with takeover off, the server dies
// while a client is blocked in a fault. Within a second the client gets a
// clear fatal error (the guard's message, then SIGBUS), never a hang and
// never zeros: 20 times out of 20.
func TestServerDeathFailsClientFast(t *testing.T) {
	requireRoot(t)
	var worst time.Duration
	for try := 0; try < 20; try++ {
		elapsed, rest, stderr, err := killBlockedReader(t, 10*time.Second)
		worst = max(worst, elapsed)
		assert.Less(t, elapsed, slowdown*time.Second, "try %d: the client must fail within a second", try)
		assert.Error(t, err, "try %d: the client must not exit normally", try)
		assert.NotContains(t, rest, "read ", "try %d: the client read data that no longer exists", try)
		assert.Contains(t, stderr, "the fault server of this process", "try %d: the guard says what happened", try)
		assert.Contains(t, stderr, "no new server took over (restarts are off)", "try %d", try)
		assert.Contains(t, stderr, "SIGBUS", "try %d", try)
	}
	t.Logf("20 of 20 clients failed with SIGBUS, the slowest %v after the kill", worst.Round(time.Millisecond))
}

// TestRestartsGiveUp: when every new server fails before it takes over,
// the guard tries as many times as configured, backing off, then poisons:
// the blocked client gets SIGBUS with a message saying so.
func TestRestartsGiveUp(t *testing.T) {
	requireRoot(t)
	elapsed, rest, stderr, err := killBlockedReader(t, 20*time.Second, config.AdoptFailEnv+"=1")
	assert.Error(t, err)
	assert.NotContains(t, rest, "read ")
	// Three attempts: no wait, 50 ms, 100 ms.
	assert.GreaterOrEqual(t, elapsed, 150*time.Millisecond, "the guard backs off between attempts")
	assert.Less(t, elapsed, slowdown*3*time.Second)
	assert.Equal(t, 3, strings.Count(stderr, "failing before the takeover"), "three attempts: %s", stderr)
	assert.Contains(t, stderr, "3 new servers in a row failed to take over")
	assert.Contains(t, stderr, "SIGBUS")
}

// waitInFault waits until a thread of process pid is blocked in a
// userfaultfd fault, as its wchan shows.
func waitInFault(t testing.TB, pid int) {
	t.Helper()
	Eventually(t, 10*time.Second, func() bool { return threadsInFault(pid) > 0 }, "no thread of pid %d blocked in a fault", pid)
}

// threadsInFault counts the threads of pid blocked in handle_userfault.
func threadsInFault(pid int) int {
	tasks, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/wchan", pid))
	n := 0
	for _, w := range tasks {
		if b, err := os.ReadFile(w); err == nil && string(b) == "handle_userfault" {
			n++
		}
	}
	return n
}

// TestMalformedMessages: a peer sending garbage gets an error reply that
// says what is wrong, and the server keeps serving.
func TestMalformedMessages(t *testing.T) {
	srv, path := startServer(t, testServerConfig())
	dial := func() *net.UnixConn {
		c, err := net.DialUnix("unixpacket", nil, &net.UnixAddr{Name: path, Net: "unixpacket"})
		require.NoError(t, err)
		t.Cleanup(func() { c.Close() })
		return c
	}
	roundTrip := func(c *net.UnixConn, b []byte, fds []int) string { return sendForReply(t, c, b, fds) }
	assert.Contains(t, roundTrip(dial(), []byte("hello there, server"), nil), "bad magic")
	assert.Contains(t, roundTrip(dial(), wire.EncodeHello(1, wire.HelloRequest{Role: wire.RoleClient, Pid: 1}), nil), "carries 0 file descriptors, want 2")
	f, err := os.Open("/dev/null")
	require.NoError(t, err)
	defer f.Close()
	assert.Contains(t, roundTrip(dial(), wire.EncodeHello(1, wire.HelloRequest{Role: wire.RoleClient, Pid: 1}), []int{int(f.Fd()), int(f.Fd())}), "host file")
	mon := dial()
	assert.Equal(t, "ok", roundTrip(mon, wire.EncodeHello(1, wire.HelloRequest{Role: wire.RoleMonitor, Pid: 1}), nil))
	assert.Contains(t, roundTrip(mon, wire.EncodeFree(2, 1<<30), nil), "needs a client session")
	assert.Contains(t, roundTrip(mon, wire.EncodeHello(3, wire.HelloRequest{Role: wire.RoleMonitor}), nil), "hello sent twice")
	assert.Equal(t, "ok", roundTrip(mon, wire.EncodeInfo(4), nil), "the monitor still works after errors")
	m, err := wire.ConnectMonitor(path)
	require.NoError(t, err)
	defer m.Close()
	in, err := m.Info()
	require.NoError(t, err)
	assert.Equal(t, os.Getpid(), in.PID, "the server survived")
	_ = srv
}

// roleConnect tries to connect and prints the error as JSON.
func roleConnect() int {
	_, err := Connect(Config{Server: "private", Private: testServerConfig()})
	out := map[string]any{"error": fmt.Sprint(err), "initialization": errors.Is(err, ErrInitialization)}
	json.NewEncoder(os.Stdout).Encode(out)
	return 0
}

// TestWithoutUserfaultfdAccess: a user who may not use userfaultfd gets an
// error that says what is missing and how to grant it.
func TestWithoutUserfaultfdAccess(t *testing.T) {
	requireRoot(t)
	sysctl, err := os.ReadFile("/proc/sys/vm/unprivileged_userfaultfd")
	require.NoError(t, err)
	if strings.TrimSpace(string(sysctl)) == "1" {
		t.Skip("vm.unprivileged_userfaultfd=1: every user may use userfaultfd here")
	}
	fi, err := os.Stat("/dev/userfaultfd")
	if err == nil && fi.Mode().Perm()&0o006 != 0 {
		t.Skip("/dev/userfaultfd is open to everyone here")
	}
	dir, err := os.MkdirTemp("", "uvm-nobody-") // t.TempDir's parent is private
	require.NoError(t, err)
	t.Cleanup(func() { os.RemoveAll(dir) })
	require.NoError(t, os.Chmod(dir, 0o755))
	exe, err := os.Executable()
	require.NoError(t, err)
	bin := filepath.Join(dir, "uvm.test")
	data, err := os.ReadFile(exe)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(bin, data, 0o755))
	cmd := exec.Command(bin)
	cmd.Env = append(os.Environ(), testRoleEnv+"=connect")
	cmd.Dir = dir
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	out, err := cmd.Output()
	require.NoError(t, err, "child: %s", out)
	var res struct {
		Error          string `json:"error"`
		Initialization bool   `json:"initialization"`
	}
	require.NoError(t, json.Unmarshal(out, &res))
	assert.True(t, res.Initialization, "the error is an initialization error: %s", res.Error)
	for _, want := range []string{"/dev/userfaultfd", "permission denied", "vm.unprivileged_userfaultfd", "chmod", "sysctl -w vm.unprivileged_userfaultfd=1"} {
		assert.Contains(t, res.Error, want)
	}
	t.Logf("what an unprivileged user sees: %s", res.Error)
}

// TestMalformedDeviceMessages: a device process that sends garbage, or a
// hello that does not fit its connection, gets an error naming what is
// wrong; the server goes on serving its client.
func TestMalformedDeviceMessages(t *testing.T) {
	s := newSession(t, testServerConfig())
	connect := func() *net.UnixConn {
		_, fds, err := s.rpc.RequestWithFDs(wire.EncodeDeviceConnect(s.rpc.NextSeq(), 0), wire.MsgDeviceConnect)
		require.NoError(t, err)
		require.Len(t, fds, 1)
		c, err := device.FileConn(uintptr(fds[0]))
		require.NoError(t, err)
		t.Cleanup(func() { c.Close() })
		return c
	}
	roundTrip := func(c *net.UnixConn, b []byte, fds []int) string { return sendForReply(t, c, b, fds) }
	assert.Contains(t, roundTrip(connect(), []byte("not a message at all"), nil), "bad magic")
	assert.Contains(t, roundTrip(connect(), wire.EncodeInfo(1), nil), "want device hello")
	assert.Contains(t, roundTrip(connect(), wire.EncodeDeviceHello(1, wire.DeviceHelloRequest{Device: 0, Pid: 1}), nil), "with 0 descriptors, want device 0 and 1")
	f, err := os.Open("/dev/null")
	require.NoError(t, err)
	defer f.Close()
	assert.Contains(t, roundTrip(connect(), wire.EncodeDeviceHello(1, wire.DeviceHelloRequest{Device: 1, Pid: 1}), []int{int(f.Fd())}), "want device 0")
	assert.Contains(t, roundTrip(connect(), wire.EncodeDeviceHello(1, wire.DeviceHelloRequest{Device: 0, Pid: 1}), []int{int(f.Fd())}), "userfaultfd handshake of device 0")
	// The client is served all the while.
	a, err := s.MallocManaged(1 << 20)
	require.NoError(t, err)
	fill(a.Bytes(), 7)
	require.NoError(t, a.Prefetch(0))
	sameBytes(t, pattern(1<<20, 7), a.Bytes(), "after the bad device messages")
}

// TestMalformedServerMessagesToDevice: a device process answers requests
// it cannot carry out (garbage, a request of the wrong kind, a map of a
// location it has no file for, a range outside the managed window) with
// an error naming the problem, and goes on serving.
func TestMalformedServerMessagesToDevice(t *testing.T) {
	server, deviceEnd, err := wire.SocketPair("test-device")
	require.NoError(t, err)
	dc, err := device.FileConn(deviceEnd.Fd())
	deviceEnd.Close()
	require.NoError(t, err)
	dev := &device.DeviceMapping{Index: 0}
	served := make(chan error, 1)
	go func() { served <- dev.ServeServer(dc) }()
	roundTrip := func(b []byte) string { return sendForReply(t, server, b, nil) }
	assert.Contains(t, roundTrip([]byte("garbage garbage garbage")), "bad magic")
	assert.Contains(t, roundTrip(wire.EncodeInfo(2)), "not a request the server sends a device")
	assert.Contains(t, roundTrip(wire.EncodeFree(3, config.ManagedWindowStart)), "not a request the server sends a device")
	assert.Contains(t, roundTrip(wire.EncodeDeviceMap(4, wire.DeviceMapRequest{Addr: config.ManagedWindowStart, Length: PageSize, File: 1})), "map device 1: this session has 0 devices")
	assert.Contains(t, roundTrip(wire.EncodeDeviceMap(5, wire.DeviceMapRequest{Addr: 1 << 20, Length: PageSize, File: core.CPU})), "outside the managed window")
	assert.Contains(t, roundTrip(wire.EncodeDeviceHints(6, []wire.Mapping{{Addr: 1 << 20, Length: PageSize}})), "outside the managed window")
	assert.Equal(t, "ok", roundTrip(wire.EncodeDeviceHints(7, nil)), "a request it can carry out, after all that")
	server.Close()
	select {
	case err := <-served:
		assert.ErrorIs(t, err, wire.ErrPeerGone)
	case <-time.After(5 * time.Second):
		t.Fatal("the device kept serving a closed connection")
	}
	dc.Close()
}

// rolePoisonReader puts 2 MiB of a pattern in managed memory, the first
// half on device 0, with takeover off; says its server's pid; and once
// told (a line on stdin) reads the host half, says whether every byte is
// right, then reads the device half, which must not come back.
func rolePoisonReader() int {
	cfg := testServerConfig()
	cfg.Restarts = -1
	const size = 2 << 20
	s, a, ok := patterned(cfg, size, func(i int) byte { return byte(i*7 + i>>12) })
	if !ok {
		return 1
	}
	b := a.Bytes()
	if err := s.Prefetch(a.Addr(), size/2, 0); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	fmt.Printf("server %d\n", s.ServerPID())
	bufio.NewReader(os.Stdin).ReadString('\n')
	for i := size / 2; i < size; i++ {
		if b[i] != byte(i*7+i>>12) {
			fmt.Printf("host byte %#x is %#x\n", i, b[i])
			return 1
		}
	}
	fmt.Println("host half right")
	v := b[12345]
	fmt.Printf("read %d\n", v) // must never be printed: the data is gone
	return 0
}

// TestPoisonKeepsHostPages: with takeover off and the server dead, the
// pages that were on the host read right; a page that was on the device
// raises SIGBUS.
func TestPoisonKeepsHostPages(t *testing.T) {
	requireRoot(t)
	c := startReporter(t, "poison-reader")
	cmd, r, stdin, stderr := c.cmd, c.stdout, c.stdin, c.stderr
	require.NoError(t, syscall.Kill(c.serverPID, syscall.SIGKILL))
	Eventually(t, 10*time.Second, func() bool { return strings.Contains(stderr.String(), "no new server took over") }, "the guard never took over: %s", stderr.String())
	fmt.Fprintln(stdin)
	rest, _ := io.ReadAll(r)
	err := cmd.Wait()
	assert.Equal(t, "host half right\n", string(rest), "stderr: %s", stderr.String())
	assert.Error(t, err)
	assert.Contains(t, stderr.String(), "SIGBUS")
}

// sendForReply sends a message and returns how it was answered: "ok", the
// error message, or "closed".
func sendForReply(t *testing.T, c *net.UnixConn, b []byte, fds []int) string {
	t.Helper()
	require.NoError(t, wire.WriteMessage(c, b, fds))
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	reply, rfds, err := wire.ReadMessage(c, make([]byte, 4096))
	wire.CloseFDs(rfds)
	if errors.Is(err, wire.ErrPeerGone) {
		return "closed"
	}
	require.NoError(t, err)
	h, payload, err := wire.ParseHeader(reply)
	require.NoError(t, err)
	if h.Status == wire.CodeOK {
		return "ok"
	}
	return (&wire.WireReader{B: payload}).Str("message")
}

// patterned connects a child role to a private server configured with
// cfg and fills a new allocation of size bytes with pattern; on failure
// it says why on standard error.
func patterned(cfg ServerConfig, size int64, pattern func(i int) byte) (*Session, *Allocation, bool) {
	s, err := Connect(Config{Server: "private", Private: cfg})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return nil, nil, false
	}
	a, err := s.MallocManaged(size)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return nil, nil, false
	}
	b := a.Bytes()
	for i := range b {
		b[i] = pattern(i)
	}
	return s, a, true
}
