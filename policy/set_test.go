package policy_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/softuvm/softuvm/internal/core"
	"github.com/softuvm/softuvm/policy"
)

// TestNewSetBuildsEachKindOnce: a set of the zero Specs is the defaults,
// with the optional interfaces of its eviction found; a bad spec of any
// kind is refused, naming the bad value.
func TestNewSetBuildsEachKindOnce(t *testing.T) {
	set, err := policy.NewSet(policy.Specs{Thrashing: policy.DefaultThrashing})
	require.NoError(t, err)
	assert.Equal(t, "density", set.Prefetch.Name())
	assert.Equal(t, policy.DefaultEviction, set.Eviction.Name())
	assert.NotNil(t, set.Thrashing)
	assert.NotNil(t, set.Refaulting, "nvidia answers refaults")
	assert.Equal(t, policy.DefaultMechanism, set.Mechanism)
	assert.True(t, set.CleanCopies, "clock evicts clean copies")
	two, err := policy.NewSet(policy.Specs{Eviction: "2q"})
	require.NoError(t, err)
	assert.NotNil(t, two.PageEviction, "2q chooses pages")
	assert.Nil(t, two.Thrashing, "the zero ThrashingSpec is off")
	copying, err := policy.NewSet(policy.Specs{Eviction: "clock:copy"})
	require.NoError(t, err)
	assert.False(t, copying.CleanCopies, "clock:copy copies every page")

	for spec, want := range map[string]policy.Specs{
		"nosuch":    {Eviction: "nosuch"},
		"lru:x":     {Eviction: "lru:x"},
		"101":       {Prefetch: policy.PrefetchSpec{Policy: "density", Threshold: 101}},
		"threshold": {Thrashing: policy.ThrashingSpec{Enabled: true, Threshold: -1}},
		"pin waits": {Mechanism: policy.Mechanism{PinWaits: -3}},
	} {
		_, err := policy.NewSet(want)
		assert.ErrorIs(t, err, core.ErrInvalidValue, spec)
		assert.ErrorContains(t, err, spec)
		assert.Equal(t, err, want.Validate())
	}
}

// TestParseMechanism: settings over the defaults, written back by String
// as read; bad keys and values refused by name.
func TestParseMechanism(t *testing.T) {
	m, err := policy.ParseMechanism("")
	require.NoError(t, err)
	assert.Equal(t, policy.DefaultMechanism, m)
	assert.Equal(t, "default", m.String())
	m, err = policy.ParseMechanism("read-aheads=4, whole-move=75%,pin-waits=5,evict-rounds=8,evict-wait=2s,evict-retry=10us")
	require.NoError(t, err)
	assert.Equal(t, policy.Mechanism{ReadAheads: 4, WholeMovePercent: 75, PinWaits: 5, EvictRounds: 8,
		EvictWait: core.Duration(2 * time.Second), EvictRetry: core.Duration(10 * time.Microsecond)}, m)
	again, err := policy.ParseMechanism(m.String())
	require.NoError(t, err)
	assert.Equal(t, m, again)
	for _, bad := range []string{"speed=3", "pin-waits", "pin-waits=0", "whole-move=100", "evict-wait=soon", "evict-retry=2s"} {
		_, err := policy.ParseMechanism(bad)
		assert.ErrorIs(t, err, core.ErrInvalidValue, bad)
	}
}

// TestWholeMove: more than the percentage of the block, and every page
// it has elsewhere.
func TestWholeMove(t *testing.T) {
	m := policy.DefaultMechanism
	var elsewhere, moving core.PageMask
	elsewhere.FillRange(0, 300)
	moving.FillRange(0, 256)
	assert.False(t, m.WholeMove(512, elsewhere, moving), "exactly half")
	moving.FillRange(0, 257)
	assert.False(t, m.WholeMove(512, elsewhere, moving), "pages left elsewhere")
	moving.FillRange(0, 300)
	assert.True(t, m.WholeMove(512, elsewhere, moving))
	m.WholeMovePercent = 60
	assert.False(t, m.WholeMove(512, elsewhere, moving), "58% under a 60% threshold")
}
