package libuvm

// SourceLayers orders libuvm's C files, lowest first: a file calls
// functions of files in lower layers only, never of a file in its own
// layer or above, so that the library stays a tree as it grows
// (internal/lint's TestLibuvmLayers checks every call, with `make lint`).
// Calls through function pointers (a stream's queued work, a kernel) are
// not calls here: they go wherever the caller that queued them could.
//
//  0. error.c, sysalloc.c: errors and messages; glibc's allocator and the
//     memory system calls by their own names (libuvm must never reach the
//     preload library's malloc or mmap).
//  1. wire.c: the protocol's messages; fiber.c: a grid's user-level
//     contexts, on stacks of their own.
//  2. session.c: the connection to the fault server, the allocations, the
//     current device and which devices exist; block.c: a grid's blocks as
//     a device process runs them (their threads as fibers, barriers,
//     shared memory) and the shapes a device runs.
//  3. coherence.c: the launch coherence model's requests; devproc.c: the
//     device process's side (a fork of the program at a device's first
//     launch); managed.c: managed variables, made managed memory before
//     main; profiler.c: the profiler's start and stop of a trace.
//  4. device.c: the program's side of device processes: starting them,
//     their sockets, writing launches, synchronizing, deaths and a
//     device's failure, how synchronizes wait.
//  5. stream.c: streams, their order, launches, queued work, marks and
//     the synchronizes; props.c: device attributes and properties, peers,
//     memory information, pointer attributes.
//  6. location.c: the ranges, prefetch and advice that the first and the
//     location (_v2) forms share, and host NUMA nodes; event.c: events,
//     on marks; grid.c: grid and cooperative launches (through stream.c's
//     launches), occupancy, limits.
//  7. memory.c: allocation, copies, fills, prefetch, advice, attachment
//     (in stream order).
//  8. copy3d.c: 2D and 3D copies and fills, on memory.c's.
//  9. preload/preload.c: the interposer of `uvm run`.
var SourceLayers = [][]string{
	{"src/error.c", "src/sysalloc.c"},
	{"src/wire.c", "src/fiber.c"},
	{"src/session.c", "src/block.c"},
	{"src/coherence.c", "src/devproc.c", "src/managed.c", "src/profiler.c"},
	{"src/device.c"},
	{"src/stream.c", "src/props.c"},
	{"src/location.c", "src/event.c", "src/grid.c"},
	{"src/memory.c"},
	{"src/copy3d.c"},
	{"preload/preload.c"},
}
