package devmem

import (
	"errors"
	"math"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func itoa(i int) string { return strconv.Itoa(i) }

func TestArenaSpecValidate(t *testing.T) {
	for _, tc := range []struct {
		name string
		spec ArenaSpec
		want string // "" for valid
	}{
		{"memfd", ArenaSpec{Device: 0, Capacity: PageSize, Backend: BackendMemfd, Node: -1}, ""},
		{"numa node 3", ArenaSpec{Device: 7, Capacity: 1 << 30, Backend: BackendNUMA, Node: 3}, ""},
		{"auto zero node", ArenaSpec{Capacity: 1 << 20}, ""},
		{"zero capacity", ArenaSpec{Capacity: 0}, "arena capacity 0: want a positive multiple of 4096 bytes"},
		{"negative capacity", ArenaSpec{Capacity: -PageSize}, "arena capacity -4096: want a positive multiple of 4096 bytes"},
		{"unaligned capacity", ArenaSpec{Capacity: PageSize + 1}, "arena capacity 4097: want a positive multiple of 4096 bytes"},
		{"negative device", ArenaSpec{Device: -1, Capacity: PageSize}, "arena device -1: want >= 0"},
		{"unknown backend", ArenaSpec{Capacity: PageSize, Backend: 7}, "arena backend 7: want auto, memfd or numa"},
		{"negative backend", ArenaSpec{Capacity: PageSize, Backend: -1}, "arena backend -1: want auto, memfd or numa"},
		{"node below -1", ArenaSpec{Capacity: PageSize, Node: -2}, "arena node -2: want -1 (pick by device) or a node number >= 0"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.spec.Validate()
			if tc.want == "" {
				assert.NoError(t, err)
				return
			}
			assert.EqualError(t, err, tc.want)
			_, err = NewArena(tc.spec)
			assert.EqualError(t, err, tc.want, "NewArena validates too")
		})
	}
	// Checked against the machine by NewArena: a node that is not there.
	_, err := NewArena(ArenaSpec{Device: 2, Capacity: PageSize, Backend: BackendNUMA, Node: 1000})
	assert.ErrorContains(t, err, "device 2 arena: NUMA node 1000 does not exist: want one of the online nodes")
}

func TestArenaSpecString(t *testing.T) {
	s := ArenaSpec{Device: 1, Capacity: 1 << 30, Backend: BackendNUMA, Node: -1}
	assert.Equal(t, "device=1 capacity=1073741824 backend=numa node=-1", s.String())
	assert.Equal(t, "device=0 capacity=0 backend=Backend(9) node=0", ArenaSpec{Backend: 9}.String())
}

func TestBackendParse(t *testing.T) {
	for _, b := range []Backend{BackendAuto, BackendMemfd, BackendNUMA} {
		got, err := ParseBackend(b.String())
		require.NoError(t, err)
		assert.Equal(t, b, got)

		text, err := b.MarshalText()
		require.NoError(t, err)
		var back Backend
		require.NoError(t, back.UnmarshalText(text))
		assert.Equal(t, b, back)
	}
	assert.Equal(t, []string{"auto", "memfd", "numa"}, []string{BackendAuto.String(), BackendMemfd.String(), BackendNUMA.String()})
	_, err := ParseBackend("gpu")
	assert.EqualError(t, err, `arena backend "gpu": want auto, memfd or numa`)
	_, err = ParseBackend("NUMA")
	assert.Error(t, err, "names are case-sensitive, like the flags that carry them")
	_, err = Backend(4).MarshalText()
	assert.Error(t, err)
	var b Backend
	assert.Error(t, b.UnmarshalText([]byte("")))
}

// resolveSpec on the fixture machines: what NewArena decides where the
// test machine cannot show it (two nodes, a CPU-only node, no NUMA, a
// kernel refusing mbind).
func TestResolveSpec(t *testing.T) {
	machine := func(name string) []Node {
		nodes, err := readNodes("testdata/" + name)
		require.NoError(t, err)
		return nodes
	}
	probeOK := func(int) error { return nil }
	refused := errors.New("operation not permitted")
	probeFails := func(int) error { return refused }

	for _, tc := range []struct {
		name     string
		machine  string
		spec     ArenaSpec
		probe    func(int) error
		want     ArenaSpec
		fellBack bool
		err      string
	}{
		{"auto one node", "1node", ArenaSpec{Device: 1, Capacity: PageSize, Node: -1}, probeOK,
			ArenaSpec{Device: 1, Capacity: PageSize, Backend: BackendMemfd, Node: -1}, false, ""},
		{"auto no numa", "nonode", ArenaSpec{Device: 0, Capacity: PageSize, Node: -1}, probeOK,
			ArenaSpec{Device: 0, Capacity: PageSize, Backend: BackendMemfd, Node: -1}, false, ""},
		{"auto two nodes device 0", "2node", ArenaSpec{Device: 0, Capacity: PageSize, Node: -1}, probeOK,
			ArenaSpec{Device: 0, Capacity: PageSize, Backend: BackendNUMA, Node: 0}, false, ""},
		{"auto two nodes device 3", "2node", ArenaSpec{Device: 3, Capacity: PageSize, Node: -1}, probeOK,
			ArenaSpec{Device: 3, Capacity: PageSize, Backend: BackendNUMA, Node: 1}, false, ""},
		{"auto two nodes explicit node", "2node", ArenaSpec{Device: 0, Capacity: PageSize, Node: 1}, probeOK,
			ArenaSpec{Device: 0, Capacity: PageSize, Backend: BackendNUMA, Node: 1}, false, ""},
		{"auto cpu-only second node", "2node-cpuonly", ArenaSpec{Device: 1, Capacity: PageSize, Node: -1}, probeOK,
			ArenaSpec{Device: 1, Capacity: PageSize, Backend: BackendMemfd, Node: -1}, false, ""},
		{"auto mbind refused falls back", "2node", ArenaSpec{Device: 0, Capacity: PageSize, Node: -1}, probeFails,
			ArenaSpec{Device: 0, Capacity: PageSize, Backend: BackendMemfd, Node: -1}, true, ""},
		{"memfd ignores node", "2node", ArenaSpec{Device: 0, Capacity: PageSize, Backend: BackendMemfd, Node: 1}, probeOK,
			ArenaSpec{Device: 0, Capacity: PageSize, Backend: BackendMemfd, Node: -1}, false, ""},
		{"numa one node", "1node", ArenaSpec{Device: 4, Capacity: PageSize, Backend: BackendNUMA, Node: -1}, probeOK,
			ArenaSpec{Device: 4, Capacity: PageSize, Backend: BackendNUMA, Node: 0}, false, ""},
		{"numa device mod nodes", "2node", ArenaSpec{Device: 5, Capacity: PageSize, Backend: BackendNUMA, Node: -1}, probeOK,
			ArenaSpec{Device: 5, Capacity: PageSize, Backend: BackendNUMA, Node: 1}, false, ""},
		{"numa skips cpu-only node", "2node-cpuonly", ArenaSpec{Device: 1, Capacity: PageSize, Backend: BackendNUMA, Node: -1}, probeOK,
			ArenaSpec{Device: 1, Capacity: PageSize, Backend: BackendNUMA, Node: 0}, false, ""},
		{"numa no such node", "1node", ArenaSpec{Device: 0, Capacity: PageSize, Backend: BackendNUMA, Node: 1}, probeOK,
			ArenaSpec{}, false, "device 0 arena: NUMA node 1 does not exist: want one of the online nodes [0]"},
		{"numa node without memory", "2node-cpuonly", ArenaSpec{Device: 0, Capacity: PageSize, Backend: BackendNUMA, Node: 1}, probeOK,
			ArenaSpec{}, false, "device 0 arena: NUMA node 1 has no memory: want one of [0]"},
		{"numa capacity beyond node", "2node", ArenaSpec{Device: 0, Capacity: 1 << 40, Backend: BackendNUMA, Node: 0}, probeOK,
			ArenaSpec{}, false, "device 0 arena: capacity 1099511627776 bytes exceeds NUMA node 0's 16777216000 bytes of memory"},
		{"numa mbind refused", "2node", ArenaSpec{Device: 0, Capacity: PageSize, Backend: BackendNUMA, Node: 1}, probeFails,
			ArenaSpec{}, false, "device 0 arena: binding memory to NUMA node 1 does not work: operation not permitted"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, err := resolveSpec(tc.spec, machine(tc.machine), nil, tc.probe)
			if tc.err != "" {
				assert.EqualError(t, err, tc.err)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.want, r.spec)
			if tc.fellBack {
				assert.ErrorIs(t, r.fallback, refused)
				assert.ErrorContains(t, r.fallback, "device 0 arena: binding memory to NUMA node 0 does not work")
			} else {
				assert.NoError(t, r.fallback)
			}
		})
	}

	// Without a node list, Auto falls back and NUMA fails, both saying why.
	noList := errors.New("no sysfs")
	r, err := resolveSpec(ArenaSpec{Capacity: PageSize, Node: -1}, nil, noList, probeOK)
	require.NoError(t, err)
	assert.Equal(t, BackendMemfd, r.spec.Backend)
	assert.ErrorIs(t, r.fallback, noList)
	_, err = resolveSpec(ArenaSpec{Capacity: PageSize, Backend: BackendNUMA, Node: -1}, nil, noList, probeOK)
	assert.EqualError(t, err, "device 0 arena: list NUMA nodes: no sysfs")
}

func newMemfdArena(t *testing.T, pages int64) *Arena {
	t.Helper()
	a, err := NewArena(ArenaSpec{Device: 0, Capacity: pages * PageSize, Backend: BackendMemfd, Node: -1})
	require.NoError(t, err)
	return a
}

func TestArenaReserveRelease(t *testing.T) {
	a := newMemfdArena(t, 256)
	assert.Equal(t, 0, a.Device())
	assert.Equal(t, int64(1<<20), a.Capacity())
	assert.Equal(t, int64(0), a.UsedBytes())
	assert.Equal(t, int64(1<<20), a.FreeBytes())

	require.NoError(t, a.Reserve(0))
	require.NoError(t, a.Reserve(200))
	require.NoError(t, a.Reserve(56))
	assert.Equal(t, int64(1<<20), a.UsedBytes())
	assert.Zero(t, a.FreeBytes())

	err := a.Reserve(2)
	assert.EqualError(t, err, "device 0 arena full: 1048576 of 1048576 bytes used, 8192 more requested")
	assert.ErrorIs(t, err, ErrArenaFull)
	var full *ArenaFullError
	require.ErrorAs(t, err, &full)
	assert.Equal(t, ArenaFullError{Device: 0, Capacity: 1 << 20, Used: 1 << 20, Requested: 8192}, *full)
	assert.Equal(t, int64(1<<20), a.UsedBytes(), "a failed reserve changes nothing")

	a.Release(100)
	assert.Equal(t, int64(156*PageSize), a.UsedBytes())
	err = a.Reserve(101)
	assert.EqualError(t, err, "device 0 arena full: 638976 of 1048576 bytes used, 413696 more requested")
	require.NoError(t, a.Reserve(100))

	err = a.Reserve(math.MaxInt64)
	assert.ErrorIs(t, err, ErrArenaFull)
	assert.ErrorContains(t, err, "9223372036854775807 more requested", "saturates instead of overflowing")
	assert.ErrorContains(t, a.Reserve(-1), "device 0 arena: reserve -1 pages: want >= 0")

	a.Release(256)
	assert.Zero(t, a.UsedBytes())
	assert.Zero(t, a.AccountingErrors())
	assert.Equal(t, "", a.LastAccountingError())
}

// Releasing more than was reserved is someone else's bug: the arena
// survives it, clamps to zero and records it.
func TestArenaReleaseUnderflow(t *testing.T) {
	a := newMemfdArena(t, 16)
	require.NoError(t, a.Reserve(2))
	a.Release(3)
	assert.Zero(t, a.UsedBytes(), "clamped")
	assert.Equal(t, int64(1), a.AccountingErrors())
	assert.Equal(t, "device 0 arena: release 3 pages (12288 bytes) with only 8192 bytes reserved", a.LastAccountingError())

	a.Release(-4)
	assert.Equal(t, int64(2), a.AccountingErrors())
	assert.Equal(t, "device 0 arena: release -4 pages: want >= 0", a.LastAccountingError())

	a.Release(math.MaxInt64)
	assert.Equal(t, int64(3), a.AccountingErrors())
	assert.Zero(t, a.UsedBytes())

	a.Release(0)
	assert.Equal(t, int64(3), a.AccountingErrors(), "releasing nothing is not an error")
	require.NoError(t, a.Reserve(16), "still usable")
}

// Many goroutines reserving at once never push the arena past its
// capacity, and exactly capacity's worth of single pages succeed.
func TestArenaReserveConcurrent(t *testing.T) {
	const pages, workers, tries = 1000, 16, 200
	a := newMemfdArena(t, pages)
	var granted atomic.Int64
	var over atomic.Int64
	var wg sync.WaitGroup
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < tries; i++ {
				err := a.Reserve(1)
				if err == nil {
					granted.Add(1)
				} else if !errors.Is(err, ErrArenaFull) {
					t.Errorf("reserve: %v", err)
				}
				if a.UsedBytes() > a.Capacity() {
					over.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	assert.Equal(t, int64(pages), granted.Load())
	assert.Equal(t, a.Capacity(), a.UsedBytes())
	assert.Zero(t, over.Load())

	// Mixed sizes, reserving and releasing concurrently.
	a.Release(pages)
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < tries; i++ {
				n := int64(1 + (w+i)%97)
				if a.Reserve(n) == nil {
					if a.UsedBytes() > a.Capacity() {
						over.Add(1)
					}
					a.Release(n)
				}
			}
		}()
	}
	wg.Wait()
	assert.Zero(t, over.Load())
	assert.Zero(t, a.UsedBytes())
	assert.Zero(t, a.AccountingErrors())
}

// A memfd arena's files are plain location files.
func TestArenaNewFileMemfd(t *testing.T) {
	a := newMemfdArena(t, 16)
	f, err := a.NewFile("dev0-client7")
	require.NoError(t, err)
	defer f.Close()
	assert.Equal(t, "dev0-client7", f.Name())
	assert.Equal(t, int64(FileSize), f.Size())
	assert.Equal(t, -1, f.Node())
	m := mapFile(t, f, 1<<40, PageSize)
	bound, _, err := PolicyOfAddress(m.Addr())
	require.NoError(t, err)
	assert.False(t, bound)
}
