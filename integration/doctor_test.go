package integration

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// doctorCheck is one check of `uvm doctor --json`.
type doctorCheck struct {
	Name        string `json:"name"`
	What        string `json:"what"`
	OK          bool   `json:"ok"`
	Required    bool   `json:"required"`
	Found       string `json:"found"`
	Consequence string `json:"consequence"`
	Fix         string `json:"fix"`
}

// doctor runs `uvm doctor --json` with env added and returns its checks
// by name, its ok and its exit status.
func doctor(t *testing.T, env ...string) (map[string]doctorCheck, bool, int) {
	t.Helper()
	out, errOut, err := uvmCmd(t, append([]string{"UVM_JEMALLOC=", "CC="}, env...), "doctor", "--json")
	var rep struct {
		OK     bool          `json:"ok"`
		Checks []doctorCheck `json:"checks"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &rep), "%s%s", out, errOut)
	checks := map[string]doctorCheck{}
	for _, c := range rep.Checks {
		checks[c.Name] = c
		if c.OK {
			assert.Empty(t, c.Consequence+c.Fix, "%s is there: nothing to fix", c.Name)
		} else {
			assert.NotEmpty(t, c.Consequence, "%s is missing: what it costs", c.Name)
			assert.NotEmpty(t, c.Fix, "%s is missing: how to fix it", c.Name)
		}
	}
	return checks, rep.OK, exitCode(err)
}

// exists says whether any of the paths exists.
func exists(paths ...string) bool {
	for _, p := range paths {
		if _, err := os.Stat(p); err == nil {
			return true
		}
	}
	return false
}

// TestDoctorTellsTheMachine: each of uvm doctor's findings against this
// machine's state, read here apart from the code that checks it.
func TestDoctorTellsTheMachine(t *testing.T) {
	checks, ok, code := doctor(t)
	var names []string
	for n := range checks {
		names = append(names, n)
	}
	assert.ElementsMatch(t, []string{"userfaultfd", "preload-library", "managed-heap", "c-compiler", "pkg-config", "ebpf-counters",
		"large-folios", "memory-cgroup", "zram", "valgrind"}, names)
	root := os.Geteuid() == 0

	fd, err := unix.Open("/dev/userfaultfd", unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err == nil {
		unix.Close(fd)
	}
	uf := checks["userfaultfd"]
	assert.True(t, uf.Required)
	if err == nil {
		assert.True(t, uf.OK, "/dev/userfaultfd opens here: %+v", uf)
	}
	unpriv, err := os.ReadFile("/proc/sys/vm/unprivileged_userfaultfd")
	require.NoError(t, err)
	assert.Contains(t, uf.Found, "vm.unprivileged_userfaultfd="+strings.TrimSpace(string(unpriv)))

	lib := checks["preload-library"]
	assert.True(t, lib.OK && lib.Required)
	assert.Equal(t, filepath.Join(binDir, "libuvm-preload.so"), lib.Found, "the library beside uvm, as uvm run finds it")

	heap := checks["managed-heap"]
	assert.True(t, heap.Required)
	ldconfig, _ := exec.Command("/sbin/ldconfig", "-p").Output()
	installed := strings.Contains(string(ldconfig), "libjemalloc.so.2 ")
	assert.Equal(t, installed, heap.OK, "jemalloc in the loader's cache: %v; %+v", installed, heap)
	if installed {
		assert.Contains(t, heap.Found, "jemalloc 5.")
	}

	_, ccErr := exec.LookPath("cc")
	_, gccErr := exec.LookPath("gcc")
	assert.Equal(t, ccErr == nil || gccErr == nil, checks["c-compiler"].OK, "%+v", checks["c-compiler"])
	_, err = exec.LookPath("pkg-config")
	assert.Equal(t, err == nil, checks["pkg-config"].OK, "%+v", checks["pkg-config"])
	_, err = exec.LookPath("valgrind")
	assert.Equal(t, err == nil, checks["valgrind"].OK, "%+v", checks["valgrind"])

	counters := checks["ebpf-counters"]
	if !exists("/sys/kernel/tracing/events", "/sys/kernel/debug/tracing/events") {
		assert.False(t, counters.OK, "no tracefs, no counters")
		assert.Contains(t, counters.Fix, "mount -t tracefs nodev /sys/kernel/tracing")
	} else if !root {
		assert.False(t, counters.OK, "not root: no BPF")
	}

	large := checks["large-folios"]
	switch {
	case !root:
		assert.False(t, large.OK, "a private tmpfs needs CAP_SYS_ADMIN")
	case exists("/sys/kernel/mm/transparent_hugepage/shmem_enabled"):
		assert.True(t, large.OK, "root, with shmem huge pages: %+v", large)
	}

	cgroups, err := os.ReadFile("/proc/cgroups")
	require.NoError(t, err)
	memory := false
	for _, l := range strings.Split(string(cgroups), "\n") {
		if f := strings.Fields(l); len(f) == 4 && f[0] == "memory" {
			memory = f[3] == "1"
		}
	}
	assert.Equal(t, memory && root, checks["memory-cgroup"].OK, "%+v", checks["memory-cgroup"])

	release, err := os.ReadFile("/proc/sys/kernel/osrelease")
	require.NoError(t, err)
	modules := "/lib/modules/" + strings.TrimSpace(string(release))
	builtin, _ := os.ReadFile(modules + "/modules.builtin")
	dep, _ := os.ReadFile(modules + "/modules.dep")
	zram := exists("/sys/class/zram-control", "/sys/block/zram0") || strings.Contains(string(builtin), "/zram.ko") || strings.Contains(string(dep), "/zram.ko")
	assert.Equal(t, zram && root, checks["zram"].OK, "%+v", checks["zram"])

	required := true
	for _, c := range checks {
		if c.Required && !c.OK {
			required = false
		}
		if !c.Required {
			assert.NotContains(t, []string{"userfaultfd", "preload-library", "managed-heap"}, c.Name)
		}
	}
	assert.Equal(t, required, ok)
	assert.Equal(t, map[bool]int{true: 0, false: 1}[required], code, "the exit status says whether everything required is here")
}

// TestDoctorNamesWhatIsMissing: jemalloc that cannot be loaded is a
// required part missing (exit status 1, with the package to install);
// a PATH without valgrind, a compiler or pkg-config lacks optional
// parts only (exit status 0), each with its fix; bad flags are 2.
func TestDoctorNamesWhatIsMissing(t *testing.T) {
	checks, ok, code := doctor(t, "UVM_JEMALLOC=libsoftuvm-no-such-jemalloc.so.2")
	heap := checks["managed-heap"]
	assert.False(t, heap.OK)
	assert.False(t, ok)
	assert.Equal(t, 1, code)
	assert.Contains(t, heap.Found, "cannot load libsoftuvm-no-such-jemalloc.so.2")
	assert.True(t, strings.HasSuffix(heap.Fix, "apt-get install libjemalloc2"), heap.Fix)
	assert.Contains(t, heap.Consequence, "programs that allocate in small pieces")

	bin := t.TempDir()
	for _, name := range []string{"true", "sh"} {
		p, err := exec.LookPath(name)
		require.NoError(t, err)
		require.NoError(t, os.Symlink(p, filepath.Join(bin, name)))
	}
	checks, ok, code = doctor(t, "PATH="+bin)
	for name, fix := range map[string]string{"valgrind": "apt-get install valgrind", "c-compiler": "apt-get install gcc libc6-dev", "pkg-config": "apt-get install pkg-config"} {
		c := checks[name]
		assert.False(t, c.OK, "%s with PATH=%s", name, bin)
		assert.False(t, c.Required, name)
		assert.Contains(t, c.Fix, fix, name)
	}
	assert.Equal(t, checks["managed-heap"].OK, ok, "only required parts decide")
	if ok {
		assert.Equal(t, 0, code, "optional parts missing: still 0")
	}

	out, _, err := uvmCmd(t, []string{"PATH=" + bin, "CC="}, "doctor")
	assert.Contains(t, []int{0, 1}, exitCode(err))
	assert.Contains(t, out, "missing (optional) valgrind")
	assert.Contains(t, out, "without it: uvm lab bound cannot run")
	assert.Contains(t, out, "fix: ")

	_, errOut, err := uvmCmd(t, nil, "doctor", "--frob")
	assert.Equal(t, 2, exitCode(err), errOut)
}
