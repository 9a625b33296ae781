package server

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestAnatomySnapshotIsWhole: a snapshot taken while samples are joined
// counts each sample in every stage or in none. TestFaultAnatomy, which
// reads the anatomy while its faults are still being sampled, once read
// 1,999 samples against 2,000 in a stage's histogram: the stages were
// recorded after the halves were matched, outside the lock a snapshot
// did not take.
func TestAnatomySnapshotIsWhole(t *testing.T) {
	a := newAnatomy(1)
	const joiners, each = 2, 20000
	var wg sync.WaitGroup
	var done atomic.Bool
	for g := range joiners {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				k := anatomyKey{tid: g, entry: time.Duration(i + 1)}
				s := anatomySample{entry: 1, read: 2, decided: 3, ioctlStart: 4, ioctlEnd: 5, taken: time.Now(), tid: g}
				if i%2 == 0 { // the halves arrive in either order
					a.join(k, &s, 0)
					a.join(k, nil, 6)
				} else {
					a.join(k, nil, 6)
					a.join(k, &s, 0)
				}
			}
		}()
	}
	go func() { wg.Wait(); done.Store(true) }()
	for snaps := 0; !done.Load() || snaps == 0; snaps++ {
		an := a.snapshot()
		for name, n := range map[string]uint64{"to server": an.ToServer.Count, "sampling": an.Sampling.Count, "decision": an.Decision.Count,
			"ioctl": an.Ioctl.Count, "wake": an.Wake.Count, "total": an.Total.Count} {
			require.Equal(t, an.Samples, n, "snapshot %d: %s", snaps, name)
		}
	}
	require.Equal(t, uint64(joiners*each), a.snapshot().Samples)
}
