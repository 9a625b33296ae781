// Package uvm is softuvm's unified memory for Go programs: CUDA-style
// managed memory, devices, kernels and streams, where the devices are CPU
// processes and every fault is a real Linux fault served by a fault
// server.
//
// A program calls MallocManaged and gets memory that is valid on the host
// and, once devices run kernels, on every device. Its pages live in one
// place at a time (host memory or a device's arena) and move on demand,
// 4 KiB at a time with speculative prefetch of their neighbours, or in
// bulk with Prefetch, as cudaMallocManaged memory does:
//
//	a, err := uvm.MallocManaged(64 << 20)
//	b := a.Bytes()          // ordinary memory to the program
//	b[0] = 1                // first touch: a zero page, and its neighbours
//	a.Prefetch(0)           // copy to device 0's arena, free the host pages
//	x := b[0]               // fault: the page (and its neighbours) come back
//	st, err := a.Stats()    // faults, migrations, prefetch, service time
//
// # Main and sessions
//
// A program that launches kernels, or chooses a policy of its own by
// name, calls Main first in main: devices, a private fault server and
// the servers that take over from it are re-executions of the program's
// binary, and Main (or this package's init function, for a server whose
// policies are registered before this package initializes) runs them
// instead of the program, once the init functions that register kernels
// and policies have run. A Session is the process's connection to a fault server;
// Default connects on first use as the environment says (ConfigFromEnv:
// UVM_SERVER, UVM_SOCKET), and the package-level functions (MallocManaged,
// Prefetch, MemAdvise, Memcpy, Free, GetDeviceCount) use it. Connect takes
// a Config: a daemon (`uvm serve`), a private server configured with a
// ServerConfig, or whichever is there, and a Log file for what the
// private server, its guard and the device processes write. Close frees
// every allocation.
//
// # Memory
//
// MallocManaged makes managed memory (WithPrefetch chooses its fault
// prefetch policy, TrackPrefetchUse records which prefetched pages get
// used, WithFlags sets AttachGlobal or AttachHost). Malloc makes device
// memory, which only kernels reach; HostAlloc makes pinned host memory
// that every device maps in place (HostGetDevicePointer), and
// HostRegister turns a program's own page-aligned memory into such
// memory. An Allocation gives its Addr, Bytes, Pointer and Size.
// Memcpy and Memset copy between every kind, as cudaMemcpy (MemcpyKind);
// PointerAttributes says what a pointer is.
//
// # Devices, kernels and streams
//
// A device is a process of its own that maps every managed range at the
// same address. A Kernel is a Go function registered by name from an init
// function (RegisterKernel, MustRegisterKernel), so that the device
// process, a re-execution of the binary, finds it too; Session.Launch
// runs it with nthreads threads on a device, asynchronously, with its
// parameters copied. Its accesses to pages that live elsewhere fault and
// bring them over, as a GPU's do. StreamCreate makes a stream; work on a
// stream runs in order (PrefetchAsync, MemcpyAsync, LaunchHostFunc and
// the other stream-ordered calls too), and StreamSynchronize,
// DeviceSynchronize and DefaultStreamSynchronize wait for it; StreamQuery
// asks. Events (EventRecord, EventSynchronize, EventElapsedTime) mark
// points in a stream.
//
// The order between streams is CUDA's. A device's default stream (a nil
// *Stream in Launch and LaunchGrid; DefaultStream) is its legacy default
// stream: its work waits for the work submitted before it on every
// blocking stream of the device, and their later work waits for it; a
// stream made with StreamNonBlocking takes no part. The synchronous calls
// are issued on the legacy streams (of every device: a Session has no
// current device): a kernel, then a Memcpy, Memset, Memcpy2D or Memset2D
// of what it wrote, sees the kernel's result; MemcpyPeer waits for the
// legacy streams of its two devices; Free, FreeHost and HostUnregister
// wait for every stream's kernels, as cudaFree. Go has no per-thread
// default stream: a goroutine's own blocking stream orders its work as
// one would.
//
// A launch that fails (a kernel's panic, naming the kernel, the device
// and the thread; the death of the device process; a launch that cannot
// be written) fails its device, as a kernel fault does a CUDA context:
// every later synchronize of the device and of its streams, and every
// event of the device, reports it (ErrLaunchFailure), and the device
// takes no work, until DeviceReset, after which the next launch starts a
// new process with nothing lost. Devices, DeviceCount,
// GetDeviceProperties and DeviceGetAttribute (with cudaDeviceAttr's
// values) describe the devices, each property with its value and why.
//
// # Grids: CUDA's kernels
//
// A GridKernel (RegisterGridKernel, or RegisterTypedGridKernel for a
// typed one) runs once for each thread of each block of a grid, as a CUDA
// kernel: Session.LaunchGrid takes a LaunchConfig (Grid and Block as
// Dim3, SharedBytes, Cooperative), and the kernel's Thread says where it
// is (ThreadIdx, BlockIdx, BlockDim, GridDim), waits for its block
// (SyncThreads, and its Count, And and Or forms), gives the block's
// shared memory (Shared), and in a cooperative launch waits for the
// whole grid (SyncGrid). A grid launch is a launch: in the same stream
// order, and failing its device the same way. A block runs on one
// worker: its first thread on the worker's goroutine, the others, once a
// thread waits at a barrier, as goroutines, so a block of any size runs
// and its threads may wait for each other; a kernel without barriers is
// a loop over its threads. A barrier costs a goroutine's park and wake
// for each waiting thread (a few hundred nanoseconds; C's fibers cost
// some ten). Shapes past CUDA's 6.0 limits are ErrInvalidConfiguration;
// a cooperative grid larger than OccupancyMaxActiveBlocksPerMultiprocessor
// times the device's workers, ErrCooperativeLaunchTooLarge. The (tid,
// nthreads) Kernel stays.
//
// # Advice
//
// MemAdvise gives cuMemAdvise advice per page: AdviseSetReadMostly (a
// reader gets a write-protected copy; a write keeps the writer's only),
// AdviseSetPreferredLocation (devices map the page there and bring it
// there), AdviseSetAccessedBy (a device maps the page wherever it lives
// and does not fault on it), and their Unset forms. MemAdviseLocation and
// PrefetchLocation(Async) take a MemLocation instead of a processor, as
// the _v2 forms of CUDA 12.2: a device, the host, a host NUMA node (the
// host pages then prefer it, and a prefetch moves them there) or the node
// nearest the caller. Under the launch coherence model (Config.Coherence
// "launch": devices without concurrent managed access, as GPUs that
// cannot fault) a launch hands a kernel its managed memory and the CPU
// may not touch it until a synchronize; StreamAttachMemAsync, in stream
// order, keeps memory on the host or with one stream; and what CUDA
// refuses there is refused (ErrInvalidDevice): Prefetch, PrefetchAsync,
// PrefetchLocation(Async), and preferred-location or accessed-by advice
// naming a device. RangeAttribute and RangeAttributes answer
// cuMemRangeGetAttribute, locations' types and ids included. Discard
// drops a range's contents everywhere, as cudaMemDiscardBatchAsync: it
// reads as zeros after, and holds no memory until touched again.
// Memcpy2D and Memset2D copy and fill rows with pitches.
//
// ProfilerStart and ProfilerStop record a trace of the session between
// them, as uvm trace records one (docs/traces.md).
//
// # Statistics
//
// Allocation.Stats, Session.Stats and Session.ServerStats report, per
// allocation, per process and for the server: faults by processor and
// kind, pages migrated each way, zero-filled, evicted, mapped remotely,
// copied by read duplication, throttles and pins, prefetched pages and
// their use, access-counter migrations, and a histogram of fault service
// time. Session.Info is the server's configuration and state, as `uvm
// info` shows it.
//
// # Errors
//
// Every error wraps one of ErrInvalidValue, ErrMemoryAllocation,
// ErrInvalidDevice, ErrInitialization, ErrNotSupported, ErrServerGone,
// ErrLaunchFailure, ErrInvalidConfiguration,
// ErrCooperativeLaunchTooLarge or ErrInternal (test with errors.Is),
// after CUDA's error codes, and its message names the offending value.
//
// How the server serves the faults, moves the pages and survives its own
// death is in docs/architecture.md; the C API, with the same server, is
// in docs/c-api.md.
package uvm
