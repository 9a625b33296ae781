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
//  1. wire.c: the protocol's messages.
//  2. session.c: the connection to the fault server, the allocations, the
//     current device and which devices exist.
//  3. coherence.c: the launch coherence model's requests; devproc.c: the
//     device process's side (a fork of the program at a device's first
//     launch).
//  4. device.c: the program's side of device processes: starting them,
//     their sockets, writing launches, synchronizing, deaths and a
//     device's failure, how synchronizes wait.
//  5. stream.c: streams, their order, launches, queued work, marks and
//     the synchronizes; props.c: device attributes and properties, peers,
//     memory information, pointer attributes.
//  6. memory.c: allocation, copies, fills, prefetch, advice, attachment
//     (in stream order); event.c: events, on marks.
//  7. preload/preload.c: the interposer of `uvm run`.
var SourceLayers = [][]string{
	{"src/error.c", "src/sysalloc.c"},
	{"src/wire.c"},
	{"src/session.c"},
	{"src/coherence.c", "src/devproc.c"},
	{"src/device.c"},
	{"src/stream.c", "src/props.c"},
	{"src/memory.c", "src/event.c"},
	{"preload/preload.c"},
}
