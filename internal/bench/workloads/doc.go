// Package workloads is a set of real programs from Debian packages that
// allocate in small pieces (hash tables, trees, page caches, interpreter
// objects), each with a deterministic input generated here with a fixed
// seed, its command line and a size knob; and two checkers, memtester and
// stress-ng, that verify the memory they write.
//
// The set is what integration/workloads_test.go runs under `uvm run`
// (output byte for byte against a plain run, the share of memory that is
// managed, evictions) and what `uvm bench run` times against a plain run
// and against a memory cgroup with zram swap. All adds two compressors,
// gzip and xz -0, on a generated web-server log (WriteLog): their memory
// is managed only with a `uvm run --min-size` of their own (a Program's
// UVMFlags), and `uvm bench cliff` draws their budget curves with the
// set's.
//
// A Program describes one program; Prepare writes its input into a
// directory for a size and returns a Workload; a Workload runs plain
// (RunPlain: wall time and, through the PeakWrapper that
// BuildPeakWrapper builds, the program's own peak RSS), under
// `uvm run` (RunUVM: the run's --stats-json report parsed into RunStats),
// or under any wrapper command that ends by exec'ing the program
// (RunWrapped: a memory cgroup, say). Compare checks two runs' standard
// output and output files byte for byte; Check checks one run's exit
// status and, for the checkers, that they reported no error.
//
// Each run has a working directory of its own: the program's standard
// output goes to a file there, and so do the output files it writes
// (named relative to it), so that runs of the same workload never share
// an output and outputs of hundreds of megabytes are not kept in memory.
package workloads
