package server

import (
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/softuvm/softuvm/internal/block"
	"github.com/softuvm/softuvm/internal/core"
	"github.com/softuvm/softuvm/internal/engine"
)

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
	if r.Kind != core.KindManaged {
		return fmt.Errorf("%w: %v on %#x: advice applies to managed memory, and this is %s", core.ErrInvalidValue, advice, addr, r.Kind)
	}
	if err := r.Advise(addr, length, advice, d); err != nil {
		return err
	}
	return sess.remapRange(r, addr, length)
}

// eachBlockParallel is block.Range.EachBlock (creating blocks) with up to workers
// blocks at once, each on its own goroutine with its lock held, for bulk
// moves of many blocks; the goroutines run on NUMA node node's CPUs (-1:
// anywhere). The first error stops the others from taking more blocks
// and is returned.
func (r *managedRange) eachBlockParallel(addr, length uintptr, workers, node int, fn func(o *block.Mover, pages core.PageMask) error) error {
	first := (addr - r.Start) >> core.BlockShift
	last := (addr + length - 1 - r.Start) >> core.BlockShift
	n := int(last-first) + 1
	if workers <= 1 || n < 2 {
		return r.EachBlock(addr, length, true, fn)
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
				blockAddr := r.Start + (first+uintptr(i))<<core.BlockShift
				lo, hi := max(addr, blockAddr), min(addr+length, blockAddr+core.BlockSize)
				if err := r.EachBlock(lo, hi-lo, true, fn); err != nil {
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
	if r.Kind != core.KindManaged {
		return core.RangeAttributes{}, fmt.Errorf("%w: range attributes of %#x: they describe managed memory, and this is %s", core.ErrInvalidValue, addr, r.Kind)
	}
	return r.Attributes(addr, length)
}
