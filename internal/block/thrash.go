package block

import (
	"time"

	"github.com/softuvm/softuvm/internal/core"
	"github.com/softuvm/softuvm/policy"
)

// thrashAction is what the detector says to do with a fault.
type thrashAction int

const (
	thrashNone     thrashAction = iota
	thrashThrottle              // make the faulting processor wait a nap
	thrashPinned                // the page is pinned in host memory
)

// PinnedAt reports whether page p is pinned in host memory.
func (o *Mover) PinnedAt(p int) bool {
	th := o.eng().pol.Thrashing
	return o.B.thrash != nil && th != nil && th.Pinned(o.B.thrash, p, o.eng().Now())
}

// checkThrashing asks the thrashing policy, before a fault by processor l
// on page p moves it, whether the page thrashes, and reports a new pin
// (EvPinned: the statistics, and the remaps that point devices at the
// host copy now and back at their own when the pin ends) or a throttle.
func (o *Mover) checkThrashing(l core.Device, p int) thrashAction {
	th := o.eng().pol.Thrashing
	if th == nil || o.B.thrash == nil {
		return thrashNone
	}
	hostPreferred := true
	if pref, ok := o.B.PreferredAt(p); ok {
		hostPreferred = pref == core.CPU
	}
	switch th.Check(o.B.thrash, policy.ThrashFault{Processor: l, Page: p, HostPreferred: hostPreferred, Now: o.eng().Now()}) {
	case policy.ThrashPinned:
		return thrashPinned
	case policy.ThrashPin:
		o.emit(Event{Kind: EvPinned, Processor: l, First: p, Until: th.PinDuration() + time.Millisecond})
		return thrashPinned
	case policy.ThrashThrottle:
		o.emit(Event{Kind: EvThrottled, Processor: l, First: p, Duration: th.Nap()})
		return thrashThrottle
	}
	return thrashNone
}

// Pinned reports whether the thrashing policy has page p of the block
// pinned in host memory now (the lab: a device then reads the host's
// copy).
func (b *Block) Pinned(e *Engine, p int) bool {
	th := e.pol.Thrashing
	return b.thrash != nil && th != nil && th.Pinned(b.thrash, p, e.Now())
}

// CounterMovable asks the access migration policy whether page p
// migrates to location l on its access counts. Only managed memory ever
// does. The block's lock is held.
func (o *Mover) CounterMovable(l core.Device, p int) bool {
	if o.R.Kind != core.KindManaged {
		return false
	}
	m, known := o.MapsAt(l, p)
	ap := policy.AccessPage{
		Processor: l, Block: o.B.Ref, Page: p,
		Resident: o.B.Resident[l.Slot()].Test(p),
		Remote:   known && m != l,
		Pinned:   o.PinnedAt(p),
		Now:      o.eng().Now(),
	}
	if pref, ok := o.B.PreferredAt(p); ok && pref != l {
		ap.PreferredElsewhere = true
	}
	return o.eng().pol.AccessMigration.Movable(ap)
}
