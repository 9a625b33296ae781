package server

import (
	"time"

	"github.com/softuvm/softuvm/policy"

	"github.com/softuvm/softuvm/internal/core"
)

// thrashAction is what the detector says to do with a fault.
type thrashAction int

const (
	thrashNone     thrashAction = iota
	thrashThrottle              // make the faulting processor wait a nap
	thrashPinned                // the page is pinned in host memory
)

// nowMicros is the server's clock for thrashing, never 0.
func (s *Server) nowMicros() int64 { return time.Since(s.started).Microseconds() + 1 }

// clock is the server's clock as policies see it.
func clock(micros int64) policy.Clock { return policy.Clock(micros) * policy.Clock(time.Microsecond) }

// recordMigration tells the thrashing policy about fault-driven
// migrations of pages, making the block's state on the first.
func (o *mover) recordMigration(pages core.PageMask, now int64) {
	th := o.sess.srv.thrashing
	if th == nil {
		return
	}
	if o.b.thrash == nil {
		o.b.thrash = th.NewState()
	}
	th.Migrated(o.b.thrash, pages, clock(now))
}

// pinnedAt reports whether page p is pinned in host memory.
func (o *mover) pinnedAt(p int, now int64) bool {
	return o.b.thrash != nil && o.sess.srv.thrashing.Pinned(o.b.thrash, p, clock(now))
}

// checkThrashing asks the thrashing policy, before a fault by processor l
// on page p moves it, whether the page thrashes, and carries out a new
// pin: the statistics, and the remaps that point devices at the host copy
// now and back at their own when the pin ends.
func (o *mover) checkThrashing(l core.Device, p int, now int64) thrashAction {
	th := o.sess.srv.thrashing
	if th == nil || o.b.thrash == nil {
		return thrashNone
	}
	hostPreferred := true
	if pref, ok := o.b.preferredAt(p); ok {
		hostPreferred = pref == core.CPU
	}
	switch th.Check(o.b.thrash, policy.ThrashFault{Processor: l, Page: p, HostPreferred: hostPreferred, Now: clock(now)}) {
	case policy.ThrashPinned:
		return thrashPinned
	case policy.ThrashPin:
		o.r.stats.Pins[l.Slot()].Add(1)
		o.sess.enqueueRemap(o.r, o.blockIndex())
		o.sess.scheduleRemap(o.r, o.blockIndex(), th.PinDuration()+time.Millisecond)
		return thrashPinned
	case policy.ThrashThrottle:
		o.r.stats.Throttles[l.Slot()].Add(1)
		return thrashThrottle
	}
	return thrashNone
}
