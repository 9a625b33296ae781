// Package libuvm carries the C sources of libuvm-preload.so, the library
// `uvm run` preloads under an unmodified program, inside every uvm binary,
// and builds the library from them on first use.
//
// Why it exists: `make build` puts bin/libuvm-preload.so beside bin/uvm,
// where `uvm run` finds it, but a uvm built with `go build ./cmd/uvm` or
// `go install` has no library beside it and so could not run any
// program. With the sources embedded (src/*.c, src/*.h, include/*.h,
// preload/preload.c and preload/jemalloc_abi.h: exactly what the
// Makefile compiles into the library, and the headers it installs),
// such a uvm compiles the library itself, once, with the C compiler
// ($CC, else cc, else gcc) and the Makefile's flags, into the user's
// cache directory ($XDG_CACHE_HOME/softuvm, else ~/.cache/softuvm), in a
// subdirectory named after a hash of the sources and the flags. Later
// runs reuse that build; a uvm with changed sources builds its own.
//
// jemalloc: the library's managed heap needs jemalloc 5 when a program
// runs, never when it is built. preload/jemalloc_abi.h declares what it
// uses of jemalloc's interface, and the library loads libjemalloc.so.2
// (or UVM_JEMALLOC) with dlopen as the program starts. ProbeHeap asks
// the library, in a process started for that, whether that works in a
// given environment: `uvm run` asks before it starts a program, so as to
// say once for the whole run, not once per process, that the heap is not
// managed and why; `uvm doctor` asks too.
//
// StaticDir builds libuvm.a from the same sources (without the preload's
// interposer) beside a copy of uvm.h and uvm_cuda.h, cached the same way:
// `uvm bench grid` links its C program with it, and
// BuildProgramWithLibuvm a program with it (`uvm bench soak`'s C client).
//
// This package imports nothing of the module; package cli builds the
// library with it only where none is found in the places it looks first,
// probes the heap with it before every `uvm run` of the managed heap, and
// builds the benchmarks' C programs with it.
//
// The C files call each other one way, down the layers SourceLayers
// lists (layers.go): wire and session at the bottom, device processes,
// then streams, memory and events above them, the preload library on
// top. `make lint` checks every call (internal/lint TestLibuvmLayers).
package libuvm
