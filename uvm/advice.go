package uvm

import (
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
)

// Advice is a cuMemAdvise hint about how a range will be used.
type Advice int

const (
	// AdviseSetReadMostly: read faults make a read-only copy of the page
	// at the reader (write-protected everywhere); a write collapses every
	// other copy. The device argument is ignored.
	AdviseSetReadMostly Advice = iota + 1
	// AdviseUnsetReadMostly collapses the copies into one: at the
	// preferred location if it holds one, else at one of the holders.
	AdviseUnsetReadMostly
	// AdviseSetPreferredLocation makes the device (or CPU) the pages'
	// home: a fault from a processor that can map it there maps it
	// remotely (and brings it home first if it is elsewhere) instead of
	// migrating it to the faulting processor. Devices can map host memory
	// and each other's; the CPU cannot map device memory, so its faults
	// migrate as before.
	AdviseSetPreferredLocation
	AdviseUnsetPreferredLocation
	// AdviseSetAccessedBy makes a device keep a mapping of the pages
	// wherever they live: its view maps the owner's file, so it does not
	// fault on them. For the CPU it is recorded and changes nothing: the
	// host always maps host memory and takes faults for device pages.
	AdviseSetAccessedBy
	AdviseUnsetAccessedBy
)

func (a Advice) String() string {
	switch a {
	case AdviseSetReadMostly:
		return "set-read-mostly"
	case AdviseUnsetReadMostly:
		return "unset-read-mostly"
	case AdviseSetPreferredLocation:
		return "set-preferred-location"
	case AdviseUnsetPreferredLocation:
		return "unset-preferred-location"
	case AdviseSetAccessedBy:
		return "set-accessed-by"
	case AdviseUnsetAccessedBy:
		return "unset-accessed-by"
	}
	return "advice(" + strconv.Itoa(int(a)) + ")"
}

// ParseAdvice reads an advice's name as String writes it.
func ParseAdvice(s string) (Advice, error) {
	for a := AdviseSetReadMostly; a <= AdviseUnsetAccessedBy; a++ {
		if a.String() == s {
			return a, nil
		}
	}
	return 0, fmt.Errorf("%w: advice %q: want set-read-mostly, unset-read-mostly, set-preferred-location, unset-preferred-location, set-accessed-by or unset-accessed-by", ErrInvalidValue, s)
}

// usesDevice reports whether the advice's device argument matters.
func (a Advice) usesDevice() bool {
	return a != AdviseSetReadMostly && a != AdviseUnsetReadMostly
}

// MemAdvise advises the runtime about [addr, addr+n), rounded out to whole
// pages, as cuMemAdvise; the range must lie in one managed allocation.
// It returns once device mappings follow the advice: after
// AdviseSetAccessedBy, the device's kernels do not fault on the range.
func (s *Session) MemAdvise(addr uintptr, n int64, advice Advice, d Device) error {
	if advice < AdviseSetReadMostly || advice > AdviseUnsetAccessedBy {
		return fmt.Errorf("%w: advice %d: want one of %v to %v", ErrInvalidValue, int(advice), AdviseSetReadMostly, AdviseUnsetAccessedBy)
	}
	if advice.usesDevice() && d != CPU && (d < 0 || int(d) >= len(s.devices)) {
		return fmt.Errorf("%w: %v for %v: %s", ErrInvalidDevice, advice, d, s.deviceChoices())
	}
	if !advice.usesDevice() {
		d = CPU // ignored, as cuMemAdvise ignores it
	}
	a, start, length, err := s.pageRange(advice.String(), addr, n)
	if err != nil {
		return err
	}
	if a.kind != kindManaged {
		return fmt.Errorf("%w: %v on %#x: advice applies to managed memory, and this is %s", ErrInvalidValue, advice, addr, a.kind)
	}
	r, err := s.request(encodeAdvise(s.nextSeq(), adviseRequest{addr: uint64(start), length: uint64(length), advice: uint8(advice), device: int32(d)}), msgAdvise)
	if err != nil {
		return err
	}
	return r.done("advise reply")
}

// MemAdvise advises the default session.
func MemAdvise(addr uintptr, n int64, advice Advice, d Device) error {
	s, err := Default()
	if err != nil {
		return err
	}
	return s.MemAdvise(addr, n, advice, d)
}

// blockAdvice is one block's share of its range's advice.
type blockAdvice struct {
	readMostly PageMask
	preferred  [PagesPerBlock]uint8 // 1 + the preferred location; 0: none
	accessedBy []PageMask           // by location
	// remote is set once preferred-location or accessed-by advice touched
	// the block: device mappings may then follow residency.
	remote bool
}

// advise applies advice to [addr, addr+length) and brings device
// mappings in line.
func (sess *session) advise(addr, length uintptr, advice Advice, d Device) error {
	if advice < AdviseSetReadMostly || advice > AdviseUnsetAccessedBy {
		return fmt.Errorf("%w: advice %d", ErrInvalidValue, int(advice))
	}
	if advice.usesDevice() {
		if err := sess.srv.checkDevice(d, advice.String()); err != nil {
			return err
		}
	}
	r, err := sess.findRange(addr, length, advice.String())
	if err != nil {
		return err
	}
	if r.kind != kindManaged {
		return fmt.Errorf("%w: %v on %#x: advice applies to managed memory, and this is %s", ErrInvalidValue, advice, addr, r.kind)
	}
	loc := locationOf(d)
	err = r.eachBlock(addr, length, true, func(o *mover, pages PageMask) error {
		b := o.b
		if b.advice == nil {
			b.advice = &blockAdvice{accessedBy: make([]PageMask, len(b.resident))}
		}
		adv := b.advice
		switch advice {
		case AdviseSetReadMostly:
			adv.readMostly.Or(&pages)
		case AdviseUnsetReadMostly:
			adv.readMostly.AndNot(&pages)
			o.collapseAll(pages)
		case AdviseSetPreferredLocation, AdviseUnsetPreferredLocation:
			adv.remote = true
			code := fileCode(loc)
			if advice == AdviseUnsetPreferredLocation {
				code = 0
			}
			for p := pages.NextSet(0); p >= 0; p = pages.NextSet(p + 1) {
				adv.preferred[p] = code
			}
		case AdviseSetAccessedBy:
			adv.remote = true
			adv.accessedBy[loc].Or(&pages)
		case AdviseUnsetAccessedBy:
			adv.accessedBy[loc].AndNot(&pages)
		}
		return nil
	})
	if err != nil {
		return err
	}
	return sess.remapRange(r, addr, length)
}

// eachBlock calls fn for each block [addr, addr+length) meets, with the
// block locked and the pages of it in the range. Without create, a block
// never used is not created, and fn gets a nil mover for it.
func (r *managedRange) eachBlock(addr, length uintptr, create bool, fn func(o *mover, pages PageMask) error) error {
	for va := addr; va < addr+length; {
		off := va - r.start
		blockAddr := r.start + off&^(BlockSize-1)
		end := min(addr+length, blockAddr+BlockSize)
		var pages PageMask
		pages.FillRange(int(va-blockAddr)/PageSize, int(end-blockAddr)/PageSize)
		b := r.blocks[off>>blockShift].Load()
		if b == nil && !create {
			if err := fn(nil, pages); err != nil {
				return err
			}
			va = end
			continue
		}
		if b == nil {
			b = r.block(int(off >> blockShift))
		}
		b.mu.Lock()
		if r.freed.Load() {
			b.mu.Unlock()
			return fmt.Errorf("%w: %#x+%d: the allocation was freed meanwhile", ErrInvalidValue, addr, length)
		}
		o := mover{sess: r.sess, r: r, b: b, blockAddr: blockAddr}
		err := fn(&o, pages)
		b.mu.Unlock()
		if err != nil {
			return err
		}
		va = end
	}
	return nil
}

// eachBlockParallel is eachBlock (creating blocks) with up to workers
// blocks at once, each on its own goroutine with its lock held, for bulk
// moves of many blocks; the goroutines run on NUMA node node's CPUs (-1:
// anywhere). The first error stops the others from taking more blocks
// and is returned.
func (r *managedRange) eachBlockParallel(addr, length uintptr, workers, node int, fn func(o *mover, pages PageMask) error) error {
	first := (addr - r.start) >> blockShift
	last := (addr + length - 1 - r.start) >> blockShift
	n := int(last-first) + 1
	if workers <= 1 || n < 2 {
		return r.eachBlock(addr, length, true, fn)
	}
	var next atomic.Int64
	var mu sync.Mutex
	var firstErr error
	var wg sync.WaitGroup
	for range min(workers, n) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			pinToNode(node)
			for {
				i := next.Add(1) - 1
				if i >= int64(n) {
					return
				}
				mu.Lock()
				stop := firstErr != nil
				mu.Unlock()
				if stop {
					return
				}
				blockAddr := r.start + (first+uintptr(i))<<blockShift
				lo, hi := max(addr, blockAddr), min(addr+length, blockAddr+BlockSize)
				if err := r.eachBlock(lo, hi-lo, true, fn); err != nil {
					mu.Lock()
					if firstErr == nil {
						firstErr = err
					}
					mu.Unlock()
					return
				}
			}
		}()
	}
	wg.Wait()
	return firstErr
}

// rangeAttributes answers cuMemRangeGetAttribute's questions for a range.
func (sess *session) rangeAttributes(addr, length uintptr) (RangeAttributes, error) {
	r, err := sess.findRange(addr, length, "range attributes")
	if err != nil {
		return RangeAttributes{}, err
	}
	if r.kind != kindManaged {
		return RangeAttributes{}, fmt.Errorf("%w: range attributes of %#x: they describe managed memory, and this is %s", ErrInvalidValue, addr, r.kind)
	}
	locations := sess.srv.locations()
	readMostly := true
	preferred, last := -1, -1 // codes shared by every page so far; -2 when they differ
	accessed := make([]bool, locations)
	for l := range accessed {
		accessed[l] = true
	}
	agree := func(seen *int, code int) {
		switch {
		case *seen == -1:
			*seen = code
		case *seen != code:
			*seen = -2
		}
	}
	err = r.eachBlock(addr, length, false, func(o *mover, pages PageMask) error {
		var adv *blockAdvice
		if o != nil {
			adv = o.b.advice
		}
		for p := pages.NextSet(0); p >= 0; p = pages.NextSet(p + 1) {
			if o == nil {
				agree(&last, 0)
			} else {
				agree(&last, int(o.b.lastPrefetch[p]))
			}
			if adv == nil {
				readMostly = false
				agree(&preferred, 0)
				clear(accessed)
				continue
			}
			readMostly = readMostly && adv.readMostly.Test(p)
			agree(&preferred, int(adv.preferred[p]))
			for l := range accessed {
				accessed[l] = accessed[l] && adv.accessedBy[l].Test(p)
			}
		}
		return nil
	})
	if err != nil {
		return RangeAttributes{}, err
	}
	a := RangeAttributes{ReadMostly: readMostly, PreferredLocation: InvalidDevice, LastPrefetchLocation: InvalidDevice, AccessedBy: []Device{}}
	if preferred > 0 {
		a.PreferredLocation = location(preferred - 1).device()
	}
	if last > 0 {
		a.LastPrefetchLocation = location(last - 1).device()
	}
	for l, ok := range accessed {
		if ok {
			a.AccessedBy = append(a.AccessedBy, location(l).device())
		}
	}
	return a, nil
}
