// Package device is the runtime of a Go device process: a re-execution of
// the program (which calls uvm.Main first) that stands for one device.
//
// RunDevice reserves the managed address window, hands the server a
// userfaultfd of its own, maps every managed range of its client from the
// device's file at the same addresses (or, where the server says so,
// another location's file: a remote mapping) and registers it, then
// serves three kinds of requests: the server's (map and unmap ranges,
// drop the page-table entries of remote mappings for hint faults), the
// client's control connection (new streams), and one connection per
// stream (launches, synchronizations, its end), whose launches run in
// order on the goroutine that reads them, on a thread that follows the
// launching CPU; wider kernels are spread over the device's pinned worker
// threads. A kernel's panic is reported by the next synchronize, naming
// the kernel, the device and the thread.
//
// Kernels are found by name in this process's registry (RegisterKernel,
// LookupKernel), which the program's init functions fill in every
// process alike; package uvm's RegisterKernel writes here.
package device
