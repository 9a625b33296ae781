package uvm

import (
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Thrashing: a page that processors take from each other faster than they
// can use it. As NVIDIA's driver does (uvm_perf_thrashing.c), a page
// whose fault-driven migrations come less than Lapse apart Threshold times
// in a row is thrashing; the processor faulting on it then is throttled
// (its fault waits Nap while the page stays where it is); after
// PinThreshold throttles the page is pinned in host memory for Pin, and
// the devices map it there remotely instead of taking it. A page whose
// preferred location is a device is never pinned: the preferred location
// overrides thrashing resolution, as cuMemAdvise documents.

// ThrashingSpec configures thrashing detection. The zero value is
// disabled; DefaultThrashing is NVIDIA's defaults.
type ThrashingSpec struct {
	Enabled      bool     `json:"enabled"`
	Threshold    int      `json:"threshold"`     // consecutive close migrations that make a page thrash
	Lapse        Duration `json:"lapse"`         // how close two migrations must be
	Nap          Duration `json:"nap"`           // how long a throttled fault waits
	PinThreshold int      `json:"pin_threshold"` // throttles of a page before it is pinned
	Pin          Duration `json:"pin"`           // how long a pin lasts
	Epoch        Duration `json:"epoch"`         // quiet time after which a page's throttles are forgotten
}

// DefaultThrashing is the default of NVIDIA's driver: threshold 3, lapse
// 500 us, nap one lapse, pin threshold 10, pin 300 lapses, epoch 2000
// lapses.
var DefaultThrashing = ThrashingSpec{
	Enabled: true, Threshold: 3, Lapse: Duration(500 * time.Microsecond), Nap: Duration(500 * time.Microsecond),
	PinThreshold: 10, Pin: Duration(150 * time.Millisecond), Epoch: Duration(time.Second),
}

func (t ThrashingSpec) String() string {
	if !t.Enabled {
		return "off"
	}
	return fmt.Sprintf("threshold=%d,lapse=%v,nap=%v,pin-threshold=%d,pin=%v,epoch=%v",
		t.Threshold, time.Duration(t.Lapse), time.Duration(t.Nap), t.PinThreshold, time.Duration(t.Pin), time.Duration(t.Epoch))
}

// ParseThrashingSpec reads "off", "on" (the defaults), or a comma list of
// key=value settings over the defaults: threshold, lapse, nap,
// pin-threshold, pin, epoch (durations as Go writes them: 500us, 2ms).
func ParseThrashingSpec(s string) (ThrashingSpec, error) {
	switch s {
	case "off", "none":
		return ThrashingSpec{}, nil
	case "", "on", "default":
		return DefaultThrashing, nil
	}
	t := DefaultThrashing
	for _, kv := range strings.Split(s, ",") {
		k, v, ok := strings.Cut(kv, "=")
		if !ok {
			return t, fmt.Errorf("%w: thrashing setting %q: want key=value (threshold, lapse, nap, pin-threshold, pin, epoch), on or off", ErrInvalidValue, kv)
		}
		var err error
		switch k {
		case "threshold":
			t.Threshold, err = strconv.Atoi(v)
		case "pin-threshold":
			t.PinThreshold, err = strconv.Atoi(v)
		case "lapse", "nap", "pin", "epoch":
			var d time.Duration
			if d, err = time.ParseDuration(v); err == nil {
				*t.duration(k) = Duration(d)
			}
		default:
			return t, fmt.Errorf("%w: thrashing setting %q: unknown key %q (want threshold, lapse, nap, pin-threshold, pin or epoch)", ErrInvalidValue, kv, k)
		}
		if err != nil {
			return t, fmt.Errorf("%w: thrashing setting %q: %v", ErrInvalidValue, kv, err)
		}
	}
	return t, t.Validate()
}

// duration returns the setting a duration key names.
func (t *ThrashingSpec) duration(key string) *Duration {
	switch key {
	case "lapse":
		return &t.Lapse
	case "nap":
		return &t.Nap
	case "pin":
		return &t.Pin
	}
	return &t.Epoch
}

// Validate checks the settings of an enabled spec.
func (t ThrashingSpec) Validate() error {
	if !t.Enabled {
		return nil
	}
	switch {
	case t.Threshold < 2 || t.Threshold > 255:
		return fmt.Errorf("%w: thrashing threshold %d: want 2 to 255 migrations", ErrInvalidValue, t.Threshold)
	case t.PinThreshold < 1 || t.PinThreshold > 255:
		return fmt.Errorf("%w: thrashing pin threshold %d: want 1 to 255 throttles", ErrInvalidValue, t.PinThreshold)
	case t.Lapse <= 0 || time.Duration(t.Lapse) > time.Second:
		return fmt.Errorf("%w: thrashing lapse %v: want more than 0 and at most 1s", ErrInvalidValue, time.Duration(t.Lapse))
	case t.Nap <= 0 || time.Duration(t.Nap) > time.Second:
		return fmt.Errorf("%w: thrashing nap %v: want more than 0 and at most 1s", ErrInvalidValue, time.Duration(t.Nap))
	case t.Pin <= 0 || time.Duration(t.Pin) > time.Hour:
		return fmt.Errorf("%w: thrashing pin %v: want more than 0 and at most 1h", ErrInvalidValue, time.Duration(t.Pin))
	case t.Epoch < t.Lapse || time.Duration(t.Epoch) > time.Hour:
		return fmt.Errorf("%w: thrashing epoch %v: want at least the lapse (%v) and at most 1h", ErrInvalidValue, time.Duration(t.Epoch), time.Duration(t.Lapse))
	}
	return nil
}

// thrashState is one block's detector, created at its first fault-driven
// migration. Times are microseconds since the server started (0: never).
type thrashState struct {
	last       [PagesPerBlock]int64
	count      [PagesPerBlock]uint8
	throttles  [PagesPerBlock]uint8
	pinnedTill [PagesPerBlock]int64
	pinnedMax  int64 // the latest pinnedTill: no page is pinned after it
}

// nowMicros is the server's clock for thrashing, never 0.
func (s *Server) nowMicros() int64 { return time.Since(s.started).Microseconds() + 1 }

// recordMigration notes fault-driven migrations of pages.
func (o *mover) recordMigration(pages PageMask, now int64) {
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

// thrashAction is what the detector says to do with a fault.
type thrashAction int

const (
	thrashNone     thrashAction = iota
	thrashThrottle              // make the faulting processor wait a nap
	thrashPinned                // the page is pinned in host memory
)

// checkThrashing decides, before a fault by processor l on page p moves
// it, whether the page thrashes. Pinning a page counts and returns
// thrashPinned.
func (o *mover) checkThrashing(l location, p int, now int64) thrashAction {
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
	pref := hostLoc
	if adv := o.b.advice; adv != nil && adv.preferred[p] != 0 {
		pref = location(adv.preferred[p] - 1)
	}
	if int(th.throttles[p]) >= spec.PinThreshold && pref == hostLoc {
		th.throttles[p] = 0
		th.pinnedTill[p] = now + time.Duration(spec.Pin).Microseconds()
		th.pinnedMax = max(th.pinnedMax, th.pinnedTill[p])
		o.r.stats.pins[l].Add(1)
		o.sess.srv.stats.pins[l].Add(1)
		// Devices map the page in host memory now, and their own again
		// when the pin ends.
		o.sess.enqueueRemap(o.r, o.blockIndex())
		o.sess.scheduleRemap(o.r, o.blockIndex(), time.Duration(spec.Pin)+time.Millisecond)
		return thrashPinned
	}
	o.r.stats.throttles[l].Add(1)
	o.sess.srv.stats.throttles[l].Add(1)
	return thrashThrottle
}
