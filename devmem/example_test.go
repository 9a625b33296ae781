package devmem_test

import (
	"errors"
	"fmt"
	"log"

	"github.com/softuvm/softuvm/devmem"
)

// A location file is sparse and huge; pages exist only where written,
// at offsets equal to the virtual addresses they back.
func ExampleCreateFile() {
	f, err := devmem.CreateFile("host-copy", devmem.FileSize)
	if err != nil {
		log.Fatal(err)
	}
	defer f.Close()

	const addr = 0x7f00_0000_0000
	if _, err := f.WriteAt([]byte("hello"), addr+devmem.PageSize); err != nil {
		log.Fatal(err)
	}
	buf := make([]byte, 5)
	if _, err := f.ReadAt(buf, addr+devmem.PageSize); err != nil {
		log.Fatal(err)
	}
	extents, err := f.DataExtents(addr, 4*devmem.PageSize)
	if err != nil {
		log.Fatal(err)
	}
	held, err := f.AllocatedBytes()
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("%s, data at %#x+%d, %d bytes held\n", buf, extents[0].Off, extents[0].Len, held)
	// Output: hello, data at 0x7f0000001000+4096, 4096 bytes held
}

// Moving a page to a device: copy it into the device file at the same
// offset, then punch the host copy out, which also unmaps it everywhere.
func ExampleFile_CopyFrom() {
	host, err := devmem.CreateFile("host", devmem.FileSize)
	if err != nil {
		log.Fatal(err)
	}
	defer host.Close()
	dev, err := devmem.CreateFile("dev0", devmem.FileSize)
	if err != nil {
		log.Fatal(err)
	}
	defer dev.Close()

	const page = 0x7f00_0020_0000
	if _, err := host.WriteAt([]byte("payload"), page); err != nil {
		log.Fatal(err)
	}
	if _, err := dev.CopyFrom(host, page, page, devmem.PageSize); err != nil {
		log.Fatal(err)
	}
	if err := host.Punch(page, devmem.PageSize); err != nil {
		log.Fatal(err)
	}
	hostHeld, _ := host.AllocatedBytes()
	devHeld, _ := dev.AllocatedBytes()
	fmt.Println("host holds", hostHeld, "bytes, device holds", devHeld)
	// Output: host holds 0 bytes, device holds 4096
}

// A client's view of managed memory: a reservation, with windows of the
// host file mapped in at address == file offset.
func ExampleReserveAddressSpace() {
	const length = 4 * devmem.PageSize
	addr, err := devmem.ReserveAddressSpace(length, 2<<20)
	if err != nil {
		log.Fatal(err)
	}
	defer devmem.ReleaseAddressSpace(addr, length)

	f, err := devmem.CreateFile("host", devmem.FileSize)
	if err != nil {
		log.Fatal(err)
	}
	defer f.Close()
	if err := f.MapFixed(addr, int64(addr), length); err != nil {
		log.Fatal(err)
	}
	copy(devmem.BytesAt(addr, length), "stored at its own address")

	buf := make([]byte, 25)
	if _, err := f.ReadAt(buf, int64(addr)); err != nil {
		log.Fatal(err)
	}
	fmt.Println(addr%(2<<20) == 0, string(buf))
	// Output: true stored at its own address
}

// Reserve refuses pages that do not fit; the error says how full the
// arena is, and tells the fault server to evict.
func ExampleArena_Reserve() {
	a, err := devmem.NewArena(devmem.ArenaSpec{Device: 0, Capacity: 256 * devmem.PageSize, Backend: devmem.BackendMemfd, Node: -1})
	if err != nil {
		log.Fatal(err)
	}
	if err := a.Reserve(256); err != nil {
		log.Fatal(err)
	}
	err = a.Reserve(2)
	fmt.Println(err)
	fmt.Println(errors.Is(err, devmem.ErrArenaFull))
	a.Release(2)
	fmt.Println(a.Reserve(2), a.FreeBytes())
	// Output:
	// device 0 arena full: 1048576 of 1048576 bytes used, 8192 more requested
	// true
	// <nil> 0
}

func ExampleArenaSpec_Validate() {
	for _, s := range []devmem.ArenaSpec{
		{Device: 0, Capacity: 1 << 30, Backend: devmem.BackendAuto, Node: -1},
		{Device: 0, Capacity: 0},
		{Device: 1, Capacity: 1 << 20, Backend: devmem.BackendNUMA, Node: -2},
	} {
		fmt.Printf("%v: %v\n", s, s.Validate())
	}
	// Output:
	// device=0 capacity=1073741824 backend=auto node=-1: <nil>
	// device=0 capacity=0 backend=auto node=0: arena capacity 0: want a positive multiple of 4096 bytes
	// device=1 capacity=1048576 backend=numa node=-2: arena node -2: want -1 (pick by device) or a node number >= 0
}

func ExampleParseBackend() {
	b, err := devmem.ParseBackend("numa")
	fmt.Println(b, err)
	_, err = devmem.ParseBackend("gpu")
	fmt.Println(err)
	// Output:
	// numa <nil>
	// arena backend "gpu": want auto, memfd or numa
}
