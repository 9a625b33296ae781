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
