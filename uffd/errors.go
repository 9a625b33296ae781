//go:build linux

package uffd

import (
	"errors"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// Errnos the callers of this package test for, so that they need not import
// golang.org/x/sys/unix. Every error of an ioctl is an *OpError that unwraps
// to its errno, so errors.Is(err, ErrExist) works.
var (
	// ErrExist: Copy, ZeroPage, Continue, Move or Poison found the page
	// already populated; another handler resolved the fault first.
	ErrExist error = unix.EEXIST
	// ErrNoEntry: Move found a hole in the source without MoveAllowSrcHoles.
	ErrNoEntry error = unix.ENOENT
	// ErrAgain: the operation resolved only part of the range (the returned
	// count says how much), or the address space is changing (a fork,
	// mremap, madvise or munmap event is waiting to be read): read the
	// pending messages and retry the rest.
	ErrAgain error = unix.EAGAIN
	// ErrProcessGone: the process that owns the registered memory exited.
	ErrProcessGone error = unix.ESRCH
	// ErrInvalid: a misaligned range, a range not registered with this fd,
	// a mode the range does not allow, or a second Handshake.
	ErrInvalid error = unix.EINVAL
	// ErrFault: the kernel could not access memory named by the call, or a
	// kernel-mode access hit a poisoned page.
	ErrFault error = unix.EFAULT
)

// ErrNotSupported is matched (with errors.Is) by every *FeatureError. It
// wraps errors.ErrUnsupported.
var ErrNotSupported error = &notSupported{}

type notSupported struct{}

func (*notSupported) Error() string { return "uffd: not supported by this kernel" }
func (*notSupported) Unwrap() error { return errors.ErrUnsupported }

// ErrPermission is matched (with errors.Is) by the error of Open when the
// process may use neither /dev/userfaultfd nor the userfaultfd(2) system
// call. It wraps os.ErrPermission.
var ErrPermission error = &permissionDenied{}

type permissionDenied struct{}

func (*permissionDenied) Error() string { return "uffd: permission denied" }
func (*permissionDenied) Unwrap() error { return os.ErrPermission }

// OpError is the error of an operation on a userfaultfd. Err is the errno
// the kernel returned (a golang.org/x/sys/unix.Errno), which Unwrap yields.
type OpError struct {
	Op            string // "copy", "register", "read", ...
	Start, Length uint64 // the range operated on; both 0 for operations without one
	Err           error

	// detail follows the range in the message (Move's source address);
	// hint follows the errno (a likely cause). Both are only built on
	// failure.
	detail, hint string
	noRange      bool
}

// Error reads like "uffd copy 0x7f0000000000+4096: file exists".
func (e *OpError) Error() string {
	var b strings.Builder
	b.WriteString("uffd ")
	b.WriteString(e.Op)
	if !e.noRange {
		b.WriteString(" 0x")
		b.WriteString(strconv.FormatUint(e.Start, 16))
		b.WriteByte('+')
		b.WriteString(strconv.FormatUint(e.Length, 10))
	}
	if e.detail != "" {
		b.WriteByte(' ')
		b.WriteString(e.detail)
	}
	b.WriteString(": ")
	if e.Err != nil {
		b.WriteString(e.Err.Error())
	} else {
		b.WriteString("<nil>")
	}
	if e.hint != "" {
		b.WriteString(" (")
		b.WriteString(e.hint)
		b.WriteByte(')')
	}
	return b.String()
}

// Unwrap returns the errno.
func (e *OpError) Unwrap() error { return e.Err }

func formatHex(v uint64) string { return strconv.FormatUint(v, 16) }

func rangeError(op string, start, length uintptr, err error) *OpError {
	return &OpError{Op: op, Start: uint64(start), Length: uint64(length), Err: err}
}

// FeatureError says that the kernel lacks a feature.
type FeatureError struct {
	Feature Feature // the missing bits
}

func (e *FeatureError) Error() string {
	return "uffd: kernel does not support " + e.Feature.String()
}

// Is makes errors.Is(err, ErrNotSupported) true.
func (e *FeatureError) Is(target error) bool { return target == ErrNotSupported }

// Unwrap returns ErrNotSupported, so errors.Is(err, errors.ErrUnsupported)
// is true as well.
func (e *FeatureError) Unwrap() error { return ErrNotSupported }

// OpenError is the error of Open when neither way to create a userfaultfd
// worked. It unwraps to both errnos; when both say the process lacks
// permission it also matches ErrPermission and os.ErrPermission, and its
// message says how to grant access.
type OpenError struct {
	DevicePath string
	Device     error // opening DevicePath or its USERFAULTFD_IOC_NEW ioctl
	Syscall    error // the userfaultfd(2) system call
	Flags      OpenFlag
	// Sysctl is the value of vm.unprivileged_userfaultfd, or "" when it
	// could not be read.
	Sysctl string
}

func isPermission(err error) bool {
	return errors.Is(err, unix.EACCES) || errors.Is(err, unix.EPERM)
}

// Permission reports whether both attempts were refused for lack of
// permission (a missing device counts as refused: it grants nothing).
func (e *OpenError) Permission() bool {
	devDenied := isPermission(e.Device) || errors.Is(e.Device, unix.ENOENT) || errors.Is(e.Device, unix.ENOTTY)
	return devDenied && isPermission(e.Syscall)
}

func (e *OpenError) Error() string {
	var b strings.Builder
	b.WriteString("uffd: open ")
	b.WriteString(e.DevicePath)
	b.WriteString(": ")
	b.WriteString(errString(e.Device))
	b.WriteString("; the userfaultfd(2) system call: ")
	b.WriteString(errString(e.Syscall))
	if !e.Permission() {
		return b.String()
	}
	if e.Sysctl != "" {
		b.WriteString(" (vm.unprivileged_userfaultfd=" + e.Sysctl)
		if e.Sysctl == "0" {
			b.WriteString(": only processes with CAP_SYS_PTRACE may handle faults the kernel takes on user memory")
			if e.Flags&UserModeOnly == 0 {
				b.WriteString(", and this open did not ask for UserModeOnly")
			}
		}
		b.WriteString(")")
	}
	b.WriteString(". Grant access with one of: chmod 0660 ")
	b.WriteString(e.DevicePath)
	b.WriteString(" and chgrp it to a group this user is in; sysctl -w vm.unprivileged_userfaultfd=1; or run as root (or with CAP_SYS_PTRACE)")
	return b.String()
}

func errString(err error) string {
	if err == nil {
		return "ok"
	}
	return err.Error()
}

// Unwrap returns both errnos.
func (e *OpenError) Unwrap() []error {
	var errs []error
	for _, err := range []error{e.Device, e.Syscall} {
		if err != nil {
			errs = append(errs, err)
		}
	}
	return errs
}

// Is matches ErrPermission when both attempts lacked permission.
func (e *OpenError) Is(target error) bool {
	return target == ErrPermission && e.Permission()
}
