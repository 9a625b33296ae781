package memsys

import (
	"fmt"
	"unsafe"

	"golang.org/x/sys/unix"
)

// maskWords is the nodemask size, in 64-bit words, used for every
// mbind/get_mempolicy call: big enough for any kernel's node count.
const maskWords = MaxNodes / 64

// Mbind sets the memory policy mode for [addr, addr+length) to the given
// nodes. For a shared-memory mapping the kernel stores the policy in the
// file's inode (a shared policy keyed by file offset), not in the mapping.
func Mbind(addr, length uintptr, mode int, nodes []int, flags int) error {
	var mask [maskWords]uint64
	for _, n := range nodes {
		if n < 0 || n >= MaxNodes {
			return unix.EINVAL
		}
		mask[n/64] |= 1 << (n % 64)
	}
	// The kernel reads maxnode-1 bits: pass one more than the mask holds.
	_, _, e := unix.Syscall6(unix.SYS_MBIND, addr, length, uintptr(mode),
		uintptr(unsafe.Pointer(&mask[0])), uintptr(len(mask)*64+1), uintptr(flags))
	if e != 0 {
		return e
	}
	return nil
}

// PolicyOfAddress reports the memory policy in force at addr (for a
// shared-memory mapping, the file's shared policy for that offset): the
// mode without its flag bits, and the nodes of its nodemask.
func PolicyOfAddress(addr uintptr) (mode int, nodes []int, err error) {
	var m int32
	var mask [maskWords]uint64
	_, _, e := unix.Syscall6(unix.SYS_GET_MEMPOLICY, uintptr(unsafe.Pointer(&m)),
		uintptr(unsafe.Pointer(&mask[0])), uintptr(len(mask)*64+1), addr, unix.MPOL_F_ADDR, 0)
	if e != 0 {
		return 0, nil, e
	}
	for n := 0; n < MaxNodes; n++ {
		if mask[n/64]&(1<<(n%64)) != 0 {
			nodes = append(nodes, n)
		}
	}
	return int(m) &^ mpolModeFlags, nodes, nil
}

// NodeOfAddress reports the node of the page at addr. The kernel faults
// the page in to find it, so on a hole this allocates a page.
func NodeOfAddress(addr uintptr) (int, error) {
	var node int32
	_, _, e := unix.Syscall6(unix.SYS_GET_MEMPOLICY, uintptr(unsafe.Pointer(&node)), 0, 0,
		addr, unix.MPOL_F_NODE|unix.MPOL_F_ADDR, 0)
	if e != 0 {
		return 0, e
	}
	return int(node), nil
}

// Getcpu reports the CPU and node the calling thread is running on.
func Getcpu() (cpu, node int, err error) {
	var c, n uint32
	_, _, e := unix.RawSyscall(unix.SYS_GETCPU, uintptr(unsafe.Pointer(&c)), uintptr(unsafe.Pointer(&n)), 0)
	if e != 0 {
		return 0, 0, e
	}
	return int(c), int(n), nil
}

// Bytes views length bytes of mapped memory at addr as a slice. The
// memory is not Go's, so the garbage collector neither scans nor moves
// it, and the slice is valid exactly as long as the mapping is: after
// munmap, touching it faults.
//
// The address is reinterpreted through memory rather than converted with
// unsafe.Pointer(addr): the result is the same, but go vet cannot tell a
// conversion of a foreign address from the misuse of a Go pointer kept
// as a uintptr, and a vet warning that is always ignored hides real ones.
func Bytes(addr uintptr, length int) []byte {
	if addr == 0 || length <= 0 {
		return nil
	}
	p := *(*unsafe.Pointer)(unsafe.Pointer(&addr))
	return unsafe.Slice((*byte)(p), length)
}

// Mincore reports, one byte per page, which pages of the mapping at addr
// are in memory: for a shared file mapping, in the file's page cache,
// mapped here or not.
func Mincore(addr, length uintptr, vec []byte) error {
	if len(vec) < int((length+4095)/4096) {
		return fmt.Errorf("mincore %#x+%d: vector of %d bytes: want one per page", addr, length, len(vec))
	}
	_, _, e := unix.Syscall(unix.SYS_MINCORE, addr, length, uintptr(unsafe.Pointer(&vec[0])))
	if e != 0 {
		return e
	}
	return nil
}
