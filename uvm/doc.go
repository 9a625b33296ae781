// Package uvm is softuvm's unified memory: the fault server and the Go
// client library.
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
// # Processes
//
// The faults of a client are served by another process, the fault server:
// a Go fault handler cannot serve faults its own goroutines take (one
// blocked in a fault inside memmove cannot be preempted, and the garbage
// collector's stop-the-world would wait for it forever). A client uses a
// daemon (`uvm serve`) when one listens on DefaultSocketPath, or starts a
// private server by re-executing its own binary; this package's init
// function runs the server in that process. The client hands the server
// its userfaultfd and its host file over a Unix socket and keeps no copy
// of the userfaultfd. The server starts a guard process that holds
// duplicates of the userfaultfds: if the server dies, the guard turns the
// clients' faults into SIGBUS with a message, instead of letting the
// kernel fill the holes with zeros.
//
// # Files and views
//
// Every location of a managed range has a file: the client's host file (a
// memfd the client creates) and one file per device (created by the
// server, its pages accounted to the device's arena). The page of address
// a lives at offset a in each of them, so contiguous pages are contiguous
// in every file and allocation needs no offset bookkeeping. The client
// maps its host file over each range and the server registers the range
// for MISSING faults (a hole: first touch, or the page lives on a device)
// and write-protect faults (a page held still while it is copied away).
//
// # The fault path
//
// Each session has a handler thread per CPU, pinned and blocked in
// read(2) on its userfaultfd, so that a fault is served on the CPU that
// took it (see uffd.Reader). A handler looks the address up in the
// session's range table (an immutable snapshot, read without a lock),
// locks the 2 MiB block, asks the range's PrefetchPolicy which other pages
// to bring, and resolves with UFFDIO_ZEROPAGE (pages never touched) or
// pread from the device file plus UFFDIO_COPY (pages on a device), then
// punches the device file, which frees those pages. It never waits for the
// client or any other process.
//
// # Devices
//
// A device is a process with its own page table: a re-execution of the
// program (which must call Main first in main) that maps every managed
// range at the same address from the device's file and runs kernels,
// registered by name with RegisterKernel, on its worker threads. Its
// faults are served by the server like the client's. Launch and the
// synchronizations go from the client to the device directly, one socket
// per stream (devproc.go); errors of kernels and the death of the process
// come back from the next synchronize, and the next launch starts a new
// process. Malloc, HostAlloc and HostRegister make device memory and
// pinned host memory; Memcpy moves data between every kind.
//
// # Advice and remote mappings
//
// MemAdvise records cuMemAdvise advice per page. Read-mostly pages get a
// write-protected copy at each reader; a write keeps the writer's copy
// only (readdup.go). A device view maps its own file except where policy
// wants it to reach data where it lies (preferred location, accessed-by,
// pinned thrashing pages, device and pinned host memory): there it maps
// another location's file, and its faults bring the page into that file.
// Only the device process can change its mappings, so they change on the
// control path and in a background remapper, never while a fault waits
// (remote.go). The host view always maps the host file: a CPU cannot map
// device memory.
//
// # Access counters
//
// Each view's process has its faults counted per 64 KiB region, by the
// eBPF program of package bpf or, without it, by the server from MINOR
// faults on device views' remote mappings. An access loop per server
// drops device views' remote mappings on a period (hint faults), so that
// accesses keep being counted; migrates a region whose count reaches the
// threshold to the processor that reached it (delayed migration) where
// accessed-by advice made the mapping remote; and halves the counts on a
// longer period. One fault in N is sampled for the fault anatomy
// (access.go, accesspolicy.go, anatomy.go).
//
// # Locks
//
// Lock order, outermost first:
//
//	Server.sessionsMu     the session table
//	session.mu            control operations of one session: alloc, free
//	view.reqMu            requests to one device process (map, unmap); held
//	                      across a remap, which takes block locks
//	block.mu              one 2 MiB block: every residency decision and the
//	                      kernel operations that carry it out
//	view.use (read)       a view used by someone other than its handlers
//	session.filesMu       creation of a session's device files
//	session.journalMu     the session's journal, and the order its records
//	                      reach the guard
//	guardLink.mu          messages to the guard (a leaf)
//	stagingArea.mu        the staging file's free slots (a leaf)
//	accessState.mu        the views counted and user-space counts (a leaf)
//
// Fault handlers take block.mu (and what follows it), never session.mu or
// view.reqMu, and never wait for another process. Nobody holds view.use
// while waiting for a block lock. Prefetch, advice and range-attribute
// queries run without session.mu, block by block; free marks a range
// freed under each block lock, and a handler or prefetch that then takes
// a block lock checks managedRange.freed first. Statistics are atomics,
// updated before a block is unlocked, and a query takes each block lock
// once (quiesce) so that it never misses a fault the client has already
// seen served.
package uvm
