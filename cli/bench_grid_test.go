package cli

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestBenchGridFlags(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--rounds", "0"}, "want --rounds >= 1"},
		{[]string{"--reduce-mib", "0"}, "--reduce-mib >= 1"},
		{[]string{"--touch-kib", "6"}, `"6" is not a size in KiB, a multiple of 4`},
		{[]string{"--touch-kib", "64,x"}, `"x" is not a size`},
		{[]string{"--runtime", "rust"}, "--runtime \"rust\": want c, go or c,go"},
	} {
		assert.ErrorContains(t, benchGrid(c.args), c.want, "%v", c.args)
	}
}

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
	r, err := gridBenchC(bin, 1, 1, []int{4, 64}, 64<<20)
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
