// Package block is softuvm's block engine: what moves pages between
// locations (the host, each device) and decides how. The fault server
// (internal/server) runs it over userfaultfd and memfds; the policy lab
// (lab) runs the same engine over page tables simulated in memory, so
// that a replay of a trace is the server's own decisions, not a copy of
// them. docs/architecture.md describes the whole; this is a map of the
// package.
//
// # What it holds
//
// Residency: a Range is one allocation, cut into 2 MiB blocks (Block)
// whose residency (which locations hold a valid copy of each page),
// advice, remote mappings (which file each device view maps over each
// page: remote.go), thrashing state, refault stamps and record of 2 MiB
// folios are guarded by the block's lock. A Mover carries every move of
// one block with that lock held (mover.go): it collapses read-duplicated
// pages, reserves room (evicting: evict.go), cuts what moves into runs,
// chooses each run's way in (a whole block as one 2 MiB folio, a whole
// block installed, 4 KiB pages, zero pages: whole.go) and does the
// bookkeeping. Read duplication and clean eviction (readdup.go,
// clean.go), the resident core (workingset.go, over package
// internal/workingset), thrashing (thrash.go), read-ahead
// (readahead.go), minor-fault mapping (continue.go), advice and range
// attributes (advice.go), the staging area's slots and intents
// (staging.go) and the fault decision (fault.go: decideFault, pure and
// tested without a userfaultfd) are here too.
//
// # What it does not hold
//
// The kernel. A Range's Memory is the engine's only way to it: each
// operation on a location (install, transfer, copy a whole block,
// protect, unprotect, punch, rebuild in small folios, continue-map, and
// the facts the decisions need) is carried out by the server with
// ioctls, file operations, its copy engine and its staging file, or by
// the lab on masks. Sessions, views, handler threads, access counting,
// the guard, journals and the staging file's crash safety stay in the
// server; so do the refusals, the hint faults of user-space access
// counting and installs through a mapping that changes (the plans that
// Plan.Engine says are its caller's).
//
// # Import direction
//
// In the layers internal/lint checks (core < policy < workingset <
// block < lab < config < ... < server), the engine comes after
// internal/workingset and before the lab and the server, which both run
// it. It imports internal/core, policy, internal/workingset and devmem
// (for devmem.ErrArenaFull, the error a full location's reservation
// gives), and nothing of the server:
// TestEngineAndLabDoNotImportServer holds every dependency of it, direct
// or not, to that.
//
// # Policy and mechanism
//
// Every decision a course may change is a policy's (package policy: one
// Set, built once from its specs and handed to New); the numbers the
// mechanism runs by are policy.Mechanism: how many read-aheads of one
// range at once, the share of a block that makes a fault's move whole,
// how long a device's fault on a pinned page waits, and how eviction
// makes room (rounds, wait, pause).
//
// # Events
//
// The engine reports what it did once, where it happens, to one sink
// (sink.go): a fault served and its plan, pages arrived and left with
// their cause, evictions, thrashing's throttles and pins, protections
// and refaults, remote mappings. The sink feeds the policies (the
// eviction policy's Arrived and Left, the thrashing policy's Migrated),
// the ranges' counters, and then the observers its user adds: the
// server's traces, remapper and fault anatomy, the lab's Result. A new
// observer is one more Observer, not a call at every site.
//
// # Locks
//
// Lock order, outermost first (internal/server/doc.go places them among
// the server's):
//
//	Block (its mutex)     one 2 MiB block: every residency decision and the
//	                      kernel operations that carry it out. A mover
//	                      takes other blocks' locks only with TryLock
//	                      (eviction, protections' release), never waits
//	                      for one
//	Staging.mu            the staging file's free slots (a leaf)
//	workingset.Set        a processor's lists of blocks with protected pages
//	                      (a leaf, taken under block locks)
//
// Observers run under the block's lock: they must not block, take a
// block lock or call back into the engine. Counts that are atomics
// (the host's pages, reservations in flight, a range's sweep state and
// read-ahead) are read without a lock.
package block
