package server

import (
	"encoding/binary"
	"fmt"
	"os"

	"github.com/softuvm/softuvm/internal/core"
)

const pagemapPresent = 1 << 63

// presentPages returns the pages of mask (a block at blockAddr) that the
// process maps.
func presentPages(pid int, blockAddr uintptr, mask core.PageMask) (core.PageMask, error) {
	var present core.PageMask
	first := mask.NextSet(0)
	if first < 0 {
		return present, nil
	}
	last := first
	for p := first; p >= 0; p = mask.NextSet(p + 1) {
		last = p
	}
	f, err := os.Open(fmt.Sprintf("/proc/%d/pagemap", pid))
	if err != nil {
		return present, err
	}
	defer f.Close()
	buf := make([]byte, (last-first+1)*8)
	off := int64(blockAddr/core.PageSize+uintptr(first)) * 8
	if _, err := f.ReadAt(buf, off); err != nil {
		return present, fmt.Errorf("read pagemap of pid %d at %#x: %w", pid, blockAddr+uintptr(first)*core.PageSize, err)
	}
	for p := first; p >= 0 && p <= last; p = mask.NextSet(p + 1) {
		if binary.LittleEndian.Uint64(buf[(p-first)*8:])&pagemapPresent != 0 {
			present.Set(p)
		}
	}
	return present, nil
}

// auditBlock settles the fate of prefetched pages of the block that are
// in mask: those the client mapped were used; if leaving, the others were
// not. The block is locked.
func (o *mover) auditBlock(mask core.PageMask, leaving bool) {
	pending := o.b.prefetchPending
	pending.And(&mask)
	if pending.Empty() {
		return
	}
	present, err := presentPages(o.sess.pid, o.blockAddr, pending)
	if err != nil {
		o.sess.srv.logger.Printf("prefetch audit of pid %d: %v", o.sess.pid, err)
		return
	}
	used := uint64(present.Count())
	o.r.stats.Used.Add(used)
	o.b.prefetchPending.AndNot(&present)
	if leaving {
		pending.AndNot(&present)
		unused := uint64(pending.Count())
		o.r.stats.Unused.Add(unused)
		o.b.prefetchPending.AndNot(&pending)
	}
}

// auditLeaving settles prefetched pages about to leave the host.
func (o *mover) auditLeaving(rn run, leaving core.PageMask) {
	o.auditBlock(leaving, true)
}

// auditPrefetch settles what can be known of a range's prefetched pages,
// before its statistics are read or it is freed.
func (sess *session) auditPrefetch(r *managedRange, leaving bool) {
	if !r.trackPrefetch {
		return
	}
	for i := range r.blocks {
		b := r.blocks[i].Load()
		if b == nil {
			continue
		}
		b.mu.Lock()
		if !b.prefetchPending.Empty() && !r.freed.Load() {
			op := mover{sess: sess, r: r, b: b, blockAddr: r.start + uintptr(i)*core.BlockSize}
			var all core.PageMask
			all.FillRange(0, b.pages)
			op.auditBlock(all, leaving)
		}
		b.mu.Unlock()
	}
}
