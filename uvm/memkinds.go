package uvm

import (
	"fmt"
	"sort"

	"github.com/softuvm/softuvm/devmem"
	"github.com/softuvm/softuvm/internal/config"
	"github.com/softuvm/softuvm/internal/core"
	"github.com/softuvm/softuvm/internal/wire"
)

// HostAlloc flags, as cudaHostAllocDefault, cudaHostAllocPortable,
// cudaHostAllocMapped and cudaHostAllocWriteCombined.
const (
	HostAllocDefault       = 0x0
	HostAllocPortable      = 0x1
	HostAllocMapped        = 0x2
	HostAllocWriteCombined = 0x4
)

// HostRegister flags, as cudaHostRegisterDefault, cudaHostRegisterPortable
// and cudaHostRegisterMapped.
const (
	HostRegisterDefault  = 0x0
	HostRegisterPortable = 0x1
	HostRegisterMapped   = 0x2
)

func checkSize(what string, size int64) error {
	if size <= 0 {
		return fmt.Errorf("%w: %s of %d bytes: want at least 1 byte", ErrInvalidValue, what, size)
	}
	if size > core.MaxAllocation {
		return fmt.Errorf("%w: %s of %d bytes (%s): the limit is %s", ErrInvalidValue, what, size, FormatSize(size), FormatSize(core.MaxAllocation))
	}
	return nil
}

// registration is host memory the program registered: its pages alias a
// pinned allocation's, which devices map.
type registration struct {
	host  uintptr
	alloc *Allocation
}

// Malloc allocates device memory in the default session.
func Malloc(d Device, size int64) (*Allocation, error) {
	s, err := Default()
	if err != nil {
		return nil, err
	}
	return s.Malloc(d, size)
}

// HostAlloc allocates pinned host memory in the default session.
func HostAlloc(size int64, flags uint32) (*Allocation, error) {
	s, err := Default()
	if err != nil {
		return nil, err
	}
	return s.HostAlloc(size, flags)
}

// Malloc allocates size bytes of device memory on device d, as
// cudaMalloc: the capacity is taken from d's arena now (managed pages are
// evicted to make room) and fails with ErrMemoryAllocation if it cannot
// be. Pages are zero until written. Free releases it.
func (s *Session) Malloc(d Device, size int64) (*Allocation, error) {
	if err := s.checkDevice(d, "malloc on"); err != nil {
		return nil, err
	}
	if err := checkSize("device allocation", size); err != nil {
		return nil, err
	}
	return s.allocate(size, wire.AllocRequest{Size: uint64(size), Kind: core.KindDevice, Device: int32(d)}, nil)
}

// HostAlloc allocates size bytes of pinned host memory, as cudaHostAlloc,
// zero-filled. FreeHost releases it.
func (s *Session) HostAlloc(size int64, flags uint32) (*Allocation, error) {
	const known = HostAllocPortable | HostAllocMapped | HostAllocWriteCombined
	if flags&^known != 0 {
		return nil, fmt.Errorf("%w: host allocation flags %#x: want a combination of HostAllocPortable (%#x), HostAllocMapped (%#x) and HostAllocWriteCombined (%#x)",
			ErrInvalidValue, flags, HostAllocPortable, HostAllocMapped, HostAllocWriteCombined)
	}
	if err := checkSize("host allocation", size); err != nil {
		return nil, err
	}
	a, err := s.allocate(size, wire.AllocRequest{Size: uint64(size), Flags: flags, Kind: core.KindPinnedHost}, func(addr uintptr, length int64) error {
		// Pinned memory exists from the start, as cudaHostAlloc's does.
		if err := s.host.Allocate(int64(addr), length); err != nil {
			return fmt.Errorf("%w: pin %s of host memory: %v", ErrMemoryAllocation, FormatSize(length), err)
		}
		return nil
	})
	if err == nil {
		a.flags = flags
	}
	return a, err
}

// FreeHost frees pinned host memory from HostAlloc, as cudaFreeHost,
// after the work of every stream, as Free.
func (s *Session) FreeHost(addr uintptr) error {
	a, err := s.allocationAt(addr, "free host")
	if err != nil {
		return err
	}
	if a.kind != core.KindPinnedHost || a.hostAlias != 0 {
		return fmt.Errorf("%w: free host %#x: it is %s, not memory from HostAlloc", ErrInvalidValue, addr, a.kindName())
	}
	s.quiesceAll()
	return s.release(a)
}

// kindName says what an allocation is, for messages.
func (a *Allocation) kindName() string {
	if a.hostAlias != 0 {
		return "registered host memory"
	}
	if a.kind == core.KindDevice {
		return fmt.Sprintf("device memory of device %d", a.device)
	}
	return a.kind.String()
}

// HostGetDevicePointer returns the address at which kernels reach pinned
// host memory, as cudaHostGetDevicePointer: the same pointer for
// HostAlloc memory, the registered copy's address for HostRegister
// memory. flags must be 0.
func (s *Session) HostGetDevicePointer(host uintptr, flags uint32) (uintptr, error) {
	if flags != 0 {
		return 0, fmt.Errorf("%w: host device pointer flags %#x: want 0", ErrInvalidValue, flags)
	}
	if reg := s.registeredAt(host); reg != nil {
		return reg.alloc.addr + (host - reg.host), nil
	}
	a := s.lookup(host)
	if a == nil || a.kind != core.KindPinnedHost {
		what := "not memory of this runtime"
		if a != nil {
			what = a.kindName()
		}
		return 0, fmt.Errorf("%w: device pointer of %#x: it is %s; want memory from HostAlloc or HostRegister", ErrInvalidValue, host, what)
	}
	return host, nil
}

func (r registration) end() uintptr { return r.host + r.alloc.length }

// registeredAt returns the registration holding addr, or nil.
func (s *Session) registeredAt(addr uintptr) *registration {
	s.allocMu.RLock()
	defer s.allocMu.RUnlock()
	i := sort.Search(len(s.registered), func(i int) bool { return s.registered[i].end() > addr })
	if i < len(s.registered) && s.registered[i].host <= addr {
		return &s.registered[i]
	}
	return nil
}

// HostRegister pins existing host memory, as cudaHostRegister, so that
// kernels reach it (at the address HostGetDevicePointer gives): its pages
// are moved into a pinned allocation that the range then maps, contents
// kept. ptr and size must be multiples of the page size (4096), as
// cuMemHostRegister first required, and the memory must be mapped memory
// of the program's own (mmap, or the C allocator's), not the Go heap,
// which the Go runtime may give back to the kernel behind the mapping's
// back. HostUnregister undoes it.
func (s *Session) HostRegister(ptr uintptr, size int64, flags uint32) error {
	const known = HostRegisterPortable | HostRegisterMapped
	if flags&^known != 0 {
		return fmt.Errorf("%w: host register flags %#x: want a combination of HostRegisterPortable (%#x) and HostRegisterMapped (%#x)", ErrInvalidValue, flags, HostRegisterPortable, HostRegisterMapped)
	}
	if err := checkSize("host register", size); err != nil {
		return err
	}
	if ptr%PageSize != 0 || size%PageSize != 0 {
		return fmt.Errorf("%w: host register %#x+%d: address and size must be multiples of the page size (%d)", ErrInvalidValue, ptr, size, PageSize)
	}
	if ptr+uintptr(size) > config.ManagedWindowStart && ptr < config.ManagedWindowStart+config.ManagedWindowSize {
		return fmt.Errorf("%w: host register %#x+%d: the range is in the runtime's own window; it is already managed, pinned or device memory", ErrInvalidValue, ptr, size)
	}
	if !devmem.IsMapped(ptr, size) {
		return fmt.Errorf("%w: host register %#x+%d: part of the range is not mapped memory", ErrInvalidValue, ptr, size)
	}
	s.allocMu.RLock()
	for _, r := range s.registered {
		if r.host < ptr+uintptr(size) && ptr < r.end() {
			s.allocMu.RUnlock()
			return fmt.Errorf("%w: host register %#x+%d: overlaps the registration at %#x+%d", ErrInvalidValue, ptr, size, r.host, r.alloc.length)
		}
	}
	s.allocMu.RUnlock()
	// The contents go to a pinned allocation, and then the program's
	// pages become an alias of it. Nothing may write the range meanwhile.
	a, err := s.allocate(size, wire.AllocRequest{Size: uint64(size), Flags: flags, Kind: core.KindPinnedHost}, func(addr uintptr, length int64) error {
		copy(devmem.BytesAt(addr, length), devmem.BytesAt(ptr, length))
		return nil
	})
	if err != nil {
		return err
	}
	if err := s.host.MapFixed(ptr, int64(a.addr), size); err != nil {
		s.release(a)
		return fmt.Errorf("%w: host register %#x+%d: %v", ErrMemoryAllocation, ptr, size, err)
	}
	a.flags, a.hostAlias = flags, ptr
	s.allocMu.Lock()
	i := sort.Search(len(s.registered), func(i int) bool { return s.registered[i].host > ptr })
	s.registered = append(s.registered, registration{})
	copy(s.registered[i+1:], s.registered[i:])
	s.registered[i] = registration{host: ptr, alloc: a}
	s.allocMu.Unlock()
	return nil
}

// HostUnregister gives registered memory back to the program as ordinary
// memory, contents kept, as cudaHostUnregister, after the work of every
// stream, as Free.
func (s *Session) HostUnregister(ptr uintptr) error {
	s.quiesceAll()
	s.allocMu.Lock()
	i := sort.Search(len(s.registered), func(i int) bool { return s.registered[i].host >= ptr })
	if i == len(s.registered) || s.registered[i].host != ptr {
		s.allocMu.Unlock()
		return fmt.Errorf("%w: host unregister %#x: not the start of registered host memory", ErrInvalidValue, ptr)
	}
	reg := s.registered[i]
	s.registered = append(s.registered[:i], s.registered[i+1:]...)
	s.allocMu.Unlock()
	length := int64(reg.alloc.length)
	saved := append([]byte(nil), devmem.BytesAt(ptr, length)...)
	if err := devmem.MapAnonymousFixed(ptr, length); err != nil {
		return fmt.Errorf("%w: host unregister %#x: %v", ErrInternal, ptr, err)
	}
	copy(devmem.BytesAt(ptr, length), saved)
	return s.release(reg.alloc)
}
