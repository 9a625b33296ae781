package uffd

import "unsafe"

// The kernel ABI of <linux/userfaultfd.h>, written by hand rather than with
// cgo. TestABIHeader compiles a C program against the installed header and
// compares every value below; TestABIKernelBTF compares the struct layouts
// with the running kernel's BTF, which also covers the structs that older
// headers lack (uffdio_move, uffdio_poison).

// _UFFDIO_* command numbers: bit positions in the Ioctl masks and the nr
// field of the ioctl request numbers.
const (
	nrRegister     = 0x00
	nrUnregister   = 0x01
	nrWake         = 0x02
	nrCopy         = 0x03
	nrZeropage     = 0x04
	nrMove         = 0x05
	nrWriteProtect = 0x06
	nrContinue     = 0x07
	nrPoison       = 0x08
	nrAPI          = 0x3F
)

const (
	uffdAPI      = 0xAA // UFFD_API
	uffdioType   = 0xAA // UFFDIO: the ioctl type byte
	userModeOnly = 1    // UFFD_USER_MODE_ONLY, a flag of userfaultfd(2)
)

// Sizes of the ioctl argument structs; the request numbers encode them.
const (
	sizeofUffdioAPI       = 24
	sizeofUffdioRange     = 16
	sizeofUffdioRegister  = 32
	sizeofUffdioCopy      = 40
	sizeofUffdioZeropage  = 32
	sizeofUffdioWriteprot = 24
	sizeofUffdioContinue  = 32
	sizeofUffdioMove      = 40
	sizeofUffdioPoison    = 32
)

// Linux's generic _IOC encoding (asm-generic/ioctl.h), which x86, arm64 and
// riscv use: dir:2 | size:14 | type:8 | nr:8.
const (
	iocNone  = 0
	iocWrite = 1
	iocRead  = 2
)

// Request numbers. UNREGISTER and WAKE are _IOR although the kernel reads
// the argument: the header keeps that historical mistake for ABI stability.
const (
	reqNew          = iocNone<<30 | 0<<16 | uffdioType<<8 | 0x00 // USERFAULTFD_IOC_NEW
	reqAPI          = (iocRead|iocWrite)<<30 | sizeofUffdioAPI<<16 | uffdioType<<8 | nrAPI
	reqRegister     = (iocRead|iocWrite)<<30 | sizeofUffdioRegister<<16 | uffdioType<<8 | nrRegister
	reqUnregister   = iocRead<<30 | sizeofUffdioRange<<16 | uffdioType<<8 | nrUnregister
	reqWake         = iocRead<<30 | sizeofUffdioRange<<16 | uffdioType<<8 | nrWake
	reqCopy         = (iocRead|iocWrite)<<30 | sizeofUffdioCopy<<16 | uffdioType<<8 | nrCopy
	reqZeropage     = (iocRead|iocWrite)<<30 | sizeofUffdioZeropage<<16 | uffdioType<<8 | nrZeropage
	reqMove         = (iocRead|iocWrite)<<30 | sizeofUffdioMove<<16 | uffdioType<<8 | nrMove
	reqWriteProtect = (iocRead|iocWrite)<<30 | sizeofUffdioWriteprot<<16 | uffdioType<<8 | nrWriteProtect
	reqContinue     = (iocRead|iocWrite)<<30 | sizeofUffdioContinue<<16 | uffdioType<<8 | nrContinue
	reqPoison       = (iocRead|iocWrite)<<30 | sizeofUffdioPoison<<16 | uffdioType<<8 | nrPoison
)

// Mode bits of the individual ioctls (UFFDIO_*_MODE_*).
const (
	zeropageModeDontWake = 1 << 0
	wpModeWP             = 1 << 0
	wpModeDontWake       = 1 << 1
	poisonModeDontWake   = 1 << 0
)

// Byte offsets inside struct uffd_msg (packed).
const (
	msgOffEvent      = 0
	msgOffArg        = 8
	msgOffPFFlags    = msgOffArg + 0
	msgOffPFAddress  = msgOffArg + 8
	msgOffPFPtid     = msgOffArg + 16
	msgOffForkUfd    = msgOffArg + 0
	msgOffRemapFrom  = msgOffArg + 0
	msgOffRemapTo    = msgOffArg + 8
	msgOffRemapLen   = msgOffArg + 16
	msgOffRemoveFrom = msgOffArg + 0
	msgOffRemoveEnd  = msgOffArg + 8
)

// struct uffdio_api
type uffdioAPI struct {
	api      uint64
	features uint64
	ioctls   uint64
}

// struct uffdio_range
type uffdioRange struct {
	start uint64
	len   uint64
}

// struct uffdio_register
type uffdioRegister struct {
	rng    uffdioRange
	mode   uint64
	ioctls uint64
}

// struct uffdio_copy. src is an unsafe.Pointer rather than the kernel's
// __u64 so that the Go stack copier adjusts it if the source buffer lives on
// a goroutine stack that moves between filling the struct and the ioctl;
// the size check below keeps the layout identical to the kernel's, which
// limits the package to 64-bit platforms.
type uffdioCopy struct {
	dst  uint64
	src  unsafe.Pointer
	len  uint64
	mode uint64
	copy int64
}

// struct uffdio_zeropage
type uffdioZeropage struct {
	rng      uffdioRange
	mode     uint64
	zeropage int64
}

// struct uffdio_writeprotect
type uffdioWriteprotect struct {
	rng  uffdioRange
	mode uint64
}

// struct uffdio_continue
type uffdioContinue struct {
	rng    uffdioRange
	mode   uint64
	mapped int64
}

// struct uffdio_move
type uffdioMove struct {
	dst  uint64
	src  uint64
	len  uint64
	mode uint64
	move int64
}

// struct uffdio_poison
type uffdioPoison struct {
	rng     uffdioRange
	mode    uint64
	updated int64
}

// Compile-time layout checks: an index out of range here means a Go struct
// no longer has the kernel's size (for instance on a 32-bit platform).
var _ = [1]struct{}{}[unsafe.Sizeof(uffdioAPI{})-sizeofUffdioAPI]
var _ = [1]struct{}{}[unsafe.Sizeof(uffdioRange{})-sizeofUffdioRange]
var _ = [1]struct{}{}[unsafe.Sizeof(uffdioRegister{})-sizeofUffdioRegister]
var _ = [1]struct{}{}[unsafe.Sizeof(uffdioCopy{})-sizeofUffdioCopy]
var _ = [1]struct{}{}[unsafe.Sizeof(uffdioZeropage{})-sizeofUffdioZeropage]
var _ = [1]struct{}{}[unsafe.Sizeof(uffdioWriteprotect{})-sizeofUffdioWriteprot]
var _ = [1]struct{}{}[unsafe.Sizeof(uffdioContinue{})-sizeofUffdioContinue]
var _ = [1]struct{}{}[unsafe.Sizeof(uffdioMove{})-sizeofUffdioMove]
var _ = [1]struct{}{}[unsafe.Sizeof(uffdioPoison{})-sizeofUffdioPoison]
