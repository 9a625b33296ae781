package uvm

import (
	"fmt"
	"runtime"
	"syscall"
	"testing"
	"time"
	"weak"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestMemRangeGetAttributes: several attributes in one call, in the
// order asked, each what the advice and prefetches given make it and
// what RangeAttribute says of it alone; bad arguments are refused.
func TestMemRangeGetAttributes(t *testing.T) {
	s := newSession(t, twoDeviceConfig())
	const size = 4 << 20
	m, err := s.MallocManaged(size)
	require.NoError(t, err)
	fill(m.Bytes(), 2)
	all := []RangeAttr{AttrReadMostly, AttrPreferredLocation, AttrAccessedBy, AttrLastPrefetchLocation}

	got, err := s.MemRangeGetAttributes(m.Addr(), size, all)
	require.NoError(t, err)
	assert.Equal(t, []any{false, InvalidDevice, []Device{}, InvalidDevice}, got, "no advice, no prefetch")

	require.NoError(t, s.MemAdvise(m.Addr(), size, AdviseSetReadMostly, CPU))
	require.NoError(t, s.MemAdvise(m.Addr(), size, AdviseSetPreferredLocation, 1))
	require.NoError(t, s.MemAdvise(m.Addr(), size, AdviseSetAccessedBy, 0))
	require.NoError(t, s.MemAdvise(m.Addr(), size, AdviseSetAccessedBy, CPU))
	require.NoError(t, s.Prefetch(m.Addr(), size, 0))
	asked := []RangeAttr{AttrLastPrefetchLocation, AttrAccessedBy, AttrReadMostly, AttrPreferredLocation, AttrReadMostly}
	got, err = s.MemRangeGetAttributes(m.Addr(), size, asked)
	require.NoError(t, err)
	assert.Equal(t, []any{Device(0), []Device{CPU, 0}, true, Device(1), true}, got, "in the order asked, repeats included")
	for i, a := range asked {
		one, err := s.RangeAttribute(m.Addr(), size, a)
		require.NoError(t, err)
		assert.Equal(t, one, got[i], "%v alone", a)
	}

	// Part of the range: the second half moves to device 1; the halves
	// disagree on the last prefetch location over the whole.
	require.NoError(t, s.Prefetch(m.Addr()+size/2, size/2, 1))
	got, err = s.MemRangeGetAttributes(m.Addr()+size/2, size/2, []RangeAttr{AttrLastPrefetchLocation})
	require.NoError(t, err)
	assert.Equal(t, []any{Device(1)}, got, "the second half")
	got, err = s.MemRangeGetAttributes(m.Addr(), size, []RangeAttr{AttrLastPrefetchLocation})
	require.NoError(t, err)
	assert.Equal(t, []any{InvalidDevice}, got, "the halves disagree")

	// The accessed-by list is each answer's own.
	got, err = s.MemRangeGetAttributes(m.Addr(), size, []RangeAttr{AttrAccessedBy, AttrAccessedBy})
	require.NoError(t, err)
	got[0].([]Device)[0] = 7
	assert.Equal(t, []Device{CPU, 0}, got[1])

	host := make([]byte, 64)
	for _, tc := range []struct {
		name  string
		addr  uintptr
		n     int64
		attrs []RangeAttr
		msg   string
	}{
		{"no attribute", m.Addr(), size, nil, "no attribute asked"},
		{"unknown attribute", m.Addr(), size, []RangeAttr{AttrReadMostly, RangeAttr(9)}, "attribute 1 is 9: want one from read-mostly (1)"},
		{"zero attribute", m.Addr(), size, []RangeAttr{0}, "attribute 0 is 0"},
		{"not managed", addr(host), 64, all, "is not managed memory of this process"},
		{"empty range", m.Addr(), 0, all, "length 0"},
		{"past the end", m.Addr(), size + 1, all, "runs past the end"},
	} {
		_, err := s.MemRangeGetAttributes(tc.addr, tc.n, tc.attrs)
		require.Error(t, err, tc.name)
		assert.ErrorIs(t, err, ErrInvalidValue, tc.name)
		assert.Contains(t, err.Error(), tc.msg, tc.name)
	}
	require.NoError(t, m.Free())
}

// pointerAttrs are every attribute, in order.
var pointerAttrs = []PointerAttr{PointerAttrMemoryType, PointerAttrDevice, PointerAttrDevicePointer, PointerAttrHostPointer,
	PointerAttrIsManaged, PointerAttrRangeStart, PointerAttrRangeSize, PointerAttrSyncMemops, PointerAttrBufferID}

// TestPointerGetAttributesOf: every attribute of a pointer into each kind
// of memory, against the addresses and sizes the allocations were made
// with, and the defaults for a pointer the runtime does not know.
func TestPointerGetAttributesOf(t *testing.T) {
	const regSize = 4 * PageSize
	mem := mmapForRegister(t, regSize)
	s := newSession(t, twoDeviceConfig())
	const size = 3*PageSize + 100
	managed, err := s.MallocManaged(size)
	require.NoError(t, err)
	dev, err := s.Malloc(1, size)
	require.NoError(t, err)
	pinned, err := s.HostAlloc(size, HostAllocMapped)
	require.NoError(t, err)
	reg := addr(mem)
	require.NoError(t, s.HostRegister(reg, regSize, 0))
	regDev, err := s.HostGetDevicePointer(reg, 0)
	require.NoError(t, err)
	ids := map[uint64]bool{}
	id := func(a *Allocation) uint64 {
		v, err := s.PointerGetAttributesOf(a.Addr(), []PointerAttr{PointerAttrBufferID})
		require.NoError(t, err)
		ids[v[0].(uint64)] = true
		return v[0].(uint64)
	}
	other := make([]byte, 64)
	regAlloc := s.lookup(regDev)
	require.NotNil(t, regAlloc)

	const off = 2*PageSize + 7
	for _, tc := range []struct {
		name string
		ptr  uintptr
		want []any
	}{
		{"managed", managed.Addr() + off, []any{MemoryManaged, Device(0), managed.Addr() + off, managed.Addr() + off, true, managed.Addr(), int64(size), false, id(managed)}},
		{"device", dev.Addr() + off, []any{MemoryDevice, Device(1), dev.Addr() + off, uintptr(0), false, dev.Addr(), int64(size), false, id(dev)}},
		{"pinned", pinned.Addr() + off, []any{MemoryHost, CPU, pinned.Addr() + off, pinned.Addr() + off, false, pinned.Addr(), int64(size), false, id(pinned)}},
		{"registered, host address", reg + off, []any{MemoryHost, CPU, regDev + off, reg + off, false, reg, int64(regSize), false, id(regAlloc)}},
		{"registered, device address", regDev + off, []any{MemoryHost, CPU, regDev + off, reg + off, false, reg, int64(regSize), false, id(regAlloc)}},
		{"ordinary memory", addr(other), []any{MemoryUnregistered, InvalidDevice, uintptr(0), uintptr(0), false, uintptr(0), int64(0), false, uint64(0)}},
		{"past the size asked", managed.Addr() + size, []any{MemoryUnregistered, InvalidDevice, uintptr(0), uintptr(0), false, uintptr(0), int64(0), false, uint64(0)}},
	} {
		got, err := s.PointerGetAttributesOf(tc.ptr, pointerAttrs)
		require.NoError(t, err, tc.name)
		assert.Equal(t, tc.want, got, tc.name)
		// One at a time, in reverse: the same answers.
		for i := len(pointerAttrs) - 1; i >= 0; i-- {
			one, err := s.PointerGetAttributesOf(tc.ptr, pointerAttrs[i:i+1])
			require.NoError(t, err)
			assert.Equal(t, tc.want[i], one[0], "%s: %v alone", tc.name, pointerAttrs[i])
		}
	}
	assert.Len(t, ids, 4, "four allocations, four buffer ids")

	for _, tc := range []struct {
		name  string
		attrs []PointerAttr
		msg   string
	}{
		{"no attribute", nil, "no attribute asked"},
		{"unknown attribute", []PointerAttr{PointerAttrDevice, 42}, "attribute 1 is 42: want one from memory-type (1) to buffer-id (9)"},
		{"zero attribute", []PointerAttr{0}, "attribute 0 is 0"},
	} {
		_, err := s.PointerGetAttributesOf(managed.Addr(), tc.attrs)
		require.Error(t, err, tc.name)
		assert.ErrorIs(t, err, ErrInvalidValue, tc.name)
		assert.Contains(t, err.Error(), tc.msg, tc.name)
	}
	require.NoError(t, s.HostUnregister(reg))
}

// TestPointerSetAttribute: sync-memops is recorded per allocation, read
// back through any pointer into it and only there, set and unset; what
// cannot be set, values of the wrong type and pointers of no allocation
// are refused.
func TestPointerSetAttribute(t *testing.T) {
	s := newSession(t, twoDeviceConfig())
	const size = 2 * PageSize
	dev, err := s.Malloc(0, size)
	require.NoError(t, err)
	other, err := s.Malloc(0, size)
	require.NoError(t, err)
	managed, err := s.MallocManaged(size)
	require.NoError(t, err)
	syncOf := func(p uintptr) bool {
		v, err := s.PointerGetAttributesOf(p, []PointerAttr{PointerAttrSyncMemops})
		require.NoError(t, err)
		return v[0].(bool)
	}
	require.NoError(t, s.PointerSetAttribute(dev.Addr()+100, PointerAttrSyncMemops, true))
	assert.True(t, syncOf(dev.Addr()), "set through a pointer inside, read at the start")
	assert.True(t, syncOf(dev.Addr()+size-1), "and at the last byte")
	assert.False(t, syncOf(other.Addr()), "another allocation keeps its own")
	require.NoError(t, s.PointerSetAttribute(managed.Addr(), PointerAttrSyncMemops, true))
	assert.True(t, syncOf(managed.Addr()), "managed memory too")
	// Synchronous copies are synchronous with it set, as without.
	src := pattern(size, 4)
	require.NoError(t, s.Memcpy(dev.Addr(), addr(src), size, MemcpyHostToDevice))
	sameBytes(t, src, readDevice(t, s, dev.Addr(), size), "a copy into memory with sync-memops set")
	require.NoError(t, s.PointerSetAttribute(dev.Addr(), PointerAttrSyncMemops, false))
	assert.False(t, syncOf(dev.Addr()), "unset")
	assert.True(t, syncOf(managed.Addr()), "the other one stays set")

	// A new allocation at the address of a freed one starts unset.
	require.NoError(t, s.PointerSetAttribute(other.Addr(), PointerAttrSyncMemops, true))
	at := other.Addr()
	require.NoError(t, other.Free())
	again, err := s.Malloc(0, size)
	require.NoError(t, err)
	if again.Addr() == at {
		assert.False(t, syncOf(again.Addr()), "a new allocation where the freed one was")
	}
	assert.False(t, syncOf(again.Addr()), "a new allocation starts unset")

	host := make([]byte, 8)
	for _, tc := range []struct {
		name  string
		ptr   uintptr
		attr  PointerAttr
		value any
		want  error
		msg   string
	}{
		{"a read-only attribute", dev.Addr(), PointerAttrBufferID, uint64(3), ErrInvalidValue, "set pointer attribute buffer-id of 0x"},
		{"an unknown attribute", dev.Addr(), PointerAttr(77), true, ErrInvalidValue, "pointer-attribute(77)"},
		{"an int for a bool", dev.Addr(), PointerAttrSyncMemops, 1, ErrInvalidValue, "to 1 (a int): want a bool"},
		{"nil", dev.Addr(), PointerAttrSyncMemops, nil, ErrInvalidValue, "to <nil> (a <nil>): want a bool"},
		{"ordinary memory", addr(host), PointerAttrSyncMemops, true, ErrInvalidDevicePointer, "no allocation of this session holds it"},
		{"freed memory", at + PageSize, PointerAttrSyncMemops, true, ErrInvalidDevicePointer, "no allocation of this session holds it"},
	} {
		if tc.name == "freed memory" && again.Addr() == at {
			continue // the address is taken again
		}
		err := s.PointerSetAttribute(tc.ptr, tc.attr, tc.value)
		require.Error(t, err, tc.name)
		assert.ErrorIs(t, err, tc.want, tc.name)
		assert.Contains(t, err.Error(), tc.msg, tc.name)
	}
	assert.False(t, syncOf(dev.Addr()), "refused calls changed nothing")

	// The record goes with the Allocation once nothing holds it.
	gone := &Allocation{s: s}
	gone.setSyncMemops(true)
	key := weak.Make(gone)
	gone = nil
	Eventually(t, 5*time.Second, func() bool {
		runtime.GC()
		_, ok := syncMemopsSet.Load(key)
		return !ok
	}, "the sync-memops record of a collected allocation was not dropped")
}

// TestMemGetAddressRange: the start and size of the allocation holding a
// pointer, for each kind of memory, at its first and last byte; anything
// else is refused naming the pointer.
func TestMemGetAddressRange(t *testing.T) {
	const regSize = 2 * PageSize
	mem := mmapForRegister(t, regSize)
	s := newSession(t, twoDeviceConfig())
	const size = 5*PageSize + 3
	managed, err := s.MallocManaged(size)
	require.NoError(t, err)
	dev, err := s.Malloc(1, size)
	require.NoError(t, err)
	pinned, err := s.HostAlloc(size, 0)
	require.NoError(t, err)
	reg := addr(mem)
	require.NoError(t, s.HostRegister(reg, regSize, 0))
	regDev, err := s.HostGetDevicePointer(reg, 0)
	require.NoError(t, err)

	for _, tc := range []struct {
		name string
		base uintptr
		size int64
	}{
		{"managed", managed.Addr(), size}, {"device", dev.Addr(), size}, {"pinned", pinned.Addr(), size},
		{"registered, host address", reg, regSize}, {"registered, device address", regDev, regSize},
	} {
		for _, at := range []uintptr{0, 1, uintptr(tc.size) / 2, uintptr(tc.size) - 1} {
			base, n, err := s.MemGetAddressRange(tc.base + at)
			require.NoError(t, err, "%s + %d", tc.name, at)
			assert.Equal(t, tc.base, base, "%s + %d", tc.name, at)
			assert.Equal(t, tc.size, n, "%s + %d", tc.name, at)
		}
	}

	host := make([]byte, 8)
	freed, err := s.MallocManaged(PageSize)
	require.NoError(t, err)
	freedAt := freed.Addr()
	require.NoError(t, freed.Free())
	for _, ptr := range []uintptr{addr(host), managed.Addr() + size, 0, freedAt} {
		if a := s.lookup(ptr); a != nil && ptr-a.addr < uintptr(a.size) {
			continue // the freed address was taken again
		}
		base, n, err := s.MemGetAddressRange(ptr)
		require.Error(t, err, "%#x", ptr)
		assert.ErrorIs(t, err, ErrInvalidValue)
		assert.Contains(t, err.Error(), fmt.Sprintf("address range of %#x: no allocation", ptr)+" of this session holds it")
		assert.Zero(t, base)
		assert.Zero(t, n)
	}
	require.NoError(t, s.HostUnregister(reg))
	_, _, err = s.MemGetAddressRange(reg)
	assert.ErrorIs(t, err, ErrInvalidValue, "unregistered memory is the program's again")
}

// mmapForRegister maps n bytes for HostRegister, unmapped at the end of
// the test: after the session's cleanup (registered later, run first),
// which gives registered memory back and must find it mapped.
func mmapForRegister(t *testing.T, n int) []byte {
	t.Helper()
	mem, err := syscall.Mmap(-1, 0, n, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_PRIVATE|syscall.MAP_ANONYMOUS)
	require.NoError(t, err)
	t.Cleanup(func() { syscall.Munmap(mem) })
	return mem
}
