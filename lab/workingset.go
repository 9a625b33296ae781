package lab

import (
	"github.com/softuvm/softuvm/internal/core"
	"github.com/softuvm/softuvm/internal/workingset"
	"github.com/softuvm/softuvm/policy"
)

// The resident core, as the server keeps it (internal/server:
// workingset.go): refaults measured, recent ones protected where the
// thrashing policy says so, protected pages hidden from the eviction
// policy until their protection ends.

// setRefaultLimits is the server's Server.setRefaultLimits: the host's
// budget and each device's capacity.
func (s *sim) setRefaultLimits() {
	s.ws = workingset.NewSet[*simBlock](maxLocs)
	s.refaulting, _ = s.thrashing.(policy.Refaulting)
	for slot := 0; slot <= s.devices; slot++ {
		p := core.DeviceAtSlot(slot)
		capacity := s.capacity
		if p == core.CPU {
			capacity = s.hostBudget / core.PageSize
		}
		if capacity <= 0 {
			continue
		}
		var l policy.RefaultLimits
		if s.refaulting != nil {
			l = s.refaulting.RefaultLimits(p, capacity)
		}
		s.ws.SetLimits(slot, workingset.Limits{Capacity: capacity, Recent: l.Recent, Protect: l.Protect, Age: l.Age})
	}
}

// arrived is the server's mover.arrived: refaults counted, the thrashing
// policy's protection, the eviction policy told of the rest.
func (o *mover) arrived(dst core.Device, pages core.PageMask) {
	s := o.s
	b := o.b
	rf := s.ws.Arrived(&b.ws, dst.Slot(), maxLocs, pages)
	s.res.Refaulted += uint64(rf.Recent.Count() + rf.Far.Count())
	s.res.RefaultedRecent += uint64(rf.Recent.Count())
	protect := o.protection(dst, pages, rf)
	visible := pages
	visible.AndNot(&protect)
	s.announce(b, dst, visible, o.cause)
}

// protection is the server's mover.protection.
func (o *mover) protection(dst core.Device, pages core.PageMask, rf workingset.Refault) core.PageMask {
	s := o.s
	if s.refaulting == nil || o.cause != policy.CauseFault || rf.Recent.Empty() {
		return core.PageMask{}
	}
	slot := dst.Slot()
	lim, ok := s.ws.Limits(slot)
	if !ok {
		return core.PageMask{}
	}
	evidence := rf.Recent
	if pages.Count() < o.b.pages {
		evidence.And(&o.demand)
	}
	if evidence.Empty() {
		return core.PageMask{}
	}
	hint := s.refaulting.Refaulted(policy.Refault{
		Block: o.b.ref, Processor: dst, Pages: evidence, Distance: int64(rf.Distance),
		Capacity: lim.Capacity, Protected: s.ws.ProtectedPages(slot),
		Limits: policy.RefaultLimits{Recent: lim.Recent, Protect: lim.Protect, Age: lim.Age},
	})
	if hint != policy.RefaultProtect {
		return core.PageMask{}
	}
	s.ws.Protect(&o.b.ws, o.b, slot, maxLocs, evidence)
	s.res.Protected += uint64(evidence.Count())
	return evidence
}

// announce is the server's Server.announce: the eviction policy hears
// of pages it may evict.
func (s *sim) announce(b *simBlock, p core.Device, pages core.PageMask, cause policy.Cause) {
	if pages.Empty() {
		return
	}
	if s.pageEviction != nil {
		s.pageEviction.ArrivedPages(b.ref, p, pages, cause)
	} else {
		s.eviction.Arrived(b.ref, p, pages.Count(), cause)
	}
}

// departed is the server's Server.departed: pages of b left p other
// than by eviction (or before an eviction stamps them).
func (s *sim) departed(b *simBlock, p core.Device, pages core.PageMask) {
	if pages.Empty() {
		return
	}
	hidden := s.ws.Left(&b.ws, p.Slot(), pages)
	known := pages
	known.AndNot(&hidden)
	if s.pageEviction != nil && !known.Empty() {
		s.pageEviction.LeftPages(b.ref, p, known)
	}
	s.leftIfNoneEvictable(b, p)
}

// leftIfNoneEvictable is the server's Server.leftIfNoneEvictable.
func (s *sim) leftIfNoneEvictable(b *simBlock, p core.Device) {
	evictable := b.resident[p.Slot()]
	if !evictable.Empty() {
		hidden := s.ws.Hidden(&b.ws, p.Slot())
		evictable.AndNot(&hidden)
	}
	if evictable.Empty() {
		s.eviction.Left(b.ref, p)
	}
}

// releaseProtections is the server's mover.releaseProtections (the
// replay holds no locks: every block is free).
func (s *sim) releaseProtections(from core.Device) {
	slot := from.Slot()
	var buf [16]*simBlock
	for _, b := range s.ws.Due(slot, buf[:0]) {
		expired := s.ws.Release(&b.ws, slot)
		expired.And(&b.resident[slot])
		s.announce(b, from, expired, policy.CauseFault)
	}
}

// evictProtected is the server's mover.evictProtected.
func (s *sim) evictProtected(o *mover, from core.Device, want int64) int64 {
	if _, ok := s.ws.Limits(from.Slot()); !ok {
		return 0
	}
	var buf [64]*simBlock
	var moved int64
	for _, b := range s.ws.Oldest(from.Slot(), buf[:0]) {
		if moved >= want {
			break
		}
		if b == o.b {
			continue
		}
		pages := s.ws.Protected(&b.ws, from.Slot())
		pages.And(&b.resident[from.Slot()])
		if !pages.Empty() {
			n := s.evictPages(b, from, pages, true)
			s.res.Demoted += uint64(n)
			moved += n
		}
	}
	return moved
}

// lastResort is the server's mover.lastResort.
func (s *sim) lastResort(o *mover, from core.Device, want int64, keep core.PageMask) int64 {
	moved := s.evictOwn(o, from, want, keep, false)
	if moved < want {
		moved += s.evictProtected(o, from, want-moved)
	}
	if moved < want {
		moved += s.evictOwn(o, from, want-moved, keep, true)
	}
	return moved
}

// evictOwn is the server's mover.evictOwn: the mover's own block's
// pages on from but keep's, those it does not protect first, in the
// order they arrived. The oracle takes what it likes through evict, and
// needs none of this.
func (s *sim) evictOwn(o *mover, from core.Device, want int64, keep core.PageMask, demote bool) int64 {
	if o.cause == policy.CauseEviction || s.evictsOwn {
		return 0
	}
	pages := o.b.resident[from.Slot()]
	pages.AndNot(&keep)
	protected := s.ws.Protected(&o.b.ws, from.Slot())
	unprotected := pages
	unprotected.AndNot(&protected)
	victims := s.ws.OldestPages(&o.b.ws, from.Slot(), unprotected, int(want))
	if !unprotected.Empty() {
		demote = false
	} else if demote {
		victims = s.ws.OldestPages(&o.b.ws, from.Slot(), pages, int(want))
	}
	if victims.Empty() {
		return 0
	}
	n := s.evictPages(o.b, from, victims, demote)
	if demote {
		s.res.Demoted += uint64(n)
	}
	return n
}
