package uvm

import (
	"math"
	"strconv"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/softuvm/softuvm/internal/core"
)

// TestMallocPitch: the pitch is the width rounded up to 512 bytes, the
// allocation is device memory of pitch*height bytes whose rows a kernel
// of its device fills and Memcpy reads back row by row, and bad sizes are
// refused naming the values.
func TestMallocPitch(t *testing.T) {
	s := newSession(t, twoDeviceConfig())
	for _, tc := range []struct{ width, height, pitch int64 }{
		{1, 1, 512}, {511, 2, 512}, {512, 3, 512}, {513, 4, 1024}, {1000, 7, 1024}, {4096, 5, 4096}, {4097, 1, 4608},
	} {
		a, pitch, err := s.MallocPitch(1, tc.width, tc.height)
		require.NoError(t, err, "%d x %d", tc.width, tc.height)
		assert.Equal(t, tc.pitch, pitch, "pitch of rows of %d bytes", tc.width)
		assert.Equal(t, tc.pitch*tc.height, a.Size(), "%d rows of pitch %d", tc.height, tc.pitch)
		attrs, err := s.PointerAttributes(a.Addr())
		require.NoError(t, err)
		assert.Equal(t, MemoryDevice, attrs.Type)
		assert.Equal(t, Device(1), attrs.Device)
		require.NoError(t, a.Free())
	}

	// Every row is there, pitch bytes apart: a kernel of device 1 fills
	// the whole allocation, and each row reads back from its own start.
	const width, height = 700, 6
	a, pitch, err := s.MallocPitch(1, width, height)
	require.NoError(t, err)
	require.Equal(t, int64(1024), pitch)
	require.NoError(t, s.Launch(1, nil, "fill", 2, rangeParams(a.Addr(), pitch*height, 40)))
	require.NoError(t, s.DeviceSynchronize(1))
	whole := wantFill(int(pitch*height), 40)
	for r := int64(0); r < height; r++ {
		row := make([]byte, width)
		require.NoError(t, s.Memcpy(addr(row), a.Addr()+uintptr(r*pitch), width, MemcpyDeviceToHost))
		sameBytes(t, whole[r*pitch:r*pitch+width], row, "row "+strconv.FormatInt(r, 10))
	}
	require.NoError(t, a.Free())

	for _, tc := range []struct {
		name          string
		d             Device
		width, height int64
		want          error
		msg           string
	}{
		{"zero width", 0, 0, 4, ErrInvalidValue, "pitched allocation of 4 rows of 0 bytes: want a width and a height of at least 1"},
		{"negative width", 0, -3, 4, ErrInvalidValue, "4 rows of -3 bytes"},
		{"zero height", 0, 100, 0, ErrInvalidValue, "0 rows of 100 bytes"},
		{"negative height", 0, 100, -1, ErrInvalidValue, "-1 rows of 100 bytes"},
		{"width overflows", 0, math.MaxInt64, 1, ErrInvalidValue, "rows of 9223372036854775807 bytes: the width rounded up to 512 bytes overflows"},
		{"size overflows", 0, 1024, math.MaxInt64 / 1000, ErrInvalidValue, "9223372036854775 rows of 1024 bytes (pitch 1024): 9223372036854775 x 1024 bytes overflows"},
		{"over the limit", 0, 1 << 20, core.MaxAllocation>>20 + 1, ErrInvalidValue, "(pitch 1048576) is " + strconv.FormatInt((core.MaxAllocation>>20+1)<<20, 10) + " bytes"},
		{"more than the arena", 0, 1 << 20, 65, ErrMemoryAllocation, ""},
		{"bad device", 2, 100, 1, ErrInvalidDevice, "pitched malloc on device 2"},
		{"the CPU", CPU, 100, 1, ErrInvalidDevice, "pitched malloc on cpu"},
	} {
		a, pitch, err := s.MallocPitch(tc.d, tc.width, tc.height)
		require.Error(t, err, tc.name)
		assert.Nil(t, a, tc.name)
		assert.Zero(t, pitch, tc.name)
		assert.ErrorIs(t, err, tc.want, tc.name)
		assert.Contains(t, err.Error(), tc.msg, tc.name)
	}
	free, total, err := s.MemGetInfo(0)
	require.NoError(t, err)
	assert.Equal(t, total, free, "refused allocations took nothing")
}
