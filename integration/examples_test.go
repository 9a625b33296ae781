package integration

import (
	"bytes"
	"context"
	"debug/elf"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestInstallAndExamples installs softuvm into a fresh prefix with `make
// install`, then builds and runs the C examples (examples/) against the
// installation exactly as a user would: pkg-config finds uvm.pc through
// PKG_CONFIG_PATH, the programs link libuvm.so (with the rpath uvm.pc
// gives) or libuvm.a, and the library finds the installed `uvm` binary to
// start its private fault server from, with UVM_BIN unset.
func TestInstallAndExamples(t *testing.T) {
	requireRoot(t)
	for _, tool := range []string{"make", "cc", "pkg-config"} {
		_, err := exec.LookPath(tool)
		require.NoError(t, err, "the examples build with %s", tool)
	}
	prefix := t.TempDir()

	// BIN= builds into a directory of the test's own: the objects are
	// compiled with this PREFIX (the library looks for <prefix>/bin/uvm),
	// and the repository's bin/ is left alone.
	install := exec.Command("make", "-s", "install", "PREFIX="+prefix, "BIN="+filepath.Join(t.TempDir(), "build"))
	install.Dir = ".."
	out, err := install.CombinedOutput()
	require.NoError(t, err, "make install:\n%s", out)

	t.Run("installed files", func(t *testing.T) {
		for _, f := range []struct {
			path string
			mode os.FileMode
		}{
			{"bin/uvm", 0o755},
			{"include/uvm.h", 0o644},
			{"lib/libuvm.so", 0o755},
			{"lib/libuvm.a", 0o644},
			{"lib/libuvm-preload.so", 0o755},
			{"lib/pkgconfig/uvm.pc", 0},
		} {
			st, err := os.Stat(filepath.Join(prefix, f.path))
			if !assert.NoError(t, err, f.path) {
				continue
			}
			assert.True(t, st.Mode().IsRegular(), "%s is not a regular file", f.path)
			assert.NotZero(t, st.Size(), "%s is empty", f.path)
			if f.mode != 0 {
				assert.Equal(t, f.mode, st.Mode().Perm(), "%s's mode", f.path)
			}
		}
		pc := func(args ...string) string {
			cmd := exec.Command("pkg-config", args...)
			cmd.Env = append(os.Environ(), "PKG_CONFIG_PATH="+filepath.Join(prefix, "lib/pkgconfig"))
			b, err := cmd.CombinedOutput()
			require.NoError(t, err, "pkg-config %s: %s", strings.Join(args, " "), b)
			return strings.TrimSpace(string(b))
		}
		flags := pc("--cflags", "--libs", "uvm")
		assert.Contains(t, flags, "-I"+filepath.Join(prefix, "include"))
		assert.Contains(t, flags, "-L"+filepath.Join(prefix, "lib"))
		assert.Contains(t, flags, "-Wl,-rpath,"+filepath.Join(prefix, "lib"))
		assert.Contains(t, flags, "-luvm")
		assert.Equal(t, filepath.Join(prefix, "lib"), pc("--variable=libdir", "uvm"))
		// uvm.pc's version is the header's.
		h, err := os.ReadFile(filepath.Join(prefix, "include/uvm.h"))
		require.NoError(t, err)
		major := regexp.MustCompile(`#define UVM_VERSION_MAJOR (\d+)`).FindSubmatch(h)
		minor := regexp.MustCompile(`#define UVM_VERSION_MINOR (\d+)`).FindSubmatch(h)
		require.NotNil(t, major, "uvm.h has no UVM_VERSION_MAJOR")
		require.NotNil(t, minor, "uvm.h has no UVM_VERSION_MINOR")
		assert.Equal(t, string(major[1])+"."+string(minor[1]), pc("--modversion", "uvm"))
		// The installed uvm runs.
		b, err := exec.Command(filepath.Join(prefix, "bin/uvm"), "help").CombinedOutput()
		assert.NoError(t, err, "%s", b)
	})

	// Build every example twice, against libuvm.so and libuvm.a, with the
	// examples' Makefile and warnings as errors.
	exe := t.TempDir()
	mk := exec.Command("make", "-s", "-C", "../examples", "OUT="+exe, "CFLAGS=-O2 -g -Wall -Wextra -Werror", "all", "static")
	mk.Env = append(os.Environ(), "PKG_CONFIG_PATH="+filepath.Join(prefix, "lib/pkgconfig"))
	out, err = mk.CombinedOutput()
	require.NoError(t, err, "make -C examples:\n%s", out)

	t.Run("linkage", func(t *testing.T) {
		for _, name := range []string{"launch_touch", "vector_add", "oversubscribe"} {
			shared, static := linkage(t, filepath.Join(exe, name)), linkage(t, filepath.Join(exe, name+"-static"))
			assert.Contains(t, shared.needed, "libuvm.so", "%s links libuvm.so", name)
			assert.Contains(t, shared.runpath, filepath.Join(prefix, "lib"), "%s finds libuvm.so through its rpath", name)
			assert.NotContains(t, static.needed, "libuvm.so", "%s-static has libuvm built in", name)
		}
	})

	// env: a private server from the installed uvm, found through PATH
	// (the prefix's bin first) and the prefix the library was built for;
	// nothing of the caller's softuvm settings.
	env := func(path string, extra ...string) []string {
		var e []string
		for _, kv := range os.Environ() {
			if strings.HasPrefix(kv, "UVM_") || strings.HasPrefix(kv, "SOFTUVM_") ||
				strings.HasPrefix(kv, "LD_PRELOAD=") || strings.HasPrefix(kv, "PATH=") {
				continue
			}
			e = append(e, kv)
		}
		e = append(e, "PATH="+path, "UVM_SERVER=private", "UVM_DEVICE_WORKERS=2")
		return append(e, extra...)
	}
	userPath := filepath.Join(prefix, "bin") + ":" + os.Getenv("PATH")

	t.Run("launch_touch", func(t *testing.T) {
		for _, bin := range []string{"launch_touch", "launch_touch-static"} {
			stdout := runExample(t, env(userPath, "UVM_DEVICES=1", "UVM_ARENA_SIZE=64MiB"), filepath.Join(exe, bin), "-n", "3", "-max", "256")
			assert.Contains(t, stdout, "Launch time (us)")
			assert.Contains(t, stdout, "Memory (KB)")
			assert.Contains(t, stdout, "Bandwidth (MB/s)")
			assert.Contains(t, stdout, "UVM_THRASHING=off")
			assert.Equal(t, []int{0, 4, 8, 16, 32, 64, 128, 256}, tableKBs(t, stdout), "%s: the table's rows:\n%s", bin, stdout)
		}
		// Another device than 0.
		stdout := runExample(t, env(userPath, "UVM_DEVICES=2", "UVM_ARENA_SIZE=64MiB"), filepath.Join(exe, "launch_touch"), "-n", "2", "-max", "16", "-device", "1")
		assert.Contains(t, stdout, "a kernel on device 1")
		assert.Equal(t, []int{0, 4, 8, 16}, tableKBs(t, stdout), "the table's rows:\n%s", stdout)
	})

	t.Run("vector_add", func(t *testing.T) {
		for _, bin := range []string{"vector_add", "vector_add-static"} {
			stdout := runExample(t, env(userPath, "UVM_DEVICES=2", "UVM_ARENA_SIZE=64MiB"), filepath.Join(exe, bin), "-n", "1048576")
			for _, want := range []string{
				"over 1048576 floats (4.0 MiB per vector) on device 0",
				"range a: read-mostly 1, preferred location none, last prefetch location device 0, accessed by []",
				"range c: read-mostly 0, preferred location device 0, last prefetch location cpu, accessed by [cpu]",
				"pointer a: type managed",
				"pointer &n (ordinary memory): type unregistered",
				"kernel + stream synchronize",
				"vector_add: OK",
			} {
				assert.Contains(t, stdout, want, "%s:\n%s", bin, stdout)
			}
		}
	})

	t.Run("oversubscribe", func(t *testing.T) {
		stdout := runExample(t, env(userPath, "UVM_DEVICES=1", "UVM_ARENA_SIZE=16MiB"), filepath.Join(exe, "oversubscribe"))
		for _, want := range []string{"has a 16 MiB arena", "32 MiB of managed memory (2x)", "pass 1:", "pass 3:", "host verified 32 MiB", "oversubscribe: OK"} {
			assert.Contains(t, stdout, want, "%s", stdout)
		}
	})

	// Last, as it moves the installed binary: the library finds uvm
	// through PATH alone, and says what it looked for when there is none.
	t.Run("uvm lookup", func(t *testing.T) {
		elsewhere := t.TempDir()
		require.NoError(t, os.Rename(filepath.Join(prefix, "bin/uvm"), filepath.Join(elsewhere, "uvm")))
		bare := "/usr/bin:/bin"
		stdout := runExample(t, env(elsewhere+":"+bare, "UVM_DEVICES=1", "UVM_ARENA_SIZE=16MiB"), filepath.Join(exe, "launch_touch"), "-n", "1", "-max", "4")
		assert.Equal(t, []int{0, 4}, tableKBs(t, stdout))

		for _, dir := range filepath.SplitList(bare) {
			if _, err := os.Stat(filepath.Join(dir, "uvm")); err == nil {
				t.Skipf("a uvm is installed in %s: cannot test a machine without one", dir)
			}
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		cmd := exec.CommandContext(ctx, filepath.Join(exe, "launch_touch"), "-n", "1", "-max", "4")
		cmd.Env = env(bare, "UVM_DEVICES=1")
		var so, se bytes.Buffer
		cmd.Stdout, cmd.Stderr = &so, &se
		err := cmd.Run()
		assert.Equal(t, 1, exitCode(err), "stdout:\n%s\nstderr:\n%s", so.String(), se.String())
		assert.Contains(t, se.String(), "launch_touch: uvmGetDeviceCount(&ndevices) failed")
		assert.Contains(t, se.String(), filepath.Join(prefix, "bin"), "the message names the prefix the library looked in")
		assert.Contains(t, se.String(), "uvmErrorInitializationError")
	})
}

// runExample runs an example program and returns its standard output,
// failing the test unless it exits 0.
func runExample(t *testing.T, env []string, bin string, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = env
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	start := time.Now()
	err := cmd.Run()
	t.Logf("%s %s (%.1fs):\n%s%s", filepath.Base(bin), strings.Join(args, " "), time.Since(start).Seconds(), stdout.String(), stderr.String())
	require.NoError(t, err, "%s %s\nstdout:\n%s\nstderr:\n%s", filepath.Base(bin), strings.Join(args, " "), stdout.String(), stderr.String())
	return stdout.String()
}

// tableKBs returns the Memory (KB) column of launch_touch's table: rows of
// four fields whose first, second and fourth are numbers.
func tableKBs(t *testing.T, stdout string) []int {
	t.Helper()
	var kbs []int
	for _, line := range strings.Split(stdout, "\n") {
		f := strings.Fields(line)
		if len(f) != 4 {
			continue
		}
		us, err1 := strconv.ParseFloat(f[0], 64)
		kb, err2 := strconv.Atoi(f[1])
		_, err3 := strconv.ParseFloat(f[3], 64)
		if err1 != nil || err2 != nil || err3 != nil {
			continue
		}
		assert.Greater(t, us, 0.0, "row %q", line)
		if kb > 0 {
			mbps, err := strconv.ParseFloat(f[2], 64)
			if assert.NoError(t, err, "row %q: bandwidth", line) {
				assert.Greater(t, mbps, 0.0, "row %q", line)
			}
		} else {
			assert.Equal(t, "-", f[2], "row %q: no bandwidth at 0 KB", line)
		}
		kbs = append(kbs, kb)
	}
	return kbs
}

type elfLinkage struct {
	needed  []string
	runpath string
}

// linkage reads a program's DT_NEEDED libraries and its RUNPATH (or
// RPATH).
func linkage(t *testing.T, path string) elfLinkage {
	t.Helper()
	f, err := elf.Open(path)
	require.NoError(t, err)
	defer f.Close()
	var l elfLinkage
	l.needed, err = f.ImportedLibraries()
	require.NoError(t, err)
	for _, tag := range []elf.DynTag{elf.DT_RUNPATH, elf.DT_RPATH} {
		if v, err := f.DynString(tag); err == nil && len(v) > 0 {
			l.runpath = strings.Join(v, ":")
			break
		}
	}
	return l
}
