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
// As CUDA's synchronous copy, it is issued on the legacy default stream:
// of every device, since a Session has no current device. It waits for
// the work submitted before it on each device's default stream and
// blocking streams (not non-blocking ones), so a kernel, then a Memcpy
// of what it wrote, reads the kernel's result. If work it waited for
// failed, it copies nothing and returns the device's failure.
//
// The copy runs in this process: device memory is reached through a
// mapping of the device's file, and copies from the calibrated size up are
// shared among the copy engine's producer threads (copyside.go). Copies
// into write-combined memory, and large copies into device memory, use
// non-temporal stores.
func (s *Session) Memcpy(dst, src uintptr, n int64, kind MemcpyKind) error {
	d, sr, err := s.checkCopy(dst, src, n, kind)
	if err != nil || n == 0 {
		return err
	}
	if err := s.waitLegacy("memcpy on", s.deviceProcs()...); err != nil {
		return err
	}
	return s.copyNow(d, sr, n)
}

// copyNow copies as Memcpy does, checked already (d, sr), without
// waiting for any stream: the asynchronous forms run it in their
// stream's turn.
func (s *Session) copyNow(d, sr side, n int64) error {
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

// Memset sets n bytes at ptr to value, as cudaMemset: issued on the
// legacy default streams, as Memcpy.
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
	if err := s.waitLegacy("memset on", s.deviceProcs()...); err != nil {
		return err
	}
	return s.fillNow(d, value, n)
}

// fillNow fills as Memset does, without waiting for any stream.
func (s *Session) fillNow(d side, value byte, n int64) error {
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

// checkCopy checks a copy's arguments as Memcpy does, without copying,
// and returns its sides (zero for an empty copy).
func (s *Session) checkCopy(dst, src uintptr, n int64, kind MemcpyKind) (side, side, error) {
	if kind < MemcpyHostToHost || kind > MemcpyDefault {
		return side{}, side{}, fmt.Errorf("%w: memcpy kind %d: want %v to %v", ErrInvalidValue, int(kind), MemcpyHostToHost, MemcpyDefault)
	}
	if n < 0 {
		return side{}, side{}, fmt.Errorf("%w: memcpy of %d bytes: want 0 or more", ErrInvalidValue, n)
	}
	if n == 0 {
		return side{}, side{}, nil
	}
	d, err := s.sideOf("destination", dst, n)
	if err != nil {
		return side{}, side{}, err
	}
	sr, err := s.sideOf("source", src, n)
	if err != nil {
		return side{}, side{}, err
	}
	if err := checkKind(kind, d, sr); err != nil {
		return side{}, side{}, err
	}
	if dst < src+uintptr(n) && src < dst+uintptr(n) {
		return side{}, side{}, fmt.Errorf("%w: memcpy %#x <- %#x of %d bytes: the ranges overlap", ErrInvalidValue, dst, src, n)
	}
	return d, sr, nil
}

// copyStream is the stream an asynchronous copy runs on: st, or for a
// nil st the default stream of the device whose device memory the copy
// touches; with none, or two, a nil st names no stream.
func (s *Session) copyStream(st *Stream, what string, sides ...side) (*Stream, error) {
	if st != nil {
		return st, nil
	}
	dev := InvalidDevice
	for _, sd := range sides {
		if !sd.device() {
			continue
		}
		if dev != InvalidDevice && sd.a.device != dev {
			return nil, fmt.Errorf("%w: %s on a nil stream: it touches the device memory of %v and of %v, and a nil stream names one device's default stream; pass a stream", ErrInvalidValue, what, dev, sd.a.device)
		}
		dev = sd.a.device
	}
	if dev == InvalidDevice {
		return nil, fmt.Errorf("%w: %s on a nil stream: it touches no device memory, and a nil stream names the default stream of the device whose memory it touches; pass a stream, or DefaultStream(device)", ErrInvalidValue, what)
	}
	return s.DefaultStream(dev), nil
}

// checkStream checks that st may take work.
func (s *Session) checkStream(st *Stream, what string) error {
	dp, err := s.streamProc(st, what)
	if err != nil {
		return err
	}
	dp.mu.Unlock()
	return nil
}

// MemcpyAsync copies n bytes from src to dst in stream order, as
// cudaMemcpyAsync: it checks its arguments as Memcpy does and returns at
// once; the copy runs once the work queued on st before it has finished,
// and the work queued after it waits for it. Its error comes back from
// st's next synchronize. Ordinary (pageable) host memory on either side
// must stay valid until then. A nil st is the default stream of the
// device whose device memory (Malloc) the copy touches; a copy touching
// none, or two devices' memory, needs a stream.
func (s *Session) MemcpyAsync(dst, src uintptr, n int64, kind MemcpyKind, st *Stream) error {
	d, sr, err := s.checkCopy(dst, src, n, kind)
	if err != nil {
		return err
	}
	what := fmt.Sprintf("MemcpyAsync %#x <- %#x of %d bytes", dst, src, n)
	if n == 0 {
		if st == nil {
			return nil
		}
		return s.checkStream(st, what+" on")
	}
	if st, err = s.copyStream(st, what, d, sr); err != nil {
		return err
	}
	return s.queueHost(st, what+" on", func() error {
		// Checked again: the memory may have gone meanwhile.
		d, sr, err := s.checkCopy(dst, src, n, kind)
		if err == nil {
			err = s.copyNow(d, sr, n)
		}
		if err != nil {
			return fmt.Errorf("%s on %v: %w", what, st, err)
		}
		return nil
	})
}

// MemsetAsync sets n bytes at ptr to value in stream order, as
// cudaMemsetAsync: it checks its arguments and returns at once; the
// stores run once the work queued on st before it has finished. Its
// error comes back from st's next synchronize. A nil st is the default
// stream of ptr's device when ptr is device memory (Malloc); other
// memory needs a stream.
func (s *Session) MemsetAsync(ptr uintptr, value byte, n int64, st *Stream) error {
	if n < 0 {
		return fmt.Errorf("%w: memset of %d bytes: want 0 or more", ErrInvalidValue, n)
	}
	what := fmt.Sprintf("MemsetAsync of %d bytes at %#x", n, ptr)
	if n == 0 {
		if st == nil {
			return nil
		}
		return s.checkStream(st, what+" on")
	}
	d, err := s.sideOf("destination", ptr, n)
	if err != nil {
		return err
	}
	if st, err = s.copyStream(st, what, d); err != nil {
		return err
	}
	return s.queueHost(st, what+" on", func() error {
		d, err := s.sideOf("destination", ptr, n)
		if err == nil {
			err = s.fillNow(d, value, n)
		}
		if err != nil {
			return fmt.Errorf("%s on %v: %w", what, st, err)
		}
		return nil
	})
}

// checkPeer checks a peer copy's arguments: two devices, and each side
// memory its device reaches (its own device memory, or managed or
// pinned memory).
func (s *Session) checkPeer(dst uintptr, dstDev Device, src uintptr, srcDev Device, n int64) (side, side, error) {
	if err := s.checkDevice(dstDev, "peer copy to"); err != nil {
		return side{}, side{}, err
	}
	if err := s.checkDevice(srcDev, "peer copy from"); err != nil {
		return side{}, side{}, err
	}
	d, sr, err := s.checkCopy(dst, src, n, MemcpyDefault)
	if err != nil || n == 0 {
		return d, sr, err
	}
	for _, c := range []struct {
		which string
		sd    side
		dev   Device
	}{{"destination", d, dstDev}, {"source", sr, srcDev}} {
		switch {
		case !c.sd.deviceReachable():
			return side{}, side{}, fmt.Errorf("%w: peer copy: the %s %#x is %s, which no device reaches; want device memory of %v, or managed or pinned memory", ErrInvalidValue, c.which, c.sd.ptr, c.sd.describe(), c.dev)
		case c.sd.device() && c.sd.a.device != c.dev:
			return side{}, side{}, fmt.Errorf("%w: peer copy: the %s %#x is device memory of %v, not of %v", ErrInvalidValue, c.which, c.sd.ptr, c.sd.a.device, c.dev)
		}
	}
	return d, sr, nil
}

// MemcpyPeer copies n bytes from src, memory of device srcDev, to dst,
// memory of device dstDev, as cudaMemcpyPeer: issued on the legacy
// default streams of both devices, it waits for the work submitted so
// far on each one's default stream and blocking streams (their errors
// stay for their synchronizes; if that work failed, it copies nothing
// and returns the failure), and returns when the bytes are there. Each
// side must be its device's device memory (Malloc), or managed or pinned
// memory, which every device reaches. The copy needs no peer access: it
// runs in this process, which maps every device's memory.
func (s *Session) MemcpyPeer(dst uintptr, dstDev Device, src uintptr, srcDev Device, n int64) error {
	d, sr, err := s.checkPeer(dst, dstDev, src, srcDev, n)
	if err != nil || n == 0 {
		return err
	}
	if err := s.waitLegacy("peer copy on", s.deviceProc(srcDev), s.deviceProc(dstDev)); err != nil {
		return err
	}
	return s.copyNow(d, sr, n)
}

// MemcpyPeerAsync is MemcpyPeer in stream order, as
// cudaMemcpyPeerAsync: it checks its arguments and returns at once; the
// copy runs once the work queued on st before it has finished (and only
// that work: work on the devices' other streams is not waited for), and
// its error comes back from st's next synchronize. A nil st is srcDev's
// default stream.
func (s *Session) MemcpyPeerAsync(dst uintptr, dstDev Device, src uintptr, srcDev Device, n int64, st *Stream) error {
	if _, _, err := s.checkPeer(dst, dstDev, src, srcDev, n); err != nil {
		return err
	}
	if st == nil {
		st = s.DefaultStream(srcDev)
	}
	what := fmt.Sprintf("MemcpyPeerAsync %#x (device %v) <- %#x (device %v) of %d bytes", dst, dstDev, src, srcDev, n)
	if n == 0 {
		return s.checkStream(st, what+" on")
	}
	return s.queueHost(st, what+" on", func() error {
		d, sr, err := s.checkPeer(dst, dstDev, src, srcDev, n)
		if err == nil {
			err = s.copyNow(d, sr, n)
		}
		if err != nil {
			return fmt.Errorf("%s on %v: %w", what, st, err)
		}
		return nil
	})
}
