package config

import (
	"strings"

	"github.com/softuvm/softuvm/policy"
)

// PolicyRefs lists the policies c selects by name, defaults included:
// what a process must have registered to build a server configured
// with c.
func (c ServerConfig) PolicyRefs() []policy.Ref {
	prefetch := c.Prefetch.Policy
	if prefetch == "" {
		prefetch = policy.DefaultPrefetch.Policy
	}
	eviction := c.Eviction
	if eviction == "" {
		eviction = policy.DefaultEviction
	}
	refs := []policy.Ref{
		{Kind: policy.KindPrefetch, Name: specName(prefetch)},
		{Kind: policy.KindEviction, Name: specName(eviction)},
	}
	if c.Thrashing.Enabled {
		name := c.Thrashing.Policy
		if name == "" {
			name = policy.DefaultThrashingPolicy
		}
		refs = append(refs, policy.Ref{Kind: policy.KindThrashing, Name: name})
	}
	name := c.ParsedAccessPolicy().Migration
	if name == "" {
		name = policy.DefaultAccessMigration
	}
	return append(refs, policy.Ref{Kind: policy.KindAccessMigration, Name: name})
}

// EnvPolicyRefs lists the policies the UVM_* variables of getenv select
// by name. It reads only the names, never the rest of the settings: it is
// asked before the program's policies are registered, when parsing the
// variables would fail on the very names it is after. A malformed
// setting is left for ServerConfigFromEnv to report.
func EnvPolicyRefs(getenv func(string) string) []policy.Ref {
	var refs []policy.Ref
	add := func(kind, name string) {
		if name = strings.TrimSpace(name); name != "" {
			refs = append(refs, policy.Ref{Kind: kind, Name: name})
		}
	}
	add(policy.KindPrefetch, specName(getenv(EnvPrefetch)))
	add(policy.KindEviction, specName(getenv(EnvEviction)))
	add(policy.KindThrashing, setting(getenv(EnvThrashing), "policy"))
	add(policy.KindAccessMigration, setting(getenv(EnvAccessPolicy), "migration"))
	return refs
}

// specName is the name of a "name[:arg]" spec.
func specName(spec string) string {
	name, _, _ := strings.Cut(strings.TrimSpace(spec), ":")
	return name
}

// setting is the value of key in a comma list of key=value settings
// (the last one given, as the parsers take it), or "".
func setting(list, key string) string {
	var v string
	for _, kv := range strings.Split(list, ",") {
		if k, val, ok := strings.Cut(kv, "="); ok && strings.TrimSpace(k) == key {
			v = val
		}
	}
	return v
}
