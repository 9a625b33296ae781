package uvm_test

import (
	"fmt"
	"log"

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
	fmt.Println(st.MigratedPages(uvm.CPU, 0), "pages went to the device")
}

// A session with an explicit configuration: a private server with two
// devices and the window prefetcher.
func ExampleConnect() {
	cfg := uvm.DefaultServerConfig()
	cfg.Devices = uvm.DeviceSpecs(2, []int64{256 << 20}, cfg.Devices[0].Backend)
	cfg.Prefetch = uvm.PrefetchSpec{Policy: "window", Window: 8}
	s, err := uvm.Connect(uvm.Config{Server: "private", Private: cfg})
	if err != nil {
		log.Fatal(err)
	}
	defer s.Close()
	a, err := s.MallocManaged(1<<20, uvm.WithPrefetch(uvm.PrefetchSpec{Policy: "none"}))
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
	err := uvm.RegisterPrefetchPolicy("next-page", func(arg string) (uvm.PrefetchPolicy, error) {
		return nextPage{}, nil
	})
	if err != nil {
		log.Fatal(err)
	}
	spec, _ := uvm.ParsePrefetchSpec("next-page")
	fmt.Println(spec.Policy)
	// Output: next-page
}

type nextPage struct{}

func (nextPage) Name() string { return "next-page" }

func (nextPage) Expand(c *uvm.PrefetchContext) (m uvm.PageMask) {
	for p := c.Faulted.NextSet(0); p >= 0; p = c.Faulted.NextSet(p + 1) {
		if p+1 < c.Pages {
			m.Set(p + 1)
		}
	}
	return m
}
