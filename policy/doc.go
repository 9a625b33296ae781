// Package policy holds the decisions of softuvm's fault server that a
// course asks students to replace: which pages a fault brings along
// (prefetch), which blocks leave a full processor (eviction), what to do
// with pages that bounce between processors (thrashing), and which
// counted pages the access counters migrate (access-counter migration).
// The server calls them; they see the server only through the types of
// this package (Block, PageMask, Processor, Clock, Cause and each
// policy's context), never its internals.
//
// # Writing a policy
//
// Each policy is one file: a type that implements one interface, and an
// init function that registers it by name. The built-in ones are the
// examples to read first:
//
//	interface        built-in (file)                               register with
//	PrefetchPolicy   density, window, none (prefetch_*.go)         RegisterPrefetchPolicy
//	Eviction         lru (evict_lru.go)                            RegisterEviction
//	Thrashing        nvidia (thrash_nvidia.go)                     RegisterThrashing
//	AccessMigration  threshold (access_threshold.go)               RegisterAccessMigration
//
// Package policy/coursework holds two more, written the way a student
// writes one (an MRU eviction and a prefetch of every other page), with a
// test that runs them on a private server.
//
// Each interface's documentation says when the server calls it, with
// which lock held, and what it must not do: a policy runs on the fault
// path or beside it, so it must be safe for concurrent use, must not
// block, and must not call back into the server.
//
// # Choosing a policy
//
// A policy is selected by name, for the whole server, with a flag of
// `uvm serve`, `uvm run` and `uvm demo` or the environment variable of
// the same name (which a private server inherits from its program):
//
//	--prefetch NAME[:ARG]            UVM_PREFETCH        (also per allocation: uvm.WithPrefetch)
//	--eviction NAME[:ARG]            UVM_EVICTION
//	--thrashing policy=NAME,...      UVM_THRASHING
//	--access-policy migration=NAME   UVM_ACCESS_POLICY
//
// The settings are plain data (PrefetchSpec, ThrashingSpec, AccessPolicy,
// an eviction name in the server's configuration), parsed by
// ParsePrefetchSpec, ParseThrashingSpec and ParseAccessPolicy; the
// *Names functions list what can be chosen.
//
// Register from an init function of a package the program imports: a
// private fault server is a re-execution of the same program and must
// know the policy too, and a daemon or a C program's server must be a
// binary that registers it.
package policy
