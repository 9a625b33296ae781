//go:build linux

package uffd_test

import (
	"encoding/binary"
	"errors"
	"fmt"
	"log"
	"time"
	"unsafe"

	"github.com/softuvm/softuvm/uffd"
	"golang.org/x/sys/unix"
)

// Open a userfaultfd, register a shared memfd mapping for missing-page
// faults, and fill its first page with zeros before anyone touches it.
// UserModeOnly lets any user run this; a fault server leaves it out, to
// also serve the faults the kernel takes on behalf of its clients.
func Example() {
	f, err := uffd.Open(uffd.NonBlock | uffd.CloseOnExec | uffd.UserModeOnly)
	if err != nil {
		log.Fatal(err) // errors.Is(err, uffd.ErrPermission): the message says how to grant access
	}
	defer f.Close()
	if _, err := f.Handshake(uffd.FeatureMissingShmem | uffd.FeatureThreadID); err != nil {
		log.Fatal(err)
	}

	const size = 4096
	memfd, err := unix.MemfdCreate("example", unix.MFD_CLOEXEC)
	if err != nil {
		log.Fatal(err)
	}
	defer unix.Close(memfd)
	if err := unix.Ftruncate(memfd, size); err != nil {
		log.Fatal(err)
	}
	mem, err := unix.Mmap(memfd, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		log.Fatal(err)
	}
	defer unix.Munmap(mem)
	start := uintptr(unsafe.Pointer(&mem[0]))

	ioctls, err := f.Register(start, size, uffd.RegisterMissing)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("range allows ZEROPAGE:", ioctls.Has(uffd.IoctlZeropage))

	n, err := f.ZeroPage(start, size, false)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("zeroed", n, "bytes; first byte", mem[0])

	// The page is populated now: a second fill reports ErrExist, the
	// answer a handler gets when another one resolved the fault first.
	_, err = f.ZeroPage(start, size, false)
	fmt.Println("again:", errors.Is(err, uffd.ErrExist))
	// Output:
	// range allows ZEROPAGE: true
	// zeroed 4096 bytes; first byte 0
	// again: true
}

// Serve one page fault with a Poller. The fault is taken by the kernel
// while write(2) copies the registered page into a pipe: the writing
// goroutine waits inside the system call, which is the only kind of fault a
// Go program may serve for itself (see the package documentation).
//
// Serving kernel-mode faults needs root or access to /dev/userfaultfd, so
// this example has no output check; TestExamplePoller runs it where it can
// and compares the output:
//
//	PAGEFAULT write: false thread known: true
//	the writer read "hello"
func ExamplePoller() {
	f, err := uffd.Open(uffd.NonBlock | uffd.CloseOnExec)
	if err != nil {
		log.Fatal(err)
	}
	defer f.Close()
	if _, err := f.Handshake(uffd.FeatureThreadID); err != nil {
		log.Fatal(err)
	}
	mem, err := unix.Mmap(-1, 0, 4096, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		log.Fatal(err)
	}
	defer unix.Munmap(mem)
	if _, err := f.Register(uintptr(unsafe.Pointer(&mem[0])), 4096, uffd.RegisterMissing); err != nil {
		log.Fatal(err)
	}

	p, err := uffd.NewPoller()
	if err != nil {
		log.Fatal(err)
	}
	defer p.Close()
	const client = 1
	if err := p.Add(f, client); err != nil {
		log.Fatal(err)
	}

	var pipe [2]int
	if err := unix.Pipe2(pipe[:], unix.O_CLOEXEC); err != nil {
		log.Fatal(err)
	}
	defer unix.Close(pipe[0])
	defer unix.Close(pipe[1])
	go unix.Write(pipe[1], mem[:5]) // faults on the missing page

	keys := make([]uint64, 0, 8)
	msgs := make([]uffd.Msg, 8)
	page := make([]byte, 4096)
	copy(page, "hello")
	for served := false; !served; {
		keys, _, err = p.Wait(keys, 10*time.Second)
		if err != nil || len(keys) == 0 {
			log.Fatal("no fault: ", err)
		}
		n, err := f.ReadMessages(msgs)
		if err != nil {
			log.Fatal(err)
		}
		for _, m := range msgs[:n] {
			fmt.Println(m.Event, "write:", m.Flags&uffd.PagefaultWrite != 0, "thread known:", m.TID != 0)
			if _, err := f.Copy(uintptr(m.Address), page, 0); err != nil && !errors.Is(err, uffd.ErrExist) {
				log.Fatal(err)
			}
			served = true
		}
	}
	buf := make([]byte, 5)
	unix.Read(pipe[0], buf)
	fmt.Printf("the writer read %q\n", buf)
}

// Check for a feature before relying on it.
func ExampleCheckFeature() {
	err := uffd.CheckFeature(uffd.FeatureMove | uffd.FeatureMinorShmem)
	var fe *uffd.FeatureError
	switch {
	case errors.As(err, &fe):
		fmt.Println("this kernel lacks", fe.Feature) // errors.Is(err, uffd.ErrNotSupported) too
	case err != nil:
		fmt.Println("cannot probe userfaultfd:", err)
	default:
		fmt.Println("MOVE and MINOR_SHMEM are available")
	}
}

// Decode a message read from a userfaultfd by other means.
func ExampleDecodeMsg() {
	var raw [uffd.MsgSize]byte
	raw[0] = byte(uffd.EventPagefault)
	binary.NativeEndian.PutUint64(raw[8:], uint64(uffd.PagefaultWrite))
	binary.NativeEndian.PutUint64(raw[16:], 0x7f0000001000)
	binary.NativeEndian.PutUint32(raw[24:], 4242)
	m, err := uffd.DecodeMsg(raw[:])
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(m)
	// Output: PAGEFAULT 0x7f0000001000 flags=WRITE tid=4242
}
