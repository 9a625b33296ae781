package metrics

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"slices"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/softuvm/softuvm/internal/config"
	"github.com/softuvm/softuvm/internal/core"
)

// Source is where a scrape's numbers come from: a server's
// (*server.Server).Stats and, optionally, its Info.
type Source struct {
	// Stats returns the server-wide counters (every session's, the
	// ended ones included). Required.
	Stats func() core.Stats
	// Info, if set, adds gauges of the devices' arenas and the connected
	// sessions, and the server's own error counters. It walks every
	// live block, which is why it may be left out.
	Info func() config.Info
}

const namespace = "softuvm"

// Label values of a fault's kind, as `uvm stat --json` spells them.
const (
	kindMissing      = "missing"
	kindMinor        = "minor"
	kindWriteProtect = "write_protect"
)

// causeUnknown labels pages a migration counted without a cause: the
// by-cause series of a direction then still add up to its total.
const causeUnknown = "unknown"

// sessionRoles are the roles whose session gauge is reported even at
// zero, so that a dashboard sees 0 rather than no data.
var sessionRoles = []string{"client", "monitor"}

// serviceBoundsNS are the fault service histogram's bucket bounds: the
// powers of two from 512 ns to about 17 s. The snapshot lists only its
// nonempty buckets, four per power of two; a Prometheus histogram needs
// the same buckets at every scrape (rates and quantiles are taken bucket
// by bucket over time), and 26 are plenty for quantiles within a factor
// of two. Every power of two is a bound of the snapshot's buckets, so
// the coarser counts are exact.
var serviceBoundsNS = func() []uint64 {
	var b []uint64
	for k := 9; k <= 34; k++ {
		b = append(b, 1<<k)
	}
	return b
}()

func desc(name, help string, labels ...string) *prometheus.Desc {
	return prometheus.NewDesc(namespace+"_"+name, help, labels, nil)
}

var (
	descFaults = desc("faults_total",
		"Page faults the server served, by the processor that took them (cpu, or a device index) and their kind (missing: no page in the view's file; minor: in the file but not mapped; write_protect: a write to a write-protected page).",
		"processor", "kind")
	descMigratedPages = desc("migrated_pages_total",
		"Pages moved from one processor's memory to another's, by why they moved (fault, prefetch, eviction, counters, advice, launch, or unknown).",
		"from", "to", "cause")
	descMigratedBytes = desc("migrated_bytes_total",
		"Bytes moved from one processor's memory to another's, by why they moved; softuvm_migrated_pages_total times the page size.",
		"from", "to", "cause")
	descPopulated = desc("populated_pages_total",
		"Pages created zero-filled (a first touch, or a prefetch of never-touched memory), by processor.",
		"processor")
	descEvicted = desc("evicted_pages_total",
		"Pages evicted from a processor's memory: from a device whose arena was full, or from the host above the host budget.",
		"processor")
	descRemoteMapped = desc("remote_mapped_pages_total",
		"Pages a device came to map in another processor's memory instead of migrating them (preferred location, accessed-by advice, pinned thrashing pages).",
		"processor")
	descReadDuplicated = desc("read_duplicated_pages_total",
		"Pages copied to a processor by read duplication (read-mostly advice), the other copies kept.",
		"processor")
	descThrottles = desc("throttles_total",
		"Faults of a processor on thrashing pages that were made to wait.",
		"processor")
	descPins = desc("pins_total",
		"Pages pinned in host memory because the processor kept taking them.",
		"processor")
	descRefaulted = desc("refaulted_pages_total",
		"Pages a fault brought back to a processor after the processor had evicted them.",
		"processor")
	descRefaultedRecent = desc("refaulted_recent_pages_total",
		"Refaulted pages that came back after fewer evictions than the processor holds: evicted too early (thrashing).",
		"processor")
	descProtected = desc("protected_pages_total",
		"Pages the thrashing policy protected from eviction after a recent refault (the processor's resident core).",
		"processor")
	descUnprotected = desc("unprotected_pages_total",
		"Protected pages whose protection ended with its generation.",
		"processor")
	descDemoted = desc("demoted_pages_total",
		"Protected pages evicted because nothing else could give room.",
		"processor")
	descHintsArmed = desc("hints_armed_pages_total",
		"Pages of a device's remote mappings unmapped so that their next access faults and is counted (hint faults).",
		"processor")
	descCrossings = desc("access_crossings_total",
		"64 KiB regions the access counters reported at their threshold for a processor.",
		"processor")
	descCounterMigrated = desc("access_counters_migrated_pages_total",
		"Pages migrated to a processor because the access counters reported them (also counted in softuvm_migrated_pages_total, cause counters).",
		"processor")
	descPrefetched = desc("prefetched_pages_total",
		"Pages brought in speculatively, beyond the faulted ones.")
	descPrefetchedUsed = desc("prefetched_used_pages_total",
		"Prefetched pages later touched, among allocations that track prefetch use.")
	descPrefetchedUnused = desc("prefetched_unused_pages_total",
		"Prefetched pages that left (migrated, evicted, freed) untouched, among allocations that track prefetch use.")
	descLaunchCopied = desc("launch_copied_pages_total",
		"Pages the launch coherence model copied to a device at a launch.")
	descLaunchClean = desc("launch_clean_pages_total",
		"Host copies the launch coherence model dropped at a launch without copying them (only read by the host).")
	descDiscarded = desc("discarded_pages_total",
		"Populated pages a discard dropped without copying (their contents were no longer wanted).")
	descEvictedClean = desc("evicted_clean_pages_total",
		"Host pages evicted without a copy: a device kept a copy when the host read them back (clean eviction), and the host had not written them.")
	descReadAhead = desc("read_ahead_pages_total",
		"Pages read ahead of a sweep: a block past the faulted one, moved while the processor worked on that one (among the prefetched pages).")
	descAllocations = desc("allocations_total",
		"Managed allocations made, freed or not.")
	descAllocatedBytes = desc("allocated_bytes_total",
		"Bytes managed allocations asked for, freed or not.")
	descService = desc("fault_service_seconds",
		"Time from the server reading a fault to the ioctl that resolved it returning. A bucket's bound is one nanosecond below a power of two: the server counts whole nanoseconds below the power.")
	descServiceMax = desc("fault_service_max_seconds",
		"The longest fault service time seen since the server started.")

	descSessions = desc("sessions",
		"Processes connected to the server, by role (client: a program using managed memory; monitor: uvm stat or uvm info).",
		"role")
	descManagedBytes = desc("managed_bytes",
		"Size of the managed allocations of the connected clients.")
	descManagedAllocations = desc("managed_allocations",
		"Managed allocations of the connected clients not freed yet.")
	descDeviceCapacity = desc("device_capacity_bytes",
		"Size of a device's memory arena.",
		"device")
	descDeviceUsed = desc("device_used_bytes",
		"Bytes of a device's memory arena in use.",
		"device")
	descStrayFaults = desc("stray_faults_total",
		"Faults on addresses no allocation owns; most are stale, their range freed meanwhile.")
	descPoisoned = desc("poisoned_pages_total",
		"Pages poisoned because a fault on them could not be served: an access raises SIGBUS.")
	descLostPages = desc("lost_pages_total",
		"Pages the residency table held resident whose file had lost them (zero unless the server has a bug).")
	descRestarts = desc("server_restarts_total",
		"Servers that died or retired before this one in its line (0 for a server that started fresh).")

	statsDescs = []*prometheus.Desc{
		descFaults, descMigratedPages, descMigratedBytes, descPopulated, descEvicted,
		descRemoteMapped, descReadDuplicated, descThrottles, descPins, descHintsArmed,
		descRefaulted, descRefaultedRecent, descProtected, descUnprotected, descDemoted,
		descCrossings, descCounterMigrated, descPrefetched, descPrefetchedUsed,
		descPrefetchedUnused, descLaunchCopied, descLaunchClean, descDiscarded, descEvictedClean, descReadAhead, descAllocations,
		descAllocatedBytes, descService, descServiceMax,
	}
	infoDescs = []*prometheus.Desc{
		descSessions, descManagedBytes, descManagedAllocations, descDeviceCapacity,
		descDeviceUsed, descStrayFaults, descPoisoned, descLostPages, descRestarts,
	}
)

// ProcessorLabel is a processor's label value: "cpu", or the device's
// index.
func ProcessorLabel(d core.Device) string {
	if d == core.CPU {
		return "cpu"
	}
	return strconv.Itoa(int(d))
}

// Collector reports a Source's snapshot at each scrape.
type Collector struct {
	src Source
}

// NewCollector returns a collector of src; src.Stats must be set.
func NewCollector(src Source) *Collector {
	if src.Stats == nil {
		panic("metrics: a Source without Stats")
	}
	return &Collector{src: src}
}

// Describe sends every metric's description, those of Info only when
// the source has Info.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range statsDescs {
		ch <- d
	}
	if c.src.Info != nil {
		for _, d := range infoDescs {
			ch <- d
		}
	}
}

// Collect takes one snapshot and sends its values.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	s := c.src.Stats()
	var in *config.Info
	if c.src.Info != nil {
		i := c.src.Info()
		in = &i
	}
	collectStats(ch, s, processors(s, in))
	if in != nil {
		collectInfo(ch, *in)
	}
}

func counter(ch chan<- prometheus.Metric, d *prometheus.Desc, v uint64, labels ...string) {
	ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), labels...)
}

func gauge(ch chan<- prometheus.Metric, d *prometheus.Desc, v float64, labels ...string) {
	ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
}

// processors lists the processors a scrape reports per-processor
// counters for, zero ones included: the host, the server's devices, and
// any other the snapshot names. The snapshot leaves out zero entries; a
// series that appears only at its first event would hide that event
// from rate() and increase().
func processors(s core.Stats, in *config.Info) []core.Device {
	seen := map[core.Device]bool{core.CPU: true}
	if in != nil {
		for _, d := range in.Devices {
			seen[d.Device] = true
		}
	}
	for _, f := range s.Faults {
		seen[f.Processor] = true
	}
	for _, ps := range [][]core.ProcessorPages{s.Populated, s.Evicted, s.RemoteMapped, s.ReadDuplicated, s.HintsArmed, s.CounterMigrated} {
		for _, p := range ps {
			seen[p.Processor] = true
		}
	}
	for _, cs := range [][]core.ProcessorCount{s.Throttles, s.Pins, s.AccessCrossings} {
		for _, c := range cs {
			seen[c.Processor] = true
		}
	}
	for _, r := range s.Refaults {
		seen[r.Processor] = true
	}
	var out []core.Device
	for d := range seen {
		out = append(out, d)
	}
	slices.Sort(out)
	return out
}

func collectStats(ch chan<- prometheus.Metric, s core.Stats, procs []core.Device) {
	for _, d := range procs {
		p := ProcessorLabel(d)
		f := s.FaultsBy(d)
		counter(ch, descFaults, f.Missing, p, kindMissing)
		counter(ch, descFaults, f.Minor, p, kindMinor)
		counter(ch, descFaults, f.WriteProtect, p, kindWriteProtect)
		counter(ch, descPopulated, s.PopulatedPages(d), p)
		counter(ch, descEvicted, s.EvictedPages(d), p)
		counter(ch, descRemoteMapped, s.RemoteMappedPages(d), p)
		counter(ch, descReadDuplicated, s.ReadDuplicatedPages(d), p)
		counter(ch, descThrottles, s.ThrottlesOf(d), p)
		counter(ch, descPins, s.PinsOf(d), p)
		counter(ch, descHintsArmed, s.HintsArmedPages(d), p)
		counter(ch, descCrossings, s.CrossingsOf(d), p)
		counter(ch, descCounterMigrated, s.CounterMigratedPages(d), p)
		rf := s.RefaultsOf(d)
		counter(ch, descRefaulted, rf.Pages, p)
		counter(ch, descRefaultedRecent, rf.Recent, p)
		counter(ch, descProtected, rf.Protected, p)
		counter(ch, descUnprotected, rf.Unprotected, p)
		counter(ch, descDemoted, rf.Demoted, p)
	}

	type direction struct{ from, to core.Device }
	byCause := map[direction]core.Migration{}
	for _, m := range s.MigrationsByCause {
		from, to := ProcessorLabel(m.From), ProcessorLabel(m.To)
		counter(ch, descMigratedPages, m.Pages, from, to, m.Cause)
		counter(ch, descMigratedBytes, m.Bytes, from, to, m.Cause)
		k := direction{m.From, m.To}
		sum := byCause[k]
		sum.Pages += m.Pages
		sum.Bytes += m.Bytes
		byCause[k] = sum
	}
	for _, m := range s.Migrations {
		known := byCause[direction{m.From, m.To}]
		if m.Pages > known.Pages {
			from, to := ProcessorLabel(m.From), ProcessorLabel(m.To)
			counter(ch, descMigratedPages, m.Pages-known.Pages, from, to, causeUnknown)
			counter(ch, descMigratedBytes, m.Bytes-min(m.Bytes, known.Bytes), from, to, causeUnknown)
		}
	}

	counter(ch, descPrefetched, s.PrefetchedPages)
	counter(ch, descPrefetchedUsed, s.PrefetchedUsed)
	counter(ch, descPrefetchedUnused, s.PrefetchedUnused)
	counter(ch, descLaunchCopied, s.LaunchCopiedPages)
	counter(ch, descLaunchClean, s.LaunchCleanPages)
	counter(ch, descDiscarded, s.DiscardedPages)
	counter(ch, descEvictedClean, s.EvictedCleanPages)
	counter(ch, descReadAhead, s.ReadAheadPages)
	counter(ch, descAllocations, s.Allocations)
	counter(ch, descAllocatedBytes, s.AllocatedBytes)

	count, buckets := serviceBuckets(s.FaultService)
	ch <- prometheus.MustNewConstHistogram(descService, count, seconds(s.FaultService.SumNS), buckets)
	gauge(ch, descServiceMax, seconds(s.FaultService.MaxNS))
}

// serviceBuckets turns the snapshot's histogram into Prometheus's: fixed
// bounds (serviceBoundsNS), cumulative counts, bounds in seconds. The
// snapshot's bucket counts values below its bound, Prometheus's those
// at or below it; durations are whole nanoseconds, so a bound of 2^k ns
// exclusive is 2^k-1 ns inclusive.
func serviceBuckets(h core.Histogram) (uint64, map[float64]uint64) {
	per := make([]uint64, len(serviceBoundsNS))
	var total uint64
	for _, b := range h.Buckets {
		total += b.Count
		if i, _ := slices.BinarySearch(serviceBoundsNS, b.UpperNS); i < len(per) {
			// b lies below serviceBoundsNS[i]: every power of two is
			// one of the snapshot's bounds, so no bucket straddles one.
			per[i] += b.Count
		}
	}
	out := make(map[float64]uint64, len(per))
	var cum uint64
	for i, n := range per {
		cum += n
		out[seconds(serviceBoundsNS[i]-1)] = cum
	}
	// The snapshot reads the count before the buckets, so a fault
	// recorded in between can make the buckets hold one more than the
	// count; a +Inf bucket below a finite one would be malformed.
	return max(h.Count, total), out
}

func seconds(ns uint64) float64 { return float64(ns) / float64(time.Second) }

func collectInfo(ch chan<- prometheus.Metric, in config.Info) {
	roles := map[string]int{}
	for _, r := range sessionRoles {
		roles[r] = 0
	}
	var managed int64
	var allocations int
	for _, s := range in.Sessions {
		roles[s.Role]++
		managed += s.ManagedBytes
		allocations += s.Allocations
	}
	for r, n := range roles {
		gauge(ch, descSessions, float64(n), r)
	}
	gauge(ch, descManagedBytes, float64(managed))
	gauge(ch, descManagedAllocations, float64(allocations))
	for _, d := range in.Devices {
		dev := ProcessorLabel(d.Device)
		gauge(ch, descDeviceCapacity, float64(d.Capacity), dev)
		gauge(ch, descDeviceUsed, float64(d.UsedBytes), dev)
	}
	counter(ch, descStrayFaults, in.StrayFaults)
	counter(ch, descPoisoned, in.PoisonedPage)
	counter(ch, descLostPages, in.LostPages)
	counter(ch, descRestarts, in.Restart.Restarts)
}

// NewRegistry returns a registry of src's collector and the Go runtime's
// and this process's: a registry of its own, so that nothing else in the
// process that registers with the global one ends up on the endpoint.
func NewRegistry(src Source) *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(
		NewCollector(src),
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
	)
	return reg
}

const indexPage = `softuvm fault server
/metrics  the server's statistics, in the Prometheus text format
`

// Handler serves src's metrics at /metrics and a short page at /.
func Handler(src Source) http.Handler {
	reg := NewRegistry(src)
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.InstrumentMetricHandler(reg, promhttp.HandlerFor(reg, promhttp.HandlerOpts{
		// A scrape waits for the faults being served (Stats quiesces):
		// a bound keeps a burst of scrapes from piling up behind them.
		MaxRequestsInFlight: 4,
	})))
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		fmt.Fprint(w, indexPage)
	})
	return mux
}

// ErrNotLoopback is returned for an address that is not a loopback one
// when the caller did not allow any address.
var ErrNotLoopback = errors.New("not a loopback address")

// Endpoint is a listening metrics endpoint.
type Endpoint struct {
	ln  *net.TCPListener
	srv *http.Server
}

// Listen binds addr (host:port; port 0 picks one) without serving yet,
// so that a bad or busy address fails before the server starts. The
// host must be a loopback address unless anyAddress is set; an empty
// host or 0.0.0.0 is every address.
func Listen(addr string, anyAddress bool) (*Endpoint, error) {
	ta, err := resolve(addr, anyAddress)
	if err != nil {
		return nil, err
	}
	ln, err := net.ListenTCP("tcp", ta)
	if err != nil {
		return nil, fmt.Errorf("metrics address %s: %w", addr, err)
	}
	return &Endpoint{ln: ln}, nil
}

// CheckAddress returns the error Listen would return for addr before
// binding it: for a caller that can only bind later.
func CheckAddress(addr string, anyAddress bool) error {
	_, err := resolve(addr, anyAddress)
	return err
}

func resolve(addr string, anyAddress bool) (*net.TCPAddr, error) {
	ta, err := net.ResolveTCPAddr("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("metrics address %q: %w", addr, err)
	}
	if !anyAddress && (ta.IP == nil || !ta.IP.IsLoopback()) {
		return nil, fmt.Errorf("metrics address %s: %w", addr, ErrNotLoopback)
	}
	return ta, nil
}

// Serve serves src on the endpoint, on a goroutine of its own, until
// Close. It is called once.
func (e *Endpoint) Serve(src Source) {
	e.srv = &http.Server{
		Handler:           Handler(src),
		ReadHeaderTimeout: 10 * time.Second,
	}
	go e.srv.Serve(e.ln)
}

// Addr is the address the endpoint listens on, with the port it got.
func (e *Endpoint) Addr() string { return e.ln.Addr().String() }

// URL is the address of the endpoint's metrics.
func (e *Endpoint) URL() string { return "http://" + e.Addr() + "/metrics" }

// Close stops listening and ends the connections being served.
func (e *Endpoint) Close() error {
	if e.srv != nil {
		return e.srv.Close()
	}
	return e.ln.Close()
}

// Serve listens on addr (see Listen) and serves src there.
func Serve(addr string, src Source, anyAddress bool) (*Endpoint, error) {
	e, err := Listen(addr, anyAddress)
	if err != nil {
		return nil, err
	}
	e.Serve(src)
	return e, nil
}
