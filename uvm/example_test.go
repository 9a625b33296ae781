package uvm_test

import (
	"encoding/binary"
	"fmt"
	"log"
	"structs"
	"unsafe"

	"github.com/softuvm/softuvm/internal/config"
	"github.com/softuvm/softuvm/internal/core"
	"github.com/softuvm/softuvm/policy"
	"github.com/softuvm/softuvm/uvm"
)

// Managed memory is ordinary memory to the program; pages move between
// the host and a device on demand or on request. (Examples here have no
// Output: they need the fault server, hence userfaultfd, hence root on
// most machines.)
func ExampleMallocManaged() {
	a, err := uvm.MallocManaged(64 << 20)
	if err != nil {
		log.Fatal(err)
	}
	defer a.Free()
	b := a.Bytes()
	b[0] = 42 // first touch: zero-filled, with its neighbours prefetched
	if err := a.Prefetch(0); err != nil {
		log.Fatal(err)
	}
	fmt.Println(b[0]) // a fault brings the page back from device 0
	st, err := a.Stats()
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(st.MigratedPages(core.CPU, 0), "pages went to the device")
}

// A session with an explicit configuration: a private server with two
// devices and the window prefetcher.
func ExampleConnect() {
	cfg := config.DefaultServerConfig()
	cfg.Devices = config.DeviceSpecs(2, []int64{256 << 20}, cfg.Devices[0].Backend)
	cfg.Prefetch = policy.PrefetchSpec{Policy: "window", Window: 8}
	s, err := uvm.Connect(uvm.Config{Server: "private", Private: cfg})
	if err != nil {
		log.Fatal(err)
	}
	defer s.Close()
	a, err := s.MallocManaged(1<<20, uvm.WithPrefetch(policy.PrefetchSpec{Policy: "none"}))
	if err != nil {
		log.Fatal(err)
	}
	if err := s.Prefetch(a.Addr(), a.Size(), 1); err != nil {
		log.Fatal(err)
	}
	attrs, err := s.RangeAttributes(a.Addr(), a.Size())
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("last prefetched to", attrs.LastPrefetchLocation)
}

// A prefetch policy of one's own, available by name to UVM_PREFETCH and
// --prefetch once registered (from an init function, so that the server,
// a re-execution of the same program, knows it too).
func ExampleRegisterPrefetchPolicy() {
	err := policy.RegisterPrefetchPolicy("next-page", func(arg string) (policy.PrefetchPolicy, error) {
		return nextPage{}, nil
	})
	if err != nil {
		log.Fatal(err)
	}
	spec, _ := policy.ParsePrefetchSpec("next-page")
	fmt.Println(spec.Policy)
	// Output: next-page
}

type nextPage struct{}

func (nextPage) Name() string { return "next-page" }

func (nextPage) Expand(c *policy.PrefetchContext) (m core.PageMask) {
	for p := c.Faulted.NextSet(0); p >= 0; p = c.Faulted.NextSet(p + 1) {
		if p+1 < c.Pages {
			m.Set(p + 1)
		}
	}
	return m
}

// Kernels are registered by name in an init function, and the program
// calls uvm.Main first in main: the same binary runs the fault server and
// the device processes.
func ExampleSession_Launch() {
	// In an init function:
	//	uvm.MustRegisterKernel("double", func(tid, n int, p []byte) { ... })
	s, err := uvm.Default()
	if err != nil {
		log.Fatal(err)
	}
	a, err := s.MallocManaged(1 << 20)
	if err != nil {
		log.Fatal(err)
	}
	defer a.Free()
	params := make([]byte, 16)
	binary.LittleEndian.PutUint64(params, uint64(a.Addr()))
	binary.LittleEndian.PutUint64(params[8:], uint64(a.Size()))
	st, err := s.StreamCreate(0)
	if err != nil {
		log.Fatal(err)
	}
	defer s.StreamDestroy(st)
	if err := s.Launch(0, st, "double", 64, params); err != nil {
		log.Fatal(err)
	}
	// A panic in the kernel, or the death of the device's process, comes
	// back here, naming the kernel.
	if err := s.StreamSynchronize(st); err != nil {
		log.Fatal(err)
	}
}

// Read-mostly data is copied to each reader instead of moving; a device
// that keeps an accessed-by mapping reads it where it lies.
func ExampleSession_MemAdvise() {
	s, err := uvm.Default()
	if err != nil {
		log.Fatal(err)
	}
	table, err := s.MallocManaged(16 << 20)
	if err != nil {
		log.Fatal(err)
	}
	defer table.Free()
	if err := s.MemAdvise(table.Addr(), table.Size(), core.AdviseSetReadMostly, 0); err != nil {
		log.Fatal(err)
	}
	if err := s.MemAdvise(table.Addr(), table.Size(), core.AdviseSetAccessedBy, 0); err != nil {
		log.Fatal(err)
	}
	attrs, err := s.RangeAttributes(table.Addr(), table.Size())
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(attrs.ReadMostly, attrs.AccessedBy)
}

// Device memory is filled and read with Memcpy; the host cannot touch it.
func ExampleSession_Memcpy() {
	s, err := uvm.Default()
	if err != nil {
		log.Fatal(err)
	}
	d, err := s.Malloc(0, 4096)
	if err != nil {
		log.Fatal(err)
	}
	defer d.Free()
	in := []byte("hello, device")
	if err := s.Memcpy(d.Addr(), uintptr(unsafe.Pointer(&in[0])), int64(len(in)), uvm.MemcpyHostToDevice); err != nil {
		log.Fatal(err)
	}
	out := make([]byte, len(in))
	if err := s.Memcpy(uintptr(unsafe.Pointer(&out[0])), d.Addr(), int64(len(out)), uvm.MemcpyDefault); err != nil {
		log.Fatal(err)
	}
	fmt.Println(string(out))
}

// Slice views an allocation as a slice of any type without pointers.
func ExampleSlice() {
	a, err := uvm.MallocManaged(1024 * 4)
	if err != nil {
		log.Fatal(err)
	}
	defer a.Free()
	xs, err := uvm.Slice[float32](a) // 1024 float32s
	if err != nil {
		log.Fatal(err)
	}
	for i := range xs {
		xs[i] = float32(i)
	}
	// A type with a pointer is refused: the garbage collector does not
	// scan managed memory.
	if _, err := uvm.Slice[*int](a); err != nil {
		fmt.Println(err)
	}
}

// scaleParams are the parameters of the "example-scale" kernel, laid out
// as the C struct { uintptr_t data; int64_t n; float factor; }: 24 bytes,
// the last 4 padding.
type scaleParams struct {
	_      structs.HostLayout
	Data   uintptr // the address of n float32s
	N      int64
	Factor float32
}

// Kernels are registered in an init function: device processes are
// re-executions of the program, and find kernels by name.
func init() {
	uvm.MustRegisterTypedKernel("example-scale", func(tid, nthreads int, p scaleParams) {
		data := uvm.SliceAt[float32](p.Data, int(p.N))
		for i := tid; i < len(data); i += nthreads {
			data[i] *= p.Factor
		}
	})
}

// A typed kernel receives its parameters as a Go value; managed memory
// travels by address, and the kernel makes a slice of it again.
func ExampleLaunchTyped() {
	s, err := uvm.Default()
	if err != nil {
		log.Fatal(err)
	}
	a, err := s.MallocManaged(1 << 20)
	if err != nil {
		log.Fatal(err)
	}
	defer a.Free()
	xs := uvm.MustSlice[float32](a)
	for i := range xs {
		xs[i] = float32(i)
	}
	p := scaleParams{Data: a.Addr(), N: int64(len(xs)), Factor: 2}
	if err := uvm.LaunchTyped(s, 0, nil, "example-scale", 64, p); err != nil {
		log.Fatal(err)
	}
	if err := s.DeviceSynchronize(0); err != nil {
		log.Fatal(err)
	}
	fmt.Println(xs[3]) // 6
}

// The bytes of typed parameters are the C struct's: what a C program
// passes to uvmLaunchKernel with a pointer to the struct and its sizeof.
func ExampleEncodeKernelParams() {
	b, err := uvm.EncodeKernelParams(scaleParams{Data: 0x1000, N: 3, Factor: 1.5})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(len(b), b)
	// Output: 24 [0 16 0 0 0 0 0 0 3 0 0 0 0 0 0 0 0 0 192 63 0 0 0 0]
}
