package memsys

import (
	"fmt"
	"golang.org/x/sys/unix"
)

// Protection and mapping flags, re-exported so callers need not import
// x/sys/unix.
const (
	ProtNone  = unix.PROT_NONE
	ProtRead  = unix.PROT_READ
	ProtWrite = unix.PROT_WRITE

	MapShared         = unix.MAP_SHARED
	MapPrivate        = unix.MAP_PRIVATE
	MapAnonymous      = unix.MAP_ANONYMOUS
	MapNoreserve      = unix.MAP_NORESERVE
	MapFixed          = unix.MAP_FIXED
	MapFixedNoreplace = unix.MAP_FIXED_NOREPLACE
)

// Memory policy modes and get_mempolicy flags.
const (
	MpolDefault   = unix.MPOL_DEFAULT
	MpolBind      = unix.MPOL_BIND
	MpolPreferred = unix.MPOL_PREFERRED
	// MpolMfMove makes mbind move the pages already there that only
	// this process maps.
	MpolMfMove = unix.MPOL_MF_MOVE

	// mpolModeFlags are the flag bits get_mempolicy may OR into the mode.
	mpolModeFlags = unix.MPOL_MODE_FLAGS
)

// MaxNodes is the largest NUMA node count the kernel can be built with
// (MAX_NUMNODES with NODES_SHIFT=10); nodemasks of this size fit any kernel.
const MaxNodes = 1024

// MaxCPUs is the number of CPUs a fixed-size affinity mask can name.
const MaxCPUs = len(unix.CPUSet{}) * 64

func ignoringEINTR(f func() error) error {
	for {
		err := f()
		if err != unix.EINTR {
			return err
		}
	}
}

// MemfdCreate creates an anonymous shared-memory file, close-on-exec so
// that a helper the process execs does not inherit (and pin) its memory.
func MemfdCreate(name string) (int, error) {
	return unix.MemfdCreate(name, unix.MFD_CLOEXEC)
}

// Ftruncate sets the file's size.
func Ftruncate(fd int, size int64) error {
	return ignoringEINTR(func() error { return unix.Ftruncate(fd, size) })
}

// Close closes fd. It is not retried on EINTR: Linux releases the
// descriptor even when close reports EINTR, and a retry could close a
// descriptor another goroutine has just been given.
func Close(fd int) error { return unix.Close(fd) }

// Dup duplicates fd; the copy is close-on-exec.
func Dup(fd int) (int, error) {
	return unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 0)
}

// SetCloexec marks fd close-on-exec.
func SetCloexec(fd int) error {
	_, err := unix.FcntlInt(uintptr(fd), unix.F_SETFD, unix.FD_CLOEXEC)
	return err
}

// Stat is the part of struct stat devmem uses.
type Stat struct {
	Dev, Ino uint64
	Mode     uint32
	Size     int64
	Blocks   int64 // 512-byte units, whatever the file system's block size
}

// IsRegular reports whether the file is a regular file (memfds are).
func (s Stat) IsRegular() bool { return s.Mode&unix.S_IFMT == unix.S_IFREG }

// FileType names the file's type for error messages.
func (s Stat) FileType() string {
	switch s.Mode & unix.S_IFMT {
	case unix.S_IFREG:
		return "regular file"
	case unix.S_IFDIR:
		return "directory"
	case unix.S_IFIFO:
		return "pipe"
	case unix.S_IFSOCK:
		return "socket"
	case unix.S_IFCHR:
		return "character device"
	case unix.S_IFBLK:
		return "block device"
	case unix.S_IFLNK:
		return "symbolic link"
	}
	return "unknown file type"
}

// Fstat stats fd.
func Fstat(fd int) (Stat, error) {
	var st unix.Stat_t
	if err := ignoringEINTR(func() error { return unix.Fstat(fd, &st) }); err != nil {
		return Stat{}, err
	}
	return Stat{
		Dev:    st.Dev,
		Ino:    st.Ino,
		Mode:   st.Mode,
		Size:   st.Size,
		Blocks: st.Blocks,
	}, nil
}

// Fallocate allocates [off, off+length) of the file.
func Fallocate(fd int, off, length int64) error {
	return ignoringEINTR(func() error { return unix.Fallocate(fd, 0, off, length) })
}

// PunchHole frees [off, off+length) of the file, keeping its size. The
// kernel also zaps every page-table entry mapping those pages, in every
// process, which is what makes it usable to evict a page.
func PunchHole(fd int, off, length int64) error {
	return ignoringEINTR(func() error {
		return unix.Fallocate(fd, unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, off, length)
	})
}

// Pread reads once at off.
func Pread(fd int, p []byte, off int64) (int, error) {
	for {
		n, err := unix.Pread(fd, p, off)
		if err != unix.EINTR {
			return n, err
		}
	}
}

// Pwrite writes once at off.
func Pwrite(fd int, p []byte, off int64) (int, error) {
	for {
		n, err := unix.Pwrite(fd, p, off)
		if err != unix.EINTR {
			return n, err
		}
	}
}

// CopyFileRange copies up to length bytes from rfd at roff to wfd at woff
// with one copy_file_range call and reports how many it copied.
func CopyFileRange(rfd int, roff int64, wfd int, woff int64, length int) (int, error) {
	for {
		r, w := roff, woff
		n, err := unix.CopyFileRange(rfd, &r, wfd, &w, length, 0)
		if err != unix.EINTR {
			return n, err
		}
	}
}

// SeekData returns the offset of the first data byte at or after off
// (lseek SEEK_DATA); ENXIO means there is none.
func SeekData(fd int, off int64) (int64, error) {
	return unix.Seek(fd, off, unix.SEEK_DATA)
}

// SeekHole returns the offset of the first hole at or after off (lseek
// SEEK_HOLE); the end of the file counts as a hole.
func SeekHole(fd int, off int64) (int64, error) {
	return unix.Seek(fd, off, unix.SEEK_HOLE)
}

// Mmap is mmap(2) with the address as a plain number.
func Mmap(addr, length uintptr, prot, flags, fd int, off int64) (uintptr, error) {
	r, _, e := unix.Syscall6(unix.SYS_MMAP, addr, length, uintptr(prot), uintptr(flags), uintptr(fd), uintptr(off))
	if e != 0 {
		return 0, e
	}
	return r, nil
}

// MremapFixed moves the mapping at from to to (MREMAP_MAYMOVE |
// MREMAP_FIXED), replacing whatever is mapped there, atomically for other
// threads: the kernel holds the address space's lock throughout.
func MremapFixed(from, length, to uintptr) error {
	r, _, e := unix.Syscall6(unix.SYS_MREMAP, from, length, length, unix.MREMAP_MAYMOVE|unix.MREMAP_FIXED, to, 0)
	if e != 0 {
		return e
	}
	if r != to {
		return fmt.Errorf("mremap moved %#x to %#x, not %#x", from, r, to)
	}
	return nil
}

// Munmap is munmap(2).
func Munmap(addr, length uintptr) error {
	_, _, e := unix.Syscall(unix.SYS_MUNMAP, addr, length, 0)
	if e != 0 {
		return e
	}
	return nil
}

// MadviseDontFork marks [addr, addr+length) MADV_DONTFORK.
func MadviseDontFork(addr, length uintptr) error {
	return madvise(addr, length, unix.MADV_DONTFORK)
}

// MonotonicNanos reads CLOCK_MONOTONIC, the clock eBPF's
// bpf_ktime_get_ns reads.
func MonotonicNanos() int64 {
	var ts unix.Timespec
	_ = unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts)
	return ts.Nano()
}

// madvise applies advice to [addr, addr+length).
func madvise(addr, length uintptr, advice int) error {
	if _, _, e := unix.Syscall(unix.SYS_MADVISE, addr, length, uintptr(advice)); e != 0 {
		return e
	}
	return nil
}

// MadviseDontNeed drops the page-table entries of [addr, addr+length);
// for a shared file mapping the pages stay in the file.
func MadviseDontNeed(addr, length uintptr) error {
	return madvise(addr, length, unix.MADV_DONTNEED)
}

// MadviseNormal sets MADV_NORMAL on [addr, addr+length): a no-op that
// fails with ENOMEM where part of the range is not mapped.
func MadviseNormal(addr, length uintptr) error {
	return madvise(addr, length, unix.MADV_NORMAL)
}

// SchedSetaffinity restricts the calling thread to one CPU.
func SchedSetaffinity(cpu int) error {
	var set unix.CPUSet
	set.Set(cpu)
	return unix.SchedSetaffinity(0, &set)
}

// SchedSetaffinitySet binds the calling thread to the CPUs listed.
func SchedSetaffinitySet(cpus []int) error {
	var set unix.CPUSet
	for _, c := range cpus {
		set.Set(c)
	}
	return unix.SchedSetaffinity(0, &set)
}

// SchedGetaffinity lists the CPUs the calling thread may run on.
func SchedGetaffinity() ([]int, error) {
	var set unix.CPUSet
	if err := unix.SchedGetaffinity(0, &set); err != nil {
		return nil, err
	}
	cpus := make([]int, 0, set.Count())
	for cpu := 0; cpu < MaxCPUs; cpu++ {
		if set.IsSet(cpu) {
			cpus = append(cpus, cpu)
		}
	}
	return cpus, nil
}

// NewHugeTmpfs makes a tmpfs that is mounted nowhere (fsopen, fsconfig,
// fsmount) with huge=always, and returns the descriptor of its root:
// files made in it (OpenUnlinked) take 2 MiB folios where a write or an
// allocation covers a whole aligned 2 MiB, whatever
// /sys/kernel/mm/transparent_hugepage/shmem_enabled says for memfds. It
// needs CAP_SYS_ADMIN. The mount disappears with its last descriptor.
func NewHugeTmpfs() (int, error) {
	fs, err := unix.Fsopen("tmpfs", unix.FSOPEN_CLOEXEC)
	if err != nil {
		return -1, fmt.Errorf("fsopen tmpfs: %w", err)
	}
	defer unix.Close(fs)
	for _, kv := range [][2]string{{"huge", "always"}, {"size", "0"}, {"nr_inodes", "0"}, {"mode", "0700"}} {
		if err := unix.FsconfigSetString(fs, kv[0], kv[1]); err != nil {
			return -1, fmt.Errorf("tmpfs option %s=%s: %w", kv[0], kv[1], err)
		}
	}
	if err := unix.FsconfigCreate(fs); err != nil {
		return -1, fmt.Errorf("create tmpfs: %w", err)
	}
	mnt, err := unix.Fsmount(fs, unix.FSMOUNT_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("fsmount tmpfs: %w", err)
	}
	return mnt, nil
}

// OpenUnlinked creates a file called name in directory dirfd, which must
// not exist yet, and unlinks it: a file no one else can open, which
// /proc/PID/maps names "/name (deleted)" in every process that maps it
// (an O_TMPFILE file shows only its inode number).
func OpenUnlinked(dirfd int, name string) (int, error) {
	fd, err := unix.Openat(dirfd, name, unix.O_CREAT|unix.O_EXCL|unix.O_RDWR|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return -1, err
	}
	if err := unix.Unlinkat(dirfd, name, 0); err != nil {
		unix.Close(fd)
		return -1, err
	}
	return fd, nil
}

// Pwritev writes the buffers, in order, once at off.
func Pwritev(fd int, iovs [][]byte, off int64) (int, error) {
	for {
		n, err := unix.Pwritev(fd, iovs, off)
		if err != unix.EINTR {
			return n, err
		}
	}
}

// MadviseNoHugepage marks [addr, addr+length) MADV_NOHUGEPAGE: faults
// there allocate 4 KiB folios even in a huge=always tmpfs.
func MadviseNoHugepage(addr, length uintptr) error {
	return madvise(addr, length, unix.MADV_NOHUGEPAGE)
}

// MadvisePopulateWrite faults [addr, addr+length) in for writing,
// allocating what is missing.
func MadvisePopulateWrite(addr, length uintptr) error {
	return ignoringEINTR(func() error { return madvise(addr, length, unix.MADV_POPULATE_WRITE) })
}

// OnTmpfs reports whether fd is a file of a tmpfs (memfds included).
func OnTmpfs(fd int) (bool, error) {
	var st unix.Statfs_t
	if err := unix.Fstatfs(fd, &st); err != nil {
		return false, err
	}
	return st.Type == unix.TMPFS_MAGIC, nil
}

// SetThreadIdle puts the calling thread at SCHED_IDLE, or at nice 19
// where that is refused.
func SetThreadIdle() error {
	if err := unix.SchedSetAttr(0, &unix.SchedAttr{Policy: unix.SCHED_IDLE, Nice: 19}, 0); err == nil {
		return nil
	}
	return unix.Setpriority(unix.PRIO_PROCESS, unix.Gettid(), 19)
}

// ThreadInvoluntarySwitches counts the calling thread's involuntary
// context switches (0 where getrusage fails).
func ThreadInvoluntarySwitches() int64 {
	var ru unix.Rusage
	if unix.Getrusage(unix.RUSAGE_THREAD, &ru) != nil {
		return 0
	}
	return ru.Nivcsw
}

// MapPopulated maps n bytes of private anonymous memory, populated.
func MapPopulated(n int) ([]byte, error) {
	return unix.Mmap(-1, 0, n, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_POPULATE)
}

// UnmapBytes unmaps memory from MapPopulated.
func UnmapBytes(b []byte) error { return unix.Munmap(b) }
