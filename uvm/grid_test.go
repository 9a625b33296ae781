package uvm

import (
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Grid kernels of the grid tests. Each writes what the host checks, the
// host computing the expected values from the launch's shape alone.

// gridVisit: every thread counts itself in its own slot and writes its
// coordinates there.
type gridVisit struct {
	Count                            uint32
	Thread, Block, BlockDim, GridDim Dim3
}

type gridVisitParams struct{ Visits uintptr }

// gridNeighbourParams: rounds of write your stamp into shared memory,
// wait, read your neighbour's, wait.
type gridNeighbourParams struct {
	Out    uintptr // uint64 per thread
	Rounds uint32
}

type gridCoopParams struct {
	A, Out uintptr // int64 per thread
	Rounds uint32
}

type gridIsolationParams struct {
	Wrong  uintptr // uint32 per block
	Words  uint32
	Rounds uint32
}

type gridCountParams struct{ Out uintptr } // int32 x 3 per block

func gridLinear(i, d Dim3) uint64 {
	return uint64(i.X) + uint64(d.X)*(uint64(i.Y)+uint64(d.Y)*uint64(i.Z))
}

func gridStamp(block uint64, thread, round int) uint64 {
	return block<<32 | uint64(round)<<16 | uint64(thread)
}

func init() {
	MustRegisterTypedGridKernel("grid-visit", func(t Thread, p gridVisitParams) {
		b, th := gridLinear(t.BlockIdx(), t.GridDim()), gridLinear(t.ThreadIdx(), t.BlockDim())
		v := &SliceAt[gridVisit](p.Visits, int((b+1)*t.BlockDim().Count()))[b*t.BlockDim().Count()+th]
		atomic.AddUint32(&v.Count, 1)
		v.Thread, v.Block, v.BlockDim, v.GridDim = t.ThreadIdx(), t.BlockIdx(), t.BlockDim(), t.GridDim()
	})
	MustRegisterTypedGridKernel("grid-neighbour", func(t Thread, p gridNeighbourParams) {
		n, me, b := int(t.BlockDim().X), int(t.ThreadIdx().X), uint64(t.BlockIdx().X)
		raw := t.Shared()
		shared := unsafe.Slice((*uint64)(unsafe.Pointer(&raw[0])), n)
		var sum uint64
		for r := 0; r < int(p.Rounds); r++ {
			shared[me] = gridStamp(b, me, r)
			t.SyncThreads()
			sum += shared[(me+1)%n]
			t.SyncThreads()
		}
		SliceAt[uint64](p.Out, int(b+1)*n)[int(b)*n+me] = sum
	})
	MustRegisterTypedGridKernel("grid-isolation", func(t Thread, p gridIsolationParams) {
		shared := t.Shared()
		me := byte(t.BlockIdx().X + 1)
		wrong := uint32(0)
		for r := 0; r < int(p.Rounds); r++ {
			for i := int(t.ThreadIdx().X); i < int(p.Words); i += int(t.BlockDim().X) {
				shared[i] = me
			}
			t.SyncThreads()
			for i := range int(p.Words) {
				if shared[i] != me {
					wrong++
				}
			}
			t.SyncThreads()
		}
		atomic.AddUint32(&SliceAt[uint32](p.Wrong, int(t.BlockIdx().X)+1)[t.BlockIdx().X], wrong)
	})
	MustRegisterTypedGridKernel("grid-counts", func(t Thread, p gridCountParams) {
		tid, b, n := t.ThreadIdx().X, t.BlockIdx().X, t.BlockDim().X
		c := t.SyncThreadsCount(tid%3 == 0)
		all := t.SyncThreadsAnd(tid < n-b)
		any := t.SyncThreadsOr(tid == b*100)
		if tid == 0 {
			out := SliceAt[int32](p.Out, int(b+1)*3)
			out[b*3] = int32(c)
			out[b*3+1] = boolInt(all)
			out[b*3+2] = boolInt(any)
		}
	})
	MustRegisterTypedGridKernel("grid-coop", func(t Thread, p gridCoopParams) {
		threads := uint64(t.BlockDim().X) * uint64(t.GridDim().X)
		me := uint64(t.BlockIdx().X)*uint64(t.BlockDim().X) + uint64(t.ThreadIdx().X)
		a := SliceAt[int64](p.A, int(threads))
		var sum int64
		for r := 0; r < int(p.Rounds); r++ {
			a[me] = int64(me*1000) + int64(r)
			t.SyncGrid()
			sum += a[(me+threads/2+uint64(t.BlockDim().X)/2)%threads]
			t.SyncGrid()
		}
		SliceAt[int64](p.Out, int(threads))[me] = sum
	})
	MustRegisterGridKernel("grid-sync-not-cooperative", func(t Thread, p []byte) { t.SyncGrid() })
	MustRegisterGridKernel("grid-panic", func(t Thread, p []byte) {
		t.SyncThreads()
		if t.ThreadIdx().X == 3 && t.BlockIdx().X == 1 {
			panic("thread 3 of block 1 gives up")
		}
		t.SyncThreads() // the others do not wait for it
	})
}

func boolInt(b bool) int32 {
	if b {
		return 1
	}
	return 0
}

// gridSession is a private server with one device of 2 workers: blocks
// far larger than the workers.
func gridSession(t *testing.T) *Session {
	cfg := testServerConfig()
	cfg.DeviceWorkers = 2
	return newSession(t, cfg)
}

func TestGridIndices(t *testing.T) {
	s := gridSession(t)
	for _, c := range []struct{ grid, block Dim3 }{
		{Dim(3, 4, 5), Dim(4, 3, 2)},
		{Dim(2, 1, 3), Dim(16, 8, 8)},
		{Dim(1000), Dim(1)},
	} {
		nb, nt := c.grid.Count(), c.block.Count()
		a, err := s.MallocManaged(int64(nb * nt * uint64(unsafe.Sizeof(gridVisit{}))))
		require.NoError(t, err)
		require.NoError(t, LaunchGridTyped(s, 0, nil, "grid-visit", LaunchConfig{Grid: c.grid, Block: c.block}, gridVisitParams{Visits: a.Addr()}))
		require.NoError(t, s.DeviceSynchronize(0))
		visits := SliceAt[gridVisit](a.Addr(), int(nb*nt))
		bad := 0
		for b := range nb {
			for th := range nt {
				want := gridVisit{Count: 1,
					Block:    Dim3{X: uint32(b % uint64(c.grid.X)), Y: uint32(b / uint64(c.grid.X) % uint64(c.grid.Y)), Z: uint32(b / (uint64(c.grid.X) * uint64(c.grid.Y)))},
					Thread:   Dim3{X: uint32(th % uint64(c.block.X)), Y: uint32(th / uint64(c.block.X) % uint64(c.block.Y)), Z: uint32(th / (uint64(c.block.X) * uint64(c.block.Y)))},
					BlockDim: c.block, GridDim: c.grid}
				if got := visits[b*nt+th]; got != want {
					if bad++; bad < 4 {
						t.Errorf("grid %v of %v: block %d thread %d: %+v, want %+v", c.grid, c.block, b, th, got, want)
					}
				}
			}
		}
		require.NoError(t, a.Free())
	}
}

func TestGridBarrier(t *testing.T) {
	s := gridSession(t)
	for _, c := range []struct{ blocks, threads, rounds int }{{6, 256, 4}, {2, 1024, 2}, {3, 1, 2}} {
		a, err := s.MallocManaged(int64(c.blocks * c.threads * 8))
		require.NoError(t, err)
		cfg := LaunchConfig{Grid: Dim(c.blocks), Block: Dim(c.threads), SharedBytes: 8 * c.threads}
		require.NoError(t, LaunchGridTyped(s, 0, nil, "grid-neighbour", cfg, gridNeighbourParams{Out: a.Addr(), Rounds: uint32(c.rounds)}))
		require.NoError(t, s.DeviceSynchronize(0))
		out := SliceAt[uint64](a.Addr(), c.blocks*c.threads)
		bad := 0
		for b := range c.blocks {
			for th := range c.threads {
				var want uint64
				for r := range c.rounds {
					want += gridStamp(uint64(b), (th+1)%c.threads, r)
				}
				if out[b*c.threads+th] != want {
					if bad++; bad < 4 {
						t.Errorf("%d blocks of %d threads: block %d thread %d read %#x, want %#x", c.blocks, c.threads, b, th, out[b*c.threads+th], want)
					}
				}
			}
		}
		require.NoError(t, a.Free())
	}
}

func TestGridSharedIsolation(t *testing.T) {
	s := gridSession(t)
	const blocks = 64
	a, err := s.MallocManaged(4 * blocks)
	require.NoError(t, err)
	p := gridIsolationParams{Wrong: a.Addr(), Words: 4096, Rounds: 8}
	require.NoError(t, LaunchGridTyped(s, 0, nil, "grid-isolation", LaunchConfig{Grid: Dim(blocks), Block: Dim(64), SharedBytes: int(p.Words)}, p))
	require.NoError(t, s.DeviceSynchronize(0))
	for b, w := range SliceAt[uint32](a.Addr(), blocks) {
		assert.Zero(t, w, "block %d read another block's number %d times", b, w)
	}
}

func TestGridCountingBarriers(t *testing.T) {
	s := gridSession(t)
	const blocks, threads = 4, 300
	a, err := s.MallocManaged(blocks * 3 * 4)
	require.NoError(t, err)
	require.NoError(t, LaunchGridTyped(s, 0, nil, "grid-counts", LaunchConfig{Grid: Dim(blocks), Block: Dim(threads)}, gridCountParams{Out: a.Addr()}))
	require.NoError(t, s.DeviceSynchronize(0))
	out := SliceAt[int32](a.Addr(), blocks*3)
	for b := range blocks {
		assert.Equal(t, int32((threads+2)/3), out[b*3], "block %d count", b)
		assert.Equal(t, boolInt(b == 0), out[b*3+1], "block %d and", b)
		assert.Equal(t, boolInt(b*100 < threads), out[b*3+2], "block %d or", b)
	}
}

func TestGridCooperative(t *testing.T) {
	s := gridSession(t)
	const threads = 64
	per := OccupancyMaxActiveBlocksPerMultiprocessor(threads, 0)
	prop, err := s.GetDeviceProperties(0)
	require.NoError(t, err)
	require.Equal(t, 32, per)
	require.Equal(t, 2, prop.MultiProcessorCount)
	blocks := per * prop.MultiProcessorCount
	n := blocks * threads
	a, err := s.MallocManaged(int64(8 * n))
	require.NoError(t, err)
	out, err := s.MallocManaged(int64(8 * n))
	require.NoError(t, err)
	for i := range SliceAt[int64](a.Addr(), n) {
		SliceAt[int64](a.Addr(), n)[i] = -1
	}
	p := gridCoopParams{A: a.Addr(), Out: out.Addr(), Rounds: 3}
	cfg := LaunchConfig{Grid: Dim(blocks), Block: Dim(threads), Cooperative: true}
	require.NoError(t, LaunchGridTyped(s, 0, nil, "grid-coop", cfg, p))
	require.NoError(t, s.DeviceSynchronize(0))
	got := SliceAt[int64](out.Addr(), n)
	bad := 0
	for i := range n {
		j := (i + n/2 + threads/2) % n
		want := int64(0)
		for r := range 3 {
			want += int64(j*1000 + r)
		}
		if got[i] != want {
			if bad++; bad < 4 {
				t.Errorf("thread %d read %d, want %d", i, got[i], want)
			}
		}
	}

	cfg.Grid = Dim(blocks + 1)
	err = LaunchGridTyped(s, 0, nil, "grid-coop", cfg, p)
	require.ErrorIs(t, err, ErrCooperativeLaunchTooLarge)
	assert.Contains(t, err.Error(), fmt.Sprintf("%d blocks", blocks+1))
	assert.Contains(t, err.Error(), fmt.Sprintf("at most %d blocks", blocks))

	// A grid barrier outside a cooperative launch fails the launch.
	require.NoError(t, s.LaunchGrid(0, nil, "grid-sync-not-cooperative", LaunchConfig{Grid: Dim(2), Block: Dim(4)}, nil))
	err = s.DeviceSynchronize(0)
	require.ErrorIs(t, err, ErrLaunchFailure)
	assert.Contains(t, err.Error(), "not cooperative")
}

func TestGridPanicAndLimits(t *testing.T) {
	s := gridSession(t)
	// A thread that panics is reported, naming its block and thread; the
	// others of its block do not wait for it at the next barrier.
	require.NoError(t, s.LaunchGrid(0, nil, "grid-panic", LaunchConfig{Grid: Dim(2), Block: Dim(8)}, nil))
	err := s.DeviceSynchronize(0)
	require.ErrorIs(t, err, ErrLaunchFailure)
	assert.Contains(t, err.Error(), "thread (3,0,0) of block (1,0,0)")
	assert.Equal(t, 1, strings.Count(err.Error(), "panicked"), "only the one thread fails: %v", err)

	for _, cfg := range []LaunchConfig{
		{Grid: Dim(0), Block: Dim(1)}, {Grid: Dim(1), Block: Dim(1, 0)}, {Grid: Dim(1, 65536), Block: Dim(1)},
		{Grid: Dim(1), Block: Dim(1025)}, {Grid: Dim(1), Block: Dim(32, 32, 2)}, {Grid: Dim(1), Block: Dim(1, 1, 65)},
		{Grid: Dim(1), Block: Dim(1), SharedBytes: 48<<10 + 1}, {Grid: Dim(1 << 31), Block: Dim(1)},
	} {
		err := s.LaunchGrid(0, nil, "grid-panic", cfg, nil)
		assert.True(t, errors.Is(err, ErrInvalidConfiguration), "%+v: %v", cfg, err)
	}
	assert.ErrorIs(t, s.LaunchGrid(0, nil, "no-such-grid-kernel", LaunchConfig{Grid: Dim(1), Block: Dim(1)}, nil), ErrInvalidValue)
	assert.ErrorIs(t, s.LaunchGrid(0, nil, "st-copy", LaunchConfig{Grid: Dim(1), Block: Dim(1)}, nil), ErrInvalidValue)
	assert.ErrorIs(t, s.LaunchGrid(3, nil, "grid-panic", LaunchConfig{Grid: Dim(1), Block: Dim(1)}, nil), ErrInvalidDevice)
	assert.ErrorIs(t, RegisterGridKernel("st-copy", func(Thread, []byte) {}), ErrInvalidValue)
	assert.ErrorIs(t, RegisterKernel("grid-panic", func(int, int, []byte) {}), ErrInvalidValue)
	for _, c := range []struct{ threads, shared, want int }{{1, 0, 32}, {64, 0, 32}, {65, 0, 31}, {256, 0, 8}, {1024, 0, 2}, {1025, 0, 0}, {32, 48 << 10, 32}, {32, 48<<10 + 1, 0}, {0, 0, 0}} {
		assert.Equal(t, c.want, OccupancyMaxActiveBlocksPerMultiprocessor(c.threads, c.shared), "blocks of %d threads with %d bytes", c.threads, c.shared)
	}
	// The largest block that keeps the most threads resident (2048 on a
	// worker of 2), and the grid that fills the device's 2 workers.
	for _, c := range []struct{ shared, limit, size, grid int }{
		{0, 0, 1024, 4}, {0, 1 << 20, 1024, 4}, {0, 1023, 512, 8}, {0, 100, 64, 64}, {0, 40, 40, 64}, {48 << 10, 0, 1024, 4},
	} {
		grid, size, err := s.OccupancyMaxPotentialBlockSize(0, c.shared, c.limit)
		require.NoError(t, err)
		assert.Equal(t, [2]int{c.size, c.grid}, [2]int{size, grid}, "block size and grid with %d bytes, limit %d", c.shared, c.limit)
	}
	_, _, err = s.OccupancyMaxPotentialBlockSize(0, 48<<10+1, 0)
	assert.ErrorIs(t, err, ErrInvalidValue)
	_, _, err = s.OccupancyMaxPotentialBlockSize(0, 0, -1)
	assert.ErrorIs(t, err, ErrInvalidValue)
	_, _, err = s.OccupancyMaxPotentialBlockSize(3, 0, 0)
	assert.ErrorIs(t, err, ErrInvalidDevice)
}
