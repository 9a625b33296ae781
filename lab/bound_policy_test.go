package lab

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/softuvm/softuvm/internal/core"
)

// TestPolicyFaultsMatchesBruteForceLRU: the default-policy column of the
// bound replays the stream through the engine: with lru, on random
// reference strings over a few blocks, its faults but the cold ones are
// the brute-force LRU's (bruteLRU, written without the replay's code),
// and references inside an excluded span change nothing.
func TestPolicyFaultsMatchesBruteForceLRU(t *testing.T) {
	base := uint64(testBase / PageSize)
	for seed := uint64(1); seed <= 8; seed++ {
		blocks, budget := 1+int(seed%4), 40+int(seed*37%200)
		_, _, refs := randomTrace(seed, blocks, budget, 2000)
		distinct := map[int]bool{}
		for _, p := range refs {
			distinct[p] = true
		}
		// A page of an excluded span, in a block the string references.
		strayPage := 0
		for distinct[strayPage] {
			strayPage++
		}
		stray := base + uint64(strayPage)
		stream, err := PageRefs(func(yield func(uint64, bool) bool) {
			for i, p := range refs {
				if !yield(base+uint64(p), false) {
					return
				}
				if i%7 == 0 && !yield(stray, true) {
					return
				}
			}
		})
		require.NoError(t, err)
		exclude := []Span{{Start: stray * PageSize, End: (stray + 1) * PageSize}}
		got, err := stream.PolicyFaults(exclude, "lru", int64(budget)*PageSize)
		require.NoError(t, err)
		faults, _, _ := bruteLRU(refs, budget)
		name := fmt.Sprintf("seed %d, %d blocks, budget %d pages", seed, blocks, budget)
		assert.EqualValues(t, faults-len(distinct), got, name)
		assert.Positive(t, got, name+": the string must fault beyond its cold faults")
	}
	stream, err := PageRefs(func(yield func(uint64, bool) bool) { yield(base, false) })
	require.NoError(t, err)
	_, err = stream.PolicyFaults(nil, OracleEviction, core.BlockSize)
	assert.ErrorIs(t, err, core.ErrInvalidValue)
}
