package uvm

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/softuvm/softuvm/devmem"
	"github.com/softuvm/softuvm/internal/config"
)

// TestConcurrentFaultsPrefetchesEvictionsAndKernels: several threads
// fault on their own parts of one allocation, checking each span against
// their shadow before they overwrite it, while others prefetch random,
// overlapping ranges of the whole allocation to every processor, and
// kernels on both devices write the rest, checked after each
// synchronize. The arenas hold a quarter of the allocation, so eviction
// runs while other faults are in flight; every byte is checked at the end.
// It runs with location files of 4 KiB folios and of large folios.
func TestConcurrentFaultsPrefetchesEvictionsAndKernels(t *testing.T) {
	for _, mode := range []string{config.LargeFoliosOff, config.LargeFoliosAuto} {
		t.Run("large-folios="+mode, func(t *testing.T) {
			if mode == config.LargeFoliosAuto {
				if err := devmem.LargeFoliosAvailable(); err != nil {
					t.Skipf("no large folios here: %v", err)
				}
			}
			stressFaultsPrefetchesEvictionsAndKernels(t, mode, "")
		})
	}
}

// TestConcurrentFaultsUnderEveryEviction: the same, with large folios,
// under each eviction policy that can be chosen besides the default.
// Each must make room on a full device whatever it lists: clock:regions
// once offered the block being served, alone, again and again, and the
// fault failed with the device full of active blocks.
func TestConcurrentFaultsUnderEveryEviction(t *testing.T) {
	if err := devmem.LargeFoliosAvailable(); err != nil {
		t.Skipf("no large folios here: %v", err)
	}
	for _, eviction := range []string{"lru", "2q", "clock:blocks", "clock:regions", "clock:copy"} {
		t.Run(eviction, func(t *testing.T) {
			stressFaultsPrefetchesEvictionsAndKernels(t, config.LargeFoliosAuto, eviction)
		})
	}
}

// stressFaultsPrefetchesEvictionsAndKernels runs the stress with large
// folios as named and the eviction policy named ("": the default).
func stressFaultsPrefetchesEvictionsAndKernels(t *testing.T, largeFolios, eviction string) {
	cfg := DefaultServerConfig()
	cfg.LargeFolios = largeFolios
	if eviction != "" {
		cfg.Eviction = eviction
	}
	cfg.Devices = config.DeviceSpecs(2, []int64{4 << 20}, cfg.Devices[0].Backend)
	cfg.DeviceWorkers = 2
	s := newSession(t, cfg)
	const (
		size       = 16 << 20
		writers    = 4
		perWriter  = 2 << 20 // writer w owns [w*perWriter, (w+1)*perWriter)
		kernelPart = size - writers*perWriter
		ops        = 6000
	)
	a, err := s.MallocManaged(size)
	require.NoError(t, err)
	mem := a.Bytes()
	seed := integritySeed(t)
	errs := make(chan error, writers+4)
	var wg sync.WaitGroup
	for w := 0; w < writers; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(seed, uint64(w)))
			base := w * perWriter
			part := mem[base : base+perWriter]
			shadow := make([]byte, perWriter)
			for op := 0; op < ops; op++ {
				length := 1 + rng.IntN([]int{64, PageSize, 5 * PageSize, 64 << 10}[rng.IntN(4)])
				off := rng.IntN(perWriter - length + 1)
				if !bytes.Equal(part[off:off+length], shadow[off:off+length]) {
					for i := off; i < off+length; i++ {
						if part[i] != shadow[i] {
							errs <- fmt.Errorf("writer %d, op %d: byte %#x is %#x, want %#x", w, op, base+i, part[i], shadow[i])
							return
						}
					}
				}
				for i := off; i < off+length; i++ {
					shadow[i] = byte(rng.Uint32())
				}
				copy(part[off:off+length], shadow[off:off+length])
			}
			if !bytes.Equal(part, shadow) {
				errs <- fmt.Errorf("writer %d: its part differs from its shadow at the end", w)
			}
		}(w)
	}
	stop := make(chan struct{})
	var helpers sync.WaitGroup
	for p := 0; p < 2; p++ {
		helpers.Add(1)
		go func(p int) {
			defer helpers.Done()
			rng := rand.New(rand.NewPCG(seed, 100+uint64(p)))
			for n := 0; ; n++ {
				select {
				case <-stop:
					return
				default:
				}
				length := int64(1 + rng.IntN(4<<20))
				off := rng.Int64N(size - length + 1)
				if err := s.Prefetch(a.Addr()+uintptr(off), length, Device(rng.IntN(3)-1)); err != nil {
					errs <- fmt.Errorf("prefetcher %d, prefetch %d: %w", p, n, err)
					return
				}
			}
		}(p)
	}
	helpers.Add(1)
	go func() {
		defer helpers.Done()
		rng := rand.New(rand.NewPCG(seed, 200))
		region := mem[writers*perWriter:]
		for n := 0; ; n++ {
			select {
			case <-stop:
				return
			default:
			}
			d := Device(n % 2)
			kseed := rng.Uint64()
			if err := s.Launch(d, nil, "writeSeeded", 2, params(uint64(a.Addr())+writers*perWriter, kernelPart, kseed)); err != nil {
				errs <- fmt.Errorf("launch %d: %w", n, err)
				return
			}
			if err := s.DeviceSynchronize(d); err != nil {
				errs <- fmt.Errorf("kernel %d: %w", n, err)
				return
			}
			for i := range region {
				if region[i] != seededByte(kseed, i) {
					errs <- fmt.Errorf("kernel %d on %v: byte %#x is %#x, want %#x", n, d, writers*perWriter+i, region[i], seededByte(kseed, i))
					return
				}
			}
		}
	}()
	wg.Wait()
	close(stop)
	helpers.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	st, err := a.Stats()
	require.NoError(t, err)
	t.Logf("faults: cpu %d, device 0 %d, device 1 %d; evicted %v; migrations %v", st.FaultsBy(CPU).Total(), st.FaultsBy(0).Total(), st.FaultsBy(1).Total(), st.Evicted, st.Migrations)
	assert.Positive(t, st.EvictedPages(0)+st.EvictedPages(1), "the arenas overflowed while faults were in flight")
	assert.Positive(t, st.FaultsBy(0).Total()+st.FaultsBy(1).Total(), "the kernels faulted")
	assert.Positive(t, st.MigratedPages(0, CPU)+st.MigratedPages(1, CPU), "pages came back to the host")
}
