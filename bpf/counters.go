package bpf

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/cilium/ebpf/ringbuf"
	"github.com/cilium/ebpf/rlimit"
)

// RegionShift is log2 of a counted region's size: 64 KiB, the
// granularity of NVIDIA's access counters by default.
const RegionShift = 16

// DefaultThreshold is the count at which a region is reported: 256, the
// default of NVIDIA's driver (uvm_perf_access_counters.c,
// UVM_PERF_ACCESS_COUNTER_THRESHOLD_DEFAULT).
const DefaultThreshold = 256

// Counters is the loaded and attached access-counting program.
type Counters struct {
	objs  countersObjects
	link  link.Link
	ring  *ringbuf.Reader
	start time.Time
}

// Crossing is a region whose count reached the threshold.
type Crossing struct {
	Processor uint32 // 0 the CPU, 1+d device d
	PID       int
	Region    uint64 // address >> RegionShift
	Count     uint64
	At        time.Duration // CLOCK_MONOTONIC
}

// RegionCount is one region's count.
type RegionCount struct {
	Processor uint32
	Region    uint64
	Count     uint64
}

// Load loads the program with threshold, attaches it to the tracepoint
// and returns it; the error says why it could not (no privilege, no BPF
// in this kernel, no tracepoint), for the caller to fall back.
func Load(threshold uint64) (*Counters, error) {
	if threshold == 0 {
		return nil, fmt.Errorf("access counter threshold 0: want 1 or more")
	}
	if err := rlimit.RemoveMemlock(); err != nil {
		return nil, fmt.Errorf("load eBPF access counters: raise RLIMIT_MEMLOCK: %w", err)
	}
	spec, err := loadCounters()
	if err != nil {
		return nil, fmt.Errorf("load eBPF access counters: %w", err)
	}
	if err := spec.Variables["threshold"].Set(threshold); err != nil {
		return nil, fmt.Errorf("load eBPF access counters: set the threshold: %w", err)
	}
	c := &Counters{start: time.Now()}
	if err := spec.LoadAndAssign(&c.objs, nil); err != nil {
		return nil, fmt.Errorf("load eBPF access counters: %w", explain(err))
	}
	if c.link, err = link.Tracepoint("exceptions", "page_fault_user", c.objs.CountFault, nil); err != nil {
		c.objs.Close()
		return nil, fmt.Errorf("attach eBPF access counters to exceptions:page_fault_user: %w", explain(err))
	}
	if c.ring, err = ringbuf.NewReader(c.objs.Crossings); err != nil {
		c.link.Close()
		c.objs.Close()
		return nil, fmt.Errorf("open the access counters' ring buffer: %w", err)
	}
	return c, nil
}

// explain adds what a permission error means here.
func explain(err error) error {
	if errors.Is(err, os.ErrPermission) {
		return fmt.Errorf("%w (needs CAP_BPF and CAP_PERFMON, or root)", err)
	}
	return err
}

// Close detaches the program and frees its maps.
func (c *Counters) Close() error {
	errs := []error{c.ring.Close(), c.link.Close(), c.objs.Close()}
	return errors.Join(errs...)
}

// Track counts pid's faults from now on as processor's (0 the CPU, 1+d
// device d), its per-process count starting at zero.
func (c *Counters) Track(pid int, processor uint32) error {
	key := uint32(pid)
	if err := c.objs.ProcessFaults.Put(key, uint64(0)); err != nil {
		return fmt.Errorf("track pid %d: %w", pid, err)
	}
	if err := c.objs.Processes.Put(key, processor); err != nil {
		return fmt.Errorf("track pid %d: %w", pid, err)
	}
	return nil
}

// Untrack stops counting pid's faults.
func (c *Counters) Untrack(pid int) {
	key := uint32(pid)
	_ = c.objs.Processes.Delete(key)
	_ = c.objs.ProcessFaults.Delete(key)
}

// ProcessFaults is the user faults of pid since Track.
func (c *Counters) ProcessFaults(pid int) (uint64, error) {
	var n uint64
	if err := c.objs.ProcessFaults.Lookup(uint32(pid), &n); err != nil {
		return 0, fmt.Errorf("faults of pid %d: %w", pid, err)
	}
	return n, nil
}

// Regions returns every counted region.
func (c *Counters) Regions() ([]RegionCount, error) {
	var out []RegionCount
	var k countersRegionKey
	var v uint64
	it := c.objs.Regions.Iterate()
	for it.Next(&k, &v) {
		out = append(out, RegionCount{Processor: k.Processor, Region: k.Region, Count: v})
	}
	return out, it.Err()
}

// Decay halves every region's count and drops those that reach zero, so
// that an old burst does not add up with new accesses to a migration.
func (c *Counters) Decay() error {
	regions, err := c.Regions()
	if err != nil {
		return err
	}
	for _, r := range regions {
		k := countersRegionKey{Processor: r.Processor, Region: r.Region}
		if r.Count/2 == 0 {
			_ = c.objs.Regions.Delete(k)
		} else if err := c.objs.Regions.Update(k, r.Count/2, ebpf.UpdateExist); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return err
		}
	}
	return nil
}

// FaultEntry returns when thread tid's last fault entered the kernel
// (CLOCK_MONOTONIC) and at which address.
func (c *Counters) FaultEntry(tid int) (time.Duration, uint64, bool) {
	var e countersFaultEntry
	if err := c.objs.FaultEntries.Lookup(uint32(tid), &e); err != nil {
		return 0, 0, false
	}
	return time.Duration(e.AtNs), e.Address, true
}

// ReadCrossing waits for the next region to reach the threshold, until
// deadline (zero: no deadline); os.ErrDeadlineExceeded when none did.
func (c *Counters) ReadCrossing(deadline time.Time) (Crossing, error) {
	c.ring.SetDeadline(deadline)
	rec, err := c.ring.Read()
	if err != nil {
		return Crossing{}, err
	}
	b := rec.RawSample
	if len(b) < 32 {
		return Crossing{}, fmt.Errorf("access counter crossing of %d bytes, want 32", len(b))
	}
	ne := binary.NativeEndian
	x := countersCrossing{Processor: ne.Uint32(b[0:]), Pid: ne.Uint32(b[4:]), Region: ne.Uint64(b[8:]), Count: ne.Uint64(b[16:]), AtNs: ne.Uint64(b[24:])}
	return Crossing{Processor: x.Processor, PID: int(x.Pid), Region: x.Region, Count: x.Count, At: time.Duration(x.AtNs)}, nil
}
