package uvm

import (
	"fmt"
	"strconv"

	"github.com/softuvm/softuvm/devmem"
	"github.com/softuvm/softuvm/internal/core"
	"github.com/softuvm/softuvm/internal/engine"
	"github.com/softuvm/softuvm/internal/wire"
)

// MemcpyKind says which way a copy goes, as cudaMemcpyKind.
type MemcpyKind int

const (
	MemcpyHostToHost MemcpyKind = iota
	MemcpyHostToDevice
	MemcpyDeviceToHost
	MemcpyDeviceToDevice
	// MemcpyDefault infers the direction from the pointers, as unified
	// addressing allows.
	MemcpyDefault
)

// side is one end of a copy.
type side struct {
	ptr  uintptr
	a    *Allocation // nil for memory the runtime does not own
	kind core.RangeKind
}

// checkKind checks that the pointers agree with the kind.
func checkKind(kind MemcpyKind, d, sr side) error {
	bad := func(which string, s side, want string) error {
		return fmt.Errorf("%w: memcpy %v: the %s %#x is %s, which is not %s; use MemcpyDefault to let the pointers decide", ErrInvalidValue, kind, which, s.ptr, s.describe(), want)
	}
	srcHost := kind == MemcpyHostToHost || kind == MemcpyHostToDevice
	dstHost := kind == MemcpyHostToHost || kind == MemcpyDeviceToHost
	switch {
	case kind == MemcpyDefault:
	case srcHost && !sr.hostReachable():
		return bad("source", sr, "reachable from the host")
	case !srcHost && !sr.deviceReachable():
		return bad("source", sr, "reachable from a device")
	case dstHost && !d.hostReachable():
		return bad("destination", d, "reachable from the host")
	case !dstHost && !d.deviceReachable():
		return bad("destination", d, "reachable from a device")
	}
	return nil
}

// fillBytes sets every byte of b to v.
func fillBytes(b []byte, v byte) {
	if v == 0 {
		clear(b)
		return
	}
	if len(b) == 0 {
		return
	}
	b[0] = v
	for done := 1; done < len(b); done *= 2 {
		copy(b[done:], b[:done])
	}
}

// Memcpy copies in the default session.
func Memcpy(dst, src uintptr, n int64, kind MemcpyKind) error {
	s, err := Default()
	if err != nil {
		return err
	}
	return s.Memcpy(dst, src, n, kind)
}

func (k MemcpyKind) String() string {
	switch k {
	case MemcpyHostToHost:
		return "host-to-host"
	case MemcpyHostToDevice:
		return "host-to-device"
	case MemcpyDeviceToHost:
		return "device-to-host"
	case MemcpyDeviceToDevice:
		return "device-to-device"
	case MemcpyDefault:
		return "default"
	}
	return "memcpy-kind(" + strconv.Itoa(int(k)) + ")"
}

// device reports whether the side is device memory, which only the server
// (and kernels) reach.
func (s side) device() bool { return s.a != nil && s.kind == core.KindDevice }

// deviceReachable reports whether kernels reach the side: device, managed
// and pinned host memory.
func (s side) deviceReachable() bool { return s.a != nil }

// hostReachable reports whether the host reaches the side: everything but
// device memory.
func (s side) hostReachable() bool { return !s.device() }

func (s side) writeCombined() bool {
	return s.a != nil && s.kind == core.KindPinnedHost && s.a.flags&HostAllocWriteCombined != 0
}

func (s side) describe() string {
	if s.a == nil {
		return "ordinary host memory"
	}
	return s.a.kindName()
}

// sideOf classifies [ptr, ptr+n).
func (s *Session) sideOf(what string, ptr uintptr, n int64) (side, error) {
	if reg := s.registeredAt(ptr); reg != nil {
		if uint64(n) > uint64(reg.end()-ptr) {
			return side{}, fmt.Errorf("%w: memcpy %s %#x+%d runs past the end of the registered memory %#x+%d", ErrInvalidValue, what, ptr, n, reg.host, reg.alloc.length)
		}
		return side{ptr: ptr, a: reg.alloc, kind: core.KindPinnedHost}, nil
	}
	if a := s.lookup(ptr); a != nil {
		if uint64(n) > uint64(a.addr+uintptr(a.size)-ptr) {
			return side{}, fmt.Errorf("%w: memcpy %s %#x+%d runs past the end of the allocation %#x+%d", ErrInvalidValue, what, ptr, n, a.addr, a.size)
		}
		return side{ptr: ptr, a: a, kind: a.kind}, nil
	}
	if !devmem.IsMapped(ptr, n) {
		return side{}, fmt.Errorf("%w: memcpy %s %#x+%d: not mapped memory", ErrInvalidValue, what, ptr, n)
	}
	return side{ptr: ptr}, nil
}

// Memcpy copies n bytes from src to dst, as cudaMemcpy, and returns when
// they are there. The kind must agree with the pointers (MemcpyDefault
// infers it): device memory is what Malloc returns; managed and pinned
// memory count as either side; other memory is host memory. The ranges
// must not overlap.
//
// The copy runs in this process: device memory is reached through a
// mapping of the device's file, and copies from the calibrated size up are
// shared among the copy engine's producer threads (copyside.go). Copies
// into write-combined memory, and large copies into device memory, use
// non-temporal stores.
func (s *Session) Memcpy(dst, src uintptr, n int64, kind MemcpyKind) error {
	if kind < MemcpyHostToHost || kind > MemcpyDefault {
		return fmt.Errorf("%w: memcpy kind %d: want %v to %v", ErrInvalidValue, int(kind), MemcpyHostToHost, MemcpyDefault)
	}
	if n < 0 {
		return fmt.Errorf("%w: memcpy of %d bytes: want 0 or more", ErrInvalidValue, n)
	}
	if n == 0 {
		return nil
	}
	d, err := s.sideOf("destination", dst, n)
	if err != nil {
		return err
	}
	sr, err := s.sideOf("source", src, n)
	if err != nil {
		return err
	}
	if err := checkKind(kind, d, sr); err != nil {
		return err
	}
	if dst < src+uintptr(n) && src < dst+uintptr(n) {
		return fmt.Errorf("%w: memcpy %#x <- %#x of %d bytes: the ranges overlap", ErrInvalidValue, dst, src, n)
	}
	to, err := s.bytesOf(d, n, "memcpy")
	if err != nil {
		return err
	}
	from, err := s.bytesOf(sr, n, "memcpy")
	if err != nil {
		return err
	}
	p, err := s.copyParameters()
	if err != nil {
		return err
	}
	nt := d.writeCombined() || (d.device() && p.nonTemporalAbove > 0 && n >= p.nonTemporalAbove)
	if _, err := s.copyEngine(p, d).Run(engine.CopyBytesJob(to, from, nt)); err != nil {
		return err
	}
	return s.noteWritten(d, n)
}

// Memset sets n bytes at ptr to value, as cudaMemset.
func (s *Session) Memset(ptr uintptr, value byte, n int64) error {
	if n < 0 {
		return fmt.Errorf("%w: memset of %d bytes: want 0 or more", ErrInvalidValue, n)
	}
	if n == 0 {
		return nil
	}
	d, err := s.sideOf("destination", ptr, n)
	if err != nil {
		return err
	}
	b, err := s.bytesOf(d, n, "memset")
	if err != nil {
		return err
	}
	if d.writeCombined() {
		pattern := make([]byte, min(n, 64<<10))
		fillBytes(pattern, value)
		for off := int64(0); off < n; off += int64(len(pattern)) {
			engine.CopyNonTemporal(b[off:], pattern)
		}
	} else {
		fillBytes(b, value)
	}
	return s.noteWritten(d, n)
}

func (s *Session) deviceCopy(req wire.DeviceCopyRequest) error {
	r, err := s.rpc.Request(wire.EncodeDeviceCopy(s.rpc.NextSeq(), req), wire.MsgDeviceCopy)
	if err != nil {
		return err
	}
	return r.Done("device copy reply")
}
