package integration

import (
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/softuvm/softuvm/libuvm"
)

// setupBox is a PATH for scripts/setup.sh (what `make` runs first) with
// the machine's state made up: stubs for id, the compiler, pkg-config,
// ldconfig, apt-get and go, whose answers follow files named
// installed-PACKAGE, which the apt-get stub creates as it "installs";
// the tools the script uses otherwise are the real ones.
type setupBox struct {
	dir, log string
}

type setupState struct {
	root, apt, goFound bool
	installed          []string // Debian packages already there
	aptFails           bool
}

func newSetupBox(t *testing.T, st setupState) setupBox {
	t.Helper()
	b := setupBox{dir: t.TempDir()}
	b.log = filepath.Join(b.dir, "apt-get.log")
	for _, tool := range []string{"sh", "dirname", "mktemp", "rm", "grep", "sed", "uname", "cat"} {
		p, err := exec.LookPath(tool)
		require.NoError(t, err)
		require.NoError(t, os.Symlink(p, filepath.Join(b.dir, tool)))
	}
	stub := func(name, body string) {
		require.NoError(t, os.WriteFile(filepath.Join(b.dir, name), []byte("#!/bin/sh\n"+body), 0o755))
	}
	uid := "1000"
	if st.root {
		uid = "0"
	}
	stub("id", "echo "+uid+"\n")
	// gcc without libc6-dev has no stdio.h: a program does not build.
	stub("cc", `[ -e `+b.dir+`/installed-gcc ] && [ -e `+b.dir+`/installed-libc6-dev ] && exit 0
echo "cc: fatal error: stdio.h: No such file or directory" >&2; exit 1
`)
	stub("ldconfig", `[ -e `+b.dir+`/installed-libjemalloc2 ] && printf '\tlibjemalloc.so.2 (libc6,x86-64) => /usr/lib/x86_64-linux-gnu/libjemalloc.so.2\n'
printf '\tlibc.so.6 (libc6,x86-64) => /lib/x86_64-linux-gnu/libc.so.6\n'
`)
	pkgConfig := "#!/bin/sh\nexit 0\n"
	if st.apt {
		chmod, err := exec.LookPath("chmod")
		require.NoError(t, err)
		fail := ""
		if st.aptFails {
			fail = `[ "$1" = install ] && { echo "E: Unable to locate package" >&2; exit 100; }` + "\n"
		}
		stub("apt-get", `echo "$*" >> `+b.log+"\n"+fail+`[ "$1" = install ] || exit 0
for p; do
	case $p in -*) continue ;; esac
	: > `+b.dir+`/installed-$p
	[ $p = pkg-config ] && printf '`+strings.ReplaceAll(pkgConfig, "\n", `\n`)+`' > `+b.dir+`/pkg-config && `+chmod+` +x `+b.dir+`/pkg-config
done
exit 0
`)
	}
	for _, p := range st.installed {
		require.NoError(t, os.WriteFile(filepath.Join(b.dir, "installed-"+p), nil, 0o644))
		if p == "pkg-config" {
			require.NoError(t, os.WriteFile(filepath.Join(b.dir, "pkg-config"), []byte(pkgConfig), 0o755))
		}
	}
	if st.goFound {
		stub("go", "exit 0\n")
	}
	return b
}

// run runs the script in the box and returns its output, its exit
// status and what apt-get was asked, one call a line.
func (b setupBox) run(t *testing.T, env ...string) (string, int, []string) {
	t.Helper()
	cmd := exec.Command(filepath.Join(b.dir, "sh"), filepath.Join("..", "scripts", "setup.sh"))
	cmd.Env = append([]string{"PATH=" + b.dir, "CC=cc", "GO=go", "GO_PREFIX=" + filepath.Join(b.dir, "prefix")}, env...)
	out, err := cmd.CombinedOutput()
	code := 0
	if err != nil {
		ee, ok := err.(*exec.ExitError)
		require.True(t, ok, "%v: %s", err, out)
		code = ee.ExitCode()
	}
	var calls []string
	if log, err := os.ReadFile(b.log); err == nil {
		calls = strings.Split(strings.TrimSpace(string(log)), "\n")
	}
	return string(out), code, calls
}

var allPackages = []string{"gcc", "libc6-dev", "pkg-config", "libjemalloc2"}

// TestSetupInstallsOrNamesTheCommand: `make`'s set-up on machines made
// up each way it can find one: everything there (nothing installed); as
// root with apt-get, what is missing installed in one apt-get call and
// checked again; as another user, the one command that installs it and
// a stop; apt-get failing; no apt-get; no Go (go.dev's command).
func TestSetupInstallsOrNamesTheCommand(t *testing.T) {
	if _, err := exec.LookPath("sh"); err != nil {
		t.Skip("no sh")
	}
	out, code, calls := newSetupBox(t, setupState{root: true, apt: true, goFound: true, installed: allPackages}).run(t)
	assert.Equal(t, 0, code, out)
	assert.Empty(t, calls, "nothing to install")
	assert.Contains(t, out, "setup: the build and uvm run have what they need")

	out, code, calls = newSetupBox(t, setupState{root: true, apt: true, goFound: true, installed: []string{"gcc"}}).run(t)
	assert.Equal(t, 0, code, out)
	assert.Equal(t, []string{"update -q", "install -y -q --no-install-recommends gcc libc6-dev pkg-config libjemalloc2"}, calls)
	for _, want := range []string{
		"setup: missing: a C compiler that builds programs (CC=cc)",
		"setup: missing: pkg-config",
		"setup: missing: jemalloc's run-time library, libjemalloc.so.2",
		"setup: installing gcc libc6-dev pkg-config libjemalloc2 (apt-get)",
		"setup: the build and uvm run have what they need",
	} {
		assert.Contains(t, out, want)
	}

	out, code, calls = newSetupBox(t, setupState{apt: true, goFound: true, installed: []string{"gcc", "libc6-dev", "pkg-config"}}).run(t)
	assert.Equal(t, 1, code, out)
	assert.Empty(t, calls, "not root: nothing run")
	assert.Contains(t, out, "setup: install them with:\n  sudo apt-get install -y libjemalloc2\n")

	out, code, _ = newSetupBox(t, setupState{root: true, apt: true, aptFails: true, goFound: true, installed: []string{"gcc", "libc6-dev", "libjemalloc2"}}).run(t)
	assert.Equal(t, 1, code, out)
	assert.Contains(t, out, "setup: apt-get install pkg-config failed")

	out, code, _ = newSetupBox(t, setupState{root: true, goFound: true, installed: []string{"gcc", "libc6-dev", "libjemalloc2"}}).run(t)
	assert.Equal(t, 1, code, out)
	assert.Contains(t, out, "setup: this is not Debian or Ubuntu (no apt-get): install the above with this system's package manager (Debian's names: pkg-config)")

	box := newSetupBox(t, setupState{apt: true, installed: allPackages})
	require.NoError(t, os.Mkdir(filepath.Join(box.dir, "prefix"), 0o755))
	out, code, _ = box.run(t)
	assert.Equal(t, 1, code, out)
	goVersion := strings.TrimPrefix(goLine(t), "go ")
	assert.Contains(t, out, "setup: missing: Go "+goVersion+" or later (go.mod)")
	arch := map[string]string{"amd64": "amd64", "arm64": "arm64"}[runtime.GOARCH]
	assert.Contains(t, out, "  curl -fsSL https://go.dev/dl/go"+goVersion+".linux-"+arch+".tar.gz | tar -C "+filepath.Join(box.dir, "prefix")+" -xz", "a prefix this user can write: no sudo")

	out, code, _ = newSetupBox(t, setupState{root: true, apt: true, goFound: true, installed: allPackages}).run(t, "CC=no-such-cc")
	assert.Equal(t, 1, code, out)
	assert.Contains(t, out, "setup: CC=no-such-cc cannot build a program")
}

// goLine is go.mod's go line.
func goLine(t *testing.T) string {
	b, err := os.ReadFile(filepath.Join("..", "go.mod"))
	require.NoError(t, err)
	for _, l := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(l, "go ") {
			return l
		}
	}
	t.Fatal("go.mod has no go line")
	return ""
}

// TestMakeSetsUpFirst: `make` (the README's first command) runs the
// set-up before it builds anything.
func TestMakeSetsUpFirst(t *testing.T) {
	out, err := exec.Command("make", "-n", "-C", "..", "all", "BIN="+t.TempDir()).CombinedOutput()
	require.NoError(t, err, "%s", out)
	setup, build := strings.Index(string(out), "scripts/setup.sh"), strings.Index(string(out), "go build")
	require.GreaterOrEqual(t, setup, 0, "make runs scripts/setup.sh: %s", out)
	require.GreaterOrEqual(t, build, 0, "%s", out)
	assert.Less(t, setup, build, "the set-up comes first")
}

// TestMakeBuildsTheHeapWithoutJemallocsHeader: the Makefile's build of
// libuvm-preload.so, with a compiler that finds a <jemalloc/jemalloc.h>
// whose every inclusion is an #error (a machine without jemalloc's
// header, whatever this one has), succeeds, and the library it makes has
// the managed heap: `uvm run` with it under sh -c manages awk's and
// sort's small allocations where libjemalloc.so.2 is installed, and says
// plainly that it does not where jemalloc cannot be loaded.
func TestMakeBuildsTheHeapWithoutJemallocsHeader(t *testing.T) {
	requireRoot(t)
	shadow := t.TempDir()
	require.NoError(t, os.MkdirAll(filepath.Join(shadow, "jemalloc"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(shadow, "jemalloc", "jemalloc.h"), []byte("#error \"jemalloc's header must not be needed\"\n"), 0o644))
	bin := t.TempDir()
	out, err := exec.Command("make", "-s", "-j2", "-C", "..", "lib", "BIN="+bin, "CC=cc -I"+shadow).CombinedOutput()
	require.NoError(t, err, "the build needs jemalloc's header:\n%s", out)
	lib := filepath.Join(bin, "libuvm-preload.so")

	ldconfig, _ := exec.Command("/sbin/ldconfig", "-p").Output()
	installed := strings.Contains(string(ldconfig), "libjemalloc.so.2 ")
	script := `seq 1 100000 | awk '{ a[$1] = $1 } END { print length(a) }'; seq 1 50000 | sort -rn | head -n 1`
	r, rep := uvmRun(t, 2*time.Minute, nil, nil, []string{"--preload", lib}, "sh", "-c", script)
	require.Equal(t, 0, r.code, r.stderr)
	assert.Equal(t, "100000\n50000\n", r.stdout)
	if installed {
		assert.Equal(t, "managed", rep.Heap, r.stderr)
		assert.Positive(t, rep.Allocations, "the heap's chunks")
		assert.Empty(t, r.stderr)
	} else {
		assert.Equal(t, "system", rep.Heap)
		assert.Equal(t, 1, strings.Count(r.stderr, "uvm run: the managed heap cannot be had: cannot load libjemalloc.so.2"), r.stderr)
	}

	p, err := libuvm.ProbeHeap(append(os.Environ(), "LD_PRELOAD="+lib, "GLIBC_TUNABLES="+libuvm.HeapTunables(""), "UVM_JEMALLOC=libsoftuvm-no-such-jemalloc.so.2"))
	require.NoError(t, err)
	assert.False(t, p.Managed)
	assert.Equal(t, "install jemalloc: apt-get install libjemalloc2", p.Fix, "plainly, with the fix")
}
