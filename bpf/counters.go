package bpf

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
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
	objs  countersLoaded
	link  link.Link
	ring  *ringbuf.Reader
	start time.Time

	// The fault anatomy, off until EnableAnatomy: its program runs on
	// every context switch, which a server that samples nothing should
	// not pay for.
	mu         sync.Mutex
	closed     bool
	switchLink link.Link       // sched_switch, nil while off
	resumes    *ringbuf.Reader // nil while off

	// maps is held for reading by every use of the maps, for writing by
	// Close while it frees them: a process detaching (Untrack) may race
	// a server closing, and a closed map's descriptor number can belong
	// to another file by then. Lock order: mu, then maps.
	maps       sync.RWMutex
	mapsClosed bool // guarded by maps
}

// useMaps holds the maps open until the returned function is called; ok
// is false once Close has freed them.
func (c *Counters) useMaps() (done func(), ok bool) {
	c.maps.RLock()
	if c.mapsClosed {
		c.maps.RUnlock()
		return func() {}, false
	}
	return c.maps.RUnlock, true
}

// countersLoaded is what Counters keeps of the collection: its programs
// and maps, not its global variables. A loaded variable memory-maps its
// section's map, and the mapping, unmapped only by a garbage collection,
// kept .bss and .rodata alive after Close.
type countersLoaded struct {
	countersPrograms
	countersMaps
}

func (o *countersLoaded) Close() error {
	return errors.Join(o.countersPrograms.Close(), o.countersMaps.Close())
}

// Crossing is a region whose count reached a multiple of the threshold.
type Crossing struct {
	Processor uint32 // the code Track was given for the process
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
	if strings.Contains(err.Error(), "tracefs") {
		return fmt.Errorf("%w (tracepoints are found through tracefs: mount -t tracefs nodev /sys/kernel/tracing)", err)
	}
	return err
}

// Close detaches the programs and frees their maps; a second call does
// nothing.
func (c *Counters) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil
	}
	c.closed = true
	var errs []error
	if c.switchLink != nil {
		errs = append(errs, c.resumes.Close(), c.switchLink.Close())
	}
	c.maps.Lock()
	defer c.maps.Unlock()
	c.mapsClosed = true
	errs = append(errs, c.ring.Close(), c.link.Close(), c.objs.Close())
	return errors.Join(errs...)
}

// ProgramIDs returns the kernel's ids of the loaded programs (the counting
// program and the anatomy's), so that a check can find what they use and
// see them gone after Close without confusing them with another server's.
func (c *Counters) ProgramIDs() ([]ebpf.ProgramID, error) {
	var ids []ebpf.ProgramID
	for _, p := range []*ebpf.Program{c.objs.CountFault, c.objs.NoteResume} {
		info, err := p.Info()
		if err != nil {
			return nil, fmt.Errorf("eBPF access counters: program info: %w", err)
		}
		id, ok := info.ID()
		if !ok {
			return nil, fmt.Errorf("eBPF access counters: the kernel gives program %s no id", info.Name)
		}
		ids = append(ids, id)
	}
	return ids, nil
}

// Track counts pid's faults from now on as processor's, its per-process
// count starting at zero. processor is a code the caller chooses for the
// processor the process acts as (the server gives each view, client or
// device process, its own, so counts of different clients never mix).
func (c *Counters) Track(pid int, processor uint32) error {
	done, ok := c.useMaps()
	defer done()
	if !ok {
		return fmt.Errorf("track pid %d: the access counters are closed", pid)
	}
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
	done, ok := c.useMaps()
	defer done()
	if !ok {
		return // nothing is counted any more
	}
	key := uint32(pid)
	_ = c.objs.Processes.Delete(key)
	_ = c.objs.ProcessFaults.Delete(key)
}

// ProcessFaults is the user faults of pid since Track.
func (c *Counters) ProcessFaults(pid int) (uint64, error) {
	done, ok := c.useMaps()
	defer done()
	if !ok {
		return 0, fmt.Errorf("faults of pid %d: the access counters are closed", pid)
	}
	var n uint64
	if err := c.objs.ProcessFaults.Lookup(uint32(pid), &n); err != nil {
		return 0, fmt.Errorf("faults of pid %d: %w", pid, err)
	}
	return n, nil
}

// Regions returns every counted region.
func (c *Counters) Regions() ([]RegionCount, error) {
	done, ok := c.useMaps()
	defer done()
	if !ok {
		return nil, errors.New("regions: the access counters are closed")
	}
	var out []RegionCount
	var k countersRegionKey
	var v uint64
	it := c.objs.Regions.Iterate()
	for it.Next(&k, &v) {
		out = append(out, RegionCount{Processor: k.Processor, Region: k.Region, Count: v})
	}
	return out, it.Err()
}

// Reset drops one region's count, the way NVIDIA's driver clears an
// access counter once it has serviced its notification, so that the
// region is reported again only after as many new faults. A region not
// counted (never, or dropped by Decay or the LRU) is already reset.
func (c *Counters) Reset(processor uint32, region uint64) {
	done, ok := c.useMaps()
	defer done()
	if !ok {
		return
	}
	_ = c.objs.Regions.Delete(countersRegionKey{Processor: processor, Region: region})
}

// Decay halves every region's count and drops those that reach zero, so
// that an old burst does not add up with new accesses to a migration.
func (c *Counters) Decay() error {
	regions, err := c.Regions()
	if err != nil {
		return err
	}
	done, ok := c.useMaps()
	defer done()
	if !ok {
		return errors.New("decay: the access counters are closed")
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
	done, ok := c.useMaps()
	defer done()
	if !ok {
		return 0, 0, false
	}
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

// Resume is a sampled fault's thread running again: when its fault
// entered the kernel and when it was next switched in, both
// CLOCK_MONOTONIC.
type Resume struct {
	TID     int
	Entry   time.Duration
	Resumed time.Duration
}

// errAnatomyOff is ReadResume's answer before EnableAnatomy.
var errAnatomyOff = errors.New("fault anatomy not enabled (EnableAnatomy)")

// EnableAnatomy attaches the program that reports when a sampled thread
// runs again, on sched:sched_switch. It is kept apart from Load because it
// runs on every context switch of the machine (one lookup in a nearly
// always empty map); a second call does nothing. Close detaches it.
func (c *Counters) EnableAnatomy() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return fmt.Errorf("enable the fault anatomy: %w", ringbuf.ErrClosed)
	}
	if c.switchLink != nil {
		return nil
	}
	l, err := link.Tracepoint("sched", "sched_switch", c.objs.NoteResume, nil)
	if err != nil {
		return fmt.Errorf("attach the fault anatomy to sched:sched_switch: %w", explain(err))
	}
	r, err := ringbuf.NewReader(c.objs.Resumes)
	if err != nil {
		l.Close()
		return fmt.Errorf("open the fault anatomy's ring buffer: %w", err)
	}
	c.switchLink, c.resumes = l, r
	return nil
}

// Sample marks thread tid's last fault for the anatomy: the next time
// the thread is switched in, ReadResume reports it. The server calls it
// while it serves the fault, before it wakes the thread, so that the
// switch-in reported is the one that ends the fault. It returns when the
// fault entered the kernel (CLOCK_MONOTONIC) and at which address; ok is
// false when tid has no fault recorded, when the anatomy is off, or when
// the sample could not be put (too many threads sampled and not yet run).
func (c *Counters) Sample(tid int) (entry time.Duration, addr uint64, ok bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.switchLink == nil || c.closed {
		return 0, 0, false
	}
	var e countersFaultEntry
	if err := c.objs.FaultEntries.Lookup(uint32(tid), &e); err != nil {
		return 0, 0, false
	}
	if err := c.objs.Sampled.Put(uint32(tid), e.AtNs); err != nil {
		return 0, 0, false
	}
	return time.Duration(e.AtNs), e.Address, true
}

// ReadResume waits for the next sampled thread to run again, until
// deadline (zero: no deadline); os.ErrDeadlineExceeded when none did,
// ringbuf.ErrClosed after Close.
func (c *Counters) ReadResume(deadline time.Time) (Resume, error) {
	c.mu.Lock()
	r, closed := c.resumes, c.closed
	c.mu.Unlock()
	if closed {
		return Resume{}, ringbuf.ErrClosed
	}
	if r == nil {
		return Resume{}, errAnatomyOff
	}
	r.SetDeadline(deadline)
	rec, err := r.Read()
	if err != nil {
		return Resume{}, err
	}
	b := rec.RawSample
	if len(b) < 24 {
		return Resume{}, fmt.Errorf("fault anatomy resume of %d bytes, want 24", len(b))
	}
	ne := binary.NativeEndian
	x := countersResume{Tid: ne.Uint32(b[0:]), EntryNs: ne.Uint64(b[8:]), ResumedNs: ne.Uint64(b[16:])}
	return Resume{TID: int(x.Tid), Entry: time.Duration(x.EntryNs), Resumed: time.Duration(x.ResumedNs)}, nil
}
