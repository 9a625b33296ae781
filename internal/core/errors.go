package core

import "errors"

// The error classes of the API, after the CUDA runtime's error codes.
// Every error the package returns wraps exactly one of them, so callers
// (and the C library's error codes) can classify with errors.Is, while the
// message names the offending value.
var (
	// ErrInvalidValue: an argument is out of range, a pointer is not
	// managed memory of this process, a message is malformed.
	ErrInvalidValue = errors.New("invalid value")
	// ErrMemoryAllocation: memory could not be reserved or a device
	// arena is full.
	ErrMemoryAllocation = errors.New("out of memory")
	// ErrInvalidDevice: a device index that does not exist.
	ErrInvalidDevice = errors.New("invalid device")
	// ErrInitialization: the runtime could not start, for example
	// because userfaultfd is not available to this user.
	ErrInitialization = errors.New("initialization error")
	// ErrNotSupported: the operation needs something this kernel or
	// configuration does not offer.
	ErrNotSupported = errors.New("not supported")
	// ErrServerGone: the fault server exited; managed memory that was not
	// on the host is lost.
	ErrServerGone = errors.New("fault server gone")
	// ErrLaunchFailure: a kernel failed (panicked, faulted) or its device
	// process died while it ran.
	ErrLaunchFailure = errors.New("launch failure")
	// ErrInternal: a bug or an unexpected kernel error.
	ErrInternal = errors.New("internal error")
)

// joinErrors joins errors, nil when there are none; every class stays
// visible to errors.Is.
func JoinErrors(errs []error) error {
	switch len(errs) {
	case 0:
		return nil
	case 1:
		return errs[0]
	}
	return errors.Join(errs...)
}
