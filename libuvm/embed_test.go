package libuvm

import (
	"debug/elf"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func requireCC(t *testing.T) {
	t.Helper()
	t.Setenv("CC", "")
	if _, err := compiler(); err != nil {
		t.Skipf("no C compiler: %v", err)
	}
}

// TestSourcesAreTheMakefiles: the embedded files are those in the tree
// that the Makefile builds the library from.
func TestSourcesAreTheMakefiles(t *testing.T) {
	var want []string
	for _, pat := range []string{"include/*.h", "preload/*.c", "preload/*.h", "src/*.c", "src/*.h"} {
		m, err := filepath.Glob(pat)
		require.NoError(t, err)
		want = append(want, m...)
	}
	assert.ElementsMatch(t, want, sourceNames())
	assert.Contains(t, sourceNames(), "src/wire_gen.h")
}

func TestBuildKey(t *testing.T) {
	k := buildKey(nil)
	assert.Len(t, k, 24)
	assert.Equal(t, k, buildKey(nil), "the same sources and flags: the same build")
	assert.NotEqual(t, k, buildKey([]string{"-m32"}), "flags in $CC: another build")
}

// TestPreloadBuildsOnceConcurrently: two builds at once into an empty
// cache both return the one path, holding a whole library that exports
// the allocator and the API; a later call reuses it without building.
func TestPreloadBuildsOnceConcurrently(t *testing.T) {
	requireCC(t)
	cache := t.TempDir()
	// A temporary directory of a killed build, and one of a build going on.
	stale, fresh := filepath.Join(cache, ".build-killed"), filepath.Join(cache, ".build-running")
	require.NoError(t, os.Mkdir(stale, 0o755))
	require.NoError(t, os.Mkdir(fresh, 0o755))
	twoHoursAgo := time.Now().Add(-2 * time.Hour)
	require.NoError(t, os.Chtimes(stale, twoHoursAgo, twoHoursAgo))

	start := make(chan struct{})
	var wg sync.WaitGroup
	paths := make([]string, 2)
	errs := make([]error, 2)
	dirs := make([]string, 2)
	for i := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			paths[i], errs[i] = Preload(Options{CacheDir: cache, Building: func(dir string) { dirs[i] = dir }})
		}()
	}
	close(start)
	wg.Wait()
	require.NoError(t, errs[0])
	require.NoError(t, errs[1])
	assert.Equal(t, paths[0], paths[1])
	dir := filepath.Dir(paths[0])
	assert.Equal(t, cache, filepath.Dir(dir), "a subdirectory of the cache per build")
	assert.Equal(t, PreloadName, filepath.Base(paths[0]))
	for i, d := range dirs {
		// Both may have built (neither saw the other's library), or one
		// may have found the other's: either way, into the same place.
		if d != "" {
			assert.Equal(t, dir, d, "build %d", i)
		}
	}
	assert.NotEqual(t, []string{"", ""}, dirs, "at least one built")

	f, err := elf.Open(paths[0])
	require.NoError(t, err)
	defer f.Close()
	assert.Equal(t, elf.ET_DYN, f.Type)
	soname, err := f.DynString(elf.DT_SONAME)
	require.NoError(t, err)
	assert.Equal(t, []string{PreloadName}, soname)
	syms, err := f.DynamicSymbols()
	require.NoError(t, err)
	exported := map[string]bool{}
	for _, s := range syms {
		if s.Section != elf.SHN_UNDEF && elf.ST_VISIBILITY(s.Other) == elf.STV_DEFAULT {
			exported[s.Name] = true
		}
	}
	for _, name := range []string{"malloc", "free", "mmap", "uvmMallocManaged"} {
		assert.True(t, exported[name], "%s exports %s", PreloadName, name)
	}
	assert.False(t, exported["uvm__fail"], "internal names stay hidden (-fvisibility=hidden)")

	left, _ := filepath.Glob(filepath.Join(cache, ".build-*"))
	assert.Equal(t, []string{fresh}, left, "the builds' own temporary directories are gone, and the stale one; a running build's is left alone")

	fi, err := os.Stat(paths[0])
	require.NoError(t, err)
	again, err := Preload(Options{CacheDir: cache, Building: func(dir string) { t.Errorf("built again into %s", dir) }})
	require.NoError(t, err)
	assert.Equal(t, paths[0], again)
	fi2, err := os.Stat(again)
	require.NoError(t, err)
	assert.True(t, os.SameFile(fi, fi2), "the same file, not a new one")
}

func TestPreloadNoCompiler(t *testing.T) {
	t.Setenv("PATH", t.TempDir())
	t.Setenv("CC", "")
	cache := t.TempDir()
	_, err := Preload(Options{CacheDir: cache, Building: func(string) { t.Error("no compiler, yet a build began") }})
	require.ErrorIs(t, err, ErrNoCompiler)
	assert.EqualError(t, err, "no C compiler: CC is not set, and neither cc nor gcc is in PATH")

	t.Setenv("CC", "no-such-cc -O1")
	_, err = Preload(Options{CacheDir: cache})
	require.ErrorIs(t, err, ErrNoCompiler)
	assert.ErrorContains(t, err, "no C compiler: CC=no-such-cc -O1: exec: \"no-such-cc\": executable file not found in $PATH")
	left, _ := os.ReadDir(cache)
	assert.Empty(t, left)
}

// TestPreloadBuildFails: a compiler that fails gives its command and
// output, and leaves nothing in the cache.
func TestPreloadBuildFails(t *testing.T) {
	dir := t.TempDir()
	cc := filepath.Join(dir, "failing-cc")
	require.NoError(t, os.WriteFile(cc, []byte("#!/bin/sh\necho \"failing-cc: cannot compile $*\" >&2\nexit 3\n"), 0o755))
	if _, err := exec.LookPath("sh"); err != nil {
		t.Skip("no sh")
	}
	t.Setenv("CC", cc)
	cache := t.TempDir()
	var built string
	_, err := Preload(Options{CacheDir: cache, Building: func(d string) { built = d }})
	var be *BuildError
	require.True(t, errors.As(err, &be), "%v", err)
	// The first file in name order.
	assert.Equal(t, cc+" -O2 -std=gnu11 -fPIC -fvisibility=hidden -pthread -Iinclude -Isrc -c -o obj/preload_preload.o preload/preload.c", be.Command)
	assert.Contains(t, be.Output, "failing-cc: cannot compile -O2")
	assert.EqualError(t, be.Err, "exit status 3")
	assert.Contains(t, err.Error(), "failing-cc: cannot compile")
	assert.Equal(t, cache, filepath.Dir(built))
	left, _ := os.ReadDir(cache)
	assert.Empty(t, left, "no library, no temporary directory")
}

// TestStaticDir: the static library and its headers build from the
// embedded sources, and a program using uvm_cuda.h links with them and
// runs (no server: it only names an error); a later call reuses the build.
func TestStaticDir(t *testing.T) {
	requireCC(t)
	cache := t.TempDir()
	built := 0
	dir, err := StaticDir(Options{CacheDir: cache, Building: func(string) { built++ }})
	require.NoError(t, err)
	assert.Equal(t, 1, built)
	for _, f := range []string{"libuvm.a", "include/uvm.h", "include/uvm_cuda.h"} {
		assert.FileExists(t, filepath.Join(dir, f))
	}
	src := filepath.Join(t.TempDir(), "p.c")
	require.NoError(t, os.WriteFile(src, []byte(`#include <stdio.h>
#include "uvm_cuda.h"
__global__ void k(int *p) { p[threadIdx.x] = blockIdx.x; }
int main(void) { printf("%s %d\n", uvmGetErrorName(uvmErrorInvalidConfiguration), dim3(4, 5).y); return 0; }
`), 0o644))
	bin := filepath.Join(t.TempDir(), "p")
	out, err := exec.Command("cc", "-std=gnu11", "-I", filepath.Join(dir, "include"), "-o", bin, src, filepath.Join(dir, "libuvm.a"), "-pthread", "-lm").CombinedOutput()
	require.NoError(t, err, "%s", out)
	out, err = exec.Command(bin).CombinedOutput()
	require.NoError(t, err, "%s", out)
	assert.Equal(t, "uvmErrorInvalidConfiguration 5\n", string(out))
	again, err := StaticDir(Options{CacheDir: cache, Building: func(string) { built++ }})
	require.NoError(t, err)
	assert.Equal(t, dir, again)
	assert.Equal(t, 1, built, "the second call reuses the build")
}
