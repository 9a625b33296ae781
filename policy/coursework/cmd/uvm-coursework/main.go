// Command uvm-coursework is the uvm command with the coursework policies
// linked in: a complete uvm (serve, run, stat, info, bench, demo) whose
// flags and UVM_* variables also accept the eviction policy "mru" and the
// prefetch policy "evens". It is how a course hands its policies to C
// programs and daemons: build it, then
//
//	UVM_BIN=/path/to/uvm-coursework UVM_EVICTION=mru ./c-program
//	uvm-coursework serve --eviction mru
//	uvm-coursework run --prefetch evens -- ./unmodified-program
//
// A course's own binary is this file with its own policies' package.
package main

import (
	"github.com/softuvm/softuvm/cli"
	_ "github.com/softuvm/softuvm/policy/coursework"
)

func main() { cli.Main() }
