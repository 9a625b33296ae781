package engine

import (
	"bytes"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestCopyNonTemporal(t *testing.T) {
	src := make([]byte, 3*4096+77)
	for i := range src {
		src[i] = byte(i*31 + i>>8)
	}
	for _, dstOff := range []int{0, 1, 8, 15, 16, 63} {
		for _, srcOff := range []int{0, 3, 16} {
			for _, n := range []int{0, 1, 15, 16, 63, 64, 65, 200, 4096, 3 * 4096} {
				dst := make([]byte, n+dstOff+64)
				sentinel := bytes.Repeat([]byte{0xee}, len(dst))
				copy(dst, sentinel)
				got := CopyNonTemporal(dst[dstOff:dstOff+n], src[srcOff:srcOff+n])
				require.Equal(t, n, got)
				require.True(t, bytes.Equal(src[srcOff:srcOff+n], dst[dstOff:dstOff+n]), "dst+%d src+%d n=%d", dstOff, srcOff, n)
				require.True(t, bytes.Equal(sentinel[:dstOff], dst[:dstOff]), "nothing written before dst+%d", dstOff)
				require.True(t, bytes.Equal(sentinel[dstOff+n:], dst[dstOff+n:]), "nothing written past dst+%d+%d", dstOff, n)
			}
		}
	}
}

// BenchmarkCopyNonTemporal compares non-temporal stores with copy() on
// a buffer larger than the last-level cache.
func BenchmarkCopyNonTemporal(b *testing.B) {
	const size = 64 << 20
	src := bytes.Repeat([]byte{7}, size)
	dst := make([]byte, size)
	copy(dst, src) // warm: the pages exist
	b.Run("copy", func(b *testing.B) {
		b.SetBytes(size)
		for b.Loop() {
			copy(dst, src)
		}
	})
	b.Run("non-temporal", func(b *testing.B) {
		b.SetBytes(size)
		for b.Loop() {
			CopyNonTemporal(dst, src)
		}
	})
}
