package bench

import (
	"encoding/binary"
	"fmt"
	"io"
	"os"
	"runtime"
	"strings"
	"time"

	"github.com/softuvm/softuvm/bpf"
	"github.com/softuvm/softuvm/devmem"
	"github.com/softuvm/softuvm/internal/config"
	"github.com/softuvm/softuvm/internal/core"
	"github.com/softuvm/softuvm/policy"
	"github.com/softuvm/softuvm/uvm"
)

// AccessReport is what `uvm bench access` measured, its JSON what
// --json prints.
type AccessReport struct {
	Machine     Machine `json:"machine"`
	Runs        int     `json:"runs"`
	FaultRounds int     `json:"fault_rounds"`
	// Mode is the access counting of the streaming run's server, as its
	// Info says.
	Mode   string `json:"mode"`
	Policy string `json:"policy"`

	// A minor fault the kernel resolves (a shared memfd page whose
	// mapping was dropped), timed in this process with no eBPF program
	// loaded, with the access counters loaded and this process tracked
	// (and the anatomy's sched_switch program attached), and loaded but
	// this process not tracked (what every other process pays). Medians
	// of rounds taken in turn; the overheads are medians of each round's
	// difference with the round without the program next to it.
	FaultNSOff              *float64 `json:"fault_ns_off"`
	FaultNSOn               *float64 `json:"fault_ns_on"`
	CountingOverheadUS      *float64 `json:"counting_overhead_us"`
	UntrackedOverheadUS     *float64 `json:"untracked_overhead_us"`
	CountingOverheadMissing string   `json:"counting_overhead_missing,omitempty"`

	// A kernel on device 0 streaming over an accessed-by range resident
	// on the host, which the device maps remotely: its rate while the
	// counters sample it (hint faults every period), and once delayed
	// migration has moved the whole range to the device; the sampled
	// accesses per 64 KiB region it took, and how long.
	RemoteBytes      int64   `json:"remote_bytes"`
	RemoteGBpsBefore float64 `json:"remote_gbps_before"`
	// RemoteGBpsUnsampled: the same stream over the remote mapping with
	// hint faults off (a server with policy hints=off): what sampling
	// costs is the difference with RemoteGBpsBefore.
	RemoteGBpsUnsampled float64 `json:"remote_gbps_unsampled"`
	RemoteGBpsAfter     float64 `json:"remote_gbps_after"`
	AccessesToMigrate   float64 `json:"accesses_to_migrate"`
	MigrationSeconds    float64 `json:"migration_seconds"`
	LaunchesToMigrate   int     `json:"launches_to_migrate"`

	// Anatomy is the median microseconds of each stage of a 4 KiB host
	// fault the server serves (every fault sampled), from the server's
	// histograms: to_server, sampling (the anatomy's own lookups),
	// decision, ioctl, wake, total.
	Anatomy        map[string]float64 `json:"anatomy,omitempty"`
	AnatomySamples uint64             `json:"anatomy_samples"`
	AnatomyMissing string             `json:"anatomy_missing,omitempty"`
}

// AccessOptions are what `uvm bench access` measures: its flags.
type AccessOptions struct {
	Runs        int   // launches timed after migration
	FaultRounds int   // rounds of each fault-cost condition
	FaultPages  int   // minor faults per fault-cost round
	Size        int64 // the remotely mapped range
	// Period is the hint-fault period of the streaming run, and
	// AccessCounting its server's access counting (auto, ebpf or user).
	Period         time.Duration
	AccessCounting string
	Timeout        time.Duration // how long to wait for delayed migration
	Progress       Progress
}

// Access is `uvm bench access`, the access counters: their cost per
// fault, a kernel streaming over remotely mapped memory before and after
// delayed migration, and the anatomy of a fault. What cannot be measured
// here (no eBPF) is reported missing, with the reason.
func Access(o AccessOptions) (*AccessReport, error) {
	progress := o.Progress.orQuiet()
	rep := &AccessReport{Runs: o.Runs, RemoteBytes: o.Size, Machine: ThisMachine()}

	progress("counting overhead: %d rounds of %d kernel-resolved minor faults, without and with the eBPF counters", o.FaultRounds, o.FaultPages)
	rep.FaultRounds = o.FaultRounds
	if err := countingOverhead(o.FaultPages, o.FaultRounds, rep); err != nil {
		rep.CountingOverheadMissing = err.Error()
		progress("counting overhead not measured: %v", err)
	}

	policy := policy.DefaultAccessPolicy
	policy.Period = core.Duration(o.Period)
	policy.Decay = core.Duration(max(time.Duration(policy.Decay), 32*o.Period))
	rep.Policy = policy.String()
	progress("delayed migration: a kernel streaming over %s mapped remotely, hint faults every %v", uvm.FormatSize(o.Size), o.Period)
	if err := remoteStream(o.Size, o.Runs, o.AccessCounting, policy, o.Timeout, progress, rep); err != nil {
		return nil, err
	}
	progress("the same stream with no hint faults")
	var err error
	if rep.RemoteGBpsUnsampled, err = unsampledStream(o.Size, o.Runs, o.AccessCounting, policy); err != nil {
		return nil, err
	}

	progress("fault anatomy: host faults on fresh managed pages, every one sampled")
	if err := faultAnatomy(o.FaultPages, rep); err != nil {
		rep.AnatomyMissing = err.Error()
		progress("fault anatomy not measured: %v", err)
	}
	return rep, nil
}

// Print writes the report.
func (r *AccessReport) Print(w io.Writer) {
	fmt.Fprintf(w, "access counting: %s\n", r.Mode)
	if r.CountingOverheadUS != nil {
		fmt.Fprintf(w, "minor fault: %.0f ns without counters, %.0f ns with: +%.3f us counted, +%.3f us for an untracked process\n",
			*r.FaultNSOff, *r.FaultNSOn, *r.CountingOverheadUS, *r.UntrackedOverheadUS)
	} else {
		fmt.Fprintf(w, "counting overhead: not measured (%s)\n", r.CountingOverheadMissing)
	}
	fmt.Fprintf(w, "remote stream over %s: %.2f GB/s sampled remotely (%.2f unsampled), %.2f GB/s after delayed migration (%d launches, %.1f s, %.0f sampled accesses per 64 KiB region)\n",
		uvm.FormatSize(r.RemoteBytes), r.RemoteGBpsBefore, r.RemoteGBpsUnsampled, r.RemoteGBpsAfter, r.LaunchesToMigrate, r.MigrationSeconds, r.AccessesToMigrate)
	if r.Anatomy != nil {
		fmt.Fprintf(w, "fault anatomy (median us of %d samples):", r.AnatomySamples)
		for _, k := range anatomyStages {
			fmt.Fprintf(w, " %s %.1f", k, r.Anatomy[k])
		}
		fmt.Fprintln(w)
	} else {
		fmt.Fprintf(w, "fault anatomy: not measured (%s)\n", r.AnatomyMissing)
	}
}

// countingOverhead times kernel-resolved minor faults in this process
// with no program loaded, with the counters tracking it, and with the
// counters loaded but the process untracked, rounds taken in turn.
func countingOverhead(pages, runs int, rep *AccessReport) error {
	length := int64(pages) * uvm.PageSize
	f, err := devmem.CreateFile("uvm-bench-minor", length)
	if err != nil {
		return err
	}
	defer f.Close()
	m, err := f.Map(0, length)
	if err != nil {
		return err
	}
	defer m.Unmap()
	b := m.Bytes()
	for i := 0; i < len(b); i += uvm.PageSize {
		b[i] = 1 // the pages stay in the file: every timed fault is minor
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	round := func() (float64, error) {
		if err := devmem.DropPages(m.Addr(), length); err != nil {
			return 0, err
		}
		var sink byte
		t0 := time.Now()
		for i := 0; i < len(b); i += uvm.PageSize {
			sink += b[i] // a read: a minor fault that maps the file's page
		}
		ns := float64(time.Since(t0).Nanoseconds()) / float64(pages)
		b[0] = sink | 1
		return ns, nil
	}
	if _, err := round(); err != nil { // warm up
		return err
	}
	var off, on, dOn, dUntracked []float64
	for r := 0; r < runs; r++ {
		base, err := round()
		if err != nil {
			return err
		}
		c, err := bpf.Load(bpf.DefaultThreshold)
		if err != nil {
			return err
		}
		u, t, err := func() (float64, float64, error) {
			defer c.Close()
			if err := c.EnableAnatomy(); err != nil {
				return 0, 0, err
			}
			u, err := round()
			if err != nil {
				return 0, 0, err
			}
			if err := c.Track(os.Getpid(), 1); err != nil {
				return 0, 0, err
			}
			t, err := round()
			return u, t, err
		}()
		if err != nil {
			return err
		}
		off, on = append(off, base), append(on, t)
		dOn, dUntracked = append(dOn, (t-base)/1e3), append(dUntracked, (u-base)/1e3)
	}
	fOff, fOn, oOn, oUn := median(off), median(on), median(dOn), median(dUntracked)
	rep.FaultNSOff, rep.FaultNSOn, rep.CountingOverheadUS, rep.UntrackedOverheadUS = &fOff, &fOn, &oOn, &oUn
	return nil
}

// remoteRange is a private server's session with size bytes of managed
// memory written by the host and device 0's process started, and a
// launch of a streaming kernel over the range that returns its GB/s.
type remoteRange struct {
	s      *uvm.Session
	a      *uvm.Allocation
	launch func() (float64, error)
}

func newRemoteRange(size int64, mode string, policy policy.AccessPolicy) (*remoteRange, error) {
	cfg := uvm.DefaultServerConfig()
	cfg.Devices = config.DeviceSpecs(1, []int64{max(config.DefaultArenaSize, 2*size)}, cfg.Devices[0].Backend)
	cfg.AccessCounting = mode
	cfg.AccessPolicy = policy
	s, err := uvm.Connect(uvm.Config{Server: "private", Private: cfg})
	if err != nil {
		return nil, err
	}
	rr := &remoteRange{s: s}
	if rr.a, err = s.MallocManaged(size); err != nil {
		s.Close()
		return nil, err
	}
	data := rr.a.Bytes()
	for i := range data {
		data[i] = byte(i)
	}
	workers, _ := s.DeviceGetAttribute(uvm.AttrWorkerCount, 0)
	params := make([]byte, 16)
	binary.LittleEndian.PutUint64(params, uint64(rr.a.Addr()))
	binary.LittleEndian.PutUint64(params[8:], uint64(size))
	rr.launch = func() (float64, error) {
		t0 := time.Now()
		if err := s.Launch(0, nil, "uvm-bench-stream", int(workers), params); err != nil {
			return 0, err
		}
		if err := s.DeviceSynchronize(0); err != nil {
			return 0, err
		}
		return float64(size) / time.Since(t0).Seconds() / 1e9, nil
	}
	err = s.Launch(0, nil, "uvm-bench-nothing", 1, nil) // starts the device process
	if err == nil {
		err = s.DeviceSynchronize(0)
	}
	if err != nil {
		rr.close()
		return nil, err
	}
	return rr, nil
}

func (rr *remoteRange) close() {
	rr.a.Free()
	rr.s.Close()
}

// unsampledStream times the kernel over the range mapped remotely with
// no hint faults: what the remote mapping itself costs.
func unsampledStream(size int64, runs int, mode string, policy policy.AccessPolicy) (float64, error) {
	policy.Hints = false
	rr, err := newRemoteRange(size, mode, policy)
	if err != nil {
		return 0, err
	}
	defer rr.close()
	if err := rr.s.MemAdvise(rr.a.Addr(), size, uvm.AdviseSetAccessedBy, 0); err != nil {
		return 0, err
	}
	if _, err := rr.launch(); err != nil { // maps the range
		return 0, err
	}
	var rates []float64
	for r := 0; r < runs; r++ {
		gbps, err := rr.launch()
		if err != nil {
			return 0, err
		}
		rates = append(rates, gbps)
	}
	return median(rates), nil
}

// remoteStream streams a kernel over an accessed-by range resident on the
// host until delayed migration has moved it all to device 0.
func remoteStream(size int64, runs int, mode string, policy policy.AccessPolicy, timeout time.Duration, progress func(string, ...any), rep *AccessReport) error {
	rr, err := newRemoteRange(size, mode, policy)
	if err != nil {
		return err
	}
	defer rr.close()
	s, a, launch := rr.s, rr.a, rr.launch
	in, err := s.Info()
	if err != nil {
		return err
	}
	rep.Mode = in.AccessCounting
	user := strings.HasPrefix(in.AccessCounting, config.AccessCountingUser)
	if strings.HasPrefix(in.AccessCounting, "off") {
		return fmt.Errorf("access counting is off: %s", in.AccessCounting)
	}
	sampled := func() (uint64, error) {
		if user {
			st, err := s.Stats()
			return st.FaultsBy(0).Minor, err
		}
		in, err := s.Info()
		if err != nil {
			return 0, err
		}
		for _, si := range in.Sessions {
			if si.PID == os.Getpid() {
				for _, d := range si.Devices {
					if d.Processor == 0 && d.EBPFFaults != nil {
						return *d.EBPFFaults, nil
					}
				}
			}
		}
		return 0, fmt.Errorf("no eBPF fault count for device 0's process in the server's Info")
	}
	start, err := sampled()
	if err != nil {
		return err
	}
	began := time.Now()
	if err := s.MemAdvise(a.Addr(), size, uvm.AdviseSetAccessedBy, 0); err != nil {
		return err
	}
	pages := uint64(size / uvm.PageSize)
	var before []float64
	launches := 0
	for {
		st, err := a.Stats()
		if err != nil {
			return err
		}
		if st.CounterMigratedPages(0) >= pages {
			break
		}
		if time.Since(began) > timeout {
			return fmt.Errorf("delayed migration moved %d of %d pages in %v", st.CounterMigratedPages(0), pages, timeout)
		}
		gbps, err := launch()
		if err != nil {
			return err
		}
		launches++
		if st.CounterMigratedPages(0) == 0 && launches > 1 { // the first maps the range
			before = append(before, gbps)
		}
		if launches%10 == 0 {
			progress("  %d launches, %d of %d pages migrated", launches, st.CounterMigratedPages(0), pages)
		}
	}
	rep.MigrationSeconds = time.Since(began).Seconds()
	rep.LaunchesToMigrate = launches
	end, err := sampled()
	if err != nil {
		return err
	}
	rep.AccessesToMigrate = float64(end-start) / float64(size>>bpf.RegionShift)
	if len(before) == 0 {
		return fmt.Errorf("the range migrated before a second launch: raise --size or --period")
	}
	rep.RemoteGBpsBefore = median(before)
	var after []float64
	for r := 0; r < runs; r++ {
		gbps, err := launch()
		if err != nil {
			return err
		}
		after = append(after, gbps)
	}
	rep.RemoteGBpsAfter = median(after)
	return nil
}

var anatomyStages = []string{"to_server", "sampling", "decision", "ioctl", "wake", "total"}

// faultAnatomy takes host faults on fresh managed pages with every fault
// sampled and reads the medians of the server's histograms.
func faultAnatomy(pages int, rep *AccessReport) error {
	cfg := uvm.DefaultServerConfig()
	cfg.AccessCounting = config.AccessCountingEBPF
	cfg.AccessPolicy = policy.DefaultAccessPolicy
	cfg.AccessPolicy.AnatomyEvery = 1
	s, err := uvm.Connect(uvm.Config{Server: "private", Private: cfg})
	if err != nil {
		return err
	}
	defer s.Close()
	// samples waits until the server has reported at least want samples
	// (a sampled fault's report arrives after its wake) and returns the
	// anatomy.
	samples := func(want uint64) (*uvm.FaultAnatomy, error) {
		deadline := time.Now().Add(10 * time.Second)
		for {
			in, err := s.Info()
			if err != nil {
				return nil, err
			}
			if in.Anatomy == nil {
				return nil, fmt.Errorf("the server samples no fault: %s", in.AccessCounting)
			}
			if in.Anatomy.Samples >= want || time.Now().After(deadline) {
				return in.Anatomy, nil
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	var warm *uvm.FaultAnatomy
	for r := 0; r < 2; r++ { // the first round warms up, and is subtracted
		if r == 1 {
			if warm, err = samples(uint64(pages)); err != nil {
				return err
			}
		}
		a, err := s.MallocManaged(int64(pages)*uvm.PageSize, uvm.WithPrefetch(uvm.PrefetchSpec{Policy: "none"}))
		if err != nil {
			return err
		}
		b := a.Bytes()
		for i := 0; i < len(b); i += uvm.PageSize {
			b[i] = 1
		}
		if err := a.Free(); err != nil {
			return err
		}
	}
	an, err := samples(warm.Samples + uint64(pages))
	if err != nil {
		return err
	}
	// About one fault per page (no prefetch), every one sampled: a round
	// takes a page's fault or two more now and then, and a report can be
	// lost, so within 1% of the round's pages, or the figures describe
	// other faults (the warm-up's doubled them).
	if got, want := an.Samples-warm.Samples, uint64(pages); got+want/100 < want || got > want+want/100+2 {
		return fmt.Errorf("the server sampled %d faults in a round of %d pages, want one per page within 1%%", got, pages)
	}
	us := func(h, w uvm.Histogram) float64 { return float64(h.Since(w).Quantile(0.5).Nanoseconds()) / 1e3 }
	rep.Anatomy = map[string]float64{"to_server": us(an.ToServer, warm.ToServer), "sampling": us(an.Sampling, warm.Sampling),
		"decision": us(an.Decision, warm.Decision), "ioctl": us(an.Ioctl, warm.Ioctl), "wake": us(an.Wake, warm.Wake), "total": us(an.Total, warm.Total)}
	rep.AnatomySamples = an.Samples - warm.Samples
	return nil
}
