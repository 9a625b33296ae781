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

// scanSink keeps the reads of hotEvictionsThroughAScan.
var scanSink byte

// hotEvictionsThroughAScan runs a program that keeps using seven blocks
// (hot) while it writes, once each, 32 blocks of a scan (cold), under a
// host budget of eight blocks and the eviction policy named, and returns
// the hot blocks' pages evicted from the host. Every byte of both is
// checked at the end.
func hotEvictionsThroughAScan(t *testing.T, eviction string) uint64 {
	cfg := smallArenaConfig(128 << 20)
	const hotBlocks, coldBlocks = 7, 32
	cfg.HostBudget = (hotBlocks + 1) * BlockSize
	cfg.Eviction = eviction
	s := newSession(t, cfg)
	hot, err := s.MallocManaged(hotBlocks * BlockSize)
	require.NoError(t, err)
	cold, err := s.MallocManaged(coldBlocks * BlockSize)
	require.NoError(t, err)
	fill(hot.Bytes(), 7)
	h, c := hot.Bytes(), cold.Bytes()
	var sum byte
	for i := 0; i < coldBlocks; i++ {
		fill(c[i*BlockSize:(i+1)*BlockSize], byte(i))
		for r := 0; r < 4; r++ { // a few passes over the hot blocks per scan block
			for p := 0; p < len(h); p += PageSize {
				sum += h[p]
			}
		}
	}
	scanSink = sum
	st, err := hot.Stats()
	require.NoError(t, err)
	require.Equal(t, pattern(hotBlocks*BlockSize, 7), hot.Bytes(), "%s: the hot blocks came back intact", eviction)
	for i := 0; i < coldBlocks; i++ {
		require.Equal(t, pattern(BlockSize, byte(i)), c[i*BlockSize:(i+1)*BlockSize], "%s: cold block %d", eviction, i)
	}
	return st.EvictedPages(CPU)
}

// TestClockKeepsBlocksInUseThroughAScan: the host's use of its blocks,
// watched with hint faults, keeps the blocks a program uses while a scan
// passes; least recently migrated (lru) evicts them, since they arrived
// first. The first victims, before anything was watched, may be in
// arrival order: the clock may lose each hot block once or twice. The hot blocks
// are more than the three quarters of the listed blocks that the active
// list holds, so one is always on probation, and only its watched
// touches keep it (a block back soon after its eviction starts active,
// which alone would keep fewer).
func TestClockKeepsBlocksInUseThroughAScan(t *testing.T) {
	lru := hotEvictionsThroughAScan(t, "lru")
	clock := hotEvictionsThroughAScan(t, "clock")
	t.Logf("hot pages evicted: lru %d, clock %d", lru, clock)
	assert.Greater(t, lru, uint64(8*BlockSize/PageSize), "lru should lose the hot blocks again and again")
	// Measured: 2-7 blocks' worth, all before the hand had passed once
	// (with blocks judged in the call that watched them, 14-46: half the
	// runs failed); with nothing watched, 21.
	assert.LessOrEqual(t, clock, uint64(14*BlockSize/PageSize), "clock evicted blocks in use")
}
