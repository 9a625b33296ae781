package lab

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"slices"
	"time"

	"github.com/softuvm/softuvm/internal/core"
	"github.com/softuvm/softuvm/policy"
	"github.com/softuvm/softuvm/trace"
)

// Counts is what a run did, in the figures replays are compared by.
type Counts struct {
	// Faults the processors took (MINOR faults included).
	Faults uint64 `json:"faults"`
	// Pages moved from the host to devices, from devices to the host, and
	// between devices (every cause).
	PagesToDevice uint64 `json:"pages_to_device"`
	PagesToHost   uint64 `json:"pages_to_host"`
	PagesPeer     uint64 `json:"pages_peer"`
	// EvictedPages is the pages evictions moved (also in the above).
	EvictedPages uint64 `json:"evicted_pages"`
}

// BytesMoved is every byte moved, each direction.
func (c Counts) BytesMoved() uint64 {
	return (c.PagesToDevice + c.PagesToHost + c.PagesPeer) * core.PageSize
}

// Result is what a replay did.
type Result struct {
	Trace string `json:"trace,omitempty"`
	// The policies replayed, by name, and the memory they ran in.
	Prefetch    string `json:"prefetch"`
	Eviction    string `json:"eviction"`
	Thrashing   string `json:"thrashing"`
	HostBudget  int64  `json:"host_budget"`  // bytes; 0: none
	DeviceBytes int64  `json:"device_bytes"` // each device's
	Devices     int    `json:"devices"`
	LargeFolios bool   `json:"large_folios"`

	// Replayed is what the policies did; Recorded what the live run's
	// trace says its own did, for fidelity.
	Replayed Counts `json:"replayed"`
	Recorded Counts `json:"recorded"`

	Events     uint64 `json:"events"`     // events read
	References uint64 `json:"references"` // touches served: faults and accessed pages of the trace
	Hits       uint64 `json:"hits"`       // references that found their page mapped
	// Faults per location slot (0: the host, 1 + d: device d), and the
	// same by processor name ("cpu", "device 0") for JSON.
	Faults      [maxLocs]uint64   `json:"-"`
	FaultsBy    map[string]uint64 `json:"faults_by_processor"`
	MinorFaults uint64            `json:"minor_faults"`
	// WriteProtectFaults are devices' writes to pages that came back to
	// their files write-protected (simBlock.wpMarked).
	WriteProtectFaults uint64 `json:"write_protect_faults"`
	// Populated pages (zero-filled at first touch) per location slot.
	Populated [maxLocs]uint64 `json:"-"`
	// Prefetched counts pages brought beyond the faulted ones.
	Prefetched uint64 `json:"prefetched_pages"`
	// Evicted pages per location slot they left, and how many victims.
	Evicted   [maxLocs]uint64 `json:"-"`
	Evictions uint64          `json:"evictions"`
	// WholeBlocks is blocks moved as one large folio; FoliosRebuilt is
	// large folios split by a partial move out of them.
	WholeBlocks uint64 `json:"whole_blocks"`
	// WholeToDevice and WholeToHost are those of them moved to a device
	// (or between devices) and to the host: the estimate prices them per
	// block, and the rest of the pages moved per page.
	WholeToDevice uint64 `json:"whole_to_device"`
	WholeToHost   uint64 `json:"whole_to_host"`
	FoliosRebuilt uint64 `json:"folios_rebuilt"`
	// The thrashing policy's doings, and touches of pinned pages.
	Throttles     uint64        `json:"throttles"`
	Pins          uint64        `json:"pins"`
	NapTime       time.Duration `json:"nap_ns"`
	RemoteTouches uint64        `json:"remote_touches"`
	Launches      uint64        `json:"launches"`
	// The resident core (workingset.go): pages back after an eviction,
	// those back soon, pages protected, and protected pages evicted
	// where nothing else could give room.
	Refaulted       uint64 `json:"refaulted_pages"`
	RefaultedRecent uint64 `json:"refaulted_recent_pages"`
	Protected       uint64 `json:"protected_pages"`
	Demoted         uint64 `json:"demoted_pages"`
	// Unserved counts references to no allocation of the trace (or to a
	// device the replay lacks); Refused, faults a full device could not
	// take (the server fails them: SIGBUS); BadVictims, victims an
	// eviction policy named that are not blocks of the replay.
	Unserved uint64 `json:"unserved"`
	// LateTouches counts touches the access mode saw of pages that had
	// left by the end of their window (sim.lateReference): not served.
	LateTouches uint64 `json:"late_touches"`
	Refused     uint64 `json:"refused"`
	BadVictims  uint64 `json:"bad_victims"`

	// Costs priced EstimatedTime.
	Costs         Costs         `json:"costs"`
	EstimatedTime time.Duration `json:"estimated_ns"`
	// Wall is how long the replay took; CutShort, that the trace ended
	// without its end record (a killed recorder).
	Wall     time.Duration `json:"wall_ns"`
	CutShort bool          `json:"cut_short,omitempty"`
}

// addMoved counts n pages moved from src to dst.
func (r *Result) addMoved(src, dst core.Device, cause policy.Cause, n int) {
	c := &r.Replayed
	switch {
	case src == core.CPU:
		c.PagesToDevice += uint64(n)
	case dst == core.CPU:
		c.PagesToHost += uint64(n)
	default:
		c.PagesPeer += uint64(n)
	}
	if cause == policy.CauseEviction {
		c.EvictedPages += uint64(n)
	}
}

// EventsPerSecond is the replay's speed.
func (r *Result) EventsPerSecond() float64 {
	if r.Wall <= 0 {
		return 0
	}
	return float64(r.Events) / r.Wall.Seconds()
}

// Fidelity is how far the replay's faults and bytes moved are from the
// recorded run's, each as a ratio (replayed / recorded; 1 where both are
// 0, +Inf where only the replay has some).
func (r *Result) Fidelity() (faults, bytes float64) {
	return ratio(r.Replayed.Faults, r.Recorded.Faults), ratio(r.Replayed.BytesMoved(), r.Recorded.BytesMoved())
}

func ratio(a, b uint64) float64 {
	switch {
	case b == 0 && a == 0:
		return 1
	case b == 0:
		return math.Inf(1)
	}
	return float64(a) / float64(b)
}

func (r *Result) estimate() {
	c := r.Costs
	var faults uint64
	r.FaultsBy = map[string]uint64{}
	for l, f := range r.Faults {
		faults += f
		if f > 0 {
			r.FaultsBy[trace.ProcessorName(int32(core.DeviceAtSlot(l)))] = f
		}
	}
	r.Replayed.Faults = faults
	var populated uint64
	for _, p := range r.Populated {
		populated += p
	}
	major := faults - r.MinorFaults - r.WriteProtectFaults
	rc := r.Replayed
	// Whole blocks to devices are counted in PagesToDevice or PagesPeer;
	// the pieces are what is left.
	wholeToDevice := min(r.WholeToDevice*core.PagesPerBlock, rc.PagesToDevice+rc.PagesPeer)
	wholeToHost := min(r.WholeToHost*core.PagesPerBlock, rc.PagesToHost)
	piecesToDevice := rc.PagesToDevice + rc.PagesPeer - wholeToDevice
	t := time.Duration(major)*c.Fault + time.Duration(r.MinorFaults)*c.MinorFault + time.Duration(r.WriteProtectFaults)*c.WPFault +
		time.Duration(piecesToDevice)*c.PageToDevice + time.Duration(rc.PagesToHost-wholeToHost)*c.PageToHost +
		time.Duration(r.WholeToDevice)*c.BlockToDevice + time.Duration(r.WholeToHost)*c.BlockToHost +
		time.Duration(r.FoliosRebuilt)*c.FolioSplit + time.Duration(populated)*c.Populate + r.NapTime
	r.EstimatedTime = t
}

// Write prints the result as `uvm trace replay` does.
func (r *Result) Write(w io.Writer) {
	if r.Trace != "" {
		fmt.Fprintf(w, "trace        %s\n", r.Trace)
	}
	fmt.Fprintf(w, "policies     prefetch %s, eviction %s, thrashing %s\n", r.Prefetch, r.Eviction, r.Thrashing)
	budget := "none"
	if r.HostBudget > 0 {
		budget = core.FormatSize(r.HostBudget)
	}
	folios := "off"
	if r.LargeFolios {
		folios = "on"
	}
	fmt.Fprintf(w, "memory       host budget %s, %d device(s) of %s, large folios %s\n", budget, r.Devices, core.FormatSize(r.DeviceBytes), folios)
	fmt.Fprintf(w, "events       %d in %v (%.2f million a second)", r.Events, r.Wall.Round(time.Millisecond), r.EventsPerSecond()/1e6)
	if r.CutShort {
		fmt.Fprint(w, ", the trace was cut short")
	}
	fmt.Fprintln(w)
	fmt.Fprintf(w, "references   %d: %d hits, %d faults (%d minor, %d write-protect)", r.References, r.Hits, r.Replayed.Faults, r.MinorFaults, r.WriteProtectFaults)
	for l, f := range r.Faults {
		if f > 0 {
			fmt.Fprintf(w, "; %s %d", trace.ProcessorName(int32(core.DeviceAtSlot(l))), f)
		}
	}
	fmt.Fprintln(w)
	c := r.Replayed
	fmt.Fprintf(w, "moved        %s to devices, %s to the host", trace.HumanSize(uint64(c.PagesToDevice*core.PageSize)), trace.HumanSize(uint64(c.PagesToHost*core.PageSize)))
	if c.PagesPeer > 0 {
		fmt.Fprintf(w, ", %s between devices", trace.HumanSize(uint64(c.PagesPeer*core.PageSize)))
	}
	fmt.Fprintf(w, "; %d pages prefetched\n", r.Prefetched)
	var populated uint64
	for _, p := range r.Populated {
		populated += p
	}
	fmt.Fprintf(w, "populated    %d pages\n", populated)
	fmt.Fprintf(w, "evicted      %d pages in %d victims", c.EvictedPages, r.Evictions)
	for l, n := range r.Evicted {
		if n > 0 {
			fmt.Fprintf(w, "; from %s %d", trace.ProcessorName(int32(core.DeviceAtSlot(l))), n)
		}
	}
	fmt.Fprintln(w)
	if r.LargeFolios {
		fmt.Fprintf(w, "folios       %d blocks moved whole, %d large folios split\n", r.WholeBlocks, r.FoliosRebuilt)
	}
	if r.Throttles+r.Pins+r.RemoteTouches > 0 {
		fmt.Fprintf(w, "thrashing    %d throttles (%v of naps), %d pins, %d touches of pinned pages\n", r.Throttles, r.NapTime, r.Pins, r.RemoteTouches)
	}
	if r.Unserved+r.Refused+r.BadVictims > 0 {
		fmt.Fprintf(w, "not served   %d references outside every allocation, %d faults a full device refused, %d victims not of this replay\n", r.Unserved, r.Refused, r.BadVictims)
	}
	fmt.Fprintf(w, "estimated    %v (%s)\n", r.EstimatedTime.Round(time.Microsecond), r.Costs)
	rc := r.Recorded
	if rc.Faults+rc.BytesMoved() > 0 {
		ff, fb := r.Fidelity()
		fmt.Fprintf(w, "recorded     %d faults, %s to devices, %s to the host, %d pages evicted (replayed/recorded: faults %.3f, bytes %.3f)\n",
			rc.Faults, trace.HumanSize(uint64(rc.PagesToDevice*core.PageSize)), trace.HumanSize(uint64(rc.PagesToHost*core.PageSize)), rc.EvictedPages, ff, fb)
	}
}

// Costs prices a replay's counts. The defaults are figures measured on
// the 2-CPU VM the project's benchmarks run on (docs/benchmarks.md):
// `uvm bench faults` (a one-page fault, p50) and the rate of fault-driven
// moves.
type Costs struct {
	// Fault is a fault's round trip with its first page; MinorFault a
	// MINOR fault's (a UFFDIO_CONTINUE of the block); WPFault a
	// write-protect fault's (the protection lifted).
	Fault      time.Duration `json:"fault_ns"`
	MinorFault time.Duration `json:"minor_fault_ns"`
	WPFault    time.Duration `json:"wp_fault_ns"`
	// Per page moved in pieces each way (PagePeer between devices), and
	// zero-filled.
	PageToDevice time.Duration `json:"page_to_device_ns"`
	PageToHost   time.Duration `json:"page_to_host_ns"`
	PagePeer     time.Duration `json:"page_peer_ns"`
	Populate     time.Duration `json:"populate_ns"`
	// Per 2 MiB block moved whole as one folio, to a device (or between
	// devices) and to the host; and per large folio split by a partial
	// move out of it (its other pages rewritten in 4 KiB folios).
	BlockToDevice time.Duration `json:"block_to_device_ns"`
	BlockToHost   time.Duration `json:"block_to_host_ns"`
	FolioSplit    time.Duration `json:"folio_split_ns"`
	// Source says where the figures came from.
	Source string `json:"source,omitempty"`
}

// DefaultCosts are used where a trace measured nothing.
var DefaultCosts = Costs{Fault: 9500 * time.Nanosecond, MinorFault: 6 * time.Microsecond, WPFault: 3 * time.Microsecond,
	PageToDevice: 870 * time.Nanosecond, PageToHost: 870 * time.Nanosecond, PagePeer: 870 * time.Nanosecond,
	Populate: 250 * time.Nanosecond, BlockToDevice: 600 * time.Microsecond, BlockToHost: 600 * time.Microsecond,
	FolioSplit: 700 * time.Microsecond, Source: "defaults"}

func (c Costs) String() string {
	return fmt.Sprintf("%s: fault %v, minor %v, write-protect %v; a page %v to devices, %v to the host, %v zero-filled; a whole block %v to devices, %v to the host; a folio split %v",
		c.Source, c.Fault, c.MinorFault, c.WPFault, c.PageToDevice, c.PageToHost, c.Populate, c.BlockToDevice, c.BlockToHost, c.FolioSplit)
}

// costSamples gathers what the recorded run measured, and counts what
// its policies did (Result.Recorded).
type costSamples struct {
	faults, minors, wps        []time.Duration
	toDevice, toHost, peer     pageTime // runs moved in pieces
	wholeToDevice, wholeToHost pageTime // whole blocks
	recorded                   Counts
}

type pageTime struct {
	pages uint64
	time  time.Duration
}

func (p pageTime) perPage() (time.Duration, bool) {
	if p.pages < 64 || p.time <= 0 {
		return 0, false
	}
	return p.time / time.Duration(p.pages), true
}

// maxSamples bounds the fault times kept for the medians.
const maxSamples = 1 << 16

func (c *costSamples) fault(e *trace.Event) {
	c.recorded.Faults++
	if e.Duration <= 0 {
		return
	}
	switch {
	case e.FaultKind == trace.FaultMinor && len(c.minors) < maxSamples:
		c.minors = append(c.minors, e.Duration)
	case e.FaultKind == trace.FaultWP && len(c.wps) < maxSamples:
		c.wps = append(c.wps, e.Duration)
	case e.FaultKind == trace.FaultMissing && e.Prefetched == 0 && len(c.faults) < maxSamples:
		c.faults = append(c.faults, e.Duration)
	}
}

func (c *costSamples) migration(e *trace.Event) {
	n := uint64(e.Pages)
	whole := n == core.PagesPerBlock && e.Addr%core.BlockSize == 0
	pt := &c.peer
	switch {
	case e.From == trace.CPU:
		c.recorded.PagesToDevice += n
		pt = &c.toDevice
		if whole {
			pt = &c.wholeToDevice
		}
	case e.To == trace.CPU:
		c.recorded.PagesToHost += n
		pt = &c.toHost
		if whole {
			pt = &c.wholeToHost
		}
	default:
		c.recorded.PagesPeer += n
	}
	if e.Cause == trace.CauseEviction {
		c.recorded.EvictedPages += n
	}
	if e.Duration > 0 {
		pt.pages += n
		pt.time += e.Duration
	}
}

func median(d []time.Duration) (time.Duration, bool) {
	if len(d) < 16 {
		return 0, false
	}
	s := slices.Clone(d)
	slices.Sort(s)
	return s[len(s)/2], true
}

// costs are the trace's measurements where it has enough of them, and
// the defaults for the rest.
func (c *costSamples) costs() Costs {
	out := DefaultCosts
	measured := 0
	if v, ok := median(c.faults); ok {
		out.Fault, measured = v, measured+1
	}
	if v, ok := median(c.minors); ok {
		out.MinorFault, measured = v, measured+1
	}
	if v, ok := median(c.wps); ok {
		out.WPFault, measured = v, measured+1
	}
	if v, ok := c.toDevice.perPage(); ok {
		out.PageToDevice, measured = v, measured+1
	}
	if v, ok := c.toHost.perPage(); ok {
		out.PageToHost, measured = v, measured+1
	}
	if v, ok := c.peer.perPage(); ok {
		out.PagePeer, measured = v, measured+1
	}
	if v, ok := c.wholeToDevice.perPage(); ok {
		out.BlockToDevice, measured = v*core.PagesPerBlock, measured+1
	}
	if v, ok := c.wholeToHost.perPage(); ok {
		out.BlockToHost, measured = v*core.PagesPerBlock, measured+1
	}
	switch measured {
	case 0:
	case 8:
		out.Source = "measured by the trace"
	default:
		out.Source = "measured by the trace, defaults where it has too few samples"
	}
	return out
}

// benchFaults is what ParseCosts reads of `uvm bench faults --json`.
type benchFaults struct {
	FaultP50US    *float64 `json:"fault_p50_us"`
	FirstTouchNS  float64  `json:"firsttouch_managed_ns_per_page"`
	D2HGBps       float64  `json:"d2h_read_gbps"`
	FreshPageGBps float64  `json:"fresh_page_write_gbps"`
	Machine       struct {
		CPUs   int    `json:"cpus"`
		Kernel string `json:"kernel"`
	} `json:"machine"`
}

// ParseCosts reads costs from JSON: either Costs' own fields, or the
// report of `uvm bench faults --json` measured on the machine whose
// costs are wanted (a one-page fault's p50 for faults of every kind, the
// fault-driven device-to-host rate for a page moved either way, the
// managed first touch for a zero-filled page). Fields it lacks keep the
// defaults.
func ParseCosts(data []byte) (Costs, error) {
	var bench benchFaults
	if err := json.Unmarshal(data, &bench); err != nil {
		return Costs{}, fmt.Errorf("costs: %w", err)
	}
	if bench.FaultP50US != nil {
		c := DefaultCosts
		fault := time.Duration(*bench.FaultP50US * float64(time.Microsecond))
		if fault <= 0 {
			return Costs{}, fmt.Errorf("%w: costs: a uvm bench faults report with a fault p50 of %v µs", core.ErrInvalidValue, *bench.FaultP50US)
		}
		c.Fault, c.MinorFault, c.WPFault = fault, fault, fault
		if bench.D2HGBps > 0 {
			page := time.Duration(float64(core.PageSize) / bench.D2HGBps) // GB/s is bytes a nanosecond
			c.PageToDevice, c.PageToHost, c.PagePeer = page, page, page
			c.BlockToDevice, c.BlockToHost = page*core.PagesPerBlock, page*core.PagesPerBlock
		}
		if bench.FirstTouchNS > 0 {
			c.Populate = time.Duration(bench.FirstTouchNS)
		}
		c.Source = fmt.Sprintf("uvm bench faults (%d CPUs, Linux %s)", bench.Machine.CPUs, bench.Machine.Kernel)
		return c, nil
	}
	c := DefaultCosts
	if err := json.Unmarshal(data, &c); err != nil {
		return Costs{}, fmt.Errorf("costs: %w", err)
	}
	for _, d := range []time.Duration{c.Fault, c.MinorFault, c.WPFault, c.PageToDevice, c.PageToHost, c.PagePeer, c.Populate, c.BlockToDevice, c.BlockToHost, c.FolioSplit} {
		if d < 0 {
			return Costs{}, fmt.Errorf("%w: costs: a negative cost (%v)", core.ErrInvalidValue, d)
		}
	}
	c.Source = "given"
	return c, nil
}
