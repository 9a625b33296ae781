package uvm

import (
	"bytes"
	"encoding/binary"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/softuvm/softuvm/devmem"
	"github.com/softuvm/softuvm/internal/config"
)

func init() {
	// scanBesideHot: params = hot address, hot length, cold address,
	// cold length. One thread writes each cold block i once, as
	// fill(block, i) does, and between two of them reads every page of
	// the hot range four times: a device's scan beside its working set.
	MustRegisterKernel("scanBesideHot", func(tid, n int, p []byte) {
		if tid != 0 {
			return
		}
		le := binary.LittleEndian
		hot := devmem.BytesAt(uintptr(le.Uint64(p)), int64(le.Uint64(p[8:])))
		cold := devmem.BytesAt(uintptr(le.Uint64(p[16:])), int64(le.Uint64(p[24:])))
		var sum byte
		for i := 0; i < len(cold)/BlockSize; i++ {
			fill(cold[i*BlockSize:(i+1)*BlockSize], byte(i))
			for r := 0; r < 4; r++ {
				for q := 0; q < len(hot); q += PageSize {
					sum += hot[q]
				}
			}
		}
		scanSink += sum
	})
}

func smallArenaConfig(arena int64) ServerConfig {
	c := DefaultServerConfig()
	c.Devices = config.DeviceSpecs(1, []int64{arena}, c.Devices[0].Backend)
	return c
}

// fillOverArena has a kernel on device 0, whose arena holds arena
// bytes, fill size bytes of new managed memory with v, and checks that
// the arena never held more than it may and that its accounting matches
// its files.
func fillOverArena(t *testing.T, arena, size int64, v byte) (*Session, *Allocation) {
	t.Helper()
	s := newSession(t, smallArenaConfig(arena))
	a, err := s.MallocManaged(size)
	require.NoError(t, err)
	require.NoError(t, s.Launch(0, nil, "fill", 1, rangeParams(a.Addr(), size, v)))
	require.NoError(t, s.DeviceSynchronize(0))
	in, err := s.Info()
	require.NoError(t, err)
	assert.LessOrEqual(t, in.Devices[0].UsedBytes, arena)
	assert.Equal(t, in.Devices[0].UsedBytes, in.Devices[0].FileBytes, "accounting matches the files")
	return s, a
}

// TestOversubscribedKernel: a kernel writes a range three times its
// device's arena; the oldest blocks are evicted to the host, the arena
// never exceeds its capacity, and every byte comes back right.
func TestOversubscribedKernel(t *testing.T) {
	const arena, size = 8 << 20, 24 << 20
	s, a := fillOverArena(t, arena, size, 5)
	st, err := a.Stats()
	require.NoError(t, err)
	assert.GreaterOrEqual(t, st.EvictedPages(0), uint64((size-arena)/PageSize), "what did not fit was evicted")
	require.Equal(t, wantFill(size, 5), a.Bytes())

	// Again the other way: the host's pages stream back to the device.
	require.NoError(t, s.Launch(0, nil, "addOne", 2, rangeParams(a.Addr(), size, 0)))
	require.NoError(t, s.DeviceSynchronize(0))
	require.Equal(t, wantFill(size, 6), a.Bytes())
}

// TestKernelWithinOneBlockLargerThanArena: a kernel writes one block,
// whose 2 MiB do not fit its device's 1 MiB arena. No other block has
// pages there to evict, so its faults make room by giving up the
// block's own earlier pages; every byte comes back right.
func TestKernelWithinOneBlockLargerThanArena(t *testing.T) {
	const arena, size = 1 << 20, BlockSize
	_, a := fillOverArena(t, arena, size, 9)
	st, err := a.Stats()
	require.NoError(t, err)
	assert.GreaterOrEqual(t, st.EvictedPages(0), uint64((size-arena)/PageSize), "what did not fit was evicted")
	require.Equal(t, wantFill(size, 9), a.Bytes())
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

// A program larger than the host budget and the device's arena together
// that then writes in one block the full arena holds. Each write fault
// moves a page back (a write takes no read copy), which frees that page's
// room in the arena and puts the host over its budget. No other block's
// pages fit in one page of room, and the host's eviction used to take, as
// its last resort, a page of the faulting block's own, the block the
// program was writing, so that it kept faulting: 14,278 faults for these
// 16,384 writes. Now the budget waits until the arena has a block's worth
// of room, and each page faults once. 12 blocks through a budget of 2 and
// an arena of 4, every byte checked.
func TestHostBudgetBeyondTheArena(t *testing.T) {
	const blocks, budgetBlocks, arenaBlocks = 12, 2, 4
	cfg := smallArenaConfig(arenaBlocks * BlockSize)
	cfg.HostBudget = budgetBlocks * BlockSize
	s := newSession(t, cfg)
	const size = blocks * BlockSize
	a, err := s.MallocManaged(size)
	require.NoError(t, err)
	b := a.Bytes()
	fill(b, 5)
	want := pattern(size, 5)
	// The first block goes to the full arena whole.
	require.NoError(t, s.Prefetch(a.Addr(), BlockSize, 0))
	before, err := a.Stats()
	require.NoError(t, err)
	const writes = 16384
	x := uint32(1)
	for i := 0; i < writes; i++ {
		x ^= x << 13
		x ^= x >> 17
		x ^= x << 5
		off := int(x % BlockSize)
		want[off] = byte(i)
		b[off] = byte(i)
	}
	after, err := a.Stats()
	require.NoError(t, err)
	faults := after.FaultsBy(CPU).Total() - before.FaultsBy(CPU).Total()
	t.Logf("%d writes in a block on the full arena (host budget %d blocks, arena %d, %d blocks in all): %d faults",
		writes, budgetBlocks, arenaBlocks, blocks, faults)
	in, err := s.Info()
	require.NoError(t, err)
	assert.LessOrEqual(t, in.Devices[0].UsedBytes, int64(arenaBlocks*BlockSize), "the arena holds no more than it may")
	// Each of the block's pages faults back once; twice allows for
	// faults that find their page on its way.
	assert.LessOrEqual(t, faults, uint64(2*BlockSize/PageSize), "faults in the block")
	require.Equal(t, want, b, "every byte, at the end")
}

// scanSink keeps the reads of hotEvictionsThroughAScan.
var scanSink byte

// hotEvictionsThroughAScan runs a program that keeps using seven blocks
// (hot) while it writes, once each, 32 blocks of a scan (cold), on the
// host under a host budget of eight blocks, or on device 0 (kernel
// scanBesideHot; the host wrote the hot blocks) whose arena holds eight,
// under the eviction policy named, with refaults answered (the resident
// core) or not, and returns the hot blocks' pages evicted from where the
// program ran, and the cold blocks' refault counts there. Every byte of
// both is checked at the end.
func hotEvictionsThroughAScan(t *testing.T, eviction string, onDevice, refault bool) (uint64, ProcessorRefaults) {
	const hotBlocks, coldBlocks = 7, 32
	cfg := smallArenaConfig(128 << 20)
	cfg.HostBudget = (hotBlocks + 1) * BlockSize
	where := CPU
	if onDevice {
		cfg = smallArenaConfig((hotBlocks + 1) * BlockSize)
		where = 0
	}
	cfg.Eviction = eviction
	cfg.Thrashing.Refault = refault
	s := newSession(t, cfg)
	hot, err := s.MallocManaged(hotBlocks * BlockSize)
	require.NoError(t, err)
	cold, err := s.MallocManaged(coldBlocks * BlockSize)
	require.NoError(t, err)
	fill(hot.Bytes(), 7)
	h, c := hot.Bytes(), cold.Bytes()
	if onDevice {
		p := make([]byte, 32)
		binary.LittleEndian.PutUint64(p, uint64(hot.Addr()))
		binary.LittleEndian.PutUint64(p[8:], uint64(len(h)))
		binary.LittleEndian.PutUint64(p[16:], uint64(cold.Addr()))
		binary.LittleEndian.PutUint64(p[24:], uint64(len(c)))
		require.NoError(t, s.Launch(0, nil, "scanBesideHot", 1, p))
		require.NoError(t, s.DeviceSynchronize(0))
	} else {
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
	}
	st, err := hot.Stats()
	require.NoError(t, err)
	cst, err := cold.Stats() // before the check below brings the cold blocks back
	require.NoError(t, err)
	require.Equal(t, pattern(hotBlocks*BlockSize, 7), h, "%s: the hot blocks came back intact", eviction)
	for i := 0; i < coldBlocks; i++ {
		require.Equal(t, pattern(BlockSize, byte(i)), c[i*BlockSize:(i+1)*BlockSize], "%s: cold block %d", eviction, i)
	}
	return st.EvictedPages(where), cst.RefaultsOf(where)
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
//
// The device subtest is the same scan by a kernel on a device whose arena
// holds eight blocks: the device process's use of its blocks is watched
// as the client's is.
func TestClockKeepsBlocksInUseThroughAScan(t *testing.T) {
	for _, c := range []struct {
		where    string
		onDevice bool
		// most is the hot blocks' worth clock may evict. Measured on
		// the host: 2-7, all before the hand had passed once (with
		// blocks judged in the call that watched them, 14-46: half the
		// runs failed); on a device: 2 in each of 4 runs. With nothing
		// watched, 21 on either.
		most int
	}{
		{"host", false, 14},
		{"device", true, 8},
	} {
		t.Run(c.where, func(t *testing.T) {
			// Without the resident core, which keeps the hot blocks
			// for lru too once they came back
			// (TestRefaultCoreKeepsAHotSetThroughAScan): this is what
			// the clock sees.
			lru, _ := hotEvictionsThroughAScan(t, "lru", c.onDevice, false)
			clock, _ := hotEvictionsThroughAScan(t, "clock", c.onDevice, false)
			t.Logf("hot pages evicted from the %s: lru %d, clock %d", c.where, lru, clock)
			assert.Greater(t, lru, uint64(8*BlockSize/PageSize), "lru should lose the hot blocks again and again")
			assert.LessOrEqual(t, clock, uint64(c.most*BlockSize/PageSize), "clock evicted blocks in use")
		})
	}
}

// The sweep of sweepRefetches: sweepBlocks under a host budget of
// sweepBudget blocks, the first sweepWarm sweeps not counted.
const sweepBlocks, sweepBudget, sweepWarm = 24, 8, 2

// sweepRefetches runs, under a host budget of sweepBudget blocks and the
// eviction policy named, a program that writes sweepBlocks blocks and
// then adds one to every page of them in order, sweeps times, as `uvm
// bench oversub` does. It checks every page and returns the pages
// brought back to the host from the device during the sweeps after the
// first sweepWarm.
func sweepRefetches(t *testing.T, eviction string, sweeps int) uint64 {
	cfg := smallArenaConfig(128 << 20)
	cfg.HostBudget = sweepBudget * BlockSize
	cfg.Eviction = eviction
	s := newSession(t, cfg)
	a, err := s.MallocManaged(sweepBlocks * BlockSize)
	require.NoError(t, err)
	b := a.Bytes()
	for p := 0; p < len(b); p += PageSize {
		b[p] = byte(p / PageSize)
	}
	var before Stats
	for sweep := 0; sweep < sweeps; sweep++ {
		if sweep == sweepWarm {
			before, err = a.Stats()
			require.NoError(t, err)
		}
		for p := 0; p < len(b); p += PageSize {
			b[p]++
		}
	}
	after, err := a.Stats()
	require.NoError(t, err)
	for p := 0; p < len(b); p += PageSize {
		require.Equal(t, byte(p/PageSize+sweeps), b[p], "%s: page %d", eviction, p/PageSize)
	}
	return after.MigratedPages(0, CPU) - before.MigratedPages(0, CPU)
}

// TestClockKeepsPartOfASweep: a program sweeping three times what its
// host budget holds, in order, again and again. Each block comes back a
// whole sweep after it left, so lru (and a clock that let such a block
// push out an active one) brings every block back on every sweep; the
// clock keeps the blocks its active list took while it had room, and
// only the others come back.
func TestClockKeepsPartOfASweep(t *testing.T) {
	const sweeps = 8
	lru := sweepRefetches(t, "lru", sweeps)
	clock := sweepRefetches(t, "clock", sweeps)
	t.Logf("pages brought back over %d sweeps: lru %d, clock %d", sweeps-sweepWarm, lru, clock)
	all := uint64((sweeps - sweepWarm) * sweepBlocks * BlockSize / PageSize)
	assert.Greater(t, 10*lru, 9*all, "lru should bring back (nearly) every block of every sweep")
	// The active list holds three quarters of the 8 blocks: those 6
	// stay, and the other 18 come back on each sweep, 55,296 pages in
	// all (measured: 55,296-56,320; 55,296-73,728 while a far block
	// could take the place of an active one whenever two blocks were
	// arriving at once). Wanted: fewer than 20 a sweep.
	assert.Less(t, clock, all*(sweepBlocks-4)/sweepBlocks, "clock should keep some blocks through the sweeps")
}

// hotRegionRefetches runs, under a host budget of four blocks and the
// eviction policy named, a program that keeps using one 64 KiB region of
// each of 12 blocks (the hot regions, a different one in each block)
// while, on each of 24 steps, it writes a new region of every one of
// these blocks once (a scan through the blocks' other regions). It
// returns the pages brought back to the host from the device during the
// steps, and then checks every byte.
func hotRegionRefetches(t *testing.T, eviction string) uint64 {
	cfg := smallArenaConfig(128 << 20)
	const blocks, steps, regionPages = 12, 24, 16
	const regionBytes, regions = regionPages * PageSize, BlockSize / (regionPages * PageSize)
	cfg.HostBudget = 4 * BlockSize
	cfg.Eviction = eviction
	s := newSession(t, cfg)
	a, err := s.MallocManaged(blocks * BlockSize)
	require.NoError(t, err)
	b := a.Bytes()
	want := make([]byte, len(b))
	region := func(k, r int) (int, int) { return k*BlockSize + r*regionBytes, k*BlockSize + (r+1)*regionBytes }
	hot := func(k int) int { return k * 5 % regions }
	for k := 0; k < blocks; k++ {
		from, to := region(k, hot(k))
		fill(b[from:to], 7)
		fill(want[from:to], 7)
	}
	before, err := a.Stats()
	require.NoError(t, err)
	var sum byte
	for i := 0; i < steps; i++ {
		for k := 0; k < blocks; k++ {
			from, to := region(k, (hot(k)+1+i)%regions)
			fill(b[from:to], byte(i))
			fill(want[from:to], byte(i))
		}
		for pass := 0; pass < 4; pass++ {
			for k := 0; k < blocks; k++ {
				from, _ := region(k, hot(k))
				for p := 0; p < regionPages; p++ {
					sum += b[from+p*PageSize]
				}
			}
		}
	}
	scanSink = sum
	after, err := a.Stats()
	require.NoError(t, err)
	require.Equal(t, want, b, "%s: every byte", eviction)
	return after.MigratedPages(0, CPU) + after.ReadDuplicatedPages(CPU) - before.MigratedPages(0, CPU) - before.ReadDuplicatedPages(CPU)
}

// TestClockRegionsKeepTheRegionsInUse: a program that keeps using a few
// pages of many blocks while it writes others once keeps the pages in
// use better with "clock:regions", which evicts the untouched 64 KiB
// regions of the blocks it touched. "clock:blocks" sees every block
// touched and keeps whole blocks, so the pages written once crowd out the
// hot regions, which come back again and again.
func TestClockRegionsKeepTheRegionsInUse(t *testing.T) {
	// Three runs each, alternating: one run's count varies by half.
	var blocks, regions uint64
	for run := 0; run < 3; run++ {
		blocks += hotRegionRefetches(t, "clock:blocks")
		regions += hotRegionRefetches(t, "clock:regions")
	}
	t.Logf("hot pages fetched back during the steps, three runs: clock:blocks %d, clock:regions %d", blocks, regions)
	// The hot regions hold 12*16 pages; the steps write 24*12*16.
	// Measured over three runs: clock:blocks 3,072-4,400,
	// clock:regions 1,360-2,704, 1.25-3.2 times fewer. The regions are
	// still lost now and then: the pages a fault prefetches arrive
	// mapped, and so look touched in the watch they arrive in, which
	// leaves the policy short of untouched regions to give. With the
	// server's hint faults mapping whole blocks (so that every region of
	// a touched block looks touched), clock:regions lost more than
	// clock:blocks: 4,336-5,008.
	assert.Greater(t, blocks, uint64(3*4*12*16), "clock:blocks should lose the hot regions again and again")
	assert.Less(t, 10*regions, 9*blocks, "clock:regions should lose the regions in use less often than clock:blocks")
}

// TestCleanEvictionCopiesOnlyWhatTheHostWrote: a kernel writes 16
// blocks, and the host, under a budget of 4, reads them twice, writes
// every other page, and reads them again, each pass in a scattered
// order. With clean eviction (clock, the
// default) a page the host only read leaves it without a copy: the two
// read passes copy nothing to the device but pages a whole-block move
// migrated (below). A page the host wrote is copied
// each time it leaves, and no more: at most twice (once after the write
// pass, once after the last read), at least as often as the written pages
// that did not stay on the host. Then a kernel adds one to every byte and
// the host checks every byte: a device copy kept after the host wrote the
// page would show the value before the write.
func TestCleanEvictionCopiesOnlyWhatTheHostWrote(t *testing.T) {
	cfg := smallArenaConfig(128 << 20)
	const blocks, budgetBlocks = 16, 4
	cfg.HostBudget = budgetBlocks * BlockSize
	s := newSession(t, cfg)
	const size = blocks * BlockSize
	a, err := s.MallocManaged(size)
	require.NoError(t, err)
	require.NoError(t, s.Launch(0, nil, "fill", 2, rangeParams(a.Addr(), size, 3)))
	require.NoError(t, s.DeviceSynchronize(0))
	want := wantFill(size, 3)

	// Pages in a scattered order: a sweep moves whole blocks, which
	// clean eviction leaves to migration (clean.go wholeMove).
	pages := size / PageSize
	scattered := func(do func(p int)) {
		for i := 0; i < pages; i++ {
			do(i * 1031 % pages) // 1031 is prime: every page once
		}
	}
	b := a.Bytes()
	readAll := func(what string) {
		scattered(func(p int) {
			if !bytes.Equal(b[p*PageSize:(p+1)*PageSize], want[p*PageSize:(p+1)*PageSize]) {
				t.Fatalf("%s: page %d differs", what, p)
			}
		})
	}
	readAll("read pass 1")
	readAll("read pass 2")
	st, err := a.Stats()
	require.NoError(t, err)
	// A fault whose prefetch brings every page the block still has on
	// the device, and more than half the block, moves it whole by
	// migration (clean.go wholeMove: a sweep), which drops the device's
	// copies; those pages then leave with a copy. In one run of six the
	// scattered reads' prefetch did so for 258 pages (about half a
	// block). Every other page the host only read leaves without one.
	assert.LessOrEqual(t, st.MigratedPages(CPU, 0), st.MigratedPages(0, CPU),
		"pages the host only read, that came as clean copies, went back to the device with a copy")
	assert.GreaterOrEqual(t, st.ReadDuplicatedPages(CPU), uint64(2*(blocks-budgetBlocks-1)*BlockSize/PageSize),
		"each read pass copied the pages that had left the host, keeping the device's copies")
	assert.GreaterOrEqual(t, st.EvictedCleanPages, uint64((blocks-budgetBlocks-1)*BlockSize/PageSize))

	written := 0
	scattered(func(p int) {
		if p%2 == 0 {
			b[p*PageSize+5] ^= 0xff
			want[p*PageSize+5] ^= 0xff
			written++
		}
	})
	readAll("the last read pass")
	st, err = a.Stats()
	require.NoError(t, err)
	copied := st.MigratedPages(CPU, 0)
	assert.LessOrEqual(t, copied, uint64(2*written), "written pages are copied each time they leave the host, and no more")
	assert.GreaterOrEqual(t, copied, uint64(written-(budgetBlocks+1)*BlockSize/PageSize), "every written page that left the host was copied")

	require.NoError(t, s.Launch(0, nil, "addOne", 2, rangeParams(a.Addr(), size, 0)))
	require.NoError(t, s.DeviceSynchronize(0))
	for i := range want {
		want[i]++
	}
	require.Equal(t, want, a.Bytes(), "the device's copies are the host's latest")
}
