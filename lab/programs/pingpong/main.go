// Command pingpong is the policy lab's thrashing workload: the host and
// device 0 take turns writing every element of one managed array, so its
// pages bounce between host memory and the device's arena. In each round
// a kernel on device 0 adds 2 to every element (one thread, start to end),
// the host waits for it, then reads and adds 1 to every element. With
// device 0's arena smaller than the array (UVM_ARENA_SIZE) the device also
// evicts to the host as it goes; with a host budget below it, the host.
//
//	pingpong [MIB [ROUNDS]]     (default 32 MiB, 24 rounds)
//
// It prints the rounds and a checksum, and exits 1 if an element is not
// 3 times the rounds. Record it with UVM_TRACE (docs/traces.md), as
// lab/programs/record.sh does:
//
//	go build -o pingpong lab/programs/pingpong/main.go
//	UVM_SERVER=private UVM_ARENA_SIZE=16MiB UVM_TRACE=pingpong.uvmtrace ./pingpong 32 96
package main

import (
	"encoding/binary"
	"fmt"
	"log"
	"os"
	"strconv"

	"github.com/softuvm/softuvm/uvm"
)

const kernel = "softuvm.lab.programs.pingpong"

func init() {
	// params: the array's address and its length in uint32s.
	uvm.MustRegisterKernel(kernel, func(tid, n int, p []byte) {
		addr, count := uintptr(binary.LittleEndian.Uint64(p)), int(binary.LittleEndian.Uint64(p[8:]))
		a := uvm.SliceAt[uint32](addr, count)
		for i := tid; i < count; i += n {
			a[i] += 2
		}
	})
}

func main() {
	uvm.Main()
	log.SetFlags(0)
	log.SetPrefix("pingpong: ")
	mib, rounds := 32, 24
	var err error
	if len(os.Args) > 1 {
		if mib, err = strconv.Atoi(os.Args[1]); err != nil || mib < 1 {
			log.Fatalf("bad size %q: want MiB, at least 1", os.Args[1])
		}
	}
	if len(os.Args) > 2 {
		if rounds, err = strconv.Atoi(os.Args[2]); err != nil || rounds < 1 {
			log.Fatalf("bad rounds %q", os.Args[2])
		}
	}

	s, err := uvm.Default()
	if err != nil {
		log.Fatal(err)
	}
	defer s.Close()
	alloc, err := s.MallocManaged(int64(mib) << 20)
	if err != nil {
		log.Fatal(err)
	}
	count := int(alloc.Size() / 4)
	a := uvm.SliceAt[uint32](alloc.Addr(), count)
	params := make([]byte, 16)
	binary.LittleEndian.PutUint64(params, uint64(alloc.Addr()))
	binary.LittleEndian.PutUint64(params[8:], uint64(count))

	for range rounds {
		if err := s.Launch(0, nil, kernel, 1, params); err != nil {
			log.Fatal(err)
		}
		if err := s.DeviceSynchronize(0); err != nil {
			log.Fatal(err)
		}
		for i := range a {
			a[i]++
		}
	}

	var sum uint64
	want := uint32(3 * rounds)
	for i, v := range a {
		if v != want {
			log.Fatalf("element %d is %d, want %d", i, v, want)
		}
		sum += uint64(v)
	}
	fmt.Printf("pingpong %d MiB, %d rounds: checksum %d\n", mib, rounds, sum)
	if err := alloc.Free(); err != nil {
		log.Fatal(err)
	}
}
