package uvm

import (
	"testing"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A discard drops the copies of the whole pages inside its range on
// every location, and only those: the host's and a device's go, their
// memory is given back, and each page reads as zeros after, brought by a
// zero fill, not a copy.
func TestDiscardDropsEveryCopyOfTheWholePagesInside(t *testing.T) {
	s := newSession(t, testServerConfig())
	const size = 4<<20 + 3*PageSize // 1027 pages: two blocks and three pages
	a, err := s.MallocManaged(size)
	require.NoError(t, err)
	b := a.Bytes()
	fill(b, 9)
	// The second block to the device; the first and the tail stay.
	require.NoError(t, s.Prefetch(a.Addr()+2<<20, 2<<20, 0))

	// From byte 100 of page 0 to byte 50 of page 768: the whole pages
	// inside are 1 to 767; page 0 and page 768 keep every byte.
	const from, to = 100, 3<<20 + 50
	require.NoError(t, s.Discard(a.Addr()+from, to-from))

	st, err := a.Stats()
	require.NoError(t, err)
	assert.Equal(t, uint64(767), st.DiscardedPages, "pages 1 to 767 had a copy, and lost it")
	in, err := s.rpc.Info()
	require.NoError(t, err)
	assert.Equal(t, int64(1+3)*PageSize, in.Sessions[0].HostBytes, "the host keeps page 0 and the tail")
	assert.Equal(t, int64(256)*PageSize, in.Devices[0].UsedBytes, "the device keeps pages 768 to 1023")
	assert.Equal(t, in.Devices[0].UsedBytes, in.Devices[0].FileBytes, "its file holds what its arena counts")

	want := pattern(size, 9)
	clear(want[PageSize : 768*PageSize])
	require.Equal(t, want, b, "zeros where whole pages were discarded, the bytes elsewhere")
	st, err = a.Stats()
	require.NoError(t, err)
	assert.Equal(t, uint64(256), st.MigratedPages(0, CPU), "only the kept device pages came back by copy")

	// Discarding again, and discarding less than a page, drop nothing.
	require.NoError(t, s.Discard(a.Addr()+PageSize+1, PageSize))
	st2, err := a.Stats()
	require.NoError(t, err)
	assert.Equal(t, st.DiscardedPages, st2.DiscardedPages, "a range of less than a whole page discards nothing")
	require.NoError(t, a.Discard())
	st2, err = a.Stats()
	require.NoError(t, err)
	assert.Equal(t, uint64(767+size/PageSize), st2.DiscardedPages, "the whole allocation, its last page included")
	require.Equal(t, make([]byte, size), b)
}

func TestDiscardRefusesWhatIsNotManagedMemory(t *testing.T) {
	s := newSession(t, testServerConfig())
	a, err := s.MallocManaged(1 << 20)
	require.NoError(t, err)
	err = s.Discard(a.Addr()+PageSize, 1<<20)
	require.ErrorIs(t, err, ErrInvalidValue)
	assert.Contains(t, err.Error(), "runs past the end of the allocation")
	err = s.Discard(a.Addr(), 0)
	require.ErrorIs(t, err, ErrInvalidValue)
	assert.Contains(t, err.Error(), "length 0")
	var local [PageSize]byte
	require.ErrorIs(t, s.Discard(uintptr(unsafe.Pointer(&local[0])), PageSize), ErrInvalidValue)

	d, err := s.Malloc(0, 1<<20)
	require.NoError(t, err)
	err = s.Discard(d.Addr(), 1<<20)
	require.ErrorIs(t, err, ErrInvalidValue)
	assert.Contains(t, err.Error(), "discard applies to managed memory, and this is device memory")
}
