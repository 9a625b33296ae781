package coursework_test

import (
	"os"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	_ "github.com/softuvm/softuvm/policy/coursework"
	"github.com/softuvm/softuvm/uvm"
)

// The private server is a re-execution of this test binary: Main runs it,
// and the package's init functions have registered the policies there
// too.
func TestMain(m *testing.M) {
	uvm.Main()
	os.Exit(m.Run())
}

func session(t *testing.T, cfg uvm.ServerConfig) *uvm.Session {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: /dev/userfaultfd is root-only here")
	}
	s, err := uvm.Connect(uvm.Config{Server: "private", Private: cfg})
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, s.Close()) })
	return s
}

// TestEvensPrefetch selects the evens policy by name for the whole server
// and faults one odd page of a fresh block: the server brings the block's
// 256 even pages with it, and says so.
func TestEvensPrefetch(t *testing.T) {
	cfg := uvm.DefaultServerConfig()
	var err error
	cfg.Prefetch, err = uvm.ParsePrefetchSpec("evens")
	require.NoError(t, err)
	s := session(t, cfg)
	in, err := s.Info()
	require.NoError(t, err)
	assert.Equal(t, "evens", in.Prefetch)

	a, err := s.MallocManaged(uvm.BlockSize)
	require.NoError(t, err)
	b := a.Bytes()
	b[5*uvm.PageSize] = 7 // page 5: odd
	st, err := a.Stats()
	require.NoError(t, err)
	assert.Equal(t, uint64(uvm.BlockSize/uvm.PageSize/2), st.PrefetchedPages, "every even page of the block came with the fault")
	assert.Equal(t, uint64(uvm.BlockSize/uvm.PageSize/2+1), st.PopulatedPages(uvm.CPU), "the even pages and the faulted one")
	assert.Equal(t, byte(7), b[5*uvm.PageSize])
}

// TestMRUEviction fills a device of three blocks in the order a, b, c and
// then prefetches a fourth: MRU evicts c, where the default LRU would
// evict a.
func TestMRUEviction(t *testing.T) {
	for _, tc := range []struct {
		eviction string
		victim   int
	}{{"mru", 2}, {"lru", 0}} {
		t.Run(tc.eviction, func(t *testing.T) {
			cfg := uvm.DefaultServerConfig()
			cfg.Devices[0].Capacity = 3 * uvm.BlockSize
			cfg.Eviction = tc.eviction
			s := session(t, cfg)
			in, err := s.Info()
			require.NoError(t, err)
			assert.Equal(t, tc.eviction, in.Eviction)

			var allocs []*uvm.Allocation
			for i := 0; i < 4; i++ {
				a, err := s.MallocManaged(uvm.BlockSize)
				require.NoError(t, err)
				b := a.Bytes()
				for p := 0; p < len(b); p += uvm.PageSize {
					b[p] = byte(i + 1)
				}
				allocs = append(allocs, a)
			}
			for _, a := range allocs {
				require.NoError(t, a.Prefetch(0))
			}
			for i, a := range allocs {
				st, err := a.Stats()
				require.NoError(t, err)
				want := uint64(0)
				if i == tc.victim {
					want = uvm.BlockSize / uvm.PageSize
				}
				assert.Equal(t, want, st.EvictedPages(0), "allocation %d evicted from device 0", i)
				b := a.Bytes()
				for p := 0; p < len(b); p += uvm.PageSize {
					if b[p] != byte(i+1) {
						t.Fatalf("allocation %d page %d reads %d, want %d", i, p/uvm.PageSize, b[p], i+1)
					}
				}
			}
		})
	}
}
