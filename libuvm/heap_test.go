package libuvm

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The library the heap tests probe, built once with jemalloc's header
// made unusable (headerlessBuild), and the compiler commands that built it.
var headerless struct {
	once     sync.Once
	lib, log string
	err      error
}

// poisonedHeader is what <jemalloc/jemalloc.h> holds for the headerless
// build: any file that includes it fails to compile.
const poisonedHeader = "#error \"jemalloc's header must not be needed to build libuvm-preload.so\"\n"

// headerlessBuild builds libuvm-preload.so, as a `uvm` from `go build`
// does on first use, with a compiler that finds a <jemalloc/jemalloc.h>
// whose every inclusion is an error, ahead of any installed one: a
// machine without jemalloc's header, whether or not this one has it.
func headerlessBuild(t *testing.T) (lib, log string) {
	t.Helper()
	requireCC(t)
	headerless.once.Do(func() {
		dir, err := os.MkdirTemp("", "softuvm-headerless-")
		if err != nil {
			headerless.err = err
			return
		}
		testDirs = append(testDirs, dir)
		shadow := filepath.Join(dir, "include")
		if err := os.MkdirAll(filepath.Join(shadow, "jemalloc"), 0o755); err != nil {
			headerless.err = err
			return
		}
		if err := os.WriteFile(filepath.Join(shadow, "jemalloc", "jemalloc.h"), []byte(poisonedHeader), 0o644); err != nil {
			headerless.err = err
			return
		}
		cc, err := compiler()
		if err != nil {
			headerless.err = err
			return
		}
		headerless.log = filepath.Join(dir, "cc.log")
		wrapper := filepath.Join(dir, "logging-cc")
		script := "#!/bin/sh\necho \"$*\" >> " + headerless.log + "\nexec " + strings.Join(cc, " ") + " -I" + shadow + " \"$@\"\n"
		if err := os.WriteFile(wrapper, []byte(script), 0o755); err != nil {
			headerless.err = err
			return
		}
		t.Setenv("CC", wrapper)
		headerless.lib, headerless.err = Preload(Options{CacheDir: filepath.Join(dir, "cache")})
	})
	require.NoError(t, headerless.err)
	return headerless.lib, headerless.log
}

// testDirs are removed when the tests end.
var testDirs []string

func TestMain(m *testing.M) {
	code := m.Run()
	for _, d := range testDirs {
		os.RemoveAll(d)
	}
	os.Exit(code)
}

// probeEnv is this process's environment with lib preloaded as `uvm
// run` preloads it for the managed heap, less any jemalloc choice of the
// caller's: extra is added last.
func probeEnv(lib string, extra ...string) []string {
	env := withoutVars(os.Environ(), "LD_PRELOAD", "GLIBC_TUNABLES", EnvJemalloc)
	env = append(env, "LD_PRELOAD="+lib, "GLIBC_TUNABLES="+HeapTunables(os.Getenv("GLIBC_TUNABLES")))
	return append(env, extra...)
}

// jemallocInstalled says whether the loader's cache lists jemalloc 5's
// library: asked of ldconfig, apart from the library under test.
func jemallocInstalled(t *testing.T) bool {
	ldconfig, err := exec.LookPath("ldconfig")
	if err != nil {
		ldconfig = "/sbin/ldconfig"
	}
	out, err := exec.Command(ldconfig, "-p").Output()
	if err != nil {
		t.Skipf("cannot list the loader's cache to know whether jemalloc is installed: %v", err)
	}
	for _, line := range strings.Split(string(out), "\n") {
		if strings.HasPrefix(strings.TrimSpace(line), DefaultJemalloc+" ") {
			return true
		}
	}
	return false
}

// TestPreloadNeedsNoJemallocHeader: the library builds where jemalloc's
// header cannot be included (every inclusion an #error), is never
// linked with jemalloc, and has the managed heap where libjemalloc.so.2
// is installed, or says plainly that it has not, and why, where it is
// not.
func TestPreloadNeedsNoJemallocHeader(t *testing.T) {
	lib, log := headerlessBuild(t)
	b, err := os.ReadFile(log)
	require.NoError(t, err)
	for _, cmd := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		assert.NotContains(t, cmd, "jemalloc", "no jemalloc define, include or link: %s", cmd)
	}
	assert.Contains(t, string(b), "preload/preload.c", "the library was built here, not found in a cache")

	p, err := ProbeHeap(probeEnv(lib))
	require.NoError(t, err)
	if jemallocInstalled(t) {
		assert.True(t, p.Managed, "jemalloc is installed, so the heap is managed: %+v", p)
		assert.True(t, strings.HasPrefix(p.Version, "5."), "jemalloc 5: %q", p.Version)
		assert.Empty(t, p.Why+p.Fix)
	} else {
		assert.False(t, p.Managed)
		assert.Contains(t, p.Why, "cannot load libjemalloc.so.2 (libjemalloc.so.2: cannot open shared object file")
		assert.Equal(t, "install jemalloc: apt-get install libjemalloc2", p.Fix)
	}
}

// TestProbeHeapSaysWhy: each way the managed heap can be missing is
// named, with its fix: a library not found, one that is not jemalloc,
// a jemalloc that is not version 5, and no room for jemalloc's TLS.
func TestProbeHeapSaysWhy(t *testing.T) {
	lib, _ := headerlessBuild(t)

	p, err := ProbeHeap(probeEnv(lib, EnvJemalloc+"=libsoftuvm-no-such-jemalloc.so.2"))
	require.NoError(t, err)
	assert.Equal(t, HeapProbe{
		Why: "cannot load libsoftuvm-no-such-jemalloc.so.2 (libsoftuvm-no-such-jemalloc.so.2: cannot open shared object file: No such file or directory)",
		Fix: "install jemalloc: apt-get install libjemalloc2",
	}, p)

	p, err = ProbeHeap(probeEnv(lib, EnvJemalloc+"=libc.so.6"))
	require.NoError(t, err)
	assert.False(t, p.Managed)
	assert.Equal(t, "libc.so.6 is not jemalloc: it lacks mallocx, rallocx, dallocx, sallocx or mallctl", p.Why)
	assert.Equal(t, "install jemalloc 5 (apt-get install libjemalloc2), or set UVM_JEMALLOC to its libjemalloc.so.2", p.Fix)

	// A jemalloc 4: the same functions, and a version its extent hooks
	// do not match.
	dir := t.TempDir()
	src, fake := filepath.Join(dir, "fake.c"), filepath.Join(dir, "libjemalloc4.so")
	require.NoError(t, os.WriteFile(src, []byte(fakeJemalloc4), 0o644))
	require.NoError(t, BuildLibrary(fake, src))
	p, err = ProbeHeap(probeEnv(lib, EnvJemalloc+"="+fake))
	require.NoError(t, err)
	assert.Equal(t, HeapProbe{Why: fake + " is jemalloc 4.5.0-0-gfake, whose extent hooks are not jemalloc 5's", Fix: "install jemalloc 5 (apt-get install libjemalloc2), or set UVM_JEMALLOC to its libjemalloc.so.2"}, p)

	if !jemallocInstalled(t) {
		t.Skip("jemalloc is not installed: its static TLS cannot be tried")
	}
	env := append(withoutVars(probeEnv(lib), "GLIBC_TUNABLES"), "GLIBC_TUNABLES="+StaticTLSTunable+"=0")
	p, err = ProbeHeap(env)
	require.NoError(t, err)
	assert.False(t, p.Managed)
	assert.Contains(t, p.Why, "cannot allocate memory in static TLS block")
	assert.Equal(t, "set GLIBC_TUNABLES=glibc.rtld.optional_static_tls=16384, as uvm run does, which makes room", p.Fix)
}

// fakeJemalloc4 has jemalloc's five functions and says it is 4.5.0.
const fakeJemalloc4 = `#include <stddef.h>
#include <string.h>
void *mallocx(size_t n, int f) { (void)n, (void)f; return NULL; }
void *rallocx(void *p, size_t n, int f) { (void)p, (void)n, (void)f; return NULL; }
void dallocx(void *p, int f) { (void)p, (void)f; }
size_t sallocx(const void *p, int f) { (void)p, (void)f; return 0; }
int mallctl(const char *name, void *oldp, size_t *oldlenp, void *newp, size_t newlen)
{
	(void)newp, (void)newlen;
	if (strcmp(name, "version") != 0 || !oldp || !oldlenp || *oldlenp != sizeof(const char *))
		return 2;
	*(const char **)oldp = "4.5.0-0-gfake";
	return 0;
}
`

func TestParseHeapProbe(t *testing.T) {
	p, err := parseHeapProbe("managed\t5.3.0-0-g54eaed1\n", "true")
	require.NoError(t, err)
	assert.Equal(t, HeapProbe{Managed: true, Version: "5.3.0-0-g54eaed1"}, p)
	p, err = parseHeapProbe("system\twhy\tfix\n", "true")
	require.NoError(t, err)
	assert.Equal(t, HeapProbe{Why: "why", Fix: "fix"}, p)
	_, err = parseHeapProbe("", "/bin/true")
	assert.EqualError(t, err, "probing the managed heap with /bin/true: no answer: the library was not loaded (LD_PRELOAD unset, or /bin/true statically linked?)")
	_, err = parseHeapProbe("managed\n", "true")
	assert.ErrorContains(t, err, `unexpected answer "managed\n"`)
}

func TestHeapTunables(t *testing.T) {
	assert.Equal(t, "glibc.rtld.optional_static_tls=16384", HeapTunables(""))
	assert.Equal(t, "glibc.malloc.check=3:glibc.rtld.optional_static_tls=16384", HeapTunables("glibc.malloc.check=3"), "the caller's are kept")
	assert.Equal(t, "glibc.rtld.optional_static_tls=65536", HeapTunables("glibc.rtld.optional_static_tls=65536"), "the caller's own size is kept")
}

// abiCheck compiles against jemalloc's header and this package's
// declarations together, and runs: every offset and size of the extent
// hooks, every hook's and function's signature (a forwarder from
// jemalloc's type to ours fails to compile, with -Werror, where a
// parameter's type or count differs), and the mallocx flags.
const abiCheck = `#include <stddef.h>
#include <stdio.h>
#include <jemalloc/jemalloc.h>
#include "jemalloc_abi.h"

#define SAME_MEMBER(m) \
	_Static_assert(offsetof(extent_hooks_t, m) == offsetof(je_extent_hooks_t, m), #m " is where jemalloc has it"); \
	_Static_assert(sizeof(((extent_hooks_t *)0)->m) == sizeof(((je_extent_hooks_t *)0)->m), #m " has jemalloc's size");
SAME_MEMBER(alloc) SAME_MEMBER(dalloc) SAME_MEMBER(destroy) SAME_MEMBER(commit) SAME_MEMBER(decommit)
SAME_MEMBER(purge_lazy) SAME_MEMBER(purge_forced) SAME_MEMBER(split) SAME_MEMBER(merge)
_Static_assert(sizeof(extent_hooks_t) == sizeof(je_extent_hooks_t), "nine hooks, as jemalloc has");

#define J(h) ((je_extent_hooks_t *)(void *)(h))
static void *f_alloc(extent_hooks_t *h, void *a, size_t s, size_t al, bool *z, bool *c, unsigned i) { return J(h)->alloc(J(h), a, s, al, z, c, i); }
static bool f_dalloc(extent_hooks_t *h, void *a, size_t s, bool c, unsigned i) { return J(h)->dalloc(J(h), a, s, c, i); }
static void f_destroy(extent_hooks_t *h, void *a, size_t s, bool c, unsigned i) { J(h)->destroy(J(h), a, s, c, i); }
static bool f_commit(extent_hooks_t *h, void *a, size_t s, size_t o, size_t l, unsigned i) { return J(h)->commit(J(h), a, s, o, l, i); }
static bool f_decommit(extent_hooks_t *h, void *a, size_t s, size_t o, size_t l, unsigned i) { return J(h)->decommit(J(h), a, s, o, l, i); }
static bool f_purge(extent_hooks_t *h, void *a, size_t s, size_t o, size_t l, unsigned i) { return J(h)->purge_forced(J(h), a, s, o, l, i) || J(h)->purge_lazy(J(h), a, s, o, l, i); }
static bool f_split(extent_hooks_t *h, void *a, size_t s, size_t x, size_t y, bool c, unsigned i) { return J(h)->split(J(h), a, s, x, y, c, i); }
static bool f_merge(extent_hooks_t *h, void *a, size_t x, void *b, size_t y, bool c, unsigned i) { return J(h)->merge(J(h), a, x, b, y, c, i); }
static extent_hooks_t forwarders = {f_alloc, f_dalloc, f_destroy, f_commit, f_decommit, f_purge, f_purge, f_split, f_merge};

_Static_assert(__builtin_types_compatible_p(__typeof__(mallocx), je_mallocx_t), "mallocx");
_Static_assert(__builtin_types_compatible_p(__typeof__(rallocx), je_rallocx_t), "rallocx");
_Static_assert(__builtin_types_compatible_p(__typeof__(dallocx), je_dallocx_t), "dallocx");
_Static_assert(__builtin_types_compatible_p(__typeof__(sallocx), je_sallocx_t), "sallocx");
_Static_assert(__builtin_types_compatible_p(__typeof__(mallctl), je_mallctl_t), "mallctl");
_Static_assert(JE_MALLOCX_ZERO == MALLOCX_ZERO, "MALLOCX_ZERO");

int main(void)
{
	(void)forwarders;
	int bad = 0;
	for (unsigned a = 0; a < 4096; a++)
		if (JE_MALLOCX_ARENA(a) != MALLOCX_ARENA(a))
			bad++, printf("MALLOCX_ARENA(%u): %d, jemalloc %d\n", a, JE_MALLOCX_ARENA(a), MALLOCX_ARENA(a));
	for (int lg = 0; lg < 48; lg++)
		if (JE_MALLOCX_ALIGN((size_t)1 << lg) != MALLOCX_ALIGN((size_t)1 << lg))
			bad++, printf("MALLOCX_ALIGN(1<<%d): %d, jemalloc %d\n", lg, JE_MALLOCX_ALIGN((size_t)1 << lg), MALLOCX_ALIGN((size_t)1 << lg));
	return bad != 0;
}
`

// TestJemallocABIMatchesHeader checks preload/jemalloc_abi.h against
// jemalloc's own header, where one can be included: the installed one
// (Debian: libjemalloc-dev), or the directory named by
// SOFTUVM_JEMALLOC_INCLUDE (one holding jemalloc/jemalloc.h, e.g. from
// `apt-get download libjemalloc-dev && dpkg-deb -x libjemalloc-dev_*.deb x`:
// x/usr/include). The build never includes that header; the integration
// tests' managed heap (chunks carved by these hooks, purges discarded)
// is the check everywhere else.
func TestJemallocABIMatchesHeader(t *testing.T) {
	requireCC(t)
	dir := t.TempDir()
	var include []string
	if d := os.Getenv("SOFTUVM_JEMALLOC_INCLUDE"); d != "" {
		include = append(include, "-I"+d)
	}
	cc, err := compiler()
	require.NoError(t, err)
	probe := filepath.Join(dir, "probe.c")
	require.NoError(t, os.WriteFile(probe, []byte("#include <jemalloc/jemalloc.h>\n"), 0o644))
	if out, err := exec.Command(cc[0], append(append(cc[1:len(cc):len(cc)], include...), "-fsyntax-only", probe)...).CombinedOutput(); err != nil {
		t.Skipf("jemalloc's header cannot be included (install libjemalloc-dev, or set SOFTUVM_JEMALLOC_INCLUDE): %s", strings.TrimSpace(string(out)))
	}
	abs, err := filepath.Abs("preload")
	require.NoError(t, err)
	src, bin := filepath.Join(dir, "abi.c"), filepath.Join(dir, "abi")
	require.NoError(t, os.WriteFile(src, []byte(abiCheck), 0o644))
	args := append(append(cc[1:len(cc):len(cc)], include...), "-I"+abs, "-std=gnu11", "-Wall", "-Wextra", "-Wconversion", "-Werror", "-o", bin, src)
	out, err := exec.Command(cc[0], args...).CombinedOutput()
	require.NoError(t, err, "jemalloc_abi.h differs from jemalloc's header:\n%s", out)
	out, err = exec.Command(bin).CombinedOutput()
	require.NoError(t, err, "the mallocx flags differ:\n%s", out)
}
