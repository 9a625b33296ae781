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
//	Eviction         clock, clock:regions, clock:copy, lru, 2q,    RegisterEviction
//	                 reuse (evict_*.go)
//	Thrashing        nvidia (thrash_nvidia.go)                     RegisterThrashing
//	AccessMigration  threshold (access_threshold.go)               RegisterAccessMigration
//
// Package policy/coursework holds two more, written the way a student
// writes one (an MRU eviction and a prefetch of every other page), with a
// test that runs them on a private server, and a uvm binary that links
// them in (policy/coursework/cmd/uvm-coursework) for C programs and
// daemons.
//
// Some policies can do more through an optional interface, asked for
// with a type assertion: a PrefetchPolicy that implements ReadAhead asks
// for the block after a host sweep's faulted one to be moved in the
// background (density does), and an Eviction that implements
// PageEviction or CleanCopying gives up pages rather than blocks, or
// keeps device copies of pages the host only read.
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
// *Names functions list what can be chosen. Together, with the numbers
// the block engine's mechanism runs by (Mechanism: read-ahead depth, the
// share of a block that makes a move whole, pin waits, eviction rounds
// and waits, ParseMechanism), they are Specs; NewSet builds a Set of
// them once, which a server (or a replay of a trace) hands to the block
// engine, the one place policies are built.
//
// # Where a policy must be registered
//
// A policy exists in a process once its init function has run there, and
// a fault server is another process: a re-execution of the program's own
// binary (a private server, and the servers that take over when one
// dies), or a uvm binary (a daemon, the server of `uvm run`, and a C
// program's private server). The rule:
//
//  1. Register the policy from an init function (RegisterEviction and
//     the others), in its own package or in package main, never later.
//  2. In a Go program, call uvm.Main() first in main. Go initializes
//     packages in import-path order among those whose imports are done,
//     and package uvm starts a re-executed server from its own init
//     function; a policy of package main, or of a package whose path
//     sorts after github.com/softuvm/softuvm/uvm, is not registered yet
//     at that point, and the servers of a program that registers such a
//     policy (in its configuration or per allocation, uvm.WithPrefetch)
//     wait for uvm.Main instead. A program that names such a policy in
//     its server's configuration but does not call uvm.Main gets an error
//     that names the policy and says so; one that names a policy nothing
//     registered gets an error listing the known ones.
//  3. For C programs and daemons, build a uvm binary of your own whose
//     main imports the policy's package and calls cli.Main (package cli;
//     policy/coursework/cmd/uvm-coursework is one), and use it: point
//     UVM_BIN at it for C programs' private servers, run its `serve` as
//     the daemon, or its `run` for unmodified programs. Its help and
//     `uvm info` list the policies it knows.
package policy
