// Package cli is the uvm command (serve, run, stat, info, bench, demo) as
// a library, so that a course can build its own uvm with its policies
// linked in. cmd/uvm is this package's Main and nothing else; a binary
// with more policies is the same few lines plus an import:
//
//	package main
//
//	import (
//		"github.com/softuvm/softuvm/cli"
//		_ "example.org/course/mypolicies" // registers them in init functions
//	)
//
//	func main() { cli.Main() }
//
// Every policy the binary's packages register is then a choice of its
// flags and variables (--eviction, UVM_EVICTION, ...), listed by its
// help and by `uvm info`. Its private fault servers, its `uvm serve`
// daemon, the server `uvm run` starts for a program, and the servers
// that take over from them are all this binary, so they know the
// policies too. A C program uses it by naming it in UVM_BIN (libuvm
// starts its private server from that binary) or by talking to its
// daemon; under `uvm run` a program's libuvm is pointed at it already.
// policy/coursework/cmd/uvm-coursework is such a binary.
package cli
