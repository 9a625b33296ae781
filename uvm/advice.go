package uvm

import (
	"fmt"

	"github.com/softuvm/softuvm/internal/core"
	"github.com/softuvm/softuvm/internal/wire"
)

// MemAdvise advises the default session.
func MemAdvise(addr uintptr, n int64, advice Advice, d Device) error {
	s, err := Default()
	if err != nil {
		return err
	}
	return s.MemAdvise(addr, n, advice, d)
}

// MemAdvise advises the runtime about [addr, addr+n), rounded out to whole
// pages, as cuMemAdvise; the range must lie in one managed allocation.
// It returns once device mappings follow the advice: after
// AdviseSetAccessedBy, the device's kernels do not fault on the range.
// Under the launch coherence model, AdviseSetPreferredLocation and
// AdviseSetAccessedBy naming a device are refused (ErrInvalidDevice), as
// CUDA refuses them without concurrent managed access.
func (s *Session) MemAdvise(addr uintptr, n int64, advice Advice, d Device) error {
	return s.adviseFor(addr, n, advice, d, -1)
}

// adviseProcessor asks the server to take advice for processor d.
func (s *Session) adviseProcessor(addr uintptr, n int64, advice Advice, d Device) error {
	if advice < AdviseSetReadMostly || advice > AdviseUnsetAccessedBy {
		return fmt.Errorf("%w: advice %d: want one of %v to %v", ErrInvalidValue, int(advice), AdviseSetReadMostly, AdviseUnsetAccessedBy)
	}
	if advice.UsesDevice() && d != CPU && (d < 0 || int(d) >= len(s.devices)) {
		return fmt.Errorf("%w: %v for %v: %s", ErrInvalidDevice, advice, d, s.deviceChoices())
	}
	if !advice.UsesDevice() {
		d = CPU // ignored, as cuMemAdvise ignores it
	}
	if d != CPU && (advice == AdviseSetPreferredLocation || advice == AdviseSetAccessedBy) {
		if err := s.refuseUnderLaunchModel(advice.String()+" for", d); err != nil {
			return err
		}
	}
	a, start, length, err := s.pageRange(advice.String(), addr, n)
	if err != nil {
		return err
	}
	if a.kind != core.KindManaged {
		return fmt.Errorf("%w: %v on %#x: advice applies to managed memory, and this is %s", ErrInvalidValue, advice, addr, a.kind)
	}
	r, err := s.rpc.Request(wire.EncodeAdvise(s.rpc.NextSeq(), wire.AdviseRequest{Addr: uint64(start), Length: uint64(length), Advice: uint8(advice), Device: int32(d)}), wire.MsgAdvise)
	if err != nil {
		return err
	}
	return r.Done("advise reply")
}
