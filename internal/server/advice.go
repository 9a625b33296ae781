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
	err = r.EachBlock(addr, length, true, func(o *block.Mover, pages core.PageMask) error {
		adv := o.B.AdviceOf()
		switch advice {
		case core.AdviseSetReadMostly:
			adv.ReadMostly.Or(&pages)
		case core.AdviseUnsetReadMostly:
			adv.ReadMostly.AndNot(&pages)
			o.CollapseAll(pages)
		case core.AdviseSetPreferredLocation, core.AdviseUnsetPreferredLocation:
			adv.Remote = true
			code := core.PageProcessorOf(d)
			if advice == core.AdviseUnsetPreferredLocation {
				code = core.NoProcessor
			}
			for p := pages.NextSet(0); p >= 0; p = pages.NextSet(p + 1) {
				adv.Preferred[p] = code
			}
		case core.AdviseSetAccessedBy:
			adv.Remote = true
			adv.AccessedBy[d.Slot()].Or(&pages)
		case core.AdviseUnsetAccessedBy:
			adv.AccessedBy[d.Slot()].AndNot(&pages)
		}
		return nil
	})
	if err != nil {
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
	locations := sess.srv.eng.Locations()
	readMostly := true
	// The preferred and last prefetch locations shared by every page so
	// far: unset until the first page, and disagree once two differ.
	var preferred, last pageAgreement
	accessed := make([]bool, locations)
	for l := range accessed {
		accessed[l] = true
	}
	err = r.EachBlock(addr, length, false, func(o *block.Mover, pages core.PageMask) error {
		var adv *block.Advice
		if o != nil {
			adv = o.B.Advice
		}
		for p := pages.NextSet(0); p >= 0; p = pages.NextSet(p + 1) {
			if o == nil {
				last.see(core.NoProcessor)
			} else {
				last.see(o.B.LastPrefetch[p])
			}
			if adv == nil {
				readMostly = false
				preferred.see(core.NoProcessor)
				clear(accessed)
				continue
			}
			readMostly = readMostly && adv.ReadMostly.Test(p)
			preferred.see(adv.Preferred[p])
			for l := range accessed {
				accessed[l] = accessed[l] && adv.AccessedBy[l].Test(p)
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
