package server

import (
	"fmt"
	"math"

	"github.com/softuvm/softuvm/internal/block"
	"github.com/softuvm/softuvm/internal/core"
	"github.com/softuvm/softuvm/trace"
)

// discard drops every copy of the pages of [addr, addr+length), which
// lies in one managed allocation, as cudaMemDiscardBatchAsync does: their
// contents are no longer wanted, so nothing is copied, and the next touch
// of each, on any processor, is a first touch that reads zeros.
//
// It is what lets a heap give memory back: an allocator's freed pages
// would otherwise keep their place in the host budget and be copied out
// and back by eviction like live data. Punching every location's file
// frees the pages and zaps every page-table entry that maps them; each
// block's lock is held while its pages go, so a fault on one waits and
// then finds it unpopulated.
func (sess *session) discard(addr, length uintptr) error {
	r, err := sess.findRange(addr, length, "discard")
	if err != nil {
		return err
	}
	if r.Kind != core.KindManaged {
		return fmt.Errorf("%w: discard %#x: discard applies to managed memory, and this is %s", core.ErrInvalidValue, addr, r.Kind)
	}
	if sess.tracing() {
		sess.emit(&trace.Event{Kind: trace.KindDiscard, Range: r.ID, Addr: uint64(addr), Pages: uint32(min(length/core.PageSize, math.MaxUint32))})
	}
	// Blocks never touched have nothing to drop: not created for it.
	return r.EachBlock(addr, length, false, func(o *block.Mover, pages core.PageMask) error {
		if o != nil {
			o.Discard(pages)
		}
		return nil
	})
}
