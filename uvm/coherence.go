package uvm

import (
	"fmt"

	"github.com/softuvm/softuvm/internal/core"
	"github.com/softuvm/softuvm/internal/wire"
)

// The launch coherence model, as CUDA ran managed memory on GPUs that
// could not fault (compute capability below 6.0): a launch hands the
// managed memory its kernel may use to the device (the pages the CPU
// wrote are copied there) and the CPU may not touch it until the
// synchronize that follows, which gives access back without a copy;
// pages then come back to the CPU one fault at a time. The server does
// the work; the client says when kernels start and when streams finish.
// Config.Coherence (UVM_COHERENCE) chooses it per process.

// launchModel reports whether the session runs the launch coherence
// model.
func (s *Session) launchModel() bool { return s.coherence == core.CoherenceLaunch }

// Coherence returns the session's coherence model: "fault" or "launch".
func (s *Session) Coherence() string { return s.coherence.String() }

// coherenceBeforeLaunch runs in stream order just before a launch of
// kernel on (d, stream) is written to the device's process. Under the
// launch coherence model it hands the managed memory the kernel may use
// to the device; an error fails the launch.
func (s *Session) coherenceBeforeLaunch(d Device, stream uint32, kernel string) error {
	if !s.launchModel() {
		return nil
	}
	r, err := s.rpc.Request(wire.EncodeLaunchBegin(s.rpc.NextSeq(), wire.LaunchBeginRequest{Device: int32(d), Stream: stream, Kernel: kernel}), wire.MsgLaunchBegin)
	if err == nil {
		err = r.Done("launch-begin reply")
	}
	if err != nil {
		return fmt.Errorf("launch of kernel %q on device %d: hand it its managed memory: %w", kernel, d, err)
	}
	return nil
}

// coherenceAfterSync runs once the client knows that every launch queued
// on (d, stream) (stream wire.AllStreams: on every stream of d) has
// finished. Under the launch coherence model it gives the CPU its access
// back to what those kernels could use.
func (s *Session) coherenceAfterSync(d Device, stream uint32) error {
	if !s.launchModel() {
		return nil
	}
	r, err := s.rpc.Request(wire.EncodeStreamsIdle(s.rpc.NextSeq(), wire.StreamsIdleRequest{Device: int32(d), Stream: stream}), wire.MsgStreamsIdle)
	if err == nil {
		err = r.Done("streams-idle reply")
	}
	if err != nil {
		return fmt.Errorf("synchronize device %d: give the CPU back its managed memory: %w", d, err)
	}
	return nil
}

// refuseUnderLaunchModel refuses what CUDA refuses on a device without
// concurrent managed access (the launch model): a prefetch (to d), and
// advice that names a device as the preferred location or an accessor.
func (s *Session) refuseUnderLaunchModel(what string, d Device) error {
	if !s.launchModel() {
		return nil
	}
	return fmt.Errorf("%w: %s %v: under the launch coherence model devices have concurrent managed access 0 (AttrConcurrentManagedAccess), and CUDA refuses this there", ErrInvalidDevice, what, d)
}

// StreamAttachMemAsync attaches the managed allocation at addr to a
// stream, as cudaStreamAttachMemAsync: flags AttachGlobal (every stream's
// launches may use it: the default), AttachHost (no launch takes it from
// the CPU, and kernels may not touch it) or AttachSingle (only launches
// on st take it; the CPU may touch it while kernels run on other
// streams, and st's synchronize gives it back). length must be 0 or the
// allocation's size: an allocation is attached whole. The attachment
// takes effect in stream order, when st reaches it (at once on a stream
// with nothing in flight, or a nil st): memory attached to the host is
// then the CPU's even while kernels that took it at their launch still
// run, as CUDA lets it. Its error, if it waited, comes back from st's
// next synchronize. Under the fault model it is recorded and changes
// nothing, as on GPUs with concurrent managed access.
func (s *Session) StreamAttachMemAsync(st *Stream, addr uintptr, length int64, flags uint32) error {
	a := s.lookup(addr)
	if a == nil || a.kind != core.KindManaged {
		return fmt.Errorf("%w: attach %#x to a stream: not managed memory (want an address MallocManaged returned)", ErrInvalidValue, addr)
	}
	if addr != a.addr {
		return fmt.Errorf("%w: attach %#x to a stream: the allocation starts at %#x, and is attached whole", ErrInvalidValue, addr, a.addr)
	}
	if length != 0 && length != a.size {
		return fmt.Errorf("%w: attach %#x to a stream with length %d: want 0 or the allocation's size, %d", ErrInvalidValue, addr, length, a.size)
	}
	req := wire.StreamAttachRequest{Addr: uint64(addr), Mode: core.AttachMode(flags), Device: -1}
	switch req.Mode {
	case core.AttachGlobal, core.AttachHost:
	case core.AttachSingle:
		if st == nil || st.id == 0 {
			return fmt.Errorf("%w: attach %#x to a single stream: want a stream StreamCreate made, not a default stream", ErrInvalidValue, addr)
		}
	default:
		return fmt.Errorf("%w: attach flags %#x: want AttachGlobal (%#x), AttachHost (%#x) or AttachSingle (%#x)", ErrInvalidValue, flags, AttachGlobal, AttachHost, AttachSingle)
	}
	attach := func() error {
		r, err := s.rpc.Request(wire.EncodeStreamAttach(s.rpc.NextSeq(), req), wire.MsgStreamAttach)
		if err == nil {
			err = r.Done("stream-attach reply")
		}
		return err
	}
	if st == nil {
		return attach()
	}
	req.Device, req.Stream = int32(st.device), st.id
	return s.queueHostNowIfIdle(st, "attach memory to", attach)
}
