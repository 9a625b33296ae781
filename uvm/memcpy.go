package uvm

import (
	"fmt"
	"strconv"

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

// stagingOffset is where, in the client's host file, the window through
// which device memory is read and written lies: below the managed window,
// at offsets no range uses.
const (
	stagingSize   = 1 << 20
	stagingOffset = managedWindowStart - stagingSize
)

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
// must not overlap. Copies into write-combined memory use non-temporal
// stores.
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
	switch {
	case d.device() && sr.device():
		return s.deviceCopy(deviceCopyRequest{op: copyDeviceToDevice, dst: uint64(dst), src: uint64(src), length: uint64(n)})
	case d.device():
		return s.throughStaging(n, func(off, c int64, stage []byte) error {
			copy(stage[:c], devmem.BytesAt(src+uintptr(off), c))
			return s.deviceCopy(deviceCopyRequest{op: copyToDevice, dst: uint64(dst) + uint64(off), length: uint64(c)})
		})
	case sr.device():
		return s.throughStaging(n, func(off, c int64, stage []byte) error {
			if err := s.deviceCopy(deviceCopyRequest{op: copyFromDevice, src: uint64(src) + uint64(off), length: uint64(c)}); err != nil {
				return err
			}
			hostCopy(d, devmem.BytesAt(dst+uintptr(off), c), stage[:c])
			return nil
		})
	}
	hostCopy(d, devmem.BytesAt(dst, n), devmem.BytesAt(src, n))
	return nil
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

// hostCopy copies on the host, with non-temporal stores into
// write-combined memory.
func hostCopy(d side, dst, src []byte) {
	if d.writeCombined() {
		copyNonTemporal(dst, src)
		return
	}
	copy(dst, src)
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
	if d.device() {
		return s.deviceCopy(deviceCopyRequest{op: fillDevice, dst: uint64(ptr), length: uint64(n), value: value})
	}
	b := devmem.BytesAt(ptr, n)
	if d.writeCombined() {
		pattern := make([]byte, min(n, 64<<10))
		for i := range pattern {
			pattern[i] = value
		}
		for off := int64(0); off < n; off += int64(len(pattern)) {
			copyNonTemporal(b[off:], pattern)
		}
		return nil
	}
	for i := range b {
		b[i] = value
	}
	return nil
}

// throughStaging runs step over [0, n) in chunks of the staging window,
// one copy at a time.
func (s *Session) throughStaging(n int64, step func(off, c int64, stage []byte) error) error {
	s.stagingMu.Lock()
	defer s.stagingMu.Unlock()
	if s.staging == nil {
		m, err := s.host.Map(stagingOffset, stagingSize)
		if err != nil {
			return fmt.Errorf("%w: map the copy staging window: %v", ErrMemoryAllocation, err)
		}
		s.staging = m
	}
	stage := s.staging.Bytes()
	for off := int64(0); off < n; off += stagingSize {
		if err := step(off, min(stagingSize, n-off), stage); err != nil {
			return err
		}
	}
	return nil
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

// Device copy operations, done by the server on device memory.
const (
	copyToDevice       = 1 // the client's staging window -> device memory at dst
	copyFromDevice     = 2 // device memory at src -> the staging window
	copyDeviceToDevice = 3 // device memory at src -> device memory at dst
	fillDevice         = 4 // value -> device memory at dst
)

type deviceCopyRequest struct {
	op       uint8
	dst, src uint64
	length   uint64
	value    uint8
}

// deviceCopy carries out a copy involving device memory. Pages written
// become resident on the owning device; holes read as zeros.
func (sess *session) deviceCopy(r deviceCopyRequest) error {
	n := uintptr(r.length)
	if (r.op == copyToDevice || r.op == copyFromDevice) && r.length > stagingSize {
		return fmt.Errorf("%w: device copy of %d bytes: at most %d at a time", ErrInvalidValue, r.length, stagingSize)
	}
	buf := make([]byte, min(n, 1<<20))
	for off := uintptr(0); off < n; {
		c := min(n-off, uintptr(len(buf)))
		chunk := buf[:c]
		var err error
		switch r.op {
		case copyToDevice:
			if _, err = sess.host.ReadAt(chunk, stagingOffset+int64(off)); err == nil {
				err = sess.writeDevice(uintptr(r.dst)+off, chunk)
			}
		case copyFromDevice:
			if err = sess.readDevice(uintptr(r.src)+off, chunk); err == nil {
				_, err = sess.host.WriteAt(chunk, stagingOffset+int64(off))
			}
		case copyDeviceToDevice:
			if err = sess.readDevice(uintptr(r.src)+off, chunk); err == nil {
				err = sess.writeDevice(uintptr(r.dst)+off, chunk)
			}
		case fillDevice:
			for i := range chunk {
				chunk[i] = r.value
			}
			err = sess.writeDevice(uintptr(r.dst)+off, chunk)
		default:
			err = fmt.Errorf("%w: device copy operation %d", ErrInvalidValue, r.op)
		}
		if err != nil {
			return err
		}
		off += c
	}
	return nil
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

// readDevice reads device memory, block by block.
func (sess *session) readDevice(addr uintptr, p []byte) error {
	r, f, err := sess.deviceFileAt(addr, uintptr(len(p)), "read device memory")
	if err != nil {
		return err
	}
	return r.eachBlock(addr&^pageMask, roundUp(addr+uintptr(len(p)), PageSize)-addr&^pageMask, true, func(o *mover, pages PageMask) error {
		lo, hi := blockSpan(o, pages, addr, len(p))
		_, err := f.ReadAt(p[lo-addr:hi-addr], int64(lo))
		return err
	})
}

// writeDevice writes device memory, block by block, and records the pages
// as resident on the device.
func (sess *session) writeDevice(addr uintptr, p []byte) error {
	r, f, err := sess.deviceFileAt(addr, uintptr(len(p)), "write device memory")
	if err != nil {
		return err
	}
	return r.eachBlock(addr&^pageMask, roundUp(addr+uintptr(len(p)), PageSize)-addr&^pageMask, true, func(o *mover, pages PageMask) error {
		lo, hi := blockSpan(o, pages, addr, len(p))
		if _, err := f.WriteAt(p[lo-addr:hi-addr], int64(lo)); err != nil {
			return err
		}
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

// blockSpan returns the part of [addr, addr+n) in the block's pages.
func blockSpan(o *mover, pages PageMask, addr uintptr, n int) (uintptr, uintptr) {
	first := pages.NextSet(0)
	last := first
	for p := first; p >= 0; p = pages.NextSet(p + 1) {
		last = p
	}
	lo := max(addr, o.pageAddr(first))
	hi := min(addr+uintptr(n), o.pageAddr(last)+PageSize)
	return lo, hi
}
