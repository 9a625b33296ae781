package uvm

import (
	"bytes"
	"fmt"
	"os"
	"syscall"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func init() {
	testRoles["touch-device-memory"] = roleTouchDeviceMemory
}

func addr(b []byte) uintptr { return uintptr(unsafe.Pointer(unsafe.SliceData(b))) }

// TestDeviceMemory: memory from Malloc lives in its device's arena only.
// Memcpy fills and reads it, its device's kernels and, with peer access,
// its peers' reach it (the peer maps it remotely), nothing migrates.
func TestDeviceMemory(t *testing.T) {
	s := newSession(t, twoDeviceConfig())
	const size = 1 << 20
	d, err := s.Malloc(0, size)
	require.NoError(t, err)
	in, err := s.Info()
	require.NoError(t, err)
	assert.Equal(t, int64(size), in.Devices[0].UsedBytes, "the capacity is taken at allocation")
	attrs, err := s.PointerAttributes(d.Addr() + 5)
	require.NoError(t, err)
	assert.Equal(t, MemoryDevice, attrs.Type)
	assert.Equal(t, Device(0), attrs.Device)
	assert.Zero(t, attrs.HostPointer, "the host cannot reach it")
	assert.False(t, attrs.IsManaged)

	src := pattern(size, 4)
	require.NoError(t, s.Memcpy(d.Addr(), addr(src), size, MemcpyHostToDevice))
	require.NoError(t, s.Launch(0, nil, "addOne", 2, rangeParams(d.Addr(), size, 0)))
	require.NoError(t, s.DeviceSynchronize(0))
	require.NoError(t, s.DeviceEnablePeerAccess(1, 0, 0))
	require.NoError(t, s.Launch(1, nil, "addOne", 2, rangeParams(d.Addr(), size, 0)))
	require.NoError(t, s.DeviceSynchronize(1))
	got := make([]byte, size)
	require.NoError(t, s.Memcpy(addr(got), d.Addr(), size, MemcpyDeviceToHost))
	sameBytes(t, plus(src, 2), got, "both devices' kernels updated device 0's memory")
	st := stats(t, d)
	assert.Empty(t, st.Migrations, "nothing migrated")
	assert.Equal(t, uint64(size/PageSize), st.RemoteMappedPages(1), "device 1 maps device 0's memory")
	assert.Zero(t, st.FaultsBy(1).Total(), "and does not fault on it")

	// Device to device, and memset.
	d1, err := s.Malloc(1, size)
	require.NoError(t, err)
	require.NoError(t, s.Memcpy(d1.Addr(), d.Addr(), size, MemcpyDeviceToDevice))
	require.NoError(t, s.Memset(d.Addr()+100, 0xab, 1000))
	require.NoError(t, s.Memcpy(addr(got), d1.Addr(), size, MemcpyDefault))
	sameBytes(t, plus(src, 2), got, "device 1 has the copy")
	require.NoError(t, s.Memcpy(addr(got), d.Addr(), size, MemcpyDefault))
	want := plus(src, 2)
	copy(want[100:1100], bytes.Repeat([]byte{0xab}, 1000))
	sameBytes(t, want, got, "memset")

	require.NoError(t, d.Free())
	require.NoError(t, d1.Free())
	in, err = s.Info()
	require.NoError(t, err)
	assert.Zero(t, in.Devices[0].UsedBytes+in.Devices[1].UsedBytes, "free gives the capacity back")

	_, err = s.Malloc(0, 65<<20)
	assert.ErrorIs(t, err, ErrMemoryAllocation, "more than the arena holds")
	_, err = s.Malloc(CPU, PageSize)
	assert.ErrorIs(t, err, ErrInvalidDevice)
	_, err = s.Malloc(7, PageSize)
	assert.ErrorIs(t, err, ErrInvalidDevice)
}

// TestDeviceMemoryEvictsManaged: device memory takes its capacity from
// managed pages on the device if it must, as cudaMalloc does.
func TestDeviceMemoryEvictsManaged(t *testing.T) {
	s := newSession(t, testServerConfig()) // one 64 MiB device
	m, err := s.MallocManaged(48 << 20)
	require.NoError(t, err)
	fill(m.Bytes(), 9)
	require.NoError(t, m.Prefetch(0))
	d, err := s.Malloc(0, 32<<20)
	require.NoError(t, err)
	st := stats(t, m)
	assert.Positive(t, st.EvictedPages(0), "managed pages made room")
	sameBytes(t, pattern(48<<20, 9), m.Bytes(), "and lost nothing")
	require.NoError(t, d.Free())
}

// roleTouchDeviceMemory touches device memory from the host, which must
// fail with SIGBUS and a message.
func roleTouchDeviceMemory() int {
	s, err := Connect(Config{Server: "private", Private: testServerConfig()})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	d, err := s.Malloc(0, PageSize)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	fmt.Println("touching")
	v := *(*byte)(d.Pointer())
	fmt.Println("read", v) // must never be printed
	return 0
}

func TestHostTouchingDeviceMemoryFailsClearly(t *testing.T) {
	requireRoot(t)
	cmd := child(t, "touch-device-memory")
	var stdout, stderr syncBuffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	require.Error(t, err)
	assert.Contains(t, stdout.String(), "touching")
	assert.NotContains(t, stdout.String(), "read", "the host read device memory")
	assert.Contains(t, stderr.String(), "the host touched device memory", "the server says what happened")
	assert.Contains(t, stderr.String(), "SIGBUS")
}

// TestPinnedHostMemory: HostAlloc memory stays on the host and every
// device maps it: kernels change it in place, without faults or
// migrations.
func TestPinnedHostMemory(t *testing.T) {
	s := newSession(t, twoDeviceConfig())
	const size = 256 << 10
	for _, flags := range []uint32{HostAllocDefault, HostAllocMapped | HostAllocPortable, HostAllocWriteCombined} {
		h, err := s.HostAlloc(size, flags)
		require.NoError(t, err, "flags %#x", flags)
		assert.Equal(t, make([]byte, size), h.Bytes(), "zero-filled")
		src := pattern(size, 3)
		require.NoError(t, s.Memcpy(h.Addr(), addr(src), size, MemcpyHostToHost))
		dp, err := s.HostGetDevicePointer(h.Addr(), 0)
		require.NoError(t, err)
		assert.Equal(t, h.Addr(), dp, "one address everywhere")
		attrs, err := s.PointerAttributes(h.Addr())
		require.NoError(t, err)
		assert.Equal(t, MemoryHost, attrs.Type)

		require.NoError(t, s.Launch(1, nil, "addOne", 2, rangeParams(dp, size, 0)))
		require.NoError(t, s.DeviceSynchronize(1))
		sameBytes(t, plus(src, 1), h.Bytes(), "the kernel wrote host memory in place")
		st := stats(t, h)
		assert.Zero(t, st.FaultsBy(1).Total(), "zero-copy: no faults")
		assert.Empty(t, st.Migrations, "pinned memory never migrates")
		assert.Equal(t, uint64(size/PageSize), st.RemoteMappedPages(1))

		assert.ErrorIs(t, s.Free(h.Addr()), ErrInvalidValue, "Free is for managed and device memory")
		assert.ErrorIs(t, s.Prefetch(h.Addr(), size, 0), ErrInvalidValue, "pinned memory does not migrate")
		require.NoError(t, s.FreeHost(h.Addr()))
	}
	_, err := s.HostAlloc(size, 0x80)
	assert.ErrorIs(t, err, ErrInvalidValue)
}

// TestHostRegister: memory the program mapped itself becomes pinned and
// reachable from kernels at its device pointer, and goes back to the
// program intact.
func TestHostRegister(t *testing.T) {
	s := newSession(t, twoDeviceConfig())
	const size = 64 << 10
	mem, err := syscall.Mmap(-1, 0, size, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_PRIVATE|syscall.MAP_ANONYMOUS)
	require.NoError(t, err)
	defer syscall.Munmap(mem)
	fill(mem, 6)
	ptr := addr(mem)
	require.NoError(t, s.HostRegister(ptr, size, HostRegisterMapped))
	sameBytes(t, pattern(size, 6), mem, "registration keeps the contents")
	dp, err := s.HostGetDevicePointer(ptr+PageSize, 0)
	require.NoError(t, err)
	attrs, err := s.PointerAttributes(ptr + PageSize)
	require.NoError(t, err)
	assert.Equal(t, MemoryHost, attrs.Type)
	assert.Equal(t, dp, attrs.DevicePointer)
	assert.Equal(t, ptr+PageSize, attrs.HostPointer)

	require.NoError(t, s.Launch(0, nil, "addOne", 1, rangeParams(dp-PageSize, size, 0)))
	require.NoError(t, s.DeviceSynchronize(0))
	sameBytes(t, plus(pattern(size, 6), 1), mem, "the kernel's writes show in the program's memory")

	assert.ErrorIs(t, s.HostRegister(ptr, size, 0), ErrInvalidValue, "registered twice")
	assert.ErrorIs(t, s.HostRegister(ptr+1, PageSize, 0), ErrInvalidValue, "unaligned")
	require.NoError(t, s.HostUnregister(ptr))
	sameBytes(t, plus(pattern(size, 6), 1), mem, "unregistration keeps the contents")
	mem[0] = 42 // ordinary memory again
	_, err = s.PointerAttributes(ptr)
	assert.ErrorIs(t, err, ErrInvalidValue)
	assert.ErrorIs(t, s.HostUnregister(ptr), ErrInvalidValue, "not registered any more")
}

// TestMemcpyKinds: every direction, checked against the pointers.
func TestMemcpyKinds(t *testing.T) {
	s := newSession(t, twoDeviceConfig())
	const size = 3*PageSize + 100
	managed, err := s.MallocManaged(size)
	require.NoError(t, err)
	pinned, err := s.HostAlloc(size, HostAllocWriteCombined)
	require.NoError(t, err)
	dev, err := s.Malloc(1, size)
	require.NoError(t, err)
	host := make([]byte, size)
	src := pattern(size, 8)

	for _, step := range []struct {
		dst, src uintptr
		kind     MemcpyKind
	}{
		{managed.Addr(), addr(src), MemcpyHostToHost},
		{pinned.Addr(), managed.Addr(), MemcpyHostToHost},
		{dev.Addr(), pinned.Addr(), MemcpyHostToDevice},
		{managed.Addr(), dev.Addr(), MemcpyDeviceToDevice},
		{addr(host), managed.Addr(), MemcpyDeviceToHost},
	} {
		require.NoError(t, s.Memcpy(step.dst, step.src, size, step.kind), "%v", step.kind)
	}
	sameBytes(t, src, host, "the data went through every kind of memory")

	for _, tc := range []struct {
		name string
		err  error
		msg  string
	}{
		{"device as host source", s.Memcpy(addr(host), dev.Addr(), size, MemcpyHostToHost), "is device memory of device 1, which is not reachable from the host"},
		{"host as device destination", s.Memcpy(addr(host), managed.Addr(), size, MemcpyHostToDevice), "is ordinary host memory, which is not reachable from a device"},
		{"overlap", s.Memcpy(managed.Addr()+1, managed.Addr(), 100, MemcpyDefault), "overlap"},
		{"past the end", s.Memcpy(dev.Addr(), addr(host), size+1, MemcpyDefault), "runs past the end"},
		{"bad kind", s.Memcpy(addr(host), managed.Addr(), 1, MemcpyKind(9)), "memcpy kind 9"},
		{"negative", s.Memcpy(addr(host), managed.Addr(), -1, MemcpyDefault), "-1 bytes"},
	} {
		require.Error(t, tc.err, tc.name)
		assert.ErrorIs(t, tc.err, ErrInvalidValue, tc.name)
		assert.Contains(t, tc.err.Error(), tc.msg, tc.name)
	}
	require.NoError(t, s.Memcpy(addr(host), managed.Addr(), 0, MemcpyDefault), "nothing to copy")
}
