package devmem

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/softuvm/softuvm/devmem/internal/memsys"
	"github.com/softuvm/softuvm/uffd"
)

// LargeFolioSize is the folio a location file of large folios allocates
// for a whole, aligned 2 MiB: one allocation and one free where 4 KiB
// folios cost 512 of each.
const LargeFolioSize = 2 << 20

// ErrFolioKept reports a punch that left memory in the punched range:
// the kernel could not split the large folio holding it (someone holds a
// reference to it, a pipe filled by vmsplice for one), so it zeroed the
// range and kept it. The pages read as zeros through any mapping without
// faulting, so the caller must rebuild the block (Punch's doc says how).
var ErrFolioKept = errors.New("a large folio kept the punched pages")

// largeFileSeq numbers the files CreateLargeFolioFile makes.
var largeFileSeq atomic.Uint64

var largeMount struct {
	once sync.Once
	fd   int
	err  error
}

// largeFolioMount returns the root of this process's private tmpfs
// mounted with huge=always (made on first use, never attached to the
// file system tree), or why there is none.
func largeFolioMount() (int, error) {
	largeMount.once.Do(func() {
		largeMount.fd, largeMount.err = memsys.NewHugeTmpfs()
	})
	return largeMount.fd, largeMount.err
}

// LargeFoliosAvailable returns nil if CreateLargeFolioFile can work
// here, else why not (typically: not root, so no tmpfs can be made).
func LargeFoliosAvailable() error {
	_, err := largeFolioMount()
	return err
}

// CreateLargeFolioFile creates a location file whose whole, aligned
// 2 MiB writes (WriteBlock, WriteAt, Allocate) take one 2 MiB folio.
// Everything smaller goes in as 4 KiB folios: a 4 KiB write into an
// empty 2 MiB of such a file would otherwise allocate the whole folio,
// and the other 511 pages would then read as zeros through every mapping
// instead of faulting, as if they lived there. Its methods keep that
// invariant: a page is present in the file only where it was written
// or allocated.
func CreateLargeFolioFile(name string, size int64) (*File, error) {
	return createSized(name, size, true, func() (int, error) {
		mnt, err := largeFolioMount()
		if err != nil {
			return -1, fmt.Errorf("large folios: %w", err)
		}
		// Named as a memfd would be, so that /proc/PID/maps shows what
		// each mapping is; a number keeps names of one server apart.
		fd, err := memsys.OpenUnlinked(mnt, fmt.Sprintf("%s.%d", strings.ReplaceAll(name, "/", "_"), largeFileSeq.Add(1)))
		if err != nil {
			return -1, fmt.Errorf("large folios: open a file in the private tmpfs: %w", err)
		}
		return fd, nil
	})
}

// Large reports whether the file takes large folios, as
// CreateLargeFolioFile makes them or as a received file reports (a
// tmpfs mounted huge=always or within_size).
func (f *File) Large() bool { return f.large }

// checkOneBlock refuses [off, off+length) for op unless it is one whole,
// aligned large folio.
func (f *File) checkOneBlock(op string, off, length int64) error {
	if length != LargeFolioSize || !whole(off, length) {
		return fmt.Errorf("%s %s %#x+%d: want %d bytes at a multiple of it", op, f.name, off, length, LargeFolioSize)
	}
	return nil
}

// whole reports whether [off, off+length) covers only whole, aligned
// large folios.
func whole(off, length int64) bool {
	return off%LargeFolioSize == 0 && length%LargeFolioSize == 0
}

// eachPiece splits [off, off+length) into the whole, aligned 2 MiB
// pieces and the rest, in order.
func eachPiece(off, length int64, fn func(off, length int64, whole bool) error) error {
	end := off + length
	for off < end {
		next := min(end, (off/LargeFolioSize+1)*LargeFolioSize)
		if err := fn(off, next-off, off%LargeFolioSize == 0 && next-off == LargeFolioSize); err != nil {
			return err
		}
		off = next
	}
	return nil
}

// window maps the pages covering [off, off+length) of the file with
// 4 KiB faults only (MADV_NOHUGEPAGE) and passes fn the bytes of
// [off, off+length).
func (f *File) window(op string, off, length int64, fn func(addr uintptr, b []byte) error) error {
	fd, err := f.sysfd(op)
	if err != nil {
		return err
	}
	first := off &^ (PageSize - 1)
	span := (off+length+PageSize-1)&^(PageSize-1) - first
	addr, err := memsys.Mmap(0, uintptr(span), memsys.ProtRead|memsys.ProtWrite, memsys.MapShared, fd, first)
	if err != nil {
		return fmt.Errorf("%s %s %#x+%d: map a window: %w", op, f.name, off, length, err)
	}
	defer memsys.Munmap(addr, uintptr(span))
	if err := memsys.MadviseNoHugepage(addr, uintptr(span)); err != nil {
		return fmt.Errorf("%s %s %#x+%d: window without large folios: %w", op, f.name, off, length, err)
	}
	return fn(addr+uintptr(off-first), memsys.Bytes(addr+uintptr(off-first), int(length)))
}

// WriteBlock writes the buffers, in order, at off as one large folio
// per 2 MiB: off and their total length must be multiples of
// LargeFolioSize. On a file without large folios it is WriteAt.
func (f *File) WriteBlock(bufs [][]byte, off int64) (int, error) {
	var total int64
	for _, b := range bufs {
		total += int64(len(b))
	}
	if err := f.checkRange("write block", off, total, true); err != nil {
		return 0, err
	}
	if !whole(off, total) {
		return 0, fmt.Errorf("write block %s %#x+%d: want a multiple of %d at a multiple of it", f.name, off, total, LargeFolioSize)
	}
	fd, err := f.sysfd("write block")
	if err != nil {
		return 0, err
	}
	mapSource(bufs...)
	n := 0
	for len(bufs) > 0 {
		c, err := memsys.Pwritev(fd, bufs, off+int64(n))
		if err != nil {
			return n, fmt.Errorf("write block %s %#x+%d: %w", f.name, off+int64(n), total-int64(n), err)
		}
		if c == 0 {
			return n, fmt.Errorf("write block %s %#x+%d: no progress", f.name, off+int64(n), total-int64(n))
		}
		n += c
		for c > 0 && len(bufs) > 0 { // drop what was written
			k := min(c, len(bufs[0]))
			bufs[0] = bufs[0][k:]
			c -= k
			if len(bufs[0]) == 0 {
				bufs = bufs[1:]
			}
		}
	}
	return n, nil
}

// mappedWritesFromCPUs is the fewest CPUs on which WriteBlockUnseen
// writes through a mapping while another writer holds the file. With 2
// CPUs, which two block movers and the program keep busy, the clearing a
// mapping's write adds cost more than the wait for the lock: Prefetch of
// 256 MiB ran at 0.47-0.54 of memcpy_all that way, against 0.54-0.69
// with pwrite alone.
var mappedWritesFromCPUs = 4 // a variable so that tests can take the mapping on any machine

// WriteBlockUnseen writes the 2 MiB b at off, a whole, aligned block,
// as one large folio, as WriteBlock does, for a caller that guarantees
// that nothing reads the block through a mapping of the file before it
// returns: every view of the file faults to the fault server first (a
// view registered for MINOR faults), and the server holds the block.
//
// A pwrite holds the file's inode lock for its whole copy, so writers of
// one file take turns: on a 16-CPU machine, threads writing 2 MiB blocks
// into one file moved 5.9-6.8 GB/s together whatever their number, and
// into a file each 42-44 GB/s with 8 (docs/benchmarks-log.md, "Several
// movers into one file"). So where another WriteBlockUnseen of this file
// is under way, this one writes through a mapping, which takes no inode
// lock: fallocate allocates the folio (a full file is then its error, not
// a SIGBUS in the copy), the mapping's first touch clears it and maps it
// with one huge entry, and the copy fills it. A mapping's write costs a
// thread more than a pwrite (the folio is cleared first: 3-3.8 against
// 5.2-7 GB/s there), so the first writer keeps the pwrite, and so do all
// on a machine of fewer than mappedWritesFromCPUs CPUs. Pages written
// through the mapping show zeros to any other mapping until the copy
// reaches them, hence the caller's guarantee. On a file without large
// folios it is WriteBlock.
func (f *File) WriteBlockUnseen(b []byte, off int64) error {
	defer f.blockWriters.Add(-1)
	if f.blockWriters.Add(1) == 1 || !f.large || runtime.NumCPU() < mappedWritesFromCPUs {
		_, err := f.WriteBlock([][]byte{b}, off)
		return err
	}
	if err := f.checkOneBlock("write block", off, int64(len(b))); err != nil {
		return err
	}
	fd, err := f.sysfd("write block")
	if err != nil {
		return err
	}
	if err := f.checkRange("write block", off, LargeFolioSize, true); err != nil {
		return err
	}
	if err := memsys.Fallocate(fd, off, LargeFolioSize); err != nil {
		return fmt.Errorf("write block %s %#x+%d: allocate: %w", f.name, off, LargeFolioSize, err)
	}
	m, err := f.mapShared(off, LargeFolioSize)
	if err != nil {
		return err
	}
	copy(m.Bytes(), b)
	f.mappedBlockWrites.Add(1)
	return m.Unmap()
}

// writeLarge is WriteAt on a file of large folios: whole, aligned 2 MiB
// with pwrite (one folio each), the rest in 4 KiB folios (fillSmall).
func (f *File) writeLarge(fd int, p []byte, off int64) (int, error) {
	n := 0
	err := eachPiece(off, int64(len(p)), func(o, l int64, whole bool) error {
		b := p[o-off : o-off+l]
		if whole {
			mapSource(b)
			c, err := f.pwriteAll(fd, b, o)
			n += c
			return err
		}
		if err := f.fillSmall(fd, b, o); err != nil {
			return err
		}
		n += int(l)
		return nil
	})
	return n, err
}

// fillSmall writes p at off, inside one 2 MiB, in 4 KiB folios. A pwrite
// into a hole would allocate a folio as large as the mount allows, and a
// write through a mapping, which faults 4 KiB folios in, shows each page
// to every other mapping of the file as soon as it is allocated, zeroed,
// before the copy reaches it: a program reading there at that moment
// reads zeros (and the integrity tests did). UFFDIO_COPY fills a page
// before it enters the file, so a page is either absent (readers fault
// and wait for the fault server) or complete. Pages already present
// are written in place with pwrite, which allocates nothing.
func (f *File) fillSmall(fd int, p []byte, off int64) error {
	first := off &^ (PageSize - 1)
	end := (off + int64(len(p)) + PageSize - 1) &^ (PageSize - 1)
	src := p
	if first != off || end != off+int64(len(p)) {
		// Whole pages: what the file holds (zeros for holes) around p.
		src = make([]byte, end-first)
		if _, err := f.ReadAt(src[:PageSize], first); err != nil {
			return err
		}
		if _, err := f.ReadAt(src[len(src)-PageSize:], end-PageSize); err != nil {
			return err
		}
		copy(src[off-first:], p)
	}
	present := func(at int64) error { // only p's bytes of that page
		lo, hi := max(at, off), min(at+PageSize, off+int64(len(p)))
		_, err := f.pwriteAll(fd, p[lo-off:hi-off], lo)
		return err
	}
	return f.fillPages(first, src, present)
}

// fillWindowSize is the span of the file one fill window maps.
const fillWindowSize = 1 << 30

// filler returns the file's userfaultfd for fillPages, opened on first
// use. It reports no faults: nothing but UFFDIO_COPY touches the windows
// registered with it.
func (f *File) filler() (*uffd.FD, error) {
	f.fill.once.Do(func() {
		u, err := uffd.Open(uffd.CloseOnExec | uffd.NonBlock | uffd.UserModeOnly)
		if err != nil {
			f.fill.err = fmt.Errorf("write %s in 4 KiB folios: %w", f.name, err)
			return
		}
		// SIGBUS rather than a wait that nobody would end, should
		// anything touch a hole of a window.
		if _, err := u.Handshake(uffd.FeatureSigbus); err != nil {
			_ = u.Close()
			f.fill.err = fmt.Errorf("write %s in 4 KiB folios: %w", f.name, err)
			return
		}
		f.fill.fd = u
	})
	return f.fill.fd, f.fill.err
}

// fillWindow returns the address at which the fill window maps offset
// off of the file, mapping the window of the fillWindowSize around it
// on first use (Map: 4 KiB faults only) and registering it for missing
// faults on u. A window stays for the file's life; each fill zaps the
// entries its copies made (fillPages). A window mapped, registered and
// unmapped per call cost four more system calls and a TLB flush of the
// server's threads on each 4 KiB move's one copy, a third of the
// server's samples in fillPages under gawk at a quarter of its peak.
func (f *File) fillWindow(u *uffd.FD, off int64) (uintptr, error) {
	i := off / fillWindowSize
	start := i * fillWindowSize
	f.fill.mu.Lock()
	defer f.fill.mu.Unlock()
	if w, ok := f.fill.windows[i]; ok {
		return w.addr + uintptr(off-start), nil
	}
	w, err := f.Map(start, min(fillWindowSize, f.size-start))
	if err != nil {
		return 0, fmt.Errorf("write %s %#x in 4 KiB folios: a window: %w", f.name, off, err)
	}
	if _, err := u.Register(w.addr, uintptr(w.length), uffd.RegisterMissing); err != nil {
		_ = w.Unmap()
		return 0, fmt.Errorf("write %s %#x in 4 KiB folios: %w", f.name, off, err)
	}
	if f.fill.windows == nil {
		f.fill.windows = map[int64]*Mapping{}
	}
	f.fill.windows[i] = w
	return w.addr + uintptr(off-start), nil
}

// fillPages puts src (whole pages) at off (page-aligned, within one
// 2 MiB) with UFFDIO_COPY through the file's fill window; pages already
// present go to present, by offset.
func (f *File) fillPages(off int64, src []byte, present func(off int64) error) error {
	u, err := f.filler()
	if err != nil {
		return err
	}
	span := uintptr(len(src))
	addr, err := f.fillWindow(u, off)
	if err != nil {
		return err
	}
	// The copies leave the pages mapped in the window: unmapped now, in
	// one zap, rather than one by one by the punches that free them
	// later (each then an unmap of a mapped page and a TLB flush of the
	// server's threads: gawk at a quarter took 1.1x as long that way).
	defer memsys.MadviseDontNeed(addr, span)
	for done := uintptr(0); done < span; {
		n, err := u.Copy(addr+done, src[done:], uffd.CopyDontWake)
		done += uintptr(n)
		switch {
		case err == nil:
			if n == 0 {
				return fmt.Errorf("write %s %#x+%d: UFFDIO_COPY made no progress", f.name, off+int64(done), span-done)
			}
		case errors.Is(err, uffd.ErrExist):
			if err := present(off + int64(done)); err != nil {
				return err
			}
			done += PageSize
		case errors.Is(err, uffd.ErrAgain) && n > 0:
			// Stopped at a present page: the retry sees EEXIST there.
		default:
			return fmt.Errorf("write %s %#x+%d: %w", f.name, off+int64(done), span-done, err)
		}
	}
	return nil
}

// zeroFolio is what Allocate writes into a whole 2 MiB.
var zeroFolio [LargeFolioSize]byte

// mapSource reads one byte of every page of bufs, so that every page of
// the source of a write that makes a new large folio is mapped. Where a
// page is not (zeroFolio, never read, is not), the kernel's first copy
// stops short, and shmem then zeroes the rest of the new folio, marks it
// up to date and unlocks it before the retried copy: a program could map
// a page of it and write in that gap, and the retry would overwrite its
// bytes.
func mapSource(bufs ...[]byte) {
	var x byte
	for _, b := range bufs {
		for i := 0; i < len(b); i += PageSize {
			x |= b[i]
		}
	}
	runtime.KeepAlive(x) // the reads are the point: keep them
}

// allocateLarge is Allocate on a file of large folios.
func (f *File) allocateLarge(fd int, off, length int64) error {
	return eachPiece(off, length, func(o, l int64, whole bool) error {
		if whole {
			// Zeros written, not fallocate: a fallocated folio is not
			// up to date, and mincore, which checks punches, cannot see
			// one the kernel kept.
			mapSource(zeroFolio[:])
			_, err := f.pwriteAll(fd, zeroFolio[:], o)
			return err
		}
		return f.window("allocate", o, l, func(addr uintptr, _ []byte) error {
			if err := memsys.MadvisePopulateWrite(addr, uintptr(l)); err != nil {
				return fmt.Errorf("allocate %s %#x+%d: %w", f.name, o, l, err)
			}
			return nil
		})
	})
}

// punchKeptRetry is how long punchLarge keeps trying before it reports
// ErrFolioKept: a folio that could not be split because of a passing
// reference (a page fault mapping it, compaction) splits a moment later.
const punchKeptRetry = 5 * time.Millisecond

// punchLarge punches [off, off+length) and then checks the partial
// 2 MiB at either end: the kernel splits a large folio to free part of
// it, and where it cannot it zeroes the part and keeps it.
func (f *File) punchLarge(fd int, off, length int64) error {
	started := time.Now()
	for {
		if err := memsys.PunchHole(fd, off, length); err != nil {
			return fmt.Errorf("punch %s %#x+%d: %w", f.name, off, length, err)
		}
		if whole(off, length) {
			return nil
		}
		kept, err := f.keptPages(off, length)
		if err != nil {
			return err
		}
		if kept == 0 {
			return nil
		}
		if time.Since(started) > punchKeptRetry {
			return fmt.Errorf("punch %s %#x+%d: %d pages still present: %w", f.name, off, length, kept, ErrFolioKept)
		}
		time.Sleep(100 * time.Microsecond)
	}
}

// keptPages counts the pages of [off, off+length) still in the file's
// page cache, looking only at the partial 2 MiB pieces (whole folios are
// freed whole).
func (f *File) keptPages(off, length int64) (int, error) {
	kept := 0
	err := eachPiece(off, length, func(o, l int64, whole bool) error {
		if whole {
			return nil
		}
		pages, err := f.Present(o, l)
		for _, p := range pages {
			if p {
				kept++
			}
		}
		return err
	})
	return kept, err
}

// Present reports, page by page, which pages of [off, off+length)
// (page-aligned) the file holds in memory, written or only allocated,
// unlike DataExtents, which counts allocated pages never written as
// holes.
func (f *File) Present(off, length int64) ([]bool, error) {
	if err := f.checkRange("present", off, length, true); err != nil {
		return nil, err
	}
	fd, err := f.sysfd("present")
	if err != nil {
		return nil, err
	}
	addr, err := memsys.Mmap(0, uintptr(length), memsys.ProtRead, memsys.MapShared, fd, off)
	if err != nil {
		return nil, fmt.Errorf("present %s %#x+%d: map: %w", f.name, off, length, err)
	}
	defer memsys.Munmap(addr, uintptr(length))
	if err := f.noCollapse(addr, length); err != nil {
		return nil, err
	}
	vec := make([]byte, length/PageSize)
	if err := memsys.Mincore(addr, uintptr(length), vec); err != nil {
		return nil, fmt.Errorf("present %s %#x+%d: mincore: %w", f.name, off, length, err)
	}
	out := make([]bool, len(vec))
	for i, v := range vec {
		out[i] = v&1 != 0
	}
	return out, nil
}

// memfdTakesLargeFolios reports whether memfds may get folios larger
// than a page on this machine: shmem_enabled, for 2 MiB or for any mTHP
// size, is set to something other than never (or deny). Unreadable
// settings count as yes: treating a file as large only costs speed.
func memfdTakesLargeFolios() bool {
	const thp = "/sys/kernel/mm/transparent_hugepage/"
	top, err := selectedSetting(thp + "shmem_enabled")
	if err != nil {
		return true
	}
	if top != "never" && top != "deny" {
		return true
	}
	if top == "deny" {
		return false
	}
	sizes, _ := filepath.Glob(thp + "hugepages-*/shmem_enabled")
	for _, p := range sizes {
		if v, err := selectedSetting(p); err != nil || (v != "never" && v != "inherit") {
			return true
		}
	}
	return false
}

// selectedSetting reads a sysfs choice file ("always [never] deny") and
// returns the bracketed choice.
func selectedSetting(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	s := string(b)
	i, j := strings.IndexByte(s, '['), strings.IndexByte(s, ']')
	if i < 0 || j < i {
		return "", fmt.Errorf("%s: no [choice] in %q", path, strings.TrimSpace(s))
	}
	return s[i+1 : j], nil
}

// mayTakeLargeFolios decides for a received file: a memfd as the
// machine's settings say, any other tmpfs file yes (a server may have
// made it on a tmpfs mounted huge=always), a file elsewhere no.
func mayTakeLargeFolios(fd int) bool {
	link, err := os.Readlink(fmt.Sprintf("/proc/self/fd/%d", fd))
	if err == nil && strings.HasPrefix(link, "/memfd:") {
		return memfdTakesLargeFolios()
	}
	onTmpfs, err := memsys.OnTmpfs(fd)
	return err != nil || onTmpfs
}

// PunchSmallFolios is Punch for pages the caller knows are not part of
// a large folio (it made every large folio of the file and split or
// freed those here): no check afterwards.
func (f *File) PunchSmallFolios(off, length int64) error {
	if err := f.checkRange("punch", off, length, true); err != nil {
		return err
	}
	fd, err := f.sysfd("punch")
	if err != nil {
		return err
	}
	if err := memsys.PunchHole(fd, off, length); err != nil {
		return fmt.Errorf("punch %s %#x+%d: %w", f.name, off, length, err)
	}
	return nil
}

// noCollapse marks a mapping of a file of large folios MADV_NOHUGEPAGE.
// khugepaged collapses a tmpfs file's pages into a large folio through
// any mapping it may scan, and fills the holes of that 2 MiB with zeros:
// pages resident elsewhere would then read as zeros here. So every
// mapping of such a file, in every process, is kept from it (the C
// library does the same); views then map large folios 4 KiB at a time.
func (f *File) noCollapse(addr uintptr, length int64) error {
	if !f.large {
		return nil
	}
	if err := memsys.MadviseNoHugepage(addr, uintptr(length)); err != nil {
		return fmt.Errorf("map %s at %#x+%d: keep it from khugepaged: %w", f.name, addr, length, err)
	}
	return nil
}
