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
	preferred  [core.PagesPerBlock]uint8 // 1 + the preferred location; 0: none
	accessedBy []core.PageMask           // by location
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
	loc := core.LocationOf(d)
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
			code := fileCode(loc)
			if advice == core.AdviseUnsetPreferredLocation {
				code = 0
			}
			for p := pages.NextSet(0); p >= 0; p = pages.NextSet(p + 1) {
				adv.preferred[p] = code
			}
		case core.AdviseSetAccessedBy:
			adv.remote = true
			adv.accessedBy[loc].Or(&pages)
		case core.AdviseUnsetAccessedBy:
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
	err = r.eachBlock(addr, length, false, func(o *mover, pages core.PageMask) error {
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
		return core.RangeAttributes{}, err
	}
	a := core.RangeAttributes{ReadMostly: readMostly, PreferredLocation: core.InvalidDevice, LastPrefetchLocation: core.InvalidDevice, AccessedBy: []core.Device{}}
	if preferred > 0 {
		a.PreferredLocation = core.Location(preferred - 1).Device()
	}
	if last > 0 {
		a.LastPrefetchLocation = core.Location(last - 1).Device()
	}
	for l, ok := range accessed {
		if ok {
			a.AccessedBy = append(a.AccessedBy, core.Location(l).Device())
		}
	}
	return a, nil
}
