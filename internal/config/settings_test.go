package config

import (
	"runtime"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// fromEnv is the configuration of an environment holding only env.
func fromEnv(env map[string]string) (ServerConfig, error) {
	c := DefaultServerConfig()
	err := c.applyEnv(func(k string) string { return env[k] })
	return c, err
}

// TestSettingsAreTheCodesDefaults: every server variable's printed
// default, given to the variable, configures the server that the
// variable unset does (resolved as the server reads empty fields); a
// default that is a phrase, not a value, is checked against the field
// it describes. The trace access mode's "off" is the zero mode.
func TestSettingsAreTheCodesDefaults(t *testing.T) {
	unset, err := fromEnv(nil)
	require.NoError(t, err)
	phrases := map[string]func(){
		EnvWorkers: func() {
			assert.Zero(t, unset.DeviceWorkers)
			assert.Equal(t, runtime.NumCPU(), unset.Workers(), "one per CPU")
		},
		EnvHostBudget:  func() { assert.Zero(t, unset.HostBudget, "unbounded") },
		EnvCopyThreads: func() { assert.Zero(t, unset.CopyProducers, "calibrated: 0 lets the engine choose") },
	}
	seen := map[string]bool{}
	for _, s := range Settings {
		assert.False(t, seen[s.Env], "%s listed twice", s.Env)
		seen[s.Env] = true
		assert.NotContains(t, s.Values, "default", "%s: Values claims a default; Default is the default", s.Env)
		if !s.Server {
			continue
		}
		require.NotEmpty(t, s.Default, s.Env)
		set, err := fromEnv(map[string]string{s.Env: s.Default})
		if check, ok := phrases[s.Env]; ok {
			require.Error(t, err, "%s=%q parses: then it is a value, to be checked as one", s.Env, s.Default)
			check()
			continue
		}
		require.NoError(t, err, "%s=%q, its printed default, is refused", s.Env, s.Default)
		assert.Equal(t, unset.Resolved(), set.Resolved(), "%s=%q configures another server than %s unset", s.Env, s.Default, s.Env)
	}
	for env := range phrases {
		assert.True(t, seen[env], "%s has a phrase check but no setting", env)
	}
	a, err := ParseTraceAccess(SettingOf(EnvTraceAccess).Default)
	require.NoError(t, err)
	assert.Equal(t, TraceAccess{}, a)
	assert.Panics(t, func() { SettingOf("UVM_NO_SUCH") })
}

// TestResolved: an empty field resolves to what the server makes of it,
// a chosen one stays.
func TestResolved(t *testing.T) {
	r := ServerConfig{}.Resolved()
	assert.Equal(t, "clock", r.Eviction)
	assert.Equal(t, "fault", r.Coherence)
	assert.Equal(t, "auto", r.DirtyTracking)
	assert.Equal(t, LargeFoliosAuto, r.LargeFolios)
	assert.Equal(t, AccessCountingAuto, r.AccessCounting)
	assert.Equal(t, DefaultServerConfig().AccessPolicy, r.AccessPolicy)
	c := ServerConfig{Eviction: "lru", Coherence: "launch", DirtyTracking: "wp-fault", LargeFolios: "off", AccessCounting: "user"}
	r = c.Resolved()
	r.AccessPolicy = c.AccessPolicy
	assert.Equal(t, c, r)
}
