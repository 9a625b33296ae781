package bpf

// The generated Go and object files are committed, so that building needs
// no clang; `make generate` rebuilds them with the clang the Makefile pins.
//go:generate go tool bpf2go -cc ${BPF_CLANG} -cflags "-O2 -g -Wall -Werror -I/usr/include/x86_64-linux-gnu" -target amd64 -type crossing -type resume counters counters.c
