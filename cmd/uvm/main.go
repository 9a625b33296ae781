// Command uvm runs, inspects and measures softuvm, CUDA-style unified
// memory for CPU "devices" on Linux. It is package cli's Main: a binary
// that links more policies in is built the same way (see package cli).
package main

import "github.com/softuvm/softuvm/cli"

func main() { cli.Main() }
