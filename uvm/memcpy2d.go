package uvm

import (
	"fmt"
	"math"

	"github.com/softuvm/softuvm/internal/engine"
)

// 2D copies and fills, as cudaMemcpy2D and cudaMemset2D: height rows of
// width bytes, each row pitch bytes after the last. With unified
// addressing every pointer says what memory it is, as for Memcpy. Each
// checks the spans from its first row's first byte to its last row's last
// byte as Memcpy checks a copy's ranges (in one allocation or in ordinary
// memory, not overlapping), then copies row by row through one view of
// each span, so a box of device memory costs one mapping and one note to
// the server, not one per row.

// ErrInvalidPitchValue is a pitch less than the width it holds, or past
// the largest (cudaErrorInvalidPitchValue); it wraps ErrInvalidValue.
var ErrInvalidPitchValue = fmt.Errorf("%w: invalid pitch", ErrInvalidValue)

// checkPitch checks rows of width bytes, pitch apart.
func checkPitch(what, which string, pitch, width, height int64) error {
	switch {
	case width < 0 || height < 0:
		return fmt.Errorf("%w: %s of %d rows of %d bytes", ErrInvalidValue, what, height, width)
	case pitch < width:
		return fmt.Errorf("%w: %s: the %s pitch %d is less than the width %d", ErrInvalidPitchValue, what, which, pitch, width)
	case pitch > math.MaxInt32:
		return fmt.Errorf("%w: %s: the %s pitch %d: at most %d (DeviceProp.MemPitch)", ErrInvalidPitchValue, what, which, pitch, math.MaxInt32)
	case height > 0 && pitch > math.MaxInt64/height:
		return fmt.Errorf("%w: %s of %d rows of %d bytes: the size overflows", ErrInvalidValue, what, height, pitch)
	}
	return nil
}

// rowsSpan is the bytes from the first row's first byte to the last's last.
func rowsSpan(pitch, width, height int64) int64 { return (height-1)*pitch + width }

// Memcpy2D copies height rows of width bytes from src, rows spitch apart,
// to dst, rows dpitch apart, as cudaMemcpy2D, and returns when they are
// there. A pitch less than the width is ErrInvalidPitchValue; the rest is
// checked as Memcpy checks a copy. As Memcpy, it is issued on the legacy
// default streams: a kernel, then a Memcpy2D of what it wrote, reads the
// kernel's result.
func (s *Session) Memcpy2D(dst uintptr, dpitch int64, src uintptr, spitch int64, width, height int64, kind MemcpyKind) error {
	d, sr, err := s.check2D("Memcpy2D", dst, dpitch, src, spitch, width, height, kind)
	if err != nil || width == 0 || height == 0 {
		return err
	}
	if err := s.waitLegacy("Memcpy2D on", s.deviceProcs()...); err != nil {
		return err
	}
	return s.copy2DNow(d, dst, dpitch, sr, src, spitch, width, height)
}

// copy2DNow copies as Memcpy2D does, checked already (d, sr), without
// waiting for any stream: Memcpy2DAsync runs it in its stream's turn.
func (s *Session) copy2DNow(d side, dst uintptr, dpitch int64, sr side, src uintptr, spitch int64, width, height int64) error {
	to, err := s.bytesOf(d, rowsSpan(dpitch, width, height), "memcpy 2D")
	if err != nil {
		return err
	}
	from, err := s.bytesOf(sr, rowsSpan(spitch, width, height), "memcpy 2D")
	if err != nil {
		return err
	}
	for y := range height {
		row := to[y*dpitch : y*dpitch+width]
		if d.writeCombined() {
			engine.CopyNonTemporal(row, from[y*spitch:y*spitch+width])
		} else {
			copy(row, from[y*spitch:y*spitch+width])
		}
	}
	return s.noteWritten(d, rowsSpan(dpitch, width, height))
}

// check2D checks a 2D copy's arguments and returns its sides (zero for an
// empty copy).
func (s *Session) check2D(what string, dst uintptr, dpitch int64, src uintptr, spitch int64, width, height int64, kind MemcpyKind) (side, side, error) {
	if kind < MemcpyHostToHost || kind > MemcpyDefault {
		return side{}, side{}, fmt.Errorf("%w: %s kind %d: want %v to %v", ErrInvalidValue, what, int(kind), MemcpyHostToHost, MemcpyDefault)
	}
	if err := checkPitch(what, "destination", dpitch, width, height); err != nil {
		return side{}, side{}, err
	}
	if err := checkPitch(what, "source", spitch, width, height); err != nil {
		return side{}, side{}, err
	}
	if width == 0 || height == 0 {
		return side{}, side{}, nil
	}
	dn, sn := rowsSpan(dpitch, width, height), rowsSpan(spitch, width, height)
	d, err := s.sideOf("destination", dst, dn)
	if err != nil {
		return side{}, side{}, err
	}
	sr, err := s.sideOf("source", src, sn)
	if err != nil {
		return side{}, side{}, err
	}
	if err := checkKind(kind, d, sr); err != nil {
		return side{}, side{}, err
	}
	if dst < src+uintptr(sn) && src < dst+uintptr(dn) {
		return side{}, side{}, fmt.Errorf("%w: %s %#x <- %#x: the spans of %d and %d bytes overlap", ErrInvalidValue, what, dst, src, dn, sn)
	}
	return d, sr, nil
}

// Memset2D sets height rows of width bytes at ptr, rows pitch apart, to
// value, as cudaMemset2D: issued on the legacy default streams, as
// Memset.
func (s *Session) Memset2D(ptr uintptr, pitch int64, value byte, width, height int64) error {
	d, err := s.checkSet2D("Memset2D", ptr, pitch, width, height)
	if err != nil || width == 0 || height == 0 {
		return err
	}
	if err := s.waitLegacy("Memset2D on", s.deviceProcs()...); err != nil {
		return err
	}
	return s.fill2DNow(d, pitch, value, width, height)
}

// fill2DNow fills as Memset2D does, checked already (d), without waiting
// for any stream.
func (s *Session) fill2DNow(d side, pitch int64, value byte, width, height int64) error {
	b, err := s.bytesOf(d, rowsSpan(pitch, width, height), "memset 2D")
	if err != nil {
		return err
	}
	row := make([]byte, width)
	fillBytes(row, value)
	for y := range height {
		if d.writeCombined() {
			engine.CopyNonTemporal(b[y*pitch:y*pitch+width], row)
		} else {
			copy(b[y*pitch:y*pitch+width], row)
		}
	}
	return s.noteWritten(d, rowsSpan(pitch, width, height))
}

func (s *Session) checkSet2D(what string, ptr uintptr, pitch, width, height int64) (side, error) {
	if err := checkPitch(what, "destination", pitch, width, height); err != nil {
		return side{}, err
	}
	if width == 0 || height == 0 {
		return side{}, nil
	}
	return s.sideOf("destination", ptr, rowsSpan(pitch, width, height))
}

// Memcpy2DAsync is Memcpy2D in stream order, as MemcpyAsync is Memcpy's;
// a nil st is chosen as MemcpyAsync chooses it.
func (s *Session) Memcpy2DAsync(dst uintptr, dpitch int64, src uintptr, spitch int64, width, height int64, kind MemcpyKind, st *Stream) error {
	d, sr, err := s.check2D("Memcpy2DAsync", dst, dpitch, src, spitch, width, height, kind)
	if err != nil {
		return err
	}
	what := fmt.Sprintf("Memcpy2DAsync %#x <- %#x of %d rows of %d bytes", dst, src, height, width)
	return s.queue2D(st, what, func() error { return s.copy2DNow(d, dst, dpitch, sr, src, spitch, width, height) }, width*height == 0, d, sr)
}

// Memset2DAsync is Memset2D in stream order, as MemsetAsync is Memset's.
func (s *Session) Memset2DAsync(ptr uintptr, pitch int64, value byte, width, height int64, st *Stream) error {
	d, err := s.checkSet2D("Memset2DAsync", ptr, pitch, width, height)
	if err != nil {
		return err
	}
	what := fmt.Sprintf("Memset2DAsync of %d rows of %d bytes at %#x", height, width, ptr)
	return s.queue2D(st, what, func() error { return s.fill2DNow(d, pitch, value, width, height) }, width*height == 0, d)
}

// queue2D queues run on st, or on the stream copyStream picks for a nil
// one; an empty copy only checks st.
func (s *Session) queue2D(st *Stream, what string, run func() error, empty bool, sides ...side) error {
	if empty {
		if st == nil {
			return nil
		}
		return s.checkStream(st, what+" on")
	}
	st, err := s.copyStream(st, what, sides...)
	if err != nil {
		return err
	}
	return s.queueHost(st, what+" on", func() error {
		if err := run(); err != nil {
			return fmt.Errorf("%s on %v: %w", what, st, err)
		}
		return nil
	})
}
