package bench

import (
	"encoding/binary"

	"github.com/softuvm/softuvm/devmem"
	"github.com/softuvm/softuvm/uvm"
)

// TouchKernel is the name of the kernel that touches every page of a
// range once (params: the address, the length, each a little-endian
// uint64): the seed experiment's kernel, which `uvm bench launch` and
// `uvm demo` run.
const TouchKernel = "uvm-bench-touch"

// The kernels the benchmarks launch, registered with every binary that
// links this package (the uvm command's devices are that binary).
func init() {
	// touchPages: params = address, length; thread t of n adds one to the
	// first byte of every page of its share, as the seed experiment's
	// kernel. `uvm demo` runs it too.
	uvm.MustRegisterKernel(TouchKernel, func(tid, n int, p []byte) {
		addr, length := uintptr(binary.LittleEndian.Uint64(p)), int64(binary.LittleEndian.Uint64(p[8:]))
		pages := (length + uvm.PageSize - 1) / uvm.PageSize
		b := devmem.BytesAt(addr, length)
		for pg := int64(tid) * pages / int64(n); pg < int64(tid+1)*pages/int64(n); pg++ {
			b[pg*uvm.PageSize]++
		}
	})
	uvm.MustRegisterKernel("uvm-bench-nothing", func(tid, n int, p []byte) {})
	// stream: params = address, length; thread t of n reads its share,
	// eight bytes at a time, once.
	uvm.MustRegisterKernel("uvm-bench-stream", func(tid, n int, p []byte) {
		addr, length := uintptr(binary.LittleEndian.Uint64(p)), int64(binary.LittleEndian.Uint64(p[8:]))
		b := devmem.BytesAt(addr, length)
		lo, hi := length*int64(tid)/int64(n)&^7, length*int64(tid+1)/int64(n)&^7
		streamSink.Add(sumWords(b[lo:hi]))
	})
}
