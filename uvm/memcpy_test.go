package uvm

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/softuvm/softuvm/internal/config"
	"github.com/softuvm/softuvm/internal/server"
)

// copyConfig is one device large enough for size bytes of device memory
// and as much managed memory; directBelow forces the copy engine on (1)
// or leaves the calibration's choice (0).
func copyConfig(size, directBelow int64) ServerConfig {
	c := DefaultServerConfig()
	c.Devices = config.DeviceSpecs(1, []int64{2*size + 16<<20}, c.Devices[0].Backend)
	c.CopyDirectBelow = directBelow
	if directBelow > 0 {
		c.CopyProducers = 2
	}
	return c
}

// TestMemcpyEverySizeAndAlignment copies between every kind of memory,
// at sizes from a byte to tens of MiB, starting and ending off page and
// off word boundaries, with the engine as calibrated and forced on for
// every size, and checks the bytes and that nothing around the
// destination changed.
func TestMemcpyEverySizeAndAlignment(t *testing.T) {
	const capacity = 40 << 20
	for _, engine := range []struct {
		name        string
		directBelow int64
	}{{"calibrated", 0}, {"engine", 1}} {
		t.Run(engine.name, func(t *testing.T) {
			s := newSession(t, copyConfig(capacity, engine.directBelow))
			devA, err := s.Malloc(0, capacity)
			require.NoError(t, err)
			devB, err := s.Malloc(0, capacity)
			require.NoError(t, err)
			managed, err := s.MallocManaged(capacity)
			require.NoError(t, err)
			host := make([]byte, capacity)
			back := make([]byte, capacity)
			for _, size := range []int64{1, 2, 63, 64, 4095, 4096, 4097, 64<<10 - 1, 64<<10 + 1, 1<<20 + 3, 8<<20 + 13, 33<<20 + 7} {
				for _, off := range []int64{0, 1, PageSize - 3} {
					if off+size+2*PageSize > capacity {
						continue
					}
					src := pattern(int(size), byte(size)+byte(off))
					copy(host[off:], src)
					name := fmt.Sprintf("%d bytes at +%d", size, off)
					// Host -> device A -> device B -> managed -> device A -> host,
					// each at its own offset so that ends fall differently.
					steps := []struct {
						dst, src uintptr
						kind     MemcpyKind
					}{
						{devA.Addr() + uintptr(off), addr(host) + uintptr(off), MemcpyHostToDevice},
						{devB.Addr() + uintptr(off) + 5, devA.Addr() + uintptr(off), MemcpyDeviceToDevice},
						{managed.Addr() + uintptr(off) + 3, devB.Addr() + uintptr(off) + 5, MemcpyDeviceToHost},
						{devA.Addr() + 7, managed.Addr() + uintptr(off) + 3, MemcpyDefault},
						{addr(back) + PageSize, devA.Addr() + 7, MemcpyDeviceToHost},
					}
					clear(back)
					for _, st := range steps {
						require.NoError(t, s.Memcpy(st.dst, st.src, size, st.kind), "%s %v", name, st.kind)
					}
					sameBytes(t, src, back[PageSize:PageSize+size], name)
					// A page on each side of the last destination.
					sameBytes(t, make([]byte, PageSize), back[:PageSize], name+": nothing before the destination changed")
					sameBytes(t, make([]byte, PageSize), back[PageSize+size:2*PageSize+size], name+": nothing after it changed")
				}
			}
			// Memset through the same mappings, unaligned, then read back.
			require.NoError(t, s.Memset(devB.Addr()+3, 0xa5, 5<<20+1))
			require.NoError(t, s.Memcpy(addr(back), devB.Addr(), 5<<20+5, MemcpyDeviceToHost))
			assert.NotEqual(t, byte(0xa5), back[2])
			for i := 3; i < 5<<20+4; i++ {
				if back[i] != 0xa5 {
					t.Fatalf("memset: byte %d is %#x", i, back[i])
				}
			}
		})
	}
}

// TestMemcpyOneGiB copies 1 GiB, less a few bytes at each end, to device
// memory and back.
func TestMemcpyOneGiB(t *testing.T) {
	if testing.Short() {
		t.Skip("copies 1 GiB three times")
	}
	const size = 1 << 30
	s := newSession(t, copyConfig(size, 0))
	dev, err := s.Malloc(0, size)
	require.NoError(t, err)
	src := pattern(size, 3)
	back := make([]byte, size)
	require.NoError(t, s.Memcpy(dev.Addr()+3, addr(src)+3, size-7, MemcpyHostToDevice))
	require.NoError(t, s.Memcpy(addr(back)+3, dev.Addr()+3, size-7, MemcpyDeviceToHost))
	assert.Equal(t, make([]byte, 3), back[:3])
	assert.Equal(t, make([]byte, 4), back[size-4:])
	sameBytes(t, src[3:size-4], back[3:size-4], "1 GiB there and back")
	st, err := dev.Stats()
	require.NoError(t, err)
	assert.Equal(t, uint64(size/PageSize), st.PopulatedPages(0), "the server counts the pages the client wrote into device memory")
}

// TestMemcpyDeviceOverlap refuses overlapping copies within device
// memory, as cudaMemcpy does for every kind, and copies adjacent ones.
func TestMemcpyDeviceOverlap(t *testing.T) {
	s := newSession(t, copyConfig(4<<20, 0))
	dev, err := s.Malloc(0, 4<<20)
	require.NoError(t, err)
	err = s.Memcpy(dev.Addr()+4096, dev.Addr(), 8192, MemcpyDeviceToDevice)
	require.ErrorIs(t, err, ErrInvalidValue)
	assert.Contains(t, err.Error(), "overlap")
	require.NoError(t, s.Memcpy(dev.Addr()+8192, dev.Addr(), 8192, MemcpyDeviceToDevice), "adjacent ranges do not overlap")
}

// TestMemcpyRacesWithMigrations copies into and out of managed memory
// while other goroutines prefetch the same range to the device and back
// and write other bytes of it, with every move through the engine: no
// byte may be lost or come from the wrong copy.
func TestMemcpyRacesWithMigrations(t *testing.T) {
	const size = 16 << 20
	s := newSession(t, copyConfig(size, 1))
	managed, err := s.MallocManaged(size)
	require.NoError(t, err)
	dev, err := s.Malloc(0, size)
	require.NoError(t, err)
	half := int64(size / 2)
	want := pattern(int(half), 9)
	require.NoError(t, s.Memcpy(dev.Addr(), addr(want), half, MemcpyHostToDevice))
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { // migrations of the whole range, back and forth
		defer wg.Done()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			to := Device(0)
			if i%2 == 1 {
				to = CPU
			}
			assert.NoError(t, s.Prefetch(managed.Addr(), size, to))
		}
	}()
	go func() { // host faults on the second half, which no copy touches
		defer wg.Done()
		b := managed.Bytes()[half:]
		for round := byte(1); ; round++ {
			select {
			case <-stop:
				return
			default:
			}
			for i := 0; i < len(b); i += PageSize {
				b[i] = round
			}
			for i := 0; i < len(b); i += PageSize {
				if b[i] != round {
					t.Errorf("byte %d of the second half is %d, want %d", i, b[i], round)
					return
				}
			}
		}
	}()
	back := make([]byte, half)
	for round := 0; round < 20; round++ {
		require.NoError(t, s.Memcpy(managed.Addr(), dev.Addr(), half, MemcpyDeviceToHost))
		clear(back)
		require.NoError(t, s.Memcpy(addr(back), managed.Addr(), half, MemcpyDefault))
		if !assert.Equal(t, want, back, "round %d", round) {
			break
		}
	}
	close(stop)
	wg.Wait()
}

// TestMemcpyLeavesNoGoroutines: the session's copy engine stops with it.
func TestMemcpyLeavesNoGoroutines(t *testing.T) {
	requireRoot(t)
	before := runtime.NumGoroutine()
	s, err := Connect(Config{Server: "private", Private: copyConfig(32<<20, 1)})
	require.NoError(t, err)
	dev, err := s.Malloc(0, 32<<20)
	require.NoError(t, err)
	src := pattern(32<<20, 1)
	require.NoError(t, s.Memcpy(dev.Addr(), addr(src), 32<<20, MemcpyHostToDevice))
	assert.Greater(t, runtime.NumGoroutine(), before, "the copy engine's producers run")
	require.NoError(t, s.Close())
	Eventually(t, 5*time.Second, func() bool { return runtime.NumGoroutine() <= before },
		"%d goroutines after Close, %d before Connect", runtime.NumGoroutine(), before)
}

func init() { testRoles["prefetch-round-trip"] = rolePrefetchRoundTrip }

// rolePrefetchRoundTrip moves 8 MiB of managed memory to device 0 and
// back through the daemon at UVM_SOCKET and checks the bytes.
func rolePrefetchRoundTrip() int {
	s, err := Connect(Config{Server: "daemon", Socket: os.Getenv(EnvSocket)})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer s.Close()
	a, err := s.MallocManaged(8 << 20)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	want := pattern(8<<20, 5)
	copy(a.Bytes(), want)
	for _, d := range []Device{0, CPU} {
		if err := s.Prefetch(a.Addr(), 8<<20, d); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
	}
	if string(a.Bytes()) != string(want) {
		fmt.Fprintln(os.Stderr, "the bytes changed on the way")
		return 1
	}
	return 0
}

// TestServerCloseLeavesNoGoroutines: a server whose migrations went
// through the copy engine's producers, releaser and block movers leaves
// no goroutine behind when it closes. A first server, closed before
// counting, starts what a process starts once (the signal goroutines of
// the userfaultfd readers).
func TestServerCloseLeavesNoGoroutines(t *testing.T) {
	requireRoot(t)
	cycle := func() {
		cfg := testServerConfig()
		cfg.Guard = false
		cfg.CopyDirectBelow, cfg.CopyProducers = 1, 2
		srv, err := server.NewServer(cfg)
		require.NoError(t, err)
		path := filepath.Join(t.TempDir(), "uvm.sock")
		l, err := server.ListenUnix(path)
		require.NoError(t, err)
		served := make(chan struct{})
		go func() { defer close(served); srv.Serve(l) }()
		out, err := child(t, "prefetch-round-trip", EnvSocket+"="+path).CombinedOutput()
		require.NoError(t, err, "%s", out)
		assert.Positive(t, srv.Stats().MigratedPages(CPU, 0))
		require.NoError(t, srv.Close())
		<-served
	}
	cycle()
	before := runtime.NumGoroutine()
	cycle()
	deadline := time.Now().Add(5 * time.Second)
	for runtime.NumGoroutine() > before && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if n := runtime.NumGoroutine(); n > before {
		buf := make([]byte, 1<<20)
		t.Fatalf("%d goroutines after Close, %d before NewServer:\n%s", n, before, buf[:runtime.Stack(buf, true)])
	}
}
