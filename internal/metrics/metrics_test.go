package metrics

import (
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil/promlint"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/softuvm/softuvm/internal/config"
	"github.com/softuvm/softuvm/internal/core"
	"github.com/softuvm/softuvm/internal/metrics/metricstest"
)

// procVals are the per-processor counters the fake snapshot holds.
type procVals struct {
	missing, minor, wp                                   uint64
	populated, evicted, remote, readDup, throttles, pins uint64
	hints, crossings, counterMigrated                    uint64
	refaulted, recent, protected, unprotected, demoted   uint64
}

type migration struct {
	from, to core.Device
	cause    core.Cause // 0: none known
	pages    int
}

var (
	fakeProcs = map[core.Device]procVals{
		core.CPU: {missing: 101, minor: 102, wp: 103, populated: 104, evicted: 105, remote: 106, readDup: 107, throttles: 108, pins: 109, hints: 110, crossings: 111, counterMigrated: 112,
			refaulted: 113, recent: 114, protected: 115, unprotected: 116, demoted: 117},
		0: {missing: 201, minor: 202, wp: 203, populated: 204, evicted: 205, remote: 206, readDup: 207, throttles: 208, pins: 209, hints: 210, crossings: 211, counterMigrated: 212,
			refaulted: 213, recent: 214, protected: 215, unprotected: 216, demoted: 217},
		1: {evicted: 7}, // nothing else: its other series must read 0
	}
	fakeMigrations = []migration{
		{core.CPU, 0, core.CauseFault, 10},
		{core.CPU, 0, core.CausePrefetch, 20},
		{0, core.CPU, core.CauseFault, 5},
		{0, core.CPU, 0, 3},
		{0, 1, core.CauseEviction, 4},
		{1, core.CPU, core.CauseLaunch, 2},
	}
	// Durations on and next to the histogram's bounds, below the first
	// and above the last.
	fakeService = []time.Duration{0, 1, 511, 512, 513, 1023, 1024, 1025, 5 * time.Microsecond, 100 * time.Microsecond, 3 * time.Millisecond, 3 * time.Millisecond, 1<<34 - 1, 1 << 34, 1 << 40}
	labelOf     = map[core.Device]string{core.CPU: "cpu", 0: "0", 1: "1"}
)

// fakeStats is a snapshot of counters filled with fakeProcs,
// fakeMigrations and fakeService.
func fakeStats() core.Stats {
	c := core.NewCounters(3)
	for d, v := range fakeProcs {
		l := d.Slot()
		c.Faults[l][core.FaultMissing].Store(v.missing)
		c.Faults[l][core.FaultMinor].Store(v.minor)
		c.Faults[l][core.FaultWP].Store(v.wp)
		c.Populated[l].Store(v.populated)
		c.Evicted[l].Store(v.evicted)
		c.RemoteMapped[l].Store(v.remote)
		c.ReadDuplicated[l].Store(v.readDup)
		c.Throttles[l].Store(v.throttles)
		c.Pins[l].Store(v.pins)
		c.HintsArmed[l].Store(v.hints)
		c.Crossings[l].Store(v.crossings)
		c.CounterMigrated[l].Store(v.counterMigrated)
		c.Refaulted[l].Store(v.refaulted)
		c.RefaultedRecent[l].Store(v.recent)
		c.Protected[l].Store(v.protected)
		c.Unprotected[l].Store(v.unprotected)
		c.Demoted[l].Store(v.demoted)
	}
	for _, m := range fakeMigrations {
		c.AddMigrated(m.from, m.to, m.cause, m.pages)
	}
	for _, d := range fakeService {
		c.Service.Record(d)
	}
	c.Prefetched.Store(301)
	c.Used.Store(302)
	c.Unused.Store(303)
	c.LaunchCopied.Store(304)
	c.LaunchClean.Store(305)
	c.Discarded.Store(308)
	c.EvictedClean.Store(309)
	c.ReadAhead.Store(310)
	c.Allocations.Store(306)
	c.AllocatedBytes.Store(307 << 20)
	return c.Snapshot()
}

func fakeInfo() config.Info {
	return config.Info{
		Sessions: []config.SessionInfo{
			{Role: "client", Allocations: 2, ManagedBytes: 3 << 20},
			{Role: "client", Allocations: 1, ManagedBytes: 1 << 20},
			{Role: "monitor"},
		},
		Devices: []config.ArenaInfo{
			{DeviceInfo: core.DeviceInfo{Device: 0, Capacity: 64 << 20}, UsedBytes: 12 << 12},
			{DeviceInfo: core.DeviceInfo{Device: 1, Capacity: 128 << 20}},
		},
		StrayFaults: 401, PoisonedPage: 402, LostPages: 403,
		Restart: config.RestartInfo{Restarts: 404},
	}
}

// expectedSamples is what a scrape of fakeStats and fakeInfo must read,
// written from the fake's inputs rather than from the snapshot.
func expectedSamples(withInfo bool) map[string]float64 {
	want := map[string]float64{}
	for d, v := range fakeProcs {
		p := labelOf[d]
		for kind, n := range map[string]uint64{"missing": v.missing, "minor": v.minor, "write_protect": v.wp} {
			want[fmt.Sprintf(`softuvm_faults_total{kind=%q,processor=%q}`, kind, p)] = float64(n)
		}
		for name, n := range map[string]uint64{
			"populated_pages_total": v.populated, "evicted_pages_total": v.evicted,
			"remote_mapped_pages_total": v.remote, "read_duplicated_pages_total": v.readDup,
			"throttles_total": v.throttles, "pins_total": v.pins, "hints_armed_pages_total": v.hints,
			"access_crossings_total": v.crossings, "access_counters_migrated_pages_total": v.counterMigrated,
			"refaulted_pages_total": v.refaulted, "refaulted_recent_pages_total": v.recent, "protected_pages_total": v.protected,
			"unprotected_pages_total": v.unprotected, "demoted_pages_total": v.demoted,
		} {
			want[fmt.Sprintf(`softuvm_%s{processor=%q}`, name, p)] = float64(n)
		}
	}
	for _, m := range fakeMigrations {
		cause := m.cause.String()
		if m.cause == 0 {
			cause = "unknown"
		}
		labels := fmt.Sprintf(`{cause=%q,from=%q,to=%q}`, cause, labelOf[m.from], labelOf[m.to])
		want["softuvm_migrated_pages_total"+labels] += float64(m.pages)
		want["softuvm_migrated_bytes_total"+labels] += float64(m.pages * core.PageSize)
	}
	var maxNS time.Duration
	for _, d := range fakeService {
		maxNS = max(maxNS, d)
	}
	for name, v := range map[string]float64{
		"prefetched_pages_total": 301, "prefetched_used_pages_total": 302, "prefetched_unused_pages_total": 303,
		"launch_copied_pages_total": 304, "launch_clean_pages_total": 305, "discarded_pages_total": 308, "evicted_clean_pages_total": 309, "read_ahead_pages_total": 310,
		"allocations_total": 306, "allocated_bytes_total": 307 << 20,
		"fault_service_max_seconds": maxNS.Seconds(),
	} {
		want["softuvm_"+name+"{}"] = v
	}
	if withInfo {
		for k, v := range map[string]float64{
			`softuvm_sessions{role="client"}`:           2,
			`softuvm_sessions{role="monitor"}`:          1,
			`softuvm_managed_bytes{}`:                   4 << 20,
			`softuvm_managed_allocations{}`:             3,
			`softuvm_device_capacity_bytes{device="0"}`: 64 << 20,
			`softuvm_device_capacity_bytes{device="1"}`: 128 << 20,
			`softuvm_device_used_bytes{device="0"}`:     12 << 12,
			`softuvm_device_used_bytes{device="1"}`:     0,
			`softuvm_stray_faults_total{}`:              401,
			`softuvm_poisoned_pages_total{}`:            402,
			`softuvm_lost_pages_total{}`:                403,
			`softuvm_server_restarts_total{}`:           404,
		} {
			want[k] = v
		}
	}
	return want
}

func serveFake(t *testing.T, src Source) *Endpoint {
	t.Helper()
	ep, err := Serve("127.0.0.1:0", src, false)
	require.NoError(t, err)
	t.Cleanup(func() { ep.Close() })
	return ep
}

func TestScrapeReadsTheSnapshot(t *testing.T) {
	for _, withInfo := range []bool{true, false} {
		t.Run(fmt.Sprintf("info=%v", withInfo), func(t *testing.T) {
			snap := fakeStats()
			var calls atomic.Int32
			src := Source{Stats: func() core.Stats { calls.Add(1); return snap }}
			if withInfo {
				src.Info = fakeInfo
			}
			fams := metricstest.Scrape(t, serveFake(t, src).URL())
			assert.Equal(t, int32(1), calls.Load(), "one snapshot per scrape")

			assert.Equal(t, expectedSamples(withInfo), metricstest.Samples(fams, "softuvm_"))

			// The same, against the snapshot itself: every direction's
			// causes add up to its total.
			got := metricstest.Samples(fams, "softuvm_migrated_pages_total")
			for _, m := range snap.Migrations {
				var sum float64
				for k, v := range got {
					if strings.Contains(k, fmt.Sprintf(`from=%q,to=%q`, labelOf[m.From], labelOf[m.To])) {
						sum += v
					}
				}
				assert.Equal(t, float64(m.Pages), sum, "%v -> %v", m.From, m.To)
			}
			for _, f := range snap.Faults {
				for kind, n := range map[string]uint64{"missing": f.Missing, "minor": f.Minor, "write_protect": f.WriteProtect} {
					assert.Equal(t, float64(n), metricstest.Samples(fams, "softuvm_faults_total")[fmt.Sprintf(`softuvm_faults_total{kind=%q,processor=%q}`, kind, labelOf[f.Processor])])
				}
			}

			checkHistogram(t, fams["softuvm_fault_service_seconds"], fakeService)
			assert.Equal(t, float64(snap.FaultService.Count), float64(fams["softuvm_fault_service_seconds"].Metric[0].Histogram.GetSampleCount()))

			for name, f := range fams {
				assert.NotEmpty(t, f.GetHelp(), "%s has no HELP", name)
				if strings.HasSuffix(name, "_total") {
					assert.Equal(t, dto.MetricType_COUNTER, f.GetType(), name)
				}
			}
			for _, name := range []string{"go_goroutines", "process_open_fds", "promhttp_metric_handler_requests_total"} {
				assert.Contains(t, fams, name, "the Go, process and handler collectors")
			}
			var mfs []*dto.MetricFamily
			for _, f := range fams {
				mfs = append(mfs, f)
			}
			problems, err := promlint.NewWithMetricFamilies(mfs).Lint()
			require.NoError(t, err)
			assert.Empty(t, problems, "the naming conventions")
		})
	}
}

// checkHistogram checks a scraped histogram against the durations it
// recorded: the fixed bounds, and at each the number of durations at or
// below it.
func checkHistogram(t *testing.T, f *dto.MetricFamily, durations []time.Duration) {
	t.Helper()
	require.NotNil(t, f)
	require.Equal(t, dto.MetricType_HISTOGRAM, f.GetType())
	require.Len(t, f.Metric, 1)
	h := f.Metric[0].GetHistogram()
	assert.Equal(t, uint64(len(durations)), h.GetSampleCount())
	var sum time.Duration
	for _, d := range durations {
		sum += d
	}
	assert.InDelta(t, sum.Seconds(), h.GetSampleSum(), 1e-9)
	var bounds []float64
	for _, b := range h.Bucket {
		if math.IsInf(b.GetUpperBound(), 1) {
			continue
		}
		bounds = append(bounds, b.GetUpperBound())
		le := time.Duration(math.Round(b.GetUpperBound() * 1e9))
		var n uint64
		for _, d := range durations {
			if d <= le {
				n++
			}
		}
		assert.Equal(t, n, b.GetCumulativeCount(), "le=%v (%v)", b.GetUpperBound(), le)
	}
	var want []float64
	for k := 9; k <= 34; k++ {
		want = append(want, float64(uint64(1)<<k-1)/1e9)
	}
	assert.Equal(t, want, bounds, "the same buckets at every scrape, empty ones included")
}

func TestScrapeOfNothing(t *testing.T) {
	fams := metricstest.Scrape(t, serveFake(t, Source{Stats: func() core.Stats { return core.Stats{} }}).URL())
	s := metricstest.Samples(fams, "softuvm_")
	assert.Equal(t, 0.0, s[`softuvm_faults_total{kind="missing",processor="cpu"}`], "the host's series exist before its first fault")
	for k, v := range s {
		assert.Zero(t, v, k)
		assert.False(t, strings.HasPrefix(k, "softuvm_migrated_"), "no direction without traffic: %s", k)
	}
	checkHistogram(t, fams["softuvm_fault_service_seconds"], nil)
}

func TestLoopbackOnly(t *testing.T) {
	for _, addr := range []string{"0.0.0.0:0", ":0", "[::]:0"} {
		_, err := Listen(addr, false)
		require.ErrorIs(t, err, ErrNotLoopback, addr)
		assert.Contains(t, err.Error(), addr)
	}
	ep, err := Listen("0.0.0.0:0", true)
	require.NoError(t, err, "allowed explicitly")
	ep.Close()
	ep, err = Listen("localhost:0", false)
	require.NoError(t, err)
	ep.Close()
	_, err = Listen("127.0.0.1", false)
	require.Error(t, err, "no port")
	assert.False(t, errors.Is(err, ErrNotLoopback))
}

func TestIndexPage(t *testing.T) {
	ep := serveFake(t, Source{Stats: func() core.Stats { return core.Stats{} }})
	resp, err := http.Get("http://" + ep.Addr() + "/")
	require.NoError(t, err)
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	assert.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Contains(t, string(body), "/metrics")
	resp, err = http.Get("http://" + ep.Addr() + "/elsewhere")
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, http.StatusNotFound, resp.StatusCode)
}

func TestServiceBucketsCountNeverBelowBuckets(t *testing.T) {
	// As a snapshot taken while a fault is recorded can read it: the
	// buckets hold one more value than the count.
	h := core.Histogram{Count: 1, SumNS: 3000, Buckets: []core.Bucket{{UpperNS: 1024, Count: 1}, {UpperNS: 4096, Count: 1}}}
	count, buckets := serviceBuckets(h)
	assert.Equal(t, uint64(2), count)
	for le, n := range buckets {
		assert.LessOrEqual(t, n, count, "le=%v", le)
	}
	assert.True(t, slices.IsSorted(serviceBoundsNS))
}
