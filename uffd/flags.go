//go:build linux

package uffd

import (
	"strconv"
	"strings"
)

// Feature is a set of UFFD_FEATURE_* bits: asked for in Handshake and
// reported by Supported.
type Feature uint64

// The UFFD_FEATURE_* bits of Linux 6.18.
const (
	FeaturePagefaultFlagWP  Feature = 1 << 0  // write-protect faults (RegisterWP) are reported
	FeatureEventFork        Feature = 1 << 1  // EventFork; needs CAP_SYS_PTRACE
	FeatureEventRemap       Feature = 1 << 2  // EventRemap; without it mremap drops the registration
	FeatureEventRemove      Feature = 1 << 3  // EventRemove on MADV_DONTNEED/MADV_REMOVE
	FeatureMissingHugetlbfs Feature = 1 << 4  // probe only: RegisterMissing works on hugetlbfs
	FeatureMissingShmem     Feature = 1 << 5  // probe only: RegisterMissing works on shmem
	FeatureEventUnmap       Feature = 1 << 6  // EventUnmap on munmap
	FeatureSigbus           Feature = 1 << 7  // faults raise SIGBUS (EFAULT in the kernel) instead of a message
	FeatureThreadID         Feature = 1 << 8  // Msg.TID is filled in
	FeatureMinorHugetlbfs   Feature = 1 << 9  // RegisterMinor works on hugetlbfs
	FeatureMinorShmem       Feature = 1 << 10 // RegisterMinor works on shmem
	FeatureExactAddress     Feature = 1 << 11 // Msg.Address keeps the offset inside the page
	FeatureWPHugetlbfsShmem Feature = 1 << 12 // RegisterWP works on hugetlbfs and shmem
	FeatureWPUnpopulated    Feature = 1 << 13 // WriteProtect also protects never-populated anonymous pages
	FeaturePoison           Feature = 1 << 14 // the Poison ioctl
	FeatureWPAsync          Feature = 1 << 15 // the kernel resolves WP faults itself (dirty tracking)
	FeatureMove             Feature = 1 << 16 // the Move ioctl
)

var featureNames = []string{
	"PAGEFAULT_FLAG_WP", "EVENT_FORK", "EVENT_REMAP", "EVENT_REMOVE",
	"MISSING_HUGETLBFS", "MISSING_SHMEM", "EVENT_UNMAP", "SIGBUS",
	"THREAD_ID", "MINOR_HUGETLBFS", "MINOR_SHMEM", "EXACT_ADDRESS",
	"WP_HUGETLBFS_SHMEM", "WP_UNPOPULATED", "POISON", "WP_ASYNC", "MOVE",
}

// knownFeatures are the bits this package has names for.
const knownFeatures = Feature(1)<<17 - 1

// String returns the kernel names without the UFFD_FEATURE_ prefix joined by
// "|", for example "MISSING_SHMEM|THREAD_ID"; bits without a name are shown
// as one hexadecimal number, and the empty set as "0".
func (f Feature) String() string { return maskString(uint64(f), featureNames) }

// Has reports whether every bit of g is set in f.
func (f Feature) Has(g Feature) bool { return f&g == g }

// Ioctl is a set of userfaultfd ioctls, as the kernel reports them from
// UFFDIO_API (the ioctls valid on the fd) and UFFDIO_REGISTER (the ioctls
// valid on the registered range): bit n stands for _UFFDIO_* command n.
type Ioctl uint64

// The ioctl bits.
const (
	IoctlRegister     Ioctl = 1 << 0x00
	IoctlUnregister   Ioctl = 1 << 0x01
	IoctlWake         Ioctl = 1 << 0x02
	IoctlCopy         Ioctl = 1 << 0x03
	IoctlZeropage     Ioctl = 1 << 0x04
	IoctlMove         Ioctl = 1 << 0x05
	IoctlWriteProtect Ioctl = 1 << 0x06
	IoctlContinue     Ioctl = 1 << 0x07
	IoctlPoison       Ioctl = 1 << 0x08
	IoctlAPI          Ioctl = 1 << 0x3F
)

var ioctlNames = func() []string {
	n := make([]string, 64)
	n[nrRegister] = "REGISTER"
	n[nrUnregister] = "UNREGISTER"
	n[nrWake] = "WAKE"
	n[nrCopy] = "COPY"
	n[nrZeropage] = "ZEROPAGE"
	n[nrMove] = "MOVE"
	n[nrWriteProtect] = "WRITEPROTECT"
	n[nrContinue] = "CONTINUE"
	n[nrPoison] = "POISON"
	n[nrAPI] = "API"
	return n
}()

// String returns the command names joined by "|", for example
// "WAKE|COPY|ZEROPAGE".
func (i Ioctl) String() string { return maskString(uint64(i), ioctlNames) }

// Has reports whether every bit of j is set in i.
func (i Ioctl) Has(j Ioctl) bool { return i&j == j }

// OpenFlag modifies Open.
type OpenFlag int

const (
	// NonBlock makes ReadMessages return at once when nothing is pending.
	// A Poller requires it: the kernel reports a blocking userfaultfd as
	// always in error to poll and epoll.
	NonBlock OpenFlag = 1 << iota
	// CloseOnExec keeps the fd out of programs this process executes.
	// Almost every caller wants it; it is a flag only because the kernel
	// offers the choice.
	CloseOnExec
	// UserModeOnly limits the fd to faults taken in user mode: a fault
	// taken while the kernel copies to or from user memory (read(2) into a
	// registered buffer, for instance) fails with EFAULT instead of
	// reaching the handler. It is what an unprivileged process may open
	// with vm.unprivileged_userfaultfd=0.
	UserModeOnly
)

// OpenMethod says how Open obtained a userfaultfd.
type OpenMethod int

const (
	// MethodDevice is the USERFAULTFD_IOC_NEW ioctl on /dev/userfaultfd,
	// whose file permissions decide who may handle kernel-mode faults.
	MethodDevice OpenMethod = iota + 1
	// MethodSyscall is the userfaultfd(2) system call.
	MethodSyscall
)

func (m OpenMethod) String() string {
	switch m {
	case MethodDevice:
		return "/dev/userfaultfd"
	case MethodSyscall:
		return "userfaultfd(2)"
	case 0:
		return "received"
	}
	return "OpenMethod(" + strconv.Itoa(int(m)) + ")"
}

// RegisterMode says which faults of a range are reported.
type RegisterMode uint64

// UFFDIO_REGISTER_MODE_* bits.
const (
	RegisterMissing RegisterMode = 1 << 0 // access to a page with nothing mapped
	RegisterWP      RegisterMode = 1 << 1 // write to a write-protected page
	RegisterMinor   RegisterMode = 1 << 2 // access to a page that is in the page cache but not mapped (shmem, hugetlbfs)
)

var registerModeNames = []string{"MISSING", "WP", "MINOR"}

// String returns "MISSING|WP" style names.
func (m RegisterMode) String() string { return maskString(uint64(m), registerModeNames) }

// CopyMode modifies Copy.
type CopyMode uint64

// UFFDIO_COPY_MODE_* bits.
const (
	CopyDontWake CopyMode = 1 << 0 // leave the faulting threads asleep; Wake them later
	CopyWP       CopyMode = 1 << 1 // map the new pages write-protected
)

// ContinueMode modifies Continue.
type ContinueMode uint64

// UFFDIO_CONTINUE_MODE_* bits.
const (
	ContinueDontWake ContinueMode = 1 << 0 // leave the faulting threads asleep
	ContinueWP       ContinueMode = 1 << 1 // map the pages write-protected
)

// MoveMode modifies Move.
type MoveMode uint64

// UFFDIO_MOVE_MODE_* bits.
const (
	MoveDontWake      MoveMode = 1 << 0 // leave the faulting threads asleep
	MoveAllowSrcHoles MoveMode = 1 << 1 // skip unpopulated source pages instead of failing with ENOENT
)

// Event is the kind of a message read from a userfaultfd.
type Event uint8

// UFFD_EVENT_* values. They start at 0x12 so that a zeroed message is not a
// valid one.
const (
	EventPagefault Event = 0x12
	EventFork      Event = 0x13
	EventRemap     Event = 0x14
	EventRemove    Event = 0x15
	EventUnmap     Event = 0x16
)

func (e Event) String() string {
	switch e {
	case EventPagefault:
		return "PAGEFAULT"
	case EventFork:
		return "FORK"
	case EventRemap:
		return "REMAP"
	case EventRemove:
		return "REMOVE"
	case EventUnmap:
		return "UNMAP"
	}
	return "Event(0x" + strconv.FormatUint(uint64(e), 16) + ")"
}

// PagefaultFlag describes a page fault.
type PagefaultFlag uint64

// UFFD_PAGEFAULT_FLAG_* bits.
const (
	PagefaultWrite PagefaultFlag = 1 << 0 // the access was a write
	PagefaultWP    PagefaultFlag = 1 << 1 // a write hit a write-protected page (RegisterWP)
	PagefaultMinor PagefaultFlag = 1 << 2 // the page is in the page cache but not mapped (RegisterMinor)
)

var pagefaultFlagNames = []string{"WRITE", "WP", "MINOR"}

// String returns "WRITE|WP" style names; a read fault of a missing page,
// which has no flag, is "0".
func (p PagefaultFlag) String() string { return maskString(uint64(p), pagefaultFlagNames) }

// maskString names the set bits of v, lowest first, and shows the bits
// without a name as one hexadecimal number at the end.
func maskString(v uint64, names []string) string {
	if v == 0 {
		return "0"
	}
	var b strings.Builder
	var unknown uint64
	for bit := range 64 {
		m := uint64(1) << bit
		if v&m == 0 {
			continue
		}
		if bit >= len(names) || names[bit] == "" {
			unknown |= m
			continue
		}
		if b.Len() > 0 {
			b.WriteByte('|')
		}
		b.WriteString(names[bit])
	}
	if unknown != 0 {
		if b.Len() > 0 {
			b.WriteByte('|')
		}
		b.WriteString("0x")
		b.WriteString(strconv.FormatUint(unknown, 16))
	}
	return b.String()
}
