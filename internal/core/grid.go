package core

import (
	"errors"
	"fmt"
)

// Dim3 is the extent of a grid (in blocks) or of a block (in threads), or
// a thread's or block's index in one: CUDA's dim3.
type Dim3 struct{ X, Y, Z uint32 }

// Count is the number of elements of an extent: X*Y*Z.
func (d Dim3) Count() uint64 { return uint64(d.X) * uint64(d.Y) * uint64(d.Z) }

func (d Dim3) String() string { return fmt.Sprintf("(%d,%d,%d)", d.X, d.Y, d.Z) }

// The limits of a grid launch. They are CUDA's at the feature level a
// device emulates (compute capability ComputeCapabilityMajor.Minor), so
// that a program that sizes its grid from the device's attributes, or
// from constants it was written with, keeps its shapes:
//
//   - a block has at most MaxThreadsPerBlock threads, at most
//     MaxBlockDim in each dimension; a grid at most MaxGridDim blocks in
//     each;
//   - a block's dynamic shared memory is at most MaxSharedMemoryPerBlock
//     bytes, CUDA's default (a CPU core's L1 and L2 hold it);
//   - a worker (a device's multiprocessor) keeps at most
//     MaxBlocksPerMultiprocessor blocks and MaxThreadsPerMultiprocessor
//     threads resident at once: what a cooperative launch may rely on
//     (MaxActiveBlocksPerMultiprocessor). Shared memory never limits
//     residency below that count: SharedMemoryPerMultiprocessor is the
//     count times the largest block's.
const (
	MaxThreadsPerBlock            = 1024
	MaxBlockDimX                  = 1024
	MaxBlockDimY                  = 1024
	MaxBlockDimZ                  = 64
	MaxGridDimX                   = 1<<31 - 1
	MaxGridDimY                   = 65535
	MaxGridDimZ                   = 65535
	MaxSharedMemoryPerBlock       = 48 << 10
	MaxBlocksPerMultiprocessor    = 32
	MaxThreadsPerMultiprocessor   = 2048
	SharedMemoryPerMultiprocessor = MaxBlocksPerMultiprocessor * MaxSharedMemoryPerBlock
)

// WarpSize is 1: no two threads of a block run in lock step (a block's
// threads take turns on one worker thread, switching at barriers), so a
// warp of one thread is the only size a program may rely on. Code that
// reads warpSize stays correct; code that assumes 32 threads move
// together is not, as CUDA's own rules say since independent thread
// scheduling.
const WarpSize = 1

// The compute capability a device reports, 6.0 (Pascal): the feature
// level of what a CPU device does as a GPU of that level does it. Managed
// memory migrated on demand with concurrent access from the host
// (concurrentManagedAccess), cooperative launches with a grid barrier,
// block barriers and shared memory, unified addressing. Not what came
// with 7.0: a thread that waits for another thread of its own block
// without a barrier (a spin on a flag) never yields to it here, where
// Volta's independent thread scheduling guarantees that it progresses.
// Warp intrinsics (shuffles, votes) and textures, which 6.0 has, are not
// emulated at all: docs/c-api.md says what a CPU device cannot do.
const (
	ComputeCapabilityMajor = 6
	ComputeCapabilityMinor = 0
)

// The stack of each thread of a block after the first (a fiber's), in
// bytes, as cudaLimitStackSize sets it; the first thread runs on its
// worker's own stack. Each stack has a guard page below it: a thread
// that overflows it is a kernel crash, reported as any other.
const (
	DefaultStackSize = 64 << 10
	MinStackSize     = 16 << 10
	MaxStackSize     = 64 << 20
)

// Grid launch flags.
const (
	// GridCooperative makes every block of the grid resident at once, so
	// that a grid barrier may wait for all of them
	// (cudaLaunchCooperativeKernel).
	GridCooperative = 1
)

// ErrInvalidConfiguration is a grid launch whose shape the device cannot
// run (cudaErrorInvalidConfiguration): a dimension of zero or past its
// limit, too many threads in a block, too much shared memory.
var ErrInvalidConfiguration = errors.New("invalid configuration")

// ErrCooperativeLaunchTooLarge is a cooperative launch of more blocks than
// the device keeps resident at once (cudaErrorCooperativeLaunchTooLarge).
var ErrCooperativeLaunchTooLarge = errors.New("cooperative launch too large")

// CheckGrid checks a grid launch's shape against the limits above; the
// error, which wraps ErrInvalidConfiguration, names the bad value and the
// limit.
func CheckGrid(grid, block Dim3, sharedBytes uint64) error {
	bad := func(format string, a ...any) error {
		return fmt.Errorf("%w: grid %v of blocks %v with %d bytes of shared memory: %s", ErrInvalidConfiguration, grid, block, sharedBytes, fmt.Sprintf(format, a...))
	}
	switch {
	case grid.X == 0 || grid.Y == 0 || grid.Z == 0:
		return bad("a grid dimension is 0; want at least 1 block in each")
	case block.X == 0 || block.Y == 0 || block.Z == 0:
		return bad("a block dimension is 0; want at least 1 thread in each")
	case grid.X > MaxGridDimX || grid.Y > MaxGridDimY || grid.Z > MaxGridDimZ:
		return bad("want at most (%d,%d,%d) blocks", MaxGridDimX, MaxGridDimY, MaxGridDimZ)
	case block.X > MaxBlockDimX || block.Y > MaxBlockDimY || block.Z > MaxBlockDimZ:
		return bad("want at most (%d,%d,%d) threads in each dimension of a block", MaxBlockDimX, MaxBlockDimY, MaxBlockDimZ)
	case block.Count() > MaxThreadsPerBlock:
		return bad("%d threads in a block; want at most %d", block.Count(), MaxThreadsPerBlock)
	case sharedBytes > MaxSharedMemoryPerBlock:
		return bad("want at most %d bytes of shared memory per block", MaxSharedMemoryPerBlock)
	}
	return nil
}

// MaxActiveBlocksPerMultiprocessor is how many blocks of blockThreads
// threads, each with sharedBytes of dynamic shared memory, one worker keeps
// resident at once (cudaOccupancyMaxActiveBlocksPerMultiprocessor); 0 for
// a block the device cannot run.
func MaxActiveBlocksPerMultiprocessor(blockThreads, sharedBytes uint64) int {
	if blockThreads == 0 || blockThreads > MaxThreadsPerBlock || sharedBytes > MaxSharedMemoryPerBlock {
		return 0
	}
	n := min(uint64(MaxBlocksPerMultiprocessor), MaxThreadsPerMultiprocessor/blockThreads)
	if sharedBytes > 0 {
		n = min(n, SharedMemoryPerMultiprocessor/sharedBytes)
	}
	return int(n)
}

// MaxPotentialBlockSize is CUDA's search of the block size that keeps
// the most threads resident on a worker: from the largest block (limit,
// or MaxThreadsPerBlock when limit is 0 or more) down, the first size with
// the most, and how many such blocks a worker keeps. size is 0 where no
// block fits sharedBytes. (libuvm's grid.c searches alike.)
func MaxPotentialBlockSize(sharedBytes uint64, limit int) (size, blocks int) {
	if limit <= 0 || limit > MaxThreadsPerBlock {
		limit = MaxThreadsPerBlock
	}
	most := 0
	for b := limit; b > 0; b-- {
		if n := MaxActiveBlocksPerMultiprocessor(uint64(b), sharedBytes); n*b > most {
			most, size, blocks = n*b, b, n
		}
	}
	return size, blocks
}

// CheckCooperative checks that a cooperative grid of blocks blocks fits
// the device's workers at once; the error wraps
// ErrCooperativeLaunchTooLarge and names the grid's size and the most
// that fit.
func CheckCooperative(grid, block Dim3, sharedBytes uint64, workers int) error {
	most := uint64(MaxActiveBlocksPerMultiprocessor(block.Count(), sharedBytes)) * uint64(max(workers, 0))
	if grid.Count() > most {
		return fmt.Errorf("%w: a cooperative grid of %d blocks (%v) of %d threads with %d bytes of shared memory each: at most %d blocks are resident at once (%d per worker, %d workers: cudaOccupancyMaxActiveBlocksPerMultiprocessor times the multiprocessor count)",
			ErrCooperativeLaunchTooLarge, grid.Count(), grid, block.Count(), sharedBytes, most, MaxActiveBlocksPerMultiprocessor(block.Count(), sharedBytes), workers)
	}
	return nil
}

// Thread is one thread of a grid launch as its kernel sees it (uvm.Thread):
// where it is, and what it may wait for. The device runtime implements it;
// a kernel gets one per thread, valid until the kernel returns.
type Thread interface {
	// ThreadIdx is the thread's index in its block, BlockIdx its block's
	// in the grid, BlockDim and GridDim their extents: CUDA's threadIdx,
	// blockIdx, blockDim and gridDim.
	ThreadIdx() Dim3
	BlockIdx() Dim3
	BlockDim() Dim3
	GridDim() Dim3
	// SyncThreads waits until every thread of the block still running
	// has called it (__syncthreads): a thread that returned no longer
	// counts. SyncThreadsCount, SyncThreadsAnd and SyncThreadsOr wait the
	// same way and say how many of the threads passed true, whether all
	// did, whether any did.
	SyncThreads()
	SyncThreadsCount(predicate bool) int
	SyncThreadsAnd(predicate bool) bool
	SyncThreadsOr(predicate bool) bool
	// SyncGrid waits until every thread of every block still running has
	// called it (a cooperative grid's grid.sync()); in a launch that is
	// not cooperative it panics, which fails the launch.
	SyncGrid()
	// Shared is the block's shared memory: the launch's SharedBytes,
	// the same slice for every thread of a block and another for every
	// block running at the same time (CUDA's extern __shared__). Its
	// contents at a block's start are undefined, as CUDA's.
	Shared() []byte
}

// GridKernel is a kernel of a grid launch: it runs once for each thread
// of each block, with the launch's parameters (copied at launch).
type GridKernel func(t Thread, params []byte)
