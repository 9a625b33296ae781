// Package lint holds checks on the repository itself that run with the
// tests: the import fence that keeps raw system calls in the packages
// that own the kernel boundary; the layers, an order of the runtime's
// packages that imports follow (fence_test.go); the public API of
// package uvm, which shows no type of the server, the wire protocol, the
// copy engine or the device runtime (api_test.go), and which the
// benchmarks measure through, importing none of those (fence_test.go);
// the sizes: no package over 8,000 lines of source, no function of the
// command or the benchmarks over 100 (size_test.go); and the layers of
// libuvm's C files, which call each other one way (libuvm_test.go).
package lint
