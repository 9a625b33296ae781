package uvm

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/require"

	"github.com/softuvm/softuvm/devmem"
	"github.com/softuvm/softuvm/internal/config"
)

// integrityOps is how many random operations TestDataIntegrity runs:
// UVM_INTEGRITY_OPS, 100,000 by default, 10,000 with -short.
func integrityOps(t *testing.T) int {
	if v := os.Getenv("UVM_INTEGRITY_OPS"); v != "" {
		n, err := strconv.Atoi(v)
		require.NoError(t, err, "UVM_INTEGRITY_OPS")
		return n
	}
	if testing.Short() {
		return 10000
	}
	return 100000
}

// integritySeed is UVM_INTEGRITY_SEED, or a new seed, logged so that a
// failure can be run again.
func integritySeed(t *testing.T) uint64 {
	seed := uint64(time.Now().UnixNano())
	if v := os.Getenv("UVM_INTEGRITY_SEED"); v != "" {
		var err error
		seed, err = strconv.ParseUint(v, 10, 64)
		require.NoError(t, err, "UVM_INTEGRITY_SEED=%q: want a decimal number", v)
	}
	t.Logf("seed %d (rerun with UVM_INTEGRITY_SEED)", seed)
	return seed
}

type shadowed struct {
	a      *Allocation
	shadow []byte
}

// newShadowed allocates up to maxSize bytes (a quarter of the time at
// most three pages) with a zeroed shadow.
func newShadowed(t *testing.T, s *Session, rng *rand.Rand, maxSize int64) shadowed {
	size := 1 + rng.Int64N(maxSize)
	if rng.IntN(4) == 0 {
		size = 1 + rng.Int64N(3*PageSize)
	}
	a, err := s.MallocManaged(size)
	require.NoError(t, err)
	return shadowed{a: a, shadow: make([]byte, size)}
}

// TestDataIntegrity runs random host writes, reads, kernel-mode writes
// (read(2) into managed memory), prefetches to the device and back, and
// frees, and checks every byte against a shadow copy.
func TestDataIntegrity(t *testing.T) {
	s := newSession(t, testServerConfig())
	seed := integritySeed(t)
	rng := rand.New(rand.NewPCG(seed, 0x5eed))
	var pipe [2]int
	require.NoError(t, syscall.Pipe(pipe[:]))
	defer syscall.Close(pipe[0])
	defer syscall.Close(pipe[1])

	newAlloc := func() shadowed { return newShadowed(t, s, rng, 2<<20) }
	slots := make([]shadowed, 4)
	for i := range slots {
		slots[i] = newAlloc()
	}
	span := func(n int) (int, int) {
		length := 1 + rng.IntN(min(n, []int{64, PageSize, 3 * PageSize, 64 << 10}[rng.IntN(4)]))
		return rng.IntN(n - length + 1), length
	}
	verify := func(op int, sl shadowed, off, length int) {
		got := sl.a.Bytes()[off : off+length]
		if !bytes.Equal(got, sl.shadow[off:off+length]) {
			for i := range got {
				if got[i] != sl.shadow[off+i] {
					t.Fatalf("op %d: byte %#x of allocation %#x is %d, want %d", op, off+i, sl.a.Addr(), got[i], sl.shadow[off+i])
				}
			}
		}
	}
	counts := map[string]int{}
	ops := integrityOps(t)
	for op := 0; op < ops; op++ {
		i := rng.IntN(len(slots))
		sl := slots[i]
		n := len(sl.shadow)
		switch k := rng.IntN(100); {
		case k < 40:
			off, length := span(n)
			sl.write(rng, off, length)
			counts["write"]++
		case k < 70:
			off, length := span(n)
			verify(op, sl, off, length)
			counts["read"]++
		case k < 75:
			// The kernel writes into managed memory inside read(2).
			off, length := span(n)
			length = min(length, 32<<10)
			src := make([]byte, length)
			for j := range src {
				src[j] = byte(rng.Uint32())
			}
			_, err := syscall.Write(pipe[1], src)
			require.NoError(t, err)
			got, err := syscall.Read(pipe[0], sl.a.Bytes()[off:off+length])
			require.NoError(t, err)
			require.Equal(t, length, got)
			copy(sl.shadow[off:], src)
			counts["kernel-write"]++
		case k < 95:
			off, length := span(n)
			if rng.IntN(10) == 0 {
				off, length = 0, n
			}
			dst := Device(0)
			if rng.IntN(2) == 0 {
				dst = CPU
			}
			require.NoError(t, s.Prefetch(sl.a.Addr()+uintptr(off), int64(length), dst), "op %d", op)
			counts["prefetch"]++
		case k < 98:
			verify(op, sl, 0, n)
			counts["verify-all"]++
		default:
			verify(op, sl, 0, n) // every byte of it, before it goes
			require.NoError(t, sl.a.Free())
			slots[i] = newAlloc()
			verify(op, slots[i], 0, len(slots[i].shadow))
			counts["free"]++
		}
	}
	for _, sl := range slots {
		verify(ops, sl, 0, len(sl.shadow))
	}
	st, err := s.Stats()
	require.NoError(t, err)
	t.Logf("%d operations %v; %d faults, %d pages to the device, %d back, %d zero-filled",
		ops, fmt.Sprint(counts), st.TotalFaults(), st.MigratedPages(CPU, 0), st.MigratedPages(0, CPU), st.PopulatedPages(CPU)+st.PopulatedPages(0))
	require.Positive(t, st.MigratedPages(0, CPU), "data really moved")
}

func init() {
	// writeSeeded: params = address, length, seed; thread t of n writes
	// its share with seededByte.
	MustRegisterKernel("writeSeeded", func(tid, n int, p []byte) {
		addr, length, seed := u64Params(p)
		b := devmem.BytesAt(uintptr(addr), int64(length))
		lo, hi := int(length)*tid/n, int(length)*(tid+1)/n
		for i := lo; i < hi; i++ {
			b[i] = seededByte(seed, i)
		}
	})
	// fnv: params = address, length, out; thread 0 stores the FNV-1a hash
	// of the range at out.
	MustRegisterKernel("fnv", func(tid, n int, p []byte) {
		if tid != 0 {
			return
		}
		addr, length, out := u64Params(p)
		*u64At(out) = fnv1a(devmem.BytesAt(uintptr(addr), int64(length)))
	})
}

func seededByte(seed uint64, i int) byte {
	return byte((seed*0x9E3779B97F4A7C15 + uint64(i)*0xBF58476D1CE4E5B9) >> 56)
}

func fnv1a(b []byte) uint64 {
	h := uint64(14695981039346656037)
	for _, c := range b {
		h = (h ^ uint64(c)) * 1099511628211
	}
	return h
}

// TestDataIntegrityDevices is the integrity test with two devices whose
// arenas are smaller than the data (eviction), kernels writing and
// reading, prefetches between every pair of processors, and every
// advice, all checked byte for byte against a shadow copy.
func TestDataIntegrityDevices(t *testing.T) { dataIntegrityDevices(t, "fault", 0) }

// TestDataIntegrityDevicesLargeFolios is TestDataIntegrityDevices with
// location files of 2 MiB folios (--large-folios auto): blocks that move
// whole go as one folio, and single pages fault out of them and back.
// TestDataIntegrityDevices runs with the default, 4 KiB folios.
func TestDataIntegrityDevicesLargeFolios(t *testing.T) {
	if err := devmem.LargeFoliosAvailable(); err != nil {
		t.Skipf("no large folios here: %v", err)
	}
	dataIntegrityDevices(t, "fault/large", 0)
}

// TestDataIntegrityDevicesLaunch is TestDataIntegrityDevices under the
// launch coherence model: launches hand the memory to the devices and
// synchronizes give it back, and not one byte may differ from the
// shadow. Every launch hands every allocation the host touched to its
// device, so an operation costs about five times the fault model's here:
// it runs a fifth of UVM_INTEGRITY_OPS (20,000 by default, 300 s here; a
// run of 100,000 passed in 261 s on 16 CPUs, seed 1795574518432676357).
func TestDataIntegrityDevicesLaunch(t *testing.T) { dataIntegrityDevices(t, "launch", 0) }

// TestDataIntegrityUnderTheCore is TestDataIntegrityDevices with a host
// budget of 4 MiB besides the devices' 6 MiB arenas, and large folios:
// every processor evicts, pages that come back soon are protected there
// and hidden from the eviction policy (the resident core,
// refault_test.go), protections end and give way while kernels on both
// devices fault, and not one byte may differ. A fifth of the operations.
func TestDataIntegrityUnderTheCore(t *testing.T) { dataIntegrityDevices(t, "fault/large", 4<<20) }

// TestDataIntegrityUnderTheCoreLaunch is TestDataIntegrityUnderTheCore
// under the launch coherence model (a fifth of its operations again).
func TestDataIntegrityUnderTheCoreLaunch(t *testing.T) { dataIntegrityDevices(t, "launch", 4<<20) }

// dataIntegrityDevices runs the two-device integrity test under the
// coherence model named ("/large": with large folios), with a host
// budget of hostBudget bytes (0: none).
func dataIntegrityDevices(t *testing.T, coherence string, hostBudget int64) {
	cfg := DefaultServerConfig()
	if c, ok := strings.CutSuffix(coherence, "/large"); ok {
		coherence, cfg.LargeFolios = c, config.LargeFoliosAuto
	}
	cfg.Coherence = coherence
	cfg.HostBudget = hostBudget
	cfg.Devices = config.DeviceSpecs(2, []int64{6 << 20}, cfg.Devices[0].Backend)
	cfg.DeviceWorkers = 2
	// Every move and copy through the copy engine's threads, however
	// small (TestDataIntegrity keeps the calibrated choice).
	cfg.CopyDirectBelow, cfg.CopyProducers = 1, 2
	s := newSession(t, cfg)
	seed := integritySeed(t)
	rng := rand.New(rand.NewPCG(seed, 0xde71ce))
	out, err := s.HostAlloc(16, HostAllocMapped)
	require.NoError(t, err)
	hashes := unsafe.Slice((*uint64)(out.Pointer()), 2)

	newAlloc := func() shadowed { return newShadowed(t, s, rng, 4<<20) }
	slots := make([]shadowed, 5)
	for i := range slots {
		slots[i] = newAlloc()
	}
	span := func(n int) (int, int) {
		length := 1 + rng.IntN(min(n, []int{64, PageSize, 3 * PageSize, 256 << 10, 4 << 20}[rng.IntN(5)]))
		return rng.IntN(n - length + 1), length
	}
	// history records what each operation did, so that a failure can say
	// what happened to the byte that went wrong.
	type event struct {
		op       int
		what     string
		addr     uintptr
		off, len int
	}
	var history []event
	record := func(op int, what string, sl shadowed, off, length int) {
		history = append(history, event{op, what, sl.a.Addr(), off, length})
	}
	explain := func(sl shadowed, at int) {
		for _, e := range history {
			if e.addr == sl.a.Addr() && e.off/BlockSize <= at/BlockSize && at/BlockSize <= (e.off+e.len-1)/BlockSize {
				mark := ""
				if e.off <= at && at < e.off+e.len {
					mark = " *"
				}
				t.Logf("op %d: %s %#x+%#x+%d%s", e.op, e.what, e.addr, e.off, e.len, mark)
			}
		}
	}
	verify := func(op int, sl shadowed, off, length int) {
		got := sl.a.Bytes()[off : off+length]
		if !bytes.Equal(got, sl.shadow[off:off+length]) {
			for i := range got {
				if got[i] != sl.shadow[off+i] {
					at := off + i
					explain(sl, at)
					t.Fatalf("op %d: byte %#x (page %d) of allocation %#x is %d, want %d", op, at, at/PageSize, sl.a.Addr(), got[i], sl.shadow[at])
				}
			}
		}
	}
	processor := func() Device { return Device(rng.IntN(3) - 1) }
	counts := map[string]int{}
	ops := integrityOps(t)
	if coherence == "launch" {
		ops /= 5
	}
	if hostBudget > 0 {
		ops /= 5
	}
	for op := 0; op < ops; op++ {
		i := rng.IntN(len(slots))
		sl := slots[i]
		n := len(sl.shadow)
		switch k := rng.IntN(100); {
		case k < 25:
			off, length := span(n)
			sl.write(rng, off, length)
			record(op, "host-write", sl, off, length)
			counts["host-write"]++
		case k < 45:
			off, length := span(n)
			verify(op, sl, off, length)
			record(op, "host-read", sl, off, length)
			counts["host-read"]++
		case k < 55:
			// Kernels on both devices at once, on different allocations.
			j := (i + 1 + rng.IntN(len(slots)-1)) % len(slots)
			for d, x := range []shadowed{sl, slots[j]} {
				off, length := span(len(x.shadow))
				kseed := rng.Uint64()
				require.NoError(t, s.Launch(Device(d), nil, "writeSeeded", 1+rng.IntN(3), params(uint64(x.a.Addr())+uint64(off), uint64(length), kseed)))
				for b := range length {
					x.shadow[off+b] = seededByte(kseed, b)
				}
				record(op, fmt.Sprintf("device %d write", d), x, off, length)
			}
			require.NoError(t, s.DeviceSynchronize(0), "op %d", op)
			require.NoError(t, s.DeviceSynchronize(1), "op %d", op)
			counts["kernel-write"]++
		case k < 62:
			// Kernels hashing on both devices at once, on different
			// allocations (or the same, a third of the time).
			j := (i + 1 + rng.IntN(len(slots)-1)) % len(slots)
			if rng.IntN(3) == 0 {
				j = i
			}
			type hashed struct {
				x         shadowed
				off, leng int
			}
			var work [2]hashed
			for d, x := range []shadowed{sl, slots[j]} {
				off, length := span(len(x.shadow))
				work[d] = hashed{x, off, length}
				require.NoError(t, s.Launch(Device(d), nil, "fnv", 1, params(uint64(x.a.Addr())+uint64(off), uint64(length), uint64(out.Addr())+8*uint64(d))))
			}
			require.NoError(t, s.DeviceSynchronize(0), "op %d", op)
			require.NoError(t, s.DeviceSynchronize(1), "op %d", op)
			for d, w := range work {
				if got, want := hashes[d], fnv1a(w.x.shadow[w.off:w.off+w.leng]); got != want {
					verify(op, w.x, w.off, w.leng) // names the byte if the host sees it too
					explain(w.x, w.off)
					t.Fatalf("op %d: device %d read allocation %#x+%d+%d with hash %#x, want %#x", op, d, w.x.a.Addr(), w.off, w.leng, got, want)
				}
				record(op, fmt.Sprintf("device %d read", d), w.x, w.off, w.leng)
			}
			counts["kernel-read"]++
		case k < 66:
			// Kernels adding on both devices at once, on different
			// allocations.
			j := (i + 1 + rng.IntN(len(slots)-1)) % len(slots)
			for d, x := range []shadowed{sl, slots[j]} {
				off, length := span(len(x.shadow))
				require.NoError(t, s.Launch(Device(d), nil, "addOne", 1+rng.IntN(2), rangeParams(x.a.Addr()+uintptr(off), int64(length), 0)))
				for b := off; b < off+length; b++ {
					x.shadow[b]++
				}
				record(op, fmt.Sprintf("device %d add", d), x, off, length)
			}
			require.NoError(t, s.DeviceSynchronize(0), "op %d", op)
			require.NoError(t, s.DeviceSynchronize(1), "op %d", op)
			counts["kernel-add"]++
		case k < 82:
			off, length := span(n)
			if rng.IntN(8) == 0 {
				off, length = 0, n
			}
			p := processor()
			err := s.Prefetch(sl.a.Addr()+uintptr(off), int64(length), p)
			if coherence == "launch" { // no concurrent managed access: CUDA refuses it
				require.ErrorIs(t, err, ErrInvalidDevice, "op %d", op)
				counts["prefetch refused"]++
				break
			}
			require.NoError(t, err, "op %d", op)
			record(op, "prefetch to "+p.String(), sl, off, length)
			counts["prefetch"]++
		case k < 92:
			off, length := span(n)
			advice := Advice(1 + rng.IntN(6))
			p := processor()
			err := s.MemAdvise(sl.a.Addr()+uintptr(off), int64(length), advice, p)
			if coherence == "launch" && p != CPU && (advice == AdviseSetPreferredLocation || advice == AdviseSetAccessedBy) {
				require.ErrorIs(t, err, ErrInvalidDevice, "op %d", op) // as CUDA without concurrent managed access
				counts[advice.String()+" refused"]++
				break
			}
			require.NoError(t, err, "op %d", op)
			record(op, advice.String()+" "+p.String(), sl, off, length)
			counts[advice.String()]++
		case k < 97:
			verify(op, sl, 0, n)
			counts["verify-all"]++
		default:
			verify(op, sl, 0, n) // every byte of it, before it goes
			require.NoError(t, sl.a.Free())
			slots[i] = newAlloc()
			verify(op, slots[i], 0, len(slots[i].shadow))
			counts["free"]++
		}
	}
	for _, sl := range slots {
		verify(ops, sl, 0, len(sl.shadow))
	}
	st, err := s.Stats()
	require.NoError(t, err)
	t.Logf("%d operations %v", ops, fmt.Sprint(counts))
	t.Logf("faults: cpu %d, device 0 %d, device 1 %d; migrations %v; evicted %v; remote-mapped %v; read-duplicated %v; throttles %v; pins %v",
		st.FaultsBy(CPU).Total(), st.FaultsBy(0).Total(), st.FaultsBy(1).Total(), st.Migrations, st.Evicted, st.RemoteMapped, st.ReadDuplicated, st.Throttles, st.Pins)
	require.Positive(t, st.MigratedPages(0, 1)+st.MigratedPages(1, 0), "data moved between devices")
	require.Positive(t, st.EvictedPages(0)+st.EvictedPages(1), "arenas overflowed")
	require.Positive(t, st.ReadDuplicatedPages(CPU)+st.ReadDuplicatedPages(0)+st.ReadDuplicatedPages(1), "pages were duplicated")
	require.Positive(t, st.RemoteMappedPages(0)+st.RemoteMappedPages(1), "devices mapped remotely")
	t.Logf("refaults and the resident core: %+v", st.Refaults)
	if hostBudget > 0 {
		var protected, unprotected uint64
		for _, r := range st.Refaults {
			protected += r.Protected
			unprotected += r.Unprotected + r.Demoted
		}
		require.Positive(t, st.EvictedPages(CPU), "the host evicted")
		require.Positive(t, protected, "pages were protected")
		require.Positive(t, unprotected, "protections ended or gave way")
	}
}

// write writes random bytes at [off, off+length) from the host, and into
// the shadow.
func (sl shadowed) write(rng *rand.Rand, off, length int) {
	src := make([]byte, length)
	for j := range src {
		src[j] = byte(rng.Uint32())
	}
	copy(sl.a.Bytes()[off:], src)
	copy(sl.shadow[off:], src)
}
