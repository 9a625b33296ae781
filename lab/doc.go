// Package lab is softuvm's policy lab: it replays the policies of
// package policy (the server's own implementations, not copies) over a
// recorded trace (package trace) by running the fault server's own
// block engine (internal/block) over memory simulated in page masks
// (memory.go), and scores them against oracles that know the trace's
// future.
//
// A replay serves the trace's references (the faults the recorded run
// took, and the pages its access mode saw touched) with the policies
// under test, through the engine: its fault decision, its prefetch
// context, whole-block moves of large folios, the soft host budget and
// hard device capacities, eviction and the resident core, read-ahead,
// clean eviction. What the recorded run's own policies
// did (its migrations, evictions, prefetches) is not replayed, only
// counted (Result.Recorded) and timed (Costs); what the client asked for
// (allocations, frees, prefetches, advice) is done again.
//
// A touch that found its page in place and was not sampled by the access
// mode is not in a trace, so a replay sees what the recorded policies
// made fault, plus the samples: a policy that keeps fewer pages in place
// than the recorded one is judged on those references only. Recording
// with the access mode on (`--trace-access`) narrows that gap.
//
// The oracles are "opt" (eviction: Belady's MIN) and "oracle" (prefetch:
// exactly the pages of the block needed soon). The course kit (lab/course)
// builds on this package.
//
// RefStream (bound.go) is the other view: a program's every data
// reference, read from valgrind's lackey tool (or, for a program whose
// references are known, made page by page: PageRefs), on which LRU's and
// MIN's misses are counted per page or granule at any capacity (uvm lab
// bound, uvm bench cliff): the bound of eviction on all a program
// touched, not only on what a trace holds. MeasureBound (bound_run.go)
// makes one: it runs the program once under lackey, with a small library
// preloaded (built at run time by libuvm's C compiler) that leaves the
// program's maps behind at exit, so that only its heap's references
// count.
//
// Import direction: the lab comes right after the block engine in the
// layers internal/lint checks (core < policy < workingset < block < lab
// < config < ... < server). It imports the engine (internal/block),
// policy, internal/core, trace and libuvm (which builds the library
// MeasureBound preloads), and nothing of the server
// (TestEngineAndLabDoNotImportServer): a replay runs the server's own
// engine without a server.
package lab
