package policy

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestNvidiaAvoidMarksPinnedAndNearPages drives the detector with random
// migrations and faults, a few pages at a time so that some thrash and
// get pinned, and after each step compares Avoid with the pages it must
// mark, read from the detector's per-page state: pinned, or one move
// short of thrashing. Avoid skips its pass over the block where it
// counts no such page, so a miscount shows here as a page left out.
func TestNvidiaAvoidMarksPinnedAndNearPages(t *testing.T) {
	spec := DefaultThrashing
	spec.PinThreshold = 2 // pins within the test's few hundred steps
	n := &NvidiaThrashing{Spec: spec}
	th := n.NewState().(*nvidiaBlock)
	rng := rand.New(rand.NewPCG(1, 2))
	now := Clock(time.Second)
	var marked, pinned, near int
	for step := 0; step < 20000; step++ {
		now += Clock(time.Duration(rng.IntN(400)) * time.Microsecond)
		if rng.IntN(50) == 0 {
			now += Clock(2 * time.Second) // past the epoch and every pin
		}
		p := rng.IntN(8) // eight pages: each moves often
		if rng.IntN(3) == 0 {
			n.Check(th, ThrashFault{Page: p, HostPreferred: true, Now: now})
		} else {
			var m PageMask
			m.Set(p)
			n.Migrated(th, m, now)
		}
		var got, want PageMask
		n.Avoid(th, PagesPerBlock, now, &got)
		for q := 0; q < PagesPerBlock; q++ {
			isPinned := th.pinnedTill[q] > micros(now)
			isNear := int(th.count[q]) >= spec.Threshold-1
			if isPinned || isNear {
				want.Set(q)
			}
			if isPinned {
				pinned++
			} else if isNear {
				near++
			}
		}
		require.Equal(t, want, got, "step %d", step)
		marked += got.Count()
	}
	// The walk must have reached every case Avoid distinguishes.
	require.Positive(t, pinned, "no page was ever pinned")
	require.Positive(t, near, "no page was ever one move short of thrashing")
	require.Less(t, marked, 20000*8, "every page was always marked")
}
