package bench

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/softuvm/softuvm/devmem"
	"github.com/softuvm/softuvm/internal/config"
	"github.com/softuvm/softuvm/trace"
	"github.com/softuvm/softuvm/uffd"
	"github.com/softuvm/softuvm/uvm"
)

// FaultsReport is what `uvm bench faults` measured, its JSON what --json
// prints. Each figure is the median over runs, after a warm-up run that
// is not counted.
type FaultsReport struct {
	Machine Machine `json:"machine"`
	Runs    int     `json:"runs"`

	// One 4 KiB host fault served by the server, prefetch off, the
	// faulting thread unpinned.
	FaultP50US float64 `json:"fault_p50_us"`
	FaultP99US float64 `json:"fault_p99_us"`
	// The same served by a minimal C handler in the faulting process
	// (uvm-cfloor), in the same run: the better of its two placements
	// (one pinned handler per CPU, or one unpinned handler), named in
	// CFloorPlacement. Which is better depends on the machine: on a
	// 2-CPU VM the per-CPU handlers, on 16 CPUs the single one.
	CFloorP50US     *float64 `json:"c_floor_p50_us"`
	CFloorP99US     *float64 `json:"c_floor_p99_us"`
	CFloorPlacement string   `json:"c_floor_placement,omitempty"`
	FaultToFloor    *float64 `json:"fault_to_c_floor_ratio"`
	// Handler placement: the server with a handler waiting on every CPU,
	// and with one unpinned handler; the C floor in each placement.
	FaultPerCPUHandlersP50US  float64  `json:"fault_per_cpu_handlers_p50_us"`
	FaultSingleHandlerP50US   float64  `json:"fault_single_handler_p50_us"`
	CFloorPerCPUHandlersP50US *float64 `json:"c_floor_per_cpu_handlers_p50_us"`
	CFloorSingleHandlerP50US  *float64 `json:"c_floor_single_handler_p50_us"`
	CFloorNote                string   `json:"c_floor_note,omitempty"`

	// Recording: the same faults on two servers at once, one recording
	// every event to a trace file (--trace), one not, alternating run by
	// run. TraceOverhead is recording's p50 over the other's.
	UntracedFaultP50US         float64 `json:"untraced_fault_p50_us"`
	TracedFaultP50US           float64 `json:"traced_fault_p50_us"`
	TraceOverhead              float64 `json:"trace_overhead_ratio"`
	TraceBytesPerMillionFaults float64 `json:"trace_bytes_per_million_faults"`
	TraceEventsPerFault        float64 `json:"trace_events_per_fault"`
	TraceDropped               uint64  `json:"trace_dropped_events"`

	// Sequential first touch (one write per page) of managed memory with
	// the default prefetch, against plain anonymous memory in 4 KiB pages
	// (MADV_NOHUGEPAGE), as managed memory is mapped. The machine's
	// transparent huge page settings, anonymous and shmem, are recorded:
	// they change both sides' costs.
	FirstTouchManagedNS float64 `json:"firsttouch_managed_ns_per_page"`
	FirstTouchAnonNS    float64 `json:"firsttouch_anon_ns_per_page"`
	FirstTouchRatio     float64 `json:"firsttouch_ratio"`
	FirstTouchFaults    uint64  `json:"firsttouch_faults"`
	THPAnon             string  `json:"thp_anon"`
	THPShmem            string  `json:"thp_shmem"`
	// The floor under any first touch of managed memory here: creating a
	// zeroed page in a memfd and mapping it with UFFDIO_ZEROPAGE, 2 MiB
	// per call, no fault at all.
	ZeroPageFloorNS float64 `json:"zeropage_floor_ns_per_page"`

	// A host copy out of memory resident on device 0 (fault-driven
	// migration with prefetch) into a warm buffer, against the same copy
	// from a warm source on the same thread.
	D2HGBps           float64 `json:"d2h_read_gbps"`
	Memcpy1TGBps      float64 `json:"memcpy_1t_gbps"`
	D2HMemcpyFraction float64 `json:"d2h_memcpy_fraction"`
	D2HFaults         uint64  `json:"d2h_faults"`
	// D2HReadAhead counts the pages of the last run that came back read
	// ahead of the copy (policy.ReadAhead), not on its faults.
	D2HReadAhead uint64 `json:"d2h_read_ahead_pages"`
	// The floor under any migration into fresh pages on this machine:
	// writing into newly allocated pages of a memfd (pwrite), in GB/s.
	FreshPageWriteGBps float64 `json:"fresh_page_write_gbps"`
	SizeBytes          int64   `json:"size_bytes"`
}

// FaultsOptions are what `uvm bench faults` measures: its flags.
type FaultsOptions struct {
	Runs     int    // measured runs of each experiment, after a warm-up
	Pages    int    // pages touched per fault-latency run
	Size     int64  // memory per first-touch and device-to-host run
	CFloor   string // the uvm-cfloor program ("": next to this binary, then $PATH)
	Progress Progress
}

// Faults is `uvm bench faults`: one-page fault latency (against a
// minimal C handler, and with the server recording a trace), first-touch
// cost (against anonymous memory) and device-to-host copy bandwidth
// (against the same copy from a warm buffer), on private servers of one
// device.
func Faults(o FaultsOptions) (*FaultsReport, error) {
	progress := o.Progress.orQuiet()
	rep := &FaultsReport{Runs: o.Runs, SizeBytes: o.Size, Machine: ThisMachine()}
	cfg := uvm.DefaultServerConfig()
	cfg.Devices = config.DeviceSpecs(1, []int64{max(config.DefaultArenaSize, 2*o.Size)}, cfg.Devices[0].Backend)
	s, err := uvm.Connect(uvm.Config{Server: "private", Private: cfg})
	if err != nil {
		return nil, err
	}
	defer s.Close()

	progress("fault latency: %d runs of %d one-page faults, prefetch off", o.Runs, o.Pages)
	if err := placementLatencies(s, cfg, o, progress, rep); err != nil {
		return nil, err
	}
	progress("recording: %d runs each of %d one-page faults on a server recording a trace and on one not, alternating", o.Runs, o.Pages)
	if err := traceOverhead(cfg, o.Pages, o.Runs, rep); err != nil {
		return nil, err
	}
	cFloor(o, progress, rep)
	progress("first touch: %d runs each of %s managed (default prefetch) and anonymous memory, alternating", o.Runs, uvm.FormatSize(o.Size))
	if err := firstTouch(s, o.Size, o.Runs, rep); err != nil {
		return nil, err
	}
	progress("device to host: %d runs of a host copy of %s resident on device 0 into a warm buffer, against the same copy from a warm source", o.Runs, uvm.FormatSize(o.Size))
	if err := deviceToHost(s, o.Size, o.Runs, rep); err != nil {
		return nil, err
	}
	return rep, nil
}

// placementLatencies times the fault on s, the server as configured
// (handlers following the faulting CPUs), then on servers with a handler
// waiting on every CPU and with one unpinned handler.
func placementLatencies(s *uvm.Session, cfg uvm.ServerConfig, o FaultsOptions, progress Progress, rep *FaultsReport) error {
	p50, p99, err := faultLatency(s, o.Pages, o.Runs)
	if err != nil {
		return err
	}
	rep.FaultP50US, rep.FaultP99US = p50, p99
	for _, alt := range []struct {
		placement config.HandlerPlacement
		p50       *float64
	}{{config.HandlersPerCPU, &rep.FaultPerCPUHandlersP50US}, {config.HandlersSingle, &rep.FaultSingleHandlerP50US}} {
		c := cfg
		c.Handlers = alt.placement
		progress("fault latency with %s handlers", alt.placement)
		ss, err := uvm.Connect(uvm.Config{Server: "private", Private: c})
		if err != nil {
			return err
		}
		*alt.p50, _, err = faultLatency(ss, o.Pages, o.Runs)
		ss.Close()
		if err != nil {
			return err
		}
	}
	return nil
}

// cFloor times the same faults served by uvm-cfloor, a minimal C handler
// in the faulting process, in both placements; where it cannot, the
// report says why (CFloorNote).
func cFloor(o FaultsOptions, progress Progress, rep *FaultsReport) {
	path, err := findCFloor(o.CFloor)
	if err != nil {
		rep.CFloorNote = err.Error()
		return
	}
	progress("C floor: %s", path)
	for _, placement := range []string{"percpu", "single"} {
		f, err := runCFloor(path, placement, o.Pages, o.Runs)
		if err != nil {
			rep.CFloorNote = err.Error()
			continue
		}
		if placement == "percpu" {
			rep.CFloorPerCPUHandlersP50US = &f.P50
		} else {
			rep.CFloorSingleHandlerP50US = &f.P50
		}
		if rep.CFloorP50US == nil || f.P50 < *rep.CFloorP50US {
			rep.CFloorP50US, rep.CFloorP99US, rep.CFloorPlacement = &f.P50, &f.P99, placement
			ratio := rep.FaultP50US / f.P50
			rep.FaultToFloor = &ratio
		}
	}
}

// traceOverhead measures what recording a trace adds to a fault: the
// same fault-latency runs on two private servers, one with --trace, one
// without, alternating, so that both see the same machine.
func traceOverhead(cfg uvm.ServerConfig, pages, runs int, rep *FaultsReport) error {
	dir, err := os.MkdirTemp("", "uvm-bench-trace-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	path := filepath.Join(dir, "faults.uvmtrace")
	traced := cfg
	traced.Trace = path
	plain, err := uvm.Connect(uvm.Config{Server: "private", Private: cfg})
	if err != nil {
		return err
	}
	defer plain.Close()
	rec, err := uvm.Connect(uvm.Config{Server: "private", Private: traced})
	if err != nil {
		return err
	}
	var on, off []float64
	for r := 0; r < runs; r++ {
		p, _, err := faultLatency(plain, pages, 1)
		if err != nil {
			rec.Close()
			return err
		}
		q, _, err := faultLatency(rec, pages, 1)
		if err != nil {
			rec.Close()
			return err
		}
		off, on = append(off, p), append(on, q)
	}
	if err := rec.Close(); err != nil {
		return err
	}
	rep.UntracedFaultP50US, rep.TracedFaultP50US = median(off), median(on)
	rep.TraceOverhead = rep.TracedFaultP50US / rep.UntracedFaultP50US
	// The private server closes its trace as it exits, after its client.
	var s *trace.Summary
	deadline := time.Now().Add(10 * time.Second)
	for {
		if s, err = trace.Summarize(path); err == nil || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err != nil {
		return fmt.Errorf("the recording server's trace: %w", err)
	}
	if n := s.TotalFaults(); n > 0 {
		rep.TraceBytesPerMillionFaults = s.BytesPerMillionFaults
		rep.TraceEventsPerFault = float64(s.Events) / float64(n)
	}
	rep.TraceDropped = s.Dropped
	return nil
}

// faultLatency times single-page write faults on fresh managed memory
// with prefetch off: per run the p50 and p99, then the median of each.
func faultLatency(s *uvm.Session, pages, runs int) (p50, p99 float64, err error) {
	var p50s, p99s []float64
	lat := make([]float64, pages)
	for r := 0; r <= runs; r++ { // run 0 warms up
		a, err := s.MallocManaged(int64(pages)*uvm.PageSize, uvm.WithPrefetch(uvm.PrefetchSpec{Policy: "none"}))
		if err != nil {
			return 0, 0, err
		}
		b := a.Bytes()
		for i := 0; i < pages; i++ {
			t0 := time.Now()
			b[i*uvm.PageSize] = 1
			lat[i] = float64(time.Since(t0).Nanoseconds()) / 1e3
		}
		if err := a.Free(); err != nil {
			return 0, 0, err
		}
		if r == 0 {
			continue
		}
		sort.Float64s(lat)
		p50s = append(p50s, lat[pages/2])
		p99s = append(p99s, lat[pages*99/100])
	}
	return median(p50s), median(p99s), nil
}

type cfloorResult struct {
	P50 float64 `json:"p50_us"`
	P99 float64 `json:"p99_us"`
}

func findCFloor(flagPath string) (string, error) {
	if flagPath != "" {
		return flagPath, nil
	}
	if exe, err := os.Executable(); err == nil {
		p := filepath.Join(filepath.Dir(exe), "uvm-cfloor")
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
	}
	if p, err := exec.LookPath("uvm-cfloor"); err == nil {
		return p, nil
	}
	return "", fmt.Errorf("uvm-cfloor not found next to this binary or in $PATH: build it with `make` (cmd/uvm-cfloor/cfloor.c) or pass --cfloor")
}

func runCFloor(path, placement string, pages, runs int) (cfloorResult, error) {
	var out, errOut bytes.Buffer
	cmd := exec.Command(path, "-p", placement, "-n", fmt.Sprint(pages), "-r", fmt.Sprint(runs))
	cmd.Stdout, cmd.Stderr = &out, &errOut
	if err := cmd.Run(); err != nil {
		return cfloorResult{}, fmt.Errorf("%s: %v: %s", path, err, strings.TrimSpace(errOut.String()))
	}
	var r cfloorResult
	if err := json.Unmarshal(out.Bytes(), &r); err != nil {
		return r, fmt.Errorf("%s printed %q: %v", path, out.String(), err)
	}
	return r, nil
}

func firstTouch(s *uvm.Session, size int64, runs int, rep *FaultsReport) error {
	pages := float64(size / uvm.PageSize)
	var managed, anon []float64
	for r := 0; r <= runs; r++ {
		a, err := s.MallocManaged(size)
		if err != nil {
			return err
		}
		before, err := a.Stats()
		if err != nil {
			return err
		}
		t0 := time.Now()
		touchPages(a.Bytes())
		m := float64(time.Since(t0).Nanoseconds()) / pages
		after, err := a.Stats()
		if err != nil {
			return err
		}
		if err := a.Free(); err != nil {
			return err
		}
		b, err := syscall.Mmap(-1, 0, int(size), syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_PRIVATE|syscall.MAP_ANONYMOUS)
		if err != nil {
			return fmt.Errorf("anonymous mmap of %d bytes: %w", size, err)
		}
		if err := syscall.Madvise(b, syscall.MADV_NOHUGEPAGE); err != nil {
			syscall.Munmap(b)
			return fmt.Errorf("madvise(MADV_NOHUGEPAGE) on the anonymous baseline: %w", err)
		}
		t0 = time.Now()
		touchPages(b)
		an := float64(time.Since(t0).Nanoseconds()) / pages
		syscall.Munmap(b)
		if r == 0 {
			continue
		}
		managed, anon = append(managed, m), append(anon, an)
		rep.FirstTouchFaults = after.TotalFaults() - before.TotalFaults()
	}
	if rep.FirstTouchFaults == 0 {
		return fmt.Errorf("first touch of %s of managed memory took no fault: the figure would time no first touch", uvm.FormatSize(size))
	}
	rep.THPAnon = thpSetting("/sys/kernel/mm/transparent_hugepage/enabled")
	rep.THPShmem = thpSetting("/sys/kernel/mm/transparent_hugepage/shmem_enabled")
	rep.FirstTouchManagedNS, rep.FirstTouchAnonNS = median(managed), median(anon)
	rep.FirstTouchRatio = rep.FirstTouchManagedNS / rep.FirstTouchAnonNS
	floor, err := zeroPageFloor(size, runs)
	if err != nil {
		return err
	}
	rep.ZeroPageFloorNS = floor
	return nil
}

// zeroPageFloor times UFFDIO_ZEROPAGE into a registered memfd mapping in
// this process, 2 MiB per call: page creation without any fault.
func zeroPageFloor(size int64, runs int) (float64, error) {
	var perPage []float64
	for r := 0; r <= runs; r++ {
		f, err := devmem.CreateFile("softuvm-bench-zeropage", size)
		if err != nil {
			return 0, err
		}
		m, err := f.Map(0, size)
		if err != nil {
			f.Close()
			return 0, err
		}
		u, err := uffd.Open(uffd.CloseOnExec)
		if err == nil {
			_, err = u.Handshake(uffd.FeatureMissingShmem)
		}
		if err == nil {
			_, err = u.Register(m.Addr(), uintptr(size), uffd.RegisterMissing)
		}
		var elapsed time.Duration
		if err == nil {
			t0 := time.Now()
			for off := int64(0); off < size && err == nil; off += 2 << 20 {
				_, err = u.ZeroPage(m.Addr()+uintptr(off), uintptr(min(2<<20, size-off)), false)
			}
			elapsed = time.Since(t0)
		}
		if u != nil {
			u.Close()
		}
		m.Unmap()
		f.Close()
		if err != nil {
			return 0, fmt.Errorf("zeropage floor: %w", err)
		}
		if r > 0 {
			perPage = append(perPage, float64(elapsed.Nanoseconds())/float64(size/uvm.PageSize))
		}
	}
	return median(perPage), nil
}

func deviceToHost(s *uvm.Session, size int64, runs int, rep *FaultsReport) error {
	src := make([]byte, size)
	dst := make([]byte, size)
	for i := range src {
		src[i] = byte(i)
	}
	copy(dst, src)
	var d2h, mc []float64
	for r := 0; r <= runs; r++ {
		a, err := s.MallocManaged(size)
		if err != nil {
			return err
		}
		b := a.Bytes()
		copy(b, src)
		if err := a.Prefetch(0); err != nil {
			a.Free()
			return err
		}
		before, err := a.Stats()
		if err != nil {
			return err
		}
		// The figure and its baseline are the same copy into the same
		// warm destination on the same thread: only the source differs,
		// managed memory on the device (every page migrates back into
		// a page the server allocates) against a warm buffer.
		t0 := time.Now()
		copy(dst, b)
		secs := time.Since(t0).Seconds()
		after, err := a.Stats()
		if err != nil {
			return err
		}
		if err := a.Free(); err != nil {
			return err
		}
		t0 = time.Now()
		copy(dst, src)
		mcSecs := time.Since(t0).Seconds()
		if moved := after.MigratedPages(0, uvm.CPU) - before.MigratedPages(0, uvm.CPU); moved != uint64(size/uvm.PageSize) {
			return fmt.Errorf("device-to-host copy: %d pages came back from the device, want %d: the figure would time no migration", moved, size/uvm.PageSize)
		}
		if r == 0 {
			continue
		}
		d2h = append(d2h, float64(size)/secs/1e9)
		mc = append(mc, float64(size)/mcSecs/1e9)
		rep.D2HFaults = after.TotalFaults() - before.TotalFaults()
		rep.D2HReadAhead = after.ReadAheadPages - before.ReadAheadPages
	}
	rep.D2HGBps, rep.Memcpy1TGBps = median(d2h), median(mc)
	rep.D2HMemcpyFraction = rep.D2HGBps / rep.Memcpy1TGBps
	fresh, err := freshPageWrite(src)
	if err != nil {
		return err
	}
	rep.FreshPageWriteGBps = fresh
	return nil
}

// Print writes the report as a table.
func (r *FaultsReport) Print(w io.Writer) {
	fmt.Fprintf(w, "machine: %d CPUs, Linux %s, %s; medians of %d runs after a warm-up\n\n", r.Machine.CPUs, r.Machine.Kernel, r.Machine.Go, r.Runs)
	fmt.Fprintf(w, "one 4 KiB fault, prefetch off\n")
	fmt.Fprintf(w, "  softuvm server (follow handlers)   p50 %6.2f us  p99 %6.2f us\n", r.FaultP50US, r.FaultP99US)
	if r.CFloorP50US != nil {
		fmt.Fprintf(w, "  C handler in-process (floor, %s) p50 %6.2f us  p99 %6.2f us   ratio %.2f\n", r.CFloorPlacement, *r.CFloorP50US, *r.CFloorP99US, *r.FaultToFloor)
	} else {
		fmt.Fprintf(w, "  C floor: %s\n", r.CFloorNote)
	}
	fmt.Fprintf(w, "  placement, p50:      softuvm   C\n")
	fmt.Fprintf(w, "    follow (default)   %6.2f      -\n", r.FaultP50US)
	fmt.Fprintf(w, "    a handler per CPU  %6.2f %s\n", r.FaultPerCPUHandlersP50US, optUS(r.CFloorPerCPUHandlersP50US))
	fmt.Fprintf(w, "    one unpinned       %6.2f %s\n", r.FaultSingleHandlerP50US, optUS(r.CFloorSingleHandlerP50US))
	fmt.Fprintf(w, "  recording a trace, p50: %6.2f us against %6.2f us without (alternating): ratio %.3f\n", r.TracedFaultP50US, r.UntracedFaultP50US, r.TraceOverhead)
	fmt.Fprintf(w, "    %.1f events and %.1f bytes of trace per fault (%s per million faults), %d dropped\n", r.TraceEventsPerFault,
		r.TraceBytesPerMillionFaults/1e6, uvm.FormatSize(int64(r.TraceBytesPerMillionFaults)), r.TraceDropped)
	fmt.Fprintf(w, "\nfirst touch of %s, one write per page\n", uvm.FormatSize(r.SizeBytes))
	fmt.Fprintf(w, "  managed, default prefetch  %7.0f ns/page  (%d faults)\n", r.FirstTouchManagedNS, r.FirstTouchFaults)
	fmt.Fprintf(w, "  anonymous memory, 4 KiB    %7.0f ns/page  (transparent huge pages: anonymous %s, shmem %s)\n", r.FirstTouchAnonNS, r.THPAnon, r.THPShmem)
	fmt.Fprintf(w, "  ratio                      %7.2f\n", r.FirstTouchRatio)
	fmt.Fprintf(w, "  UFFDIO_ZEROPAGE alone      %7.0f ns/page  (creating the pages, no faults: the floor)\n\n", r.ZeroPageFloorNS)
	fmt.Fprintf(w, "host copy of %s resident on device 0 into a warm buffer\n", uvm.FormatSize(r.SizeBytes))
	fmt.Fprintf(w, "  migrating copy             %7.2f GB/s  (%d faults, %d pages read ahead)\n", r.D2HGBps, r.D2HFaults, r.D2HReadAhead)
	fmt.Fprintf(w, "  memcpy of a warm source    %7.2f GB/s  (same destination, same thread)\n", r.Memcpy1TGBps)
	fmt.Fprintf(w, "  fraction                   %7.2f\n", r.D2HMemcpyFraction)
	fmt.Fprintf(w, "  writing fresh memfd pages  %7.2f GB/s  (the ceiling of any copy into new pages here)\n", r.FreshPageWriteGBps)
}

func optUS(v *float64) string {
	if v == nil {
		return "     -"
	}
	return fmt.Sprintf("%6.2f", *v)
}
