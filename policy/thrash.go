package policy

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/softuvm/softuvm/internal/core"
)

// ThrashingSpec configures thrashing detection. The zero value is
// disabled; DefaultThrashing is NVIDIA's defaults.
type ThrashingSpec struct {
	Enabled      bool          `json:"enabled"`
	Threshold    int           `json:"threshold"`     // consecutive close migrations that make a page thrash
	Lapse        core.Duration `json:"lapse"`         // how close two migrations must be
	Nap          core.Duration `json:"nap"`           // how long a throttled fault waits
	PinThreshold int           `json:"pin_threshold"` // throttles of a page before it is pinned
	Pin          core.Duration `json:"pin"`           // how long a pin lasts
	Epoch        core.Duration `json:"epoch"`         // quiet time after which a page's throttles are forgotten
}

// DefaultThrashing is the default of NVIDIA's driver: threshold 3, lapse
// 500 us, nap one lapse, pin threshold 10, pin 300 lapses, epoch 2000
// lapses.
var DefaultThrashing = ThrashingSpec{
	Enabled: true, Threshold: 3, Lapse: core.Duration(500 * time.Microsecond), Nap: core.Duration(500 * time.Microsecond),
	PinThreshold: 10, Pin: core.Duration(150 * time.Millisecond), Epoch: core.Duration(time.Second),
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
			return t, fmt.Errorf("%w: thrashing setting %q: want key=value (threshold, lapse, nap, pin-threshold, pin, epoch), on or off", core.ErrInvalidValue, kv)
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
				*t.duration(k) = core.Duration(d)
			}
		default:
			return t, fmt.Errorf("%w: thrashing setting %q: unknown key %q (want threshold, lapse, nap, pin-threshold, pin or epoch)", core.ErrInvalidValue, kv, k)
		}
		if err != nil {
			return t, fmt.Errorf("%w: thrashing setting %q: %v", core.ErrInvalidValue, kv, err)
		}
	}
	return t, t.Validate()
}

func (t ThrashingSpec) String() string {
	if !t.Enabled {
		return "off"
	}
	return fmt.Sprintf("threshold=%d,lapse=%v,nap=%v,pin-threshold=%d,pin=%v,epoch=%v",
		t.Threshold, time.Duration(t.Lapse), time.Duration(t.Nap), t.PinThreshold, time.Duration(t.Pin), time.Duration(t.Epoch))
}

// duration returns the setting a duration key names.
func (t *ThrashingSpec) duration(key string) *core.Duration {
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
		return fmt.Errorf("%w: thrashing threshold %d: want 2 to 255 migrations", core.ErrInvalidValue, t.Threshold)
	case t.PinThreshold < 1 || t.PinThreshold > 255:
		return fmt.Errorf("%w: thrashing pin threshold %d: want 1 to 255 throttles", core.ErrInvalidValue, t.PinThreshold)
	case t.Lapse <= 0 || time.Duration(t.Lapse) > time.Second:
		return fmt.Errorf("%w: thrashing lapse %v: want more than 0 and at most 1s", core.ErrInvalidValue, time.Duration(t.Lapse))
	case t.Nap <= 0 || time.Duration(t.Nap) > time.Second:
		return fmt.Errorf("%w: thrashing nap %v: want more than 0 and at most 1s", core.ErrInvalidValue, time.Duration(t.Nap))
	case t.Pin <= 0 || time.Duration(t.Pin) > time.Hour:
		return fmt.Errorf("%w: thrashing pin %v: want more than 0 and at most 1h", core.ErrInvalidValue, time.Duration(t.Pin))
	case t.Epoch < t.Lapse || time.Duration(t.Epoch) > time.Hour:
		return fmt.Errorf("%w: thrashing epoch %v: want at least the lapse (%v) and at most 1h", core.ErrInvalidValue, time.Duration(t.Epoch), time.Duration(t.Lapse))
	}
	return nil
}
