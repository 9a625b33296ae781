package uvm

import (
	"fmt"
	"strconv"
	"syscall"

	"github.com/softuvm/softuvm/devmem"
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

// side is one end of a copy.
type side struct {
	ptr  uintptr
	a    *Allocation // nil for memory the runtime does not own
	kind rangeKind
}

// device reports whether the side is device memory, which only the server
// (and kernels) reach.
func (s side) device() bool { return s.a != nil && s.kind == kindDevice }

// deviceReachable reports whether kernels reach the side: device, managed
// and pinned host memory.
func (s side) deviceReachable() bool { return s.a != nil }

// hostReachable reports whether the host reaches the side: everything but
// device memory.
func (s side) hostReachable() bool { return !s.device() }

func (s side) writeCombined() bool {
	return s.a != nil && s.kind == kindPinnedHost && s.a.flags&HostAllocWriteCombined != 0
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
		return side{ptr: ptr, a: reg.alloc, kind: kindPinnedHost}, nil
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
	if _, err := s.copyEngine(p, d).run(copyBytesJob(to, from, nt)); err != nil {
		return err
	}
	return s.noteWritten(d, n)
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
			copyNonTemporal(b[off:], pattern)
		}
	} else {
		fillBytes(b, value)
	}
	return s.noteWritten(d, n)
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

func (s *Session) deviceCopy(req deviceCopyRequest) error {
	r, err := s.request(encodeDeviceCopy(s.nextSeq(), req), msgDeviceCopy)
	if err != nil {
		return err
	}
	return r.done("device copy reply")
}

// Memcpy copies in the default session.
func Memcpy(dst, src uintptr, n int64, kind MemcpyKind) error {
	s, err := Default()
	if err != nil {
		return err
	}
	return s.Memcpy(dst, src, n, kind)
}

// Device copy operations. The client copies device memory itself, through
// its mapping of the device's file; only the bookkeeping is the server's.
// Operations 1 to 4 were copies through a staging window, before the
// copy engine.
const (
	// deviceWritten says the client wrote device memory at dst through
	// its mapping of the device's file (msgDeviceFile): the server records
	// the pages as populated.
	deviceWritten = 5
)

// deviceFileReply answers msgDeviceFile: the session's file of device d,
// which the client maps to copy device memory in and out itself, with
// the copy engine's parameters (copy producers, the size from which
// non-temporal stores pay, the size from which the engine pays); for the
// CPU, the parameters only.
func (sess *session) deviceFileReply(h header, d Device) ([]byte, []int, error) {
	if err := sess.srv.checkDevice(d, "device file of"); err != nil {
		return nil, nil, err
	}
	c := sess.srv.copyCalibration()
	reply := encodeU64Reply(h, uint64(c.CopyProducers), uint64(c.NonTemporalAbove), uint64(c.CopyDirectBelow))
	if d == CPU { // the parameters only: host memory is in the host file
		return reply, nil, nil
	}
	f, err := sess.deviceFile(int(d))
	if err != nil {
		return nil, nil, err
	}
	fd, err := syscall.Dup(f.Fd())
	if err != nil {
		return nil, nil, fmt.Errorf("%w: device %d file: %v", ErrMemoryAllocation, d, err)
	}
	return reply, []int{fd}, nil
}

type deviceCopyRequest struct {
	op       uint8
	dst, src uint64
	length   uint64
	value    uint8
}

// deviceCopy carries out a device copy operation.
func (sess *session) deviceCopy(r deviceCopyRequest) error {
	if r.op != deviceWritten {
		return fmt.Errorf("%w: device copy operation %d: want %d (device memory written)", ErrInvalidValue, r.op, deviceWritten)
	}
	return sess.noteDeviceWritten(uintptr(r.dst), uintptr(r.length))
}

// deviceFileAt returns the device memory holding [addr, addr+n) and the
// file its pages live in.
func (sess *session) deviceFileAt(addr, n uintptr, what string) (*managedRange, *devmem.File, error) {
	r := sess.ranges.Load().lookup(addr)
	if r == nil || r.kind != kindDevice {
		return nil, nil, fmt.Errorf("%w: %s %#x: not device memory of pid %d", ErrInvalidValue, what, addr, sess.pid)
	}
	if n > r.end()-addr {
		return nil, nil, fmt.Errorf("%w: %s %#x+%d runs past the end of the device memory %#x+%d", ErrInvalidValue, what, addr, n, r.start, r.length)
	}
	f, err := sess.file(r.owner)
	return r, f, err
}

// noteDeviceWritten records the pages of [addr, addr+n), which the client
// wrote through its own mapping of the device's file, as resident there.
func (sess *session) noteDeviceWritten(addr, n uintptr) error {
	r, _, err := sess.deviceFileAt(addr, n, "note device memory written")
	if err != nil {
		return err
	}
	return r.eachBlock(addr&^pageMask, roundUp(addr+n, PageSize)-addr&^pageMask, true, func(o *mover, pages PageMask) error {
		fresh := pages
		fresh.AndNot(&o.b.resident[r.owner])
		if k := fresh.Count(); k > 0 {
			o.b.resident[r.owner].Or(&fresh)
			r.stats.populated[r.owner].Add(uint64(k))
			sess.srv.stats.populated[r.owner].Add(uint64(k))
		}
		return nil
	})
}
