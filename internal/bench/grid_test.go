package bench

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A tiny `uvm bench grid`, C side: the program builds against libuvm,
// runs every measurement once (its own checks of the sums and touches
// pass), and reports each figure.
func TestBenchGridC(t *testing.T) {
	if testing.Short() {
		t.Skip("builds uvm and libuvm")
	}
	if os.Geteuid() != 0 {
		t.Skip("userfaultfd is root-only here")
	}
	if _, err := exec.LookPath("cc"); err != nil {
		t.Skipf("no cc: %v", err)
	}
	bin := filepath.Join(t.TempDir(), "uvm")
	out, err := exec.Command("go", "build", "-o", bin, "github.com/softuvm/softuvm/cmd/uvm").CombinedOutput()
	require.NoError(t, err, "%s", out)
	t.Setenv("XDG_CACHE_HOME", t.TempDir()) // libuvm.a built afresh, not a cached older one
	t.Setenv("UVM_DEVICE_WORKERS", "2")
	r, err := gridBenchC(bin, 1, 1, []int{4, 64}, 64<<20, t.Logf)
	require.NoError(t, err)
	assert.Equal(t, 2, r.Workers)
	assert.Positive(t, r.NullGridUS)
	assert.Positive(t, r.NullThreadsUS)
	assert.InDelta(t, r.NullGridUS/r.NullThreadsUS, r.NullRatio, 1e-9)
	assert.Len(t, r.BarrierNSPerThread, 3)
	assert.Equal(t, 1, r.ReduceMiB)
	assert.Positive(t, r.ReduceGridMS)
	require.Len(t, r.Touch, 2)
	assert.Equal(t, 64, r.Touch[1].KiB)
	assert.Positive(t, r.Touch[1].GridUS)
}
