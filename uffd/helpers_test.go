//go:build linux

package uffd

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

var pageSize = os.Getpagesize()

// testTimeout bounds every wait for the kernel or a helper process, so that
// a broken test fails instead of hanging.
const testTimeout = 10 * time.Second

// skipIfNoAccess skips when err says this process may not create a
// userfaultfd that handles kernel-mode faults and it is not root; as root
// (where CI runs) such an error is a failure.
func skipIfNoAccess(t testing.TB, err error) {
	t.Helper()
	if err != nil && os.Geteuid() != 0 && errors.Is(err, ErrPermission) {
		t.Skipf("needs root (or access to /dev/userfaultfd) to handle kernel-mode faults: %v", err)
	}
}

// openT opens a userfaultfd that is closed when the test ends.
func openT(t testing.TB, flags OpenFlag) *FD {
	t.Helper()
	f, err := Open(flags)
	skipIfNoAccess(t, err)
	require.NoError(t, err)
	t.Cleanup(func() { f.Close() })
	return f
}

// requireFeature skips the test when the kernel lacks one of want.
func requireFeature(t testing.TB, want Feature) {
	t.Helper()
	err := CheckFeature(want)
	if errors.Is(err, ErrNotSupported) {
		t.Skipf("the kernel lacks %v: %v", want, err)
	}
	skipIfNoAccess(t, err)
	require.NoError(t, err)
}

// handshakeT opens a NonBlock userfaultfd and handshakes it with want,
// skipping when the kernel lacks part of want.
func handshakeT(t testing.TB, want Feature) *FD {
	t.Helper()
	requireFeature(t, want)
	f := openT(t, NonBlock|CloseOnExec)
	got, err := f.Handshake(want)
	require.NoError(t, err)
	require.True(t, got.Has(want), "granted %v, asked %v", got, want)
	return f
}

// mmapAnon maps private anonymous memory, unmapped when the test ends.
func mmapAnon(t testing.TB, pages int) []byte {
	t.Helper()
	mem, err := unix.Mmap(-1, 0, pages*pageSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	require.NoError(t, err)
	t.Cleanup(func() { unix.Munmap(mem) })
	return mem
}

// memfdT creates a memfd of pages pages and maps it shared (shmem).
func memfdT(t testing.TB, pages int) (int, []byte) {
	t.Helper()
	fd, err := unix.MemfdCreate("uffd-test", unix.MFD_CLOEXEC)
	require.NoError(t, err)
	t.Cleanup(func() { unix.Close(fd) })
	require.NoError(t, unix.Ftruncate(fd, int64(pages*pageSize)))
	mem, err := unix.Mmap(fd, 0, pages*pageSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	require.NoError(t, err)
	t.Cleanup(func() { unix.Munmap(mem) })
	return fd, mem
}

// pipeT returns a pipe closed when the test ends. Raw fds keep the kernel
// calls on the calling thread, outside the runtime's poller.
func pipeT(t testing.TB) (r, w int) {
	t.Helper()
	var p [2]int
	require.NoError(t, unix.Pipe2(p[:], unix.O_CLOEXEC))
	t.Cleanup(func() { unix.Close(p[0]); unix.Close(p[1]) })
	return p[0], p[1]
}

func fill(n int, b byte) []byte { return bytes.Repeat([]byte{b}, n) }

// faulter is a goroutine, locked to its thread, that takes a fault on
// registered memory inside a system call. Kernel-mode faults are the only
// ones a Go test may take on memory its own process serves: the goroutine
// waits in a syscall, where the garbage collector does not need it to stop.
type faulter struct {
	tid  int
	done chan struct{}
	n    int
	err  error
}

func goFault(t testing.TB, f *FD, fn func() (int, error)) *faulter {
	t.Helper()
	fl := &faulter{done: make(chan struct{})}
	tid := make(chan int)
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		tid <- unix.Gettid()
		fl.n, fl.err = fn()
		close(fl.done)
	}()
	fl.tid = <-tid
	t.Cleanup(func() {
		select {
		case <-fl.done:
			return
		default:
		}
		// The test failed before resolving the fault: closing the
		// userfaultfd wakes the thread, which then retries without it.
		f.Close()
		select {
		case <-fl.done:
		case <-time.After(testTimeout):
			t.Errorf("faulting thread %d still blocked after closing the userfaultfd", fl.tid)
		}
	})
	return fl
}

// wait returns the result of the faulting system call.
func (fl *faulter) wait(t testing.TB) (int, error) {
	t.Helper()
	select {
	case <-fl.done:
		return fl.n, fl.err
	case <-time.After(testTimeout):
		t.Fatalf("the faulting system call of thread %d did not complete within %v", fl.tid, testTimeout)
		return 0, nil
	}
}

// requireBlocked checks that the faulting call is still waiting after d.
func (fl *faulter) requireBlocked(t testing.TB, d time.Duration) {
	t.Helper()
	select {
	case <-fl.done:
		t.Fatalf("the faulting system call completed (n=%d, err=%v) although nothing woke it", fl.n, fl.err)
	case <-time.After(d):
	}
}

// kernelRead makes the kernel read mem, by writing it into a pipe: a read
// fault taken in write(2). The pipe's read end returns the data.
func kernelRead(t testing.TB, f *FD, mem []byte) (*faulter, int) {
	t.Helper()
	r, w := pipeT(t)
	return goFault(t, f, func() (int, error) { return unix.Write(w, mem) }), r
}

// kernelWrite makes the kernel write data into mem, by reading it from a
// pipe: a write fault taken in read(2).
func kernelWrite(t testing.TB, f *FD, mem, data []byte) *faulter {
	t.Helper()
	r, w := pipeT(t)
	n, err := unix.Write(w, data)
	require.NoError(t, err)
	require.Equal(t, len(data), n)
	return goFault(t, f, func() (int, error) { return unix.Read(r, mem[:len(data)]) })
}

// readPipe reads exactly n bytes from a pipe.
func readPipe(t testing.TB, r, n int) []byte {
	t.Helper()
	buf := make([]byte, n)
	for got := 0; got < n; {
		m, err := unix.Read(r, buf[got:])
		require.NoError(t, err)
		require.NotZero(t, m, "pipe closed early")
		got += m
	}
	return buf
}

// pollIn waits up to d for f to be readable.
func pollIn(t testing.TB, fd int, d time.Duration) bool {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		left := time.Until(deadline)
		if left < 0 {
			left = 0
		}
		pfd := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		n, err := unix.Poll(pfd, int((left+time.Millisecond-1)/time.Millisecond))
		if err == unix.EINTR {
			continue
		}
		require.NoError(t, err)
		return n > 0
	}
}

// waitMsg returns the next message of f, failing after testTimeout.
func waitMsg(t testing.TB, f *FD) Msg {
	t.Helper()
	deadline := time.Now().Add(testTimeout)
	var msgs [1]Msg
	for {
		n, err := f.ReadMessages(msgs[:])
		require.NoError(t, err)
		if n == 1 {
			return msgs[0]
		}
		if time.Now().After(deadline) {
			t.Fatalf("no message on the userfaultfd within %v", testTimeout)
		}
		pollIn(t, f.Fd(), time.Until(deadline))
	}
}

// requireNoMsg checks that no message arrives within d.
func requireNoMsg(t testing.TB, f *FD, d time.Duration) {
	t.Helper()
	pollIn(t, f.Fd(), d)
	var msgs [1]Msg
	n, err := f.ReadMessages(msgs[:])
	require.NoError(t, err)
	require.Zero(t, n, "unexpected message %v", msgs[0])
}

// The C helper (testdata/helper.c) plays a client process: it creates a
// userfaultfd, registers memory, passes the fd to the test over a socket
// and then generates events or faults the test serves with this package.

var helperBuild struct {
	once      sync.Once
	dir, path string
	err       error
}

func helperBinary(t testing.TB) string {
	t.Helper()
	gcc, err := exec.LookPath("gcc")
	if err != nil {
		t.Skip("gcc is not installed: the test needs it to build testdata/helper.c")
	}
	helperBuild.once.Do(func() {
		helperBuild.dir, helperBuild.err = os.MkdirTemp("", "uffd-helper-")
		if helperBuild.err != nil {
			return
		}
		path := filepath.Join(helperBuild.dir, "helper")
		out, err := exec.Command(gcc, "-O2", "-Wall", "-Werror", "-o", path, "testdata/helper.c").CombinedOutput()
		if err != nil {
			helperBuild.err = errors.New("gcc testdata/helper.c: " + err.Error() + "\n" + string(out))
			return
		}
		helperBuild.path = path
	})
	require.NoError(t, helperBuild.err)
	return helperBuild.path
}

func cleanupHelper() {
	if helperBuild.dir != "" {
		os.RemoveAll(helperBuild.dir)
	}
}

type helperProc struct {
	cmd    *exec.Cmd
	sock   int
	stderr *os.File
	f      *FD               // the helper's userfaultfd, received at start
	init   map[string]uint64 // the values of its "init" message
}

// startHelper runs the helper and receives its userfaultfd.
func startHelper(t testing.TB, args ...string) *helperProc {
	t.Helper()
	bin := helperBinary(t)
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	require.NoError(t, err)
	childEnd := os.NewFile(uintptr(fds[1]), "helper-socket")
	stderr, err := os.CreateTemp(t.TempDir(), "helper-output")
	require.NoError(t, err)
	h := &helperProc{cmd: exec.Command(bin, args...), sock: fds[0], stderr: stderr}
	h.cmd.ExtraFiles = []*os.File{childEnd} // fd 3 in the helper
	h.cmd.Stdout, h.cmd.Stderr = stderr, stderr
	err = h.cmd.Start()
	childEnd.Close()
	if err != nil {
		unix.Close(h.sock)
		stderr.Close()
		require.NoError(t, err)
	}
	t.Cleanup(func() {
		h.cmd.Process.Kill()
		h.cmd.Wait()
		unix.Close(h.sock)
		if t.Failed() {
			out, _ := os.ReadFile(stderr.Name())
			t.Logf("helper output:\n%s", out)
		}
		stderr.Close()
	})
	require.NoError(t, unix.SetsockoptTimeval(h.sock, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &unix.Timeval{Sec: int64(testTimeout / time.Second)}))

	buf := make([]byte, 512)
	oob := make([]byte, unix.CmsgSpace(4))
	n, oobn, _, _, err := unix.Recvmsg(h.sock, buf, oob, unix.MSG_CMSG_CLOEXEC)
	require.NoError(t, err, "receiving the helper's userfaultfd")
	scms, err := unix.ParseSocketControlMessage(oob[:oobn])
	require.NoError(t, err)
	require.Len(t, scms, 1)
	rights, err := unix.ParseUnixRights(&scms[0])
	require.NoError(t, err)
	require.Len(t, rights, 1)
	h.f = NewFD(rights[0])
	t.Cleanup(func() { h.f.Close() })
	word, kv := parseHelperMsg(t, string(buf[:n]))
	require.Equal(t, "init", word)
	h.init = kv
	return h
}

func parseHelperMsg(t testing.TB, s string) (string, map[string]uint64) {
	t.Helper()
	fields := strings.Fields(s)
	require.NotEmpty(t, fields, "empty helper message")
	kv := make(map[string]uint64)
	for _, f := range fields[1:] {
		k, v, ok := strings.Cut(f, "=")
		require.True(t, ok, "helper message %q", s)
		n, err := strconv.ParseUint(v, 0, 64)
		require.NoError(t, err, "helper message %q", s)
		kv[k] = n
	}
	return fields[0], kv
}

// expect receives the helper's next message, which must start with word.
func (h *helperProc) expect(t testing.TB, word string) map[string]uint64 {
	t.Helper()
	buf := make([]byte, 512)
	n, err := unix.Read(h.sock, buf)
	for err == unix.EINTR {
		// The runtime's preemption signal interrupts a raw read (seen
		// once in a full run); the message is still coming.
		n, err = unix.Read(h.sock, buf)
	}
	require.NoError(t, err, "waiting for the helper's %q message", word)
	require.NotZero(t, n, "the helper closed its socket before %q", word)
	got, kv := parseHelperMsg(t, string(buf[:n]))
	require.Equal(t, word, got, "helper message %q", buf[:n])
	return kv
}

// proceed lets the helper go on.
func (h *helperProc) proceed(t testing.TB) {
	t.Helper()
	_, err := unix.Write(h.sock, []byte{'g'})
	require.NoError(t, err)
}

// exit waits for the helper to exit and checks its status.
func (h *helperProc) exit(t testing.TB) {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- h.cmd.Wait() }()
	select {
	case err := <-done:
		require.NoError(t, err, "helper exit")
	case <-time.After(testTimeout):
		t.Fatal("the helper did not exit")
	}
}
