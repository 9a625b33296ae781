package lab

import (
	"encoding/json"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/softuvm/softuvm/policy"
	"github.com/softuvm/softuvm/trace"
)

// TestScoreboardDefaultAgainstLRUAndMIN: on a small synthetic trace (a
// hot set through two scans, prefetch none), the scoreboard scores the
// default eviction policy though it was not asked for, and each eviction
// line's faults over lru's and opt's are those of a replay of the line's
// policy over the faults that the brute-force LRU and MIN, written
// without the replay's code, count.
func TestScoreboardDefaultAgainstLRUAndMIN(t *testing.T) {
	const hot, scan, rounds, budget = 16, 300, 2, 64
	refs, blocks := hotSetThroughScans(hot, scan, rounds)
	h, events := pageTrace(refs, nil, blocks, budget)
	path := filepath.Join(t.TempDir(), "synthetic.uvmtrace")
	w, err := trace.Create(path, h)
	require.NoError(t, err)
	for i := range events {
		w.Emit(&events[i])
	}
	require.NoError(t, w.Close())
	_, dropped := w.Counts()
	require.Zero(t, dropped)

	lruFaults, _, _ := bruteLRU(refs, budget)
	minFaults, _, _ := bruteMIN(refs, budget)
	require.Equal(t, hot+rounds*scan, minFaults)
	require.Equal(t, hot+rounds*scan+rounds*hot, lruFaults)
	def, err := ReplayEvents(h, events, Config{Eviction: policy.DefaultEviction})
	require.NoError(t, err)

	scores, err := Scoreboard([]string{path}, []string{"eviction:reuse"}, nil)
	require.NoError(t, err)
	var got []string
	for _, s := range scores {
		got = append(got, s.Policy)
		assert.Equal(t, s.Policy == policy.DefaultEviction, s.Default, s.Policy)
	}
	require.Equal(t, []string{"reuse", policy.DefaultEviction, OracleEviction, OracleEviction + "+none"}, got)
	reuse, dflt, opt, none := scores[0], scores[1], scores[2], scores[3]
	assert.EqualValues(t, minFaults, reuse.Faults)
	assert.InDelta(t, float64(minFaults)/float64(lruFaults), reuse.FaultsVsLRU, 1e-12)
	assert.InDelta(t, 1, reuse.FaultsVsOPT, 1e-12)
	assert.Equal(t, def.Replayed.Faults, dflt.Faults)
	assert.InDelta(t, float64(def.Replayed.Faults)/float64(lruFaults), dflt.FaultsVsLRU, 1e-12)
	assert.InDelta(t, float64(def.Replayed.Faults)/float64(minFaults), dflt.FaultsVsOPT, 1e-12)
	assert.EqualValues(t, minFaults, opt.Faults)
	assert.InDelta(t, float64(minFaults)/float64(lruFaults), opt.FaultsVsLRU, 1e-12)
	assert.Zero(t, none.FaultsVsLRU, "opt with demand fetching has another prefetch: no ratio")

	// JSON carries them; the line without them leaves them out.
	b, err := json.Marshal(dflt)
	require.NoError(t, err)
	var m map[string]any
	require.NoError(t, json.Unmarshal(b, &m))
	assert.InDelta(t, dflt.FaultsVsLRU, m["faults_vs_lru"], 1e-12)
	assert.InDelta(t, dflt.FaultsVsOPT, m["faults_vs_opt"], 1e-12)
	assert.Equal(t, true, m["default"])
	b, err = json.Marshal(none)
	require.NoError(t, err)
	assert.NotContains(t, string(b), "faults_vs_lru")
}
