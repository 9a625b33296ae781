package uffd

import (
	"os"
	"strings"

	"golang.org/x/sys/unix"
)

// devicePath is where Open looks for the userfaultfd device; tests point it
// elsewhere to exercise the fallback to the system call.
var devicePath = "/dev/userfaultfd"

// FD is a userfaultfd. Once the handshake is done (or recorded), its
// methods other than Close may be called from many goroutines at once;
// Close must not race with any of them.
type FD struct {
	fd     int
	method OpenMethod

	// Set by Handshake or SetHandshaken, before the FD is shared.
	features   Feature
	ioctls     Ioctl
	handshaken bool
}

// Open creates a userfaultfd: first through /dev/userfaultfd
// (USERFAULTFD_IOC_NEW), whose file permissions can grant kernel-mode fault
// handling to a group, then through the userfaultfd(2) system call, which
// needs CAP_SYS_PTRACE or vm.unprivileged_userfaultfd=1 unless UserModeOnly
// is asked for. The handshake is not done: call Handshake.
//
// When both ways fail the error is an *OpenError carrying both errnos; it
// matches ErrPermission when both were refused for lack of permission.
func Open(flags OpenFlag) (*FD, error) {
	if unknown := flags &^ (NonBlock | CloseOnExec | UserModeOnly); unknown != 0 {
		return nil, &OpError{Op: "open", noRange: true, Err: unix.EINVAL,
			hint: "unknown OpenFlag bits " + maskString(uint64(unknown), nil)}
	}
	path := devicePath
	fd, devErr := openDevice(path, flags)
	if devErr == nil {
		return &FD{fd: fd, method: MethodDevice}, nil
	}
	fd, sysErr := openSyscall(flags)
	if sysErr == nil {
		return &FD{fd: fd, method: MethodSyscall}, nil
	}
	e := &OpenError{DevicePath: path, Device: devErr, Syscall: sysErr, Flags: flags}
	if b, err := os.ReadFile("/proc/sys/vm/unprivileged_userfaultfd"); err == nil {
		e.Sysctl = strings.TrimSpace(string(b))
	}
	return nil, e
}

// kernelFlags translates OpenFlag into the flags of userfaultfd(2), which
// USERFAULTFD_IOC_NEW takes too.
func kernelFlags(flags OpenFlag) uintptr {
	var k uintptr
	if flags&NonBlock != 0 {
		k |= unix.O_NONBLOCK
	}
	if flags&CloseOnExec != 0 {
		k |= unix.O_CLOEXEC
	}
	if flags&UserModeOnly != 0 {
		k |= userModeOnly
	}
	return k
}

func openDevice(path string, flags OpenFlag) (int, error) {
	dev, err := unix.Open(path, unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, err
	}
	fd, err := ioctlInt(dev, reqNew, kernelFlags(flags))
	unix.Close(dev)
	return fd, err
}

func openSyscall(flags OpenFlag) (int, error) {
	r, _, e := unix.Syscall(unix.SYS_USERFAULTFD, kernelFlags(flags), 0, 0)
	if e != 0 {
		return -1, e
	}
	return int(r), nil
}

// NewFD wraps a userfaultfd received from another process (SCM_RIGHTS) or
// from an EventFork message; it takes ownership of fd. If the handshake was
// already done (by the sender; a fork child's fd inherits its parent's),
// pass the granted features with SetHandshaken: the kernel refuses a second
// UFFDIO_API.
func NewFD(fd int) *FD { return &FD{fd: fd} }

// SetHandshaken records the result of a handshake done elsewhere, so that
// Features and Ioctls report it. It does not talk to the kernel.
func (f *FD) SetHandshaken(granted Feature, ioctls Ioctl) {
	f.features, f.ioctls, f.handshaken = granted, ioctls, true
}

// Fd returns the file descriptor, -1 after Close.
func (f *FD) Fd() int { return f.fd }

// Method says how Open created the fd; 0 for NewFD.
func (f *FD) Method() OpenMethod { return f.method }

// Features returns the features granted by the handshake.
func (f *FD) Features() Feature { return f.features }

// Ioctls returns the ioctls the handshake reported valid on the fd
// (REGISTER|UNREGISTER|API); the per-range ioctls come from Register.
func (f *FD) Ioctls() Ioctl { return f.ioctls }

// Close closes the fd. Threads blocked in a fault on ranges registered with
// it are woken and retry the access as if the range had never been
// registered. Closing twice is not an error.
func (f *FD) Close() error {
	if f.fd < 0 {
		return nil
	}
	fd := f.fd
	f.fd = -1
	if err := unix.Close(fd); err != nil {
		return &OpError{Op: "close", noRange: true, Err: err}
	}
	return nil
}

// Handshake performs UFFDIO_API, asking for want ∩ Supported(), and returns
// what was granted (with FeatureWPUnpopulated added when FeatureWPAsync is
// granted: the kernel enables it implicitly). The kernel accepts one
// handshake per fd; a second call fails with an *OpError wrapping
// ErrInvalid. If the probe behind Supported fails, want is passed through
// unmasked and the kernel refuses unknown bits.
func (f *FD) Handshake(want Feature) (Feature, error) {
	ask := want
	if sup, err := Supported(); err == nil {
		ask &= sup
	}
	a := uffdioAPI{api: uffdAPI, features: uint64(ask)}
	if err := ioctlAPI(f.fd, &a); err != nil {
		e := &OpError{Op: "api", noRange: true, Err: err, detail: "features " + ask.String()}
		switch {
		case err == unix.EINVAL && f.handshaken:
			e.hint = "the handshake was already done on this fd, and the kernel accepts UFFDIO_API only once"
		case err == unix.EINVAL:
			e.hint = "the kernel accepts UFFDIO_API only once per fd: if the fd came from another process or a fork event, it is already done; use SetHandshaken"
		case err == unix.EPERM && ask&FeatureEventFork != 0:
			e.hint = "EVENT_FORK needs CAP_SYS_PTRACE"
		}
		return 0, e
	}
	granted := ask
	if granted&FeatureWPAsync != 0 {
		granted |= FeatureWPUnpopulated
	}
	f.SetHandshaken(granted, Ioctl(a.ioctls))
	return granted, nil
}

// fail builds the error of a range operation, with a hint for the EINVAL a
// missing handshake causes. Only called on failure.
func (f *FD) fail(op string, start, length uintptr, err error) *OpError {
	e := rangeError(op, start, length, err)
	if err == unix.EINVAL && !f.handshaken {
		e.hint = "no handshake recorded on this fd: call Handshake, or SetHandshaken for a received fd"
	}
	return e
}

// Register starts reporting faults of [start, start+length) in the given
// modes and returns the ioctls valid on the range. The range must be page
// aligned and cover whole VMAs of a memory type that supports the modes:
// MINOR needs shmem or hugetlbfs; registering MINOR on anonymous memory
// fails with ErrInvalid.
func (f *FD) Register(start, length uintptr, mode RegisterMode) (Ioctl, error) {
	r := uffdioRegister{rng: uffdioRange{start: uint64(start), len: uint64(length)}, mode: uint64(mode)}
	if err := ioctlRegister(f.fd, &r); err != nil {
		e := f.fail("register", start, length, err)
		e.detail = "mode " + mode.String()
		if err == unix.EBUSY {
			e.hint = "the range is registered with another userfaultfd"
		}
		return 0, e
	}
	return Ioctl(r.ioctls), nil
}

// Unregister stops reporting faults of the range and wakes the threads
// waiting on it.
func (f *FD) Unregister(start, length uintptr) error {
	r := uffdioRange{start: uint64(start), len: uint64(length)}
	if err := ioctlRange(f.fd, reqUnregister, &r); err != nil {
		return f.fail("unregister", start, length, err)
	}
	return nil
}

// progress is the count an ioctl reported before failing: the kernel stores
// either the bytes done or a negative errno in the same field.
func progress(n int64) int64 { return max(n, 0) }

// Copy atomically fills the missing pages at dst with src (whole pages) and
// wakes the threads waiting on them. It returns the bytes copied; on error,
// the bytes copied before it. A partial copy fails with ErrAgain; a page
// that is already populated fails with ErrExist.
func (f *FD) Copy(dst uintptr, src []byte, mode CopyMode) (int64, error) {
	c := uffdioCopy{dst: uint64(dst), src: bufPtr(src), len: uint64(len(src)), mode: uint64(mode)}
	if err := ioctlCopy(f.fd, &c, src); err != nil {
		return progress(c.copy), f.fail("copy", dst, uintptr(len(src)), err)
	}
	return c.copy, nil
}

// ZeroPage maps zero-filled pages over the missing range.
func (f *FD) ZeroPage(start, length uintptr, dontWake bool) (int64, error) {
	z := uffdioZeropage{rng: uffdioRange{start: uint64(start), len: uint64(length)}}
	if dontWake {
		z.mode = zeropageModeDontWake
	}
	if err := ioctlZeropage(f.fd, &z); err != nil {
		return progress(z.zeropage), f.fail("zeropage", start, length, err)
	}
	return z.zeropage, nil
}

// Continue resolves minor faults: it maps the pages the page cache already
// holds for the range (shmem, hugetlbfs).
func (f *FD) Continue(start, length uintptr, mode ContinueMode) (int64, error) {
	c := uffdioContinue{rng: uffdioRange{start: uint64(start), len: uint64(length)}, mode: uint64(mode)}
	if err := ioctlContinue(f.fd, &c); err != nil {
		return progress(c.mapped), f.fail("continue", start, length, err)
	}
	return c.mapped, nil
}

// WriteProtect sets (protect) or removes write protection on a range
// registered with RegisterWP. Removing it wakes the threads waiting on the
// range unless dontWake; setting it wakes nobody, so dontWake is ignored
// then (the kernel would refuse the combination).
func (f *FD) WriteProtect(start, length uintptr, protect, dontWake bool) error {
	w := uffdioWriteprotect{rng: uffdioRange{start: uint64(start), len: uint64(length)}}
	if protect {
		w.mode = wpModeWP
	} else if dontWake {
		w.mode = wpModeDontWake
	}
	if err := ioctlWriteprotect(f.fd, &w); err != nil {
		op := "writeprotect"
		if !protect {
			op = "unprotect"
		}
		return f.fail(op, start, length, err)
	}
	return nil
}

// Wake wakes the threads waiting on faults in the range, after it was
// resolved with a DontWake mode.
func (f *FD) Wake(start, length uintptr) error {
	r := uffdioRange{start: uint64(start), len: uint64(length)}
	if err := ioctlRange(f.fd, reqWake, &r); err != nil {
		return f.fail("wake", start, length, err)
	}
	return nil
}

// Move moves the pages at src to the missing range at dst without copying
// them. Both must be anonymous private memory of the calling process; the
// kernel refuses a move into another process's address space.
func (f *FD) Move(dst, src, length uintptr, mode MoveMode) (int64, error) {
	m := uffdioMove{dst: uint64(dst), src: uint64(src), len: uint64(length), mode: uint64(mode)}
	if err := ioctlMove(f.fd, &m); err != nil {
		e := f.fail("move", dst, length, err)
		e.detail = "from 0x" + formatHex(uint64(src))
		return progress(m.move), e
	}
	return m.move, nil
}

// Poison marks the missing range as poisoned: user accesses get SIGBUS and
// kernel accesses EFAULT, as for a hardware memory error, without a fault
// message. It is how a handler reports memory it cannot provide.
func (f *FD) Poison(start, length uintptr, dontWake bool) (int64, error) {
	p := uffdioPoison{rng: uffdioRange{start: uint64(start), len: uint64(length)}}
	if dontWake {
		p.mode = poisonModeDontWake
	}
	if err := ioctlPoison(f.fd, &p); err != nil {
		return progress(p.updated), f.fail("poison", start, length, err)
	}
	return p.updated, nil
}
