package devmem

import (
	"errors"
	"fmt"
	"sync"
	"syscall"
	"time"

	"github.com/softuvm/softuvm/devmem/internal/memsys"
)

// Mapping is a MAP_SHARED read-write view of part of a File in this
// process. Its memory is not Go's: the slice from Bytes is valid until
// Unmap, and touching it afterwards faults.
type Mapping struct {
	mu     sync.Mutex
	addr   uintptr
	length int64
	name   string
	off    int64
}

// Map maps [off, off+length) of the file (page-aligned) shared and
// read-write, at an address the kernel picks. Stores through it reach
// the file's pages directly, and a Punch of the range by anyone zaps it.
func (f *File) Map(off, length int64) (*Mapping, error) {
	m, err := f.mapShared(off, length)
	if err != nil {
		return nil, err
	}
	if err := f.noCollapse(m.addr, length); err != nil {
		m.Unmap()
		return nil, err
	}
	return m, nil
}

// mapShared is Map without the MADV_NOHUGEPAGE of a file of large
// folios (noCollapse).
func (f *File) mapShared(off, length int64) (*Mapping, error) {
	if err := f.checkRange("map", off, length, true); err != nil {
		return nil, err
	}
	fd, err := f.sysfd("map")
	if err != nil {
		return nil, err
	}
	addr, err := memsys.Mmap(0, uintptr(length), memsys.ProtRead|memsys.ProtWrite, memsys.MapShared, fd, off)
	if err != nil {
		return nil, fmt.Errorf("map %s %#x+%d: %w", f.name, off, length, err)
	}
	return &Mapping{addr: addr, length: length, name: f.name, off: off}, nil
}

// MapBlockToCopy maps the whole, aligned 2 MiB at off of a file whose
// every page there is present, to copy it out: where the 2 MiB is one
// large folio the kernel maps it with one huge entry at the first touch.
// Map keeps every mapping of a file of large folios from huge entries
// (noCollapse: khugepaged would fill its holes with zeros), and a block
// copied through 512 entries cost 1.3-1.5 times as much to map, read
// and unmap, most of it in the TLB misses of the read and in the
// unmap, which frees the page table and so flushes every CPU that ran
// the process (benchmarks-log.md, "Whole blocks read through a huge
// entry"). A block with no hole has nothing for khugepaged to fill, and
// the mapping lives for one copy. On a file without large folios it is
// Map.
func (f *File) MapBlockToCopy(off int64) (*Mapping, error) {
	if !f.large {
		return f.Map(off, LargeFolioSize)
	}
	if err := f.checkOneBlock("map to copy", off, LargeFolioSize); err != nil {
		return nil, err
	}
	return f.mapShared(off, LargeFolioSize)
}

// MapFixed maps [off, off+length) of the file (page-aligned) shared and
// read-write at addr, replacing whatever was mapped there. addr must lie
// inside a reservation made by ReserveAddressSpace: MAP_FIXED silently
// replaces any mapping, so pointing it at memory the process did not set
// aside would corrupt it. The project maps with addr == off, so that a
// file offset is the virtual address. The window is removed by mapping
// over it again or by ReleaseAddressSpace.
func (f *File) MapFixed(addr uintptr, off, length int64) error {
	if err := f.checkRange("map fixed", off, length, true); err != nil {
		return err
	}
	if addr == 0 || addr%PageSize != 0 {
		return fmt.Errorf("map fixed %s %#x+%d: address %#x: want a nonzero multiple of %d", f.name, off, length, addr, PageSize)
	}
	fd, err := f.sysfd("map fixed")
	if err != nil {
		return err
	}
	got, err := memsys.Mmap(addr, uintptr(length), memsys.ProtRead|memsys.ProtWrite, memsys.MapShared|memsys.MapFixed, fd, off)
	if err != nil {
		return fmt.Errorf("map fixed %s %#x+%d at %#x: %w", f.name, off, length, addr, err)
	}
	if got != addr { // MAP_FIXED cannot do this; guard against a kernel that did
		memsys.Munmap(got, uintptr(length))
		return fmt.Errorf("map fixed %s %#x+%d at %#x: kernel mapped it at %#x", f.name, off, length, addr, got)
	}
	return f.noCollapse(addr, length)
}

// Bytes returns the mapped memory; nil after Unmap.
func (m *Mapping) Bytes() []byte {
	m.mu.Lock()
	defer m.mu.Unlock()
	return memsys.Bytes(m.addr, int(m.length))
}

// Addr returns the mapping's address; 0 after Unmap.
func (m *Mapping) Addr() uintptr {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.addr
}

// Len returns the mapping's length in bytes.
func (m *Mapping) Len() int64 { return m.length }

// Unmap removes the mapping. Unmapping twice is not an error.
func (m *Mapping) Unmap() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.addr == 0 {
		return nil
	}
	if err := memsys.Munmap(m.addr, uintptr(m.length)); err != nil {
		return fmt.Errorf("unmap %s %#x+%d at %#x: %w", m.name, m.off, m.length, m.addr, err)
	}
	m.addr = 0
	return nil
}

// BytesAt views length bytes of memory mapped at addr (a MapFixed window,
// say) as a slice. The caller keeps the memory mapped for as long as it
// uses the slice.
func BytesAt(addr uintptr, length int64) []byte {
	return memsys.Bytes(addr, int(length))
}

// ReserveAddressSpace reserves length bytes of virtual address space
// aligned to align, inaccessible (PROT_NONE) and uncommitted
// (MAP_NORESERVE), for MapFixed windows to be placed in. It maps
// length+align-PageSize bytes and unmaps the slack on both sides of the
// aligned part, so only the reservation itself remains.
func ReserveAddressSpace(length, align int64) (uintptr, error) {
	if length <= 0 || length%PageSize != 0 {
		return 0, fmt.Errorf("reserve %d bytes aligned to %d: length %d: want a positive multiple of %d", length, align, length, PageSize)
	}
	if align < PageSize || align&(align-1) != 0 {
		return 0, fmt.Errorf("reserve %d bytes aligned to %d: alignment %d: want a power of two >= %d", length, align, align, PageSize)
	}
	if length > FileSize || align > FileSize {
		return 0, fmt.Errorf("reserve %d bytes aligned to %d: want at most %#x bytes and alignment", length, align, int64(FileSize))
	}
	over := uintptr(length + align - PageSize)
	base, err := memsys.Mmap(0, over, memsys.ProtNone, memsys.MapPrivate|memsys.MapAnonymous|memsys.MapNoreserve, -1, 0)
	if err != nil {
		return 0, fmt.Errorf("reserve %d bytes aligned to %d: %w", length, align, err)
	}
	a := uintptr(align)
	addr := (base + a - 1) &^ (a - 1)
	end := addr + uintptr(length)
	if head := addr - base; head > 0 {
		if err := memsys.Munmap(base, head); err != nil {
			memsys.Munmap(base, over)
			return 0, fmt.Errorf("reserve %d bytes aligned to %d: trim %#x+%d: %w", length, align, base, head, err)
		}
	}
	if tail := base + over - end; tail > 0 {
		if err := memsys.Munmap(end, tail); err != nil {
			memsys.Munmap(addr, base+over-addr)
			return 0, fmt.Errorf("reserve %d bytes aligned to %d: trim %#x+%d: %w", length, align, end, tail, err)
		}
	}
	return addr, nil
}

// MapOver maps [off, off+length) of the file at addr, replacing what is
// mapped there, with no moment at which other threads of the process see
// the new mapping before prepare has run on it. The file is mapped at a
// scratch address first; prepare gets that address (to register the
// mapping with a userfaultfd, say, which moves with it); then the mapping
// is moved over addr with mremap, which the kernel does under the address
// space's lock. As MapFixed, addr must lie in a reservation of the caller.
func (f *File) MapOver(addr uintptr, off, length int64, prepare func(scratch uintptr) error) error {
	if addr%PageSize != 0 {
		return fmt.Errorf("map %s %#x+%d over %#x: address not page-aligned", f.name, off, length, addr)
	}
	m, err := f.Map(off, length)
	if err != nil {
		return err
	}
	if prepare != nil {
		if err := prepare(m.addr); err != nil {
			m.Unmap()
			return fmt.Errorf("map %s %#x+%d over %#x: %w", f.name, off, length, addr, err)
		}
	}
	if err := memsys.MremapFixed(m.addr, uintptr(length), addr); err != nil {
		m.Unmap()
		return fmt.Errorf("map %s %#x+%d over %#x: move: %w", f.name, off, length, addr, err)
	}
	return nil
}

// ReserveAddressSpaceAt reserves [addr, addr+length) like
// ReserveAddressSpace, at that address or not at all: an address already
// mapped is an error wrapping ErrAddressInUse (MAP_FIXED_NOREPLACE), and
// nothing is replaced. Processes that must agree on addresses (a client
// and its device processes) reserve from a window both leave alone.
func ReserveAddressSpaceAt(addr uintptr, length int64) error {
	if addr%PageSize != 0 || length <= 0 || length%PageSize != 0 {
		return fmt.Errorf("reserve %#x+%d: want a page-aligned address and a positive multiple of %d bytes", addr, length, PageSize)
	}
	got, err := memsys.Mmap(addr, uintptr(length), memsys.ProtNone, memsys.MapPrivate|memsys.MapAnonymous|memsys.MapNoreserve|memsys.MapFixedNoreplace, -1, 0)
	if err != nil {
		if errors.Is(err, syscall.EEXIST) {
			return fmt.Errorf("reserve %#x+%d: %w", addr, length, ErrAddressInUse)
		}
		return fmt.Errorf("reserve %#x+%d: %w", addr, length, err)
	}
	if got != addr { // a kernel without MAP_FIXED_NOREPLACE takes it as a hint
		memsys.Munmap(got, uintptr(length))
		return fmt.Errorf("reserve %#x+%d: kernel placed it at %#x: %w", addr, length, got, ErrAddressInUse)
	}
	return nil
}

// ReturnToReservation replaces whatever is mapped at [addr, addr+length)
// with a reservation again (PROT_NONE, MAP_FIXED over it): a process that
// keeps a window reserved unmaps a range this way, so that nothing else
// is placed there meanwhile.
func ReturnToReservation(addr uintptr, length int64) error {
	if addr%PageSize != 0 || length <= 0 || length%PageSize != 0 {
		return fmt.Errorf("unmap %#x+%d: want a page-aligned address and a positive multiple of %d bytes", addr, length, PageSize)
	}
	if _, err := memsys.Mmap(addr, uintptr(length), memsys.ProtNone, memsys.MapPrivate|memsys.MapAnonymous|memsys.MapNoreserve|memsys.MapFixed, -1, 0); err != nil {
		return fmt.Errorf("unmap %#x+%d: %w", addr, length, err)
	}
	return nil
}

// MapAnonymousFixed replaces whatever is mapped at [addr, addr+length)
// with private anonymous read-write memory, as ordinary memory of the
// process is: it gives back memory that was aliased to a file.
func MapAnonymousFixed(addr uintptr, length int64) error {
	if addr%PageSize != 0 || length <= 0 || length%PageSize != 0 {
		return fmt.Errorf("map anonymous %#x+%d: want a page-aligned address and a positive multiple of %d bytes", addr, length, PageSize)
	}
	if _, err := memsys.Mmap(addr, uintptr(length), memsys.ProtRead|memsys.ProtWrite, memsys.MapPrivate|memsys.MapAnonymous|memsys.MapFixed, -1, 0); err != nil {
		return fmt.Errorf("map anonymous %#x+%d: %w", addr, length, err)
	}
	return nil
}

// ErrAddressInUse says a fixed reservation met an existing mapping.
var ErrAddressInUse = errors.New("address range already in use")

// ReleaseAddressSpace unmaps [addr, addr+length): the reservation and any
// MapFixed windows in it.
func ReleaseAddressSpace(addr uintptr, length int64) error {
	if addr%PageSize != 0 || length <= 0 {
		return fmt.Errorf("release %#x+%d: want a page-aligned address and a positive length", addr, length)
	}
	if err := memsys.Munmap(addr, uintptr(length)); err != nil {
		return fmt.Errorf("release %#x+%d: %w", addr, length, err)
	}
	return nil
}

// DontFork marks [addr, addr+length) MADV_DONTFORK, so that a child the
// process forks (to exec a helper, say) gets no copy of the range. A
// child's copy would not be known to the fault server: it could read
// stale pages or keep them pinned behind the server's back.
func DontFork(addr uintptr, length int64) error {
	if addr%PageSize != 0 || length <= 0 {
		return fmt.Errorf("dontfork %#x+%d: want a page-aligned address and a positive length", addr, length)
	}
	if err := memsys.MadviseDontFork(addr, uintptr(length)); err != nil {
		return fmt.Errorf("dontfork %#x+%d: %w", addr, length, err)
	}
	return nil
}

// DropPages drops this process's page-table entries over [addr,
// addr+length) of a shared file mapping. The pages stay in the file: the
// next access maps them again with a minor fault. The fault server's hint
// faults use it so that accesses to remotely mapped memory are seen.
func DropPages(addr uintptr, length int64) error {
	if addr%PageSize != 0 || length <= 0 {
		return fmt.Errorf("drop pages %#x+%d: want a page-aligned address and a positive length", addr, length)
	}
	if err := memsys.MadviseDontNeed(addr, uintptr(length)); err != nil {
		return fmt.Errorf("drop pages %#x+%d: %w", addr, length, err)
	}
	return nil
}

// MonotonicNow reads CLOCK_MONOTONIC, the clock of kernel tracepoint
// timestamps (bpf_ktime_get_ns), so that user-space times compare with
// them.
func MonotonicNow() time.Duration { return time.Duration(memsys.MonotonicNanos()) }

// IsMapped reports whether every page of [addr, addr+length) is mapped
// in this process, so that touching it cannot fault for lack of a
// mapping.
func IsMapped(addr uintptr, length int64) bool {
	if length <= 0 || addr+uintptr(length) < addr {
		return false
	}
	start := addr &^ (PageSize - 1)
	end := (addr + uintptr(length) + PageSize - 1) &^ (PageSize - 1)
	return memsys.MadviseNormal(start, end-start) == nil
}
