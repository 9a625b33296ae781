package bench

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// touchEnv makes the test binary, run as a child, write every page of
// that many bytes and exit: the program the cgroup variant limits.
const touchEnv = "UVM_BENCH_TEST_TOUCH_BYTES"

func init() {
	if s := os.Getenv(touchEnv); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil {
			os.Exit(2)
		}
		b := make([]byte, n)
		for i := range b {
			b[i] = byte(i>>12) | 1
		}
		sum := 0
		for i := 0; i < n; i += 4096 {
			sum += int(b[i])
		}
		if sum == 0 {
			os.Exit(3)
		}
		os.Exit(0)
	}
}

// The cgroup variant's setup on whichever hierarchy holds the memory
// controller here (v1 on this project's CI machine, v2 on most others):
// the limit is written, a program that touches three times the limit
// runs inside it with the rest in zram swap, the peaks are read, and
// the teardown leaves no cgroup, no swap device and the parent's
// controllers as they were.
func TestMemoryCgroupVariantSetup(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("a memory cgroup and a swap device need root")
	}
	mount, v2, err := MemoryCgroupMount()
	if err != nil {
		t.Skipf("no memory cgroup: %v", err)
	}
	control := filepath.Join(mount, "cgroup.subtree_control")
	controlBefore, _ := os.ReadFile(control)
	swapsBefore, _ := os.ReadFile("/proc/swaps")

	const limit, touched = 8 << 20, 24 << 20
	cg, skip := setUpMemoryCgroup(limit, touched)
	if cg == nil {
		t.Skipf("the machine does not allow it: %s", skip)
	}
	torn := false
	defer func() {
		if !torn {
			cg.teardown()
		}
	}()
	assert.Equal(t, v2, cg.v2)
	limitFile := "memory.limit_in_bytes"
	if v2 {
		limitFile = "memory.max"
		assert.Contains(t, cg.describe(), "memory cgroup v2 ")
		b, err := os.ReadFile(control)
		require.NoError(t, err)
		assert.Contains(t, strings.Fields(string(b)), "memory", "the parent hands the controller down")
	} else {
		assert.Contains(t, cg.describe(), "memory cgroup v1 ")
	}
	b, err := os.ReadFile(filepath.Join(cg.dir, limitFile))
	require.NoError(t, err)
	assert.Equal(t, strconv.Itoa(limit), strings.TrimSpace(string(b)), limitFile)
	swaps, _ := os.ReadFile("/proc/swaps")
	assert.Contains(t, string(swaps), cg.swapDev, "the zram device is swapped on")

	self, err := os.Executable()
	require.NoError(t, err)
	for run := 0; run < 2; run++ {
		cg.resetPeaks()
		kills := cg.oomKills()
		argv := cg.runIn(self, "-test.run=^$")
		cmd := exec.Command(argv[0], argv[1:]...)
		cmd.Env = append(os.Environ(), touchEnv+"="+strconv.Itoa(touched))
		out, err := cmd.CombinedOutput()
		require.NoError(t, err, "run %d: %s", run, out)
		assert.Equal(t, kills, cg.oomKills(), "run %d: nothing OOM-killed", run)
		mem, memsw, swap := cg.peaks()
		t.Logf("run %d: %s: %s", run, cg.describe(), cgroupPeaks(mem, memsw, swap))
		assert.Greater(t, mem, int64(limit/2), "run %d: the program's memory is charged here", run)
		// The peak may pass the limit by what a charge takes at once
		// before reclaim pulls it back (a page was seen).
		assert.LessOrEqual(t, mem, int64(limit+1<<20), "run %d: the limit held", run)
		if v2 && swap == 0 && memsw == 0 {
			t.Logf("run %d: no swap peak read (memory.swap.peak needs Linux 6.5)", run)
			continue
		}
		if v2 {
			assert.Zero(t, memsw, "v2 has no memory+swap counter")
			assert.Greater(t, swap, int64(touched-2*limit), "run %d: the rest went to swap", run)
		} else if cg.memsw {
			assert.Zero(t, swap, "v1 reports memory plus swap")
			assert.Greater(t, memsw, int64(touched-limit), "run %d: the rest went to swap", run)
		}
	}

	torn = true
	require.NoError(t, cg.teardown())
	assert.NoDirExists(t, cg.dir, "the cgroup is removed")
	swapsAfter, _ := os.ReadFile("/proc/swaps")
	assert.Equal(t, string(swapsBefore), string(swapsAfter), "the swap device is gone")
	controlAfter, _ := os.ReadFile(control)
	assert.Equal(t, string(controlBefore), string(controlAfter), "the parent's controllers are as they were")
}

// noCgroupOrSwapLeft returns a check, for the end of a test that ran a
// benchmark with a cgroup variant, that the benchmark removed the cgroup
// it made and the swap device it added (or made neither).
func noCgroupOrSwapLeft(t *testing.T) func() {
	t.Helper()
	swapsBefore, _ := os.ReadFile("/proc/swaps")
	return func() {
		t.Helper()
		if mount, _, err := MemoryCgroupMount(); err == nil && mount != "" {
			assert.NoDirExists(t, filepath.Join(mount, fmt.Sprintf("uvm-bench-oversub-%d", os.Getpid())), "the cgroup is removed")
		}
		swapsAfter, _ := os.ReadFile("/proc/swaps")
		assert.Equal(t, string(swapsBefore), string(swapsAfter), "the swap device is gone")
	}
}
