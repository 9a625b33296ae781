package cli

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/softuvm/softuvm/uvm"
)

func TestRunEnv(t *testing.T) {
	env := runEnv([]string{"PATH=/bin", "LD_PRELOAD=/a.so /b.so", "UVM_SOCKET=/old", "UVM_SERVER=private", "UVM_MIN_SIZE=7", "UVM_HEAP=system", "UVM_STATICS=1", "UVM_BIN=/usr/bin/uvm", "HOME=/root"},
		"/tmp/x/uvm.sock", 65536, "managed", false, "/lib/libuvm-preload.so", "/opt/course/uvm-course")
	assert.Equal(t, []string{"PATH=/bin", "HOME=/root", "GLIBC_TUNABLES=glibc.rtld.optional_static_tls=16384", "UVM_SOCKET=/tmp/x/uvm.sock", "UVM_SERVER=daemon", "UVM_BIN=/opt/course/uvm-course", "UVM_MIN_SIZE=65536", "UVM_HEAP=managed", "UVM_STATICS=0",
		"LD_PRELOAD=/lib/libuvm-preload.so:/a.so /b.so"}, env, "ours replace the caller's (UVM_BIN: the running binary, with its policies); the library goes ahead of the caller's preloads")
	env = runEnv([]string{"LD_PRELOAD="}, "/s", 1, "system", true, "/l.so", "/u")
	assert.Contains(t, env, "UVM_STATICS=1")
	assert.Contains(t, env, "LD_PRELOAD=/l.so", "an empty LD_PRELOAD leaves no stray colon")
	assert.NotContains(t, strings.Join(env, " "), "GLIBC_TUNABLES", "the system heap loads no jemalloc")
	env = runEnv([]string{"GLIBC_TUNABLES=glibc.malloc.check=3"}, "/s", 1, "managed", true, "/l.so", "/u")
	assert.Contains(t, env, "GLIBC_TUNABLES=glibc.malloc.check=3:glibc.rtld.optional_static_tls=16384", "the caller's tunables are kept")
	env = runEnv([]string{"GLIBC_TUNABLES=glibc.rtld.optional_static_tls=65536"}, "/s", 1, "managed", true, "/l.so", "/u")
	assert.Contains(t, env, "GLIBC_TUNABLES=glibc.rtld.optional_static_tls=65536", "the caller's own static TLS size is kept")
}

func TestHumanSize(t *testing.T) {
	for n, want := range map[uint64]string{
		0: "0 B", 1023: "1023 B", 1024: "1 KiB", 1536: "1.5 KiB", 16 << 20: "16 MiB",
		19482324 << 10: "18.6 GiB", 3<<40 + 1: "3.0 TiB",
	} {
		assert.Equal(t, want, humanSize(n), "%d bytes", n)
	}
}

func TestFindPreload(t *testing.T) {
	dir := t.TempDir()
	lib := filepath.Join(dir, preloadName)
	require.NoError(t, os.WriteFile(lib, nil, 0o644))

	got, err := findPreload(lib)
	require.NoError(t, err)
	assert.Equal(t, lib, got)
	_, err = findPreload(filepath.Join(dir, "missing.so"))
	assert.ErrorContains(t, err, "--preload "+filepath.Join(dir, "missing.so"))
	_, err = findPreload(dir)
	assert.ErrorContains(t, err, "a directory, want the path of "+preloadName)

	t.Setenv("UVM_PRELOAD", lib)
	got, err = findPreload("")
	require.NoError(t, err)
	assert.Equal(t, lib, got, "UVM_PRELOAD when there is no flag")
	t.Setenv("UVM_PRELOAD", "")
	// The test binary has no library beside it, and with no compiler none
	// can be built: both places are named, and what to do.
	cache := t.TempDir()
	t.Setenv("XDG_CACHE_HOME", cache)
	path := os.Getenv("PATH")
	t.Setenv("PATH", t.TempDir())
	t.Setenv("CC", "")
	_, err = findPreload("")
	exe, _ := os.Executable()
	exe, _ = filepath.EvalSymlinks(exe)
	assert.ErrorContains(t, err, "cannot find "+preloadName+": not at "+filepath.Join(filepath.Dir(exe), preloadName)+" or "+
		filepath.Join(filepath.Dir(filepath.Dir(exe)), "lib", preloadName)+", neither --preload nor UVM_PRELOAD names it, "+
		"and it cannot be built from the sources in this uvm: no C compiler: CC is not set, and neither cc nor gcc is in PATH\n"+
		"Install a C compiler (apt-get install gcc, or set CC), or build the library with `make lib`")

	// A flag or variable naming a missing file is an error even where a
	// build would succeed.
	t.Setenv("PATH", path)
	t.Setenv("UVM_PRELOAD", filepath.Join(dir, "missing.so"))
	_, err = findPreload("")
	assert.ErrorContains(t, err, "UVM_PRELOAD "+filepath.Join(dir, "missing.so")+": ")
	built, _ := os.ReadDir(cache)
	assert.Empty(t, built, "nothing built")
}

func TestRunReportAndSummary(t *testing.T) {
	st := uvm.Stats{
		Allocations: 2, AllocatedBytes: 3 << 20,
		Faults: []uvm.ProcessorFaults{{Processor: uvm.CPU, Missing: 10, WriteProtect: 2}, {Processor: 0, Missing: 4}},
		Migrations: []uvm.Migration{
			{From: uvm.CPU, To: 0, Pages: 100, Bytes: 100 * uvm.PageSize},
			{From: 0, To: uvm.CPU, Pages: 60, Bytes: 60 * uvm.PageSize},
			{From: 0, To: 1, Pages: 5, Bytes: 5 * uvm.PageSize}, // peer traffic is neither way
		},
		Evicted: []uvm.ProcessorPages{{Processor: uvm.CPU, Pages: 90}, {Processor: 0, Pages: 3}},
		FaultService: uvm.Histogram{Count: 16, SumNS: 16000, MaxNS: 4000,
			Buckets: []uvm.Bucket{{UpperNS: 1000, Count: 15}, {UpperNS: 4096, Count: 1}}},
	}
	cfg := uvm.DefaultServerConfig()
	cfg.HostBudget = 4 << 20
	rep := makeRunReport([]string{"prog", "x"}, syscall.WaitStatus(3<<8), 1500*time.Millisecond, 1<<20, cfg, st)
	rep.HostPeakBytes = 5 << 20
	assert.Equal(t, 3, rep.ExitStatus)
	assert.Empty(t, rep.Signal)
	assert.Equal(t, uint64(100*uvm.PageSize), rep.HostToDeviceBytes)
	assert.Equal(t, uint64(60*uvm.PageSize), rep.DeviceToHostBytes)
	assert.Equal(t, uint64(93), rep.EvictedPages)
	assert.Equal(t, int64(1000), rep.FaultServiceP50NS)
	assert.Equal(t, int64(4000), rep.FaultServiceP99NS)
	assert.Equal(t, 1, rep.Devices)

	var b strings.Builder
	renderRunSummary(&b, "prog", rep)
	for _, want := range []string{
		"uvm run: prog exited with status 3 after 1.50s",
		"managed allocations  2 (3 MiB), threshold 1 MiB",
		"faults               cpu 12 (missing 10, minor 0, write-protect 2); device 0 4 (missing 4, minor 0, write-protect 0)",
		"copied               host -> device 400 KiB, device -> host 240 KiB",
		"cpu -> device 0",
		"evicted              93 pages (372 KiB), host budget 4 MiB",
		"host peak            5 MiB of managed memory on the host at once",
		"fault service        16 faults: p50 1µs, p99 4µs, max 4µs",
	} {
		assert.Contains(t, b.String(), want)
	}

	killed := makeRunReport([]string{"prog"}, syscall.WaitStatus(syscall.SIGKILL), time.Second, 1<<20, cfg, uvm.Stats{})
	assert.Equal(t, 137, killed.ExitStatus)
	assert.Equal(t, "SIGKILL", killed.Signal)
	assert.NotNil(t, killed.Faults, "JSON says [] rather than null")
	b.Reset()
	renderRunSummary(&b, "prog", killed)
	assert.Contains(t, b.String(), "uvm run: prog was killed by SIGKILL (status 137)")
	assert.Contains(t, b.String(), "faults               none")
	assert.Contains(t, b.String(), "fault service        no faults")
	assert.NotContains(t, b.String(), "host peak", "no peak known: no line")
}

// staticallyLinked tells a program LD_PRELOAD cannot reach (no ELF
// interpreter) from one it can, and from a script.
func TestStaticallyLinked(t *testing.T) {
	dir := t.TempDir()
	script := filepath.Join(dir, "script")
	require.NoError(t, os.WriteFile(script, []byte("#!/bin/sh\nexit 0\n"), 0o755))
	assert.False(t, staticallyLinked(script), "a script: its interpreter runs")
	assert.False(t, staticallyLinked(filepath.Join(dir, "missing")), "nothing there")
	sh, err := exec.LookPath("sh")
	require.NoError(t, err)
	assert.False(t, staticallyLinked(sh), "%s is dynamically linked", sh)

	cc, err := exec.LookPath("cc")
	if err != nil {
		t.Skip("no C compiler to build a static program")
	}
	src := filepath.Join(dir, "p.c")
	require.NoError(t, os.WriteFile(src, []byte("int main(void) { return 0; }\n"), 0o644))
	dynamic := filepath.Join(dir, "dynamic")
	out, err := exec.Command(cc, "-o", dynamic, src).CombinedOutput()
	require.NoError(t, err, "%s", out)
	assert.False(t, staticallyLinked(dynamic))
	for _, flag := range []string{"-static", "-static-pie"} {
		static := filepath.Join(dir, "static"+flag)
		if out, err := exec.Command(cc, flag, "-o", static, src).CombinedOutput(); err != nil {
			t.Logf("cc %s: %v: %s (no static C library here?)", flag, err, out)
			continue
		}
		assert.True(t, staticallyLinked(static), "cc %s", flag)
	}
}
