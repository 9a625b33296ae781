package uvm

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestMemcpy2D: 2D copies and fills with pitches between managed, device
// and ordinary memory, every byte of each box checked and every byte
// between the rows left as it was.
func TestMemcpy2D(t *testing.T) {
	s := newSession(t, twoDeviceConfig())
	const width, height, spitch, hpitch = 200, 50, 300, 256
	pat := func(x, y int) byte { return byte(x*7 + y*13 + 1) }
	src, err := s.MallocManaged(spitch * height)
	require.NoError(t, err)
	sb := src.Bytes()
	for y := range height {
		for x := range spitch {
			sb[y*spitch+x] = 0xaa
			if x < width {
				sb[y*spitch+x] = pat(x, y)
			}
		}
	}
	dev, dpitch, err := s.MallocPitch(0, width, height)
	require.NoError(t, err)
	back := make([]byte, hpitch*height)
	for i := range back {
		back[i] = 0xee
	}
	check := func(what string, want func(x, y int) byte) {
		t.Helper()
		bad := 0
		for y := range height {
			for x := range hpitch {
				w := byte(0xee)
				if x < width {
					w = want(x, y)
				}
				if back[y*hpitch+x] != w {
					if bad++; bad < 4 {
						t.Errorf("%s: (%d,%d) is %#x, want %#x", what, x, y, back[y*hpitch+x], w)
					}
				}
			}
		}
	}
	require.NoError(t, s.Memcpy2D(dev.Addr(), dpitch, src.Addr(), spitch, width, height, MemcpyHostToDevice))
	require.NoError(t, s.Memcpy2D(addr(back), hpitch, dev.Addr(), dpitch, width, height, MemcpyDeviceToHost))
	check("round trip", pat)

	require.NoError(t, s.Memset2D(dev.Addr()+10, dpitch, 0x5c, 50, height-1))
	require.NoError(t, s.Memcpy2D(addr(back), hpitch, dev.Addr(), dpitch, width, height, MemcpyDefault))
	check("fill", func(x, y int) byte {
		if x >= 10 && x < 60 && y < height-1 {
			return 0x5c
		}
		return pat(x, y)
	})

	st, err := s.StreamCreate(0)
	require.NoError(t, err)
	require.NoError(t, s.Memcpy2DAsync(dev.Addr(), dpitch, src.Addr(), spitch, width, height, MemcpyDefault, st))
	require.NoError(t, s.StreamSynchronize(st))
	require.NoError(t, s.Memset2DAsync(dev.Addr(), dpitch, 0x11, 5, height, nil), "a nil stream: the device's default")
	require.NoError(t, s.DefaultStreamSynchronize(0))
	require.NoError(t, s.Memcpy2D(addr(back), hpitch, dev.Addr(), dpitch, width, height, MemcpyDefault))
	check("in stream order", func(x, y int) byte {
		if x < 5 {
			return 0x11
		}
		return pat(x, y)
	})
	require.NoError(t, s.StreamDestroy(st))

	assert.ErrorIs(t, s.Memcpy2D(dev.Addr(), 100, src.Addr(), spitch, width, height, MemcpyDefault), ErrInvalidPitchValue)
	assert.ErrorIs(t, s.Memcpy2D(dev.Addr(), dpitch, src.Addr(), 199, width, height, MemcpyDefault), ErrInvalidValue)
	assert.ErrorIs(t, s.Memset2D(dev.Addr(), 1<<32, 0, width, 2), ErrInvalidPitchValue)
	assert.ErrorIs(t, s.Memcpy2D(dev.Addr(), dpitch, src.Addr(), spitch, width, height+1, MemcpyDefault), ErrInvalidValue, "past the allocation")
	assert.ErrorIs(t, s.Memcpy2D(src.Addr()+1, spitch, src.Addr(), spitch, width, 2, MemcpyDefault), ErrInvalidValue, "overlap")
	assert.ErrorIs(t, s.Memcpy2D(addr(back), hpitch, dev.Addr(), dpitch, width, height, MemcpyHostToHost), ErrInvalidValue, "the kind")
	assert.NoError(t, s.Memcpy2D(dev.Addr(), dpitch, src.Addr(), spitch, 0, height, MemcpyDefault), "nothing")
	assert.ErrorIs(t, s.Memset2DAsync(addr(back), hpitch, 0, width, height, nil), ErrInvalidValue, "ordinary memory on a nil stream")
}
