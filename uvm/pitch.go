package uvm

import (
	"fmt"
	"math"

	"github.com/softuvm/softuvm/internal/core"
)

// pitchAlignment is what MallocPitch rounds a row up to, in bytes: 512,
// CUDA's texturePitchAlignment on most GPUs (DeviceProp's
// TexturePitchAlignment).
const pitchAlignment = 512

// MallocPitch allocates device memory on device d for height rows of
// width bytes each, as cudaMallocPitch: each row starts pitch bytes after
// the one before, pitch being width rounded up to
// DeviceProp.TexturePitchAlignment (512 bytes), so that the allocation
// holds pitch*height bytes. Row r starts at Addr() + r*pitch. Width and
// height must be positive, and pitch*height within the allocation limit.
// It is device memory as Malloc's, freed by Free.
func (s *Session) MallocPitch(d Device, width, height int64) (*Allocation, int64, error) {
	if err := s.checkDevice(d, "pitched malloc on"); err != nil {
		return nil, 0, err
	}
	if width <= 0 || height <= 0 {
		return nil, 0, fmt.Errorf("%w: pitched allocation of %d rows of %d bytes: want a width and a height of at least 1", ErrInvalidValue, height, width)
	}
	if width > math.MaxInt64-(pitchAlignment-1) {
		return nil, 0, fmt.Errorf("%w: pitched allocation of rows of %d bytes: the width rounded up to %d bytes overflows", ErrInvalidValue, width, pitchAlignment)
	}
	pitch := (width + pitchAlignment - 1) / pitchAlignment * pitchAlignment
	if height > math.MaxInt64/pitch {
		return nil, 0, fmt.Errorf("%w: pitched allocation of %d rows of %d bytes (pitch %d): %d x %d bytes overflows", ErrInvalidValue, height, width, pitch, height, pitch)
	}
	size := pitch * height
	if size > core.MaxAllocation {
		return nil, 0, fmt.Errorf("%w: pitched allocation of %d rows of %d bytes (pitch %d) is %d bytes (%s): the limit is %s",
			ErrInvalidValue, height, width, pitch, size, FormatSize(size), FormatSize(core.MaxAllocation))
	}
	a, err := s.Malloc(d, size)
	if err != nil {
		return nil, 0, err
	}
	return a, pitch, nil
}
