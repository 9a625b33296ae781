package block

import (
	"time"

	"github.com/softuvm/softuvm/internal/core"
	"github.com/softuvm/softuvm/policy"
)

// Mover carries every move of one block, with the block's lock held. It
// decides what moves where and in what runs, does the bookkeeping, and
// asks its range's Memory for the operations:
//
//	nowhere -> L   zero pages installed through L's view (allocating in
//	               L's file), or allocated in L's file when it has none
//	S -> L         S's writers held still (write-protected) in every
//	               view that maps S's file there; the pages copied out,
//	               S's copy punched, then put at L (installed through
//	               L's view, or written into L's file); the writers let
//	               go: their retry faults the pages back
//
// Punching a file frees its pages and zaps every page-table entry that
// maps them, in every process: that is how a page leaves a location.
type Mover struct {
	R         *Range
	B         *Block
	BlockAddr uintptr // address of the block's page 0
	// FV is the view whose fault is being served (whoever serves the
	// fault keeps it alive), nil on the control path.
	FV View
	// Thread is the serving thread's context, for the Memory's scratch
	// (the server's handler: its staging buffer, its fault anatomy);
	// nil on the control path.
	Thread any
	// Ctx is scratch for the prefetch policy's context, nil allocates.
	Ctx *policy.PrefetchContext
	// Cause is why this mover moves pages: the thrashing detector
	// counts only moves a fault causes, and the eviction policy is told.
	// Zero for movers that move nothing of their own (remaps, audits).
	Cause policy.Cause
	// RunStarted is when the run being moved began, while an observer
	// times runs.
	RunStarted time.Time
	// Prefetched counts the pages this mover brought speculatively, for
	// its fault's event.
	Prefetched int
	// readAhead is the direction (+1, -1) in which the prefetch policy
	// asked for the next block to be read ahead of this fault (0: not).
	readAhead int
	// demand is the pages the fault being served asked for (not those
	// prefetched with them): the evidence of a refault (workingset.go).
	demand core.PageMask
	// keep is the pages the move under way brings, which the lab's
	// oracle, evicting the mover's own block, spares.
	keep    core.PageMask
	facts   moverFacts // the fault's facts, kept here so as not to allocate them
	runBuf  []Run      // reused for runs; nil allocates
	holdBuf []View     // reused by holders
}

// NewMover returns a mover of block i of r, which the caller has locked.
func (r *Range) NewMover(i int, b *Block) Mover {
	return Mover{R: r, B: b, BlockAddr: r.Start + uintptr(i)*core.BlockSize}
}

// Scratch is reusable storage for the movers of one thread, so that
// serving a fault allocates nothing.
type Scratch struct {
	Runs  []Run
	Holds []View
	Ctx   policy.PrefetchContext
}

// Use gives the mover the scratch's buffers.
func (o *Mover) Use(s *Scratch) {
	if s.Runs == nil {
		s.Runs = make([]Run, 0, core.PagesPerBlock/2+1)
	}
	o.runBuf, o.holdBuf, o.Ctx = s.Runs[:0], s.Holds[:0], &s.Ctx
}

// Run is a maximal stretch of pages with the same source and the same
// way in.
type Run struct {
	First, Outer int
	Src          core.Device
	Populated    bool // false: the pages exist nowhere yet
	Speculative  bool // brought by prefetch, not demanded, and left unmapped
	Mapped       bool // installed through the target's view
}

// Target says where a move puts pages: location Dst's file, through view
// Via for the pages in Mapped (Via maps Dst's file over them), straight
// into the file for the others.
type Target struct {
	Dst    core.Device
	Via    View
	Mapped core.PageMask
}

// PageAddr is the address of page p of the block.
func (o *Mover) PageAddr(p int) uintptr { return o.BlockAddr + uintptr(p)*core.PageSize }

// FileOff is the offset of page p of the block in every location file.
func (o *Mover) FileOff(p int) int64 { return o.R.FileOff + int64(o.PageAddr(p)-o.R.Start) }

// blockIndex is the mover's block's index in its range.
func (o *Mover) blockIndex() int { return int((o.BlockAddr - o.R.Start) >> core.BlockShift) }

// BlockIndex is the mover's block's index in its range.
func (o *Mover) BlockIndex() int { return o.blockIndex() }

func (o *Mover) eng() *Engine   { return o.R.eng }
func (o *Mover) space() Memory  { return o.R.Space }
func (o *Mover) loc(v View) int { return v.Processor().Slot() }

// ViewOf returns location l's view for use by this mover: the faulting
// view as it is (whoever serves the fault keeps it alive), any other with
// a reference; release with DoneWith.
func (o *Mover) ViewOf(l core.Device) View {
	if o.FV != nil && o.FV.Processor() == l {
		return o.FV
	}
	return o.space().View(l)
}

// DoneWith releases a view ViewOf returned.
func (o *Mover) DoneWith(v View) {
	if v != nil && v != o.FV {
		o.space().Release(v)
	}
}

// DoneWithAll releases views.
func (o *Mover) DoneWithAll(vs []View) {
	for _, v := range vs {
		o.DoneWith(v)
	}
}

// OwnTarget is dst with its own view, if it runs, over the pages it maps
// its file on: how the control path moves pages. Release with
// DoneWith(t.Via).
func (o *Mover) OwnTarget(dst core.Device) Target {
	t := Target{Dst: dst, Via: o.ViewOf(dst)}
	if t.Via != nil {
		t.Mapped = o.PagesMapping(dst, dst)
	}
	return t
}

// runs splits want into runs by source and by the way in: speculative
// pages brought to the host of a range that tracks prefetch use (lazy)
// are left unmapped, so that their first touch shows. The run holding
// page lead comes first: the faulting thread waits on it.
func (o *Mover) runs(want, speculative core.PageMask, t Target, lazy bool, lead int) []Run {
	out := o.runBuf[:0]
	b := o.B
	mapped := func(p int) bool { return t.Via != nil && t.Mapped.Test(p) && !(lazy && speculative.Test(p)) }
	for p := want.NextSet(0); p >= 0; {
		first := p
		src, populated := b.LocationOf(p)
		spec := lazy && speculative.Test(p)
		m := mapped(p)
		for p++; p < b.Pages && want.Test(p); p++ {
			s, pop := b.LocationOf(p)
			if s != src || pop != populated || (lazy && speculative.Test(p)) != spec || mapped(p) != m {
				break
			}
		}
		out = append(out, Run{First: first, Outer: p, Src: src, Populated: populated, Speculative: spec, Mapped: m})
		if p >= b.Pages {
			break
		}
		p = want.NextSet(p)
	}
	for i, rn := range out {
		if rn.First <= lead && lead < rn.Outer && i > 0 {
			copy(out[1:i+1], out[:i])
			out[0] = rn
			break
		}
	}
	o.runBuf = out
	return out
}

// arrivalCause is why pages this mover brings arrive, as the eviction
// policy is told: the mover's cause, or advice (read duplication, a pin)
// where it set none.
func (o *Mover) arrivalCause() policy.Cause {
	if o.Cause == 0 {
		return policy.CauseAdvice
	}
	return o.Cause
}

// MoveTo brings demand and speculative pages to t.Dst. Capacity for a
// device is reserved first, so that a full arena fails before anything
// moved; pages over the host's budget leave after.
func (o *Mover) MoveTo(t Target, demand, speculative core.PageMask, lead int) error {
	moved, err := o.move(t, demand, speculative, lead)
	if t.Dst == core.CPU && moved > 0 {
		keep := demand
		keep.Or(&speculative)
		o.overBudget(keep)
	}
	return err
}

// moveToUnmapped moves pages into dst's file only: eviction does, so that
// the pages' next user maps them on touch.
func (o *Mover) moveToUnmapped(dst core.Device, pages core.PageMask) error {
	var none core.PageMask
	_, err := o.move(Target{Dst: dst}, pages, none, -1)
	return err
}

func (o *Mover) move(t Target, demand, speculative core.PageMask, lead int) (int64, error) {
	b := o.B
	e := o.eng()
	dst := t.Dst
	// A page with copies in several places (read duplication) becomes a
	// single copy before it moves: demanded ones keep their first copy,
	// speculative ones stay where they are.
	if dup := b.Duplicated(); !dup.Empty() {
		speculative.AndNot(&dup)
		dd := demand
		dd.And(&dup)
		if !dd.Empty() {
			o.CollapseAll(dd)
		}
	}
	// Demanded pages already on dst may only want mapping: they stay, as
	// the others this move brings, if it must give up pages of its own
	// block for room there (reserve).
	keep := demand
	keep.Or(&speculative)
	want := keep
	want.AndNot(&b.Resident[dst.Slot()])
	need := int64(want.Count())
	if need == 0 {
		return 0, nil
	}
	charged := o.R.Kind != core.KindDevice // device memory reserved its capacity at allocation
	var arena Arena
	if dst != core.CPU && charged {
		arena = e.cfg.Arenas[dst]
		err := o.Reserve(dst, need, keep)
		if err != nil && !speculative.Empty() {
			// The prefetched pages do not fit (a whole block, say, on a
			// full device whose other blocks are all in use): the
			// demanded ones alone may, and a fault must not fail for
			// want of room for pages nobody asked for.
			speculative = core.PageMask{}
			want = demand
			want.AndNot(&b.Resident[dst.Slot()])
			if need = int64(want.Count()); need == 0 {
				return 0, nil
			}
			err = o.Reserve(dst, need, demand)
		}
		if err != nil {
			return 0, err
		}
		defer o.Settled(dst) // after the runs are accounted, below
	}
	dstLarge, err := o.space().LargeFile(dst)
	lazy := dst == core.CPU && o.R.TrackPrefetch
	var moved int64
	if err == nil {
		for _, rn := range o.runs(want, speculative, t, lazy, lead) {
			var done core.PageMask
			if e.sink.timed {
				o.RunStarted = time.Now()
			}
			done, err = o.moveRun(rn, t, dstLarge)
			o.Account(rn, done, dst, speculative)
			moved += int64(done.Count())
			if err != nil {
				break
			}
		}
	}
	if arena != nil && moved < need {
		arena.Release(need - moved)
	}
	return moved, err
}

// moveRun moves one run to t.Dst, without touching the block's
// residency: the way in (whole-block moves, whole.go; the 4 KiB path),
// each step asked of the Memory.
func (o *Mover) moveRun(rn Run, t Target, dstLarge bool) (core.PageMask, error) {
	var done core.PageMask
	mem := o.space()
	if o.wholeRun(rn) {
		touching := o.touching(rn, t)
		switch {
		case !touching && dstLarge:
			return o.moveWhole(rn, t)
		case touching && dstLarge && (o.continuesInto(t) || o.faultsInFromOwnFile(t)):
			// One folio written, then mapped in one Continue (the host)
			// or by the kernel's own minor faults (a device's own file).
			return o.moveWhole(rn, t)
		case touching && rn.Populated && o.mayBeLarge(rn.Src):
			return o.moveWholeInstalled(rn, t)
		}
	}
	if !rn.Populated {
		if rn.Mapped {
			done, _, err := mem.InstallZero(o, t.Via, rn.First, rn.Outer)
			return done, err
		}
		if err := mem.Allocate(o, t.Dst, rn.First, rn.Outer); err != nil {
			return done, err
		}
		done.FillRange(rn.First, rn.Outer)
		return done, nil
	}
	if o.mayBeLarge(rn.Src) {
		// Part of the block leaves: its copy there goes into 4 KiB
		// folios first (PunchPages says why).
		if err := o.breakLarge(rn.Src, 0, 0); err != nil {
			return done, err
		}
	}
	holders, err := o.hold(rn.Src, rn.First, rn.Outer)
	if err != nil {
		return done, err
	}
	defer o.DoneWithAll(holders)
	if rn.Src == core.CPU {
		var all core.PageMask
		all.FillRange(rn.First, rn.Outer)
		o.auditBlock(all, true)
	}
	done, err = mem.Transfer(o, t, rn.Mapped, rn.First, rn.Outer, rn.Src)
	o.Released(rn.Src, done)
	// Writers held by the protection retry now and fault the pages
	// back; pages that did not move are writable again.
	o.letGo(holders, rn.First, rn.Outer, done.CountRange(rn.First, rn.Outer) < rn.Outer-rn.First)
	return done, err
}

// hold write-protects, in every view that may map location src's file
// over pages [first, outer), those pages, so that its writers wait while
// they are copied away. The caller releases the views (DoneWithAll)
// and lets the writers go (letGo).
func (o *Mover) hold(src core.Device, first, outer int) ([]View, error) {
	holders := o.Holders(src, first, outer)
	for _, v := range holders {
		if err := o.space().Protect(o, v, first, outer); err != nil {
			o.letGo(holders, first, outer, true)
			o.DoneWithAll(holders)
			return nil, err
		}
	}
	return holders, nil
}

// letGo lets the writers that holders held go: with unprotect (some
// pages stayed) their protection is lifted, else they are woken to fault
// again.
func (o *Mover) letGo(holders []View, first, outer int, unprotect bool) {
	for _, v := range holders {
		if unprotect {
			o.space().Unprotect(o, v, first, outer)
		} else {
			o.space().Wake(o, v, first, outer)
		}
	}
}

// Released accounts for location l's copies of pages that left l's
// file: l's arena has their room back.
func (o *Mover) Released(l core.Device, pages core.PageMask) {
	if l != core.CPU && o.R.Kind != core.KindDevice {
		o.eng().cfg.Arenas[l].Release(int64(pages.Count()))
	}
}

// drop frees location l's copies of pages (their data lives elsewhere
// now): punching l's file zaps every page-table entry that maps them, in
// every process.
func (o *Mover) drop(l core.Device, pages core.PageMask) {
	if _, err := o.space().LargeFile(l); err != nil {
		return
	}
	for p, q := pages.NextRun(0); p >= 0; p, q = pages.NextRun(q) {
		if err := o.PunchPages(l, p, q); err != nil {
			o.eng().cfg.Logf("free %v pages %#x+%d: %v", l, o.FileOff(p), (q-p)*core.PageSize, err)
		}
	}
	o.Released(l, pages)
}

// dropCopies frees location l's copies of pages, which it holds, and
// forgets them there: in the residency, the host's page count and the
// eviction policies. Read duplication collapsing to one copy and a
// discard both come here.
func (o *Mover) dropCopies(l core.Device, pages core.PageMask) {
	b := o.B
	o.drop(l, pages)
	b.Resident[l.Slot()].AndNot(&pages)
	o.departed(l, pages)
	if l == core.CPU {
		o.eng().hostPages.Add(-int64(pages.Count()))
	}
}

// Account records that the pages done of run rn now live at dst.
func (o *Mover) Account(rn Run, done core.PageMask, dst core.Device, speculative core.PageMask) {
	n := done.Count()
	if n == 0 {
		return
	}
	b := o.B
	e := o.eng()
	for l := range b.Resident {
		b.Resident[l].AndNot(&done)
	}
	b.Resident[dst.Slot()].Or(&done)
	if rn.Populated {
		o.departed(rn.Src, done)
	}
	cause := o.arrivalCause()
	o.arrived(dst, done, cause)
	if dst == core.CPU {
		e.hostGained(int64(n))
	} else if rn.Populated && rn.Src == core.CPU {
		e.hostPages.Add(-int64(n))
	}
	spec := done
	spec.And(&speculative)
	k := spec.Count()
	o.emit(Event{Kind: EvArrived, First: done.NextSet(0), Pages: done, Prefetched: k, From: rn.Src, To: dst,
		Cause: cause, Populated: rn.Populated, Started: o.RunStarted})
	if k > 0 {
		o.Prefetched += k
		if rn.Speculative && dst == core.CPU {
			b.PrefetchPending.Or(&spec)
		}
	}
	o.residencyChanged()
}

// residencyChanged tells the remapper to look at the block when device
// mappings there depend on where pages live.
func (o *Mover) residencyChanged() {
	if o.B.RemoteMappable(o.eng()) {
		o.emit(Event{Kind: EvMappings})
	}
}

// RemoteMappable reports whether a device may map another location's
// file over some page of the block: it does, or advice or a pin may make
// it. Blocks without are left alone by the remapper.
func (b *Block) RemoteMappable(e *Engine) bool {
	th := e.pol.Thrashing
	return b.maps != nil || (b.Advice != nil && b.Advice.Remote) || (b.thrash != nil && th != nil && th.PinnedUntil(b.thrash) > e.Now())
}

// Prefetch moves pages of the block to dst, as cuMemPrefetchAsync does:
// pages never touched are populated (zero-filled) at dst; read-mostly
// pages get a copy at dst and keep the others.
func (o *Mover) Prefetch(dst core.Device, pages core.PageMask) error {
	o.Cause = policy.CausePrefetch
	for p := pages.NextSet(0); p >= 0; p = pages.NextSet(p + 1) {
		o.B.LastPrefetch[p] = core.PageProcessorOf(dst)
	}
	t := o.OwnTarget(dst)
	defer o.DoneWith(t.Via)
	var err error
	if adv := o.B.Advice; adv != nil {
		dup := pages
		dup.And(&adv.ReadMostly)
		dup.AndNot(&o.B.Resident[dst.Slot()])
		var populated core.PageMask
		for l := range o.B.Resident {
			populated.Or(&o.B.Resident[l])
		}
		dup.And(&populated)
		if !dup.Empty() {
			err = o.duplicate(t, dup)
			pages.AndNot(&dup)
		}
	}
	if err == nil {
		var none core.PageMask
		err = o.MoveTo(t, pages, none, -1)
	}
	return err
}

// MoveIn moves pages of the block to location dst through its own view
// for cause: a delayed migration, a launch's hand-off.
func (o *Mover) MoveIn(dst core.Device, pages core.PageMask, cause policy.Cause) error {
	o.Cause = cause
	t := o.OwnTarget(dst)
	defer o.DoneWith(t.Via)
	return o.MoveTo(t, pages, core.PageMask{}, -1)
}

// Discard drops every location's copies of pages: their next touch, on
// any processor, is a first touch.
func (o *Mover) Discard(pages core.PageMask) {
	b := o.B
	var populated core.PageMask
	for l := range b.Resident {
		x := b.Resident[l]
		x.And(&pages)
		if !x.Empty() {
			populated.Or(&x)
			o.dropCopies(core.DeviceAtSlot(l), x)
		}
	}
	// Speculative pages that go untouched were prefetched for nothing.
	pending := b.PrefetchPending
	pending.And(&pages)
	if n := pending.Count(); n > 0 {
		o.emit(Event{Kind: EvPrefetchAudit, Unused: n})
		b.PrefetchPending.AndNot(&pending)
	}
	if !populated.Empty() {
		o.emit(Event{Kind: EvDiscarded, First: populated.NextSet(0), Pages: populated})
		o.residencyChanged()
	}
}

// auditBlock settles the fate of prefetched pages of the block that are
// in mask: those the client mapped were used; if leaving, the others were
// not.
func (o *Mover) auditBlock(mask core.PageMask, leaving bool) {
	pending := o.B.PrefetchPending
	pending.And(&mask)
	if pending.Empty() {
		return
	}
	present, err := o.space().Mapped(o, pending)
	if err != nil {
		o.eng().cfg.Logf("prefetch audit of %#x: %v", o.BlockAddr, err)
		return
	}
	o.B.PrefetchPending.AndNot(&present)
	ev := Event{Kind: EvPrefetchAudit, N: present.Count()}
	if leaving {
		pending.AndNot(&present)
		ev.Unused = pending.Count()
		o.B.PrefetchPending.AndNot(&pending)
	}
	o.emit(ev)
}

// Audit settles what can be known of the block's prefetched pages,
// before its range's statistics are read (leaving false) or it is freed.
func (o *Mover) Audit(leaving bool) {
	if o.B.PrefetchPending.Empty() {
		return
	}
	var all core.PageMask
	all.FillRange(0, o.B.Pages)
	o.auditBlock(all, leaving)
}

// HandOff is the block's share of a launch's hand-off to dst under the
// launch coherence model; written holds the pages the CPU wrote. Host
// copies of pages a device also holds that the CPU did not write are
// dropped; written ones become the only copies; every page then only on
// the host moves to dst.
func (o *Mover) HandOff(dst core.Device, written core.PageMask) error {
	b := o.B
	host := b.Resident[core.CPU.Slot()]
	if host.Empty() {
		return nil
	}
	dup := b.HostDuplicates()
	clean := dup
	clean.AndNot(&written)
	if n := clean.Count(); n > 0 {
		o.drop(core.CPU, clean)
		b.Resident[core.CPU.Slot()].AndNot(&clean)
		o.departed(core.CPU, clean)
		o.eng().hostPages.Add(-int64(n))
		o.emit(Event{Kind: EvLaunch, To: dst, Clean: n})
	}
	dirty := dup
	dirty.And(&written)
	if !dirty.Empty() {
		o.CollapseTo(core.CPU, dirty) // the device copies are stale
	}
	rest := b.Resident[core.CPU.Slot()]
	if rest.Empty() {
		o.residencyChanged()
		return nil
	}
	n := rest.Count()
	err := o.MoveIn(dst, rest, policy.CauseLaunch)
	left := b.Resident[core.CPU.Slot()]
	left.And(&rest)
	o.emit(Event{Kind: EvLaunch, To: dst, N: n - left.Count()})
	return err
}

// Adopt records pages found in location l's file as resident there (a
// server taking over from one that died), as the moves that put them
// there did: the eviction policy hears of them, and the host's count and
// a device's arena are charged by the caller.
func (o *Mover) Adopt(l core.Device, pages core.PageMask) {
	o.B.Resident[l.Slot()].Or(&pages)
	o.B.MarkLarge() // the dead server's folios are not known
	if o.R.Kind == core.KindManaged {
		o.announce(l, pages, policy.CauseFault)
	}
}

// Free forgets the block as its range is freed (Range.Free): its
// protections end and the eviction policy forgets it everywhere. The
// pages it held at each location slot are added to resident.
func (o *Mover) Free(resident []int64) {
	b := o.B
	e := o.eng()
	for l := range b.Resident {
		resident[l] += int64(b.Resident[l].Count())
		if !b.Resident[l].Empty() {
			e.ws.Left(&b.ws, l, b.Resident[l]) // its protections end
			o.emit(Event{Kind: EvDelisted, Processor: core.DeviceAtSlot(l), None: true})
		}
	}
	if n := b.PrefetchPending.Count(); n > 0 {
		o.emit(Event{Kind: EvPrefetchAudit, Unused: n})
	}
}

// AuditLeaving settles the prefetched pages of pages, about to leave the
// host: those the client mapped were used, the others not.
func (o *Mover) AuditLeaving(pages core.PageMask) { o.auditBlock(pages, true) }

// NoteWritten records pages of device memory that the client wrote
// through its own mapping of location l's file as resident there: they
// arrive, created, as advice makes pages.
func (o *Mover) NoteWritten(l core.Device, pages core.PageMask) {
	fresh := pages
	fresh.AndNot(&o.B.Resident[l.Slot()])
	if fresh.Empty() {
		return
	}
	o.B.Resident[l.Slot()].Or(&fresh)
	o.emit(Event{Kind: EvArrived, First: fresh.NextSet(0), Pages: fresh, To: l, Cause: policy.CauseAdvice})
}
