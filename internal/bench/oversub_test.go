package bench

import (
	"encoding/binary"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The swap header written where mkswap is missing: what mkswap writes,
// but for the UUID.
func TestSwapHeader(t *testing.T) {
	const size = 1 << 20
	h := swapHeader(size)
	require.Len(t, h, 4096)
	assert.Equal(t, "SWAPSPACE2", string(h[4086:]))
	assert.Equal(t, uint32(1), binary.LittleEndian.Uint32(h[1024:]), "version")
	assert.Equal(t, uint32(size/4096-1), binary.LittleEndian.Uint32(h[1028:]), "last page")
	assert.Equal(t, uint32(0), binary.LittleEndian.Uint32(h[1032:]), "bad pages")

	mkswap, err := exec.LookPath("mkswap")
	if err != nil {
		t.Skip("no mkswap to compare with")
	}
	f := filepath.Join(t.TempDir(), "swap")
	require.NoError(t, os.WriteFile(f, make([]byte, size), 0o600))
	out, err := exec.Command(mkswap, f).CombinedOutput()
	require.NoError(t, err, "%s", out)
	theirs, err := os.ReadFile(f)
	require.NoError(t, err)
	assert.Equal(t, theirs[:1036], h[:1036], "up to the UUID")
	assert.Equal(t, theirs[1052:4096], h[1052:], "after the UUID")
}

// A tiny `uvm bench oversub`: all three variants (or the reason the
// cgroup one was skipped), every run checked by the program, and the
// cgroup and swap device gone after.
func TestBenchOversub(t *testing.T) {
	uvmBin := buildUVMForTest(t)
	leftNothing := noCgroupOrSwapLeft(t)

	rep, err := Oversub(OversubOptions{Budget: 2 << 20, Size: 6 << 20, Sweeps: 2, Runs: 1,
		UVMBin: uvmBin, Progress: t.Logf})
	require.NoError(t, err)
	assert.True(t, rep.Checked, "the program checked every word of every run")
	assert.Equal(t, int64(6<<20), rep.SizeBytes)
	for name, v := range map[string]*OversubVariant{"unmanaged": &rep.Unmanaged, "managed": &rep.Managed} {
		assert.Greater(t, v.SweepSeconds, 0.0, name)
		assert.Greater(t, v.WallSeconds, 0.0, name)
		assert.Len(t, v.SweepRuns, 1, name)
	}
	assert.GreaterOrEqual(t, rep.Managed.ManagedBytes, uint64(6<<20), "the array is managed")
	assert.Greater(t, rep.Managed.EvictedPages, uint64(0), "6 MiB under a 2 MiB budget evicts")
	assert.Greater(t, rep.ManagedToUnmanaged, 0.0)
	if rep.Cgroup == nil {
		assert.NotEmpty(t, rep.CgroupSkipped)
		t.Logf("cgroup variant skipped: %s", rep.CgroupSkipped)
	} else {
		assert.Greater(t, rep.Cgroup.SweepSeconds, 0.0)
		assert.Greater(t, rep.Cgroup.WallSeconds, 0.0)
		assert.LessOrEqual(t, rep.Cgroup.PeakMemoryBytes, int64(2<<20), "the limit held")
		if rep.Cgroup.PeakMemorySwapBytes > 0 {
			assert.Greater(t, rep.Cgroup.PeakMemorySwapBytes, int64(2<<20), "the rest went to swap")
		}
		if rep.Cgroup.PeakSwapBytes > 0 { // cgroup v2
			assert.Greater(t, rep.Cgroup.PeakSwapBytes, int64(2<<20), "the rest went to swap")
		}
		require.NotNil(t, rep.ManagedToCgroup)
		require.NotNil(t, rep.GoalCgroupMet)
	}
	leftNothing()
}
