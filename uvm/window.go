package uvm

import (
	"errors"
	"fmt"
	"sort"
	"sync"

	"github.com/softuvm/softuvm/devmem"
	"github.com/softuvm/softuvm/internal/config"
)

// vaWindow hands out addresses for managed ranges from the managed window
// (see devproc.go): first fit over a sorted list of free extents, 2 MiB
// aligned, reused after free. Addresses outside the window would not be
// free in device processes.
type vaWindow struct {
	mu   sync.Mutex
	init bool
	free []extent // sorted, disjoint, guarded by mu
}

type extent struct{ start, end uintptr }

// reserve finds length bytes (a multiple of BlockSize) and reserves them
// in this process.
func (w *vaWindow) reserve(length uintptr) (uintptr, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.init {
		w.free = []extent{{config.ManagedWindowStart, config.ManagedWindowStart + config.ManagedWindowSize}}
		w.init = true
	}
	for i := 0; i < len(w.free); i++ {
		e := w.free[i]
		for start := e.start; start+length <= e.end; {
			err := devmem.ReserveAddressSpaceAt(start, int64(length))
			if err == nil {
				w.take(i, start, start+length)
				return start, nil
			}
			if !errors.Is(err, devmem.ErrAddressInUse) {
				return 0, fmt.Errorf("%w: reserve %s of address space at %#x: %v", ErrMemoryAllocation, FormatSize(int64(length)), start, err)
			}
			// Something else lives there: look further on.
			start += BlockSize
		}
	}
	return 0, fmt.Errorf("%w: no %s of free address space left in the managed window %#x+%s", ErrMemoryAllocation, FormatSize(int64(length)), uintptr(config.ManagedWindowStart), FormatSize(config.ManagedWindowSize))
}

// take removes [start, end) from free extent i.
func (w *vaWindow) take(i int, start, end uintptr) {
	e := w.free[i]
	var parts []extent
	if e.start < start {
		parts = append(parts, extent{e.start, start})
	}
	if end < e.end {
		parts = append(parts, extent{end, e.end})
	}
	w.free = append(w.free[:i], append(parts, w.free[i+1:]...)...)
}

// release unmaps [start, start+length) and returns it to the window.
func (w *vaWindow) release(start, length uintptr) error {
	err := devmem.ReleaseAddressSpace(start, int64(length))
	w.mu.Lock()
	defer w.mu.Unlock()
	w.free = append(w.free, extent{start, start + length})
	sort.Slice(w.free, func(i, j int) bool { return w.free[i].start < w.free[j].start })
	merged := w.free[:1]
	for _, e := range w.free[1:] {
		last := &merged[len(merged)-1]
		if e.start <= last.end {
			last.end = max(last.end, e.end)
		} else {
			merged = append(merged, e)
		}
	}
	w.free = merged
	return err
}
