package devmem

import (
	"bufio"
	"fmt"
	"os"
	"strings"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// mapsLine returns the /proc/self/maps line of the mapping containing
// addr, "" if none does.
func mapsLine(t *testing.T, addr uintptr) string {
	t.Helper()
	f, err := os.Open("/proc/self/maps")
	require.NoError(t, err)
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		var lo, hi uintptr
		if _, err := fmt.Sscanf(s.Text(), "%x-%x", &lo, &hi); err == nil && lo <= addr && addr < hi {
			return s.Text()
		}
	}
	require.NoError(t, s.Err())
	return ""
}

// mappings returns the end of every mapping in /proc/self/maps by its
// start.
func mappings(t *testing.T) map[uintptr]uintptr {
	t.Helper()
	b, err := os.ReadFile("/proc/self/maps")
	require.NoError(t, err)
	ends := map[uintptr]uintptr{}
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		lo, hi := lineRange(t, line)
		ends[lo] = hi
	}
	return ends
}

// lineRange is the range of a /proc/self/maps line.
func lineRange(t *testing.T, line string) (lo, hi uintptr) {
	t.Helper()
	_, err := fmt.Sscanf(line, "%x-%x", &lo, &hi)
	require.NoError(t, err, "maps line %q", line)
	return lo, hi
}

func TestReserveAddressSpaceAlignment(t *testing.T) {
	for _, align := range []int64{PageSize, 2 << 20, 1 << 30} {
		t.Run(fmt.Sprint(align), func(t *testing.T) {
			const length = 6 << 20
			before := mappings(t)
			addr, err := ReserveAddressSpace(length, align)
			require.NoError(t, err)
			assert.Zero(t, addr%uintptr(align), "address %#x aligned to %d", addr, align)

			line := mapsLine(t, addr)
			assert.Contains(t, line, " ---p ", "reserved, inaccessible and private")

			require.NoError(t, DontFork(addr, length))
			require.NoError(t, ReleaseAddressSpace(addr, length))
			assert.NotContains(t, mapsLine(t, addr), "---p", "released")
			// Exactly the reservation: the slack mapped for alignment was
			// trimmed on both sides, so none of it is left mapped once the
			// reservation is released. (Its maps line alone cannot say: a
			// neighbouring mapping with the same protection, such as the
			// Go runtime's reserved heap, merges with it.)
			for _, at := range []uintptr{addr - PageSize, addr + length} {
				if line := mapsLine(t, at); line != "" {
					lo, hi := lineRange(t, line)
					assert.Equal(t, before[lo], hi, "%#x is mapped after the release, and was not so before: %q", at, line)
				}
			}
		})
	}
}

func TestReserveAddressSpaceErrors(t *testing.T) {
	for _, tc := range []struct {
		length, align int64
		want          string
	}{
		{0, PageSize, "length 0: want a positive multiple of 4096"},
		{100, PageSize, "length 100: want a positive multiple of 4096"},
		{PageSize, 0, "alignment 0: want a power of two >= 4096"},
		{PageSize, 3 * PageSize, "alignment 12288: want a power of two >= 4096"},
		{PageSize, 512, "alignment 512: want a power of two >= 4096"},
		{FileSize * 2, PageSize, "want at most 0x800000000000 bytes"},
	} {
		_, err := ReserveAddressSpace(tc.length, tc.align)
		assert.ErrorContains(t, err, tc.want)
	}
	assert.ErrorContains(t, DontFork(1, PageSize), "dontfork 0x1+4096: want a page-aligned address")
	assert.ErrorContains(t, ReleaseAddressSpace(PageSize, 0), "release 0x1000+0: want a page-aligned address and a positive length")
}

// The project's rule: a page's file offset is its virtual address. A
// MapFixed window placed at addr == offset inside a reservation shows the
// file's pages at their own addresses, coherent with any other mapping
// of the file and with pread/pwrite, and a Punch zaps it.
func TestMapFixedOffsetEqualsAddress(t *testing.T) {
	const length = 16 * PageSize
	addr, err := ReserveAddressSpace(length, 2<<20)
	require.NoError(t, err)
	defer func() { require.NoError(t, ReleaseAddressSpace(addr, length)) }()
	f := newFile(t, FileSize)

	// Replace the middle of the reservation; the rest stays reserved.
	win, off := addr+4*PageSize, int64(addr+4*PageSize)
	require.NoError(t, f.MapFixed(win, off, 8*PageSize))
	assert.Contains(t, mapsLine(t, win), " rw-s ")
	assert.Contains(t, mapsLine(t, addr), " ---p ")
	assert.Contains(t, mapsLine(t, addr+12*PageSize), " ---p ")
	assert.Contains(t, mapsLine(t, win), fmt.Sprintf(" %08x ", off), "the window maps file offset == address")

	fixed := BytesAt(win, 8*PageSize)
	want := pattern(8*PageSize, 9)
	copy(fixed, want)
	assert.Equal(t, want, readAll(t, f, off, 8*PageSize), "stores at the address are the file's page at that offset")

	other := mapFile(t, f, off, 8*PageSize)
	assert.Equal(t, want, other.Bytes(), "visible through another mapping")
	copy(other.Bytes()[PageSize:], "from the other side")
	assert.Equal(t, "from the other side", string(fixed[PageSize:PageSize+19]))

	require.NoError(t, f.Punch(off, 8*PageSize))
	allocated, err := f.AllocatedBytes()
	require.NoError(t, err)
	assert.Zero(t, allocated)
	assert.True(t, isZero(fixed), "punch zapped the window")
}

func TestMappingUnmap(t *testing.T) {
	f := newFile(t, FileSize)
	m, err := f.Map(PageSize, 2*PageSize)
	require.NoError(t, err)
	addr := m.Addr()
	assert.Len(t, m.Bytes(), 2*PageSize)
	require.NoError(t, m.Unmap())
	require.NoError(t, m.Unmap(), "unmapping twice is fine")
	assert.Nil(t, m.Bytes())
	assert.Zero(t, m.Addr())
	assert.Equal(t, "", strings.TrimSpace(mapsLine(t, addr)), "gone from the address space")
	_, err = NodeOfAddress(addr)
	assert.ErrorIs(t, err, syscall.EFAULT)
}

func TestBytesAtNil(t *testing.T) {
	assert.Nil(t, BytesAt(0, PageSize))
	assert.Nil(t, BytesAt(PageSize, 0))
}

func TestReserveAddressSpaceAt(t *testing.T) {
	addr, err := ReserveAddressSpace(4<<20, 2<<20)
	require.NoError(t, err)
	require.NoError(t, ReleaseAddressSpace(addr, 4<<20))
	// The range is free again: reserve it at that very address.
	require.NoError(t, ReserveAddressSpaceAt(addr, 4<<20))
	err = ReserveAddressSpaceAt(addr+PageSize, PageSize)
	require.ErrorIs(t, err, ErrAddressInUse, "a second reservation over the first is refused")
	assert.Contains(t, err.Error(), fmt.Sprintf("%#x", addr+PageSize))

	// A file window inside, then returned to the reservation.
	f, err := CreateFile("reserve-at", FileSize)
	require.NoError(t, err)
	defer f.Close()
	require.NoError(t, f.MapFixed(addr, int64(addr), 2<<20))
	BytesAt(addr, 2<<20)[0] = 7
	require.NoError(t, ReturnToReservation(addr, 2<<20))
	buf := make([]byte, 1)
	_, err = f.ReadAt(buf, int64(addr))
	require.NoError(t, err)
	assert.Equal(t, byte(7), buf[0], "the data stays in the file")
	err = ReserveAddressSpaceAt(addr, PageSize)
	require.ErrorIs(t, err, ErrAddressInUse, "the range is still reserved")
	require.NoError(t, ReleaseAddressSpace(addr, 4<<20))

	assert.Error(t, ReserveAddressSpaceAt(addr+1, PageSize))
	assert.Error(t, ReturnToReservation(addr, 0))
}

func TestMapOver(t *testing.T) {
	addr, err := ReserveAddressSpace(2<<20, 2<<20)
	require.NoError(t, err)
	defer ReleaseAddressSpace(addr, 2<<20)
	a, err := CreateFile("map-over-a", FileSize)
	require.NoError(t, err)
	defer a.Close()
	b, err := CreateFile("map-over-b", FileSize)
	require.NoError(t, err)
	defer b.Close()
	require.NoError(t, a.MapFixed(addr, int64(addr), 2<<20))
	BytesAt(addr, PageSize)[0] = 'a'
	_, err = b.WriteAt([]byte{'b'}, int64(addr)+PageSize)
	require.NoError(t, err)
	var scratch uintptr
	require.NoError(t, b.MapOver(addr+PageSize, int64(addr)+PageSize, PageSize, func(s uintptr) error {
		scratch = s
		assert.NotEqual(t, addr+PageSize, s, "prepared at a scratch address")
		return nil
	}))
	assert.NotZero(t, scratch)
	assert.Equal(t, byte('a'), BytesAt(addr, PageSize)[0], "the first page still maps a")
	assert.Equal(t, byte('b'), BytesAt(addr+PageSize, PageSize)[0], "the second page now maps b")
	err = b.MapOver(addr, int64(addr), PageSize, func(uintptr) error { return fmt.Errorf("refused") })
	require.ErrorContains(t, err, "refused")
	assert.Equal(t, byte('a'), BytesAt(addr, PageSize)[0], "a refused prepare leaves the old mapping")
}

func TestMapAnonymousFixed(t *testing.T) {
	addr, err := ReserveAddressSpace(PageSize, PageSize)
	require.NoError(t, err)
	defer ReleaseAddressSpace(addr, PageSize)
	f, err := CreateFile("anon-fixed", FileSize)
	require.NoError(t, err)
	defer f.Close()
	require.NoError(t, f.MapFixed(addr, 0, PageSize))
	BytesAt(addr, PageSize)[0] = 'f'
	require.NoError(t, MapAnonymousFixed(addr, PageSize))
	mem := BytesAt(addr, PageSize)
	assert.Zero(t, mem[0], "fresh anonymous memory")
	mem[0] = 'x'
	got := make([]byte, 1)
	_, err = f.ReadAt(got, 0)
	require.NoError(t, err)
	assert.Equal(t, byte('f'), got[0], "writes no longer reach the file")
	assert.Error(t, MapAnonymousFixed(addr+1, PageSize), "unaligned")
}

func TestIsMapped(t *testing.T) {
	m, err := CreateFile("is-mapped", FileSize)
	require.NoError(t, err)
	defer m.Close()
	mp, err := m.Map(0, 2*PageSize)
	require.NoError(t, err)
	addr := mp.Addr()
	assert.True(t, IsMapped(addr+10, 100))
	assert.True(t, IsMapped(addr, 2*PageSize))
	require.NoError(t, mp.Unmap())
	assert.False(t, IsMapped(addr, PageSize), "unmapped")
	assert.False(t, IsMapped(addr, 0), "empty")
}
