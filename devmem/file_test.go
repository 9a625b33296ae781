package devmem

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/softuvm/softuvm/devmem/internal/memsys"
)

// A location file behaves as the fault server needs: stores through a
// mapping are the file's contents, visible to pread, and pwrite is
// visible through the mapping.
func TestFileMapWriteRead(t *testing.T) {
	f := newFile(t, FileSize)
	assert.Equal(t, "test-TestFileMapWriteRead", f.Name())
	assert.Equal(t, int64(FileSize), f.Size())
	assert.Equal(t, -1, f.Node())
	assert.GreaterOrEqual(t, f.Fd(), 0)

	off := int64(0x7f12_3456_0000) // a typical mmap address: offsets are addresses
	m := mapFile(t, f, off, 4*PageSize)
	assert.Equal(t, int64(4*PageSize), m.Len())
	assert.NotZero(t, m.Addr())
	want := pattern(4*PageSize, 1)
	copy(m.Bytes(), want)
	assert.Equal(t, want, readAll(t, f, off, 4*PageSize))

	_, err := f.WriteAt([]byte("through pwrite"), off+PageSize+10)
	require.NoError(t, err)
	assert.Equal(t, "through pwrite", string(m.Bytes()[PageSize+10:PageSize+24]))

	allocated, err := f.AllocatedBytes()
	require.NoError(t, err)
	assert.Equal(t, int64(4*PageSize), allocated)
}

// ReadAt follows io.ReaderAt at the end of a file, and holes read as
// zeros without allocating.
func TestFileReadAt(t *testing.T) {
	f := newFile(t, 2*PageSize)
	p := make([]byte, PageSize)
	n, err := f.ReadAt(p, 0)
	require.NoError(t, err)
	assert.Equal(t, PageSize, n)
	assert.True(t, isZero(p))
	allocated, err := f.AllocatedBytes()
	require.NoError(t, err)
	assert.Zero(t, allocated, "reading a hole allocates nothing")

	n, err = f.ReadAt(make([]byte, 2*PageSize), PageSize)
	assert.Equal(t, PageSize, n)
	assert.ErrorIs(t, err, io.EOF)
}

// Punch frees pages and zaps them from existing mappings: the memory
// really goes (AllocatedBytes drops before anything touches the range
// again) and the mapping then reads zeros.
func TestFilePunch(t *testing.T) {
	f := newFile(t, FileSize)
	const off = 1 << 30
	m := mapFile(t, f, off, 4*PageSize)
	copy(m.Bytes(), pattern(4*PageSize, 2))

	ext, err := f.DataExtents(off, 4*PageSize)
	require.NoError(t, err)
	assert.Equal(t, []Extent{{Off: off, Len: 4 * PageSize}}, ext)

	require.NoError(t, f.Punch(off+PageSize, PageSize))
	allocated, err := f.AllocatedBytes()
	require.NoError(t, err)
	assert.Equal(t, int64(3*PageSize), allocated, "punch frees the page")
	ext, err = f.DataExtents(off, 4*PageSize)
	require.NoError(t, err)
	assert.Equal(t, []Extent{{Off: off, Len: PageSize}, {Off: off + 2*PageSize, Len: 2 * PageSize}}, ext)

	// The PTE was zapped: the next read faults and, shmem having no
	// shared zero page, allocates a fresh zeroed page.
	assert.True(t, isZero(m.Bytes()[PageSize:2*PageSize]))
	assert.Equal(t, pattern(4*PageSize, 2)[2*PageSize:], m.Bytes()[2*PageSize:], "neighbours untouched")
	allocated, err = f.AllocatedBytes()
	require.NoError(t, err)
	assert.Equal(t, int64(4*PageSize), allocated, "touching the hole refilled it")

	require.NoError(t, f.Punch(off, 4*PageSize))
	allocated, err = f.AllocatedBytes()
	require.NoError(t, err)
	assert.Zero(t, allocated)
}

func TestFileAllocate(t *testing.T) {
	f := newFile(t, FileSize)
	const off = 5 * PageSize
	require.NoError(t, f.Allocate(off, 3*PageSize))
	allocated, err := f.AllocatedBytes()
	require.NoError(t, err)
	assert.Equal(t, int64(3*PageSize), allocated)
	assert.True(t, isZero(readAll(t, f, off, 3*PageSize)))

	// shmem reports allocated pages that were never written as holes to
	// SEEK_DATA: they hold nothing but zeros. Writing makes them data.
	ext, err := f.DataExtents(0, 16*PageSize)
	require.NoError(t, err)
	assert.Empty(t, ext)
	_, err = f.WriteAt([]byte{1}, off+PageSize)
	require.NoError(t, err)
	ext, err = f.DataExtents(0, 16*PageSize)
	require.NoError(t, err)
	assert.Equal(t, []Extent{{Off: off + PageSize, Len: PageSize}}, ext)
	allocated, err = f.AllocatedBytes()
	require.NoError(t, err)
	assert.Equal(t, int64(3*PageSize), allocated, "writing an allocated page allocates nothing more")
}

// DataExtents clips to the range asked about and finds data far apart
// in a sparse file without visiting the holes.
func TestFileDataExtents(t *testing.T) {
	f := newFile(t, FileSize)
	ext, err := f.DataExtents(0, FileSize)
	require.NoError(t, err)
	assert.Empty(t, ext, "a new file is one hole")

	for _, off := range []int64{0, 2 * PageSize, 3 * PageSize, 1 << 40, FileSize - PageSize} {
		_, err := f.WriteAt([]byte{1}, off)
		require.NoError(t, err)
	}
	for _, tc := range []struct {
		off, length int64
		want        []Extent
	}{
		{0, FileSize, []Extent{{0, PageSize}, {2 * PageSize, 2 * PageSize}, {1 << 40, PageSize}, {FileSize - PageSize, PageSize}}},
		{PageSize, PageSize, nil},
		{100, 3 * PageSize, []Extent{{100, PageSize - 100}, {2 * PageSize, PageSize + 100}}},
		{3 * PageSize, 1<<40 - 3*PageSize, []Extent{{3 * PageSize, PageSize}}},
		{1<<40 + 10, 20, []Extent{{1<<40 + 10, 20}}},
		{FileSize, 0, nil},
	} {
		t.Run(fmt.Sprintf("%#x+%d", tc.off, tc.length), func(t *testing.T) {
			ext, err := f.DataExtents(tc.off, tc.length)
			require.NoError(t, err)
			assert.Equal(t, tc.want, ext)
		})
	}
	assert.Equal(t, int64(3*PageSize), Extent{PageSize, 2 * PageSize}.End())
}

func TestFileCopyFrom(t *testing.T) {
	src := newFile(t, FileSize)
	for _, tc := range []struct {
		name                   string
		srcOff, dstOff, length int64
	}{
		{"one page", 1 << 30, 1 << 30, PageSize},
		{"8 MiB", 1 << 32, 1 << 32, 8 << 20},
		{"unaligned", 1<<30 + 100, 1<<31 + 5000, 10_000},
		{"unaligned 3 MiB", 1<<32 + 4095, 7, 3<<20 + 1},
		{"last byte", FileSize - 1, 0, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			want := pattern(int(tc.length), 3)
			_, err := src.WriteAt(want, tc.srcOff)
			require.NoError(t, err)
			dst := newFile(t, FileSize)
			n, err := dst.CopyFrom(src, tc.srcOff, tc.dstOff, tc.length)
			require.NoError(t, err)
			assert.Equal(t, tc.length, n)
			assert.Equal(t, want, readAll(t, dst, tc.dstOff, int(tc.length)))
		})
	}
}

// Holes in src become zero-filled pages in dst: data in dst under a
// source hole is overwritten, not left behind.
func TestFileCopyFromHoles(t *testing.T) {
	src := newFile(t, FileSize)
	dst := newFile(t, FileSize)
	const off = 1 << 35
	_, err := src.WriteAt(pattern(PageSize, 4), off)
	require.NoError(t, err)
	_, err = src.WriteAt(pattern(PageSize, 5), off+2*PageSize)
	require.NoError(t, err)
	_, err = dst.WriteAt(pattern(3*PageSize, 6), off)
	require.NoError(t, err)

	n, err := dst.CopyFrom(src, off, off, 3*PageSize)
	require.NoError(t, err)
	assert.Equal(t, int64(3*PageSize), n)
	got := readAll(t, dst, off, 3*PageSize)
	assert.Equal(t, pattern(PageSize, 4), got[:PageSize])
	assert.True(t, isZero(got[PageSize:2*PageSize]), "the hole copied as zeros")
	assert.Equal(t, pattern(PageSize, 5), got[2*PageSize:])

	// And into a fresh file the hole arrives as an allocated zero page.
	fresh := newFile(t, FileSize)
	_, err = fresh.CopyFrom(src, off, off, 3*PageSize)
	require.NoError(t, err)
	allocated, err := fresh.AllocatedBytes()
	require.NoError(t, err)
	assert.Contains(t, []int64{2 * PageSize, 3 * PageSize}, allocated)
}

// Between a memfd and a file on another file system the kernel refuses
// copy_file_range with EXDEV, which exercises the bounce-buffer path.
func TestFileCopyFromFallback(t *testing.T) {
	const size = 16 << 20
	osf, err := os.Create(filepath.Join(t.TempDir(), "other-fs"))
	require.NoError(t, err)
	require.NoError(t, osf.Truncate(size))
	fd, err := memsys.Dup(int(osf.Fd()))
	require.NoError(t, err)
	require.NoError(t, osf.Close())
	disk, err := FileFromFD(fd, "disk")
	require.NoError(t, err)
	defer disk.Close()
	mem := newFile(t, FileSize)

	_, err = memsys.CopyFileRange(mem.Fd(), 0, disk.Fd(), 0, PageSize)
	if !errors.Is(err, syscall.EXDEV) {
		t.Logf("copy_file_range memfd -> %s gave %v, not EXDEV: the fallback is exercised only by the direct call below", t.TempDir(), err)
	}

	want := pattern(3<<20+123, 7)
	_, err = mem.WriteAt(want, 1<<33+11)
	require.NoError(t, err)
	n, err := disk.CopyFrom(mem, 1<<33+11, 4096+5, int64(len(want)))
	require.NoError(t, err)
	assert.Equal(t, int64(len(want)), n)
	assert.Equal(t, want, readAll(t, disk, 4096+5, len(want)))

	back := newFile(t, FileSize)
	n, err = back.CopyFrom(disk, 4096+5, 1<<20, int64(len(want)))
	require.NoError(t, err)
	assert.Equal(t, int64(len(want)), n)
	assert.Equal(t, want, readAll(t, back, 1<<20, len(want)))

	// The bounce path on its own, between two memfds.
	direct := newFile(t, FileSize)
	n, err = direct.copyBounce(mem, mem.Fd(), direct.Fd(), 1<<33+11, 77, int64(len(want)))
	require.NoError(t, err)
	assert.Equal(t, int64(len(want)), n)
	assert.Equal(t, want, readAll(t, direct, 77, len(want)))
}

// Overlapping copies within one file are refused, whether the overlap
// is visible (same *File) or only to the kernel (a dup of it).
func TestFileCopyFromOverlap(t *testing.T) {
	f := newFile(t, FileSize)
	_, err := f.CopyFrom(f, 0, PageSize, 2*PageSize)
	assert.ErrorContains(t, err, "ranges overlap")

	fd, err := memsys.Dup(f.Fd())
	require.NoError(t, err)
	g, err := FileFromFD(fd, "dup")
	require.NoError(t, err)
	defer g.Close()
	_, err = g.CopyFrom(f, 0, PageSize, 2*PageSize)
	assert.ErrorContains(t, err, "ranges overlap")

	// Disjoint ranges of one file are fine.
	_, err = f.WriteAt(pattern(PageSize, 8), 0)
	require.NoError(t, err)
	_, err = f.CopyFrom(f, 0, 1<<40, PageSize)
	require.NoError(t, err)
	assert.Equal(t, pattern(PageSize, 8), readAll(t, f, 1<<40, PageSize))
}

// FileFromFD adopts a received descriptor: a dup of a memfd sees the
// same pages, and closing one leaves the other working.
func TestFileFromFD(t *testing.T) {
	f := newFile(t, FileSize)
	_, err := f.WriteAt([]byte("shared"), 1<<44)
	require.NoError(t, err)
	fd, err := memsys.Dup(f.Fd())
	require.NoError(t, err)
	g, err := FileFromFD(fd, "received")
	require.NoError(t, err)
	assert.Equal(t, "received", g.Name())
	assert.Equal(t, int64(FileSize), g.Size())
	assert.Equal(t, -1, g.Node())
	assert.Equal(t, fd, g.Fd())
	assert.Equal(t, "shared", string(readAll(t, g, 1<<44, 6)))

	_, err = g.WriteAt([]byte("back"), 1<<44)
	require.NoError(t, err)
	require.NoError(t, g.Close())
	assert.Equal(t, "backed", string(readAll(t, f, 1<<44, 6)))
}

// FileFromFD refuses what is not a regular file, naming what it got,
// and closes the descriptor either way (the leak check would catch it).
func TestFileFromFDErrors(t *testing.T) {
	r, w, err := os.Pipe()
	require.NoError(t, err)
	defer r.Close()
	defer w.Close()
	fd, err := memsys.Dup(int(r.Fd()))
	require.NoError(t, err)
	_, err = FileFromFD(fd, "pipe")
	assert.ErrorContains(t, err, "it is a pipe: want a memfd or regular file")

	d, err := os.Open(t.TempDir())
	require.NoError(t, err)
	fd, err = memsys.Dup(int(d.Fd()))
	require.NoError(t, err)
	require.NoError(t, d.Close())
	_, err = FileFromFD(fd, "dir")
	assert.ErrorContains(t, err, "it is a directory")

	_, err = FileFromFD(-1, "nothing")
	assert.ErrorContains(t, err, "fd -1: want a descriptor >= 0")

	_, err = CreateFile("empty", 0)
	assert.ErrorContains(t, err, "size 0: want > 0")
}

// Bad ranges are refused before any system call, and the error names
// the offending value and what was wanted.
func TestFileInputErrors(t *testing.T) {
	f := newFile(t, FileSize)
	other := newFile(t, 4*PageSize)
	addr := uintptr(1 << 30)
	for _, tc := range []struct {
		name string
		call func() error
		want string
	}{
		{"punch negative", func() error { return f.Punch(-PageSize, PageSize) }, "punch test-TestFileInputErrors -0x1000+4096: offset -4096: want >= 0"},
		{"punch unaligned offset", func() error { return f.Punch(1, PageSize) }, "offset 0x1: want a multiple of 4096"},
		{"punch unaligned length", func() error { return f.Punch(0, 100) }, "length 100: want a multiple of 4096"},
		{"punch empty", func() error { return f.Punch(0, 0) }, "length 0: want > 0"},
		{"punch beyond", func() error { return f.Punch(FileSize-PageSize, 2*PageSize) }, "range ends at 0x800000001000: want at most the file size 0x800000000000"},
		{"punch overflow", func() error { return f.Punch(1<<62, 1<<62) }, "want at most the file size"},
		{"allocate unaligned", func() error { return f.Allocate(PageSize+8, PageSize) }, "allocate test-TestFileInputErrors 0x1008+4096: offset 0x1008: want a multiple of 4096"},
		{"allocate beyond", func() error { return other.Allocate(0, 8*PageSize) }, "range ends at 0x8000: want at most the file size 0x4000"},
		{"map unaligned", func() error { _, err := f.Map(10, PageSize); return err }, "map test-TestFileInputErrors 0xa+4096: offset 0xa: want a multiple of 4096"},
		{"map empty", func() error { _, err := f.Map(0, 0); return err }, "length 0: want > 0"},
		{"map fixed unaligned address", func() error { return f.MapFixed(addr+1, 0, PageSize) }, "address 0x40000001: want a nonzero multiple of 4096"},
		{"map fixed nil address", func() error { return f.MapFixed(0, 0, PageSize) }, "address 0x0: want a nonzero multiple of 4096"},
		{"bind negative node", func() error { return f.BindRange(-1, 0, PageSize) }, "node -1: want 0..1023"},
		{"bind unaligned", func() error { return f.BindRange(0, 0, 1) }, "length 1: want a multiple of 4096"},
		{"write beyond", func() error { _, err := other.WriteAt(make([]byte, 10), 4*PageSize-5); return err }, "write test-TestFileInputErrors 0x3ffb+10: range ends at 0x4005"},
		{"write negative", func() error { _, err := f.WriteAt([]byte{1}, -1); return err }, "offset -1: want >= 0"},
		{"read negative", func() error { _, err := f.ReadAt([]byte{1}, -8); return err }, "offset -8: want >= 0"},
		{"extents negative length", func() error { _, err := f.DataExtents(0, -1); return err }, "length -1: want > 0"},
		{"copy negative source", func() error { _, err := f.CopyFrom(other, -1, 0, 1); return err }, "copy from test-TestFileInputErrors -0x1+1: offset -1: want >= 0"},
		{"copy beyond source", func() error { _, err := f.CopyFrom(other, 0, 0, 5*PageSize); return err }, "range ends at 0x5000: want at most the file size 0x4000"},
		{"copy beyond destination", func() error { _, err := other.CopyFrom(f, 0, 3*PageSize, 2*PageSize); return err }, "copy to test-TestFileInputErrors 0x3000+8192"},
		{"copy negative length", func() error { _, err := f.CopyFrom(other, 0, 0, -1); return err }, "length -1: want > 0"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			assert.ErrorContains(t, tc.call(), tc.want)
		})
	}
}

// Close is idempotent and later calls fail with os.ErrClosed rather than
// touching whatever now has the descriptor number.
func TestFileClose(t *testing.T) {
	f, err := CreateFile("closing", FileSize)
	require.NoError(t, err)
	require.NoError(t, f.Close())
	require.NoError(t, f.Close())
	assert.Equal(t, -1, f.Fd())
	assert.ErrorIs(t, f.Punch(0, PageSize), os.ErrClosed)
	_, err = f.ReadAt(make([]byte, 1), 0)
	assert.ErrorIs(t, err, os.ErrClosed)
	_, err = f.AllocatedBytes()
	assert.ErrorIs(t, err, os.ErrClosed)
	_, err = f.Map(0, PageSize)
	assert.ErrorIs(t, err, os.ErrClosed)
}

// System-call errors keep their errno and say what was attempted.
func TestFileErrnoKept(t *testing.T) {
	f := newFile(t, FileSize)
	// The kernel cannot map all 2^47 bytes at once (that is the whole
	// user address space): ENOMEM, with the range named.
	_, err := f.Map(0, FileSize)
	if err == nil {
		t.Skip("this kernel mapped the whole address space")
	}
	assert.ErrorIs(t, err, syscall.ENOMEM)
	assert.ErrorContains(t, err, "map test-TestFileErrnoKept 0x0+140737488355328: cannot allocate memory")
}
