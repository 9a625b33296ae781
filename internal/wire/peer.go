package wire

import (
	"fmt"

	"github.com/softuvm/softuvm/internal/core"
)

// Peer access (cudaDeviceEnablePeerAccess, cudaDeviceDisablePeerAccess):
// a device's processes map another device's device memory only while the
// client has enabled the first device's access to the second.

// PeerAccessRequest enables (Enable) or disables device Device's access
// to the device memory of device Peer. Flags must be 0, as CUDA's; the
// server checks it, and that both devices exist and differ.
type PeerAccessRequest struct {
	Device, Peer int32
	Enable       bool
	Flags        uint32
}

// PeerAccessReply says whether the access was enabled before the request:
// the server's table is the only record, and a client turns a request
// that changes nothing into cudaErrorPeerAccessAlreadyEnabled or
// cudaErrorPeerAccessNotEnabled.
type PeerAccessReply struct {
	WasEnabled bool
}

func init() {
	requestDecoders[MsgPeerAccess] = func(r *WireReader) any {
		pa := PeerAccessRequest{Device: r.i32("device"), Peer: r.i32("peer"), Enable: r.boolean("enable"), Flags: r.u32("flags")}
		for _, d := range []struct {
			what string
			v    int32
		}{{"device", pa.Device}, {"peer", pa.Peer}} {
			if r.err == nil && (d.v < 0 || d.v >= core.MaxDevices) {
				r.err = fmt.Errorf("%w: peer access: %s %d: want a device from 0 to %d", core.ErrInvalidDevice, d.what, d.v, core.MaxDevices-1)
			}
		}
		return pa
	}
}

// EncodePeerAccess writes a peer-access request.
func EncodePeerAccess(seq uint32, pa PeerAccessRequest) []byte {
	w := NewMessage(Header{Typ: MsgPeerAccess, Seq: seq})
	w.i32(pa.Device)
	w.i32(pa.Peer)
	w.boolean(pa.Enable)
	w.u32(pa.Flags)
	return w.B
}

// EncodePeerAccessReply writes the server's answer to h.
func EncodePeerAccessReply(h Header, pr PeerAccessReply) []byte {
	w := NewMessage(Header{Typ: h.Typ, Seq: h.Seq})
	w.boolean(pr.WasEnabled)
	return w.B
}

// DecodePeerAccessReply reads the server's answer.
func DecodePeerAccessReply(r *WireReader) (PeerAccessReply, error) {
	pr := PeerAccessReply{WasEnabled: r.boolean("was enabled")}
	return pr, r.Done("peer access reply")
}
