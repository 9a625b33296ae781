package integration

import (
	"bufio"
	"bytes"
	"encoding/json"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/softuvm/softuvm/internal/proctest"
	"github.com/softuvm/softuvm/uvm"
)

// Policies of a program's own, on the servers of C programs and Go
// programs: the coursework policies in a uvm binary built with package
// cli (policy/coursework/cmd/uvm-coursework), and a policy that package
// main registers, after package uvm has initialized
// (testdata/latepolicy).

// buildGo builds a command of this module into binDir.
func buildGo(t *testing.T, name, pkg string) string {
	t.Helper()
	out := filepath.Join(binDir, name)
	cmd := exec.Command("go", "build", "-o", out, pkg)
	cmd.Dir = ".."
	b, err := cmd.CombinedOutput()
	require.NoError(t, err, "go build %s:\n%s", pkg, b)
	return out
}

// blocksC builds testdata/policy/blocks.c once.
func blocksC(t *testing.T) string {
	t.Helper()
	if p := filepath.Join(binDir, "blocks"); fileExists(p) {
		return p
	}
	return buildC(t, "blocks", "testdata/policy/blocks.c")
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

// policyEnv is the environment of blocks.c: one device of three blocks,
// and the variables given.
func policyEnv(extra ...string) []string {
	return append(append(os.Environ(), "UVM_DEVICES=1", "UVM_ARENA_SIZE=6MiB", "UVM_DEVICE_WORKERS=2"), extra...)
}

// cProgram is blocks.c running, stopped after its work until finish.
type cProgram struct {
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	stdout *syncBuf
	stderr *syncBuf
}

// startBlocks runs blocks.c in mode and waits for it to say "ready".
func startBlocks(t *testing.T, env []string, mode string) *cProgram {
	t.Helper()
	p := &cProgram{cmd: exec.Command(blocksC(t), mode), stdout: &syncBuf{}, stderr: &syncBuf{}}
	p.cmd.Env = env
	var err error
	p.stdin, err = p.cmd.StdinPipe()
	require.NoError(t, err)
	out, err := p.cmd.StdoutPipe()
	require.NoError(t, err)
	p.cmd.Stderr = p.stderr
	require.NoError(t, p.cmd.Start())
	t.Cleanup(func() { p.cmd.Process.Kill() })
	r := bufio.NewReader(out)
	ready := make(chan string, 1)
	go func() {
		line, _ := r.ReadString('\n')
		ready <- line
		io.Copy(p.stdout, r)
	}()
	select {
	case line := <-ready:
		require.Equal(t, "ready\n", line, "blocks %s: stderr: %s", mode, p.stderr.String())
	case <-time.After(30 * time.Second):
		t.Fatalf("blocks %s did not get its work done: %s", mode, p.stderr.String())
	}
	return p
}

// finish lets the program check its data, and wants it to succeed.
func (p *cProgram) finish(t *testing.T) {
	t.Helper()
	closeAndWait(t, "blocks", p.stdin, p.cmd, 30*time.Second, p.stderr.String)
	assert.Contains(t, p.stdout.String(), "blocks: OK")
}

// privateServerOf finds the private server a C program started: its
// child process named softuvm-server.
func privateServerOf(t *testing.T, pid int) int {
	t.Helper()
	server, err := proctest.ServerChild(pid)
	require.NoError(t, err)
	require.NotZero(t, server, "no private server is a child of pid %d", pid)
	return server
}

// serverReport is `bin stat ... --count 1 --json`: the server's own
// account of its configuration and of what it did.
func serverReport(t *testing.T, bin string, where ...string) (uvm.Info, uvm.Stats) {
	t.Helper()
	cmd := exec.Command(bin, append([]string{"stat", "--count", "1", "--json"}, where...)...)
	var errOut bytes.Buffer
	cmd.Stderr = &errOut
	out, err := cmd.Output()
	require.NoError(t, err, "%s stat %v: %s", bin, where, errOut.String())
	var frame struct {
		Info  uvm.Info  `json:"info"`
		Stats uvm.Stats `json:"stats"`
	}
	require.NoError(t, json.Unmarshal(out, &frame), "%s", out)
	return frame.Info, frame.Stats
}

// evictTable is what blocks.c's evict mode makes a server do, by its
// eviction policy (see blocks.c): the pages evicted from device 0 and the
// pages moved to it.
var evictTable = map[string]struct{ evicted, moved uint64 }{
	"lru": {2 * 512, 5 * 512},
	"mru": {1 * 512, 4 * 512},
}

// checkEvict checks a server's report of blocks.c's evict mode.
func checkEvict(t *testing.T, in uvm.Info, st uvm.Stats, eviction, like string) {
	t.Helper()
	want := evictTable[like]
	assert.Equal(t, eviction, in.Eviction, "the server's eviction policy")
	assert.Equal(t, want.evicted, st.EvictedPages(0), "pages evicted from device 0 under %s (%s's choice)", eviction, like)
	assert.Equal(t, want.moved, st.MigratedPages(uvm.CPU, 0), "pages moved to device 0 under %s (%s's choice)", eviction, like)
}

// startDaemon runs `bin serve` on a socket in a fresh directory with a
// device of three blocks, and returns the socket once it listens. Its
// log is a file: its guard, and servers that take over, write there too
// and outlive it.
func startDaemon(t *testing.T, bin string, flags ...string) (string, *exec.Cmd, logFileT) {
	t.Helper()
	dir := t.TempDir()
	sock := filepath.Join(dir, "uvm.sock")
	d := exec.Command(bin, append([]string{"serve", "--socket", sock, "--devices", "1", "--arena-size", "6MiB"}, flags...)...)
	log := logFile(t, dir, "daemon")
	d.Stderr = log.f
	require.NoError(t, d.Start())
	t.Cleanup(func() {
		d.Process.Signal(syscall.SIGTERM)
		d.Wait()
	})
	eventually(t, 10*time.Second, func() bool { return strings.Contains(log.String(), "listening on") }, "%s serve did not start: %s", bin, log)
	return sock, d, log
}

// stopAtEnd ends process pid, if it still runs, when the test ends: the
// guard and the servers of a daemon the test killed are nobody's
// children to wait for.
func stopAtEnd(t *testing.T, pid int) {
	t.Cleanup(func() {
		if pid > 0 && running(pid) {
			syscall.Kill(pid, syscall.SIGKILL)
		}
	})
}

// runUVMBin runs `bin run` on a shell that prints the UVM_BIN its libuvm
// would start a private server from, and returns that.
func runUVMBin(t *testing.T, bin string, flags ...string) string {
	t.Helper()
	lib := filepath.Join(binDir, "libuvm-preload.so")
	args := append(append([]string{"run", "--quiet", "--preload", lib}, flags...), "--", "sh", "-c", `printf %s "$UVM_BIN"`)
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), "UVM_BIN=/nonexistent/uvm")
	var errOut bytes.Buffer
	cmd.Stderr = &errOut
	out, err := cmd.Output()
	require.NoError(t, err, "%s %v: %s", bin, args, errOut.String())
	return string(out)
}

// TestCustomBinaryForC: a uvm built with package cli and the coursework
// policies serves C programs with them, as their private server (UVM_BIN)
// and as a daemon, and its own report says so; the stock uvm refuses
// them and says how to get them.
func TestCustomBinaryForC(t *testing.T) {
	requireRoot(t)
	custom := buildGo(t, "uvm-coursework", "./policy/coursework/cmd/uvm-coursework")

	out, _, err := runCmd(custom, nil, "help")
	require.NoError(t, err)
	assert.Regexp(t, `(?m)^  eviction +lru, 2q, clock\[:regions\|copy\], reuse, mru \(`, out, "help lists the linked-in eviction policy")
	assert.Regexp(t, `(?m)^  prefetch +.*, evens \(`, out, "help lists the linked-in prefetch policy")
	out, _, err = runCmd(custom, nil, "info", "--json")
	require.NoError(t, err)
	var mi struct {
		Policies []struct {
			Kind  string   `json:"kind"`
			Names []string `json:"names"`
		} `json:"policies"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &mi), out)
	known := map[string][]string{}
	for _, k := range mi.Policies {
		known[k.Kind] = k.Names
	}
	assert.Equal(t, []string{"lru", "2q", "clock[:regions|copy]", "reuse", "mru"}, known["eviction"])
	assert.Contains(t, known["prefetch"], "evens")

	t.Run("private", func(t *testing.T) {
		for _, eviction := range []string{"mru", "lru"} {
			p := startBlocks(t, policyEnv("UVM_BIN="+custom, "UVM_SERVER=private", "UVM_EVICTION="+eviction), "evict")
			in, st := serverReport(t, custom, "--pid", strconv.Itoa(privateServerOf(t, p.cmd.Process.Pid)))
			checkEvict(t, in, st, eviction, eviction)
			p.finish(t)
		}
		p := startBlocks(t, policyEnv("UVM_BIN="+custom, "UVM_SERVER=private", "UVM_PREFETCH=evens"), "touch")
		in, st := serverReport(t, custom, "--pid", strconv.Itoa(privateServerOf(t, p.cmd.Process.Pid)))
		assert.Equal(t, "evens", in.Prefetch)
		assert.Equal(t, uint64(256), st.PrefetchedPages, "a write to page 5 of a fresh block brings its 256 even pages")
		p.finish(t)
	})

	t.Run("daemon", func(t *testing.T) {
		sock, _, log := startDaemon(t, custom, "--eviction", "mru")
		p := startBlocks(t, policyEnv("UVM_SERVER=daemon", "UVM_SOCKET="+sock), "evict")
		in, st := serverReport(t, custom, "--socket", sock)
		checkEvict(t, in, st, "mru", "mru")
		p.finish(t)
		assert.NotContains(t, log.String(), "poison")
	})

	t.Run("run", func(t *testing.T) {
		assert.Equal(t, custom, runUVMBin(t, custom, "--eviction", "mru"), "uvm run points the program's libuvm at the binary that runs it")
	})

	t.Run("stock uvm", func(t *testing.T) {
		cmd := exec.Command(blocksC(t), "evict")
		cmd.Env = policyEnv("UVM_BIN="+filepath.Join(binDir, "uvm"), "UVM_SERVER=private", "UVM_EVICTION=mru")
		out, err := cmd.CombinedOutput()
		require.Error(t, err, "%s", out)
		assert.Contains(t, string(out), `eviction policy "mru": want one of lru`)
		assert.Contains(t, string(out), "calls cli.Main, and set UVM_BIN to it")
	})
}

// runCmd runs bin with args and returns stdout, stderr and the error.
func runCmd(bin string, env []string, args ...string) (string, string, error) {
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), env...)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	return out.String(), errOut.String(), err
}

// TestPolicyRegisteredByMain: policies registered by package main's init
// function, which runs after package uvm's, reach every server of a
// program whose main calls uvm.Main first: its private server (named in
// its configuration, or by an allocation), the one that takes over when
// that dies, the daemon and the one that takes over from it, `run`'s
// server, and a C program's private server from it. A program that forgets uvm.Main, or
// names a policy nobody registered, is told what to do.
func TestPolicyRegisteredByMain(t *testing.T) {
	requireRoot(t)
	late := buildGo(t, "latepolicy", "./integration/testdata/latepolicy")

	// With late-mru the server's configuration names a late policy; with
	// mru only an allocation does (late-evens, per allocation), which the
	// server cannot tell from its configuration.
	for _, eviction := range []string{"late-mru", "mru"} {
		t.Run("private "+eviction, func(t *testing.T) {
			out, errOut, err := runCmd(late, nil, "client", eviction)
			require.NoError(t, err, "stderr: %s", errOut)
			var rep struct {
				Eviction          string   `json:"eviction"`
				Evicted           []uint64 `json:"evicted"`
				Prefetched        uint64   `json:"prefetched"`
				AdoptedPrefetched uint64   `json:"adopted_prefetched"`
				AdoptedEviction   string   `json:"adopted_eviction"`
				Restarts          uint64   `json:"restarts"`
			}
			require.NoError(t, json.Unmarshal([]byte(out), &rep), out)
			assert.Equal(t, eviction, rep.Eviction)
			assert.Equal(t, []uint64{0, 0, 512, 0}, rep.Evicted, "MRU's victim: the allocation that arrived last before the fourth")
			assert.Equal(t, uint64(256), rep.Prefetched, "late-evens brought the 256 even pages of the block")
			assert.Equal(t, uint64(1), rep.Restarts, "the killed server was replaced: %s", errOut)
			assert.Equal(t, eviction, rep.AdoptedEviction, "the server that took over built the policy too")
			assert.Equal(t, uint64(256), rep.AdoptedPrefetched, "the server that took over rebuilt the allocation's late-evens")
		})
	}

	t.Run("without Main", func(t *testing.T) {
		_, errOut, err := runCmd(late, []string{"LATEPOLICY_WITHOUT_MAIN=1"}, "client", "late-mru")
		assert.Equal(t, 1, exitCode(err), errOut)
		for _, want := range []string{`eviction policy "late-mru" is registered after package uvm initialized`, "knows eviction policies 2q, clock, lru, mru", "call uvm.Main() first in main"} {
			assert.Contains(t, errOut, want)
		}
	})

	t.Run("without Main, per allocation", func(t *testing.T) {
		_, errOut, err := runCmd(late, []string{"LATEPOLICY_WITHOUT_MAIN=1"}, "client", "mru")
		assert.Equal(t, 1, exitCode(err), errOut)
		for _, want := range []string{`prefetch policy "late-evens" is registered after package uvm initialized`, "call uvm.Main() first in main"} {
			assert.Contains(t, errOut, want)
		}
	})

	t.Run("unregistered", func(t *testing.T) {
		_, errOut, err := runCmd(late, nil, "client", "nosuch")
		assert.Equal(t, 1, exitCode(err), errOut)
		for _, want := range []string{`eviction policy "nosuch": want one of lru, 2q, clock[:regions|copy], reuse, late-mru, mru`, "init function registers it", "call uvm.Main() first in main"} {
			assert.Contains(t, errOut, want)
		}
	})

	t.Run("C private", func(t *testing.T) {
		p := startBlocks(t, policyEnv("UVM_BIN="+late, "UVM_SERVER=private", "UVM_EVICTION=late-mru"), "evict")
		in, st := serverReport(t, late, "--pid", strconv.Itoa(privateServerOf(t, p.cmd.Process.Pid)))
		checkEvict(t, in, st, "late-mru", "mru")
		p.finish(t)
	})

	t.Run("daemon", func(t *testing.T) {
		sock, d, log := startDaemon(t, late, "--eviction", "late-mru")
		p := startBlocks(t, policyEnv("UVM_SERVER=daemon", "UVM_SOCKET="+sock), "evict")
		in, st := serverReport(t, late, "--socket", sock)
		checkEvict(t, in, st, "late-mru", "mru")
		stopAtEnd(t, in.Restart.GuardPID)
		require.NoError(t, d.Process.Kill())
		var took uvm.Info
		eventually(t, 20*time.Second, func() bool {
			cmd := exec.Command(late, "stat", "--count", "1", "--json", "--socket", sock)
			out, err := cmd.Output()
			var frame struct {
				Info uvm.Info `json:"info"`
			}
			if err != nil || json.Unmarshal(out, &frame) != nil {
				return false
			}
			took = frame.Info
			return took.Restart.Restarts == 1
		}, "no server took over from the killed daemon: %s", log)
		stopAtEnd(t, took.PID)
		assert.Equal(t, "late-mru", took.Eviction, "the server that took over built the policy too")
		p.finish(t)
		assert.NotContains(t, log.String(), "poison")
		// The daemon the test started is dead: stop the one that took over.
		syscall.Kill(took.PID, syscall.SIGTERM)
		eventually(t, 10*time.Second, func() bool { return !running(took.PID) }, "pid %d did not exit on SIGTERM", took.PID)
	})

	t.Run("run", func(t *testing.T) {
		assert.Equal(t, late, runUVMBin(t, late, "--eviction", "late-mru"), "run's server started, and the program's libuvm is pointed at this binary")
	})
}
