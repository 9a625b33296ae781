package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Tests of a uvm with no libuvm-preload.so beside it (as `go build` or
// `go install` leave it): `uvm run` builds the library from the sources
// in the binary into the cache on first use, and reuses it after.

// buildLoneUVM builds cmd/uvm into an empty directory, so that no
// library is beside it or in ../lib from it.
func buildLoneUVM(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "bin", "uvm")
	cmd := exec.Command("go", "build", "-o", bin, "../cmd/uvm")
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "go build:\n%s", out)
	entries, err := os.ReadDir(filepath.Dir(bin))
	require.NoError(t, err)
	require.Len(t, entries, 1, "only uvm in its directory")
	return bin
}

// loneEnv is the test's environment without anything that names or
// builds the library, plus extra.
func loneEnv(extra ...string) []string {
	var env []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(k, "UVM_") || k == "CC" || k == "XDG_CACHE_HOME" || k == "LD_PRELOAD" {
			continue
		}
		env = append(env, kv)
	}
	return append(env, extra...)
}

type loneRun struct {
	stdout, stderr string
	code           int
}

func runLone(t *testing.T, env []string, argv ...string) loneRun {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Env = env
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	require.NoError(t, ctx.Err(), "%s did not finish; stderr:\n%s", strings.Join(argv, " "), stderr.String())
	r := loneRun{stdout: stdout.String(), stderr: stderr.String()}
	if err != nil {
		ee, ok := err.(*exec.ExitError)
		require.True(t, ok, "%s: %v", strings.Join(argv, " "), err)
		r.code = ee.ExitCode()
	}
	return r
}

// bigAlloc allocates 8 MiB, writes it, reads a byte of each page back,
// and prints the library preloaded and the sum.
const bigAlloc = `#include <stdio.h>
#include <stdlib.h>
#include <string.h>
int main(void)
{
	size_t n = 8 << 20;
	char *p = malloc(n);
	if (!p)
		return 1;
	memset(p, 7, n);
	long sum = 0;
	for (size_t i = 0; i < n; i += 4096)
		sum += p[i];
	printf("%s %ld\n", getenv("LD_PRELOAD"), sum);
	free(p);
	return 0;
}
`

// forkAfterSmallMallocs fills 2,000 small allocations (jemalloc's, in
// managed memory, where the library has jemalloc), forks, and has the
// child check every byte and allocate more before the parent checks its
// exit.
const forkAfterSmallMallocs = `#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#define N 2000
static int check(char **p)
{
	for (int i = 0; i < N; i++)
		for (int j = 0; j < 32 + i % 200; j++)
			if (p[i][j] != (char)(i + j))
				return 1;
	return 0;
}
int main(void)
{
	char *p[N];
	for (int i = 0; i < N; i++) {
		p[i] = malloc(32 + i % 200);
		if (!p[i])
			return 1;
		for (int j = 0; j < 32 + i % 200; j++)
			p[i][j] = (char)(i + j);
	}
	fflush(stdout);
	pid_t pid = fork();
	if (pid < 0)
		return 2;
	if (pid == 0) {
		char *more = malloc(100);
		if (!more || check(p))
			_exit(3);
		printf("child ok\n");
		fflush(stdout);
		_exit(0);
	}
	int status;
	if (waitpid(pid, &status, 0) != pid)
		return 4;
	if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
		printf("child ended with status %#x\n", status);
		return 5;
	}
	printf("parent %s\n", check(p) ? "bad" : "ok");
	return 0;
}
`

// TestRunBuildsPreloadOnFirstUse: a lone uvm builds the library into
// $XDG_CACHE_HOME/softuvm on its first run, and the program's large
// allocation is managed memory through it; the second run reuses it.
func TestRunBuildsPreloadOnFirstUse(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: userfaultfd")
	}
	cc, err := exec.LookPath("cc")
	if err != nil {
		t.Skip("no C compiler")
	}
	uvmBin := buildLoneUVM(t)
	dir := t.TempDir()
	prog := filepath.Join(dir, "bigalloc")
	require.NoError(t, os.WriteFile(prog+".c", []byte(bigAlloc), 0o644))
	out, err := exec.Command(cc, "-O0", "-o", prog, prog+".c").CombinedOutput()
	require.NoError(t, err, "%s", out)
	cache := filepath.Join(dir, "cache")
	env := loneEnv("XDG_CACHE_HOME=" + cache)

	run := func() (loneRun, runReport) {
		stats := filepath.Join(t.TempDir(), "stats.json")
		r := runLone(t, env, uvmBin, "run", "--quiet", "--stats-json", stats, "--", prog)
		require.Equal(t, 0, r.code, "stderr:\n%s", r.stderr)
		b, err := os.ReadFile(stats)
		require.NoError(t, err)
		var rep runReport
		require.NoError(t, json.Unmarshal(b, &rep), "%s", b)
		return r, rep
	}
	first, rep := run()
	libs, err := filepath.Glob(filepath.Join(cache, "softuvm", "*", preloadName))
	require.NoError(t, err)
	require.Len(t, libs, 1, "one build in the cache")
	lib := libs[0]
	assert.Equal(t, "uvm run: building "+preloadName+" into "+filepath.Dir(lib)+" (first use of this uvm build) ...\n", first.stderr,
		"the build line and nothing else (--quiet)")
	assert.Equal(t, lib+" 14336\n", first.stdout, "the program ran under the cached library and read back what it wrote")
	// How many the library makes of one malloc is its business (a heap
	// of its own, say); without it there would be none.
	assert.Positive(t, rep.Allocations, "the 8 MiB malloc became managed memory")
	assert.GreaterOrEqual(t, rep.AllocatedBytes, uint64(8<<20))
	assert.Positive(t, rep.Stats.TotalFaults(), "its pages were faulted in through the server")
	before, err := os.Stat(lib)
	require.NoError(t, err)

	second, rep := run()
	assert.Empty(t, second.stderr, "no build the second time")
	assert.Equal(t, lib+" 14336\n", second.stdout)
	assert.Positive(t, rep.Allocations)
	assert.GreaterOrEqual(t, rep.AllocatedBytes, uint64(8<<20))
	after, err := os.Stat(lib)
	require.NoError(t, err)
	assert.True(t, os.SameFile(before, after), "the same file")
	assert.Equal(t, before.ModTime(), after.ModTime(), "not rewritten")
	again, err := filepath.Glob(filepath.Join(cache, "softuvm", "*"))
	require.NoError(t, err)
	assert.Equal(t, []string{filepath.Dir(lib)}, again, "nothing else in the cache")

	// A program that forks, under the library built here: its child
	// has its copy of the heap before jemalloc's fork handler touches it.
	forker := filepath.Join(dir, "forker")
	require.NoError(t, os.WriteFile(forker+".c", []byte(forkAfterSmallMallocs), 0o644))
	out, err = exec.Command(cc, "-O0", "-o", forker, forker+".c").CombinedOutput()
	require.NoError(t, err, "%s", out)
	forked := runLone(t, env, uvmBin, "run", "--quiet", "--", forker)
	assert.Equal(t, 0, forked.code, "stdout:\n%sstderr:\n%s", forked.stdout, forked.stderr)
	assert.Equal(t, "child ok\nparent ok\n", forked.stdout)
}

// TestRunWithoutCompiler: a lone uvm with no C compiler, or with one that
// fails, says what is missing and what to do, exits 125, and does not run
// the program.
func TestRunWithoutCompiler(t *testing.T) {
	uvmBin := buildLoneUVM(t)
	dir := t.TempDir()
	emptyPath := filepath.Join(dir, "empty-path")
	require.NoError(t, os.Mkdir(emptyPath, 0o755))
	failingCC := filepath.Join(dir, "failing-cc")
	require.NoError(t, os.WriteFile(failingCC, []byte("#!/bin/sh\necho 'failing-cc: out of luck' >&2\nexit 1\n"), 0o755))
	for _, c := range []struct {
		name string
		env  []string
		want []string
	}{
		{"no compiler", []string{"PATH=" + emptyPath}, []string{
			"uvm run: cannot find " + preloadName + ": not at " + filepath.Join(filepath.Dir(uvmBin), preloadName) + " or " +
				filepath.Join(filepath.Dir(filepath.Dir(uvmBin)), "lib", preloadName) + ", neither --preload nor UVM_PRELOAD names it, " +
				"and it cannot be built from the sources in this uvm: no C compiler: CC is not set, and neither cc nor gcc is in PATH\n",
			"Install a C compiler (apt-get install gcc, or set CC), or build the library with `make lib` in a softuvm checkout and pass --preload PATH or set UVM_PRELOAD=PATH\n",
		}},
		{"CC not found", []string{"PATH=" + emptyPath, "CC=clang-99"}, []string{
			"no C compiler: CC=clang-99: exec: \"clang-99\": executable file not found in $PATH\n",
			"Install a C compiler",
		}},
		{"compiler fails", []string{"CC=" + failingCC}, []string{
			"uvm run: building " + preloadName + " into ",
			"and building it from the sources in this uvm failed: " + failingCC + " -O2 ",
			": exit status 1\nfailing-cc: out of luck\nInstall a C compiler",
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			cache := filepath.Join(t.TempDir(), "cache")
			marker := filepath.Join(t.TempDir(), "ran")
			env := loneEnv(append([]string{"XDG_CACHE_HOME=" + cache}, c.env...)...)
			r := runLone(t, env, uvmBin, "run", "--", "/bin/sh", "-c", "echo ran > "+marker)
			assert.Equal(t, runStatusFailed, r.code)
			for _, w := range c.want {
				assert.Contains(t, r.stderr, w)
			}
			assert.NoFileExists(t, marker, "the program did not run")
			left, _ := filepath.Glob(filepath.Join(cache, "softuvm", "*", preloadName))
			assert.Empty(t, left, "no library in the cache")
		})
	}
}
