package devmem

import (
	"slices"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func memoryNodes(t *testing.T) []int {
	t.Helper()
	nodes, err := Nodes()
	require.NoError(t, err)
	var ids []int
	for _, n := range nodes {
		if n.MemTotal > 0 {
			ids = append(ids, n.ID)
		}
	}
	return ids
}

// The NUMA backend end to end, on node 0 (which every machine has): the
// arena's files are bound as a whole at creation, the binding is in the
// inode (a fresh mapping anywhere in the file sees it), and pages placed
// by every path land on the node.
func TestNUMABackendNode0(t *testing.T) {
	skipUnlessMbind(t)
	a, err := NewArena(ArenaSpec{Device: 0, Capacity: 1 << 20, Backend: BackendNUMA, Node: 0})
	require.NoError(t, err)
	assert.Equal(t, ArenaSpec{Device: 0, Capacity: 1 << 20, Backend: BackendNUMA, Node: 0}, a.Spec())
	assert.NoError(t, a.FallbackReason())

	f, err := a.NewFile("dev0-client1")
	require.NoError(t, err)
	defer f.Close()
	assert.Equal(t, 0, f.Node())
	assert.Equal(t, int64(FileSize), f.Size())

	// 1<<42-4*PageSize straddles two of BindRange's 4 TiB windows.
	for _, off := range []int64{0, 1 << 30, 1<<42 - 4*PageSize, 1 << 43, 1<<46 + 1<<20, FileSize - 8*PageSize} {
		m := mapFile(t, f, off, 8*PageSize)
		bound, nodes, err := PolicyOfAddress(m.Addr())
		require.NoError(t, err)
		assert.True(t, bound, "offset %#x bound", off)
		assert.Equal(t, []int{0}, nodes, "offset %#x", off)

		// Place pages by store, pwrite, fallocate and copy_file_range.
		copy(m.Bytes()[:2*PageSize], pattern(2*PageSize, 1))
		_, err = f.WriteAt(pattern(2*PageSize, 2), off+2*PageSize)
		require.NoError(t, err)
		require.NoError(t, f.Allocate(off+4*PageSize, 2*PageSize))
		src := newFile(t, FileSize)
		_, err = src.WriteAt(pattern(2*PageSize, 3), off+6*PageSize)
		require.NoError(t, err)
		_, err = f.CopyFrom(src, off+6*PageSize, off+6*PageSize, 2*PageSize)
		require.NoError(t, err)

		for p := int64(0); p < 8; p++ {
			node, err := NodeOfAddress(m.Addr() + uintptr(p*PageSize))
			require.NoError(t, err)
			assert.Equal(t, 0, node, "page %#x", off+p*PageSize)
		}
	}
	allocated, err := f.AllocatedBytes()
	require.NoError(t, err)
	assert.Equal(t, int64(6*8*PageSize), allocated)
}

// BindRange on a plain file binds exactly the range asked for, and the
// binding outlives the temporary mapping BindRange used.
func TestBindRange(t *testing.T) {
	skipUnlessMbind(t)
	f := newFile(t, FileSize)
	const off = 1 << 40
	require.NoError(t, f.BindRange(0, off, 4*PageSize))
	assert.Equal(t, -1, f.Node(), "a partial binding is not the file's node")

	m := mapFile(t, f, off-PageSize, 6*PageSize)
	for p, want := range []bool{false, true, true, true, true, false} {
		addr := m.Addr() + uintptr(p*PageSize)
		bound, nodes, err := PolicyOfAddress(addr)
		require.NoError(t, err)
		assert.Equal(t, want, bound, "page %d", p)
		if want {
			assert.Equal(t, []int{0}, nodes)
		}
	}
	copy(m.Bytes()[PageSize:], pattern(4*PageSize, 4))
	for p := 1; p <= 4; p++ {
		node, err := NodeOfAddress(m.Addr() + uintptr(p*PageSize))
		require.NoError(t, err)
		assert.Equal(t, 0, node)
	}

	require.NoError(t, f.BindRange(0, 0, FileSize))
	assert.Equal(t, 0, f.Node(), "binding the whole file sets its node")
}

// On this machine Auto means memfd unless there are several memory
// nodes, and a node that does not exist is refused by name.
func TestNUMAOnThisMachine(t *testing.T) {
	mem := memoryNodes(t)
	a, err := NewArena(ArenaSpec{Device: 3, Capacity: 1 << 20, Backend: BackendAuto, Node: -1})
	require.NoError(t, err)
	if len(mem) <= 1 {
		assert.Equal(t, BackendMemfd, a.Spec().Backend, "one memory node: auto is memfd")
		assert.Equal(t, -1, a.Spec().Node)
		assert.NoError(t, a.FallbackReason())
	} else {
		assert.Contains(t, []Backend{BackendNUMA, BackendMemfd}, a.Spec().Backend)
	}

	nodes, err := Nodes()
	require.NoError(t, err)
	missing := 0
	for slices.ContainsFunc(nodes, func(n Node) bool { return n.ID == missing }) {
		missing++
	}
	_, err = NewArena(ArenaSpec{Device: 0, Capacity: 1 << 20, Backend: BackendNUMA, Node: missing})
	assert.ErrorContains(t, err, "NUMA node "+itoa(missing)+" does not exist")

	skipUnlessMbind(t)
	// Node -1 spreads devices over the memory nodes.
	a, err = NewArena(ArenaSpec{Device: 5, Capacity: 1 << 20, Backend: BackendNUMA, Node: -1})
	require.NoError(t, err)
	assert.Equal(t, mem[5%len(mem)], a.Spec().Node)
}

// The probe catches a node mbind cannot use, with the errno.
func TestProbeBindMissingNode(t *testing.T) {
	skipUnlessMbind(t)
	nodes, err := Nodes()
	require.NoError(t, err)
	if len(nodes) > 1 {
		t.Skip("node 1 exists here")
	}
	err = probeBindOnce(1)
	assert.ErrorIs(t, err, syscall.EINVAL)
	assert.ErrorContains(t, err, "to node 1: mbind")
	// Cached: a second probe answers the same without asking again.
	assert.Equal(t, probeBind(1), probeBind(1))
}
