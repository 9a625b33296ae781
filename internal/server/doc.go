// Package server is softuvm's fault server: it owns every client's and
// device process's userfaultfd, the location files and the residency of
// every page, and serves faults on handler threads that never touch
// managed memory themselves. docs/architecture.md describes the whole;
// this is a map of the package.
//
// # Sessions and views
//
// A Server (server.go) has a session per connected process
// (session.go): a client, which hands over its userfaultfd and host file,
// or a monitor (`uvm stat`, `uvm info`). Every process that maps a
// session's ranges is a view (view.go): the client's, and each device
// process's, each with its own userfaultfd and handler threads. A
// managedRange is one allocation, cut into 2 MiB blocks whose residency
// (which locations hold a valid copy of each page) is guarded by the
// block's lock (residency.go). Location files are sparse memfds in which
// the page of address a sits at offset a.
//
// # The fault path
//
// One handler thread per CPU per session, pinned and blocked in read(2)
// (handler.go), kept waiting only on the CPUs the session's threads
// fault on (placement.go). A handler looks the address up in the
// session's immutable range table, locks the block, and serves the fault
// in two steps (fault.go): decideFault, a pure step from the fault, the
// block's state and the policies' hints to a plan, and serveFault, which
// carries the plan out. The mover (migrate.go) carries every move of one
// block, with its lock held, through the copy engine: it write-protects
// the source, reads it into a staging slot (staging.go), punches it, and
// only then installs the page at the destination and wakes the writers.
//
// # Policy and the rest of residency
//
// Advice (advice.go), read duplication (readdup.go), remote mappings and
// the background remapper that follows what faults change (remote.go),
// thrashing (thrash.go) and eviction (evict.go) ask the policies of
// package policy, chosen by ServerConfig; workingset.go measures
// refaults and keeps each processor's resident core (package
// internal/workingset), hiding its pages from the eviction policy. Device copies (memcpy.go) hand
// the client its device files; the copies themselves run in the client.
// Access counting (access.go) reads the eBPF counters of package bpf, or
// counts MINOR faults on remote mappings itself, arms hint faults and
// migrates regions whose counts cross the threshold; one fault in N is
// sampled for the fault anatomy (anatomy.go).
//
// # Surviving death
//
// The guard (guard.go) is a process beside the server that holds a
// duplicate of every userfaultfd, file, connection, listening socket, the
// staging file and each session's journal (journal.go). When the server
// dies the guard starts a new one, which takes over (adopt.go); a daemon
// can also be replaced in place (replace.go). ListenAndServe (spawn.go)
// runs `uvm serve`; StartServerProcess (run.go) runs `uvm run`'s server
// in a process of its own.
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
//	workingset.Set        a processor's lists of blocks with protected pages
//	                      (workingset.go; a leaf, taken under block locks)
//	launchState.mu        the launch model's running kernels and every range's
//	                      attachment and locks (a leaf; faults take it under a
//	                      block lock)
//	session.statsMu       the ranges whose statistics a sum reads, and the
//	                      session's retired statistics (a leaf)
//	deviceTrace.mu        one device process's report socket: read and
//	                      emitted under it, so that a session's end records
//	                      every report before its session_end (a leaf but
//	                      for trace.Recorder.mu)
//	deviceTraces.mu       a session's list of report sockets (a leaf)
//	trace.Recorder.mu     encoding one event into a trace's buffer (a leaf;
//	                      faults and moves emit under a block lock)
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
//
// docs/architecture.md quotes this lock order; keep the two identical.
package server
