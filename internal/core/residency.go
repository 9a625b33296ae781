package core

import (
	"fmt"
)

// rangeKind is what sort of memory a range is.
type RangeKind uint8

const (
	KindManaged    RangeKind = iota // MallocManaged: migrates on demand
	KindPinnedHost                  // HostAlloc, HostRegister: host memory devices map
	KindDevice                      // Malloc: device memory, only in its arena
)

func (k RangeKind) String() string {
	switch k {
	case KindManaged:
		return "managed memory"
	case KindPinnedHost:
		return "pinned host memory"
	case KindDevice:
		return "device memory"
	}
	return fmt.Sprintf("memory kind %d", uint8(k))
}
