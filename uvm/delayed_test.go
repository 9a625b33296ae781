package uvm

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/softuvm/softuvm/internal/config"
	"github.com/softuvm/softuvm/internal/core"
	"github.com/softuvm/softuvm/policy"
)

const hintPeriod = 10 * time.Millisecond

func accessTestConfig(mode string, decay time.Duration) ServerConfig {
	c := testServerConfig()
	c.DeviceWorkers = 1
	c.AccessCounting = mode
	c.AccessPolicy = policy.AccessPolicy{Hints: true, Threshold: 256, Period: core.Duration(hintPeriod), Sample: 256 << 20,
		Decay: core.Duration(decay), AnatomyEvery: 1}
	return c
}

// eachCountingMode runs f with the eBPF counters (skipped where they do
// not load) and with user-space counting.
func eachCountingMode(t *testing.T, decay time.Duration, f func(t *testing.T, s *Session, mode string)) {
	for _, mode := range []string{config.AccessCountingEBPF, config.AccessCountingUser} {
		t.Run(mode, func(t *testing.T) {
			requireRoot(t)
			if mode == config.AccessCountingEBPF {
				cfg := testServerConfig()
				cfg.AccessCounting = config.AccessCountingAuto
				s := newSession(t, cfg)
				in, err := s.rpc.Info()
				require.NoError(t, err)
				s.Close()
				if !strings.HasPrefix(in.AccessCounting, "ebpf") {
					t.Skipf("no eBPF access counters here: %s", in.AccessCounting)
				}
			}
			s := newSession(t, accessTestConfig(mode, decay))
			in, err := s.rpc.Info()
			require.NoError(t, err)
			require.True(t, strings.HasPrefix(in.AccessCounting, mode), "Info says %q", in.AccessCounting)
			f(t, s, mode)
		})
	}
}

// hostRangeAccessedBy makes size bytes resident on the host, accessed by
// device 0, and an output word on the device.
func hostRangeAccessedBy(t *testing.T, s *Session, size int64) (a, out *Allocation, want uint64) {
	a, err := s.MallocManaged(size)
	require.NoError(t, err)
	out, err = s.MallocManaged(8)
	require.NoError(t, err)
	fill(a.Bytes(), 7)
	want = byteSum(a.Bytes())
	require.NoError(t, s.Prefetch(out.Addr(), 8, 0))
	runSum(t, s, 0, out, out) // starts the device process, which then maps the range
	require.NoError(t, s.MemAdvise(a.Addr(), size, AdviseSetAccessedBy, 0))
	ab, err := s.RangeAttribute(a.Addr(), size, AttrAccessedBy)
	require.NoError(t, err)
	require.Equal(t, []Device{0}, ab)
	return a, out, want
}

// sampledAccesses is what the access counters saw of device 0's
// accesses: the device process's faults as eBPF counts them, or the
// minor faults the server served in user-space mode.
func sampledAccesses(t *testing.T, s *Session, mode string) uint64 {
	if mode == config.AccessCountingUser {
		st, err := s.Stats()
		require.NoError(t, err)
		return st.FaultsBy(0).Minor
	}
	si := ownSession(t, s)
	if pf, ok := deviceProcess(si, 0); ok && pf.EBPFFaults != nil {
		return *pf.EBPFFaults
	}
	t.Fatalf("no eBPF count for device 0 in %+v", si)
	return 0
}

// settledFaults is device d's count of faults on a once it is still. A
// thread that faulted through a mapping being replaced waits for the new
// one (the server defers its fault); if the replacement wakes it first,
// it goes on through the new mapping, and the deferred fault is served,
// and counted, at its next retry, after the kernel that took it ended.
func settledFaults(t *testing.T, a *Allocation, d Device) uint64 {
	t.Helper()
	last := stats(t, a).FaultsBy(d).Total()
	Eventually(t, 5*time.Second, func() bool {
		time.Sleep(50 * time.Millisecond) // several retries of a deferred fault
		now := stats(t, a).FaultsBy(d).Total()
		still := now == last
		last = now
		return still
	}, "device faults still being counted")
	return last
}

// TestDelayedMigrationOfAFrequentReader: a kernel reading the range
// again and again gets it migrated to its device after about the
// threshold's worth of sampled accesses per 64 KiB region.
func TestDelayedMigrationOfAFrequentReader(t *testing.T) {
	eachCountingMode(t, time.Minute, func(t *testing.T, s *Session, mode string) {
		const size = 1 << 20
		const pages, regions = size / PageSize, size / (64 << 10)
		a, out, want := hostRangeAccessedBy(t, s, size)
		st := stats(t, a)
		require.Zero(t, st.CounterMigratedPages(0))
		require.Equal(t, uint64(pages), st.RemoteMappedPages(0))

		start := sampledAccesses(t, s, mode)
		deadline := time.Now().Add(20 * time.Second * time.Duration(slowdown))
		launches := 0
		for stats(t, a).CounterMigratedPages(0) < pages && time.Now().Before(deadline) {
			require.Equal(t, want, runSum(t, s, 0, a, out), "the device reads the host's data")
			launches++
		}
		sampled := sampledAccesses(t, s, mode) - start
		st = stats(t, a)
		t.Logf("%s: %d launches, %d sampled accesses (%.0f per region), %d hint pages armed, %d crossings",
			mode, launches, sampled, float64(sampled)/regions, st.HintsArmedPages(0), st.CrossingsOf(0))
		require.Equal(t, uint64(pages), st.CounterMigratedPages(0), "the whole range migrated to device 0")
		assert.Equal(t, uint64(pages), st.MigratedPages(CPU, 0), "migrations %+v, faults %+v", st.Migrations, st.Faults)
		assert.Equal(t, uint64(regions), st.CrossingsOf(0))
		perRegion := float64(sampled) / regions
		assert.GreaterOrEqual(t, perRegion, 256.0, "no region migrates before the threshold")
		assert.LessOrEqual(t, perRegion, 1.5*256, "about the threshold's worth")

		// Now on the device, read there without faults; the host still
		// reads it (migrating it back).
		faults := settledFaults(t, a, 0)
		assert.Equal(t, want, runSum(t, s, 0, a, out))
		assert.Equal(t, faults, stats(t, a).FaultsBy(0).Total(), "device 0 reads its own memory without faults")
		assert.Equal(t, want, byteSum(a.Bytes()))
	})
}

// TestNoDelayedMigrationOfARareReader: a kernel that reads the range now
// and then does not get it migrated: the counts decay faster than its
// samples add up, though without the decay they would have crossed.
func TestNoDelayedMigrationOfARareReader(t *testing.T) {
	decay := 10 * hintPeriod
	eachCountingMode(t, decay, func(t *testing.T, s *Session, mode string) {
		const size = 1 << 20
		const regions = size / (64 << 10)
		a, out, want := hostRangeAccessedBy(t, s, size)
		start := sampledAccesses(t, s, mode)
		for range 30 {
			require.Equal(t, want, runSum(t, s, 0, a, out))
			time.Sleep(5 * hintPeriod)
		}
		sampled := sampledAccesses(t, s, mode) - start
		st := stats(t, a)
		t.Logf("%s: %d sampled accesses (%.0f per region), %d hint pages armed", mode, sampled, float64(sampled)/regions, st.HintsArmedPages(0))
		assert.Greater(t, float64(sampled)/regions, 256.0, "enough samples to cross without decay")
		assert.Zero(t, st.CounterMigratedPages(0), "nothing migrated")
		assert.Zero(t, st.MigratedPages(CPU, 0))
		assert.Zero(t, st.CrossingsOf(0))
	})
}

// TestPinnedRangeNeverMoves: a range whose preferred location is the host
// stays there however often a device reads it: its 16 regions cross the
// threshold 32 times in all (the server counts crossings per processor,
// not per region), and advice keeps every page home.
func TestPinnedRangeNeverMoves(t *testing.T) {
	eachCountingMode(t, time.Minute, func(t *testing.T, s *Session, mode string) {
		const size = 1 << 20
		a, out, want := hostRangeAccessedBy(t, s, size)
		require.NoError(t, s.MemAdvise(a.Addr(), size, AdviseSetPreferredLocation, CPU))
		pref, err := s.RangeAttribute(a.Addr(), size, AttrPreferredLocation)
		require.NoError(t, err)
		require.Equal(t, CPU, pref)
		deadline := time.Now().Add(10 * time.Second * time.Duration(slowdown))
		for stats(t, a).CrossingsOf(0) < 2*size/(64<<10) && time.Now().Before(deadline) {
			require.Equal(t, want, runSum(t, s, 0, a, out))
		}
		st := stats(t, a)
		t.Logf("%s: %d crossings, %d hint pages armed", mode, st.CrossingsOf(0), st.HintsArmedPages(0))
		assert.GreaterOrEqual(t, st.CrossingsOf(0), uint64(2*size/(64<<10)), "the regions crossed the threshold twice as often as there are regions")
		assert.Zero(t, st.CounterMigratedPages(0))
		assert.Zero(t, st.MigratedPages(CPU, 0))
		assert.Equal(t, want, byteSum(a.Bytes()))
	})
}
