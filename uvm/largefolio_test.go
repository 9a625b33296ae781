package uvm

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/softuvm/softuvm/devmem"
	"github.com/softuvm/softuvm/internal/config"
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
				for i := range want {
					if b[i] != want[i] {
						t.Fatalf("%s: byte %#x (page %d) is %d, want %d", step, i, i/PageSize, b[i], want[i])
					}
				}
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
