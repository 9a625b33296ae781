package devmem

import (
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"syscall"

	"github.com/softuvm/softuvm/devmem/internal/memsys"
)

// maxCopyChunk bounds one copy_file_range call; the kernel caps a call
// near 2 GiB anyway, and a bounded chunk keeps each call's latency
// bounded for the fault server.
const maxCopyChunk = 1 << 30

// bounceSize is the fallback's buffer size: large enough that pread and
// pwrite costs are dominated by copying, small enough to pool.
const bounceSize = 1 << 20

var bouncePool = sync.Pool{New: func() any { b := make([]byte, bounceSize); return &b }}

// noCopyFileRange is set once the kernel says it has no copy_file_range
// at all, so that later copies skip straight to the fallback.
var noCopyFileRange atomic.Bool

// CopyFrom copies length bytes from src at srcOff into f at dstOff and
// returns how many it copied. It uses copy_file_range, which copies
// between memfds inside the kernel without a trip through user memory,
// and falls back to pread/pwrite through a bounce buffer where the kernel
// refuses (EXDEV across file systems, EINVAL, EOPNOTSUPP, ENOSYS).
// Offsets and length need not be page-aligned.
//
// Holes in src become zero-filled pages in f. That is correct here:
// callers copy only resident pages, and a hole reads as zeros anyway.
// Overlapping ranges of one file are refused.
func (f *File) CopyFrom(src *File, srcOff, dstOff, length int64) (int64, error) {
	if length == 0 {
		return 0, nil
	}
	if err := src.checkRange("copy from", srcOff, length, false); err != nil {
		return 0, err
	}
	if err := f.checkRange("copy to", dstOff, length, false); err != nil {
		return 0, err
	}
	if src == f && srcOff < dstOff+length && dstOff < srcOff+length {
		return 0, f.overlapError(srcOff, dstOff, length)
	}
	rfd, err := src.sysfd("copy from")
	if err != nil {
		return 0, err
	}
	wfd, err := f.sysfd("copy to")
	if err != nil {
		return 0, err
	}
	var done int64
	// Into a file of large folios copy_file_range would allocate folios
	// as large as each chunk it writes, present beyond the bytes copied:
	// the bounce buffer's WriteAt keeps the invariant (large.go).
	for done < length && !noCopyFileRange.Load() && !f.large {
		n, err := memsys.CopyFileRange(rfd, srcOff+done, wfd, dstOff+done, int(min(length-done, maxCopyChunk)))
		if err != nil {
			if errors.Is(err, syscall.ENOSYS) {
				noCopyFileRange.Store(true)
			}
			if copyFallsBack(err) {
				break
			}
			return done, f.copyError(src, srcOff+done, dstOff+done, length-done, err)
		}
		if n == 0 {
			break // src ended early; the fallback says so precisely
		}
		done += int64(n)
	}
	if done < length {
		n, err := f.copyBounce(src, rfd, wfd, srcOff+done, dstOff+done, length-done)
		done += n
		if err != nil {
			return done, err
		}
	}
	return done, nil
}

func copyFallsBack(err error) bool {
	return errors.Is(err, syscall.EXDEV) || errors.Is(err, syscall.EINVAL) ||
		errors.Is(err, syscall.EOPNOTSUPP) || errors.Is(err, syscall.ENOSYS)
}

func (f *File) copyError(src *File, srcOff, dstOff, length int64, err error) error {
	return fmt.Errorf("copy %s %#x+%d to %s %#x: %w", src.name, srcOff, length, f.name, dstOff, err)
}

func (f *File) overlapError(srcOff, dstOff, length int64) error {
	return fmt.Errorf("copy %s %#x+%d to %#x: ranges overlap: want disjoint ranges", f.name, srcOff, length, dstOff)
}

// copyBounce copies through a pooled buffer in user memory.
func (f *File) copyBounce(src *File, rfd, wfd int, srcOff, dstOff, length int64) (int64, error) {
	// copy_file_range refuses overlapping ranges of one inode with
	// EINVAL, which lands here; a forward copy would then smear data,
	// so check with the inode numbers that only this slow path pays for.
	if rst, err := memsys.Fstat(rfd); err == nil {
		if wst, err := memsys.Fstat(wfd); err == nil &&
			rst.Dev == wst.Dev && rst.Ino == wst.Ino &&
			srcOff < dstOff+length && dstOff < srcOff+length {
			return 0, f.overlapError(srcOff, dstOff, length)
		}
	}
	bp := bouncePool.Get().(*[]byte)
	defer bouncePool.Put(bp)
	buf := *bp
	var done int64
	for done < length {
		chunk := buf[:min(length-done, int64(len(buf)))]
		n, err := src.ReadAt(chunk, srcOff+done)
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		if err != nil {
			return done, f.copyError(src, srcOff+done, dstOff+done, length-done, err)
		}
		if _, err := f.WriteAt(chunk[:n], dstOff+done); err != nil {
			return done, f.copyError(src, srcOff+done, dstOff+done, length-done, err)
		}
		done += int64(n)
	}
	return done, nil
}
