package server

import (
	"time"

	"github.com/softuvm/softuvm/internal/core"
)

// thrashState is one block's detector, created at its first fault-driven
// migration. Times are microseconds since the server started (0: never).
type thrashState struct {
	last       [core.PagesPerBlock]int64
	count      [core.PagesPerBlock]uint8
	throttles  [core.PagesPerBlock]uint8
	pinnedTill [core.PagesPerBlock]int64
	pinnedMax  int64 // the latest pinnedTill: no page is pinned after it
}

// thrashAction is what the detector says to do with a fault.
type thrashAction int

const (
	thrashNone     thrashAction = iota
	thrashThrottle              // make the faulting processor wait a nap
	thrashPinned                // the page is pinned in host memory
)

// nowMicros is the server's clock for thrashing, never 0.
func (s *Server) nowMicros() int64 { return time.Since(s.started).Microseconds() + 1 }

// recordMigration notes fault-driven migrations of pages.
func (o *mover) recordMigration(pages core.PageMask, now int64) {
	spec := &o.sess.srv.cfg.Thrashing
	if !spec.Enabled {
		return
	}
	b := o.b
	if b.thrash == nil {
		b.thrash = &thrashState{}
	}
	th := b.thrash
	lapse := time.Duration(spec.Lapse).Microseconds()
	for p := pages.NextSet(0); p >= 0; p = pages.NextSet(p + 1) {
		if th.last[p] != 0 && now-th.last[p] <= lapse {
			if th.count[p] < 255 {
				th.count[p]++
			}
		} else {
			th.count[p] = 1
		}
		th.last[p] = now
	}
}

// pinnedAt reports whether page p is pinned in host memory.
func (o *mover) pinnedAt(p int, now int64) bool {
	th := o.b.thrash
	return th != nil && th.pinnedTill[p] > now
}

// checkThrashing decides, before a fault by processor l on page p moves
// it, whether the page thrashes. Pinning a page counts and returns
// thrashPinned.
func (o *mover) checkThrashing(l core.Location, p int, now int64) thrashAction {
	spec := &o.sess.srv.cfg.Thrashing
	th := o.b.thrash
	if !spec.Enabled || th == nil {
		return thrashNone
	}
	if th.pinnedTill[p] > now {
		return thrashPinned
	}
	if now-th.last[p] > time.Duration(spec.Epoch).Microseconds() {
		th.throttles[p] = 0
	}
	if int(th.count[p]) < spec.Threshold || now-th.last[p] > time.Duration(spec.Lapse).Microseconds() {
		return thrashNone
	}
	th.count[p] = 0
	th.throttles[p]++
	pref := core.HostLoc
	if adv := o.b.advice; adv != nil && adv.preferred[p] != 0 {
		pref = core.Location(adv.preferred[p] - 1)
	}
	if int(th.throttles[p]) >= spec.PinThreshold && pref == core.HostLoc {
		th.throttles[p] = 0
		th.pinnedTill[p] = now + time.Duration(spec.Pin).Microseconds()
		th.pinnedMax = max(th.pinnedMax, th.pinnedTill[p])
		o.r.stats.Pins[l].Add(1)
		o.sess.srv.Counters.Pins[l].Add(1)
		// Devices map the page in host memory now, and their own again
		// when the pin ends.
		o.sess.enqueueRemap(o.r, o.blockIndex())
		o.sess.scheduleRemap(o.r, o.blockIndex(), time.Duration(spec.Pin)+time.Millisecond)
		return thrashPinned
	}
	o.r.stats.Throttles[l].Add(1)
	o.sess.srv.Counters.Throttles[l].Add(1)
	return thrashThrottle
}
