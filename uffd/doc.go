// Package uffd is a pure-Go binding of the Linux userfaultfd ABI: opening a
// userfaultfd, the UFFDIO_API handshake, every range ioctl (REGISTER,
// UNREGISTER, COPY, ZEROPAGE, CONTINUE, WRITEPROTECT, WAKE, MOVE, POISON),
// decoding of the messages read from the fd, an epoll-based Poller, and
// cached probes of what the running kernel supports.
//
// It is the only package of softuvm that talks to userfaultfd. The fault
// server uses it to serve the page faults of client and device processes,
// which send it their userfaultfds over a Unix socket:
//
//	f := uffd.NewFD(receivedFD)        // or uffd.Open(uffd.CloseOnExec)
//	f.Handshake(uffd.FeatureThreadID | uffd.FeatureMissingShmem)
//	r, _ := f.NewReader()              // one per CPU, each on a pinned, locked thread
//	msgs := make([]uffd.Msg, 16)
//	for {
//		n, err := r.Read(msgs)         // blocks in read(2); Stop ends it
//		if err != nil {
//			return
//		}
//		for _, m := range msgs[:n] {
//			// decide where the page comes from, then resolve:
//			f.Copy(uintptr(m.Address), data, 0)
//		}
//	}
//
// Reader is how the fault server waits, because a thread blocked in
// read(2) takes a message inside the kernel as soon as it runs (see its
// documentation); Poller, an epoll over many userfaultfds, serves where
// latency matters less, such as the guard process.
//
// # Why a separate process serves the faults
//
// A Go program must not serve faults taken by its own goroutines in user
// mode: a goroutine blocked in a fault inside memmove cannot be preempted,
// so the next stop-the-world garbage collection waits for it forever while
// the handler goroutine is stopped too. Faults the kernel takes while
// copying to or from user memory inside a system call (read(2) into a
// registered buffer) are safe, since the goroutine is in a syscall; the tests
// of this package rely on that, or fault from a child process.
//
// # The fault path
//
// Reader.Read, ReadMessages, Poller.Wait and the resolving ioctls do not allocate and
// build errors only on failure: a served fault costs microseconds, and the
// server should add well under one. An error of an ioctl is an *OpError that
// keeps the errno; test it with errors.Is against ErrExist (another handler
// resolved the page first), ErrAgain (partial progress, or an address space
// change whose event is waiting to be read: read it and retry), and the
// other sentinels, so callers need not import golang.org/x/sys/unix.
//
// # Opening
//
// Open tries /dev/userfaultfd first, because its file permissions can grant
// kernel-mode fault handling to a group, and falls back to userfaultfd(2),
// which grants it only to processes with CAP_SYS_PTRACE unless
// vm.unprivileged_userfaultfd=1. When neither works the error matches
// ErrPermission and says how to grant access.
//
// This package needs a 64-bit Linux platform: the Go mirrors of the kernel
// structs hold pointers where the kernel has 64-bit integers.
package uffd
