package devmem

import (
	"errors"
	"fmt"
	"slices"
	"sync"
	"syscall"

	"github.com/softuvm/softuvm/devmem/internal/memsys"
)

// maxBindChunk is the largest window BindRange maps at once. Binding a
// whole location file (1<<47 bytes) cannot be done through one mapping,
// since that is the whole user address space; 4 TiB windows bind it in 32
// steps, each a separate entry in the inode's shared-policy tree, while
// borrowing only a sliver of the address space at a time.
const maxBindChunk = 1 << 42

// minBindChunk is where BindRange stops halving its window when the
// address space is too fragmented to map a larger one.
const minBindChunk = 1 << 21

// BindRange sets the memory policy MPOL_BIND(node) for [off, off+length)
// of the file (page-aligned). The kernel keeps a shared-memory file's
// policy in its inode, keyed by file offset, so the binding applies to
// every later page allocation in that range, through any process's
// mapping, pwrite, fallocate or copy_file_range. mbind only takes
// addresses, hence the temporary mapping: the range is mapped (in windows
// of at most 4 TiB), bound and unmapped.
//
// Pages already allocated in the range stay where they are; binding is
// meant to happen before data is placed. Binding the whole file sets
// Node.
func (f *File) BindRange(node int, off, length int64) error {
	if node < 0 || node >= memsys.MaxNodes {
		return fmt.Errorf("bind %s %#x+%d: node %d: want 0..%d", f.name, off, length, node, memsys.MaxNodes-1)
	}
	if err := f.checkRange("bind", off, length, true); err != nil {
		return err
	}
	fd, err := f.sysfd("bind")
	if err != nil {
		return err
	}
	chunk := int64(maxBindChunk)
	for pos := off; pos < off+length; {
		n := min(chunk, off+length-pos)
		addr, err := memsys.Mmap(0, uintptr(n), memsys.ProtNone, memsys.MapShared|memsys.MapNoreserve, fd, pos)
		if errors.Is(err, syscall.ENOMEM) && chunk > minBindChunk {
			chunk /= 2
			continue
		}
		if err != nil {
			return fmt.Errorf("bind %s %#x+%d to node %d: map %#x+%d: %w", f.name, off, length, node, pos, n, err)
		}
		err = memsys.Mbind(addr, uintptr(n), memsys.MpolBind, []int{node}, 0)
		if uerr := memsys.Munmap(addr, uintptr(n)); uerr != nil && err == nil {
			return fmt.Errorf("bind %s %#x+%d to node %d: unmap window %#x+%d: %w", f.name, off, length, node, pos, n, uerr)
		}
		if err != nil {
			return fmt.Errorf("bind %s %#x+%d to node %d: mbind %#x+%d: %w", f.name, off, length, node, pos, n, err)
		}
		pos += n
	}
	if off == 0 && length == f.size {
		f.node.Store(int64(node))
	}
	return nil
}

// PreferNode gives [addr, addr+length), a shared mapping of a location
// file, the memory policy that prefers NUMA node node (MPOL_PREFERRED):
// the file keeps it (a shared policy), so pages allocated there later, by
// whichever process, are allocated on node where they can be. With move,
// the pages already there that this process alone maps move to the node
// (MPOL_MF_MOVE); one that cannot move (mapped elsewhere too) stays, as a
// preference allows. Node -1 puts back the default policy.
func PreferNode(addr uintptr, length int64, node int, move bool) error {
	mode, nodes, flags := memsys.MpolDefault, []int(nil), 0
	if node >= 0 {
		mode, nodes = memsys.MpolPreferred, []int{node}
		if move {
			flags = memsys.MpolMfMove
		}
	}
	err := memsys.Mbind(addr, uintptr(length), mode, nodes, flags)
	if err != nil && !errors.Is(err, syscall.EIO) {
		return fmt.Errorf("prefer NUMA node %d for %#x+%d: mbind: %w", node, addr, length, err)
	}
	return nil
}

// PreferredNodeOf reports the node the memory policy at addr prefers
// (MPOL_PREFERRED), or -1 for any other policy.
func PreferredNodeOf(addr uintptr) (int, error) {
	mode, nodes, err := memsys.PolicyOfAddress(addr)
	if err != nil {
		return -1, fmt.Errorf("policy of address %#x: %w", addr, err)
	}
	if mode != memsys.MpolPreferred || len(nodes) != 1 {
		return -1, nil
	}
	return nodes[0], nil
}

// CurrentNode is the NUMA node of the CPU the calling thread runs on
// (getcpu).
func CurrentNode() (int, error) {
	_, node, err := memsys.Getcpu()
	if err != nil {
		return -1, fmt.Errorf("getcpu: %w", err)
	}
	return node, nil
}

// NodeOfAddress reports the NUMA node of the page at addr. The kernel
// faults the page in to look at it, so asking about a hole of a mapped
// file allocates a page (under the file's policy).
func NodeOfAddress(addr uintptr) (int, error) {
	node, err := memsys.NodeOfAddress(addr)
	if err != nil {
		return -1, fmt.Errorf("node of address %#x: %w", addr, err)
	}
	return node, nil
}

// PolicyOfAddress reports the memory policy at addr: whether it binds
// (MPOL_BIND) and to which nodes. For a mapping of a location file it is
// the file's shared policy for that offset, so it shows what BindRange
// left in the inode. Nodes is nil when the policy is the default.
func PolicyOfAddress(addr uintptr) (bound bool, nodes []int, err error) {
	mode, nodes, err := memsys.PolicyOfAddress(addr)
	if err != nil {
		return false, nil, fmt.Errorf("policy of address %#x: %w", addr, err)
	}
	if mode != memsys.MpolBind {
		return false, nil, nil
	}
	return true, nodes, nil
}

var (
	probeMu    sync.Mutex
	probeCache = map[int]error{}
)

// probeBind checks, once per node per process, that binding a memfd
// range to node really places its pages there: mbind may be refused
// (seccomp, a kernel without NUMA) or the node may be outside this
// process's cpuset.
func probeBind(node int) error {
	probeMu.Lock()
	defer probeMu.Unlock()
	if err, ok := probeCache[node]; ok {
		return err
	}
	err := probeBindOnce(node)
	probeCache[node] = err
	return err
}

func probeBindOnce(node int) (err error) {
	f, err := CreateFile("softuvm-mbind-probe", PageSize)
	if err != nil {
		return err
	}
	defer func() {
		if cerr := f.Close(); cerr != nil && err == nil {
			err = cerr
		}
	}()
	if err := f.BindRange(node, 0, PageSize); err != nil {
		return err
	}
	// Allocate with pwrite, not a store through a mapping: if the node
	// cannot supply the page, pwrite reports ENOMEM where a store would
	// bring SIGBUS.
	page := make([]byte, PageSize)
	page[0] = 1
	if _, err := f.WriteAt(page, 0); err != nil {
		return err
	}
	m, err := f.Map(0, PageSize)
	if err != nil {
		return err
	}
	defer func() {
		if uerr := m.Unmap(); uerr != nil && err == nil {
			err = uerr
		}
	}()
	bound, nodes, err := PolicyOfAddress(m.Addr())
	if err != nil {
		return err
	}
	if !bound || !slices.Equal(nodes, []int{node}) {
		return fmt.Errorf("mbind probe: file bound to node %d reports policy bound=%v nodes=%v", node, bound, nodes)
	}
	got, err := NodeOfAddress(m.Addr())
	if err != nil {
		return err
	}
	if got != node {
		return fmt.Errorf("mbind probe: page of a file bound to node %d landed on node %d", node, got)
	}
	return nil
}

// ArenaNode is the node to run copies into an arena of backend on: its
// node for a NUMA arena of a machine with several nodes, else -1.
func ArenaNode(backend string, node int) int {
	if backend != BackendNUMA.String() || !multiNode() {
		return -1
	}
	return node
}

var (
	multiNodeOnce sync.Once
	multiNodeMemo bool
)

// multiNode reports whether this machine has more than one NUMA node, the
// only case where pinning copy threads to one matters.
func multiNode() bool {
	multiNodeOnce.Do(func() {
		nodes, err := Nodes()
		multiNodeMemo = err == nil && len(nodes) > 1
	})
	return multiNodeMemo
}
