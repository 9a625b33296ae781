// Package server is softuvm's fault server: it owns every client's and
// device process's userfaultfd and the location files, and serves faults
// on handler threads that never touch managed memory themselves. What
// moves pages and decides how is the block engine (package block), which
// the server runs over the kernel and the lab over simulated memory.
// docs/architecture.md describes the whole; this is a map of the
// package.
//
// # Sessions and views
//
// A Server (server.go) has a session per connected process
// (session.go): a client, which hands over its userfaultfd and host file,
// or a monitor (`uvm stat`, `uvm info`). Every process that maps a
// session's ranges is a view (view.go): the client's, and each device
// process's, each with its own userfaultfd and handler threads. A
// managedRange is one allocation: the engine's range (block.Range, whose
// 2 MiB blocks keep the residency under each block's lock) and what the
// server keeps beside it (residency.go). Location files are sparse
// memfds in which the page of address a sits at offset a.
//
// # The fault path
//
// One handler thread per CPU per session, pinned and blocked in read(2)
// (handler.go), kept waiting only on the CPUs the session's threads
// fault on (placement.go). A handler looks the address up in the
// session's immutable range table, locks the block, and has the engine
// serve the fault (fault.go: block.Mover.ServeFault decides and carries
// the plan out); the plans the engine leaves to the server are refusals,
// hint faults (access.go) and installs through a mapping that changes
// (servePending). A session is the engine's Memory (memory.go): the
// kernel's side of every move (migrate.go: write-protect the source,
// read it into a staging slot, punch it, and only then install the page
// at the destination and wake the writers; whole.go: a block as one
// 2 MiB folio; continue.go: UFFDIO_CONTINUE), through the copy engine.
//
// # What else the server does
//
// Advice, prefetch and discard (advice.go, migrate.go, discard.go) check
// their requests and have the engine act block by block; the remapper
// (remote.go) has device processes map what the engine says they should;
// the launch coherence model (coherence.go) hands memory over at
// launches. The engine's events (events.go) feed the traces (trace.go),
// the remapper and the fault anatomy (anatomy.go). Device copies
// (memcpy.go) hand the client its device files; the copies themselves
// run in the client. Access counting (access.go) reads the eBPF counters
// of package bpf, or counts MINOR faults on remote mappings itself, arms
// hint faults and migrates regions whose counts cross the threshold; the
// use observer (watch.go) unmaps what an eviction policy watches.
//
// # Surviving death
//
// The guard (package guard; the server's end of it is guard.go) is a
// process beside the server that holds a duplicate of every
// userfaultfd, file, connection, listening socket, the staging file and
// each session's journal. When the server dies the guard starts a new
// one, which takes over (adopt.go); a daemon can also be replaced in
// place (replace.go). ListenAndServe (spawn.go) runs `uvm serve`;
// StartServerProcess (run.go) runs `uvm run`'s server in a process of
// its own.
//
// # Locks
//
// Lock order, outermost first:
//
//	Server.sessionsMu     the session table
//	session.mu            control operations of one session: alloc, free
//	view.reqMu            requests to one device process (map, unmap); held
//	                      across a remap, which takes block locks
//	block.Block           one 2 MiB block (package block, its mutex): every
//	                      residency decision and the kernel operations that
//	                      carry it out; a mover takes another block's only
//	                      with TryLock (eviction, protections ending)
//	view.use (read)       a view used by someone other than its handlers
//	session.filesMu       creation of a session's device files
//	session.journalMu     the session's journal, and the order its records
//	                      reach the guard
//	guard.Link.mu         messages to the guard (a leaf)
//	block.Staging.mu      the staging file's free slots (a leaf)
//	accessState.mu        the views counted and user-space counts (a leaf)
//	workingset.Set        a processor's lists of blocks with protected pages
//	                      (the engine's resident core; a leaf, taken under
//	                      block locks)
//	remapper.mu           the blocks whose device mappings the remapper is
//	                      to reconcile (a leaf; the engine's events of a
//	                      block, under its lock, enqueue them)
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
// a block lock checks block.Range.Freed first. Statistics are atomics,
// counted by the engine's sink before a block is unlocked, and a query
// takes each block lock once (Quiesce) so that it never misses a fault the
// client has already seen served. The engine's observers run under the
// block's lock, so they take only leaves.
//
// docs/architecture.md quotes this lock order; keep the two identical.
package server
