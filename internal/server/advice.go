package server

import (
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/softuvm/softuvm/internal/core"
	"github.com/softuvm/softuvm/internal/engine"
)

// blockAdvice is one block's share of its range's advice.
type blockAdvice struct {
	readMostly core.PageMask
	preferred  [core.PagesPerBlock]core.PageProcessor // the preferred location, if any
	accessedBy []core.PageMask                        // by processor slot
	// remote is set once preferred-location or accessed-by advice touched
	// the block: device mappings may then follow residency.
	remote bool
}

// advise applies advice to [addr, addr+length) and brings device
// mappings in line.
func (sess *session) advise(addr, length uintptr, advice core.Advice, d core.Device) error {
	if advice < core.AdviseSetReadMostly || advice > core.AdviseUnsetAccessedBy {
		return fmt.Errorf("%w: advice %d", core.ErrInvalidValue, int(advice))
	}
	if advice.UsesDevice() {
		if err := sess.srv.checkDevice(d, advice.String()); err != nil {
			return err
		}
	}
	r, err := sess.findRange(addr, length, advice.String())
	if err != nil {
		return err
	}
	if r.kind != core.KindManaged {
		return fmt.Errorf("%w: %v on %#x: advice applies to managed memory, and this is %s", core.ErrInvalidValue, advice, addr, r.kind)
	}
	err = r.eachBlock(addr, length, true, func(o *mover, pages core.PageMask) error {
		b := o.b
		if b.advice == nil {
			b.advice = &blockAdvice{accessedBy: make([]core.PageMask, len(b.resident))}
		}
		adv := b.advice
		switch advice {
		case core.AdviseSetReadMostly:
			adv.readMostly.Or(&pages)
		case core.AdviseUnsetReadMostly:
			adv.readMostly.AndNot(&pages)
			o.collapseAll(pages)
		case core.AdviseSetPreferredLocation, core.AdviseUnsetPreferredLocation:
			adv.remote = true
			code := core.PageProcessorOf(d)
			if advice == core.AdviseUnsetPreferredLocation {
				code = core.NoProcessor
			}
			for p := pages.NextSet(0); p >= 0; p = pages.NextSet(p + 1) {
				adv.preferred[p] = code
			}
		case core.AdviseSetAccessedBy:
			adv.remote = true
			adv.accessedBy[d.Slot()].Or(&pages)
		case core.AdviseUnsetAccessedBy:
			adv.accessedBy[d.Slot()].AndNot(&pages)
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
func (r *managedRange) eachBlock(addr, length uintptr, create bool, fn func(o *mover, pages core.PageMask) error) error {
	for va := addr; va < addr+length; {
		off := va - r.start
		blockAddr := r.start + off&^(core.BlockSize-1)
		end := min(addr+length, blockAddr+core.BlockSize)
		var pages core.PageMask
		pages.FillRange(int(va-blockAddr)/core.PageSize, int(end-blockAddr)/core.PageSize)
		b := r.blocks[off>>core.BlockShift].Load()
		if b == nil && !create {
			if err := fn(nil, pages); err != nil {
				return err
			}
			va = end
			continue
		}
		if b == nil {
			b = r.block(int(off >> core.BlockShift))
		}
		b.mu.Lock()
		if r.freed.Load() {
			b.mu.Unlock()
			return fmt.Errorf("%w: %#x+%d: the allocation was freed meanwhile", core.ErrInvalidValue, addr, length)
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
func (r *managedRange) eachBlockParallel(addr, length uintptr, workers, node int, fn func(o *mover, pages core.PageMask) error) error {
	first := (addr - r.start) >> core.BlockShift
	last := (addr + length - 1 - r.start) >> core.BlockShift
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
			engine.PinToNode(node)
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
				blockAddr := r.start + (first+uintptr(i))<<core.BlockShift
				lo, hi := max(addr, blockAddr), min(addr+length, blockAddr+core.BlockSize)
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
func (sess *session) rangeAttributes(addr, length uintptr) (core.RangeAttributes, error) {
	r, err := sess.findRange(addr, length, "range attributes")
	if err != nil {
		return core.RangeAttributes{}, err
	}
	if r.kind != core.KindManaged {
		return core.RangeAttributes{}, fmt.Errorf("%w: range attributes of %#x: they describe managed memory, and this is %s", core.ErrInvalidValue, addr, r.kind)
	}
	locations := sess.srv.locations()
	readMostly := true
	// The preferred and last prefetch locations shared by every page so
	// far: unset until the first page, and disagree once two differ.
	var preferred, last pageAgreement
	accessed := make([]bool, locations)
	for l := range accessed {
		accessed[l] = true
	}
	err = r.eachBlock(addr, length, false, func(o *mover, pages core.PageMask) error {
		var adv *blockAdvice
		if o != nil {
			adv = o.b.advice
		}
		for p := pages.NextSet(0); p >= 0; p = pages.NextSet(p + 1) {
			if o == nil {
				last.see(core.NoProcessor)
			} else {
				last.see(o.b.lastPrefetch[p])
			}
			if adv == nil {
				readMostly = false
				preferred.see(core.NoProcessor)
				clear(accessed)
				continue
			}
			readMostly = readMostly && adv.readMostly.Test(p)
			preferred.see(adv.preferred[p])
			for l := range accessed {
				accessed[l] = accessed[l] && adv.accessedBy[l].Test(p)
			}
		}
		return nil
	})
	if err != nil {
		return core.RangeAttributes{}, err
	}
	a := core.RangeAttributes{ReadMostly: readMostly, PreferredLocation: core.InvalidDevice, LastPrefetchLocation: core.InvalidDevice, AccessedBy: []core.Device{}}
	a.PreferredLocation = preferred.shared()
	a.LastPrefetchLocation = last.shared()
	for l, ok := range accessed {
		if ok {
			a.AccessedBy = append(a.AccessedBy, core.DeviceAtSlot(l))
		}
	}
	return a, nil
}

// pageAgreement finds the processor every page of a range agrees on.
type pageAgreement struct {
	seen     bool
	disagree bool
	p        core.PageProcessor
}

func (a *pageAgreement) see(p core.PageProcessor) {
	switch {
	case !a.seen:
		a.seen, a.p = true, p
	case a.p != p:
		a.disagree = true
	}
}

// shared is the processor every page named, or InvalidDevice when some
// page named none or two pages differ (cuMemRangeGetAttribute's rule).
func (a *pageAgreement) shared() core.Device {
	if d, ok := a.p.Device(); ok && a.seen && !a.disagree {
		return d
	}
	return core.InvalidDevice
}

// preferredAt returns page p's preferred location, ok false for none.
func (b *block) preferredAt(p int) (core.Device, bool) {
	if b.advice == nil {
		return 0, false
	}
	return b.advice.preferred[p].Device()
}
