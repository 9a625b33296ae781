package uvm

import (
	"fmt"
	"reflect"
	"sync"

	"github.com/softuvm/softuvm/internal/core"
	"github.com/softuvm/softuvm/internal/device"
	"github.com/softuvm/softuvm/internal/wire"
)

// Grid launches: CUDA's kernel<<<grid, block, shared, stream>>>. A
// GridKernel runs once for each thread of each block of the grid; its
// Thread says where the thread is (ThreadIdx, BlockIdx, BlockDim,
// GridDim), lets it wait for the other threads of its block
// (SyncThreads), gives the block's shared memory (Shared), and in a
// cooperative launch waits for the whole grid (SyncGrid).
//
// How a device runs it: the blocks are shared out among the device's
// workers, a block at a time each. A block's first thread runs on its
// worker; if it returns without waiting at a barrier, the next one runs,
// so a kernel without barriers costs a loop over its threads. The first
// thread that waits while others are still to run starts them as
// goroutines, so a block of any size runs, its threads waiting for each
// other at SyncThreads, however few workers the device has. A
// cooperative launch runs every block at once.
//
// The limits are CUDA's at compute capability 6.0 (DeviceProp says them):
// at most 1024 threads in a block, (1024, 1024, 64) in each dimension,
// (2^31-1, 65535, 65535) blocks, 48 KiB of shared memory a block.

type (
	// Dim3 is a grid's extent in blocks, a block's in threads, or an
	// index in one: CUDA's dim3. Dim makes one.
	Dim3 = core.Dim3
	// Thread is one thread of a grid launch, as its GridKernel sees it,
	// valid until the kernel returns (an interface the device runtime
	// implements):
	//
	//	ThreadIdx() Dim3                // its index in its block: threadIdx
	//	BlockIdx() Dim3                 // its block's in the grid: blockIdx
	//	BlockDim() Dim3                 // a block's extent: blockDim
	//	GridDim() Dim3                  // the grid's: gridDim
	//	SyncThreads()                   // __syncthreads: waits for every living thread of the block
	//	SyncThreadsCount(bool) int      // and how many passed true
	//	SyncThreadsAnd(bool) bool       // and whether all did
	//	SyncThreadsOr(bool) bool        // and whether any did
	//	SyncGrid()                      // grid.sync(), in a cooperative launch; a panic elsewhere
	//	Shared() []byte                 // the block's shared memory, SharedBytes long
	//
	// A thread that returned (or panicked) no longer counts at a barrier.
	// Shared's contents at a block's start are undefined, as CUDA's.
	Thread = core.Thread
	// GridKernel is a kernel of a grid launch (RegisterGridKernel,
	// LaunchGrid): it runs once for each thread of each block, with the
	// launch's parameters (copied at launch, as CUDA copies kernel
	// arguments). It sees managed memory as a Kernel does.
	GridKernel = core.GridKernel
)

// Dim is CUDA's dim3(x, y, z): the dimensions left out are 1.
func Dim(x int, yz ...int) Dim3 {
	d := Dim3{X: uint32(x), Y: 1, Z: 1}
	if len(yz) > 0 {
		d.Y = uint32(yz[0])
	}
	if len(yz) > 1 {
		d.Z = uint32(yz[1])
	}
	return d
}

// LaunchConfig is a grid launch's shape, as cudaLaunchConfig_t.
type LaunchConfig struct {
	// Grid is the grid's extent in blocks, Block each block's in threads.
	Grid, Block Dim3
	// SharedBytes is each block's shared memory (Thread.Shared), at most
	// 48 KiB.
	SharedBytes int
	// Cooperative keeps every block resident at once, so that
	// Thread.SyncGrid may wait for all of them (cudaLaunchCooperativeKernel).
	// A grid of more blocks than OccupancyMaxActiveBlocksPerMultiprocessor
	// times the device's workers is refused (ErrCooperativeLaunchTooLarge).
	Cooperative bool
}

// RegisterGridKernel makes a grid kernel launchable by name (LaunchGrid).
// Call it from an init function, as RegisterKernel; a name belongs to one
// kernel of either kind.
func RegisterGridKernel(name string, k GridKernel) error { return device.RegisterGridKernel(name, k) }

// MustRegisterGridKernel is RegisterGridKernel for init functions: it
// panics on error, which there is a programming error.
func MustRegisterGridKernel(name string, k GridKernel) {
	if err := RegisterGridKernel(name, k); err != nil {
		panic(err)
	}
}

// LaunchGrid runs grid kernel name on device d as cfg's grid, as a CUDA
// kernel launch: asynchronously, after the work queued before it on the
// stream (nil: the device's default stream). params are copied. A shape
// past the device's limits is ErrInvalidConfiguration, naming the value
// and the limit; a cooperative grid too large to be resident at once,
// ErrCooperativeLaunchTooLarge, naming its size and the most that fit. A
// kernel's panic (SyncGrid outside a cooperative launch among them) comes
// back from the next synchronize, naming the block and the thread.
func (s *Session) LaunchGrid(d Device, st *Stream, name string, cfg LaunchConfig, params []byte) error {
	if err := s.checkDevice(d, "launch on"); err != nil {
		return err
	}
	if _, ok := device.LookupGridKernel(name); !ok {
		if _, plain := device.LookupKernel(name); plain {
			return fmt.Errorf("%w: grid launch of kernel %q: it is a kernel of threads (RegisterKernel): launch it with Launch, or register a GridKernel", ErrInvalidValue, name)
		}
		return fmt.Errorf("%w: grid launch of kernel %q: no grid kernel of that name is registered (RegisterGridKernel in an init function)", ErrInvalidValue, name)
	}
	if cfg.SharedBytes < 0 {
		return fmt.Errorf("%w: grid launch of kernel %q with %d bytes of shared memory", ErrInvalidConfiguration, name, cfg.SharedBytes)
	}
	if err := core.CheckGrid(cfg.Grid, cfg.Block, uint64(cfg.SharedBytes)); err != nil {
		return fmt.Errorf("grid launch of kernel %q on device %d: %w", name, d, err)
	}
	lg := &wire.LaunchGridRequest{Grid: cfg.Grid, Block: cfg.Block, SharedBytes: uint32(cfg.SharedBytes)}
	if cfg.Cooperative {
		if err := core.CheckCooperative(cfg.Grid, cfg.Block, uint64(cfg.SharedBytes), s.devices[d].Workers); err != nil {
			return fmt.Errorf("launch of kernel %q on device %d: %w", name, d, err)
		}
		lg.Flags = core.GridCooperative
	}
	return s.launch(d, st, name, 0, lg, params)
}

// OccupancyMaxActiveBlocksPerMultiprocessor is how many blocks of
// blockThreads threads, each with sharedBytes of shared memory, one
// worker of a device keeps resident at once
// (cudaOccupancyMaxActiveBlocksPerMultiprocessor): min(32, 2048 /
// blockThreads), shared memory never the tighter bound; 0 for a block
// past the limits. Times the device's workers (DeviceProp's
// MultiProcessorCount), it is the largest cooperative grid.
func OccupancyMaxActiveBlocksPerMultiprocessor(blockThreads, sharedBytes int) int {
	if blockThreads <= 0 || sharedBytes < 0 {
		return 0
	}
	return core.MaxActiveBlocksPerMultiprocessor(uint64(blockThreads), uint64(sharedBytes))
}

// OccupancyMaxPotentialBlockSize is the block size that keeps the most
// threads resident on device d (the largest such block up to
// blockSizeLimit: 1024 where the limit is 0 or past it), and the smallest
// grid of such blocks that fills the device
// (OccupancyMaxActiveBlocksPerMultiprocessor times its workers), as
// cudaOccupancyMaxPotentialBlockSize. sharedBytes is each block's
// dynamic shared memory.
func (s *Session) OccupancyMaxPotentialBlockSize(d Device, sharedBytes, blockSizeLimit int) (minGridSize, blockSize int, err error) {
	if sharedBytes < 0 || blockSizeLimit < 0 {
		return 0, 0, fmt.Errorf("%w: occupancy with %d bytes of shared memory and a block size limit of %d: want neither negative", ErrInvalidValue, sharedBytes, blockSizeLimit)
	}
	prop, err := s.GetDeviceProperties(d)
	if err != nil {
		return 0, 0, err
	}
	size, blocks := core.MaxPotentialBlockSize(uint64(sharedBytes), blockSizeLimit)
	if size == 0 {
		return 0, 0, fmt.Errorf("%w: occupancy with %d bytes of shared memory per block: want at most %d", ErrInvalidValue, sharedBytes, core.MaxSharedMemoryPerBlock)
	}
	return blocks * prop.MultiProcessorCount, size, nil
}

// TypedGridKernel is a grid kernel that receives its launch's parameters
// as a value of type P, laid out as TypedKernel says
// (RegisterTypedGridKernel, LaunchGridTyped).
type TypedGridKernel[P any] func(t Thread, p P)

// typedGridKernels maps the names of typed grid kernels to their
// parameter types, for LaunchGridTyped to check.
var typedGridKernels sync.Map // string → reflect.Type

// RegisterTypedGridKernel makes a grid kernel with parameters of type P
// launchable by name, as RegisterTypedKernel does a kernel of threads;
// the rules on P and the errors are RegisterTypedKernel's. Each thread
// decodes the parameters into its own P.
func RegisterTypedGridKernel[P any](name string, k TypedGridKernel[P]) error {
	decode, err := typedDecoder[P]("grid kernel", name)
	if err != nil {
		return err
	}
	var gk GridKernel
	if k != nil {
		gk = func(th Thread, params []byte) { k(th, decode(params)) }
	}
	if err := RegisterGridKernel(name, gk); err != nil {
		return err
	}
	typedGridKernels.Store(name, reflect.TypeFor[P]())
	return nil
}

// MustRegisterTypedGridKernel is RegisterTypedGridKernel for init
// functions: it panics on error.
func MustRegisterTypedGridKernel[P any](name string, k TypedGridKernel[P]) {
	if err := RegisterTypedGridKernel(name, k); err != nil {
		panic(err)
	}
}

// LaunchGridTyped is Session.LaunchGrid with parameters given as a Go
// value, as LaunchTyped is Launch's.
func LaunchGridTyped[P any](s *Session, d Device, st *Stream, name string, cfg LaunchConfig, p P) error {
	params, err := typedParams(&typedGridKernels, "grid kernel", name, p)
	if err != nil {
		return err
	}
	return s.LaunchGrid(d, st, name, cfg, params)
}
