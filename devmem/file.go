package devmem

import (
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"sync/atomic"
	"syscall"

	"github.com/softuvm/softuvm/devmem/internal/memsys"
	"github.com/softuvm/softuvm/uffd"
)

// PageSize is the unit the fault server moves memory in.
const PageSize = 4096

// FileSize is the size of every location file. Files are sparse and this
// large so that a file offset can equal a virtual address: 1<<47 covers
// the whole x86-64 user address space with 4-level page tables.
const FileSize = 1 << 47

// File is a location file: a memfd whose page at offset o holds the page
// of virtual address o.
//
// Its methods may be called from many goroutines at once, except Close,
// which must not race with the others (as with a raw descriptor, the
// number could be reused by the time a racing call uses it).
type File struct {
	fd     int
	name   string
	size   int64
	node   atomic.Int64
	closed atomic.Bool
	// large: the file may take folios larger than a page (large.go),
	// so writes, allocations and punches keep pages of a partial 2 MiB
	// in 4 KiB folios.
	large bool
	// fill is the userfaultfd that puts partial pieces of a large file
	// in 4 KiB folios, and the windows of the file registered with it
	// that they are copied into (large.go: fillPages).
	fill struct {
		once sync.Once
		fd   *uffd.FD
		err  error
		mu   sync.Mutex
		// windows holds the window of each fillWindowSize of the file
		// that a fill reached, by index. Guarded by mu.
		windows map[int64]*Mapping
	}
	// blockWriters counts the WriteBlockUnseen calls under way, which
	// choose between pwrite and a mapping by it.
	blockWriters atomic.Int32
	// mappedBlockWrites counts the blocks WriteBlockUnseen wrote through
	// a mapping (its tests read it).
	mappedBlockWrites atomic.Uint64
}

// CreateFile creates an anonymous memory file of the given size; name
// shows in /proc/PID/fd and in error messages.
func CreateFile(name string, size int64) (*File, error) {
	return createSized(name, size, memfdTakesLargeFolios(), func() (int, error) {
		fd, err := memsys.MemfdCreate(name)
		if err != nil {
			return -1, fmt.Errorf("memfd_create: %w", err)
		}
		return fd, nil
	})
}

// createSized makes a file with create and sizes it.
func createSized(name string, size int64, large bool, create func() (int, error)) (*File, error) {
	if size <= 0 {
		return nil, fmt.Errorf("create %s: size %d: want > 0", name, size)
	}
	fd, err := create()
	if err != nil {
		return nil, fmt.Errorf("create %s: %w", name, err)
	}
	if err := memsys.Ftruncate(fd, size); err != nil {
		memsys.Close(fd)
		return nil, fmt.Errorf("create %s: ftruncate to %#x: %w", name, size, err)
	}
	f := wrapFD(fd, name, size)
	f.large = large
	return f, nil
}

// FileFromFD adopts fd, typically one received over SCM_RIGHTS from a
// client, and sizes the File from fstat. It always takes ownership: on
// error fd is closed too, so a receiver has no leak path to get wrong.
// The file must be a regular file (a memfd is one); pipes, sockets and
// devices are refused because punching and copying pages in them does
// not mean what the fault server needs it to mean.
//
// The File's Node is -1: a received file carries whatever policy its
// creator gave it, and devmem does not guess.
func FileFromFD(fd int, name string) (*File, error) {
	if fd < 0 {
		return nil, fmt.Errorf("adopt %s: fd %d: want a descriptor >= 0", name, fd)
	}
	st, err := memsys.Fstat(fd)
	if err != nil {
		memsys.Close(fd)
		return nil, fmt.Errorf("adopt %s fd %d: fstat: %w", name, fd, err)
	}
	if !st.IsRegular() {
		memsys.Close(fd)
		return nil, fmt.Errorf("adopt %s fd %d: it is a %s: want a memfd or regular file", name, fd, st.FileType())
	}
	if st.Size <= 0 {
		memsys.Close(fd)
		return nil, fmt.Errorf("adopt %s fd %d: size %d: want > 0", name, fd, st.Size)
	}
	// A descriptor received without MSG_CMSG_CLOEXEC would otherwise
	// leak into anything the server execs.
	if err := memsys.SetCloexec(fd); err != nil {
		memsys.Close(fd)
		return nil, fmt.Errorf("adopt %s fd %d: set close-on-exec: %w", name, fd, err)
	}
	f := wrapFD(fd, name, st.Size)
	f.large = mayTakeLargeFolios(fd)
	return f, nil
}

func wrapFD(fd int, name string, size int64) *File {
	f := &File{fd: fd, name: name, size: size}
	f.node.Store(-1)
	return f
}

// Fd returns the descriptor, for passing over SCM_RIGHTS; -1 after Close.
// The File still owns it.
func (f *File) Fd() int {
	if f.closed.Load() {
		return -1
	}
	return f.fd
}

// Name returns the name given at creation.
func (f *File) Name() string { return f.name }

// Size returns the file's size (FileSize for location files).
func (f *File) Size() int64 { return f.size }

// Node returns the NUMA node the whole file is bound to, or -1 if none:
// it is set by BindRange over the whole file, which Arena.NewFile does on
// the NUMA backend.
func (f *File) Node() int { return int(f.node.Load()) }

// Close closes the descriptor. Mappings of the file stay valid; the
// memory is freed when the last descriptor and mapping are gone. Closing
// twice is not an error.
func (f *File) Close() error {
	if f.closed.Swap(true) {
		return nil
	}
	if f.fill.fd != nil {
		// The windows are mappings of the file: its pages would outlive
		// the descriptor.
		f.fill.mu.Lock()
		for _, w := range f.fill.windows {
			_ = w.Unmap()
		}
		f.fill.windows = nil
		f.fill.mu.Unlock()
		_ = f.fill.fd.Close()
	}
	if err := memsys.Close(f.fd); err != nil {
		return fmt.Errorf("close %s: %w", f.name, err)
	}
	return nil
}

func (f *File) sysfd(op string) (int, error) {
	if f.closed.Load() {
		return -1, fmt.Errorf("%s %s: %w", op, f.name, os.ErrClosed)
	}
	return f.fd, nil
}

// checkRange validates [off, off+length) against the file. The error
// names the operation, the file, the range, the offending value and what
// was expected.
func (f *File) checkRange(op string, off, length int64, aligned bool) error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%s %s %#x+%d: %s", op, f.name, off, length, fmt.Sprintf(format, args...))
	}
	switch {
	case off < 0:
		return bad("offset %d: want >= 0", off)
	case length <= 0:
		return bad("length %d: want > 0", length)
	case aligned && off%PageSize != 0:
		return bad("offset %#x: want a multiple of %d", off, PageSize)
	case aligned && length%PageSize != 0:
		return bad("length %d: want a multiple of %d", length, PageSize)
	case off > f.size || length > f.size-off:
		return bad("range ends at %#x: want at most the file size %#x", uint64(off)+uint64(length), f.size)
	}
	return nil
}

// Punch frees the pages of [off, off+length) (page-aligned) and zaps
// every page-table entry mapping them, in every process, so the next
// access through any mapping faults. On a file of large folios a punch
// of part of a 2 MiB folio splits it; where the kernel cannot split it
// the punched pages stay, zeroed, and after a few milliseconds of
// retries Punch returns ErrFolioKept. The caller then rebuilds the
// block: with every writer of it held, it reads the pages that belong
// there, punches the whole 2 MiB and writes them back (WriteAt puts them
// in 4 KiB folios).
func (f *File) Punch(off, length int64) error {
	if err := f.checkRange("punch", off, length, true); err != nil {
		return err
	}
	fd, err := f.sysfd("punch")
	if err != nil {
		return err
	}
	if f.large {
		return f.punchLarge(fd, off, length)
	}
	if err := memsys.PunchHole(fd, off, length); err != nil {
		return fmt.Errorf("punch %s %#x+%d: %w", f.name, off, length, err)
	}
	return nil
}

// Allocate allocates the pages of [off, off+length) (page-aligned),
// zero-filled where they were holes. On a node-bound file they are
// allocated on that node. Until written, DataExtents reports them as
// holes.
func (f *File) Allocate(off, length int64) error {
	if err := f.checkRange("allocate", off, length, true); err != nil {
		return err
	}
	fd, err := f.sysfd("allocate")
	if err != nil {
		return err
	}
	if f.large {
		return f.allocateLarge(fd, off, length)
	}
	if err := memsys.Fallocate(fd, off, length); err != nil {
		return fmt.Errorf("allocate %s %#x+%d: %w", f.name, off, length, err)
	}
	return nil
}

// ReadAt reads len(p) bytes at off, looping over short reads. Holes read
// as zeros without allocating. As io.ReaderAt requires, a read that runs
// past the end of the file returns what it got and io.EOF.
func (f *File) ReadAt(p []byte, off int64) (int, error) {
	if off < 0 {
		return 0, fmt.Errorf("read %s %#x+%d: offset %d: want >= 0", f.name, off, len(p), off)
	}
	fd, err := f.sysfd("read")
	if err != nil {
		return 0, err
	}
	n := 0
	for n < len(p) {
		c, err := memsys.Pread(fd, p[n:], off+int64(n))
		if err != nil {
			return n, fmt.Errorf("read %s %#x+%d: %w", f.name, off+int64(n), len(p)-n, err)
		}
		if c == 0 {
			return n, io.EOF
		}
		n += c
	}
	return n, nil
}

// WriteAt writes all of p at off, looping over short writes. Writing
// past the file's size is refused rather than growing the file: every
// location file has the same size, and growth would be a bug.
func (f *File) WriteAt(p []byte, off int64) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	if err := f.checkRange("write", off, int64(len(p)), false); err != nil {
		return 0, err
	}
	fd, err := f.sysfd("write")
	if err != nil {
		return 0, err
	}
	if f.large {
		return f.writeLarge(fd, p, off)
	}
	return f.pwriteAll(fd, p, off)
}

func (f *File) pwriteAll(fd int, p []byte, off int64) (int, error) {
	n := 0
	for n < len(p) {
		c, err := memsys.Pwrite(fd, p[n:], off+int64(n))
		if err != nil {
			return n, fmt.Errorf("write %s %#x+%d: %w", f.name, off+int64(n), len(p)-n, err)
		}
		if c == 0 {
			return n, fmt.Errorf("write %s %#x+%d: %w", f.name, off+int64(n), len(p)-n, io.ErrShortWrite)
		}
		n += c
	}
	return n, nil
}

// Extent is a run of bytes [Off, Off+Len) of a file.
type Extent struct{ Off, Len int64 }

// End returns the offset just past the extent.
func (e Extent) End() int64 { return e.Off + e.Len }

// DataExtents lists the allocated (non-hole) extents within
// [off, off+length), in order, clipped to that range. It uses
// SEEK_DATA/SEEK_HOLE, which move the descriptor's file position: nothing
// in softuvm uses the position (all I/O is positional), so sharing the
// open file with other processes is unaffected.
//
// Pages that fallocate created and nothing has written yet count as
// holes: shmem reports them so, since they hold only zeros.
// AllocatedBytes counts them. (On a file of large folios Allocate
// writes zeros or faults pages in instead, and those count as data.)
func (f *File) DataExtents(off, length int64) ([]Extent, error) {
	if length == 0 && off >= 0 && off <= f.size {
		return nil, nil
	}
	if err := f.checkRange("extents", off, length, false); err != nil {
		return nil, err
	}
	fd, err := f.sysfd("extents")
	if err != nil {
		return nil, err
	}
	end := off + length
	var extents []Extent
	for pos := off; pos < end; {
		data, err := memsys.SeekData(fd, pos)
		if errors.Is(err, syscall.ENXIO) {
			break // no data at or after pos
		}
		if err != nil {
			return nil, fmt.Errorf("extents %s %#x+%d: seek data from %#x: %w", f.name, off, length, pos, err)
		}
		if data >= end {
			break
		}
		hole, err := memsys.SeekHole(fd, data)
		if err != nil {
			return nil, fmt.Errorf("extents %s %#x+%d: seek hole from %#x: %w", f.name, off, length, data, err)
		}
		hole = min(hole, end)
		extents = append(extents, Extent{Off: data, Len: hole - data})
		pos = hole
	}
	return extents, nil
}

// AllocatedBytes reports how much memory the file holds (st_blocks*512),
// resident or swapped out. Leak checks compare it with what the arena
// accounted.
func (f *File) AllocatedBytes() (int64, error) {
	fd, err := f.sysfd("stat")
	if err != nil {
		return 0, err
	}
	st, err := memsys.Fstat(fd)
	if err != nil {
		return 0, fmt.Errorf("stat %s: %w", f.name, err)
	}
	return st.Blocks * 512, nil
}
