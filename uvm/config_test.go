package uvm

import (
	"testing"

	"github.com/softuvm/softuvm/devmem"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestParseSize(t *testing.T) {
	for in, want := range map[string]int64{"4096": 4096, "64MiB": 64 << 20, "2GiB": 2 << 30, "1G": 1 << 30, "1.5KiB": 1536, "3 MB": 3e6, " 1T ": 1 << 40} {
		got, err := ParseSize(in)
		require.NoError(t, err, in)
		assert.Equal(t, want, got, in)
	}
	for _, bad := range []string{"", "abc", "-1", "5 furlongs", "1e30", "99999999999TiB"} {
		_, err := ParseSize(bad)
		require.Error(t, err, bad)
		assert.Contains(t, err.Error(), bad)
	}
	assert.Equal(t, "64 MiB", FormatSize(64<<20))
	assert.Equal(t, "1536 MiB", FormatSize(3<<29), "exact units first")
	assert.Equal(t, "1.5 GiB", FormatSize(3<<29+1))
	assert.Equal(t, "100 B", FormatSize(100))
}

func TestServerConfigEnv(t *testing.T) {
	env := map[string]string{EnvDevices: "2", EnvArenaSize: "64MiB,128MiB", EnvArenaBackend: "memfd", EnvPrefetch: "window:8", EnvHandlers: "single", EnvTrackPrefetch: "1"}
	c := DefaultServerConfig()
	require.NoError(t, c.applyEnv(func(k string) string { return env[k] }))
	assert.Equal(t, []devmem.ArenaSpec{
		{Device: 0, Capacity: 64 << 20, Backend: devmem.BackendMemfd, Node: -1},
		{Device: 1, Capacity: 128 << 20, Backend: devmem.BackendMemfd, Node: -1},
	}, c.Devices)
	assert.Equal(t, PrefetchSpec{Policy: "window", Window: 8}, c.Prefetch)
	assert.Equal(t, HandlersSingle, c.Handlers)
	assert.True(t, c.TrackPrefetchUse)

	back, err := unmarshalServerConfig(c.marshal())
	require.NoError(t, err)
	assert.Equal(t, c, back, "the configuration survives the trip to a private server")

	for k, v := range map[string]string{EnvDevices: "99", EnvArenaSize: "lots", EnvArenaBackend: "tape", EnvPrefetch: "psychic", EnvHandlers: "many", EnvTrackPrefetch: "maybe"} {
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
