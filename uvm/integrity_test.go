package uvm

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
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

type shadowed struct {
	a      *Allocation
	shadow []byte
}

// TestDataIntegrity runs random host writes, reads, kernel-mode writes
// (read(2) into managed memory), prefetches to the device and back, and
// frees, and checks every byte against a shadow copy.
func TestDataIntegrity(t *testing.T) {
	s := newSession(t, testServerConfig())
	seed := uint64(time.Now().UnixNano())
	if v := os.Getenv("UVM_INTEGRITY_SEED"); v != "" {
		seed, _ = strconv.ParseUint(v, 10, 64)
	}
	t.Logf("seed %d (rerun with UVM_INTEGRITY_SEED)", seed)
	rng := rand.New(rand.NewPCG(seed, 0x5eed))
	var pipe [2]int
	require.NoError(t, syscall.Pipe(pipe[:]))
	defer syscall.Close(pipe[0])
	defer syscall.Close(pipe[1])

	newAlloc := func() shadowed {
		size := 1 + rng.Int64N(2<<20)
		if rng.IntN(4) == 0 {
			size = 1 + rng.Int64N(3*PageSize)
		}
		a, err := s.MallocManaged(size)
		require.NoError(t, err)
		return shadowed{a: a, shadow: make([]byte, size)}
	}
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
			src := make([]byte, length)
			for j := range src {
				src[j] = byte(rng.Uint32())
			}
			copy(sl.a.Bytes()[off:], src)
			copy(sl.shadow[off:], src)
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
