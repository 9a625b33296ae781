package lab

import (
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// shippedTraces are the traces of real programs in lab/traces.
func shippedTraces(t *testing.T) []*Loaded {
	t.Helper()
	paths, err := filepath.Glob("traces/*.uvmtrace.gz")
	require.NoError(t, err)
	require.GreaterOrEqual(t, len(paths), 5, "lab/traces must hold the shipped traces")
	var out []*Loaded
	for _, p := range paths {
		l, err := Load(p)
		require.NoError(t, err)
		require.False(t, l.CutShort, p)
		out = append(out, l)
	}
	return out
}

// TestShippedTracesReplayFidelity: replaying the policies a shipped
// trace was recorded with reproduces the recorded run's faults and bytes
// moved within 5% (docs/lab.md says why it holds for one-thread
// programs, which they are).
func TestShippedTracesReplayFidelity(t *testing.T) {
	for _, l := range shippedTraces(t) {
		res, err := l.Replay(Config{})
		require.NoError(t, err)
		faults, bytes := res.Fidelity()
		t.Logf("%s: faults %d replayed / %d recorded (%.3f), bytes %d / %d (%.3f), %.2f million events a second",
			filepath.Base(l.Path), res.Replayed.Faults, res.Recorded.Faults, faults, res.Replayed.BytesMoved(), res.Recorded.BytesMoved(), bytes, res.EventsPerSecond()/1e6)
		assert.Positive(t, res.Recorded.EvictedPages, "%s: a shipped trace must have evictions", l.Path)
		assert.InDelta(t, 1, faults, 0.05, "%s: faults", l.Path)
		assert.InDelta(t, 1, bytes, 0.05, "%s: bytes moved", l.Path)
	}
}

// TestShippedTracesOPTBoundsEveryPolicy: on every shipped trace, opt
// with demand fetching moves no more bytes than any pair of built-in
// eviction and prefetch policies.
func TestShippedTracesOPTBoundsEveryPolicy(t *testing.T) {
	for _, l := range shippedTraces(t) {
		bound, err := l.Replay(Config{Eviction: OracleEviction, Prefetch: "none"})
		require.NoError(t, err)
		for _, ev := range []string{"lru", "2q"} {
			for _, pf := range []string{"none", "density", "window:16"} {
				res, err := l.Replay(Config{Eviction: ev, Prefetch: pf})
				require.NoError(t, err)
				assert.LessOrEqual(t, bound.Replayed.BytesMoved(), res.Replayed.BytesMoved(), "%s: opt with demand fetching against %s with %s", l.Path, ev, pf)
			}
		}
	}
}
