package uvm

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/softuvm/softuvm/internal/config"
)

func smallArenaConfig(arena int64) ServerConfig {
	c := DefaultServerConfig()
	c.Devices = config.DeviceSpecs(1, []int64{arena}, c.Devices[0].Backend)
	return c
}

// TestOversubscribedKernel: a kernel writes a range three times its
// device's arena; the oldest blocks are evicted to the host, the arena
// never exceeds its capacity, and every byte comes back right.
func TestOversubscribedKernel(t *testing.T) {
	const arena, size = 8 << 20, 24 << 20
	s := newSession(t, smallArenaConfig(arena))
	a, err := s.MallocManaged(size)
	require.NoError(t, err)
	require.NoError(t, s.Launch(0, nil, "fill", 1, rangeParams(a.Addr(), size, 5)))
	require.NoError(t, s.DeviceSynchronize(0))
	in, err := s.Info()
	require.NoError(t, err)
	assert.LessOrEqual(t, in.Devices[0].UsedBytes, int64(arena))
	assert.Equal(t, in.Devices[0].UsedBytes, in.Devices[0].FileBytes, "accounting matches the files")
	st, err := a.Stats()
	require.NoError(t, err)
	assert.GreaterOrEqual(t, st.EvictedPages(0), uint64((size-arena)/PageSize), "what did not fit was evicted")
	require.Equal(t, wantFill(size, 5), a.Bytes())

	// Again the other way: the host's pages stream back to the device.
	require.NoError(t, s.Launch(0, nil, "addOne", 2, rangeParams(a.Addr(), size, 0)))
	require.NoError(t, s.DeviceSynchronize(0))
	require.Equal(t, wantFill(size, 6), a.Bytes())
}

// TestPrefetchLargerThanArena: prefetching more than the arena holds keeps
// the most recent part on the device and the rest, evicted, on the host.
func TestPrefetchLargerThanArena(t *testing.T) {
	const arena, size = 4 << 20, 16 << 20
	s := newSession(t, smallArenaConfig(arena))
	a, err := s.MallocManaged(size)
	require.NoError(t, err)
	fill(a.Bytes(), 4)
	require.NoError(t, a.Prefetch(0))
	in, err := s.Info()
	require.NoError(t, err)
	assert.Equal(t, int64(arena), in.Devices[0].UsedBytes, "the arena is full, not over")
	assert.Equal(t, int64(size-arena), in.Sessions[0].HostBytes, "the evicted rest is on the host")
	require.Equal(t, pattern(size, 4), a.Bytes())
}

// TestHostBudget: above the host budget, host pages go to the device and
// fault back on use.
func TestHostBudget(t *testing.T) {
	cfg := smallArenaConfig(64 << 20)
	cfg.HostBudget = 8 << 20
	s := newSession(t, cfg)
	const size = 32 << 20
	a, err := s.MallocManaged(size)
	require.NoError(t, err)
	fill(a.Bytes(), 2)
	in, err := s.Info()
	require.NoError(t, err)
	assert.LessOrEqual(t, in.Sessions[0].HostBytes, int64(8<<20+BlockSize), "the host keeps within its budget (plus the block in hand)")
	assert.GreaterOrEqual(t, in.Devices[0].UsedBytes, int64(size-8<<20-BlockSize))
	st, err := a.Stats()
	require.NoError(t, err)
	assert.Positive(t, st.EvictedPages(CPU))
	require.Equal(t, pattern(size, 2), a.Bytes(), "evicted pages fault back intact")
}
