package uvm

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/softuvm/softuvm/internal/core"
	"github.com/softuvm/softuvm/policy"
)

func TestParseThrashingSpec(t *testing.T) {
	for _, s := range []string{"", "on", "default"} {
		got, err := policy.ParseThrashingSpec(s)
		require.NoError(t, err, s)
		assert.Equal(t, policy.DefaultThrashing, got, s)
	}
	off, err := policy.ParseThrashingSpec("off")
	require.NoError(t, err)
	assert.False(t, off.Enabled)
	assert.Equal(t, "off", off.String())

	got, err := policy.ParseThrashingSpec("threshold=5,lapse=2ms,nap=1ms,pin-threshold=3,pin=1s,epoch=4s")
	require.NoError(t, err)
	assert.Equal(t, policy.ThrashingSpec{Enabled: true, Threshold: 5, Lapse: core.Duration(2 * time.Millisecond), Nap: core.Duration(time.Millisecond),
		PinThreshold: 3, Pin: core.Duration(time.Second), Epoch: core.Duration(4 * time.Second),
		Refault: true, RefaultDistance: 100, Core: 97, CoreAge: 4}, got, "the refault settings keep their defaults")
	back, err := policy.ParseThrashingSpec(got.String())
	require.NoError(t, err)
	assert.Equal(t, got, back, "String parses back")

	for spec, msg := range map[string]string{
		"threshold":       "want key=value",
		"speed=3":         `unknown key "speed"`,
		"threshold=x":     `"threshold=x"`,
		"threshold=1":     "threshold 1: want 2 to 255",
		"lapse=0s":        "lapse 0s",
		"epoch=1us":       "epoch 1µs: want at least the lapse",
		"pin-threshold=0": "pin threshold 0",
	} {
		_, err := policy.ParseThrashingSpec(spec)
		require.Error(t, err, spec)
		assert.ErrorIs(t, err, ErrInvalidValue, spec)
		assert.Contains(t, err.Error(), msg, spec)
	}
}

func TestParseAdvice(t *testing.T) {
	for a := AdviseSetReadMostly; a <= AdviseUnsetAccessedBy; a++ {
		got, err := ParseAdvice(a.String())
		require.NoError(t, err)
		assert.Equal(t, a, got)
	}
	_, err := ParseAdvice("set-fast")
	assert.ErrorIs(t, err, ErrInvalidValue)
	assert.Contains(t, err.Error(), `"set-fast"`)
}
