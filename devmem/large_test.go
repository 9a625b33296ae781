package devmem

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/softuvm/softuvm/devmem/internal/memsys"
)

// newLargeFile makes a file of large folios, or skips where none can be
// made (not root).
func newLargeFile(t *testing.T) *File {
	t.Helper()
	if err := LargeFoliosAvailable(); err != nil {
		t.Skipf("no large folios here: %v", err)
	}
	f, err := CreateLargeFolioFile("test-"+t.Name(), FileSize)
	require.NoError(t, err)
	t.Cleanup(func() { f.Close() })
	require.True(t, f.Large())
	return f
}

// presentPages lists the present pages of [off, off+length).
func presentPages(t *testing.T, f *File, off, length int64) []int {
	t.Helper()
	pres, err := f.Present(off, length)
	require.NoError(t, err)
	var out []int
	for i, ok := range pres {
		if ok {
			out = append(out, i)
		}
	}
	return out
}

// folioHeads reads, from /proc/self/pagemap and /proc/kpageflags, which
// pages of the file's [off, off+length) head a compound (large) folio and
// which are tails, independently of devmem's own view.
func folioHeads(t *testing.T, f *File, off, length int64) (heads, tails int) {
	t.Helper()
	m, err := f.Map(off, length)
	require.NoError(t, err)
	defer m.Unmap()
	var sum byte // fault the whole window in: read every page
	b := m.Bytes()
	for p := int64(0); p < length; p += PageSize {
		sum += b[p]
	}
	t.Logf("read %d pages (sum %d)", length/PageSize, sum)
	pm, err := os.Open("/proc/self/pagemap")
	require.NoError(t, err)
	defer pm.Close()
	kf, err := os.Open("/proc/kpageflags")
	if err != nil {
		t.Skipf("no /proc/kpageflags: %v", err)
	}
	defer kf.Close()
	var e [8]byte
	for p := int64(0); p < length/PageSize; p++ {
		_, err := pm.ReadAt(e[:], int64(m.Addr()/PageSize+uintptr(p))*8)
		require.NoError(t, err)
		pfn := binary.LittleEndian.Uint64(e[:]) & (1<<55 - 1)
		require.NotZero(t, pfn, "page %d has no frame (are we root?)", p)
		_, err = kf.ReadAt(e[:], int64(pfn)*8)
		require.NoError(t, err)
		flags := binary.LittleEndian.Uint64(e[:])
		if flags&(1<<15) != 0 {
			heads++
		}
		if flags&(1<<16) != 0 {
			tails++
		}
	}
	return heads, tails
}

// The pitfall: a small write into an empty 2 MiB of a huge=always tmpfs
// allocates a whole folio, and the other pages read as zeros through
// any mapping instead of faulting. WriteAt, Allocate and CopyFrom must
// leave them absent; whole 2 MiB writes must make one large folio.
func TestLargeFolioPartialWritesStayPageSized(t *testing.T) {
	f := newLargeFile(t)
	base := int64(64 << 30)
	data := bytes.Repeat([]byte{0xa5}, 3*PageSize)
	_, err := f.WriteAt(data, base+5*PageSize)
	require.NoError(t, err)
	assert.Equal(t, []int{5, 6, 7}, presentPages(t, f, base, LargeFolioSize), "a 12 KiB write into an empty 2 MiB")

	require.NoError(t, f.Allocate(base+LargeFolioSize+9*PageSize, 2*PageSize))
	assert.Equal(t, []int{9, 10}, presentPages(t, f, base+LargeFolioSize, LargeFolioSize), "an 8 KiB allocation")

	src := newFile(t, FileSize)
	_, err = src.WriteAt(bytes.Repeat([]byte{7}, 32*PageSize), base)
	require.NoError(t, err)
	_, err = f.CopyFrom(src, base, base+2*LargeFolioSize+32*PageSize, 32*PageSize)
	require.NoError(t, err)
	var want []int
	for p := 32; p < 64; p++ {
		want = append(want, p)
	}
	assert.Equal(t, want, presentPages(t, f, base+2*LargeFolioSize, LargeFolioSize), "a 128 KiB copy_file_range would make a 128 KiB folio")

	whole := bytes.Repeat([]byte{3}, LargeFolioSize)
	n, err := f.WriteBlock([][]byte{whole[:LargeFolioSize/2], whole[LargeFolioSize/2:]}, base+3*LargeFolioSize)
	require.NoError(t, err)
	assert.Equal(t, LargeFolioSize, n)
	heads, tails := folioHeads(t, f, base+3*LargeFolioSize, LargeFolioSize)
	assert.Equal(t, 1, heads, "a whole 2 MiB write is one folio")
	assert.Equal(t, 511, tails)
	got := make([]byte, LargeFolioSize)
	_, err = f.ReadAt(got, base+3*LargeFolioSize)
	require.NoError(t, err)
	assert.Equal(t, whole, got)

	require.NoError(t, f.Allocate(base+4*LargeFolioSize, LargeFolioSize))
	assert.Len(t, presentPages(t, f, base+4*LargeFolioSize, LargeFolioSize), 512, "a whole 2 MiB allocation is present, zeros up to date")

	_, err = f.WriteBlock([][]byte{data}, base+PageSize)
	assert.ErrorContains(t, err, "want a multiple of 2097152")
}

// A partial punch of a large folio frees the punched pages and keeps the
// others with their bytes (the kernel splits the folio).
func TestLargeFolioPartialPunch(t *testing.T) {
	f := newLargeFile(t)
	base := int64(66 << 30)
	whole := make([]byte, LargeFolioSize)
	for i := range whole {
		whole[i] = byte(i / PageSize)
	}
	_, err := f.WriteBlock([][]byte{whole}, base)
	require.NoError(t, err)
	require.NoError(t, f.Punch(base+100*PageSize, 3*PageSize))
	pres := presentPages(t, f, base, LargeFolioSize)
	assert.Len(t, pres, 509)
	assert.NotContains(t, pres, 100)
	assert.NotContains(t, pres, 102)
	got := make([]byte, LargeFolioSize)
	_, err = f.ReadAt(got, base)
	require.NoError(t, err)
	for p := range 512 {
		want := byte(p)
		if p >= 100 && p < 103 {
			want = 0
		}
		require.Equal(t, want, got[p*PageSize], "page %d", p)
	}
}

// Where a reference holds the folio (here a pipe filled by vmsplice), the
// kernel cannot split it: it zeroes the punched pages and keeps them.
// Punch must say so rather than leave them looking resident.
func TestLargeFolioPunchOfPinnedFolio(t *testing.T) {
	f := newLargeFile(t)
	base := int64(68 << 30)
	_, err := f.WriteBlock([][]byte{bytes.Repeat([]byte{9}, LargeFolioSize)}, base)
	require.NoError(t, err)
	m, err := f.Map(base, LargeFolioSize)
	require.NoError(t, err)
	defer m.Unmap()
	var p [2]int
	require.NoError(t, unix.Pipe2(p[:], unix.O_CLOEXEC))
	defer unix.Close(p[0])
	defer unix.Close(p[1])
	_, err = unix.FcntlInt(uintptr(p[1]), unix.F_SETPIPE_SZ, 1<<20)
	require.NoError(t, err)
	iov := []unix.Iovec{{Base: &m.Bytes()[0]}}
	iov[0].SetLen(PageSize)
	_, err = unix.Vmsplice(p[1], iov, 0) // the pipe now holds a reference to the folio
	require.NoError(t, err)

	err = f.Punch(base+10*PageSize, PageSize)
	require.True(t, errors.Is(err, ErrFolioKept), "punch of a pinned folio: %v", err)
	assert.Contains(t, presentPages(t, f, base, LargeFolioSize), 10, "the kernel kept the punched page")

	// Once the reference is gone the punch works.
	unix.Close(p[0])
	unix.Close(p[1])
	require.NoError(t, f.Punch(base+10*PageSize, PageSize))
	assert.NotContains(t, presentPages(t, f, base, LargeFolioSize), 10)
}

func TestMemfdLargeFolioSetting(t *testing.T) {
	dir := t.TempDir()
	write := func(name, s string) string {
		p := dir + "/" + name
		require.NoError(t, os.WriteFile(p, []byte(s), 0o600))
		return p
	}
	v, err := selectedSetting(write("a", "always within_size advise [never] deny force\n"))
	require.NoError(t, err)
	assert.Equal(t, "never", v)
	_, err = selectedSetting(write("b", "garbage\n"))
	assert.ErrorContains(t, err, "no [choice]")
}

// A partial write into a file of large folios shows no page before its
// bytes are in it: another mapping that finds a page present reads what
// was written, never the zeros of a page allocated and not yet filled
// (a program reading managed memory as a page arrives would read them).
func TestLargeFolioPartialWriteShowsOnlyWholePages(t *testing.T) {
	f := newLargeFile(t)
	base := int64(80 << 30)
	const pages = LargeFolioSize/PageSize - 1
	m, err := f.Map(base, LargeFolioSize)
	require.NoError(t, err)
	defer m.Unmap()
	view := m.Bytes()
	for round := 1; round <= 20; round++ {
		require.NoError(t, f.Punch(base, LargeFolioSize))
		data := bytes.Repeat([]byte{byte(round)}, pages*PageSize)
		bad := make(chan string, 1)
		go func() {
			vec := make([]byte, 1)
			for p := 1; p <= pages; p++ {
				addr := uintptr(unsafe.Pointer(&view[p*PageSize]))
				for vec[0]&1 == 0 { // until the page is in the file
					if err := memsys.Mincore(addr, PageSize, vec); err != nil {
						bad <- err.Error()
						return
					}
				}
				vec[0] = 0
				if last, first := view[p*PageSize+PageSize-1], view[p*PageSize]; last != byte(round) || first != byte(round) {
					bad <- fmt.Sprintf("round %d: page %d present with bytes %#x...%#x, want %#x", round, p, first, last, round)
					return
				}
			}
			bad <- ""
		}()
		_, err := f.WriteAt(data, base+PageSize)
		require.NoError(t, err)
		require.Empty(t, <-bad)
	}

	// Pieces of pages: a hole gets a whole page of zeros around the bytes,
	// a present page keeps its other bytes.
	require.NoError(t, f.Punch(base, LargeFolioSize))
	_, err = f.WriteAt(bytes.Repeat([]byte{9}, PageSize), base+3*PageSize)
	require.NoError(t, err)
	_, err = f.WriteAt([]byte{1, 2, 3}, base+2*PageSize+PageSize-1) // the end of page 2, the start of page 3
	require.NoError(t, err)
	assert.Equal(t, []int{2, 3}, presentPages(t, f, base, LargeFolioSize))
	got := make([]byte, 2*PageSize)
	_, err = f.ReadAt(got, base+2*PageSize)
	require.NoError(t, err)
	want := append(make([]byte, PageSize-1), 1, 2, 3)
	want = append(want, bytes.Repeat([]byte{9}, PageSize-2)...)
	assert.Equal(t, want, got)
}

// TestLargeFolioFillsThroughKeptWindows writes pages of partial 2 MiB
// pieces in three places, two of them a window (1 GiB) apart, punches
// them, and writes them again: the fill windows stay mapped between
// writes, and must neither keep what a punch freed nor stop a page from
// coming back. A page written over while present (it stays mapped in
// its window) must take the new bytes in place. Every byte is read
// back through the file.
func TestLargeFolioFillsThroughKeptWindows(t *testing.T) {
	f := newLargeFile(t)
	offs := []int64{3<<30 + 5*PageSize, 3<<30 + 6<<20 + 7*PageSize, 4<<30 + 10<<20 + 100*PageSize}
	page := func(b byte) []byte { return bytes.Repeat([]byte{b}, PageSize) }
	allocated := func() int64 {
		n, err := f.AllocatedBytes()
		require.NoError(t, err)
		return n
	}
	base := allocated()
	for round := byte(1); round <= 3; round++ {
		for i, off := range offs {
			_, err := f.WriteAt(page(round*16+byte(i)), off)
			require.NoError(t, err)
		}
		assert.Equal(t, base+int64(len(offs))*PageSize, allocated(), "round %d: one page each, no large folio", round)
		// Written again while present: in place.
		_, err := f.WriteAt(page(0xee), offs[1])
		require.NoError(t, err)
		for i, off := range offs {
			want := page(round*16 + byte(i))
			if i == 1 {
				want = page(0xee)
			}
			got := make([]byte, PageSize)
			_, err := f.ReadAt(got, off)
			require.NoError(t, err)
			require.Equal(t, want, got, "round %d, page %d", round, i)
		}
		for _, off := range offs {
			require.NoError(t, f.Punch(off, PageSize))
		}
		assert.Equal(t, base, allocated(), "round %d: the punches freed every page the windows map", round)
		for _, off := range offs {
			assert.Empty(t, presentPages(t, f, off&^(LargeFolioSize-1), LargeFolioSize), "round %d", round)
		}
	}
	f.fill.mu.Lock()
	assert.Len(t, f.fill.windows, 2, "one window per GiB written")
	f.fill.mu.Unlock()
}

// shmemPmdMapped returns the ShmemPmdMapped figure, in KiB, of the
// mapping of this process that starts at addr (/proc/self/smaps).
func shmemPmdMapped(t *testing.T, addr uintptr) int {
	t.Helper()
	b, err := os.ReadFile("/proc/self/smaps")
	require.NoError(t, err)
	head := fmt.Sprintf("%x-", addr)
	in := false
	for _, line := range bytes.Split(b, []byte("\n")) {
		if len(line) > 0 && line[0] != ' ' && bytes.IndexByte(line, ':') > bytes.IndexByte(line, ' ') {
			in = bytes.HasPrefix(line, []byte(head)) // a mapping's first line: "start-end perms ..."
			continue
		}
		var kb int
		if in {
			if _, err := fmt.Sscanf(string(line), "ShmemPmdMapped: %d kB", &kb); err == nil {
				return kb
			}
		}
	}
	t.Fatalf("no ShmemPmdMapped line for the mapping at %#x", addr)
	return 0
}

// TestMapBlockToCopyMapsAWholeFolioHuge: a block written whole (one 2 MiB
// folio) is mapped with one huge entry at its first touch, which Map
// never does for a file of large folios; a block in 4 KiB folios is
// mapped and read all the same; every byte of both reads right; and an
// offset that is not a whole block is refused with its value.
func TestMapBlockToCopyMapsAWholeFolioHuge(t *testing.T) {
	f := newLargeFile(t)
	whole := make([]byte, LargeFolioSize)
	for i := range whole {
		whole[i] = byte(i*7 + i>>12)
	}
	const at = 10 * LargeFolioSize
	_, err := f.WriteAt(whole, at)
	require.NoError(t, err)
	const small = 12 * LargeFolioSize
	for off := 0; off < LargeFolioSize; off += 64 << 10 { // partial writes: 4 KiB folios
		_, err := f.WriteAt(whole[off:off+64<<10], small+int64(off))
		require.NoError(t, err)
	}

	m, err := f.MapBlockToCopy(at)
	require.NoError(t, err)
	require.Equal(t, whole, m.Bytes(), "the block written whole")
	assert.Equal(t, 2048, shmemPmdMapped(t, m.Addr()), "one huge entry")
	require.NoError(t, m.Unmap())

	plain, err := f.Map(at, LargeFolioSize)
	require.NoError(t, err)
	require.Equal(t, whole, plain.Bytes())
	assert.Equal(t, 0, shmemPmdMapped(t, plain.Addr()), "Map keeps 4 KiB entries")
	require.NoError(t, plain.Unmap())

	m, err = f.MapBlockToCopy(small)
	require.NoError(t, err)
	require.Equal(t, whole, m.Bytes(), "the block in 4 KiB folios")
	assert.Equal(t, 0, shmemPmdMapped(t, m.Addr()))
	require.NoError(t, m.Unmap())

	_, err = f.MapBlockToCopy(at + PageSize)
	assert.ErrorContains(t, err, fmt.Sprintf("%#x", at+PageSize))
}

// blockPattern is the content of test block i: every byte depends on the
// block and on its place in it.
func blockPattern(i int) []byte {
	b := make([]byte, LargeFolioSize)
	for j := range b {
		b[j] = byte(j*13 + j>>12 + i*71 + 1)
	}
	return b
}

// WriteBlockUnseen writes with pwrite alone, and through a mapping while
// another writer holds the file: either way the block arrives whole, as
// one large folio, over holes and over pages present before.
func TestWriteBlockUnseenThroughAMapping(t *testing.T) {
	f := newLargeFile(t)
	saved := mappedWritesFromCPUs
	mappedWritesFromCPUs = 0 // take the mapping on this machine too
	t.Cleanup(func() { mappedWritesFromCPUs = saved })
	check := func(i int, off int64, want []byte) {
		t.Helper()
		got := make([]byte, LargeFolioSize)
		_, err := f.ReadAt(got, off)
		require.NoError(t, err)
		require.True(t, bytes.Equal(want, got), "block %d's bytes", i)
		assert.Len(t, presentPages(t, f, off, LargeFolioSize), LargeFolioSize/PageSize, "block %d's pages", i)
	}

	// Alone: pwrite.
	require.NoError(t, f.WriteBlockUnseen(blockPattern(0), 0))
	check(0, 0, blockPattern(0))
	require.Zero(t, f.mappedBlockWrites.Load(), "a writer alone writes with pwrite")

	// Another writer under way: through a mapping, into a hole, then
	// over a block that held 4 KiB pages already.
	f.blockWriters.Add(1)
	require.NoError(t, f.WriteBlockUnseen(blockPattern(1), 2*LargeFolioSize))
	_, err := f.WriteAt(blockPattern(9)[:3*PageSize], 3*LargeFolioSize+5*PageSize)
	require.NoError(t, err)
	require.NoError(t, f.WriteBlockUnseen(blockPattern(2), 3*LargeFolioSize))
	f.blockWriters.Add(-1)
	require.EqualValues(t, 2, f.mappedBlockWrites.Load())
	check(1, 2*LargeFolioSize, blockPattern(1))
	check(2, 3*LargeFolioSize, blockPattern(2))
	heads, tails := folioHeads(t, f, 2*LargeFolioSize, LargeFolioSize)
	assert.Equal(t, 1, heads, "one folio written through the mapping")
	assert.Equal(t, LargeFolioSize/PageSize-1, tails)

	// Many at once, each into its own block.
	const writers, each = 6, 3
	errs := make(chan error, writers)
	start := make(chan struct{})
	for w := range writers {
		go func() {
			<-start
			for k := range each {
				i := 10 + w*each + k
				if err := f.WriteBlockUnseen(blockPattern(i), int64(i)*LargeFolioSize); err != nil {
					errs <- err
					return
				}
			}
			errs <- nil
		}()
	}
	close(start)
	for range writers {
		require.NoError(t, <-errs)
	}
	for i := 10; i < 10+writers*each; i++ {
		check(i, int64(i)*LargeFolioSize, blockPattern(i))
	}
	t.Logf("%d of %d blocks written at once went through a mapping", f.mappedBlockWrites.Load()-2, writers*each)

	// Refused: not an aligned block, or past the end.
	f.blockWriters.Add(1)
	defer f.blockWriters.Add(-1)
	err = f.WriteBlockUnseen(blockPattern(0), 4*LargeFolioSize+PageSize)
	assert.ErrorContains(t, err, fmt.Sprintf("%#x", 4*LargeFolioSize+PageSize))
	err = f.WriteBlockUnseen(blockPattern(0), FileSize)
	assert.ErrorContains(t, err, fmt.Sprintf("%#x", FileSize))
	err = f.WriteBlockUnseen(blockPattern(0)[:PageSize], 4*LargeFolioSize)
	assert.ErrorContains(t, err, "want 2097152 bytes")
}
