package uvm

import (
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/softuvm/softuvm/devmem"
	"github.com/softuvm/softuvm/internal/config"
	"github.com/softuvm/softuvm/policy"
)

// Blocks that move whole go as one 2 MiB folio; single pages then fault
// out of that folio and back next to pages resident elsewhere. Every
// byte must survive each step, with large folios on (where the machine
// has them) and off.
func TestLargeFolioBlocksAndSinglePages(t *testing.T) {
	for _, mode := range []string{config.LargeFoliosAuto, config.LargeFoliosOff} {
		t.Run(mode, func(t *testing.T) {
			if mode == config.LargeFoliosAuto {
				if err := devmem.LargeFoliosAvailable(); err != nil {
					t.Skipf("no large folios here: %v", err)
				}
			}
			cfg := DefaultServerConfig()
			cfg.LargeFolios = mode
			cfg.Devices = config.DeviceSpecs(2, []int64{64 << 20}, cfg.Devices[0].Backend)
			s := newSession(t, cfg)
			const blocks = 4
			size := int64(blocks * BlockSize)
			a, err := s.MallocManaged(size, WithPrefetch(PrefetchSpec{Policy: "none"}))
			require.NoError(t, err)
			defer a.Free()
			b := a.Bytes()
			want := make([]byte, size)
			for i := range want {
				want[i] = byte(i*7 + i/PageSize)
			}
			copy(b, want)
			check := func(step string) {
				t.Helper()
				sameBytes(t, want, b, step)
			}
			require.NoError(t, s.Prefetch(a.Addr(), size, 0)) // whole blocks to device 0
			// One page back from each block, written: the block's device
			// copy is punched around it.
			for blk := range blocks {
				i := blk*BlockSize + (37+blk)*PageSize
				require.Equal(t, want[i], b[i], "page read back from device 0")
				b[i]++
				want[i]++
			}
			require.NoError(t, s.Prefetch(a.Addr(), size, 1)) // mixed blocks: page by page
			check("after device 1")
			require.NoError(t, s.Prefetch(a.Addr(), size, 0)) // whole again, device to device
			require.NoError(t, s.Prefetch(a.Addr()+BlockSize, BlockSize, CPU))
			check("one block back whole, the rest read by faults")
			require.NoError(t, s.Prefetch(a.Addr(), size, CPU))
			check("all back")
		})
	}
}

// A page leaving a block that sits in a large folio on the host, while
// that folio cannot be split (a pipe filled by vmsplice holds it) and a
// thread of the program reads the page over and over: every read sees
// the page's bytes. A partial punch of such a folio zeroes the punched
// page and keeps it, and a reader would read the zeros without faulting.
func TestLargeFolioPageLeavesUnderReaders(t *testing.T) {
	cfg := largeFolioConfig(t)
	s := newSession(t, cfg)
	a, err := s.MallocManaged(BlockSize, WithPrefetch(PrefetchSpec{Policy: "none"}))
	require.NoError(t, err)
	defer a.Free()
	b := a.Bytes()
	for i := range b {
		b[i] = byte(i/PageSize) | 0x80 // never zero
	}
	// Whole to the device and whole back: one 2 MiB folio on the host.
	require.NoError(t, s.Prefetch(a.Addr(), BlockSize, 0))
	require.NoError(t, s.Prefetch(a.Addr(), BlockSize, CPU))
	var p [2]int
	require.NoError(t, unix.Pipe2(p[:], unix.O_CLOEXEC))
	defer unix.Close(p[0])
	defer unix.Close(p[1])
	iov := []unix.Iovec{{Base: &b[0]}}
	iov[0].SetLen(PageSize)
	_, err = unix.Vmsplice(p[1], iov, 0) // a reference to the folio
	require.NoError(t, err)

	for _, page := range []int{300, 301, 17, 450} {
		stop := make(chan struct{})
		seen := make(chan string, 1)
		started := make(chan struct{})
		go func() {
			want := byte(page) | 0x80
			reads := 0
			for {
				for _, i := range []int{0, PageSize / 2, PageSize - 1} {
					if got := b[page*PageSize+i]; got != want {
						seen <- fmt.Sprintf("byte %d of page %d read %#x, want %#x", i, page, got, want)
						return
					}
				}
				if reads++; reads == 1 {
					close(started)
				}
				select {
				case <-stop:
					seen <- ""
					return
				default:
				}
			}
		}()
		<-started
		require.NoError(t, s.Prefetch(a.Addr()+uintptr(page)*PageSize, PageSize, 0))
		close(stop)
		require.Empty(t, <-seen)
	}
	for i := range b {
		require.Equal(t, byte(i/PageSize)|0x80, b[i], "byte %#x", i)
	}
}

// A program sweeping more than its host budget, with large folios on:
// eviction moves whole host blocks to the device as one folio each, and
// a fault into such a block brings it back whole although the host is
// at its budget (which is soft: overBudget pushes the oldest block out
// after the move), so no block is ever rebuilt in 4 KiB folios. Before,
// a full host took only pieces, and each piece rebuilt the rest of the
// device's folio. Every byte is checked on every sweep, and the host
// keeps within its budget plus the block in hand.
func TestLargeFolioSweepOverHostBudget(t *testing.T) {
	cfg := largeFolioConfig(t)
	const budget, size = 4 << 20, 12 << 20
	cfg.HostBudget = budget
	s := newSession(t, cfg)
	a, err := s.MallocManaged(size)
	require.NoError(t, err)
	defer a.Free()
	b := a.Bytes()
	fill(b, 0)
	for sweep := 1; sweep <= 3; sweep++ {
		want := pattern(size, byte(sweep-1))
		for blk := 0; blk < size; blk += BlockSize {
			for i := blk; i < blk+BlockSize; i++ {
				if b[i] != want[i] {
					t.Fatalf("sweep %d: byte %#x (page %d) is %d, want %d", sweep, i, i/PageSize, b[i], want[i])
				}
			}
			for i := blk; i < blk+BlockSize; i++ {
				b[i] = byte(i>>12) ^ byte(i) ^ byte(sweep)
			}
		}
	}
	require.Equal(t, pattern(size, 3), b)
	in, err := s.Info()
	require.NoError(t, err)
	assert.LessOrEqual(t, in.Sessions[0].HostBytes, int64(budget+BlockSize), "the host keeps within its budget plus the block in hand")
	st, err := a.Stats()
	require.NoError(t, err)
	assert.GreaterOrEqual(t, st.EvictedPages(CPU), uint64(3*(size-budget-BlockSize)/PageSize), "every sweep pushed the blocks beyond the budget out")
	assert.Zero(t, in.FoliosRebuilt, "blocks evicted whole came back whole")
}

// largeFolioConfig is a server with large folios on and one device of
// 64 MiB; the test is skipped where the machine has no large folios.
func largeFolioConfig(t *testing.T) ServerConfig {
	t.Helper()
	if err := devmem.LargeFoliosAvailable(); err != nil {
		t.Skipf("no large folios here: %v", err)
	}
	cfg := DefaultServerConfig()
	cfg.LargeFolios = config.LargeFoliosAuto
	cfg.Devices = config.DeviceSpecs(1, []int64{64 << 20}, cfg.Devices[0].Backend)
	return cfg
}

// largeFolioSession starts a session with cfg, and skips the test where
// its server could not turn large folios on.
func largeFolioSession(t *testing.T, cfg ServerConfig) *Session {
	t.Helper()
	s := newSession(t, cfg)
	in, err := s.Info()
	require.NoError(t, err)
	if !strings.HasPrefix(in.LargeFolios, "on") {
		t.Skipf("large folios: %s", in.LargeFolios)
	}
	return s
}

// deviceMinflt is the kernel's count of minor faults (minflt) of device
// d's process of s, which counts the faults the server served as well as
// those the kernel resolved itself; false while d has no process.
func deviceMinflt(t *testing.T, s *Session, d Device) (uint64, bool) {
	t.Helper()
	pf, ok := deviceProcess(ownSession(t, s), d)
	if !ok {
		return 0, false
	}
	require.NotNil(t, pf.MinorFaults, "device %d's process's minflt", d)
	return *pf.MinorFaults, true
}

// patternedManaged allocates size bytes of managed memory (freed when the test
// ends) and writes byte i as i*mul + i/PageSize + add, different on
// every page; it returns the allocation, its bytes and what was written.
func patternedManaged(t *testing.T, s *Session, size int64, mul, add int) (*Allocation, []byte, []byte) {
	t.Helper()
	a, err := s.MallocManaged(size)
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, a.Free()) })
	want := make([]byte, size)
	for i := range want {
		want[i] = byte(i*mul + i/PageSize + add)
	}
	b := a.Bytes()
	copy(b, want)
	return a, b, want
}

// minorFaultsOfProcess is the kernel's count of this process's minor
// faults (/proc/self/stat, field 10).
func minorFaultsOfProcess(t *testing.T) uint64 {
	t.Helper()
	var ru unix.Rusage
	require.NoError(t, unix.Getrusage(unix.RUSAGE_SELF, &ru))
	return uint64(ru.Minflt)
}

// With large folios, the host view registers MINOR faults over its own
// file: a fault that brings a whole block writes it into the host file
// as one folio and maps it with one UFFDIO_CONTINUE, and pages the file
// holds but the view does not map (a block rebuilt in 4 KiB folios as
// one of its pages left) fault to the server once per block, not once
// per page to the kernel. A prefetch to the CPU maps what it brings.
func TestLargeFolioHostBlocksMappedWhole(t *testing.T) {
	s := largeFolioSession(t, largeFolioConfig(t))
	const blocks = 4
	size := int64(blocks * BlockSize)
	// The default prefetch policy: a fault on a block held whole elsewhere
	// brings the whole block (largeElsewhere).
	a, b, want := patternedManaged(t, s, size, 13, 5)
	check := func(step string) {
		t.Helper()
		sameBytes(t, want, b, step)
	}
	pages := uint64(blocks * BlockSize / PageSize)
	// read checks every byte and returns the faults it took: the
	// server's, and the kernel's minor faults of this process.
	read := func(step string) (served ProcessorFaults, kernel uint64) {
		t.Helper()
		before, err := a.Stats()
		require.NoError(t, err)
		minflt := minorFaultsOfProcess(t)
		check(step)
		kernel = minorFaultsOfProcess(t) - minflt
		after, err := a.Stats()
		require.NoError(t, err)
		b, f := before.FaultsBy(CPU), after.FaultsBy(CPU)
		return ProcessorFaults{Processor: CPU, Missing: f.Missing - b.Missing, Minor: f.Minor - b.Minor, WriteProtect: f.WriteProtect - b.WriteProtect}, kernel
	}

	// Whole blocks on device 0, brought back by faults: one missing
	// fault each writes the block into the host file as one folio and
	// maps it.
	require.NoError(t, s.Prefetch(a.Addr(), size, 0))
	// A thread interrupted while it waits in a fault faults again (the
	// Go runtime preempts with signals): a few duplicates are allowed.
	const duplicates = 2
	served, kernel := read("brought back from device 0 by faults")
	assert.GreaterOrEqual(t, served.Missing, uint64(blocks), "one missing fault per block")
	assert.LessOrEqual(t, served.Missing, uint64(blocks+duplicates), "one missing fault per block")
	assert.LessOrEqual(t, served.Minor, uint64(duplicates), "MINOR faults after a fault brought whole blocks")
	assert.Less(t, kernel, pages/8, "the kernel's minor faults while reading %d pages brought whole", pages)
	// Each block is one folio on the host now: a page leaving breaks it.
	rebuilt := func() uint64 {
		in, err := s.Info()
		require.NoError(t, err)
		return in.FoliosRebuilt
	}
	was := rebuilt()
	for blk := range blocks {
		require.NoError(t, s.Prefetch(a.Addr()+uintptr(blk*BlockSize+7*PageSize), PageSize, 0))
	}
	assert.Equal(t, uint64(blocks), rebuilt()-was, "host blocks rebuilt as a page left each: the faults brought them as one folio")

	// Prefetched back whole: written into the host file and mapped, so
	// reading takes no fault.
	require.NoError(t, s.Prefetch(a.Addr(), size, 0))
	require.NoError(t, s.Prefetch(a.Addr(), size, CPU))
	served, kernel = read("prefetched back from device 0 whole")
	assert.Zero(t, served.Total(), "faults after a prefetch to the CPU")
	assert.Less(t, kernel, pages/8, "the kernel's minor faults while reading %d pages prefetched whole", pages)

	// One page leaves each block: the host's folio is rebuilt in 4 KiB
	// folios, which no page table maps; reading the rest faults MINOR
	// to the server, which maps each run at once.
	for blk := range blocks {
		addr := a.Addr() + uintptr(blk*BlockSize+100*PageSize)
		require.NoError(t, s.Prefetch(addr, PageSize, 0))
	}
	in, err := s.Info()
	require.NoError(t, err)
	assert.GreaterOrEqual(t, in.FoliosRebuilt, uint64(blocks), "host blocks rebuilt as a page left each")
	served, kernel = read("after one page of each block left for device 0")
	// Each block: one MINOR fault maps the pages on both sides of the
	// one that left, which comes back by a missing fault.
	assert.GreaterOrEqual(t, served.Minor, uint64(blocks), "MINOR faults for %d rebuilt blocks", blocks)
	assert.LessOrEqual(t, served.Minor, uint64(blocks+duplicates), "MINOR faults for %d rebuilt blocks", blocks)
	assert.GreaterOrEqual(t, served.Missing, uint64(blocks), "the pages on device 0 came back by missing faults")
	assert.LessOrEqual(t, served.Missing, uint64(blocks+duplicates), "the pages on device 0 came back by missing faults")
	assert.Less(t, kernel, pages/8, "the kernel's minor faults while reading %d rebuilt pages", pages)
}

// TestLargeFolioDeviceFaultsTakeWholeBlocks: a kernel sweeping blocks
// that live on the host brings each whole once the sweep shows, as one
// folio in the device's file that its threads map with the kernel's own
// minor faults; the host sweeping them back then takes each whole (the
// device holds it in one folio). No page write-protect-faults on the
// way, pass after pass: a page that left a view by a whole move leaves
// no protection behind that its return by a write into the file would
// meet. Every byte is checked after each pass.
func TestLargeFolioDeviceFaultsTakeWholeBlocks(t *testing.T) {
	cfg := largeFolioConfig(t)
	var err error
	cfg.Thrashing, err = policy.ParseThrashingSpec("off") // the ping-pong is the point
	require.NoError(t, err)
	s := largeFolioSession(t, cfg)
	const blocks = 8
	size := int64(blocks * BlockSize)
	a, b, want := patternedManaged(t, s, size, 11, 3)
	// A thread interrupted while it waits in a fault faults again (the
	// Go runtime preempts with signals), and a sweep shows only after
	// policy.SweepRun faults, which bring pieces. The device's workers
	// each sweep a part of the range, and a block split between two
	// parts may be faulted on by both: on 16 CPUs (16 workers, half a
	// block each) the device took 17-20 faults.
	const duplicates = 2
	workers, err := s.DeviceGetAttribute(AttrWorkerCount, 0)
	require.NoError(t, err)
	most := uint64(blocks + 2*policy.SweepRun + duplicates)
	mostDevice := most + uint64(workers-1)
	faults := func(before, after Stats, p Device) ProcessorFaults {
		b, f := before.FaultsBy(p), after.FaultsBy(p)
		return ProcessorFaults{Processor: p, Missing: f.Missing - b.Missing, Minor: f.Minor - b.Minor, WriteProtect: f.WriteProtect - b.WriteProtect}
	}
	// The device's process maps what its file takes whole with one
	// UFFDIO_CONTINUE a block: its kernel's touches cost it no minor
	// faults of its own, where the kernel would map the block a page a
	// fault (512 a block). The process's own memory (stacks, heap) costs
	// a few. The first pass starts the process, whose own start costs
	// more.
	const processFaults = 256
	for pass := range 3 {
		before, err := a.Stats()
		require.NoError(t, err)
		minfltBefore, running := deviceMinflt(t, s, 0)
		require.NoError(t, s.Launch(0, nil, "addOne", 1, rangeParams(a.Addr(), size, 0)))
		require.NoError(t, s.DeviceSynchronize(0))
		minfltAfter, _ := deviceMinflt(t, s, 0)
		minflt := minfltAfter - minfltBefore
		for i := range want {
			want[i]++
		}
		mid, err := a.Stats()
		require.NoError(t, err)
		sameBytes(t, want, b, fmt.Sprintf("pass %d, read back on the host", pass))
		after, err := a.Stats()
		require.NoError(t, err)
		dev, host := faults(before, mid, Device(0)), faults(mid, after, CPU)
		t.Logf("pass %d: device %+v (its process's minflt %d), host %+v", pass, dev, minflt, host)
		if running {
			assert.LessOrEqual(t, minflt, dev.Total()+processFaults, "pass %d: the device process's minor faults beyond those the server served", pass)
		}
		assert.LessOrEqual(t, dev.WriteProtect, uint64(duplicates), "pass %d: the device's write-protect faults", pass)
		assert.LessOrEqual(t, dev.Total(), mostDevice, "pass %d: the device's faults, sweeping %d blocks with %d workers", pass, blocks, workers)
		assert.LessOrEqual(t, host.Total(), most, "pass %d: the host's faults, sweeping %d blocks", pass, blocks)
	}
	// The blocks are on the host again; on the device, each was one
	// folio: one page leaving a block there breaks it.
	require.NoError(t, s.Launch(0, nil, "addOne", 1, rangeParams(a.Addr(), size, 0)))
	require.NoError(t, s.DeviceSynchronize(0))
	in, err := s.Info()
	require.NoError(t, err)
	was := in.FoliosRebuilt
	for blk := range blocks {
		require.NoError(t, s.Prefetch(a.Addr()+uintptr(blk*BlockSize+9*PageSize), PageSize, CPU))
	}
	in, err = s.Info()
	require.NoError(t, err)
	assert.GreaterOrEqual(t, in.FoliosRebuilt-was, uint64(blocks-1), "device blocks rebuilt as a page left each: the kernel's faults brought them as one folio")
	for i := range want {
		want[i]++
	}
	sameBytes(t, want, b, "after the last pass")
}
