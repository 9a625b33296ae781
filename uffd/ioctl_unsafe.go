//go:build linux

package uffd

import (
	"runtime"
	"unsafe"

	"golang.org/x/sys/unix"
)

// ioctlPtr issues an ioctl whose argument is a pointer. The uintptr
// conversion happens in the argument list of the assembly syscall stub,
// which keeps arg alive and unmoved for the duration of the call. The errno
// is returned as an error without allocating (small integers are boxed from
// a static table).
func ioctlPtr(fd int, req uintptr, arg unsafe.Pointer) error {
	_, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), req, uintptr(arg))
	if e != 0 {
		return e
	}
	return nil
}

// ioctlPtrCount is ioctlPtr for an ioctl that returns a count.
func ioctlPtrCount(fd int, req uintptr, arg unsafe.Pointer) (int, error) {
	r, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), req, uintptr(arg))
	if e != 0 {
		return 0, e
	}
	return int(r), nil
}

// ioctlInt issues an ioctl whose argument is an integer and which returns a
// new file descriptor (USERFAULTFD_IOC_NEW).
func ioctlInt(fd int, req uintptr, arg uintptr) (int, error) {
	r, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), req, arg)
	if e != 0 {
		return -1, e
	}
	return int(r), nil
}

// Typed wrappers: each passes its struct by pointer and keeps it alive past
// the call, since the kernel writes results back into it.

func ioctlAPI(fd int, a *uffdioAPI) error {
	err := ioctlPtr(fd, reqAPI, unsafe.Pointer(a))
	runtime.KeepAlive(a)
	return err
}

func ioctlRegister(fd int, r *uffdioRegister) error {
	err := ioctlPtr(fd, reqRegister, unsafe.Pointer(r))
	runtime.KeepAlive(r)
	return err
}

// ioctlRange issues UNREGISTER or WAKE.
func ioctlRange(fd int, req uintptr, r *uffdioRange) error {
	err := ioctlPtr(fd, req, unsafe.Pointer(r))
	runtime.KeepAlive(r)
	return err
}

// bufPtr returns the address of b's data for uffdioCopy.src. The caller
// stores it in a struct on its own stack: storing it through a pointer
// parameter here would make every source buffer escape to the heap.
func bufPtr(b []byte) unsafe.Pointer { return unsafe.Pointer(unsafe.SliceData(b)) }

// ioctlCopy issues UFFDIO_COPY; c.src points into src, which stays alive
// until the kernel is done with it.
func ioctlCopy(fd int, c *uffdioCopy, src []byte) error {
	err := ioctlPtr(fd, reqCopy, unsafe.Pointer(c))
	runtime.KeepAlive(c)
	runtime.KeepAlive(src)
	return err
}

func ioctlZeropage(fd int, z *uffdioZeropage) error {
	err := ioctlPtr(fd, reqZeropage, unsafe.Pointer(z))
	runtime.KeepAlive(z)
	return err
}

func ioctlWriteprotect(fd int, w *uffdioWriteprotect) error {
	err := ioctlPtr(fd, reqWriteProtect, unsafe.Pointer(w))
	runtime.KeepAlive(w)
	return err
}

func ioctlContinue(fd int, c *uffdioContinue) error {
	err := ioctlPtr(fd, reqContinue, unsafe.Pointer(c))
	runtime.KeepAlive(c)
	return err
}

func ioctlMove(fd int, m *uffdioMove) error {
	err := ioctlPtr(fd, reqMove, unsafe.Pointer(m))
	runtime.KeepAlive(m)
	return err
}

func ioctlPoison(fd int, p *uffdioPoison) error {
	err := ioctlPtr(fd, reqPoison, unsafe.Pointer(p))
	runtime.KeepAlive(p)
	return err
}

// readNoWait is preadv2(fd, buf, -1, RWF_NOWAIT) with the iovec on the
// stack, so that it does not allocate.
func readNoWait(fd int, buf []byte) (int, error) {
	iov := unix.Iovec{Base: unsafe.SliceData(buf)}
	iov.SetLen(len(buf))
	off := int64(-1) // the current position, which a userfaultfd ignores
	n, _, e := unix.Syscall6(unix.SYS_PREADV2, uintptr(fd), uintptr(unsafe.Pointer(&iov)), 1, uintptr(off), 0, unix.RWF_NOWAIT)
	if e != 0 {
		return 0, e
	}
	return int(n), nil
}
