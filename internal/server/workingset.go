package server

import (
	"github.com/softuvm/softuvm/internal/core"
	"github.com/softuvm/softuvm/internal/workingset"
	"github.com/softuvm/softuvm/policy"
	"github.com/softuvm/softuvm/trace"
)

// The resident core (package workingset): pages a fault brings back to
// a processor soon after their eviction from it are protected from
// eviction, where the thrashing policy says so (policy.Refaulting), and
// hidden from the eviction policy until their protection ends. Every
// change of residency comes through here: arrivals (arrived), departures
// (departed), evictions (evictPages: evicted).

// setRefaultLimits gives each processor the thrashing policy's limits
// for what it may hold: the host its budget, a device its arena. The
// server's processors never change size, so this runs once.
func (s *Server) setRefaultLimits() {
	s.ws = workingset.NewSet[blockRef](s.locations())
	s.refaulting, _ = s.thrashing.(policy.Refaulting)
	for slot := 0; slot < s.locations(); slot++ {
		p := core.DeviceAtSlot(slot)
		var capacity int64
		if p == core.CPU {
			capacity = s.cfg.HostBudget / core.PageSize
		} else {
			capacity = s.arenas[p].Capacity() / core.PageSize
		}
		if capacity <= 0 {
			continue // no budget: the host never evicts
		}
		var l policy.RefaultLimits // none: refaults measured, nothing protected
		if s.refaulting != nil {
			l = s.refaulting.RefaultLimits(p, capacity)
		}
		s.ws.SetLimits(slot, workingset.Limits{Capacity: capacity, Recent: l.Recent, Protect: l.Protect, Age: l.Age})
	}
}

// arrived records that pages of the mover's block now live on dst, for
// cause: the refaults among them, what the thrashing policy protects of
// those, and the eviction policy told of the rest.
func (o *mover) arrived(dst core.Device, pages core.PageMask, cause policy.Cause) {
	srv := o.sess.srv
	b := o.b
	if o.r.kind != core.KindManaged { // pinned and device memory are never evicted
		return
	}
	slot := dst.Slot()
	rf := srv.ws.Arrived(&b.ws, slot, srv.locations(), pages)
	if n := rf.Recent.Count() + rf.Far.Count(); n > 0 {
		o.r.stats.Refaulted[slot].Add(uint64(n))
		o.r.stats.RefaultedRecent[slot].Add(uint64(rf.Recent.Count()))
	}
	protect := o.protection(dst, pages, rf)
	visible := pages
	visible.AndNot(&protect)
	srv.announce(b, dst, visible, cause)
}

// protection returns the pages of a refault that the thrashing policy
// protects, and protects them. The evidence is what the fault demanded,
// not what came with it: a program's unused neighbours of a page it uses
// (zero pages of its data segment, say) come back with every fault there
// and would fill the core; but a block that came back whole is protected
// whole, so that its folio stays whole.
func (o *mover) protection(dst core.Device, pages core.PageMask, rf workingset.Refault) core.PageMask {
	srv := o.sess.srv
	if srv.refaulting == nil || o.cause != policy.CauseFault || rf.Recent.Empty() {
		return core.PageMask{}
	}
	slot := dst.Slot()
	lim, ok := srv.ws.Limits(slot)
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
	protected := srv.ws.ProtectedPages(slot)
	hint := srv.refaulting.Refaulted(policy.Refault{
		Block: o.b.ref, Processor: dst, Pages: evidence, Distance: int64(rf.Distance),
		Capacity: lim.Capacity, Protected: protected,
		Limits: policy.RefaultLimits{Recent: lim.Recent, Protect: lim.Protect, Age: lim.Age},
	})
	if hint != policy.RefaultProtect {
		return core.PageMask{}
	}
	srv.ws.Protect(&o.b.ws, blockRef{r: o.r, i: o.blockIndex(), b: o.b}, slot, srv.locations(), evidence)
	n := evidence.Count()
	o.r.stats.Protected[slot].Add(uint64(n))
	if o.sess.tracing() {
		o.sess.tracePages(trace.KindProtect, o.r, o.pageAddr(evidence.NextSet(0)), n, dst)
	}
	return evidence
}

// announce tells the eviction policy that pages of managed block b now
// live on p, by cause: by page where it chooses pages, else by count. A
// sampled watch of b on p ends, so that Touched reads the whole block
// again and the pages that arrived count as touched where they were
// mapped, as they do in a block unmapped whole. (A block that leaves p
// needs no such end: the policy forgets it, and its next watch there,
// after it arrives again, sets the state anew.)
func (s *Server) announce(b *block, p core.Device, pages core.PageMask, cause policy.Cause) {
	if pages.Empty() {
		return
	}
	b.endSampledWatch(p)
	if s.pageEviction != nil {
		s.pageEviction.ArrivedPages(b.ref, p, pages, cause)
		return
	}
	s.eviction.Arrived(b.ref, p, pages.Count(), cause)
}

// departed records that pages of b left p other than by eviction (or
// before an eviction stamps them): their protection ends, and the
// eviction policy hears of those it knew, and that p holds none of b
// any more where nothing it may evict is left.
func (s *Server) departed(b *block, p core.Device, pages core.PageMask) {
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

// leftIfNoneEvictable tells the eviction policy that p holds none of b
// that it may evict, where that is so: nothing resident, or only pages
// protected (which it never heard of). Policies take Left for a block
// they do not list as nothing.
func (s *Server) leftIfNoneEvictable(b *block, p core.Device) {
	evictable := b.resident[p.Slot()]
	if !evictable.Empty() {
		hidden := s.ws.Hidden(&b.ws, p.Slot())
		evictable.AndNot(&hidden)
	}
	if evictable.Empty() {
		s.eviction.Left(b.ref, p)
	}
}

// releaseProtections reports to the eviction policy the pages on from
// whose protection has ended (their generation is over), block by
// block: the mover's own block, whose lock it holds, and others whose
// locks are free (the others wait for the next eviction).
func (o *mover) releaseProtections(from core.Device) {
	srv := o.sess.srv
	slot := from.Slot()
	var buf [16]blockRef
	due := srv.ws.Due(slot, buf[:0])
	var busy []blockRef
	for _, v := range due {
		own := v.b == o.b
		if !own && !v.b.mu.TryLock() {
			busy = append(busy, v)
			continue
		}
		if !v.r.freed.Load() {
			expired := srv.ws.Release(&v.b.ws, slot)
			expired.And(&v.b.resident[slot])
			srv.announce(v.b, from, expired, policy.CauseFault)
			if n := expired.Count(); n > 0 {
				v.r.stats.Unprotected[slot].Add(uint64(n))
			}
		}
		if !own {
			v.b.mu.Unlock()
		}
	}
	srv.ws.Requeue(slot, busy)
}

// evictProtected evicts, where nothing the eviction policy offers gave
// enough room, protected pages of other blocks on from, those protected
// longest ago first, until want pages left; it returns how many did.
// Protection bounds the core below what the processor holds, so this is
// rare: blocks in use by others, or a limit changed.
func (o *mover) evictProtected(from core.Device, want int64) int64 {
	srv := o.sess.srv
	if _, ok := srv.ws.Limits(from.Slot()); !ok {
		return 0
	}
	var buf [64]blockRef
	var moved int64
	for _, v := range srv.ws.Oldest(from.Slot(), buf[:0]) {
		if moved >= want {
			break
		}
		if v.b == o.b || !v.b.mu.TryLock() {
			continue
		}
		if !v.r.freed.Load() {
			// All of the block's protected pages: a block protected
			// whole is one folio, which a part leaving would split.
			pages := srv.ws.Protected(&v.b.ws, from.Slot())
			pages.And(&v.b.resident[from.Slot()])
			if !pages.Empty() {
				n := evictPages(v, from, pages, true)
				v.r.stats.Demoted[from.Slot()].Add(uint64(n))
				moved += n
			}
		}
		v.b.mu.Unlock()
	}
	return moved
}
