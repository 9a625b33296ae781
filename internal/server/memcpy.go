package server

import (
	"fmt"
	"syscall"

	"github.com/softuvm/softuvm/devmem"
	"github.com/softuvm/softuvm/internal/block"
	"github.com/softuvm/softuvm/internal/core"
	"github.com/softuvm/softuvm/internal/wire"
)

// deviceFileReply answers msgDeviceFile: the session's file of device d,
// which the client maps to copy device memory in and out itself, with
// the copy engine's parameters (copy producers, the size from which
// non-temporal stores pay, the size from which the engine pays); for the
// CPU, the parameters only.
func (sess *session) deviceFileReply(h wire.Header, d core.Device) ([]byte, []int, error) {
	if err := sess.srv.checkDevice(d, "device file of"); err != nil {
		return nil, nil, err
	}
	c := sess.srv.copyCalibration()
	reply := wire.EncodeU64Reply(h, uint64(c.CopyProducers), uint64(c.NonTemporalAbove), uint64(c.CopyDirectBelow))
	if d == core.CPU { // the parameters only: host memory is in the host file
		return reply, nil, nil
	}
	f, err := sess.deviceFile(int(d))
	if err != nil {
		return nil, nil, err
	}
	fd, err := syscall.Dup(f.Fd())
	if err != nil {
		return nil, nil, fmt.Errorf("%w: device %d file: %v", core.ErrMemoryAllocation, d, err)
	}
	return reply, []int{fd}, nil
}

// deviceCopy carries out a device copy operation.
func (sess *session) deviceCopy(r wire.DeviceCopyRequest) error {
	if r.Op != wire.DeviceWritten {
		return fmt.Errorf("%w: device copy operation %d: want %d (device memory written)", core.ErrInvalidValue, r.Op, wire.DeviceWritten)
	}
	return sess.noteDeviceWritten(uintptr(r.Dst), uintptr(r.Length))
}

// deviceFileAt returns the device memory holding [addr, addr+n) and the
// file its pages live in.
func (sess *session) deviceFileAt(addr, n uintptr, what string) (*managedRange, *devmem.File, error) {
	r := sess.ranges.Load().lookup(addr)
	if r == nil || r.Kind != core.KindDevice {
		return nil, nil, fmt.Errorf("%w: %s %#x: not device memory of pid %d", core.ErrInvalidValue, what, addr, sess.pid)
	}
	if n > r.End()-addr {
		return nil, nil, fmt.Errorf("%w: %s %#x+%d runs past the end of the device memory %#x+%d", core.ErrInvalidValue, what, addr, n, r.Start, r.Length)
	}
	f, err := sess.file(r.Owner)
	return r, f, err
}

// noteDeviceWritten records the pages of [addr, addr+n), which the client
// wrote through its own mapping of the device's file, as resident there.
func (sess *session) noteDeviceWritten(addr, n uintptr) error {
	r, _, err := sess.deviceFileAt(addr, n, "note device memory written")
	if err != nil {
		return err
	}
	return r.EachBlock(addr&^core.PageOffsetMask, core.RoundUp(addr+n, core.PageSize)-addr&^core.PageOffsetMask, true, func(o *block.Mover, pages core.PageMask) error {
		o.NoteWritten(r.Owner, pages)
		return nil
	})
}
