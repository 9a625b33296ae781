package uvm

import (
	"fmt"
	"runtime"
	"sync"
	"weak"
)

// MemRangeGetAttributes queries several attributes of [addr, addr+n) at
// once, as cudaMemRangeGetAttributes: one value per attribute asked, in
// order, of the type RangeAttribute gives it (a bool for AttrReadMostly,
// a Device for AttrPreferredLocation and AttrLastPrefetchLocation, a
// []Device for AttrAccessedBy), all from one look at the range. The range
// must lie in one managed allocation; an attribute may be asked twice.
func (s *Session) MemRangeGetAttributes(addr uintptr, n int64, attrs []RangeAttr) ([]any, error) {
	if len(attrs) == 0 {
		return nil, fmt.Errorf("%w: range attributes of %#x+%d: no attribute asked", ErrInvalidValue, addr, n)
	}
	for i, a := range attrs {
		if err := checkRangeAttr(a); err != nil {
			return nil, fmt.Errorf("%w: range attributes of %#x+%d: attribute %d is %d: %v", ErrInvalidValue, addr, n, i, int(a), err)
		}
	}
	all, err := s.RangeAttributes(addr, n)
	if err != nil {
		return nil, err
	}
	out := make([]any, len(attrs))
	for i, a := range attrs {
		out[i] = rangeAttrValue(all, a)
	}
	return out, nil
}

// PointerGetAttributesOf queries several attributes of ptr at once, as
// cuPointerGetAttributes: one value per attribute asked, in order, of the
// type each PointerAttr names. As there, a pointer this runtime does not
// know is no error: its memory type is MemoryUnregistered, its device
// InvalidDevice, and every other value zero or false. An attribute this
// runtime does not know is an error (ErrInvalidValue).
func (s *Session) PointerGetAttributesOf(ptr uintptr, attrs []PointerAttr) ([]any, error) {
	if len(attrs) == 0 {
		return nil, fmt.Errorf("%w: pointer attributes of %#x: no attribute asked", ErrInvalidValue, ptr)
	}
	for i, a := range attrs {
		if a < PointerAttrMemoryType || a > PointerAttrBufferID {
			return nil, fmt.Errorf("%w: pointer attributes of %#x: attribute %d is %d: want one from %v (%d) to %v (%d)",
				ErrInvalidValue, ptr, i, int(a), PointerAttrMemoryType, int(PointerAttrMemoryType), PointerAttrBufferID, int(PointerAttrBufferID))
		}
	}
	pa, err := s.PointerAttributes(ptr)
	syncMemops := false
	if err != nil {
		pa = PointerAttributes{Type: MemoryUnregistered, Device: InvalidDevice}
	} else if a, _ := s.allocationHolding(ptr); a != nil {
		syncMemops = a.syncMemops()
	}
	out := make([]any, len(attrs))
	for i, a := range attrs {
		switch a {
		case PointerAttrMemoryType:
			out[i] = pa.Type
		case PointerAttrDevice:
			out[i] = pa.Device
		case PointerAttrDevicePointer:
			out[i] = pa.DevicePointer
		case PointerAttrHostPointer:
			out[i] = pa.HostPointer
		case PointerAttrIsManaged:
			out[i] = pa.IsManaged
		case PointerAttrRangeStart:
			out[i] = pa.RangeStart
		case PointerAttrRangeSize:
			out[i] = pa.RangeSize
		case PointerAttrSyncMemops:
			out[i] = syncMemops
		case PointerAttrBufferID:
			out[i] = pa.BufferID
		}
	}
	return out, nil
}

// PointerSetAttribute sets an attribute of the allocation ptr falls in,
// as cuPointerSetAttribute. The only attribute that may be set is
// PointerAttrSyncMemops, to a bool, recorded for the allocation and read
// back by PointerGetAttributesOf until it is freed. In CUDA it makes
// synchronous memory operations on the allocation (Memcpy, Memset)
// synchronize fully, which they may otherwise not do for device memory;
// in softuvm every synchronous copy or set touching any allocation is
// fully synchronous already (it has happened, in the calling process,
// when it returns), so setting it guarantees what already holds, and
// unsetting it takes nothing away. A pointer that no allocation of this
// session holds is ErrInvalidDevicePointer.
func (s *Session) PointerSetAttribute(ptr uintptr, attr PointerAttr, value any) error {
	if attr != PointerAttrSyncMemops {
		return fmt.Errorf("%w: set pointer attribute %v of %#x: only %v may be set", ErrInvalidValue, attr, ptr, PointerAttrSyncMemops)
	}
	on, ok := value.(bool)
	if !ok {
		return fmt.Errorf("%w: set pointer attribute %v of %#x to %v (a %T): want a bool", ErrInvalidValue, attr, ptr, value, value)
	}
	a, _ := s.allocationHolding(ptr)
	if a == nil {
		return fmt.Errorf("%w: set pointer attribute %v of %#x: no allocation of this session holds it", ErrInvalidDevicePointer, attr, ptr)
	}
	a.setSyncMemops(on)
	return nil
}

// MemGetAddressRange returns the start and size of the allocation holding
// ptr, as cuMemGetAddressRange: managed, device or pinned host memory, or
// memory registered with HostRegister (at the program's own address or
// at its device pointer). The size is the size asked for; a pointer past
// it, or in no allocation, is ErrInvalidValue.
func (s *Session) MemGetAddressRange(ptr uintptr) (uintptr, int64, error) {
	a, base := s.allocationHolding(ptr)
	if a == nil {
		return 0, 0, fmt.Errorf("%w: address range of %#x: no allocation of this session holds it (managed, device or pinned host memory)", ErrInvalidValue, ptr)
	}
	return base, a.size, nil
}

// allocationHolding returns the allocation with a byte at ptr, and where
// it starts as seen from ptr: the program's own address for registered
// memory reached there, the allocation's address otherwise.
func (s *Session) allocationHolding(ptr uintptr) (*Allocation, uintptr) {
	if reg := s.registeredAt(ptr); reg != nil {
		if ptr-reg.host < uintptr(reg.alloc.size) {
			return reg.alloc, reg.host
		}
		return nil, 0
	}
	a := s.lookup(ptr)
	if a == nil || ptr-a.addr >= uintptr(a.size) {
		return nil, 0
	}
	return a, a.addr
}

// syncMemopsSet holds the allocations whose PointerAttrSyncMemops is set,
// weakly: an Allocation the program no longer holds leaves the set when
// it is collected.
var syncMemopsSet sync.Map // weak.Pointer[Allocation] -> struct{}

func (a *Allocation) syncMemops() bool {
	_, ok := syncMemopsSet.Load(weak.Make(a))
	return ok
}

func (a *Allocation) setSyncMemops(on bool) {
	key := weak.Make(a)
	if !on {
		syncMemopsSet.Delete(key)
		return
	}
	if _, had := syncMemopsSet.LoadOrStore(key, struct{}{}); !had {
		runtime.AddCleanup(a, func(k weak.Pointer[Allocation]) { syncMemopsSet.Delete(k) }, key)
	}
}
