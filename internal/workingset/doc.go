// Package workingset detects thrashing under memory pressure from
// refaults, and keeps the resident core that answers it: the
// bookkeeping that the fault server (internal/server) and the lab's
// replay (package lab) share, so that both act alike.
//
// A processor (the host under its budget, a device's arena) that must
// evict counts the pages it evicts: its eviction clock. Each page
// evicted keeps a stamp, the clock at its eviction (Linux keeps the same
// in the page cache's shadow entry, mm/workingset.c). When a fault
// brings the page back, the refault distance is the clock now less the
// stamp: the pages evicted in between. A page that comes back after
// fewer evictions than the processor holds was evicted too early: had
// the processor kept it instead of any of the pages evicted since, it
// would not have faulted. Many such refaults are thrashing: a program
// that loops over more pages than fit, whose victims are the pages it
// needs next, so that nearly every reference faults.
//
// The answer, a policy's decision (policy.Refaulting), is to protect
// the pages that come back soon: they form a resident core that
// eviction leaves alone, up to a limit a little under what the
// processor holds, and the rest of the working set takes turns in what
// is left. A loop larger than the processor then costs its excess a
// pass, as Belady's MIN does, rather than all of it. Protection ages:
// the pages protected in one generation (a number of evictions that the
// policy sets) stay protected until the end of the next one, so that a
// program whose working set moves on gets its room back.
//
// What is protected is hidden from the eviction policy: the server
// reports protected pages as having left the processor and reports them
// again, as arriving, when their protection ends. The policy sees, and
// orders, only the pages it may evict.
//
// Concurrency: a Block's state is guarded by the lock of the block it
// belongs to (the server's block.mu); a Set's counters are atomics and
// its lists of protected blocks have a lock of their own, a leaf.
//
// Import direction: workingset comes after policy and before the block
// engine in the layers internal/lint checks (core < policy < workingset <
// block < lab < ... < server), and imports only internal/core; the engine
// (internal/block) keeps its bookkeeping, for the server and the lab
// alike.
package workingset
