package core

import (
	"fmt"
	"strconv"
)

// Advice is a cuMemAdvise hint about how a range will be used.
type Advice int

const (
	// AdviseSetReadMostly: read faults make a read-only copy of the page
	// at the reader (write-protected everywhere); a write collapses every
	// other copy. The device argument is ignored.
	AdviseSetReadMostly Advice = iota + 1
	// AdviseUnsetReadMostly collapses the copies into one: at the
	// preferred location if it holds one, else at one of the holders.
	AdviseUnsetReadMostly
	// AdviseSetPreferredLocation makes the device (or CPU) the pages'
	// home: a fault from a processor that can map it there maps it
	// remotely (and brings it home first if it is elsewhere) instead of
	// migrating it to the faulting processor. Devices can map host memory
	// and each other's; the CPU cannot map device memory, so its faults
	// migrate as before.
	AdviseSetPreferredLocation
	AdviseUnsetPreferredLocation
	// AdviseSetAccessedBy makes a device keep a mapping of the pages
	// wherever they live: its view maps the owner's file, so it does not
	// fault on them. For the CPU it is recorded and changes nothing: the
	// host always maps host memory and takes faults for device pages.
	AdviseSetAccessedBy
	AdviseUnsetAccessedBy
)

// ParseAdvice reads an advice's name as String writes it.
func ParseAdvice(s string) (Advice, error) {
	for a := AdviseSetReadMostly; a <= AdviseUnsetAccessedBy; a++ {
		if a.String() == s {
			return a, nil
		}
	}
	return 0, fmt.Errorf("%w: advice %q: want set-read-mostly, unset-read-mostly, set-preferred-location, unset-preferred-location, set-accessed-by or unset-accessed-by", ErrInvalidValue, s)
}

func (a Advice) String() string {
	switch a {
	case AdviseSetReadMostly:
		return "set-read-mostly"
	case AdviseUnsetReadMostly:
		return "unset-read-mostly"
	case AdviseSetPreferredLocation:
		return "set-preferred-location"
	case AdviseUnsetPreferredLocation:
		return "unset-preferred-location"
	case AdviseSetAccessedBy:
		return "set-accessed-by"
	case AdviseUnsetAccessedBy:
		return "unset-accessed-by"
	}
	return "advice(" + strconv.Itoa(int(a)) + ")"
}

// usesDevice reports whether the advice's device argument matters.
func (a Advice) UsesDevice() bool {
	return a != AdviseSetReadMostly && a != AdviseUnsetReadMostly
}
