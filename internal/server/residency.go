package server

import (
	"sort"
	"time"

	"github.com/softuvm/softuvm/internal/block"
	"github.com/softuvm/softuvm/internal/core"
)

// managedRange is one allocation as the server sees it: the engine's
// range (package block: its blocks, their residency, its statistics)
// and what the server keeps beside it.
type managedRange struct {
	*block.Range
	sess *session
	born time.Time // when the server made it: older fault messages are stale
	size int64     // bytes asked for
	// flags are the allocation's, as the client asked.
	flags uint32
	// launch is the range's attachment and locks under the launch
	// coherence model (coherence.go), guarded by sess.launch.mu.
	launch rangeLaunch
}

// rangeOf is the server's range of an engine's range.
func rangeOf(r *block.Range) *managedRange { return r.Ext.(*managedRange) }

// rangeTable is an immutable, sorted snapshot of a session's ranges. Faults
// look ranges up in it without a lock; control operations publish a new
// one under sess.mu.
type rangeTable struct {
	ranges []*managedRange // sorted by start, disjoint
}

func (t *rangeTable) lookup(addr uintptr) *managedRange {
	if t == nil {
		return nil
	}
	rs := t.ranges
	i := sort.Search(len(rs), func(i int) bool { return rs[i].End() > addr })
	if i < len(rs) && rs[i].Start <= addr {
		return rs[i]
	}
	return nil
}

func (t *rangeTable) with(r *managedRange) *rangeTable {
	n := &rangeTable{ranges: make([]*managedRange, 0, len(t.ranges)+1)}
	n.ranges = append(n.ranges, t.ranges...)
	n.ranges = append(n.ranges, r)
	sort.Slice(n.ranges, func(i, j int) bool { return n.ranges[i].Start < n.ranges[j].Start })
	return n
}

func (t *rangeTable) without(r *managedRange) *rangeTable {
	n := &rangeTable{ranges: make([]*managedRange, 0, len(t.ranges))}
	for _, x := range t.ranges {
		if x != r {
			n.ranges = append(n.ranges, x)
		}
	}
	return n
}

// overlapping returns the ranges that meet [start, start+length).
func (t *rangeTable) overlapping(start, length uintptr) []*managedRange {
	var out []*managedRange
	for _, r := range t.ranges {
		if r.Start < start+length && start < r.End() {
			out = append(out, r)
		}
	}
	return out
}

// releaseReservation gives device memory's capacity back to its arena.
func (r *managedRange) releaseReservation() {
	if r.Kind == core.KindDevice {
		r.sess.srv.arenas[r.Owner].Release(int64(r.Length / core.PageSize))
	}
}
