package uvm

import (
	"fmt"
	"reflect"
	"unsafe"

	"github.com/softuvm/softuvm/devmem"
	"github.com/softuvm/softuvm/internal/core"
)

// Slice returns the allocation as a slice of T, of a.Size()/sizeof(T)
// elements, as Bytes returns it as bytes: valid until the allocation is
// freed, and touching it afterwards faults.
//
// T must be plain (see SliceAt): a type of numbers, bools, and arrays and
// structs of them, with no pointer anywhere. Managed memory is not the Go
// heap: the garbage collector does not scan it, so a pointer stored there
// would not keep what it points to alive. The allocation's size must be a
// multiple of T's size. Managed memory and pinned host memory (HostAlloc)
// are reachable from the host; device memory (Malloc) is not, and Slice
// refuses it: copy it with Memcpy, or reach it from a kernel with
// SliceAt. Every refusal wraps ErrInvalidValue and names T and the sizes.
func Slice[T any](a *Allocation) ([]T, error) {
	t := reflect.TypeFor[T]()
	if path, part, ok := pointerPart(t); !ok {
		return nil, fmt.Errorf("%w: Slice[%v]: %s; memory outside the Go heap must hold no pointers, which the garbage collector would not see: %s",
			ErrInvalidValue, t, describeNotPlain(t, path, part), plainRule)
	}
	size := int64(t.Size())
	if size == 0 {
		return nil, fmt.Errorf("%w: Slice[%v]: the type has size 0, so no number of elements covers the allocation", ErrInvalidValue, t)
	}
	if a == nil {
		return nil, fmt.Errorf("%w: Slice[%v] of a nil allocation", ErrInvalidValue, t)
	}
	if a.freed.Load() {
		return nil, fmt.Errorf("%w: Slice[%v] of %s at %#x: it was freed", ErrInvalidValue, t, a.kindName(), a.addr)
	}
	if a.kind == core.KindDevice {
		return nil, fmt.Errorf("%w: Slice[%v] of %s at %#x: the host cannot touch device memory; copy it with Memcpy, or reach it from a kernel with SliceAt",
			ErrInvalidValue, t, a.kindName(), a.addr)
	}
	if a.size%size != 0 {
		return nil, fmt.Errorf("%w: Slice[%v] of %s at %#x: its size, %d bytes, is not a multiple of the size of %v, %d bytes (%d left over)",
			ErrInvalidValue, t, a.kindName(), a.addr, a.size, t, size, a.size%size)
	}
	// The allocation starts on a page, which aligns every T.
	return unsafe.Slice((*T)(a.Pointer()), a.size/size), nil
}

// MustSlice is Slice for callers that know the type and the size fit: it
// panics where Slice returns an error.
func MustSlice[T any](a *Allocation) []T {
	s, err := Slice[T](a)
	if err != nil {
		panic(err)
	}
	return s
}

// SliceAt returns the n values of type T at addr: what a kernel makes of
// the addresses its parameters carry, and what host code makes of an
// address into managed or pinned memory. The memory is not checked: addr
// must lie in memory of the session that the caller may touch (a kernel
// may touch managed, device and mapped pinned memory; the host, all but
// device memory), for n*sizeof(T) bytes.
//
// T must be plain: bools, integers (uintptr included), floating-point and
// complex numbers, and arrays and structs of them. Memory outside the Go
// heap must hold no pointer, string, slice, map, channel, func or
// interface: the garbage collector would not see them. SliceAt panics if
// T is not plain, if addr is not aligned for T, if n is negative, or if
// addr is 0 and n is not: it is meant for kernels, where a panic is the
// error path (it comes back from the next synchronize as
// ErrLaunchFailure, naming the kernel and the thread). n == 0 gives an
// empty slice.
func SliceAt[T any](addr uintptr, n int) []T {
	t := reflect.TypeFor[T]()
	if path, part, ok := pointerPart(t); !ok {
		panic(fmt.Sprintf("uvm.SliceAt[%v]: %s; memory outside the Go heap must hold no pointers: %s", t, describeNotPlain(t, path, part), plainRule))
	}
	size := t.Size()
	switch {
	case n < 0:
		panic(fmt.Sprintf("uvm.SliceAt[%v](%#x, %d): negative length", t, addr, n))
	case n == 0:
		return []T{}
	case addr == 0:
		panic(fmt.Sprintf("uvm.SliceAt[%v](0, %d): nil address", t, n))
	case addr%uintptr(t.Align()) != 0:
		panic(fmt.Sprintf("uvm.SliceAt[%v](%#x, %d): the address is not aligned for %v, which wants a multiple of %d", t, addr, n, t, t.Align()))
	case size == 0:
		return make([]T, n)
	case uintptr(n) > (^uintptr(0)-addr)/size:
		panic(fmt.Sprintf("uvm.SliceAt[%v](%#x, %d): %d elements of %d bytes run past the end of the address space", t, addr, n, n, size))
	}
	b := devmem.BytesAt(addr, int64(n)*int64(size))
	return unsafe.Slice((*T)(unsafe.Pointer(unsafe.SliceData(b))), n)
}
