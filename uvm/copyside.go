package uvm

import (
	"fmt"
	"syscall"

	"github.com/softuvm/softuvm/devmem"
	"github.com/softuvm/softuvm/internal/engine"
	"github.com/softuvm/softuvm/internal/wire"
)

// copyParams are the copy engine's parameters, as the server calibrated
// them.
type copyParams struct {
	producers        int
	nonTemporalAbove int64
	directBelow      int64
}

// copyParameters asks the server for the copy parameters once.
func (s *Session) copyParameters() (copyParams, error) {
	s.copyMu.Lock()
	defer s.copyMu.Unlock()
	if s.copyParams != nil {
		return *s.copyParams, nil
	}
	p, fds, err := s.deviceFileRequest(CPU)
	wire.CloseFDs(fds)
	if err != nil {
		return copyParams{}, err
	}
	s.copyParams = &p
	return p, nil
}

// deviceFileRequest sends msgDeviceFile for device d (CPU: the parameters
// only) and returns the parameters and the descriptors the reply carries.
func (s *Session) deviceFileRequest(d Device) (copyParams, []int, error) {
	r, fds, err := s.rpc.RequestWithFDs(wire.EncodeDeviceFile(s.rpc.NextSeq(), d), wire.MsgDeviceFile)
	if err != nil {
		return copyParams{}, nil, err
	}
	p := copyParams{producers: int(r.U64("copy producers")), nonTemporalAbove: int64(r.U64("non-temporal size")), directBelow: int64(r.U64("direct-path size"))}
	if err := r.Done("device file reply"); err != nil {
		wire.CloseFDs(fds)
		return copyParams{}, nil, err
	}
	if p.producers < 1 || p.producers > 1024 || p.nonTemporalAbove < 0 || p.directBelow < 0 {
		wire.CloseFDs(fds)
		return copyParams{}, nil, fmt.Errorf("%w: device file reply: %d copy producers, non-temporal from %d, direct below %d", ErrInternal, p.producers, p.nonTemporalAbove, p.directBelow)
	}
	return p, fds, nil
}

// copyEngine is the session's engine for copies into d, started on first
// use and stopped by Close: its producers run near d's memory where it is
// device memory on a NUMA arena of a machine with several nodes.
func (s *Session) copyEngine(p copyParams, d side) *engine.CopyEngine {
	s.copyMu.Lock()
	if s.engines == nil {
		s.engines = engine.NewCopyEngines(p.producers, p.directBelow)
		if s.rpc.Closed.Load() {
			s.engines.Stop()
		}
	}
	engines := s.engines
	s.copyMu.Unlock()
	node := -1
	if d.device() && int(d.a.device) < len(s.devices) {
		node = devmem.ArenaNode(s.devices[d.a.device].Backend, s.devices[d.a.device].Node)
	}
	return engines.ForNode(node)
}

// deviceFile returns the session's file of device d, fetched once.
func (s *Session) deviceFile(d Device) (*devmem.File, error) {
	s.copyMu.Lock()
	defer s.copyMu.Unlock()
	if s.deviceFiles == nil {
		s.deviceFiles = make([]*devmem.File, len(s.devices))
	}
	if int(d) >= len(s.deviceFiles) {
		return nil, fmt.Errorf("%w: device %v's file: this session has %d devices", ErrInvalidDevice, d, len(s.deviceFiles))
	}
	if f := s.deviceFiles[d]; f != nil {
		return f, nil
	}
	p, fds, err := s.deviceFileRequest(d)
	if err != nil {
		return nil, err
	}
	if len(fds) != 1 {
		wire.CloseFDs(fds)
		return nil, fmt.Errorf("%w: device file reply carries %d descriptors, want 1", ErrInternal, len(fds))
	}
	f, err := devmem.FileFromFD(fds[0], fmt.Sprintf("softuvm-dev%d", d))
	if err != nil {
		syscall.Close(fds[0])
		return nil, fmt.Errorf("%w: device %v's file: %v", ErrInternal, d, err)
	}
	if s.copyParams == nil {
		s.copyParams = &p
	}
	s.deviceFiles[d] = f
	return f, nil
}

// closeCopies stops the copy engine and closes the device files.
func (s *Session) closeCopies() {
	s.copyMu.Lock()
	defer s.copyMu.Unlock()
	if s.engines != nil {
		s.engines.Stop()
	}
	for i, f := range s.deviceFiles {
		if f != nil {
			f.Close()
			s.deviceFiles[i] = nil
		}
	}
}

// bytesOf returns the n bytes of a copy's side: the memory itself on the
// host, the mapping of the device's file for device memory.
func (s *Session) bytesOf(sd side, n int64, what string) ([]byte, error) {
	if !sd.device() {
		return devmem.BytesAt(sd.ptr, n), nil
	}
	m, err := s.shadowOf(sd.a)
	if err != nil {
		return nil, fmt.Errorf("%s of device memory %#x+%d: %w", what, sd.ptr, n, err)
	}
	off := int64(sd.ptr - sd.a.addr)
	return m.Bytes()[off : off+n], nil
}

// shadowOf maps device memory a from its device's file, once.
func (s *Session) shadowOf(a *Allocation) (*devmem.Mapping, error) {
	a.shadowMu.Lock()
	defer a.shadowMu.Unlock()
	if a.shadow != nil {
		return a.shadow, nil
	}
	if a.freed.Load() {
		return nil, fmt.Errorf("%w: the allocation %#x was freed", ErrInvalidValue, a.addr)
	}
	f, err := s.deviceFile(a.device)
	if err != nil {
		return nil, err
	}
	// Device memory's file offset is its address.
	m, err := f.Map(int64(a.addr), int64(a.length))
	if err != nil {
		return nil, fmt.Errorf("%w: map device memory %#x+%d: %v", ErrMemoryAllocation, a.addr, a.length, err)
	}
	a.shadow = m
	return m, nil
}

// unmapShadow unmaps the allocation's view of its device's file.
func (a *Allocation) unmapShadow() {
	a.shadowMu.Lock()
	defer a.shadowMu.Unlock()
	if a.shadow != nil {
		a.shadow.Unmap()
		a.shadow = nil
	}
}

// noteWritten tells the server that n bytes of device memory at d were
// written, so that it records the pages as resident there. Pages already
// noted are not noted again: after the first copy into device memory,
// copies into it make no round trip to the server.
func (s *Session) noteWritten(d side, n int64) error {
	if !d.device() {
		return nil
	}
	a := d.a
	first, last := int((d.ptr-a.addr)/PageSize), int((d.ptr+uintptr(n)-1-a.addr)/PageSize)
	a.shadowMu.Lock()
	if a.noted == nil {
		a.noted = make([]uint64, (a.length/PageSize+63)/64)
	}
	fresh := false
	for p := first; p <= last && !fresh; p++ {
		fresh = a.noted[p/64]&(1<<(p%64)) == 0
	}
	a.shadowMu.Unlock()
	if !fresh {
		return nil
	}
	if err := s.deviceCopy(wire.DeviceCopyRequest{Op: wire.DeviceWritten, Dst: uint64(d.ptr), Length: uint64(n)}); err != nil {
		return err
	}
	a.shadowMu.Lock()
	for p := first; p <= last; p++ {
		a.noted[p/64] |= 1 << (p % 64)
	}
	a.shadowMu.Unlock()
	return nil
}
