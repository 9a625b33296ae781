package bench

import (
	"fmt"
	"io"
	"math"
	"time"

	"github.com/softuvm/softuvm/internal/config"
	"github.com/softuvm/softuvm/uvm"
)

// MemcpyReport is what `uvm bench memcpy` measured, its JSON what --json
// prints. Rates are medians over runs, after a warm-up that is not
// counted; GB/s are 1e9 bytes a second.
type MemcpyReport struct {
	Machine   Machine                `json:"machine"`
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
	Producers []ProducerRow `json:"producers"`
	// Sizes: the engine's transfer time normalized to a single-thread
	// copy of the same bytes, as the paper's figures 9 and 10.
	Sizes []SizeRow `json:"sizes"`
	// SizesOneThread and SizesEngineForced are the same sweep with
	// Memcpy's engine forced off (one thread at every size) and forced
	// on (from 1 byte, with SizesEngineProducers, a producer per CPU),
	// measured with --plot only, to draw beside the calibration's choice.
	SizesOneThread       []SizeRow `json:"sizes_one_thread,omitempty"`
	SizesEngineForced    []SizeRow `json:"sizes_engine_forced,omitempty"`
	SizesEngineProducers int       `json:"sizes_engine_forced_producers,omitempty"`
}

// ProducerRow is Memcpy both ways with one producer count forced.
type ProducerRow struct {
	Producers int     `json:"producers"`
	H2DGBps   float64 `json:"h2d_gbps"`
	D2HGBps   float64 `json:"d2h_gbps"`
}

// SizeRow is Memcpy of one size each way against a single-thread copy
// of the same bytes between host buffers.
type SizeRow struct {
	Bytes          int64   `json:"bytes"`
	SingleThreadUS float64 `json:"single_thread_us"`
	H2DUS          float64 `json:"h2d_us"`
	D2HUS          float64 `json:"d2h_us"`
	H2DNormalized  float64 `json:"h2d_normalized"`
	D2HNormalized  float64 `json:"d2h_normalized"`
}

// MemcpyOptions are what `uvm bench memcpy` measures: its flags.
type MemcpyOptions struct {
	Size      int64 // bytes per transfer
	Runs      int   // measured runs of each transfer
	Producers []int // producer counts to time (nil: 1, 2, 4, ... up to the CPUs)
	PlotDir   string
	Progress  Progress
}

// Memcpy is `uvm bench memcpy`, the copy engine: Memcpy to device memory
// and back and Prefetch both ways against plain memcpy, how the copy
// scales with producer threads, and from which size the engine wins;
// with a PlotDir, the sizes sweep also with the engine forced off and
// forced on, and its figure.
func Memcpy(o MemcpyOptions) (*MemcpyReport, error) {
	if err := checkPlotDir(o.PlotDir); err != nil {
		return nil, err
	}
	m := newMemcpyRun(o)
	for _, step := range []func() error{m.plainCopies, m.engine, m.prefetches, m.producers, m.sizes} {
		if err := step(); err != nil {
			return nil, err
		}
	}
	if _, err := plotMemcpy(o.PlotDir, m.rep, m.progress); err != nil {
		return nil, err
	}
	return m.rep, nil
}

// memcpyRun is a run of `uvm bench memcpy`: the host buffers every
// transfer copies from (src) and to (dst), and a third that the baseline
// timed right before each run copies into: this VM's memory speed
// changes by half from one minute to the next.
type memcpyRun struct {
	o              MemcpyOptions
	progress       Progress
	src, dst, base []byte
	rep            *MemcpyReport
}

func newMemcpyRun(o MemcpyOptions) *memcpyRun {
	m := &memcpyRun{o: o, progress: o.Progress.orQuiet(), rep: &MemcpyReport{Runs: o.Runs, SizeBytes: o.Size, Machine: ThisMachine()}}
	m.progress("host buffers: 3 x %s", uvm.FormatSize(o.Size))
	m.src, m.dst, m.base = warmBuffer(o.Size), warmBuffer(o.Size), warmBuffer(o.Size)
	for i := range m.src {
		m.src[i] = byte(i*7 + i>>12)
	}
	return m
}

// baseline is a memcpy on every CPU, in GB/s.
func (m *memcpyRun) baseline() float64 {
	return rateOnce(m.o.Size, func() { parallelCopy(m.base, m.src, cpus()) })
}

// plainCopies times memcpy between the warm buffers on one thread and
// on every CPU, and writing into fresh memfd pages.
func (m *memcpyRun) plainCopies() error {
	size, runs, src, dst := m.o.Size, m.o.Runs, m.src, m.dst
	m.progress("plain memcpy: one thread, then %d", cpus())
	m.rep.Memcpy1tGBps = medianRate(size, runs, func() error { copy(dst, src); return nil })
	m.rep.MemcpyAllGBps = medianRate(size, runs, func() error { parallelCopy(dst, src, cpus()); return nil })
	fresh, err := freshPageWrite(src[:min(size, 256<<20)])
	if err != nil {
		return err
	}
	m.rep.FreshPageWriteGBps = fresh
	return nil
}

// engine times Memcpy to device memory and back as the engine is
// calibrated, and reads the calibration.
func (m *memcpyRun) engine() error {
	m.progress("engine: Memcpy %s to device memory and back", uvm.FormatSize(m.o.Size))
	s, err := memcpySession(m.o.Size, 0, 0)
	if err != nil {
		return err
	}
	in, err := s.Info()
	if err != nil {
		s.Close()
		return err
	}
	m.rep.Engine = in.CopyEngine
	eng, err := engineRates(s, m.src, m.dst, m.o.Runs, m.baseline)
	s.Close()
	if err != nil {
		return err
	}
	rep := m.rep
	rep.EngineH2DFirstGBps = eng.first
	rep.EngineH2DGBps, rep.EngineD2HGBps, rep.EngineH2DFraction, rep.EngineD2HFraction = eng.h2d, eng.d2h, eng.h2dFraction, eng.d2hFraction
	return nil
}

// prefetches times Prefetch to device 0 and back as calibrated, with the
// chunk pipeline forced on, and with no engine.
func (m *memcpyRun) prefetches() error {
	rep := m.rep
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
		m.progress("Prefetch %s to device 0 and back, %s", uvm.FormatSize(m.o.Size), mode.name)
		pf, err := prefetchRates(m.o.Size, m.src, m.o.Runs, mode.producers, mode.directBelow, m.baseline)
		if err != nil {
			return err
		}
		*mode.h2d, *mode.d2h = pf.h2d, pf.d2h
		if mode.directBelow == 0 {
			rep.PrefetchH2DFraction, rep.PrefetchD2HFraction = pf.h2dFraction, pf.d2hFraction
		}
	}
	return nil
}

// producers times Memcpy both ways with each producer count forced.
func (m *memcpyRun) producers() error {
	producers := m.o.Producers
	if producers == nil {
		for n := 1; n <= cpus(); n *= 2 {
			producers = append(producers, n)
		}
		if producers[len(producers)-1] != cpus() {
			producers = append(producers, cpus())
		}
	}
	for _, n := range producers {
		m.progress("engine with %d producers", n)
		s, err := memcpySession(m.o.Size, n, 0)
		if err != nil {
			return err
		}
		r, err := engineRates(s, m.src, m.dst, m.o.Runs, m.baseline)
		s.Close()
		if err != nil {
			return err
		}
		m.rep.Producers = append(m.rep.Producers, ProducerRow{Producers: n, H2DGBps: r.h2d, D2HGBps: r.d2h})
	}
	return nil
}

// sizes sweeps Memcpy's sizes against one thread's copy; for the figure,
// also with the engine forced off and forced on.
func (m *memcpyRun) sizes() error {
	size, runs, src, dst, rep := m.o.Size, m.o.Runs, m.src, m.dst, m.rep
	m.progress("sizes: engine against one thread, 64 KiB to %s", uvm.FormatSize(size))
	var err error
	if rep.Sizes, err = sizeSweep(size, src, dst, runs, 0, 0); err != nil {
		return err
	}
	if m.o.PlotDir == "" {
		return nil
	}
	rep.SizesEngineProducers = cpus()
	m.progress("sizes, for --plot: Memcpy with the engine forced off, then forced on with %d producers", rep.SizesEngineProducers)
	if rep.SizesOneThread, err = sizeSweep(size, src, dst, runs, 0, math.MaxInt64); err != nil {
		return err
	}
	rep.SizesEngineForced, err = sizeSweep(size, src, dst, runs, rep.SizesEngineProducers, 1)
	return err
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
func sizeSweep(size int64, src, dst []byte, runs, producers int, directBelow int64) ([]SizeRow, error) {
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
	var rows []SizeRow
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
		row := SizeRow{Bytes: n}
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

// Print writes the report as tables.
func (r *MemcpyReport) Print(w io.Writer) {
	fmt.Fprintf(w, "machine: %d CPUs, Linux %s, %s; %s per transfer, medians of %d runs\n", r.Machine.CPUs, r.Machine.Kernel, r.Machine.Go, uvm.FormatSize(r.SizeBytes), r.Runs)
	e := r.Engine
	fmt.Fprintf(w, "engine: %d producers for copies, %d for migrations; engine from %s for copies, %s for migrations\n\n",
		e.CopyProducers, e.MigrationProducers, config.FormatDirectBelow(e.CopyDirectBelow), config.FormatDirectBelow(e.DirectBelow))
	fmt.Fprintf(w, "(fractions: each run against a memcpy on every CPU timed right before it, median over runs)\n")
	fmt.Fprintf(w, "memcpy one thread        %7.2f GB/s\n", r.Memcpy1tGBps)
	fmt.Fprintf(w, "memcpy all CPUs          %7.2f GB/s\n", r.MemcpyAllGBps)
	fmt.Fprintf(w, "engine host->device      %7.2f GB/s  %.2f of memcpy_all (goal 0.9); first copy into new device memory %.2f GB/s\n", r.EngineH2DGBps, r.EngineH2DFraction, r.EngineH2DFirstGBps)
	fmt.Fprintf(w, "engine device->host      %7.2f GB/s  %.2f of memcpy_all (goal 0.9)\n", r.EngineD2HGBps, r.EngineD2HFraction)
	fmt.Fprintf(w, "prefetch host->device    %7.2f GB/s  %.2f of memcpy_all (goal 0.8); chunk pipeline forced on %.2f, no engine %.2f\n", r.PrefetchH2DGBps, r.PrefetchH2DFraction, r.PrefetchEngineH2DGBps, r.PrefetchDirectH2DGBps)
	fmt.Fprintf(w, "prefetch device->host    %7.2f GB/s  %.2f of memcpy_all (goal 0.8); chunk pipeline forced on %.2f, no engine %.2f\n", r.PrefetchD2HGBps, r.PrefetchD2HFraction, r.PrefetchEngineD2HGBps, r.PrefetchDirectD2HGBps)
	fmt.Fprintf(w, "writing new memfd pages  %7.2f GB/s  (the ceiling of any migration here)\n\n", r.FreshPageWriteGBps)
	fmt.Fprintf(w, "%10s %10s %10s\n", "producers", "h2d GB/s", "d2h GB/s")
	for _, p := range r.Producers {
		fmt.Fprintf(w, "%10d %10.2f %10.2f\n", p.Producers, p.H2DGBps, p.D2HGBps)
	}
	fmt.Fprintf(w, "\n%10s %14s %10s %10s %10s %10s\n", "size", "1 thread us", "h2d us", "d2h us", "h2d norm", "d2h norm")
	for _, s := range r.Sizes {
		fmt.Fprintf(w, "%10s %14.1f %10.1f %10.1f %10.2f %10.2f\n", uvm.FormatSize(s.Bytes), s.SingleThreadUS, s.H2DUS, s.D2HUS, s.H2DNormalized, s.D2HNormalized)
	}
	if len(r.SizesOneThread) > 0 {
		fmt.Fprintf(w, "\nMemcpy us, engine forced off (one thread) and forced on (from 1 byte, %d producers):\n%10s %10s %10s %10s %10s\n", r.SizesEngineProducers, "size", "off h2d", "off d2h", "on h2d", "on d2h")
		for i, s := range r.SizesOneThread {
			if i < len(r.SizesEngineForced) {
				e := r.SizesEngineForced[i]
				fmt.Fprintf(w, "%10s %10.1f %10.1f %10.1f %10.1f\n", uvm.FormatSize(s.Bytes), s.H2DUS, s.D2HUS, e.H2DUS, e.D2HUS)
			}
		}
	}
}
