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
	vec := scanVecs.Get().(*[64]pageRegion)
	defer scanVecs.Put(vec)
	for start < end {
		a := pmScanArg{
			size: uint64(unsafe.Sizeof(pmScanArg{})), flags: pmScanCheckWPAsync,
			start: uint64(start), end: uint64(end),
			vec: uint64(uintptr(unsafe.Pointer(&vec[0]))), vecLen: uint64(len(vec)),
			categoryMask: pageIsWritten | pageIsPresent, returnMask: pageIsWritten,
		}
		n, err := ioctlPtrCount(int(pagemap.Fd()), pagemapScanIoctl, unsafe.Pointer(&a))
		runtime.KeepAlive(&a)
		runtime.KeepAlive(pagemap)
		if err != nil {
			if err == unix.EPERM || err == unix.ENOTTY || err == unix.EINVAL {
				return out, fmt.Errorf("%w: PAGEMAP_SCAN of %#x-%#x: %v (it needs Linux 6.7 and a range registered for write-protect faults with WP_ASYNC)", ErrNotSupported, start, end, err)
			}
			return out, fmt.Errorf("PAGEMAP_SCAN of %#x-%#x: %w", start, end, err)
		}
		for _, r := range vec[:n] {
			if k := len(out); k > 0 && out[k-1].End == uintptr(r.start) {
				out[k-1].End = uintptr(r.end)
				continue
			}
			out = append(out, PageRun{uintptr(r.start), uintptr(r.end)})
		}
		if a.walkEnd <= uint64(start) {
			return out, fmt.Errorf("PAGEMAP_SCAN of %#x-%#x made no progress", start, end)
		}
		start = uintptr(a.walkEnd)
	}
	return out, nil
}
