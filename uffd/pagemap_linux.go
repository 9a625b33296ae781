package uffd

import (
	"fmt"
	"os"
	"runtime"
	"sync"
	"unsafe"

	"golang.org/x/sys/unix"
)

// PAGEMAP_SCAN (Linux 6.7): an ioctl on /proc/PID/pagemap that walks a
// range of that process's page tables and returns runs of pages by
// category. With a range registered for write-protect faults on a
// userfaultfd that has FeatureWPAsync, a page is "written" when its PTE is
// present and no longer uffd-wp: the kernel cleared the bit at the first
// write after the page was installed or protected. That makes the pair a
// dirty tracker that costs writers nothing but that first minor fault.
const (
	pagemapScanIoctl = 0xc0606610 // _IOWR('f', 16, struct pm_scan_arg)

	pageIsWritten = 1 << 1
	pageIsPresent = 1 << 3

	pmScanCheckWPAsync = 1 << 1 // fail with EPERM on a range without WP_ASYNC
)

// pmScanArg is struct pm_scan_arg (include/uapi/linux/fs.h).
type pmScanArg struct {
	size, flags, start, end, walkEnd, vec, vecLen, maxPages       uint64
	categoryInverted, categoryMask, categoryAnyofMask, returnMask uint64
}

// pageRegion is struct page_region.
type pageRegion struct{ start, end, categories uint64 }

// scanVecs holds the kernel's output vectors: on the heap, because the
// argument carries the vector's address as an integer, which a moving
// stack would not update.
var scanVecs = sync.Pool{New: func() any { return new([64]pageRegion) }}

// PageRun is [Start, End) in bytes, page aligned.
type PageRun struct{ Start, End uintptr }

// ScanWritten appends to out the runs of pages in [start, end) that the
// process whose pagemap file pagemap is wrote since they were installed
// or last write-protected, and returns it. The range must be registered
// for write-protect faults with a userfaultfd that has FeatureWPAsync:
// otherwise it fails (ErrNotSupported) rather than say nothing was
// written.
func ScanWritten(pagemap *os.File, start, end uintptr, out []PageRun) ([]PageRun, error) {
	out, err := scanPages(pagemap, start, end, pmScanCheckWPAsync, pageIsWritten|pageIsPresent, pageIsWritten, out)
	if err == unix.EPERM || err == unix.ENOTTY || err == unix.EINVAL {
		return out, fmt.Errorf("%w: PAGEMAP_SCAN of %#x-%#x: %v (it needs Linux 6.7 and a range registered for write-protect faults with WP_ASYNC)", ErrNotSupported, start, end, err)
	} else if err != nil {
		return out, fmt.Errorf("PAGEMAP_SCAN of %#x-%#x: %w", start, end, err)
	}
	return out, nil
}

// ScanPresent appends to out the runs of pages in [start, end) that the
// process whose pagemap file pagemap is maps (its page table has an
// entry for them), and returns it. It needs Linux 6.7 (ErrNotSupported
// before).
func ScanPresent(pagemap *os.File, start, end uintptr, out []PageRun) ([]PageRun, error) {
	out, err := scanPages(pagemap, start, end, 0, pageIsPresent, pageIsPresent, out)
	if err == unix.ENOTTY {
		return out, fmt.Errorf("%w: PAGEMAP_SCAN of %#x-%#x: %v (it needs Linux 6.7)", ErrNotSupported, start, end, err)
	} else if err != nil {
		return out, fmt.Errorf("PAGEMAP_SCAN of %#x-%#x: %w", start, end, err)
	}
	return out, nil
}

// scanPages runs PAGEMAP_SCAN over [start, end): pages whose categories
// in mask are all set are returned, in runs merged with out's last.
// Errors are the ioctl's, bare.
func scanPages(pagemap *os.File, start, end uintptr, flags, mask, returnMask uint64, out []PageRun) ([]PageRun, error) {
	vec := scanVecs.Get().(*[64]pageRegion)
	defer scanVecs.Put(vec)
	for start < end {
		a := pmScanArg{
			size: uint64(unsafe.Sizeof(pmScanArg{})), flags: flags,
			start: uint64(start), end: uint64(end),
			vec: uint64(uintptr(unsafe.Pointer(&vec[0]))), vecLen: uint64(len(vec)),
			categoryMask: mask, returnMask: returnMask,
		}
		n, err := ioctlPtrCount(int(pagemap.Fd()), pagemapScanIoctl, unsafe.Pointer(&a))
		runtime.KeepAlive(&a)
		runtime.KeepAlive(pagemap)
		if err != nil {
			return out, err
		}
		for _, r := range vec[:n] {
			if k := len(out); k > 0 && out[k-1].End == uintptr(r.start) {
				out[k-1].End = uintptr(r.end)
				continue
			}
			out = append(out, PageRun{uintptr(r.start), uintptr(r.end)})
		}
		if a.walkEnd <= uint64(start) {
			return out, fmt.Errorf("no progress")
		}
		start = uintptr(a.walkEnd)
	}
	return out, nil
}

// Process is another process, held by a pidfd, whose page table PageOut
// changes.
type Process struct{ pidfd int }

// OpenProcess opens a pidfd for pid (Linux 5.3).
func OpenProcess(pid int) (*Process, error) {
	fd, err := unix.PidfdOpen(pid, unix.PIDFD_NONBLOCK)
	if err != nil {
		return nil, fmt.Errorf("pidfd_open(%d): %w", pid, err)
	}
	return &Process{pidfd: fd}, nil
}

// Close releases the pidfd.
func (p *Process) Close() error { return unix.Close(p.pidfd) }

// SwapTotal returns the bytes of swap space the system has on.
func SwapTotal() (uint64, error) {
	var si unix.Sysinfo_t
	if err := unix.Sysinfo(&si); err != nil {
		return 0, fmt.Errorf("sysinfo: %w", err)
	}
	return uint64(si.Totalswap) * uint64(si.Unit), nil
}

// PageOut asks the kernel to reclaim the pages of runs in process p:
// process_madvise(MADV_PAGEOUT). Pages of a file that has nowhere to go
// (a tmpfs file while no swap is on) stay in the file, unmapped from p:
// its next touch of each is a minor fault. A page other processes also
// map is left alone, and so is a large folio the runs do not cover whole
// (it would be split). It returns the bytes the kernel took the advice
// for. It needs the right to ptrace p, and write access to the files or
// CAP_SYS_ADMIN.
func (p *Process) PageOut(runs []PageRun) (int64, error) {
	pidfd := p.pidfd
	var done int64
	const maxIov = 1024 // UIO_MAXIOV
	// struct iovec with the base as an integer: the addresses are the
	// other process's, never this one's pointers.
	type remoteIovec struct{ base, length uintptr }
	iov := make([]remoteIovec, 0, min(len(runs), maxIov))
	for len(runs) > 0 {
		iov = iov[:0]
		for _, r := range runs[:min(len(runs), maxIov)] {
			iov = append(iov, remoteIovec{r.Start, r.End - r.Start})
		}
		runs = runs[len(iov):]
		n, _, errno := unix.Syscall6(unix.SYS_PROCESS_MADVISE, uintptr(pidfd), uintptr(unsafe.Pointer(&iov[0])), uintptr(len(iov)), unix.MADV_PAGEOUT, 0, 0)
		runtime.KeepAlive(iov)
		if errno != 0 {
			return done, fmt.Errorf("process_madvise(MADV_PAGEOUT): %w", errno)
		}
		done += int64(n)
	}
	return done, nil
}
