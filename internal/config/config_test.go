package config

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/softuvm/softuvm/devmem"
	"github.com/softuvm/softuvm/internal/core"
	"github.com/softuvm/softuvm/policy"
)

func TestParseSize(t *testing.T) {
	for in, want := range map[string]int64{"4096": 4096, "64MiB": 64 << 20, "2GiB": 2 << 30, "1G": 1 << 30, "1.5KiB": 1536, "3 MB": 3e6, " 1T ": 1 << 40} {
		got, err := core.ParseSize(in)
		require.NoError(t, err, in)
		assert.Equal(t, want, got, in)
	}
	for _, bad := range []string{"", "abc", "-1", "5 furlongs", "1e30", "99999999999TiB"} {
		_, err := core.ParseSize(bad)
		require.Error(t, err, bad)
		assert.Contains(t, err.Error(), bad)
	}
	assert.Equal(t, "64 MiB", core.FormatSize(64<<20))
	assert.Equal(t, "1536 MiB", core.FormatSize(3<<29), "exact units first")
	assert.Equal(t, "1.5 GiB", core.FormatSize(3<<29+1))
	assert.Equal(t, "100 B", core.FormatSize(100))
}

func TestServerConfigEnv(t *testing.T) {
	env := map[string]string{EnvDevices: "3", EnvArenaSize: "64MiB,128MiB", EnvArenaBackend: "memfd,numa", EnvPrefetch: "window:8", EnvHandlers: "single",
		EnvTrackPrefetch: "1", EnvWorkers: "3", EnvHostBudget: "1GiB", EnvThrashing: "threshold=4,pin=1s"}
	c := DefaultServerConfig()
	require.NoError(t, c.applyEnv(func(k string) string { return env[k] }))
	assert.Equal(t, []devmem.ArenaSpec{
		{Device: 0, Capacity: 64 << 20, Backend: devmem.BackendMemfd, Node: -1},
		{Device: 1, Capacity: 128 << 20, Backend: devmem.BackendNUMA, Node: -1},
		{Device: 2, Capacity: 128 << 20, Backend: devmem.BackendNUMA, Node: -1},
	}, c.Devices, "sizes and backends per device, the last repeating")
	assert.Equal(t, policy.PrefetchSpec{Policy: "window", Window: 8}, c.Prefetch)
	assert.Equal(t, HandlersSingle, c.Handlers)
	assert.True(t, c.TrackPrefetchUse)
	assert.Equal(t, 3, c.DeviceWorkers)
	assert.Equal(t, int64(1<<30), c.HostBudget)
	want := policy.DefaultThrashing
	want.Threshold, want.Pin = 4, core.Duration(time.Second)
	assert.Equal(t, want, c.Thrashing)

	back, err := UnmarshalServerConfig(c.Marshal())
	require.NoError(t, err)
	assert.Equal(t, c, back, "the configuration survives the trip to a private server")

	for k, v := range map[string]string{EnvDevices: "99", EnvArenaSize: "lots", EnvArenaBackend: "memfd,tape", EnvPrefetch: "psychic", EnvHandlers: "many",
		EnvTrackPrefetch: "maybe", EnvWorkers: "0", EnvHostBudget: "much", EnvThrashing: "threshold=1"} {
		c := DefaultServerConfig()
		err := c.applyEnv(func(key string) string {
			if key == k {
				return v
			}
			return ""
		})
		require.Error(t, err, k)
		assert.Contains(t, err.Error(), v, "the error for %s names the value", k)
	}
}

func TestParseTraceAccess(t *testing.T) {
	for _, c := range []struct {
		in   string
		want TraceAccess
	}{
		{"", TraceAccess{}},
		{"off", TraceAccess{}},
		{"on", TraceAccess{Period: core.Duration(100 * time.Millisecond), Sample: 64 << 20}},
		{"250ms", TraceAccess{Period: core.Duration(250 * time.Millisecond), Sample: 64 << 20}},
		{" 1s , 16MiB ", TraceAccess{Period: core.Duration(time.Second), Sample: 16 << 20}},
	} {
		got, err := ParseTraceAccess(c.in)
		require.NoError(t, err, "%q", c.in)
		require.Equal(t, c.want, got, "%q", c.in)
		back, err := ParseTraceAccess(got.String())
		require.NoError(t, err, "%q", got.String())
		require.Equal(t, got, back, "String of %q", c.in)
	}
	for _, in := range []string{"5ms", "2m", "fast", "100ms,", "100ms,1KiB", "100ms,lots"} {
		_, err := ParseTraceAccess(in)
		require.ErrorIs(t, err, core.ErrInvalidValue, "%q", in)
		require.ErrorContains(t, err, in, "the error names the setting")
	}
}
