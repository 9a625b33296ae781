// Package memsys is devmem's only door to golang.org/x/sys/unix.
//
// Keeping every raw system call here means the rest of devmem can be read
// as policy (which range, which node, what to do on failure) without
// wading through uintptr casts, and the unsafe pointer work the kernel
// interfaces force on us (nodemasks, out-parameters, memory that Go did
// not allocate) sits in one small, reviewable place: the *_unsafe.go
// files.
//
// The wrappers return the bare errno (a syscall.Errno, so callers test it
// with errors.Is against the syscall constants) and add no context: the
// caller knows which file and range it was working on and says so in its
// own error. Calls that the kernel may interrupt are retried on EINTR
// here, because every caller would otherwise have to.
//
// Calls that take or return a virtual address use uintptr and go through
// Syscall6 directly rather than x/sys's []byte-based helpers: the
// addresses are in memory the Go runtime does not manage (reservations,
// MAP_FIXED windows, mappings shared with other processes), and
// round-tripping them through unsafe.Pointer would only invite the
// misuse go vet warns about.
package memsys
