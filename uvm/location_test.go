package uvm

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/softuvm/softuvm/devmem"
)

// TestPrefetchLocation: prefetches to a device, a host NUMA node, the host
// and the caller's node, each reported by the range attributes as a
// location, with the host pages' policy and node as the kernel reports
// them (the machine has node 0, and perhaps others).
func TestPrefetchLocation(t *testing.T) {
	s := newSession(t, twoDeviceConfig())
	const size = 4 << 20
	a, err := s.MallocManaged(size)
	require.NoError(t, err)
	b := a.Bytes()
	for i := range b {
		b[i] = byte(i * 7)
	}
	loc := func(what string, addr uintptr, n int64, wantType MemLocationType, wantID int) {
		t.Helper()
		ra, err := s.RangeAttributes(addr, n)
		require.NoError(t, err)
		assert.Equal(t, wantType, ra.LastPrefetchLocationType, "%s: type", what)
		assert.Equal(t, wantID, ra.LastPrefetchLocationID, "%s: id", what)
		typ, err := s.RangeAttribute(addr, n, AttrLastPrefetchLocationType)
		require.NoError(t, err)
		id, err := s.RangeAttribute(addr, n, AttrLastPrefetchLocationID)
		require.NoError(t, err)
		assert.Equal(t, wantType, typ, "%s: type attribute", what)
		assert.Equal(t, wantID, id, "%s: id attribute", what)
	}
	loc("never prefetched", a.Addr(), size, LocationInvalid, int(InvalidDevice))

	require.NoError(t, s.PrefetchLocation(a.Addr(), size, MemLocation{Type: LocationDevice, ID: 1}))
	loc("to device 1", a.Addr(), size, LocationDevice, 1)
	assert.Equal(t, uint64(size/PageSize), stats(t, a).MigratedPages(CPU, 1), "every page went to device 1")

	require.NoError(t, s.PrefetchLocation(a.Addr(), size, MemLocation{Type: LocationHostNUMA, ID: 0}))
	loc("to node 0", a.Addr(), size, LocationHostNUMA, 0)
	for _, off := range []uintptr{0, size / 2, size - 1} {
		node, err := devmem.PreferredNodeOf(a.Addr() + off)
		require.NoError(t, err)
		assert.Equal(t, 0, node, "the host pages prefer node 0 at +%d", off)
		on, err := devmem.NodeOfAddress(a.Addr() + off)
		require.NoError(t, err)
		assert.Equal(t, 0, on, "the page at +%d is on node 0", off)
	}
	assert.Equal(t, uint64(size/PageSize), stats(t, a).MigratedPages(1, CPU), "every page came back")

	require.NoError(t, s.PrefetchLocation(a.Addr(), size, MemLocation{Type: LocationHost, ID: 77}))
	loc("to the host", a.Addr(), size, LocationHost, int(CPU))

	node, err := devmem.CurrentNode()
	require.NoError(t, err)
	require.NoError(t, s.PrefetchLocation(a.Addr(), size, MemLocation{Type: LocationHostNUMACurrent}))
	loc("to the caller's node", a.Addr(), size, LocationHostNUMA, node)

	// Halves: the whole has no location, each half its own.
	require.NoError(t, s.PrefetchLocation(a.Addr()+size/2, size/2, MemLocation{Type: LocationHost}))
	require.NoError(t, s.PrefetchLocation(a.Addr(), size/2, MemLocation{Type: LocationHostNUMA, ID: 0}))
	loc("halves", a.Addr(), size, LocationInvalid, int(InvalidDevice))
	loc("first half", a.Addr(), size/2, LocationHostNUMA, 0)
	loc("second half", a.Addr()+size/2, size/2, LocationHost, int(CPU))
	require.NoError(t, s.Prefetch(a.Addr(), size, CPU))
	loc("the processor form", a.Addr(), size, LocationHost, int(CPU))

	// In stream order.
	st, err := s.StreamCreate(0)
	require.NoError(t, err)
	require.NoError(t, s.PrefetchLocationAsync(a.Addr(), size, MemLocation{Type: LocationDevice, ID: 0}, st))
	require.NoError(t, s.PrefetchLocationAsync(a.Addr(), size, MemLocation{Type: LocationHostNUMA, ID: 0}, st))
	require.NoError(t, s.StreamSynchronize(st))
	loc("two on a stream", a.Addr(), size, LocationHostNUMA, 0)
	require.NoError(t, s.StreamDestroy(st))
	for i := range b {
		require.Equal(t, byte(i*7), b[i], "byte %d", i)
	}

	assert.ErrorIs(t, s.PrefetchLocation(a.Addr(), size, MemLocation{Type: LocationHostNUMA, ID: 4000}), ErrInvalidValue)
	assert.ErrorIs(t, s.PrefetchLocation(a.Addr(), size, MemLocation{Type: LocationDevice, ID: 2}), ErrInvalidDevice)
	assert.ErrorIs(t, s.PrefetchLocation(a.Addr(), size, MemLocation{Type: LocationInvalid}), ErrInvalidValue)
	assert.ErrorIs(t, s.PrefetchLocationAsync(a.Addr(), size, MemLocation{Type: LocationHost}, nil), ErrInvalidValue)
	_, err = s.RangeAttribute(a.Addr(), size, RangeAttr(9))
	assert.ErrorIs(t, err, ErrInvalidValue)
}

// TestMemAdviseLocation: a preferred location on a host node, a device,
// the host, none; the policy of the host pages follows.
func TestMemAdviseLocation(t *testing.T) {
	s := newSession(t, twoDeviceConfig())
	const size = 4 << 20
	a, err := s.MallocManaged(size)
	require.NoError(t, err)
	pref := func(what string, addr uintptr, n int64, wantType MemLocationType, wantID int) {
		t.Helper()
		ra, err := s.RangeAttributes(addr, n)
		require.NoError(t, err)
		assert.Equal(t, wantType, ra.PreferredLocationType, "%s: type", what)
		assert.Equal(t, wantID, ra.PreferredLocationID, "%s: id", what)
	}
	policy := func(off uintptr) int {
		node, err := devmem.PreferredNodeOf(a.Addr() + off)
		require.NoError(t, err)
		return node
	}
	pref("no preference", a.Addr(), size, LocationInvalid, int(InvalidDevice))
	require.NoError(t, s.MemAdviseLocation(a.Addr(), size, AdviseSetPreferredLocation, MemLocation{Type: LocationHostNUMA, ID: 0}))
	pref("node 0", a.Addr(), size, LocationHostNUMA, 0)
	assert.Equal(t, 0, policy(0))

	require.NoError(t, s.MemAdviseLocation(a.Addr(), size/4, AdviseSetPreferredLocation, MemLocation{Type: LocationDevice, ID: 1}))
	pref("a quarter on device 1", a.Addr(), size, LocationInvalid, int(InvalidDevice))
	pref("the quarter", a.Addr(), size/4, LocationDevice, 1)
	assert.Equal(t, -1, policy(0), "the default policy back")
	assert.Equal(t, 0, policy(size/2), "the rest keeps it")

	require.NoError(t, s.MemAdviseLocation(a.Addr(), size, AdviseSetPreferredLocation, MemLocation{Type: LocationHost}))
	pref("the host", a.Addr(), size, LocationHost, int(CPU))
	assert.Equal(t, -1, policy(size/2))

	require.NoError(t, s.MemAdviseLocation(a.Addr(), size, AdviseSetPreferredLocation, MemLocation{Type: LocationHostNUMA, ID: 0}))
	require.NoError(t, s.MemAdvise(a.Addr(), size, AdviseUnsetPreferredLocation, 0))
	pref("unset", a.Addr(), size, LocationInvalid, int(InvalidDevice))
	assert.Equal(t, -1, policy(0))

	require.NoError(t, s.MemAdviseLocation(a.Addr(), size, AdviseSetAccessedBy, MemLocation{Type: LocationDevice, ID: 1}))
	by, err := s.RangeAttribute(a.Addr(), size, AttrAccessedBy)
	require.NoError(t, err)
	assert.Equal(t, []Device{1}, by)
	require.NoError(t, s.MemAdviseLocation(a.Addr(), size, AdviseSetReadMostly, MemLocation{Type: 99}), "read-mostly ignores the location")
	assert.ErrorIs(t, s.MemAdviseLocation(a.Addr(), size, AdviseSetPreferredLocation, MemLocation{Type: LocationHostNUMA, ID: -1}), ErrInvalidValue)
	assert.ErrorIs(t, s.MemAdviseLocation(a.Addr(), size, AdviseSetAccessedBy, MemLocation{Type: LocationDevice, ID: 7}), ErrInvalidDevice)
}
