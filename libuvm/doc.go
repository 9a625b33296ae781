// Package libuvm carries the C sources of libuvm-preload.so, the library
// `uvm run` preloads under an unmodified program, inside every uvm binary,
// and builds the library from them on first use.
//
// Why it exists: `make build` puts bin/libuvm-preload.so beside bin/uvm,
// where `uvm run` finds it, but a uvm built with `go build ./cmd/uvm` or
// `go install` has no library beside it and so could not run any
// program. With the sources embedded (src/*.c, src/*.h, include/*.h,
// preload/preload.c: what the Makefile compiles into the library, and the
// headers it installs), such a uvm compiles the library itself, once, with the C
// compiler ($CC, else cc, else gcc) and the Makefile's flags, into the
// user's cache directory ($XDG_CACHE_HOME/softuvm, else
// ~/.cache/softuvm), in a subdirectory named after a hash of the sources,
// the flags and whether jemalloc was found. Later runs reuse that build;
// a uvm with changed sources builds its own.
//
// jemalloc: as the Makefile does, the builder compiles a one-line file
// that includes <jemalloc/jemalloc.h>; if that works, preload.c is
// compiled with -DUVM_PRELOAD_JEMALLOC (it loads libjemalloc.so.2 with
// dlopen when a program runs, and is never linked with it), else
// without. The check runs every
// time (it takes a few tens of milliseconds), so that installing or
// removing jemalloc selects another build rather than reusing one that
// no longer matches the machine.
//
// StaticDir builds libuvm.a from the same sources (without the preload's
// interposer) beside a copy of uvm.h and uvm_cuda.h, cached the same way:
// `uvm bench grid` links its C program with it.
//
// This package imports nothing of the module; package cli uses it only
// when no library is found in the places it looks first, and for the
// benchmarks' C programs.
package libuvm
