package cli

import (
	"fmt"
	"math"
	"os"
	"strings"
	"sync"
	"time"
	"unsafe"

	"github.com/softuvm/softuvm/internal/config"
	"github.com/softuvm/softuvm/uvm"
)

// memcpyReport is the JSON `uvm bench memcpy --json` prints. Rates are
// medians over runs, after a warm-up that is not counted; GB/s are 1e9
// bytes a second.
type memcpyReport struct {
	Machine   machineSummary         `json:"machine"`
	Runs      int                    `json:"runs"`
	SizeBytes int64                  `json:"size_bytes"`
	Engine    config.CopyCalibration `json:"engine"`

	// Plain memcpy between warm buffers of the size, in this process:
	// one thread, and every CPU copying a share at once.
	Memcpy1tGBps  float64 `json:"memcpy_1t_gbps"`
	MemcpyAllGBps float64 `json:"memcpy_all_gbps"`

	// Memcpy of the size from ordinary host memory to device memory and
	// back, through the copy engine. The first copy into new device
	// memory allocates its pages and is reported apart.
	EngineH2DGBps float64 `json:"engine_h2d_gbps"`
	EngineD2HGBps float64 `json:"engine_d2h_gbps"`
	// Fractions are the median over runs of each run's rate against a
	// memcpy on every CPU timed right before it: this VM's memory speed
	// changes by half from one minute to the next.
	EngineH2DFraction  float64 `json:"engine_h2d_fraction"`
	EngineD2HFraction  float64 `json:"engine_d2h_fraction"`
	EngineH2DFirstGBps float64 `json:"engine_h2d_first_copy_gbps"`

	// Prefetch of a managed range of the size to device 0 and back to
	// the CPU, each a migration of every page.
	PrefetchH2DGBps     float64 `json:"prefetch_h2d_gbps"`
	PrefetchD2HGBps     float64 `json:"prefetch_d2h_gbps"`
	PrefetchH2DFraction float64 `json:"prefetch_h2d_fraction"`
	PrefetchD2HFraction float64 `json:"prefetch_d2h_fraction"`
	// The same prefetches with the chunk pipeline forced on (from 1
	// byte), and with no engine at all (one block at a time, every stage
	// on one goroutine), whatever the calibration chose.
	PrefetchEngineH2DGBps float64 `json:"prefetch_engine_h2d_gbps"`
	PrefetchEngineD2HGBps float64 `json:"prefetch_engine_d2h_gbps"`
	PrefetchDirectH2DGBps float64 `json:"prefetch_direct_h2d_gbps"`
	PrefetchDirectD2HGBps float64 `json:"prefetch_direct_d2h_gbps"`
	// The ceiling of any migration here: writing into new pages of a
	// memfd, which allocates them.
	FreshPageWriteGBps float64 `json:"fresh_page_write_gbps"`

	// Producers: engine_h2d and engine_d2h with N_P forced, to show how
	// the copy scales with producer threads.
	Producers []producerRow `json:"producers"`
	// Sizes: the engine's transfer time normalized to a single-thread
	// copy of the same bytes, as the paper's figures 9 and 10.
	Sizes []sizeRow `json:"sizes"`
	// SizesOneThread and SizesEngineForced are the same sweep with
	// Memcpy's engine forced off (one thread at every size) and forced
	// on (from 1 byte, with SizesEngineProducers, a producer per CPU),
	// measured with --plot only, to draw beside the calibration's choice.
	SizesOneThread       []sizeRow `json:"sizes_one_thread,omitempty"`
	SizesEngineForced    []sizeRow `json:"sizes_engine_forced,omitempty"`
	SizesEngineProducers int       `json:"sizes_engine_forced_producers,omitempty"`
}

type producerRow struct {
	Producers int     `json:"producers"`
	H2DGBps   float64 `json:"h2d_gbps"`
	D2HGBps   float64 `json:"d2h_gbps"`
}

type sizeRow struct {
	Bytes          int64   `json:"bytes"`
	SingleThreadUS float64 `json:"single_thread_us"`
	H2DUS          float64 `json:"h2d_us"`
	D2HUS          float64 `json:"d2h_us"`
	H2DNormalized  float64 `json:"h2d_normalized"`
	D2HNormalized  float64 `json:"d2h_normalized"`
}

func benchMemcpy(args []string) error {
	fs := newFlagSet("bench memcpy", "[--json] [--size SIZE] [--runs N] [--producers LIST] [--plot DIR]",
		"Measure the copy engine: Memcpy to device memory and back and Prefetch both ways against plain memcpy, how the copy scales with producer threads, and from which size the engine wins")
	asJSON := fs.Bool("json", false, "print one JSON object")
	sizeText := fs.String("size", "1GiB", "bytes per transfer")
	runs := fs.Int("runs", 5, "measured runs of each transfer (median)")
	producersText := fs.String("producers", "", "comma list of producer counts to time (default: 1, 2, 4, ... up to the CPUs)")
	plotDir := fs.String("plot", "", "also draw the sizes sweep (a single-thread copy between host buffers and Memcpy each way, each timed at 64 KiB, 256 KiB, ... up to --size) into `DIR` (created if missing) as copy-sizes.png and copy-sizes.svg, GB/s against the copy's size; it also sweeps Memcpy with the engine forced off (one thread) and forced on (from 1 byte, a producer per CPU), drawn beside the calibration's choice and given in --json as sizes_one_thread and sizes_engine_forced")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	size, err := uvm.ParseSize(*sizeText)
	if err != nil {
		return fmt.Errorf("--size: %w", err)
	}
	if size < 4<<20 || *runs < 1 {
		return fmt.Errorf("want --size of at least 4 MiB and --runs >= 1 (have %q, %d)", *sizeText, *runs)
	}
	producers, err := parseProducers(*producersText)
	if err != nil {
		return err
	}
	if err := checkPlotDir(*plotDir); err != nil {
		return err
	}
	progress := func(format string, a ...any) { fmt.Fprintf(os.Stderr, "uvm bench: "+format+"\n", a...) }
	rep := memcpyReport{Runs: *runs, SizeBytes: size, Machine: machineSummary{CPUs: cpus(), Kernel: kernelRelease(), Go: goVersion()}}

	progress("host buffers: 3 x %s", uvm.FormatSize(size))
	src, dst, base := warmBuffer(size), warmBuffer(size), warmBuffer(size)
	baseline := func() float64 { return rateOnce(size, func() { parallelCopy(base, src, cpus()) }) }
	for i := range src {
		src[i] = byte(i*7 + i>>12)
	}
	progress("plain memcpy: one thread, then %d", cpus())
	rep.Memcpy1tGBps = medianRate(size, *runs, func() error { copy(dst, src); return nil })
	rep.MemcpyAllGBps = medianRate(size, *runs, func() error { parallelCopy(dst, src, cpus()); return nil })
	fresh, err := freshPageWrite(src[:min(size, 256<<20)])
	if err != nil {
		return err
	}
	rep.FreshPageWriteGBps = fresh

	progress("engine: Memcpy %s to device memory and back", uvm.FormatSize(size))
	s, err := memcpySession(size, 0, 0)
	if err != nil {
		return err
	}
	in, err := s.Info()
	if err != nil {
		s.Close()
		return err
	}
	rep.Engine = in.CopyEngine
	var eng transferRates
	eng, err = engineRates(s, src, dst, *runs, baseline)
	s.Close()
	if err != nil {
		return err
	}
	rep.EngineH2DFirstGBps = eng.first
	rep.EngineH2DGBps, rep.EngineD2HGBps, rep.EngineH2DFraction, rep.EngineD2HFraction = eng.h2d, eng.d2h, eng.h2dFraction, eng.d2hFraction

	for _, mode := range []struct {
		name        string
		producers   int
		directBelow int64
		h2d, d2h    *float64
	}{
		{"as calibrated", 0, 0, &rep.PrefetchH2DGBps, &rep.PrefetchD2HGBps},
		{"pipeline forced on", 0, 1, &rep.PrefetchEngineH2DGBps, &rep.PrefetchEngineD2HGBps},
		{"no engine", 1, math.MaxInt64, &rep.PrefetchDirectH2DGBps, &rep.PrefetchDirectD2HGBps},
	} {
		progress("Prefetch %s to device 0 and back, %s", uvm.FormatSize(size), mode.name)
		pf, err := prefetchRates(size, src, *runs, mode.producers, mode.directBelow, baseline)
		if err != nil {
			return err
		}
		*mode.h2d, *mode.d2h = pf.h2d, pf.d2h
		if mode.directBelow == 0 {
			rep.PrefetchH2DFraction, rep.PrefetchD2HFraction = pf.h2dFraction, pf.d2hFraction
		}
	}

	if producers == nil {
		for n := 1; n <= cpus(); n *= 2 {
			producers = append(producers, n)
		}
		if producers[len(producers)-1] != cpus() {
			producers = append(producers, cpus())
		}
	}
	for _, n := range producers {
		progress("engine with %d producers", n)
		s, err := memcpySession(size, n, 0)
		if err != nil {
			return err
		}
		r, err := engineRates(s, src, dst, *runs, baseline)
		s.Close()
		if err != nil {
			return err
		}
		rep.Producers = append(rep.Producers, producerRow{Producers: n, H2DGBps: r.h2d, D2HGBps: r.d2h})
	}

	progress("sizes: engine against one thread, 64 KiB to %s", uvm.FormatSize(size))
	if rep.Sizes, err = sizeSweep(size, src, dst, *runs, 0, 0); err != nil {
		return err
	}
	if *plotDir != "" {
		rep.SizesEngineProducers = cpus()
		progress("sizes, for --plot: Memcpy with the engine forced off, then forced on with %d producers", rep.SizesEngineProducers)
		if rep.SizesOneThread, err = sizeSweep(size, src, dst, *runs, 0, math.MaxInt64); err != nil {
			return err
		}
		if rep.SizesEngineForced, err = sizeSweep(size, src, dst, *runs, rep.SizesEngineProducers, 1); err != nil {
			return err
		}
	}
	if _, err := plotMemcpy(*plotDir, rep); err != nil {
		return err
	}

	if *asJSON {
		return writeJSON(os.Stdout, rep)
	}
	printMemcpyReport(rep)
	return nil
}

func parseProducers(text string) ([]int, error) {
	if text == "" {
		return nil, nil
	}
	var out []int
	for _, part := range strings.Split(text, ",") {
		part = strings.TrimSpace(part)
		var n int
		if _, err := fmt.Sscanf(part, "%d", &n); err != nil || n < 1 || n > 1024 {
			return nil, fmt.Errorf("--producers: %q is not a count from 1 to 1024", part)
		}
		out = append(out, n)
	}
	return out, nil
}

// memcpySession starts a private server with one device large enough for
// device memory and a managed range of size each; producers and
// directBelow override the engine's calibration where nonzero.
func memcpySession(size int64, producers int, directBelow int64) (*uvm.Session, error) {
	cfg := uvm.DefaultServerConfig()
	cfg.Devices = config.DeviceSpecs(1, []int64{2*size + 64<<20}, cfg.Devices[0].Backend)
	cfg.CopyProducers = producers
	cfg.CopyDirectBelow = directBelow
	return uvm.Connect(uvm.Config{Server: "private", Private: cfg})
}

// warmBuffer returns size bytes whose pages exist: this VM hands unused
// memory back to the host, and the first touch of a page costs several
// times a copy of it.
func warmBuffer(size int64) []byte {
	b := make([]byte, size)
	for i := int64(0); i < size; i += uvm.PageSize {
		b[i] = 1
	}
	return b
}

// parallelCopy copies src into dst with n goroutines, each a contiguous
// share, as plain memcpy on every CPU.
func parallelCopy(dst, src []byte, n int) {
	var wg sync.WaitGroup
	share := (len(src) + n - 1) / n
	for lo := 0; lo < len(src); lo += share {
		hi := min(len(src), lo+share)
		wg.Add(1)
		go func() { defer wg.Done(); copy(dst[lo:hi], src[lo:hi]) }()
	}
	wg.Wait()
}

// medianRate runs f once to warm up, then runs times, and returns the
// median rate in GB/s.
func medianRate(bytes int64, runs int, f func() error) float64 {
	var rates []float64
	for r := -1; r < runs; r++ {
		t := time.Now()
		if err := f(); err != nil {
			return 0
		}
		if r >= 0 {
			rates = append(rates, float64(bytes)/time.Since(t).Seconds()/1e9)
		}
	}
	return median(rates)
}

// transferRates are one transfer's medians over runs, each way, and of
// each run's rate against the baseline timed right before it.
type transferRates struct {
	first, h2d, d2h          float64
	h2dFraction, d2hFraction float64
}

// rateOnce runs f once and returns its rate in GB/s.
func rateOnce(bytes int64, f func()) float64 {
	t := time.Now()
	f()
	return float64(bytes) / time.Since(t).Seconds() / 1e9
}

// timeBoth runs there and back runs times after one warm-up, each right
// after a baseline, and returns the medians of their rates and of their
// rates against the baseline.
func timeBoth(bytes int64, runs int, baseline func() float64, there, back func() error) (transferRates, error) {
	var r transferRates
	var h2d, d2h, fh, fd []float64
	for i := -1; i < runs; i++ {
		for _, way := range []struct {
			f            func() error
			rates, fracs *[]float64
		}{{there, &h2d, &fh}, {back, &d2h, &fd}} {
			b := baseline()
			t := time.Now()
			if err := way.f(); err != nil {
				return r, err
			}
			rate := float64(bytes) / time.Since(t).Seconds() / 1e9
			if i >= 0 {
				*way.rates = append(*way.rates, rate)
				*way.fracs = append(*way.fracs, rate/b)
			}
		}
	}
	r.h2d, r.d2h, r.h2dFraction, r.d2hFraction = median(h2d), median(d2h), median(fh), median(fd)
	return r, nil
}

// engineRates times Memcpy from src to new device memory (the first copy,
// which allocates the device pages), then to it and back to dst, and
// checks the bytes.
func engineRates(s *uvm.Session, src, dst []byte, runs int, baseline func() float64) (transferRates, error) {
	size := int64(len(src))
	host, back := addrOf(src), addrOf(dst)
	// The first copy into new device memory, each time into memory just
	// allocated (freeing device memory gives its pages back to the
	// arena): the median of at least five.
	var firsts []float64
	for i := 0; i < max(runs, 5); i++ {
		fresh, err := s.Malloc(0, size)
		if err != nil {
			return transferRates{}, err
		}
		t := time.Now()
		err = s.Memcpy(fresh.Addr(), host, size, uvm.MemcpyHostToDevice)
		secs := time.Since(t).Seconds()
		if ferr := s.Free(fresh.Addr()); err == nil {
			err = ferr
		}
		if err != nil {
			return transferRates{}, err
		}
		firsts = append(firsts, float64(size)/secs/1e9)
	}
	first := median(firsts)
	dev, err := s.Malloc(0, size)
	if err != nil {
		return transferRates{}, err
	}
	defer s.Free(dev.Addr())
	if err := s.Memcpy(dev.Addr(), host, size, uvm.MemcpyHostToDevice); err != nil {
		return transferRates{}, err
	}
	clear(dst)
	r, err := timeBoth(size, runs, baseline,
		func() error { return s.Memcpy(dev.Addr(), host, size, uvm.MemcpyHostToDevice) },
		func() error { return s.Memcpy(back, dev.Addr(), size, uvm.MemcpyDeviceToHost) })
	if err != nil {
		return r, err
	}
	r.first = first
	if i := firstDifference(dst, src); i >= 0 {
		return r, fmt.Errorf("Memcpy through device memory changed byte %d: %#x, want %#x", i, dst[i], src[i])
	}
	return r, nil
}

func firstDifference(a, b []byte) int {
	const step = 1 << 20
	for lo := 0; lo < len(a); lo += step {
		hi := min(len(a), lo+step)
		if string(a[lo:hi]) != string(b[lo:hi]) {
			for i := lo; i < hi; i++ {
				if a[i] != b[i] {
					return i
				}
			}
		}
	}
	return -1
}

// prefetchRates writes a managed range of size on the host, then times
// Prefetch to device 0 and back to the CPU, runs times after a warm-up
// round trip, and checks the bytes.
func prefetchRates(size int64, src []byte, runs, producers int, directBelow int64, baseline func() float64) (transferRates, error) {
	s, err := memcpySession(size, producers, directBelow)
	if err != nil {
		return transferRates{}, err
	}
	defer s.Close()
	a, err := s.MallocManaged(size)
	if err != nil {
		return transferRates{}, err
	}
	defer s.Free(a.Addr())
	copy(a.Bytes(), src)
	// Each timed prefetch must move every page, or the figure times a
	// prefetch that found its pages already there. The two statistics
	// requests fall inside the timing: some 0.1 ms against the 100 ms or
	// more a prefetch of the default 256 MiB takes.
	moves := func(from, to uvm.Device) func() error {
		return func() error {
			before, err := a.Stats()
			if err != nil {
				return err
			}
			if err := s.Prefetch(a.Addr(), size, to); err != nil {
				return err
			}
			after, err := a.Stats()
			if err != nil {
				return err
			}
			if moved, want := after.MigratedPages(from, to)-before.MigratedPages(from, to), uint64(size/uvm.PageSize); moved != want {
				return fmt.Errorf("prefetch of %s to %v moved %d pages from %v, want %d", uvm.FormatSize(size), to, moved, from, want)
			}
			return nil
		}
	}
	r, err := timeBoth(size, runs, baseline, moves(uvm.CPU, 0), moves(0, uvm.CPU))
	if err != nil {
		return r, err
	}
	if i := firstDifference(a.Bytes(), src); i >= 0 {
		return r, fmt.Errorf("Prefetch there and back changed byte %d", i)
	}
	return r, nil
}

// sizeSweep times Memcpy to device memory and back at sizes from 64 KiB
// up, against a single-thread copy of the same bytes between host
// buffers, each the median of enough repetitions to take a few
// milliseconds; producers and directBelow override the engine's
// calibration where nonzero (as memcpySession's).
func sizeSweep(size int64, src, dst []byte, runs, producers int, directBelow int64) ([]sizeRow, error) {
	s, err := memcpySession(size, producers, directBelow)
	if err != nil {
		return nil, err
	}
	defer s.Close()
	dev, err := s.Malloc(0, size)
	if err != nil {
		return nil, err
	}
	defer s.Free(dev.Addr())
	host, back := addrOf(src), addrOf(dst)
	if err := s.Memcpy(dev.Addr(), host, size, uvm.MemcpyHostToDevice); err != nil { // its pages exist from here on
		return nil, err
	}
	var rows []sizeRow
	for n := int64(64 << 10); n <= size; n *= 4 {
		reps := int(max(1, (8<<20)/n))
		timeIt := func(f func() error) (float64, error) {
			var us []float64
			for r := -1; r < runs; r++ {
				t := time.Now()
				for range reps {
					if err := f(); err != nil {
						return 0, err
					}
				}
				if r >= 0 {
					us = append(us, float64(time.Since(t).Microseconds())/float64(reps))
				}
			}
			return median(us), nil
		}
		row := sizeRow{Bytes: n}
		row.SingleThreadUS, _ = timeIt(func() error { copy(dst[:n], src[:n]); return nil })
		if row.H2DUS, err = timeIt(func() error { return s.Memcpy(dev.Addr(), host, n, uvm.MemcpyHostToDevice) }); err != nil {
			return nil, err
		}
		if row.D2HUS, err = timeIt(func() error { return s.Memcpy(back, dev.Addr(), n, uvm.MemcpyDeviceToHost) }); err != nil {
			return nil, err
		}
		if row.SingleThreadUS > 0 {
			row.H2DNormalized = row.H2DUS / row.SingleThreadUS
			row.D2HNormalized = row.D2HUS / row.SingleThreadUS
		}
		rows = append(rows, row)
	}
	return rows, nil
}

func printMemcpyReport(r memcpyReport) {
	fmt.Printf("machine: %d CPUs, Linux %s, %s; %s per transfer, medians of %d runs\n", r.Machine.CPUs, r.Machine.Kernel, r.Machine.Go, uvm.FormatSize(r.SizeBytes), r.Runs)
	e := r.Engine
	fmt.Printf("engine: %d producers for copies, %d for migrations; engine from %s for copies, %s for migrations\n\n",
		e.CopyProducers, e.MigrationProducers, engineSize(e.CopyDirectBelow), engineSize(e.DirectBelow))
	fmt.Printf("(fractions: each run against a memcpy on every CPU timed right before it, median over runs)\n")
	fmt.Printf("memcpy one thread        %7.2f GB/s\n", r.Memcpy1tGBps)
	fmt.Printf("memcpy all CPUs          %7.2f GB/s\n", r.MemcpyAllGBps)
	fmt.Printf("engine host->device      %7.2f GB/s  %.2f of memcpy_all (goal 0.9); first copy into new device memory %.2f GB/s\n", r.EngineH2DGBps, r.EngineH2DFraction, r.EngineH2DFirstGBps)
	fmt.Printf("engine device->host      %7.2f GB/s  %.2f of memcpy_all (goal 0.9)\n", r.EngineD2HGBps, r.EngineD2HFraction)
	fmt.Printf("prefetch host->device    %7.2f GB/s  %.2f of memcpy_all (goal 0.8); chunk pipeline forced on %.2f, no engine %.2f\n", r.PrefetchH2DGBps, r.PrefetchH2DFraction, r.PrefetchEngineH2DGBps, r.PrefetchDirectH2DGBps)
	fmt.Printf("prefetch device->host    %7.2f GB/s  %.2f of memcpy_all (goal 0.8); chunk pipeline forced on %.2f, no engine %.2f\n", r.PrefetchD2HGBps, r.PrefetchD2HFraction, r.PrefetchEngineD2HGBps, r.PrefetchDirectD2HGBps)
	fmt.Printf("writing new memfd pages  %7.2f GB/s  (the ceiling of any migration here)\n\n", r.FreshPageWriteGBps)
	fmt.Printf("%10s %10s %10s\n", "producers", "h2d GB/s", "d2h GB/s")
	for _, p := range r.Producers {
		fmt.Printf("%10d %10.2f %10.2f\n", p.Producers, p.H2DGBps, p.D2HGBps)
	}
	fmt.Printf("\n%10s %14s %10s %10s %10s %10s\n", "size", "1 thread us", "h2d us", "d2h us", "h2d norm", "d2h norm")
	for _, s := range r.Sizes {
		fmt.Printf("%10s %14.1f %10.1f %10.1f %10.2f %10.2f\n", uvm.FormatSize(s.Bytes), s.SingleThreadUS, s.H2DUS, s.D2HUS, s.H2DNormalized, s.D2HNormalized)
	}
	if len(r.SizesOneThread) > 0 {
		fmt.Printf("\nMemcpy us, engine forced off (one thread) and forced on (from 1 byte, %d producers):\n%10s %10s %10s %10s %10s\n", r.SizesEngineProducers, "size", "off h2d", "off d2h", "on h2d", "on d2h")
		for i, s := range r.SizesOneThread {
			if i < len(r.SizesEngineForced) {
				e := r.SizesEngineForced[i]
				fmt.Printf("%10s %10.1f %10.1f %10.1f %10.1f\n", uvm.FormatSize(s.Bytes), s.H2DUS, s.D2HUS, e.H2DUS, e.D2HUS)
			}
		}
	}
}

// addrOf is the address of b's first byte, for Memcpy.
func addrOf(b []byte) uintptr { return uintptr(unsafe.Pointer(unsafe.SliceData(b))) }
