package block

import (
	"errors"
	"fmt"
	"sync/atomic"

	"github.com/softuvm/softuvm/internal/core"
	"github.com/softuvm/softuvm/policy"
)

// ErrDeferred reports that a fault was left waiting on purpose (a
// throttled processor, a mapping about to change), to be served again
// after a nap.
var ErrDeferred = errors.New("fault deferred")

// Fault is one fault being served, as the engine sees it: its kind,
// whether it writes, and how many times it was deferred already.
type Fault struct {
	Kind  core.FaultKind
	Write bool
	Waits int  // naps already taken
	NoNap bool // served once throttled: do not throttle again
}

// Plan is what the decision step says to do with a fault.
type Plan int

const (
	PlanRefuse        Plan = iota + 1 // the host touched device memory: an error
	PlanLaunchRefuse                  // the launch coherence model forbids this touch: an error
	PlanHint                          // a MINOR fault on a remote mapping: the user-space counters' hint fault
	PlanContinue                      // a MINOR fault on the view's own file, which holds the page: map it
	PlanWaitMapping                   // defer: the view is being pointed at a file that holds the page
	PlanPending                       // the view's mapping is changing: install through it and look
	PlanWP                            // a write to a write-protected page
	PlanWake                          // the page is where the view maps it already: install a zero page, which wakes
	PlanDuplicate                     // a read of a read-mostly page: copy it here, keep the others
	PlanThrottle                      // the thrashing policy throttles the processor: defer
	PlanPinToHost                     // pinned in host memory: bring it there, defer until the device maps it
	PlanMigrateAnyway                 // pinned, but the device never mapped the host copy: migrate, and say so
	PlanMigrate                       // migrate the page and what the prefetch policy adds
)

var planNames = [...]string{PlanRefuse: "refuse", PlanLaunchRefuse: "launch-refuse", PlanHint: "hint", PlanContinue: "continue", PlanWaitMapping: "wait-mapping", PlanPending: "pending",
	PlanWP: "write-protect", PlanWake: "wake", PlanDuplicate: "duplicate", PlanThrottle: "throttle",
	PlanPinToHost: "pin-to-host", PlanMigrateAnyway: "migrate-anyway", PlanMigrate: "migrate"}

func (p Plan) String() string {
	if p > 0 && int(p) < len(planNames) {
		return planNames[p]
	}
	return fmt.Sprintf("plan(%d)", int(p))
}

// Engine's reports whether the engine carries the plan out itself
// (ServeFault); the others (refusals, hint faults, installs through a
// mapping that changes) are its caller's.
func (p Plan) Engine() bool {
	switch p {
	case PlanRefuse, PlanLaunchRefuse, PlanHint, PlanPending:
		return false
	}
	return true
}

// faultFacts is what the decision step asks about a fault of a view on a
// page of a block. Each fact is computed when asked: some cost a look at
// every location's residency, and thrashing tells the thrashing policy
// about the fault, so the step asks them in the order and under the
// conditions that make them relevant.
type faultFacts interface {
	hostOnDeviceMemory() bool // the range is device memory and the view is the host's
	kind() core.FaultKind
	write() bool
	waitsLeft() bool // the fault may be deferred once more
	noNap() bool     // the fault was throttled once already
	// mapping is the location whose file the view maps over the page,
	// and whether that is known (not changing).
	mapping() (m core.Device, known bool)
	ownFileHolds() bool // the view is being pointed at its own file, which holds the page
	residentAt(loc core.Device) bool
	viewLocation() core.Device
	desiredFile() core.Device // where policy wants the view to map the page
	source() (src core.Device, populated bool)
	readMostly() bool
	// cleanCopy: clean eviction applies to the page: the host reads it
	// back from a device, and its device copy may stay (clean.go).
	cleanCopy() bool
	thrashing() thrashAction
	// Under the launch coherence model: the touch is forbidden (the CPU
	// during a kernel that may use the page, a kernel on memory no launch
	// of its device took), or the host view's fault is served by a copy
	// the device keeps.
	launchRefused() bool
	launchCopy() bool
}

// decideFault is the fault path's decision: from the fault, the block's
// state and the policies' hints, what to do. It changes nothing but what
// the thrashing policy records when asked.
func decideFault(f faultFacts) Plan {
	if f.hostOnDeviceMemory() {
		return PlanRefuse
	}
	if f.launchRefused() {
		return PlanLaunchRefuse
	}
	if f.kind() == core.FaultMinor {
		// Device views' remote mappings register MINOR faults for the
		// user-space fallback's hint faults; every view whose file
		// takes large folios registers them over its own file too, so
		// that a block written there whole is mapped with one
		// Continue.
		m, known := f.mapping()
		switch {
		case !known && f.waitsLeft():
			// The view is being pointed at another file, and the fault
			// may have come through either. Through its own file, the
			// page may be a stray one (a large folio made it present,
			// the table has it elsewhere), which must not be mapped:
			// wait until the mapping is known.
			return PlanWaitMapping
		case !known || m != f.viewLocation():
			return PlanHint
		case f.residentAt(m):
			return PlanContinue
		}
		// The view's own file has the page but the table has it
		// elsewhere, or nowhere: a stray page. Serve it as a missing
		// one; the install writes over it.
	}
	m, known := f.mapping()
	if !known {
		if f.ownFileHolds() && f.waitsLeft() {
			// The fault came through the old mapping: wait for the new
			// one rather than take the page back.
			return PlanWaitMapping
		}
		return PlanPending
	}
	if f.kind() == core.FaultWP {
		return PlanWP
	}
	if f.residentAt(m) {
		// Believed present in the file the view maps, but the view
		// faulted: a race with another handler (the page exists now),
		// or the process punched it (it reads as zeros again).
		return PlanWake
	}
	l := f.viewLocation()
	if m != l && f.residentAt(l) && f.waitsLeft() && f.desiredFile() == l {
		// The page came to this processor (a delayed migration, a
		// prefetch) while the view still maps where it was: taking it
		// back would undo the move; wait for the remapper.
		return PlanWaitMapping
	}
	src, populated := f.source()
	if populated && (f.launchCopy() || !f.write() && (f.readMostly() || f.cleanCopy())) {
		return PlanDuplicate
	}
	if populated && src != m && !f.noNap() {
		switch f.thrashing() {
		case thrashThrottle:
			return PlanThrottle
		case thrashPinned:
			// Pinned in host memory: bring it there and wait for the
			// device to map the host copy, unless policy keeps the
			// device on its own file.
			if m != core.CPU && f.desiredFile() == core.CPU {
				if f.waitsLeft() {
					return PlanPinToHost
				}
				return PlanMigrateAnyway
			}
		}
	}
	return PlanMigrate
}

// moverFacts answers faultFacts from a mover's block, for the fault f
// of view o.FV on page p. The block's lock is held.
type moverFacts struct {
	o *Mover
	p int
	f Fault
}

func (f *moverFacts) hostOnDeviceMemory() bool {
	return f.o.R.Kind == core.KindDevice && f.o.FV.Processor() == core.CPU
}
func (f *moverFacts) kind() core.FaultKind            { return f.f.Kind }
func (f *moverFacts) write() bool                     { return f.f.Write }
func (f *moverFacts) waitsLeft() bool                 { return f.f.Waits < f.o.eng().mech.PinWaits }
func (f *moverFacts) noNap() bool                     { return f.f.NoNap }
func (f *moverFacts) mapping() (core.Device, bool)    { return f.o.MapsAt(f.o.FV.Processor(), f.p) }
func (f *moverFacts) residentAt(loc core.Device) bool { return f.o.B.Resident[loc.Slot()].Test(f.p) }
func (f *moverFacts) viewLocation() core.Device       { return f.o.FV.Processor() }
func (f *moverFacts) desiredFile() core.Device        { return f.o.DesiredFile(f.o.FV.Processor(), f.p) }
func (f *moverFacts) source() (core.Device, bool)     { return f.o.B.LocationOf(f.p) }
func (f *moverFacts) thrashing() thrashAction         { return f.o.checkThrashing(f.o.FV.Processor(), f.p) }
func (f *moverFacts) ownFileHolds() bool {
	l := f.o.FV.Processor()
	return fileOf(f.o.B.maps[l.Slot()].file[f.p], l) == l && f.o.B.Resident[l.Slot()].Test(f.p)
}
func (f *moverFacts) launchRefused() bool { return f.o.space().LaunchRefused(f.o) }
func (f *moverFacts) launchCopy() bool    { return f.o.launchCopy(f.p) }
func (f *moverFacts) readMostly() bool {
	adv := f.o.B.Advice
	return adv != nil && adv.ReadMostly.Test(f.p)
}
func (f *moverFacts) cleanCopy() bool { return f.o.cleanCopy(f.p) }

// ServeFault decides what to do with fault f of view o.FV on page p
// (decideFault) and, for the plans the engine carries out (Plan.Engine),
// carries it out, bringing prefetched pages along; ErrDeferred says it
// was left to wait. The view maps some file over p (its own, or another
// location's: a remote mapping), and the page is brought into that file.
// The plans the engine leaves are returned with nothing done.
func (o *Mover) ServeFault(p int, f *Fault) (Plan, error) {
	o.facts = moverFacts{o: o, p: p, f: *f}
	plan := decideFault(&o.facts)
	if !plan.Engine() {
		return plan, nil
	}
	return plan, o.serve(plan, p, f)
}

func (o *Mover) serve(plan Plan, p int, f *Fault) error {
	l := o.FV.Processor()
	switch plan {
	case PlanContinue:
		o.serveContinue(p)
		return nil
	case PlanWaitMapping, PlanThrottle:
		return ErrDeferred
	case PlanWP:
		m, _ := o.MapsAt(l, p)
		o.serveWP(p, m)
		return nil
	case PlanWake:
		done, found, err := o.space().InstallZero(o, o.FV, p, p+1)
		if err == nil && done.Test(p) && !found.Test(p) {
			o.emit(Event{Kind: EvLostPage, Processor: l, First: p})
		}
		return err
	}
	m, _ := o.MapsAt(l, p)
	var faulted core.PageMask
	faulted.Set(p)
	o.demand = faulted
	t := Target{Dst: m, Via: o.FV, Mapped: o.PagesMapping(l, m)}
	if l == core.CPU && f.Write {
		o.B.HostWrote.Set(p)
	}
	switch plan {
	case PlanDuplicate:
		extra := o.expand(m, faulted, &t)
		if o.launchCopy(p) {
			extra = o.launchCopyExtra(extra)
			faulted.Or(&extra)
			return o.duplicate(t, faulted)
		}
		if adv := o.B.Advice; adv == nil || !adv.ReadMostly.Test(p) {
			return o.serveCleanCopies(t, faulted, extra, p, true)
		}
		extra.And(&o.B.Advice.ReadMostly)
		var populatedPages core.PageMask
		for x := range o.B.Resident {
			populatedPages.Or(&o.B.Resident[x])
		}
		extra.And(&populatedPages)
		faulted.Or(&extra)
		return o.duplicate(t, faulted)
	case PlanPinToHost:
		host := o.OwnTarget(core.CPU)
		err := o.MoveTo(host, faulted, core.PageMask{}, -1)
		o.DoneWith(host.Via)
		if err != nil {
			return err
		}
		return ErrDeferred
	case PlanMigrateAnyway:
		o.eng().cfg.Logf("device %d: page %#x is pinned in host memory but the device has not mapped it after %d naps; migrating it", l, o.PageAddr(p), o.eng().mech.PinWaits)
	}
	extra := o.expand(m, faulted, &t)
	// Where the page comes from, asked only where read-ahead may follow:
	// after the move it is here.
	var from core.Device
	populated := false
	if o.readAhead != 0 && m == l {
		from, populated = o.B.LocationOf(p)
	}
	var err error
	if m == core.CPU && o.cleanCopies() {
		err = o.serveCleanCopies(t, faulted, extra, p, false)
	} else {
		o.Cause = policy.CauseFault
		err = o.MoveTo(t, faulted, extra, p)
	}
	if err == nil && populated && from != l {
		o.R.readAheadFrom(l, from, o.blockIndex(), o.readAhead)
	}
	return err
}

// Served reports the fault f of view o.FV on page p, which the caller
// served (or failed to: failed), for every observer: the counters, the
// tracer, the fault anatomy. Dur is how long it took; thread the
// faulting thread.
func (o *Mover) Served(p int, f *Fault, plan Plan, ev Event) {
	ev.Kind, ev.Processor, ev.First, ev.Plan, ev.FaultKind, ev.Write, ev.Prefetched = EvFault, o.FV.Processor(), p, plan, f.Kind, f.Write, o.Prefetched
	o.emit(ev)
}

// serveWP resolves a write to a write-protected page that view o.FV maps
// from file m.
func (o *Mover) serveWP(p int, m core.Device) {
	b := o.B
	if !b.Resident[m.Slot()].Test(p) {
		// The page left while the writer waited; its retry faults as
		// missing and brings it back.
		o.space().Wake(o, o.FV, p, p+1)
		return
	}
	if b.Copies(p) > 1 {
		// A write to a read-duplicated page: this copy becomes the only
		// one, and writable (CollapseTo lifts the protection of every
		// mapping of it, which wakes the writer). A host copy written
		// is not made a clean copy again (cleanCopy).
		if o.FV.Processor() == core.CPU {
			b.HostWrote.Set(p)
		}
		var one core.PageMask
		one.Set(p)
		o.CollapseTo(m, one)
		return
	}
	// A migration protected the page and did not take it, or a stale
	// protection survived a move: give write access back (this also
	// wakes the writer).
	o.space().Unprotect(o, o.FV, p, p+1)
}

// launchCopy reports whether a fault of the host view on page p is served
// by a copy that the device keeps: the launch model's way back to the CPU.
func (o *Mover) launchCopy(p int) bool {
	return o.space().LaunchModel() && o.FV.Processor() == core.CPU && o.R.Kind == core.KindManaged && !o.B.Resident[core.CPU.Slot()].Test(p)
}

// launchCopyExtra is what the prefetch policy adds to a launch-model
// copy back to the host: pages with a copy on a device, none here.
func (o *Mover) launchCopyExtra(extra core.PageMask) core.PageMask {
	onDevices := o.B.OnDevices()
	extra.And(&onDevices)
	extra.AndNot(&o.B.Resident[core.CPU.Slot()])
	return extra
}

// sweepState is what a range keeps per location to tell sweeps: the
// pages (of the range, plus one; zero: none) the location's last fault
// brought, first and last, and the run of faults that landed just past
// them: counted up while they ascend, down while they descend. Without a
// lock: two faults at once may miss each other's note, which only delays
// a sweep by a fault.
type sweepState struct {
	lo, hi atomic.Int64
	run    atomic.Int32
}

// sweep reports whether location m's fault at page p of the mover's block
// continues a sweep (policy.SweepStep, PrefetchContext.Sweep); full says
// that m has no room to spare.
func (o *Mover) sweep(m core.Device, p int, full bool) (sweeping, descending bool) {
	l := m.Slot()
	if l >= len(o.R.sweeps) {
		return false, false
	}
	st := &o.R.sweeps[l]
	page := int64(o.PageAddr(p)-o.R.Start) >> core.PageShift
	n, sweeping := policy.SweepStep(st.lo.Load()-1, st.hi.Load()-1, st.run.Load(), page, full)
	st.run.Store(n)
	return sweeping, n < 0
}

// noteFetch records the pages of the block that location m's fault
// brings, faulted and prefetched, for the next fault's sweep.
func (o *Mover) noteFetch(m core.Device, pages core.PageMask) {
	first, last := pages.NextSet(0), pages.LastSet()
	if l := m.Slot(); l < len(o.R.sweeps) && first >= 0 {
		o.R.sweeps[l].lo.Store(int64(o.PageAddr(first)-o.R.Start)>>core.PageShift + 1)
		o.R.sweeps[l].hi.Store(int64(o.PageAddr(last)-o.R.Start)>>core.PageShift + 1)
	}
}

// expand asks the range's prefetch policy which other pages to bring to
// file m with the faulted ones, keeping those the view maps from m.
func (o *Mover) expand(m core.Device, faulted core.PageMask, t *Target) core.PageMask {
	b := o.B
	e := o.eng()
	ctx := o.Ctx
	if ctx == nil {
		ctx = &policy.PrefetchContext{}
	}
	full := !e.RoomFor(m, policy.FullRoomBlocks*core.BlockSize)
	elsewhere, here := b.Resident.Elsewhere(m), b.Resident[m.Slot()]
	*ctx = policy.PrefetchContext{Block: b.Ref, Processor: m, Now: e.Now(), Pages: b.Pages, Faulted: faulted, ResidentOnDest: here,
		Populated: !elsewhere.Empty() || !here.Empty(), Elsewhere: elsewhere, Full: full, SourceLarge: o.largeElsewhere(m)}
	ctx.Sweep, ctx.Descending = o.sweep(m, faulted.NextSet(0), full)
	if adv := b.Advice; adv != nil {
		p := faulted.NextSet(0)
		ctx.DestIsPreferred = adv.Preferred[p].Is(m)
	}
	if th := e.pol.Thrashing; th != nil && b.thrash != nil {
		th.Avoid(b.thrash, b.Pages, e.Now(), &ctx.Thrashing)
	}
	extra, brought := policy.Expanded(o.R.Prefetch, ctx)
	o.noteFetch(m, brought)
	if policy.ReadsAhead(o.R.Prefetch, ctx, brought) {
		o.readAhead = 1
		if ctx.Descending {
			o.readAhead = -1
		}
	}
	extra.And(&t.Mapped)
	return extra
}
