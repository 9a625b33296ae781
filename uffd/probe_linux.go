package uffd

import (
	"sync"
	"sync/atomic"

	"golang.org/x/sys/unix"
)

// Probes run once per process, on a throwaway userfaultfd, and their results
// are cached: the kernel's answers cannot change while the process runs.

// probeRuns counts probe executions, so that tests can check the caching.
var probeRuns struct {
	supported, openMethods atomic.Int32
}

var supported = sync.OnceValues(func() (Feature, error) {
	probeRuns.supported.Add(1)
	f, err := Open(CloseOnExec | NonBlock)
	if err != nil {
		// The feature set does not depend on the mode, and an
		// unprivileged process may still open a user-mode-only fd.
		var err2 error
		if f, err2 = Open(CloseOnExec | NonBlock | UserModeOnly); err2 != nil {
			return 0, err
		}
	}
	defer f.Close()
	a := uffdioAPI{api: uffdAPI}
	if err := ioctlAPI(f.fd, &a); err != nil {
		return 0, &OpError{Op: "api", noRange: true, Err: err, detail: "(feature probe)"}
	}
	return Feature(a.features), nil
})

// Supported returns every feature this kernel offers: what UFFDIO_API
// reports when asked for no feature, on a throwaway fd.
func Supported() (Feature, error) { return supported() }

// CheckFeature returns nil when the kernel offers every bit of f, a
// *FeatureError naming the missing bits (matching ErrNotSupported) when it
// does not, and the probe's own error when the probe failed.
func CheckFeature(f Feature) error {
	sup, err := Supported()
	if err != nil {
		return err
	}
	if missing := f &^ sup; missing != 0 {
		return &FeatureError{Feature: missing}
	}
	return nil
}

var openMethods = sync.OnceValues(func() (device, syscall error) {
	probeRuns.openMethods.Add(1)
	path := devicePath
	if fd, err := openDevice(path, CloseOnExec|NonBlock); err != nil {
		device = &OpError{Op: "open " + path, noRange: true, Err: err}
	} else {
		unix.Close(fd)
	}
	if fd, err := openSyscall(CloseOnExec | NonBlock); err != nil {
		e := &OpError{Op: "open userfaultfd(2)", noRange: true, Err: err}
		if err == unix.EPERM {
			e.hint = "vm.unprivileged_userfaultfd=0 and no CAP_SYS_PTRACE; UserModeOnly would be allowed"
		}
		syscall = e
	} else {
		unix.Close(fd)
	}
	return device, syscall
})

// OpenMethods reports whether each way of opening a userfaultfd that can
// handle kernel-mode faults works in this process: nil, or the error of the
// attempt. The result is cached.
func OpenMethods() (device error, syscall error) { return openMethods() }
