package bench

import (
	"fmt"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"github.com/softuvm/softuvm/uvm"
)

// What the benchmarks do to memory on the host: write and read it, copy
// it on several threads, and the floors they measure themselves against.

// touchPages writes one byte per page, in order.
func touchPages(b []byte) {
	for i := 0; i < len(b); i += uvm.PageSize {
		b[i] = 1
	}
}

// sumWords reads every byte, eight at a time.
func sumWords(b []byte) uint64 {
	words := unsafe.Slice((*uint64)(unsafe.Pointer(unsafe.SliceData(b))), len(b)/8)
	var sum uint64
	for _, w := range words {
		sum += w
	}
	return sum
}

// streamSink keeps what the reads sum, so that no read is left out as
// unused.
var streamSink atomic.Uint64

// parallelRead reads b once on threads threads, each its own share, as
// uvm-bench-stream's workers do.
func parallelRead(b []byte, threads int) {
	threads = max(1, threads)
	var wg sync.WaitGroup
	for t := 0; t < threads; t++ {
		lo, hi := len(b)*t/threads/8*8, len(b)*(t+1)/threads/8*8
		wg.Add(1)
		go func() {
			defer wg.Done()
			streamSink.Add(sumWords(b[lo:hi]))
		}()
	}
	wg.Wait()
}

// warmBuffer returns size bytes whose pages exist: this VM hands unused
// memory back to the host, and the first touch of a page costs several
// times a copy of it.
func warmBuffer(size int64) []byte {
	b := make([]byte, size)
	for i := int64(0); i < size; i += uvm.PageSize {
		b[i] = 1
	}
	return b
}

// parallelCopy copies src into dst with n goroutines, each a contiguous
// share, as plain memcpy on every CPU.
func parallelCopy(dst, src []byte, n int) {
	var wg sync.WaitGroup
	share := (len(src) + n - 1) / n
	for lo := 0; lo < len(src); lo += share {
		hi := min(len(src), lo+share)
		wg.Add(1)
		go func() { defer wg.Done(); copy(dst[lo:hi], src[lo:hi]) }()
	}
	wg.Wait()
}

// firstDifference is the index of the first byte where a and b differ,
// or -1.
func firstDifference(a, b []byte) int {
	const step = 1 << 20
	for lo := 0; lo < len(a); lo += step {
		hi := min(len(a), lo+step)
		if string(a[lo:hi]) != string(b[lo:hi]) {
			for i := lo; i < hi; i++ {
				if a[i] != b[i] {
					return i
				}
			}
		}
	}
	return -1
}

// freshPageWrite measures writing into newly allocated pages of a memfd:
// what any migration into fresh 4 KiB pages costs at least here.
func freshPageWrite(src []byte) (float64, error) {
	var rates []float64
	for r := 0; r < 8; r++ { // the first a warm-up, then the median of seven
		fd, err := memfdCreate("softuvm-bench")
		if err != nil {
			return 0, err
		}
		t0 := time.Now()
		n, err := syscall.Pwrite(fd, src, 0)
		secs := time.Since(t0).Seconds()
		syscall.Close(fd)
		if err != nil || n != len(src) {
			return 0, fmt.Errorf("pwrite into a memfd: %v", err)
		}
		if r > 0 {
			rates = append(rates, float64(len(src))/secs/1e9)
		}
	}
	return median(rates), nil
}

func memfdCreate(name string) (int, error) {
	p, err := syscall.BytePtrFromString(name)
	if err != nil {
		return -1, err
	}
	const sysMemfdCreate = 319 // amd64
	fd, _, errno := syscall.Syscall(sysMemfdCreate, uintptr(unsafe.Pointer(p)), 1 /* MFD_CLOEXEC */, 0)
	if errno != 0 {
		return -1, fmt.Errorf("memfd_create: %w", errno)
	}
	return int(fd), nil
}

// addrOf is the address of b's first byte, for Memcpy.
func addrOf(b []byte) uintptr { return uintptr(unsafe.Pointer(unsafe.SliceData(b))) }
