package policy

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/softuvm/softuvm/internal/core"
)

// TestRegistered: the built-in policies are there, those that are built
// without a factory (density, window, none) too, and a registered one
// appears once registered.
func TestRegistered(t *testing.T) {
	has := func(r Ref) bool {
		for _, x := range Registered() {
			if x == r {
				return true
			}
		}
		return false
	}
	for _, r := range []Ref{
		{KindPrefetch, "density"}, {KindPrefetch, "window"}, {KindPrefetch, "none"},
		{KindEviction, "lru"}, {KindEviction, "2q"}, {KindEviction, "clock"}, {KindThrashing, "nvidia"}, {KindAccessMigration, "threshold"},
	} {
		assert.True(t, has(r), "%v", r)
	}
	late := Ref{KindEviction, "registry-test-late"}
	assert.False(t, has(late))
	require.NoError(t, RegisterEviction(late.Name, func(string) (Eviction, error) { return NewLRU(), nil }))
	assert.True(t, has(late))
	assert.Equal(t, `eviction policy "registry-test-late"`, late.String())
}

// TestUnknownError: every way of naming a policy that nothing registered
// gives an UnknownError with the kind, the name and what is known, which
// is still an invalid value and reads as before.
func TestUnknownError(t *testing.T) {
	_, prefetchParse := ParsePrefetchSpec("psychic:3")
	_, prefetchNew := NewPrefetchPolicy(PrefetchSpec{Policy: "psychic"})
	_, eviction := NewEviction("psychic")
	_, thrashing := ParseThrashingSpec("threshold=4,policy=psychic")
	_, access := ParseAccessPolicy("migration=psychic")
	for _, c := range []struct {
		err        error
		kind, name string
		text       string
	}{
		{prefetchParse, KindPrefetch, "psychic:3", `invalid value: prefetch policy "psychic:3": want one of density[:PERCENT], window:PAGES, none`},
		{prefetchNew, KindPrefetch, "psychic", `prefetch policy "psychic": want one of density[:PERCENT]`},
		{eviction, KindEviction, "psychic", `invalid value: eviction policy "psychic": want one of lru, 2q`},
		{ValidateEviction("psychic"), KindEviction, "psychic", `eviction policy "psychic": want one of lru, 2q`},
		{thrashing, KindThrashing, "psychic", `thrashing setting "policy=psychic": invalid value: thrashing policy "psychic": want one of nvidia`},
		{access, KindAccessMigration, "psychic", `access policy setting "migration=psychic": invalid value: access migration policy "psychic": want one of threshold`},
	} {
		var u *UnknownError
		require.True(t, errors.As(c.err, &u), "%v", c.err)
		assert.Equal(t, c.kind, u.Kind)
		assert.Equal(t, c.name, u.Name)
		assert.NotEmpty(t, u.Known)
		assert.ErrorIs(t, c.err, core.ErrInvalidValue)
		assert.ErrorContains(t, c.err, c.text)
	}
}

// TestBuiltin: the package's own policies of every kind are built in; a
// registered one, or a name of another kind, is not.
func TestBuiltin(t *testing.T) {
	for _, r := range []Ref{
		{KindPrefetch, "density"}, {KindPrefetch, "window"}, {KindPrefetch, "none"},
		{KindEviction, "lru"}, {KindEviction, "2q"}, {KindEviction, "clock"}, {KindEviction, "reuse"},
		{KindThrashing, "nvidia"}, {KindAccessMigration, "threshold"},
	} {
		assert.True(t, Builtin(r), "%v", r)
	}
	require.NoError(t, RegisterEviction("builtin-test-registered", func(string) (Eviction, error) { return NewLRU(), nil }))
	for _, r := range []Ref{{KindEviction, "builtin-test-registered"}, {KindPrefetch, "lru"}, {"colour", "lru"}} {
		assert.False(t, Builtin(r), "%v", r)
	}
}
