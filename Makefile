# softuvm: CUDA-style unified memory for CPU devices on Linux.
# `make help` lists the targets.

GO     ?= go
CC     ?= gcc
CFLAGS ?= -O2 -Wall -Wextra
BIN    := bin
PREFIX ?= /usr/local

# libuvm: the C library (uvm.h), static and shared, and the preload
# library `uvm run` puts under unmodified programs. Built with
# -fvisibility=hidden: only uvm.h's names (and the interposed allocator
# functions in the preload library) are exported.
LIBUVM_CFLAGS := $(CFLAGS) -std=gnu11 -fPIC -fvisibility=hidden -pthread -Ilibuvm/include \
	-DUVM_BINDIR='"$(PREFIX)/bin"'
LIBUVM_SRC := $(wildcard libuvm/src/*.c)
LIBUVM_OBJ := $(patsubst libuvm/src/%.c,$(BIN)/obj/%.o,$(LIBUVM_SRC))
PRELOAD_OBJ := $(BIN)/obj/preload.o
# The preload library serves a program's small allocations from jemalloc
# arenas over managed memory (its "managed heap"). It declares the part
# of jemalloc 5 it uses itself (libuvm/preload/jemalloc_abi.h), so that
# building needs no jemalloc, and loads libjemalloc.so.2 when a program
# starts: where that is missing, `uvm run` says so once and the small
# allocations stay in glibc's.
PRELOAD_SRC := libuvm/preload/preload.c libuvm/preload/jemalloc_abi.h
LIBS := $(BIN)/libuvm.so $(BIN)/libuvm.a $(BIN)/libuvm-preload.so

.PHONY: all setup build lib demo test fuzz bench lint generate help clean install

all: setup build demo ## set up (below), build bin/uvm, bin/uvm-cfloor and libuvm, then run `uvm demo`

# What the build and `uvm run` need (Go, a C compiler, pkg-config,
# jemalloc's run-time library), installed where missing as root with
# apt-get, else the one command that installs it, and make stops.
setup: ## find Go, a C compiler, pkg-config and libjemalloc2; install what is missing (root, apt-get) or name the command that does
	@CC='$(CC)' GO='$(GO)' sh scripts/setup.sh

build: lib ## build bin/uvm, the C fault-handler floor bin/uvm-cfloor and libuvm
	$(GO) build -o $(BIN)/uvm ./cmd/uvm
	$(CC) $(CFLAGS) -o $(BIN)/uvm-cfloor cmd/uvm-cfloor/cfloor.c -lpthread

lib: $(LIBS) ## build libuvm.so, libuvm.a and libuvm-preload.so into bin/

$(BIN)/obj/%.o: libuvm/src/%.c libuvm/src/internal.h libuvm/src/wire_gen.h libuvm/include/uvm.h
	@mkdir -p $(BIN)/obj
	$(CC) $(LIBUVM_CFLAGS) -c -o $@ $<

$(PRELOAD_OBJ): $(PRELOAD_SRC) libuvm/src/internal.h libuvm/src/wire_gen.h libuvm/include/uvm.h
	@mkdir -p $(BIN)/obj
	$(CC) $(LIBUVM_CFLAGS) -Ilibuvm/src -c -o $@ $<

$(BIN)/libuvm.so: $(LIBUVM_OBJ)
	$(CC) -shared -pthread -Wl,-soname,libuvm.so -o $@ $^

$(BIN)/libuvm.a: $(LIBUVM_OBJ)
	rm -f $@
	ar rcs $@ $^

$(BIN)/libuvm-preload.so: $(LIBUVM_OBJ) $(PRELOAD_OBJ)
	$(CC) -shared -pthread -Wl,-soname,libuvm-preload.so -o $@ $^

install: build ## install uvm, uvm.h, libuvm and uvm.pc under PREFIX (default /usr/local)
	install -d $(DESTDIR)$(PREFIX)/bin $(DESTDIR)$(PREFIX)/include $(DESTDIR)$(PREFIX)/lib/pkgconfig
	install -m 755 $(BIN)/uvm $(DESTDIR)$(PREFIX)/bin/uvm
	install -m 644 libuvm/include/uvm.h libuvm/include/uvm_cuda.h $(DESTDIR)$(PREFIX)/include/
	install -m 755 $(BIN)/libuvm.so $(BIN)/libuvm-preload.so $(DESTDIR)$(PREFIX)/lib/
	install -m 644 $(BIN)/libuvm.a $(DESTDIR)$(PREFIX)/lib/
	sed -e 's|@PREFIX@|$(PREFIX)|g' libuvm/uvm.pc.in > $(DESTDIR)$(PREFIX)/lib/pkgconfig/uvm.pc

demo: build ## run `uvm demo`: allocate, touch, prefetch to a device and back
	$(BIN)/uvm demo

test: build ## run every test (as root: userfaultfd is root-only here), then fuzz the decoders for a minute
	$(GO) vet ./...
	$(GO) test -count=1 -timeout 45m ./...
	$(MAKE) fuzz

# A count, not a duration: with a duration Go 1.26's fuzz coordinator can
# report its own deadline as a failure ("context deadline exceeded", no
# crasher written; golang/go#75804, fixed in Go 1.27). 300,000 runs take
# 15-25 s here.
FUZZTIME ?= 300000x
fuzz: ## fuzz the decoders of every peer, FUZZTIME each: requests (server, devices), replies (clients, server), the guard's messages
	@for f in internal/wire:FuzzParseRequest internal/wire:FuzzParseReply internal/server:FuzzGuardMessage; do \
		pkg=$${f%%:*}; fn=$${f#*:}; \
		echo "fuzz $$fn in $$pkg for $(FUZZTIME)"; \
		$(GO) test ./$$pkg -run '^$$' -fuzz "^$$fn\$$" -fuzztime $(FUZZTIME) || exit 1; \
	done

bench: build ## run the Go benchmarks and `uvm bench` faults, launch, memcpy and access
	$(GO) test -count=1 -run '^$$' -bench . -benchmem ./...
	$(BIN)/uvm bench faults
	$(BIN)/uvm bench launch
	$(BIN)/uvm bench memcpy
	$(BIN)/uvm bench access

lint: ## gofmt, go vet, the import fence, uvm's API hiding internal types, libuvm's layers, packages under 8,000 lines and cli's and the benchmarks' functions under 100, a tidy go.mod, and libuvm's wire constants as Go defines them
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || { gofmt -l $$(git ls-files '*.go'); echo "gofmt would change the files above"; exit 1; }
	$(GO) vet ./...
	$(GO) test -count=1 -run 'TestImportFence|TestLayers|TestEngineAndLabDoNotImportServer|TestBenchmarksMeasureThroughTheClient|TestPublicAPIHidesInternals|TestPackageSize|TestFunctionLength|TestLibuvmLayers|TestParseC' ./internal/lint/
	$(GO) mod tidy -diff
	$(GO) run ./internal/wire/internal/gencheader -check -o libuvm/src/wire_gen.h

# The eBPF objects are built with this clang (Debian's clang-16, with
# llvm-16 and libbpf-dev for bpf_helpers.h); the generated files are
# committed, so that building needs no clang.
BPF_CLANG ?= clang-16

generate: ## rebuild the eBPF programs and their Go bindings (bpf2go; needs $(BPF_CLANG), llvm-16 and libbpf-dev)
	@command -v $(BPF_CLANG) >/dev/null || { echo "make generate: $(BPF_CLANG) is not installed (apt-get install clang-16 llvm-16 libbpf-dev)"; exit 1; }
	BPF_CLANG=$(BPF_CLANG) $(GO) generate ./...

help: ## list the targets
	@grep -E '^[a-z]+:.*## ' $(MAKEFILE_LIST) | sed -E 's/^([a-z]+):.*## (.*)/  \1\t\2/' | expand -t 12

clean: ## remove bin/
	rm -rf $(BIN)
