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

// TestThrashingSpecRefaultSettings: the refault keys parse, print back,
// and are checked with the value and what was wanted named.
func TestThrashingSpecRefaultSettings(t *testing.T) {
	def, err := ParseThrashingSpec("on")
	require.NoError(t, err)
	require.True(t, def.Refault)
	require.Equal(t, 100, def.RefaultDistance)
	require.Equal(t, 97, def.Core)
	require.Equal(t, 4, def.CoreAge)

	s, err := ParseThrashingSpec("refault-distance=250,core=80,core-age=9")
	require.NoError(t, err)
	require.Equal(t, 250, s.RefaultDistance)
	require.Equal(t, 80, s.Core)
	require.Equal(t, 9, s.CoreAge)
	back, err := ParseThrashingSpec(s.String())
	require.NoError(t, err)
	require.Equal(t, s, back, "String reads back: %s", s)

	off, err := ParseThrashingSpec("refault=off")
	require.NoError(t, err)
	require.False(t, off.Refault)
	require.Contains(t, off.String(), "refault=off")
	back, err = ParseThrashingSpec(off.String())
	require.NoError(t, err)
	require.False(t, back.Refault)

	for spec, want := range map[string]string{
		"core=100":             `core 100: want 1 to 99`,
		"core=0":               `core 0: want 1 to 99`,
		"refault-distance=0":   `refault-distance 0: want 1 to 1000`,
		"core-age=0":           `core-age 0: want 1 to 1000`,
		"refault=maybe":        `"refault=maybe": want on or off`,
		"core=x":               `"core=x"`,
		"refault-distanse=100": `unknown key "refault-distanse" (want policy, threshold, lapse, nap, pin-threshold, pin, epoch, refault, refault-distance, core, core-age)`,
	} {
		_, err := ParseThrashingSpec(spec)
		require.ErrorContains(t, err, want, spec)
	}
	// Off, the refault settings are not checked.
	_, err = ParseThrashingSpec("refault=off,core=100")
	require.NoError(t, err)
}

// TestNvidiaRefaultLimits: the limits are the spec's percentages of the
// capacity, the core leaving at least a 64 KiB region to turn over, and
// nothing where refaults are off; a refault is protected where it fits
// whole.
func TestNvidiaRefaultLimits(t *testing.T) {
	n := &NvidiaThrashing{Spec: DefaultThrashing}
	l := n.RefaultLimits(CPU, 18*PagesPerBlock)
	require.Equal(t, RefaultLimits{Recent: 18 * PagesPerBlock, Protect: 18 * PagesPerBlock * 97 / 100, Age: 4 * 18 * PagesPerBlock}, l)
	require.Equal(t, int64(160-16), n.RefaultLimits(0, 160).Protect, "a small processor keeps a region's room")
	require.Equal(t, int64(0), n.RefaultLimits(0, 10).Protect, "one smaller than a region protects nothing")
	require.Equal(t, RefaultLimits{}, n.RefaultLimits(CPU, 0), "no capacity, no limits")

	f := Refault{Protected: l.Protect - PagesPerBlock, Limits: l}
	f.Pages.FillRange(0, PagesPerBlock)
	require.Equal(t, RefaultProtect, n.Refaulted(f), "a block that fits")
	f.Protected++
	require.Equal(t, RefaultNone, n.Refaulted(f), "a block one page over the limit")

	off := &NvidiaThrashing{Spec: DefaultThrashing}
	off.Spec.Refault = false
	require.Equal(t, RefaultLimits{Recent: 1 << 20}, off.RefaultLimits(CPU, 1<<20), "off: recent refaults told, nothing protected")
}
