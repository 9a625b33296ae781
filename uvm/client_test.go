package uvm

import (
	"bytes"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/softuvm/softuvm/internal/core"
)

// fill writes a pattern that depends on the byte's offset and seed.
func fill(b []byte, seed byte) {
	for i := range b {
		b[i] = byte(i>>12) ^ byte(i) ^ seed
	}
}

func pattern(n int, seed byte) []byte {
	b := make([]byte, n)
	fill(b, seed)
	return b
}

func TestFirstTouchReadsZerosAndCounts(t *testing.T) {
	s := newSession(t, testServerConfig())
	a, err := s.MallocManaged(4 << 20)
	require.NoError(t, err)
	b := a.Bytes()
	require.True(t, bytes.Equal(b, make([]byte, len(b))), "fresh managed memory reads as zeros")
	fill(b, 1)
	require.Equal(t, pattern(len(b), 1), b)

	st, err := a.Stats()
	require.NoError(t, err)
	assert.Equal(t, uint64(1024), st.PopulatedPages(CPU), "every page zero-filled once, on the host")
	assert.Empty(t, st.Migrations)
	host := st.FaultsBy(CPU)
	assert.Positive(t, host.Missing)
	assert.Less(t, host.Missing, uint64(100), "prefetch brought pages along")
	// A thread interrupted while waiting in a fault (the Go runtime
	// preempts with signals) faults again: the server sees, serves and
	// counts that duplicate, so faults may exceed the pages demanded.
	assert.GreaterOrEqual(t, st.PrefetchedPages+host.Missing, uint64(1024))
	assert.Less(t, st.PrefetchedPages, uint64(1024))
	// Every fault served is timed. With large folios a whole block is
	// written into the host file and then mapped: a thread interrupted
	// in between faults again, as MINOR.
	assert.Equal(t, host.Missing+host.Minor, st.FaultService.Count)

	in, err := s.rpc.Info()
	require.NoError(t, err)
	require.Len(t, in.Sessions, 1)
	assert.Equal(t, int64(4<<20), in.Sessions[0].HostBytes, "the host file holds the pages")
	require.NoError(t, a.Free())
}

func TestPrefetchRoundTrip(t *testing.T) {
	s := newSession(t, testServerConfig())
	const size = 8<<20 + 123 // not a multiple of pages or blocks
	a, err := s.MallocManaged(size)
	require.NoError(t, err)
	b := a.Bytes()
	fill(b, 7)

	require.NoError(t, a.Prefetch(0))
	in, err := s.rpc.Info()
	require.NoError(t, err)
	pages := int64((size + PageSize - 1) / PageSize)
	assert.Equal(t, int64(0), in.Sessions[0].HostBytes, "the host copies were freed")
	assert.Equal(t, pages*PageSize, in.Devices[0].UsedBytes, "the arena holds every page")
	assert.Equal(t, in.Devices[0].UsedBytes, in.Devices[0].FileBytes, "accounting matches the files")
	attrs, err := s.RangeAttributes(a.Addr(), size)
	require.NoError(t, err)
	assert.Equal(t, Device(0), attrs.LastPrefetchLocation)
	assert.Equal(t, InvalidDevice, attrs.PreferredLocation)
	assert.False(t, attrs.ReadMostly)
	assert.Empty(t, attrs.AccessedBy)

	require.Equal(t, pattern(size, 7), b, "data comes back by faults, intact")
	st, err := a.Stats()
	require.NoError(t, err)
	assert.Equal(t, uint64(pages), st.MigratedPages(CPU, 0))
	assert.Equal(t, uint64(pages), st.MigratedPages(0, CPU))
	in, err = s.rpc.Info()
	require.NoError(t, err)
	assert.Equal(t, int64(0), in.Devices[0].UsedBytes, "faulting back freed the device pages")
	assert.Equal(t, int64(0), in.Devices[0].FileBytes)

	require.NoError(t, a.Prefetch(0))
	require.NoError(t, a.Prefetch(CPU))
	attrs, err = s.RangeAttributes(a.Addr(), size)
	require.NoError(t, err)
	assert.Equal(t, CPU, attrs.LastPrefetchLocation)
	st, err = a.Stats()
	require.NoError(t, err)
	faults := st.TotalFaults()
	require.Equal(t, pattern(size, 7), b)
	st, err = a.Stats()
	require.NoError(t, err)
	assert.Equal(t, faults, st.TotalFaults(), "after a prefetch to the CPU the host reads without faults")
}

func TestPrefetchPopulatesUntouchedMemory(t *testing.T) {
	s := newSession(t, testServerConfig())
	a, err := s.MallocManaged(1 << 20)
	require.NoError(t, err)
	require.NoError(t, a.Prefetch(0))
	st, err := a.Stats()
	require.NoError(t, err)
	assert.Equal(t, uint64(256), st.PopulatedPages(0), "never-touched pages are created on the destination")
	require.True(t, bytes.Equal(a.Bytes(), make([]byte, 1<<20)))
	st, err = a.Stats()
	require.NoError(t, err)
	assert.Equal(t, uint64(256), st.MigratedPages(0, CPU))

	c, err := s.MallocManaged(1 << 20)
	require.NoError(t, err)
	require.NoError(t, c.Prefetch(CPU))
	st, err = c.Stats()
	require.NoError(t, err)
	assert.Equal(t, uint64(256), st.PopulatedPages(CPU))
	assert.Zero(t, st.TotalFaults())
}

func TestPrefetchRoundsToPagesAndAttributes(t *testing.T) {
	s := newSession(t, testServerConfig())
	a, err := s.MallocManaged(64 * PageSize)
	require.NoError(t, err)
	b := a.Bytes()
	fill(b, 3)
	// Bytes 1..10 of page 0 round out to page 0, as CUDA rounds.
	require.NoError(t, s.Prefetch(a.Addr()+1, 10, 0))
	for _, tc := range []struct {
		off, n int64
		want   Device
	}{
		{0, PageSize, 0},
		{5, 1, 0},
		{0, 2 * PageSize, InvalidDevice}, // page 1 never prefetched
		{PageSize, PageSize, InvalidDevice},
	} {
		got, err := s.RangeAttribute(a.Addr()+uintptr(tc.off), tc.n, AttrLastPrefetchLocation)
		require.NoError(t, err)
		assert.Equal(t, tc.want, got, "last prefetch location of +%d..%d", tc.off, tc.off+tc.n)
	}
	require.NoError(t, s.Prefetch(a.Addr()+PageSize, 63*PageSize, CPU))
	got, err := s.RangeAttribute(a.Addr(), 64*PageSize, AttrLastPrefetchLocation)
	require.NoError(t, err)
	assert.Equal(t, InvalidDevice, got, "pages prefetched to different places")
	v, err := s.RangeAttribute(a.Addr(), 1, AttrReadMostly)
	require.NoError(t, err)
	assert.Equal(t, false, v)
	v, err = s.RangeAttribute(a.Addr(), 1, AttrAccessedBy)
	require.NoError(t, err)
	assert.Equal(t, []Device{}, v)
	require.Equal(t, pattern(len(b), 3), b)
}

func TestPointerAttributes(t *testing.T) {
	s := newSession(t, testServerConfig())
	a, err := s.MallocManaged(10000)
	require.NoError(t, err)
	c, err := s.MallocManaged(1)
	require.NoError(t, err)
	pa, err := s.PointerAttributes(a.Addr() + 9999)
	require.NoError(t, err)
	assert.Equal(t, PointerAttributes{Type: MemoryManaged, Device: 0, DevicePointer: a.Addr() + 9999, HostPointer: a.Addr() + 9999,
		RangeStart: a.Addr(), RangeSize: 10000, BufferID: pa.BufferID, IsManaged: true}, pa)
	assert.Equal(t, a.Addr(), uintptr(a.Pointer()), "Pointer and Addr name the same byte")
	pc, err := s.PointerAttributes(c.Addr())
	require.NoError(t, err)
	assert.NotEqual(t, pa.BufferID, pc.BufferID, "buffer ids are unique")

	local := 0
	_, err = s.PointerAttributes(uintptr(unsafe.Pointer(&local)))
	assert.ErrorIs(t, err, ErrInvalidValue, "a Go stack pointer is not managed")
	_, err = s.PointerAttributes(a.Addr() + 10000)
	assert.ErrorIs(t, err, ErrInvalidValue, "one past the end is not the allocation's")
	require.NoError(t, c.Free())
	_, err = s.PointerAttributes(c.Addr())
	assert.ErrorIs(t, err, ErrInvalidValue, "freed memory is not managed")
}

// TestKernelModeFaults: system calls that read and write managed memory
// resident on a device (the kernel faults inside copy_to_user and
// copy_from_user) see the right data.
func TestKernelModeFaults(t *testing.T) {
	s := newSession(t, testServerConfig())
	a, err := s.MallocManaged(1 << 20)
	require.NoError(t, err)
	b := a.Bytes()
	fill(b, 9)
	require.NoError(t, a.Prefetch(0))

	var p [2]int
	require.NoError(t, syscall.Pipe(p[:]))
	defer syscall.Close(p[0])
	defer syscall.Close(p[1])
	// write(2) from device-resident memory: the kernel reads it.
	n, err := syscall.Write(p[1], b[:60000])
	require.NoError(t, err)
	got := make([]byte, n)
	_, err = syscall.Read(p[0], got)
	require.NoError(t, err)
	assert.Equal(t, pattern(len(b), 9)[:n], got)

	// read(2) into device-resident memory: the kernel writes it.
	require.NoError(t, a.Prefetch(0))
	src := pattern(50000, 5)
	_, err = syscall.Write(p[1], src)
	require.NoError(t, err)
	n, err = syscall.Read(p[0], b[100000:150000])
	require.NoError(t, err)
	require.Equal(t, 50000, n)
	want := pattern(len(b), 9)
	copy(want[100000:], src)
	assert.Equal(t, want, b)
}

func TestPrefetchPolicies(t *testing.T) {
	s := newSession(t, testServerConfig())
	for _, tc := range []struct {
		spec   PrefetchSpec
		faults uint64
	}{
		{PrefetchSpec{Policy: "none"}, 512},
		{PrefetchSpec{Policy: "window", Window: 15}, 32},
		{PrefetchSpec{Policy: "density", Threshold: 51}, 6},
	} {
		a, err := s.MallocManaged(BlockSize, WithPrefetch(tc.spec))
		require.NoError(t, err)
		b := a.Bytes()
		for i := 0; i < len(b); i += PageSize {
			b[i] = 1
		}
		st, err := a.Stats()
		require.NoError(t, err)
		// Faults may include a few duplicates (a thread interrupted in a
		// fault faults again); the pages prefetched are exact.
		assert.Equal(t, 512-tc.faults, st.PrefetchedPages, "%v: pages prefetched in a sequential first touch of 2 MiB", tc.spec)
		assert.GreaterOrEqual(t, st.TotalFaults(), tc.faults, "%v", tc.spec)
		assert.LessOrEqual(t, st.TotalFaults(), tc.faults+5, "%v", tc.spec)
		require.NoError(t, a.Free())
	}
}

// TestTrackPrefetchUse: with tracking, prefetched pages are left unmapped
// until touched, so the statistics know which were used.
func TestTrackPrefetchUse(t *testing.T) {
	s := newSession(t, testServerConfig())
	a, err := s.MallocManaged(BlockSize, TrackPrefetchUse())
	require.NoError(t, err)
	b := a.Bytes()
	const touched = 100
	for p := 0; p < touched; p++ {
		b[p*PageSize] = byte(p)
	}
	for p := 0; p < touched; p++ {
		require.Equal(t, byte(p), b[p*PageSize])
	}
	st, err := a.Stats()
	require.NoError(t, err)
	// Every touched page that did not fault was prefetched and used;
	// faults can count duplicates (see TestFirstTouchReadsZerosAndCounts).
	faults := st.TotalFaults()
	assert.GreaterOrEqual(t, st.PrefetchedUsed, touched-faults)
	assert.Less(t, st.PrefetchedUsed, uint64(touched))
	assert.Positive(t, st.PrefetchedPages)
	prefetched := st.PrefetchedPages
	require.NoError(t, a.Prefetch(0))
	st, err = a.Stats()
	require.NoError(t, err)
	assert.Equal(t, prefetched-st.PrefetchedUsed, st.PrefetchedUnused, "pages that left untouched were unused")
	stSession, err := s.Stats()
	require.NoError(t, err)
	assert.Equal(t, st.PrefetchedUsed, stSession.PrefetchedUsed)
}

// TestConcurrentWritersDuringMigration: threads keep writing while the
// range migrates back and forth; no write may be lost (the write
// protection taken before a page is copied away holds writers still).
func TestConcurrentWritersDuringMigration(t *testing.T) {
	s := newSession(t, testServerConfig())
	const pages = 256
	a, err := s.MallocManaged(pages * PageSize)
	require.NoError(t, err)
	words := unsafe.Slice((*uint64)(unsafe.Pointer(unsafe.SliceData(a.Bytes()))), pages*PageSize/8)
	const writers = 4
	var stop atomic.Bool
	var wg sync.WaitGroup
	// Each page has one writer, which reads back its previous write
	// before each new one: a write lost in any migration shows at once,
	// not only if it was the last.
	lost := make(chan string, writers)
	var writes atomic.Int64
	for w := 0; w < writers; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			for v := uint64(1); !stop.Load(); v++ {
				for p := w; p < pages; p += writers {
					if got := words[p*PageSize/8]; got != v-1 {
						lost <- fmt.Sprintf("page %d holds %d before write %d: write %d was lost", p, got, v, v-1)
						return
					}
					words[p*PageSize/8] = v
					writes.Add(1)
				}
				runtime.Gosched()
			}
		}(w)
	}
	for i := 0; i < 20; i++ {
		require.NoError(t, a.Prefetch(0))
		require.NoError(t, a.Prefetch(CPU))
		require.NoError(t, a.Prefetch(0))
	}
	stop.Store(true)
	wg.Wait()
	close(lost)
	for msg := range lost {
		t.Error(msg)
	}
	st, err := a.Stats()
	require.NoError(t, err)
	assert.GreaterOrEqual(t, st.MigratedPages(CPU, 0), uint64(20*pages), "each prefetch to the device after one to the host moved every page")
	t.Logf("%d writes checked; write-protect faults while migrating: %d", writes.Load(), st.FaultsBy(CPU).WriteProtect)
}

func TestBadInputNamesTheValue(t *testing.T) {
	s := newSession(t, testServerConfig())
	a, err := s.MallocManaged(3 * PageSize)
	require.NoError(t, err)
	local := 0
	stack := uintptr(unsafe.Pointer(&local))
	for _, tc := range []struct {
		name  string
		err   error
		class error
		want  string
	}{
		{"zero size", second(s.MallocManaged(0)), ErrInvalidValue, "allocation of 0 bytes"},
		{"negative size", second(s.MallocManaged(-5)), ErrInvalidValue, "allocation of -5 bytes"},
		{"absurd size", second(s.MallocManaged(core.MaxAllocation + 1)), ErrInvalidValue, "70368744177665 bytes"},
		{"bad flags", second(s.MallocManaged(1, WithFlags(9))), ErrInvalidValue, "flags 0x9"},
		{"zero option", second(s.MallocManaged(1, AllocOption{})), ErrInvalidValue, "option 0 is a zero AllocOption"},
		{"bad policy", second(s.MallocManaged(1, WithPrefetch(PrefetchSpec{Policy: "window", Window: 0}))), ErrInvalidValue, "window 0"},
		{"unknown device", s.Prefetch(a.Addr(), 1, 3), ErrInvalidDevice, "device 3"},
		{"negative device", s.Prefetch(a.Addr(), 1, -7), ErrInvalidDevice, "device(-7)"},
		{"unmanaged pointer", s.Prefetch(stack, 8, 0), ErrInvalidValue, "is not managed memory"},
		{"past the end", s.Prefetch(a.Addr(), 4*PageSize, 0), ErrInvalidValue, "runs past the end"},
		{"zero length", s.Prefetch(a.Addr(), 0, 0), ErrInvalidValue, "length 0"},
		{"attributes of stack", second(s.RangeAttributes(stack, 8)), ErrInvalidValue, "is not managed memory"},
		{"unknown attribute", second(s.RangeAttribute(a.Addr(), 8, 42)), ErrInvalidValue, "range attribute 42"},
		{"free inside", s.Free(a.Addr() + 8), ErrInvalidValue, "lies 8 bytes into"},
		{"free stack", s.Free(stack), ErrInvalidValue, "is not managed memory"},
	} {
		require.Error(t, tc.err, tc.name)
		assert.ErrorIs(t, tc.err, tc.class, tc.name)
		assert.Contains(t, tc.err.Error(), tc.want, tc.name)
	}
	require.NoError(t, a.Free())
	err = a.Free()
	assert.ErrorIs(t, err, ErrInvalidValue)
	assert.Contains(t, err.Error(), "not managed memory", "a second free finds nothing")
}

func second[T any](_ T, err error) error { return err }
