# softuvm: CUDA-style unified memory for CPU devices on Linux.
# `make help` lists the targets.

GO     ?= go
CC     ?= gcc
CFLAGS ?= -O2 -Wall -Wextra
BIN    := bin

.PHONY: all build demo test bench lint generate help clean

all: build demo ## build bin/uvm and bin/uvm-cfloor, then run `uvm demo`

build: ## build bin/uvm and the C fault-handler floor bin/uvm-cfloor
	$(GO) build -o $(BIN)/uvm ./cmd/uvm
	$(CC) $(CFLAGS) -o $(BIN)/uvm-cfloor cmd/uvm-cfloor/cfloor.c -lpthread

demo: build ## run `uvm demo`: allocate, touch, prefetch to a device and back
	$(BIN)/uvm demo

test: build ## run every test (as root: userfaultfd is root-only here)
	$(GO) vet ./...
	$(GO) test -count=1 -timeout 45m ./...

bench: build ## run the Go benchmarks, `uvm bench faults` and `uvm bench launch`
	$(GO) test -count=1 -run '^$$' -bench . -benchmem ./...
	$(BIN)/uvm bench faults
	$(BIN)/uvm bench launch

lint: ## gofmt, go vet, the import fence, and a tidy go.mod
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || { gofmt -l $$(git ls-files '*.go'); echo "gofmt would change the files above"; exit 1; }
	$(GO) vet ./...
	$(GO) test -count=1 -run TestImportFence ./internal/lint/
	$(GO) mod tidy -diff

generate: ## run go generate (nothing is generated yet: the eBPF objects come with the access-counter work)
	@echo "make generate: no generated code yet; the eBPF programs and their bpf2go objects arrive with the access counters"
	$(GO) generate ./...

help: ## list the targets
	@grep -E '^[a-z]+:.*## ' $(MAKEFILE_LIST) | sed -E 's/^([a-z]+):.*## (.*)/  \1\t\2/' | expand -t 12

clean: ## remove bin/
	rm -rf $(BIN)
