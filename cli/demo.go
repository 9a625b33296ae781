package cli

import (
	"encoding/binary"
	"fmt"
	"time"

	"github.com/softuvm/softuvm/internal/bench"
	"github.com/softuvm/softuvm/uvm"
)

func runDemo(args []string) error {
	fs := newFlagSet("demo", "[--size SIZE] [server flags]",
		"Allocate managed memory, touch it on the host, prefetch it to device 0, read it back on the host (page faults migrate it), let a kernel on device 0 change it (its faults migrate it there), and show what each step did and cost")
	var sf serverFlags
	sf.register(fs)
	sizeText := fs.String("size", "64MiB", "bytes to allocate")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	size, err := uvm.ParseSize(*sizeText)
	if err != nil {
		return fmt.Errorf("--size: %w", err)
	}
	cfg, err := sf.config()
	if err != nil {
		return err
	}
	if len(cfg.Devices) == 0 {
		return fmt.Errorf("the demo needs a device: run it with --devices 1 or more")
	}
	if size > cfg.Devices[0].Capacity {
		return fmt.Errorf("--size %s does not fit device 0's arena of %s: raise --arena-size", uvm.FormatSize(size), uvm.FormatSize(cfg.Devices[0].Capacity))
	}
	s, err := uvm.Connect(uvm.Config{Server: "private", Private: cfg})
	if err != nil {
		return err
	}
	defer s.Close()
	fmt.Printf("fault server pid %d (private), device 0 arena %s, prefetch %s\n\n", s.ServerPID(), uvm.FormatSize(cfg.Devices[0].Capacity), cfg.Prefetch)

	a, err := s.MallocManaged(size)
	if err != nil {
		return err
	}
	defer a.Free()
	d := &demo{s: s, a: a, b: a.Bytes()}
	d.pages = (len(d.b) + uvm.PageSize - 1) / uvm.PageSize
	fmt.Printf("1. MallocManaged(%s) at %#x: %d pages, none populated yet\n", uvm.FormatSize(size), a.Addr(), d.pages)
	for _, step := range []func() error{d.hostWrites, d.prefetchToDevice, d.hostReadsBack, d.kernelAddsOne, d.attributesAndService} {
		if err := step(); err != nil {
			return err
		}
	}
	return nil
}

// demo is `uvm demo`'s allocation, which each step moves and checks:
// page i holds i (its low byte) from the host's first touch on.
type demo struct {
	s     *uvm.Session
	a     *uvm.Allocation
	b     []byte
	pages int
}

// step times work and prints what it did: its time, per page and as a
// rate, and what the allocation's counters say it moved.
func (d *demo) step(title string, work func()) error {
	before, err := d.a.Stats()
	if err != nil {
		return err
	}
	t0 := time.Now()
	work()
	elapsed := time.Since(t0)
	after, err := d.a.Stats()
	if err != nil {
		return err
	}
	fmt.Printf("%s: %v (%.2f us/page, %.2f GB/s)\n", title, elapsed.Round(time.Microsecond),
		float64(elapsed.Microseconds())/float64(d.pages), float64(len(d.b))/elapsed.Seconds()/1e9)
	describeDelta(before, after)
	return nil
}

func (d *demo) hostWrites() error {
	return d.step("2. host writes every page (first touch)", func() {
		for i := range d.b {
			d.b[i] = byte(i >> 12)
		}
	})
}

func (d *demo) prefetchToDevice() error {
	var perr error
	if err := d.step("3. Prefetch to device 0", func() { perr = d.a.Prefetch(0) }); err != nil {
		return err
	}
	if perr != nil {
		return perr
	}
	if in, err := d.s.Info(); err == nil {
		fmt.Printf("   device 0 arena now holds %s; the host file holds %s\n", uvm.FormatSize(in.Devices[0].UsedBytes), uvm.FormatSize(in.Sessions[0].HostBytes))
	}
	return nil
}

func (d *demo) hostReadsBack() error {
	bad := 0
	if err := d.step("4. host reads every page back (faults migrate it)", func() {
		for i := 0; i < len(d.b); i += uvm.PageSize {
			if d.b[i] != byte(i>>12) {
				bad++
			}
		}
	}); err != nil {
		return err
	}
	if bad > 0 {
		return fmt.Errorf("%d pages came back wrong", bad)
	}
	return nil
}

func (d *demo) kernelAddsOne() error {
	workers, err := d.s.DeviceGetAttribute(uvm.AttrWorkerCount, 0)
	if err != nil {
		return err
	}
	params := make([]byte, 16)
	binary.LittleEndian.PutUint64(params, uint64(d.a.Addr()))
	binary.LittleEndian.PutUint64(params[8:], uint64(d.a.Size()))
	var kerr error
	if err := d.step(fmt.Sprintf("5. a kernel on device 0 (%d threads) adds one to every page (its faults migrate them)", workers), func() {
		if kerr = d.s.Launch(0, nil, bench.TouchKernel, int(workers), params); kerr == nil {
			kerr = d.s.DeviceSynchronize(0)
		}
	}); err != nil {
		return err
	}
	if kerr != nil {
		return kerr
	}
	bad := 0
	for i := 0; i < len(d.b); i += uvm.PageSize {
		if d.b[i] != byte(i>>12)+1 {
			bad++
		}
	}
	if bad > 0 {
		return fmt.Errorf("%d pages came back from the kernel wrong", bad)
	}
	return nil
}

func (d *demo) attributesAndService() error {
	attrs, err := d.s.RangeAttributes(d.a.Addr(), d.a.Size())
	if err != nil {
		return err
	}
	fmt.Printf("6. the host sees the kernel's writes; range attributes: last prefetch location %v, preferred location %v, read-mostly %v\n", attrs.LastPrefetchLocation, attrs.PreferredLocation, attrs.ReadMostly)
	st, err := d.a.Stats()
	if err != nil {
		return err
	}
	h := st.FaultService
	fmt.Printf("   fault service time over %d faults: p50 %v, p99 %v, max %v\n", h.Count, h.Quantile(0.5), h.Quantile(0.99), time.Duration(h.MaxNS))
	return nil
}

func describeDelta(before, after uvm.Stats) {
	faults := after.TotalFaults() - before.TotalFaults()
	fmt.Printf("   %d faults", faults)
	for _, m := range after.Migrations {
		if n := m.Pages - before.MigratedPages(m.From, m.To); n > 0 {
			fmt.Printf(", %d pages %v -> %v", n, m.From, m.To)
		}
	}
	for _, p := range after.Populated {
		if n := p.Pages - before.PopulatedPages(p.Processor); n > 0 {
			fmt.Printf(", %d pages zero-filled on %v", n, p.Processor)
		}
	}
	if n := after.PrefetchedPages - before.PrefetchedPages; n > 0 {
		fmt.Printf(", %d of them prefetched", n)
	}
	fmt.Println()
}
