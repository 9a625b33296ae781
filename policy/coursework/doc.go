// Package coursework holds two policies written the way a student writes
// one, each in one file against package policy: an eviction policy that
// evicts the block that arrived last (MRU), and a prefetch policy that
// brings every other page of the faulted block. Importing the package
// registers them as "mru" and "evens"; its test runs them on a private
// server and checks, by the server's statistics, that they were used.
// cmd/uvm-coursework is the uvm command with them linked in, for C
// programs (UVM_BIN) and daemons.
package coursework
