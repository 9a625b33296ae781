package cli

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"syscall"
	"time"
	"unsafe"

	"github.com/softuvm/softuvm/devmem"
	"github.com/softuvm/softuvm/internal/config"
	"github.com/softuvm/softuvm/uffd"
	"github.com/softuvm/softuvm/uvm"
)

func runBench(args []string) error {
	if len(args) == 0 || strings.HasPrefix(args[0], "-") {
		fmt.Fprintln(os.Stderr, "Usage: uvm bench faults|launch|grid|memcpy|access|restart|oversub|run|cliff|soak [flags]\n\nBenchmarks: faults, launch, grid, memcpy, access, restart, oversub, run, cliff, soak.")
		if len(args) > 0 && (args[0] == "-h" || args[0] == "--help" || args[0] == "-help") {
			return nil
		}
		return errUsage
	}
	switch args[0] {
	case "faults":
		return benchFaults(args[1:])
	case "launch":
		return benchLaunch(args[1:])
	case "grid":
		return benchGrid(args[1:])
	case "memcpy":
		return benchMemcpy(args[1:])
	case "access":
		return benchAccess(args[1:])
	case "restart":
		return benchRestart(args[1:])
	case "oversub":
		return benchOversub(args[1:])
	case "run":
		return benchRun(args[1:])
	case "cliff":
		return benchCliff(args[1:])
	case "soak":
		return benchSoak(args[1:])
	}
	return fmt.Errorf("unknown benchmark %q: want faults, launch, grid, memcpy, access, restart, oversub, run, cliff or soak", args[0])
}

// faultsReport is the JSON `uvm bench faults --json` prints. Each figure
// is the median over runs, after a warm-up run that is not counted.
type faultsReport struct {
	Machine machineSummary `json:"machine"`
	Runs    int            `json:"runs"`

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

type machineSummary struct {
	CPUs   int    `json:"cpus"`
	Kernel string `json:"kernel"`
	Go     string `json:"go"`
}

func benchFaults(args []string) error {
	fs := newFlagSet("bench faults", "[--json] [--runs N] [--pages N] [--size SIZE] [--cfloor PATH]",
		"Measure one-page fault latency (against a minimal C handler), first-touch cost (against anonymous memory) and device-to-host copy bandwidth (a copy out of managed memory on a device, against the same copy from a warm buffer). Figures are medians over runs, after a warm-up")
	asJSON := fs.Bool("json", false, "print one JSON object")
	runs := fs.Int("runs", 7, "measured runs of each experiment")
	pages := fs.Int("pages", 4096, "pages touched per fault-latency run")
	sizeText := fs.String("size", "256MiB", "memory per first-touch and device-to-host run")
	cfloor := fs.String("cfloor", "", "the uvm-cfloor program (default: next to this binary, then $PATH)")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	size, err := uvm.ParseSize(*sizeText)
	if err != nil {
		return fmt.Errorf("--size: %w", err)
	}
	if *runs < 1 || *pages < 100 || size < 16*uvm.PageSize {
		return fmt.Errorf("want --runs >= 1, --pages >= 100 and --size >= 64KiB")
	}
	rep := faultsReport{Runs: *runs, SizeBytes: size, Machine: machineSummary{CPUs: cpus(), Kernel: kernelRelease(), Go: goVersion()}}
	progress := func(format string, a ...any) { fmt.Fprintf(os.Stderr, "uvm bench: "+format+"\n", a...) }

	cfg := uvm.DefaultServerConfig()
	cfg.Devices = config.DeviceSpecs(1, []int64{max(config.DefaultArenaSize, 2*size)}, cfg.Devices[0].Backend)
	s, err := uvm.Connect(uvm.Config{Server: "private", Private: cfg})
	if err != nil {
		return err
	}
	defer s.Close()

	progress("fault latency: %d runs of %d one-page faults, prefetch off", *runs, *pages)
	p50, p99, err := faultLatency(s, *pages, *runs)
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
		*alt.p50, _, err = faultLatency(ss, *pages, *runs)
		ss.Close()
		if err != nil {
			return err
		}
	}
	progress("recording: %d runs each of %d one-page faults on a server recording a trace and on one not, alternating", *runs, *pages)
	if err := traceOverhead(cfg, *pages, *runs, &rep); err != nil {
		return err
	}
	if path, err := findCFloor(*cfloor); err != nil {
		rep.CFloorNote = err.Error()
	} else {
		progress("C floor: %s", path)
		for _, placement := range []string{"percpu", "single"} {
			f, err := runCFloor(path, placement, *pages, *runs)
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

	progress("first touch: %d runs each of %s managed (default prefetch) and anonymous memory, alternating", *runs, uvm.FormatSize(size))
	if err := firstTouch(s, size, *runs, &rep); err != nil {
		return err
	}
	progress("device to host: %d runs of a host copy of %s resident on device 0 into a warm buffer, against the same copy from a warm source", *runs, uvm.FormatSize(size))
	if err := deviceToHost(s, size, *runs, &rep); err != nil {
		return err
	}
	if *asJSON {
		return writeJSON(os.Stdout, rep)
	}
	printFaultsReport(rep)
	return nil
}

func cpus() int         { return runtime.NumCPU() }
func goVersion() string { return runtime.Version() }

func kernelRelease() string {
	b, _ := os.ReadFile("/proc/sys/kernel/osrelease")
	return strings.TrimSpace(string(b))
}

func median(xs []float64) float64 {
	s := append([]float64(nil), xs...)
	sort.Float64s(s)
	return s[len(s)/2]
}

// traceOverhead measures what recording a trace adds to a fault: the
// same fault-latency runs on two private servers, one with --trace, one
// without, alternating, so that both see the same machine.
func traceOverhead(cfg uvm.ServerConfig, pages, runs int, rep *faultsReport) error {
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
	var s *traceSummary
	deadline := time.Now().Add(10 * time.Second)
	for {
		if s, err = summarizeTrace(path); err == nil || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err != nil {
		return fmt.Errorf("the recording server's trace: %w", err)
	}
	if n := s.totalFaults(); n > 0 {
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

// touchPages writes one byte per page, in order.
func touchPages(b []byte) {
	for i := 0; i < len(b); i += uvm.PageSize {
		b[i] = 1
	}
}

func firstTouch(s *uvm.Session, size int64, runs int, rep *faultsReport) error {
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

// thpSetting returns the selected value of a transparent huge page
// setting ("always [madvise] never" gives "madvise"), or "unknown".
func thpSetting(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return "unknown"
	}
	text := string(b)
	if i, j := strings.IndexByte(text, '['), strings.IndexByte(text, ']'); i >= 0 && j > i {
		return text[i+1 : j]
	}
	return strings.TrimSpace(text)
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

// sumWords reads every byte, eight at a time.
func sumWords(b []byte) uint64 {
	words := unsafe.Slice((*uint64)(unsafe.Pointer(unsafe.SliceData(b))), len(b)/8)
	var sum uint64
	for _, w := range words {
		sum += w
	}
	return sum
}

var sink uint64

func deviceToHost(s *uvm.Session, size int64, runs int, rep *faultsReport) error {
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

// freshPageWrite measures writing into newly allocated pages of a memfd:
// what any migration into fresh 4 KiB pages costs at least here.
func freshPageWrite(src []byte) (float64, error) {
	var rates []float64
	for r := 0; r < 8; r++ { // the first a warm-up, then the median of seven
		fd, err := memfdCreate("softuvm-bench")
		if err != nil {
			return 0, err
		}
		t0 := time.Now()
		n, err := syscall.Pwrite(fd, src, 0)
		secs := time.Since(t0).Seconds()
		syscall.Close(fd)
		if err != nil || n != len(src) {
			return 0, fmt.Errorf("pwrite into a memfd: %v", err)
		}
		if r > 0 {
			rates = append(rates, float64(len(src))/secs/1e9)
		}
	}
	return median(rates), nil
}

func memfdCreate(name string) (int, error) {
	p, err := syscall.BytePtrFromString(name)
	if err != nil {
		return -1, err
	}
	const sysMemfdCreate = 319 // amd64
	fd, _, errno := syscall.Syscall(sysMemfdCreate, uintptr(unsafe.Pointer(p)), 1 /* MFD_CLOEXEC */, 0)
	if errno != 0 {
		return -1, fmt.Errorf("memfd_create: %w", errno)
	}
	return int(fd), nil
}

func printFaultsReport(r faultsReport) {
	fmt.Printf("machine: %d CPUs, Linux %s, %s; medians of %d runs after a warm-up\n\n", r.Machine.CPUs, r.Machine.Kernel, r.Machine.Go, r.Runs)
	fmt.Printf("one 4 KiB fault, prefetch off\n")
	fmt.Printf("  softuvm server (follow handlers)   p50 %6.2f us  p99 %6.2f us\n", r.FaultP50US, r.FaultP99US)
	if r.CFloorP50US != nil {
		fmt.Printf("  C handler in-process (floor, %s) p50 %6.2f us  p99 %6.2f us   ratio %.2f\n", r.CFloorPlacement, *r.CFloorP50US, *r.CFloorP99US, *r.FaultToFloor)
	} else {
		fmt.Printf("  C floor: %s\n", r.CFloorNote)
	}
	fmt.Printf("  placement, p50:      softuvm   C\n")
	fmt.Printf("    follow (default)   %6.2f      -\n", r.FaultP50US)
	fmt.Printf("    a handler per CPU  %6.2f %s\n", r.FaultPerCPUHandlersP50US, optUS(r.CFloorPerCPUHandlersP50US))
	fmt.Printf("    one unpinned       %6.2f %s\n", r.FaultSingleHandlerP50US, optUS(r.CFloorSingleHandlerP50US))
	fmt.Printf("  recording a trace, p50: %6.2f us against %6.2f us without (alternating): ratio %.3f\n", r.TracedFaultP50US, r.UntracedFaultP50US, r.TraceOverhead)
	fmt.Printf("    %.1f events and %.1f bytes of trace per fault (%s per million faults), %d dropped\n", r.TraceEventsPerFault,
		r.TraceBytesPerMillionFaults/1e6, uvm.FormatSize(int64(r.TraceBytesPerMillionFaults)), r.TraceDropped)
	fmt.Printf("\nfirst touch of %s, one write per page\n", uvm.FormatSize(r.SizeBytes))
	fmt.Printf("  managed, default prefetch  %7.0f ns/page  (%d faults)\n", r.FirstTouchManagedNS, r.FirstTouchFaults)
	fmt.Printf("  anonymous memory, 4 KiB    %7.0f ns/page  (transparent huge pages: anonymous %s, shmem %s)\n", r.FirstTouchAnonNS, r.THPAnon, r.THPShmem)
	fmt.Printf("  ratio                      %7.2f\n", r.FirstTouchRatio)
	fmt.Printf("  UFFDIO_ZEROPAGE alone      %7.0f ns/page  (creating the pages, no faults: the floor)\n\n", r.ZeroPageFloorNS)
	fmt.Printf("host copy of %s resident on device 0 into a warm buffer\n", uvm.FormatSize(r.SizeBytes))
	fmt.Printf("  migrating copy             %7.2f GB/s  (%d faults, %d pages read ahead)\n", r.D2HGBps, r.D2HFaults, r.D2HReadAhead)
	fmt.Printf("  memcpy of a warm source    %7.2f GB/s  (same destination, same thread)\n", r.Memcpy1TGBps)
	fmt.Printf("  fraction                   %7.2f\n", r.D2HMemcpyFraction)
	fmt.Printf("  writing fresh memfd pages  %7.2f GB/s  (the ceiling of any copy into new pages here)\n", r.FreshPageWriteGBps)
}

func optUS(v *float64) string {
	if v == nil {
		return "     -"
	}
	return fmt.Sprintf("%6.2f", *v)
}
