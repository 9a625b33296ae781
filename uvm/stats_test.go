package uvm

import (
	"math/rand/v2"
	"sort"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/softuvm/softuvm/internal/core"
)

func TestHistogramBuckets(t *testing.T) {
	for ns := uint64(0); ns < 1<<20; ns += 1 + ns/7 {
		b := core.HistBucket(ns)
		require.Less(t, ns, core.HistBucketUpper(b), "value %d above its bucket %d", ns, b)
		if b > 0 {
			require.GreaterOrEqual(t, ns, core.HistBucketUpper(b-1), "value %d below its bucket %d", ns, b)
		}
	}
	assert.Equal(t, core.HistBuckets-1, core.HistBucket(1<<62), "huge values land in the last bucket")
}

func TestHistogramQuantiles(t *testing.T) {
	var h core.LiveHistogram
	rng := rand.New(rand.NewPCG(3, 4))
	var vals []float64
	for i := 0; i < 10000; i++ {
		v := time.Duration(1000 + rng.ExpFloat64()*9000)
		vals = append(vals, float64(v))
		h.Record(v)
	}
	sort.Float64s(vals)
	s := h.Snapshot()
	assert.Equal(t, uint64(10000), s.Count)
	for _, q := range []float64{0.5, 0.9, 0.99} {
		exact := vals[int(q*float64(len(vals)))-1]
		got := float64(s.Quantile(q))
		assert.InEpsilon(t, exact, got, 0.2, "q%v", q)
		assert.GreaterOrEqual(t, got, exact, "a quantile is reported as its bucket's upper bound")
	}
	var merged Histogram
	merged.Add(s)
	merged.Add(s)
	assert.Equal(t, 2*s.Count, merged.Count)
	assert.Equal(t, s.Quantile(0.5), merged.Quantile(0.5))
	assert.Equal(t, time.Duration(0), Histogram{}.Quantile(0.5))
}

func TestCountersSnapshotAndMerge(t *testing.T) {
	c := core.NewCounters(3)
	c.Faults[core.CPU.Slot()][core.FaultMissing].Add(5)
	c.Faults[core.Device(1).Slot()][core.FaultWP].Add(1)
	c.AddMigrated(core.CPU, 0, core.CauseFault, 10)
	c.AddMigrated(0, core.CPU, core.CausePrefetch, 4)
	c.Populated[core.CPU.Slot()].Add(7)
	c.Prefetched.Add(3)
	c.Service.Record(8 * time.Microsecond)
	c.Allocations.Add(2)
	c.AllocatedBytes.Add(3 << 20)
	s := c.Snapshot()
	assert.Equal(t, uint64(6), s.TotalFaults())
	assert.Equal(t, ProcessorFaults{Processor: CPU, Missing: 5}, s.FaultsBy(CPU))
	assert.Equal(t, uint64(1), s.FaultsBy(1).WriteProtect)
	assert.Equal(t, uint64(10), s.MigratedPages(CPU, 0))
	assert.Equal(t, uint64(4), s.MigratedPages(0, CPU))
	assert.Equal(t, uint64(0), s.MigratedPages(0, 1))
	assert.Equal(t, uint64(7), s.PopulatedPages(CPU))
	assert.Equal(t, uint64(10*PageSize), s.Migrations[0].Bytes)

	total := core.NewCounters(3)
	total.AddFrom(c)
	total.AddFrom(c)
	t2 := total.Snapshot()
	assert.Equal(t, 2*s.TotalFaults(), t2.TotalFaults())
	assert.Equal(t, uint64(20), t2.MigratedPages(CPU, 0))
	assert.Equal(t, 2*s.FaultService.Count, t2.FaultService.Count)
	assert.Equal(t, uint64(2), s.Allocations)
	assert.Equal(t, uint64(3<<20), s.AllocatedBytes)
	assert.Equal(t, uint64(4), t2.Allocations, "allocation counts merge")
	assert.Equal(t, uint64(6<<20), t2.AllocatedBytes)
}

// TestAllocationsCounted: the server and the session count managed
// allocations and the bytes asked for, freed ones included, once each;
// other kinds of memory are not managed allocations.
func TestAllocationsCounted(t *testing.T) {
	s := newSession(t, testServerConfig())
	a, err := s.MallocManaged(3<<20 + 5)
	require.NoError(t, err)
	b, err := s.MallocManaged(PageSize)
	require.NoError(t, err)
	b.Bytes()[0] = 1
	require.NoError(t, b.Free(), "a freed allocation stays counted")
	d, err := s.Malloc(0, 1<<20)
	require.NoError(t, err)
	h, err := s.HostAlloc(1<<20, 0)
	require.NoError(t, err)

	want := uint64(3<<20 + 5 + PageSize)
	sess, err := s.Stats()
	require.NoError(t, err)
	assert.Equal(t, uint64(2), sess.Allocations, "session scope")
	assert.Equal(t, want, sess.AllocatedBytes)
	srv, err := s.ServerStats()
	require.NoError(t, err)
	assert.Equal(t, uint64(2), srv.Allocations, "server scope")
	assert.Equal(t, want, srv.AllocatedBytes)
	own, err := a.Stats()
	require.NoError(t, err)
	assert.Zero(t, own.Allocations, "an allocation's own statistics do not count allocations")
	require.NoError(t, a.Free())
	require.NoError(t, d.Free())
	require.NoError(t, s.FreeHost(h.Addr()))
	sess, err = s.Stats()
	require.NoError(t, err)
	assert.Equal(t, uint64(2), sess.Allocations, "frees do not uncount")
}

// TestHistogramSince: a later snapshot less an earlier one is what was
// counted in between, bucket by bucket, worked out here by hand.
func TestHistogramSince(t *testing.T) {
	earlier := Histogram{Count: 3, SumNS: 3000, MaxNS: 2000, Buckets: []Bucket{{UpperNS: 1024, Count: 2}, {UpperNS: 2048, Count: 1}}}
	later := Histogram{Count: 7, SumNS: 23000, MaxNS: 9000, Buckets: []Bucket{{UpperNS: 1024, Count: 2}, {UpperNS: 2048, Count: 3}, {UpperNS: 16384, Count: 2}}}
	got := later.Since(earlier)
	assert.Equal(t, Histogram{Count: 4, SumNS: 20000, MaxNS: 9000, Buckets: []Bucket{{UpperNS: 2048, Count: 2}, {UpperNS: 16384, Count: 2}}}, got)
	// The median of the four: the second of them lies in the 2048 bucket.
	assert.Equal(t, 2048*time.Nanosecond, got.Quantile(0.5))
	assert.Equal(t, Histogram{MaxNS: 2000}, earlier.Since(earlier))
}

// TestServerStatsCountEachEventOnce: the server's statistics are the sum
// of its sessions', live and ended, each event counted once. Two clients
// of one daemon each write 8 MiB of managed memory and prefetch it to
// device 0 and back, one after the other: the server counts two
// allocations, and twice the pages each way, whether a session is still
// ending or gone.
func TestServerStatsCountEachEventOnce(t *testing.T) {
	cfg := testServerConfig()
	cfg.Guard = false
	srv, path := startServer(t, cfg)
	const pages = 8 << 20 / PageSize // what rolePrefetchRoundTrip moves each way
	for run := uint64(1); run <= 2; run++ {
		out, err := child(t, "prefetch-round-trip", EnvSocket+"="+path).CombinedOutput()
		require.NoError(t, err, "%s", out)
		st := srv.Stats()
		assert.Equal(t, run, st.Allocations, "after client %d", run)
		assert.Equal(t, run*8<<20, st.AllocatedBytes, "after client %d", run)
		assert.Equal(t, run*pages, st.MigratedPages(CPU, 0), "after client %d", run)
		assert.Equal(t, run*pages, st.MigratedPages(0, CPU), "after client %d", run)
	}
}

// The server's host high-water mark: the most managed pages the host
// held at once. It follows arrivals (first touches, migrations back) and
// does not fall when pages leave.
func TestHostPeak(t *testing.T) {
	s := newSession(t, DefaultServerConfig())
	host := func() (now, peak int64) {
		t.Helper()
		in, err := s.Info()
		require.NoError(t, err)
		return in.HostResidentBytes / PageSize, in.HostPeakBytes / PageSize
	}
	now, peak := host()
	require.Zero(t, now)
	require.Zero(t, peak)
	noPrefetch := WithPrefetch(PrefetchSpec{Policy: "none"})
	a, err := s.MallocManaged(3<<20, noPrefetch)
	require.NoError(t, err)
	b := a.Bytes()
	touch := func(b []byte, pages int) {
		for i := 0; i < pages; i++ {
			b[i*PageSize]++
		}
	}
	touch(b, 100)
	now, peak = host()
	assert.Equal(t, int64(100), now)
	assert.Equal(t, int64(100), peak)

	// The prefetch to the device takes the pages away (one may stay where
	// the clock's watch of the block holds it at that moment: busy pages
	// wait for the next move).
	require.NoError(t, a.Prefetch(0))
	now, peak = host()
	assert.LessOrEqual(t, now, int64(1))
	assert.Equal(t, int64(100), peak, "the mark stays where it was")
	left := now

	touch(b, 40) // 40 come back
	now, peak = host()
	assert.InDelta(t, 40, now, float64(left))
	assert.Equal(t, int64(100), peak)

	c, err := s.MallocManaged(1<<20, noPrefetch)
	require.NoError(t, err)
	touch(c.Bytes(), 256)
	now, peak = host()
	assert.InDelta(t, 296, now, float64(left))
	assert.Equal(t, now, peak, "a new high: the mark is where the count is")
	require.NoError(t, c.Free())
	require.NoError(t, a.Free())
	now, peak = host()
	assert.Zero(t, now)
	assert.Equal(t, int64(296), peak)
}
