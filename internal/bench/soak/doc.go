// Package soak is `uvm bench soak`: for a given time, a daemon shared by
// Go and C clients that check every byte they read against shadow
// copies, and unmodified programs under `uvm run` whose output is
// compared with a plain run's, while it kills the daemon's server, the
// clients' device processes, the guards, and the servers and guards of
// the `uvm run`s, one at a time, each after the last one's recovery was
// seen. Run reports what the clients did, the kills by kind and their
// recoveries, and every failure: a wrong byte with the operations that
// touched it, a hang, a crash, an unexpected error, a kill not recovered
// from, or a server that counted or logged a poisoned, lost or stray
// page.
//
//	soak.go     Options, Report, Run: the daemon, the clients' start and end, the final checks
//	client.go   the Go client (`uvm __soak-client`, ClientMain): its operations, shadows and checks
//	csrc/       the C client, built at run time against libuvm.a (libuvm.BuildProgramWithLibuvm)
//	clients.go  the Go and C clients as the soak sees them: their lines, hangs, their end
//	kill.go     the kills: what is killed, in which order, and how each recovery is seen
//	run.go      the clients that run programs under uvm run, and their outputs' checks
//
// It sits beside package bench, not in it, as the benchmarks do not
// need it (nor it them, but for the machine a report names); like them
// it works through the public client and the uvm command, and asks
// servers for their counters with `uvm stat`, as a user would.
package soak
