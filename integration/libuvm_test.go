package integration

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/softuvm/softuvm/trace"
)

// buildC compiles C sources against uvm.h and the static libuvm into
// binDir/name.
func buildC(t *testing.T, name string, sources ...string) string {
	t.Helper()
	return compileC(t, name, sources, filepath.Join(binDir, "libuvm.a"))
}

// buildCShared is buildC against the shared libuvm.so, as a program
// built with pkg-config's flags links: what it calls must be exported.
func buildCShared(t *testing.T, name string, sources ...string) string {
	t.Helper()
	return compileC(t, name, sources, "-L"+binDir, "-Wl,-rpath,"+binDir, "-luvm")
}

func compileC(t *testing.T, name string, sources []string, lib ...string) string {
	t.Helper()
	out := filepath.Join(binDir, name)
	args := []string{"-O1", "-g", "-Wall", "-Wextra", "-Werror", "-std=gnu11", "-I../libuvm/include", "-I../libuvm/tests", "-o", out}
	args = append(args, sources...)
	args = append(args, lib...)
	args = append(args, "-pthread", "-lm")
	cmd := exec.Command("gcc", args...)
	b, err := cmd.CombinedOutput()
	require.NoError(t, err, "gcc %s:\n%s", strings.Join(args, " "), b)
	return out
}

// cEnv is the environment C tests run in: a private server from the
// freshly built uvm, two small devices.
func cEnv(extra ...string) []string {
	env := append(os.Environ(), "UVM_BIN="+filepath.Join(binDir, "uvm"), "UVM_SERVER=private",
		"UVM_DEVICES=2", "UVM_ARENA_SIZE=64MiB", "UVM_DEVICE_WORKERS=2")
	return append(env, extra...)
}

// TestLibuvm runs each C test of libuvm/tests: one program per file,
// built against the static library, which prints "N checks passed".
func TestLibuvm(t *testing.T) {
	requireRoot(t)
	files, err := filepath.Glob("../libuvm/tests/*_test.c")
	require.NoError(t, err)
	require.NotEmpty(t, files, "no C tests found")
	for _, f := range files {
		name := strings.TrimSuffix(filepath.Base(f), ".c")
		t.Run(name, func(t *testing.T) {
			bins := []string{buildC(t, name, f)}
			if name == "cuda_test" { // managed variables handed over to the shared library too
				bins = append(bins, buildCShared(t, name+"_shared", f))
			}
			for _, bin := range bins {
				runCTest(t, name, bin)
			}
		})
	}
}

// runCTest runs the C test name, built as bin, under the environments it
// wants.
func runCTest(t *testing.T, name, bin string) {
	envs := [][]string{nil}
	if name == "access_test" { // under both ways of counting, with hint faults often
		envs = [][]string{{"UVM_ACCESS_COUNTING=auto", "UVM_ACCESS_POLICY=period=5ms"}, {"UVM_ACCESS_COUNTING=user", "UVM_ACCESS_POLICY=period=5ms"}}
	}
	if name == "coherence_test" { // under both coherence models
		envs = [][]string{nil, {"UVM_COHERENCE=launch"}, {"UVM_COHERENCE=launch", "UVM_DIRTY_TRACKING=wp-fault"}}
	}
	if name == "fork_stress_test" { // arenas of half its allocation: eviction with faults in flight
		envs = [][]string{{"UVM_ARENA_SIZE=8MiB"}, {"UVM_ARENA_SIZE=8MiB", "UVM_LARGE_FOLIOS=off"}}
	}
	if name == "layout_test" { // host faults bring no neighbours: every other page written makes a run
		envs = [][]string{{"UVM_PREFETCH=none"}}
	}
	if name == "memory_test" || name == "stream_test" { // with location files of 4 KiB folios too
		envs = [][]string{nil, {"UVM_LARGE_FOLIOS=off"}}
	}
	for _, extra := range envs {
		cmd := exec.Command(bin)
		cmd.Env = cEnv(extra...)
		if name == "profiler_test" {
			cmd.Dir = t.TempDir() // where its trace goes
		}
		out, err := cmd.CombinedOutput()
		require.NoError(t, err, "%s %v:\n%s", name, extra, out)
		assert.Contains(t, string(out), "checks passed")
		for _, bad := range []string{"poisoned", "panic:", "fatal error:"} {
			assert.NotContains(t, string(out), bad, "the server, its guard or a device process went wrong")
		}
		if name == "profiler_test" {
			checkProfiledTrace(t, string(out), filepath.Join(cmd.Dir, "profiler_test.uvmtrace"))
		}
	}
}

// checkProfiledTrace checks the trace profiler_test.c recorded between
// uvmProfilerStart and uvmProfilerStop: the one allocation it made there,
// and its pages' trip to device 0 and back, and nothing else.
func checkProfiledTrace(t *testing.T, out, path string) {
	m := regexp.MustCompile(`profiled: allocation (0x[0-9a-f]+), (\d+) pages`).FindStringSubmatch(out)
	require.NotNil(t, m, "profiler_test printed no allocation:\n%s", out)
	addr, err := strconv.ParseUint(m[1], 0, 64)
	require.NoError(t, err)
	pages, err := strconv.ParseUint(m[2], 10, 64)
	require.NoError(t, err)
	_, events, err := trace.ReadFile(path)
	require.NoError(t, err, "the trace must be whole: uvmProfilerStop completes it")
	var allocs []uint64
	moved := map[[2]int32]uint64{}
	for _, e := range events {
		switch e.Kind {
		case trace.KindAlloc:
			allocs = append(allocs, e.Addr)
		case trace.KindMigration:
			moved[[2]int32{e.From, e.To}] += uint64(e.Pages)
		}
	}
	assert.Equal(t, []uint64{addr}, allocs, "the allocation made between start and stop, alone")
	assert.Equal(t, map[[2]int32]uint64{{-1, 0}: pages, {0, -1}: pages}, moved, "its pages to device 0 and back, and no other migration")
}
