package server

import (
	"fmt"

	"github.com/softuvm/softuvm/internal/block"
	"github.com/softuvm/softuvm/internal/core"
)

// Mapped returns the pages of mask that the client's process maps, from
// its page table (PAGEMAP_SCAN, as the use observer reads it): the audit
// of prefetched pages' use.
func (sess *session) Mapped(o *block.Mover, mask core.PageMask) (core.PageMask, error) {
	_, pagemap, err := sess.watch.open(sess.pid)
	if err != nil {
		return core.PageMask{}, fmt.Errorf("pagemap of pid %d: %w", sess.pid, err)
	}
	mapped, err := mappedPages(pagemap, o.BlockAddr, o.B.Pages)
	mapped.And(&mask)
	return mapped, err
}

// auditPrefetch settles what can be known of a range's prefetched pages,
// before its statistics are read or it is freed.
func (sess *session) auditPrefetch(r *managedRange, leaving bool) {
	if !r.TrackPrefetch {
		return
	}
	for i := range r.Blocks() {
		b := r.BlockAt(i)
		if b == nil {
			continue
		}
		b.Lock()
		if !r.Freed.Load() {
			o := r.NewMover(i, b)
			o.Audit(leaving)
		}
		b.Unlock()
	}
}
