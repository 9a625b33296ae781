package cli

import (
	"flag"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestReplayFlags: the flags of uvm trace replay and uvm lab score become
// the replay's configuration, and bad values are refused naming them.
func TestReplayFlags(t *testing.T) {
	costs := filepath.Join(t.TempDir(), "costs.json")
	require.NoError(t, os.WriteFile(costs, []byte(`{"fault_ns": 20000, "page_to_host_ns": 1000}`), 0o644))
	parse := func(args ...string) (*replayFlags, error) {
		fs := flag.NewFlagSet("t", flag.ContinueOnError)
		rf := addReplayFlags(fs)
		return rf, fs.Parse(args)
	}
	rf, err := parse("--eviction", "opt", "--prefetch", "window:8", "--host-budget", "16M", "--arena-size", "1G", "--devices", "2", "--costs", costs)
	require.NoError(t, err)
	cfg, err := rf.config()
	require.NoError(t, err)
	assert.Equal(t, "opt", cfg.Eviction)
	assert.Equal(t, "window:8", cfg.Prefetch)
	assert.EqualValues(t, 16<<20, cfg.HostBudget)
	assert.EqualValues(t, 1<<30, cfg.DeviceBytes)
	assert.Equal(t, 2, cfg.Devices)
	require.NotNil(t, cfg.Costs)
	assert.Equal(t, 20*time.Microsecond, cfg.Costs.Fault)
	assert.Equal(t, time.Microsecond, cfg.Costs.PageToHost)

	rf, err = parse("--host-budget", "none")
	require.NoError(t, err)
	cfg, err = rf.config()
	require.NoError(t, err)
	assert.EqualValues(t, -1, cfg.HostBudget, "none: no budget, whatever the trace had")

	for _, bad := range [][]string{{"--host-budget", "lots"}, {"--arena-size", "0"}, {"--devices", "-1"}, {"--costs", filepath.Join(t.TempDir(), "missing.json")}} {
		rf, err := parse(bad...)
		require.NoError(t, err)
		_, err = rf.config()
		assert.ErrorContains(t, err, bad[0], "%v", bad)
	}
}
