// Package bench is `uvm bench`: each benchmark measures something of
// softuvm against a baseline taken in the same run, and returns a report
// whose JSON is what `uvm bench NAME --json` prints and whose Print
// writes its table. Package cli reads the command's flags into a
// benchmark's options and prints its report. The Parse functions here
// read the list-valued flags whose vocabulary a benchmark defines (its
// schedules, its programs, its budgets); they, and the checks of the
// paths a benchmark writes its figures to (--plot, --png), name the flag
// in their errors.
//
// One file a benchmark, with the options, the measurement and the
// report of `uvm bench NAME`:
//
//	faults.go    Faults: one-page fault latency against a C handler, first touch, device to host
//	launch*.go   Launch: the seed's launch-and-touch, null launches against a pipe round trip, dirty tracking
//	grid*.go     Grid: grid launches, barriers and shared memory against the thread launch, in C and Go
//	memcpy*.go   Memcpy: the copy engine against memcpy, by producers and by size
//	access.go    Access: the access counters' cost, delayed migration, the fault anatomy
//	restart.go   Restart: a server killed under a client, the pause and the rebuild
//	oversub.go   Oversub: a C sweep over thrice its host budget, against plain and a memory cgroup
//	run.go       Run: real programs (package workloads) under uvm run, against plain and a memory cgroup
//	cliff*.go    Cliff: the budget curve, against plain, LRU and Belady's MIN
//
// and, in package soak beside it, `uvm bench soak`: clients checking every
// byte while servers, device processes and guards are killed;
//
// and what they share: where a benchmark says what it is doing
// (progress.go), the machine a report names (machine.go), medians
// (stats.go), what they do to host memory (memory.go), the kernels they
// launch (kernels.go, registered with every binary that links this
// package, so that its devices know them), the memory cgroup with zram
// swap that is the kernel's baseline for a host budget (cgroup.go, whose
// probes `uvm doctor` reuses), running a program's variants in
// alternation and reading the sizes of its inputs (variants.go), and the
// figures' files (plot.go). The C
// programs some benchmarks build at run time are in csrc/, embedded.
//
// The benchmarks measure through the public client (package uvm) and the
// uvm command it starts; they import nothing of the server, the wire
// protocol, the copy engine or the device runtime (internal/lint checks
// it). Speed goals live here, in the reports' goal fields, never in
// timed unit tests.
package bench
