package block

import (
	"github.com/softuvm/softuvm/internal/core"
	"github.com/softuvm/softuvm/internal/workingset"
	"github.com/softuvm/softuvm/policy"
)

// The resident core (package workingset): pages a fault brings back to
// a processor soon after their eviction from it are protected from
// eviction, where the thrashing policy says so (policy.Refaulting), and
// hidden from the eviction policy until their protection ends. Every
// change of residency comes through here: arrivals (arrived), departures
// (departed), evictions (evictPages: Evicted).

// setRefaultLimits gives each processor the thrashing policy's limits
// for what it may hold: the host its budget, a device its arena. The
// processors never change size, so this runs once.
func (e *Engine) setRefaultLimits() {
	e.ws = workingset.NewSet[Ref](e.locs)
	for slot := 0; slot < e.locs; slot++ {
		p := core.DeviceAtSlot(slot)
		var capacity int64
		if p == core.CPU {
			capacity = e.cfg.HostBudget / core.PageSize
		} else {
			capacity = e.cfg.Arenas[p].Capacity() / core.PageSize
		}
		if capacity <= 0 {
			continue // no budget: the host never evicts
		}
		var l policy.RefaultLimits // none: refaults measured, nothing protected
		if e.pol.Refaulting != nil {
			l = e.pol.Refaulting.RefaultLimits(p, capacity)
		}
		e.ws.SetLimits(slot, workingset.Limits{Capacity: capacity, Recent: l.Recent, Protect: l.Protect, Age: l.Age})
	}
}

// arrived records that pages of the mover's block now live on dst, for
// cause: the refaults among them, what the thrashing policy protects of
// those, and the eviction policy told of the rest.
func (o *Mover) arrived(dst core.Device, pages core.PageMask, cause policy.Cause) {
	e := o.eng()
	b := o.B
	if o.R.Kind != core.KindManaged { // pinned and device memory are never evicted
		return
	}
	slot := dst.Slot()
	rf := e.ws.Arrived(&b.ws, slot, e.locs, pages)
	if n := rf.Recent.Count() + rf.Far.Count(); n > 0 {
		o.emit(Event{Kind: EvRefaulted, Processor: dst, N: n, Recent: rf.Recent.Count()})
	}
	protect := o.protection(dst, pages, rf)
	visible := pages
	visible.AndNot(&protect)
	o.announce(dst, visible, cause)
}

// protection returns the pages of a refault that the thrashing policy
// protects, and protects them. The evidence is what the fault demanded,
// not what came with it: a program's unused neighbours of a page it uses
// (zero pages of its data segment, say) come back with every fault there
// and would fill the core; but a block that came back whole is protected
// whole, so that its folio stays whole.
func (o *Mover) protection(dst core.Device, pages core.PageMask, rf workingset.Refault) core.PageMask {
	e := o.eng()
	if e.pol.Refaulting == nil || o.Cause != policy.CauseFault || rf.Recent.Empty() {
		return core.PageMask{}
	}
	slot := dst.Slot()
	lim, ok := e.ws.Limits(slot)
	if !ok {
		return core.PageMask{}
	}
	evidence := rf.Recent
	if pages.Count() < o.B.Pages {
		evidence.And(&o.demand)
	}
	if evidence.Empty() {
		return core.PageMask{}
	}
	hint := e.pol.Refaulting.Refaulted(policy.Refault{
		Block: o.B.Ref, Processor: dst, Pages: evidence, Distance: int64(rf.Distance),
		Capacity: lim.Capacity, Protected: e.ws.ProtectedPages(slot),
		Limits: policy.RefaultLimits{Recent: lim.Recent, Protect: lim.Protect, Age: lim.Age},
	})
	if hint != policy.RefaultProtect {
		return core.PageMask{}
	}
	e.ws.Protect(&o.B.ws, Ref{R: o.R, I: o.blockIndex(), B: o.B}, slot, e.locs, evidence)
	o.emit(Event{Kind: EvProtected, Processor: dst, First: evidence.NextSet(0), Pages: evidence})
	return evidence
}

// announce tells the eviction policy that pages of the mover's managed
// block now live on p, by cause. A sampled watch of the block on p ends,
// so that Touched reads the whole block again and the pages that arrived
// count as touched where they were mapped, as they do in a block
// unmapped whole. (A block that leaves p needs no such end: the policy
// forgets it, and its next watch there, after it arrives again, sets the
// state anew.)
func (o *Mover) announce(p core.Device, pages core.PageMask, cause policy.Cause) {
	if pages.Empty() {
		return
	}
	o.B.EndSampledWatch(p)
	o.emit(Event{Kind: EvListed, Processor: p, Pages: pages, Cause: cause})
}

// departed records that pages of the block left p other than by eviction
// (or before an eviction stamps them): their protection ends, and the
// eviction policy hears of those it knew, and that p holds none of the
// block any more where nothing it may evict is left.
func (o *Mover) departed(p core.Device, pages core.PageMask) {
	if pages.Empty() {
		return
	}
	e := o.eng()
	hidden := e.ws.Left(&o.B.ws, p.Slot(), pages)
	known := pages
	known.AndNot(&hidden)
	ev := Event{Kind: EvDelisted, Processor: p, None: o.B.noneEvictable(e, p)}
	if e.pol.PageEviction != nil {
		ev.Pages = known
	}
	if ev.None || !ev.Pages.Empty() {
		o.emit(ev)
	}
}

// noneEvictable reports that p holds none of the block that the eviction
// policy may evict: nothing resident, or only pages protected (which it
// never heard of). Policies take Left for a block they do not list as
// nothing.
func (b *Block) noneEvictable(e *Engine, p core.Device) bool {
	evictable := b.Resident[p.Slot()]
	if !evictable.Empty() {
		hidden := e.ws.Hidden(&b.ws, p.Slot())
		evictable.AndNot(&hidden)
	}
	return evictable.Empty()
}

// releaseProtections reports to the eviction policy the pages on from
// whose protection has ended (their generation is over), block by
// block: the mover's own block, whose lock it holds, and others whose
// locks are free (the others wait for the next eviction).
func (o *Mover) releaseProtections(from core.Device) {
	e := o.eng()
	slot := from.Slot()
	var buf [16]Ref
	due := e.ws.Due(slot, buf[:0])
	var busy []Ref
	for _, v := range due {
		own := v.B == o.B
		if !own && !v.B.TryLock() {
			busy = append(busy, v)
			continue
		}
		if !v.R.Freed.Load() {
			expired := e.ws.Release(&v.B.ws, slot)
			expired.And(&v.B.Resident[slot])
			vo := v.R.NewMover(v.I, v.B)
			vo.Thread = o.Thread
			vo.announce(from, expired, policy.CauseFault)
			if !expired.Empty() {
				vo.emit(Event{Kind: EvUnprotected, Processor: from, First: expired.NextSet(0), Pages: expired})
			}
		}
		if !own {
			v.B.Unlock()
		}
	}
	e.ws.Requeue(slot, busy)
}

// evictProtected evicts, where nothing the eviction policy offers gave
// enough room, protected pages of other blocks on from, those protected
// longest ago first, until want pages left; it returns how many did.
// Protection bounds the core below what the processor holds, so this is
// rare: blocks in use by others, or a limit changed.
func (o *Mover) evictProtected(from core.Device, want int64) int64 {
	e := o.eng()
	if _, ok := e.ws.Limits(from.Slot()); !ok {
		return 0
	}
	var buf [64]Ref
	var moved int64
	for _, v := range e.ws.Oldest(from.Slot(), buf[:0]) {
		if moved >= want {
			break
		}
		if v.B == o.B || !v.B.TryLock() {
			continue
		}
		if !v.R.Freed.Load() {
			// All of the block's protected pages: a block protected
			// whole is one folio, which a part leaving would split.
			pages := e.ws.Protected(&v.B.ws, from.Slot())
			pages.And(&v.B.Resident[from.Slot()])
			if !pages.Empty() {
				n := evictPages(v, from, pages, true)
				if n > 0 {
					vo := v.R.NewMover(v.I, v.B)
					vo.emit(Event{Kind: EvDemoted, Processor: from, N: int(n)})
				}
				moved += n
			}
		}
		v.B.Unlock()
	}
	return moved
}
