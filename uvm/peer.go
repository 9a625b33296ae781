package uvm

import (
	"fmt"

	"github.com/softuvm/softuvm/internal/wire"
)

// Peer access, after the CUDA runtime's: a kernel of device d reaches the
// device memory (Malloc) of another device, its peer, only while d's
// access to the peer is enabled. Go has no current device, so the device
// that gains access is an argument. Managed memory needs no peer access
// (it migrates to whoever touches it), nor does pinned host memory (every
// device maps it).

// DeviceCanAccessPeer reports whether device d can be given access to
// peer's device memory, as cudaDeviceCanAccessPeer: true for any two
// devices of the session, all of which are processes on the same host;
// false for a device and itself, which needs no peer access to its own
// memory.
func (s *Session) DeviceCanAccessPeer(d, peer Device) (bool, error) {
	if err := s.checkDevice(d, "peer access of"); err != nil {
		return false, err
	}
	if err := s.checkDevice(peer, "peer access to"); err != nil {
		return false, err
	}
	return d != peer, nil
}

// DeviceEnablePeerAccess lets device d's kernels reach the device memory
// of peer, as cudaDeviceEnablePeerAccess: d's process maps peer's device
// memory, allocated before or after, at the same addresses. Access is one
// way: peer's kernels gain nothing. flags must be 0. Enabling it twice is
// ErrPeerAccessAlreadyEnabled. It lasts until DeviceDisablePeerAccess,
// across DeviceReset and the end of d's process.
//
// Without it, a kernel of d that touches peer's device memory fails: the
// memory is not mapped in d's process, so the touch faults there, and
// the next synchronize reports the kernel's error (ErrLaunchFailure).
func (s *Session) DeviceEnablePeerAccess(d, peer Device, flags uint32) error {
	return s.peerAccess(d, peer, true, flags)
}

// DeviceDisablePeerAccess takes device d's access to peer's device memory
// away, as cudaDeviceDisablePeerAccess: d's process unmaps it, and a
// kernel of d touching it afterwards fails. Disabling an access that is
// not enabled is ErrPeerAccessNotEnabled. Kernels of d still running
// must not use peer's memory any more, as in CUDA.
func (s *Session) DeviceDisablePeerAccess(d, peer Device) error {
	return s.peerAccess(d, peer, false, 0)
}

func (s *Session) peerAccess(d, peer Device, enable bool, flags uint32) error {
	what := "disable"
	if enable {
		what = "enable"
	}
	if err := s.checkDevice(d, what+" peer access of"); err != nil {
		return err
	}
	if err := s.checkDevice(peer, what+" peer access to"); err != nil {
		return err
	}
	if d == peer {
		return fmt.Errorf("%w: %s peer access of device %d to itself: a device always reaches its own memory; want another device as the peer", ErrInvalidDevice, what, d)
	}
	if flags != 0 {
		return fmt.Errorf("%w: %s peer access of device %d to device %d with flags %#x: want 0", ErrInvalidValue, what, d, peer, flags)
	}
	req := wire.PeerAccessRequest{Device: int32(d), Peer: int32(peer), Enable: enable, Flags: flags}
	r, err := s.rpc.Request(wire.EncodePeerAccess(s.rpc.NextSeq(), req), wire.MsgPeerAccess)
	if err != nil {
		return err
	}
	reply, err := wire.DecodePeerAccessReply(r)
	if err != nil {
		return err
	}
	switch {
	case enable && reply.WasEnabled:
		return fmt.Errorf("%w: device %d's access to device %d's memory is enabled already", ErrPeerAccessAlreadyEnabled, d, peer)
	case !enable && !reply.WasEnabled:
		return fmt.Errorf("%w: device %d's access to device %d's memory is not enabled", ErrPeerAccessNotEnabled, d, peer)
	}
	return nil
}
