package config

import (
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/softuvm/softuvm/policy"
)

func TestPolicyRefs(t *testing.T) {
	refs := func(kv ...string) []policy.Ref {
		var out []policy.Ref
		for i := 0; i < len(kv); i += 2 {
			out = append(out, policy.Ref{Kind: kv[i], Name: kv[i+1]})
		}
		return out
	}
	c := DefaultServerConfig()
	assert.Equal(t, refs(policy.KindPrefetch, "density", policy.KindEviction, "clock", policy.KindThrashing, "nvidia", policy.KindAccessMigration, "threshold"),
		c.PolicyRefs(), "the defaults, named")
	c.Prefetch = policy.PrefetchSpec{Policy: "evens:2"}
	c.Eviction = "mru:x"
	c.Thrashing = policy.ThrashingSpec{}
	c.AccessPolicy = policy.DefaultAccessPolicy
	c.AccessPolicy.Migration = "student"
	assert.Equal(t, refs(policy.KindPrefetch, "evens", policy.KindEviction, "mru", policy.KindAccessMigration, "student"),
		c.PolicyRefs(), "names without arguments; no thrashing policy when thrashing is off")
}

// TestEnvPolicyRefs: the names are read from the variables whatever they
// name, registered or not, and nothing else is.
func TestEnvPolicyRefs(t *testing.T) {
	env := map[string]string{
		EnvPrefetch:     "evens:3",
		EnvEviction:     " mru ",
		EnvThrashing:    "threshold=4,policy=student,pin=1ms",
		EnvAccessPolicy: "migration=eager,threshold=8",
		EnvDevices:      "2",
	}
	assert.Equal(t, []policy.Ref{
		{Kind: policy.KindPrefetch, Name: "evens"},
		{Kind: policy.KindEviction, Name: "mru"},
		{Kind: policy.KindThrashing, Name: "student"},
		{Kind: policy.KindAccessMigration, Name: "eager"},
	}, EnvPolicyRefs(func(k string) string { return env[k] }))
	env = map[string]string{EnvThrashing: "off", EnvAccessPolicy: "threshold=8"}
	assert.Empty(t, EnvPolicyRefs(func(k string) string { return env[k] }), "settings that name no policy")
}
