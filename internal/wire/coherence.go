package wire

import (
	"fmt"

	"github.com/softuvm/softuvm/internal/core"
)

// The launch coherence model's requests: a client tells the server how
// its managed allocations are attached to streams, when a kernel is about
// to start, and when streams have finished, so that the server hands the
// memory a kernel may use to its device and refuses the CPU's touches
// until the synchronize that follows.

// StreamAttachRequest attaches the managed allocation at Addr
// (cudaStreamAttachMemAsync): to every stream (AttachGlobal), to the host
// (AttachHost), or to stream Stream of device Device (AttachSingle).
type StreamAttachRequest struct {
	Addr   uint64
	Mode   core.AttachMode
	Device int32
	Stream uint32
}

// LaunchBeginRequest says that kernel Kernel is about to start on stream
// Stream of device Device.
type LaunchBeginRequest struct {
	Device int32
	Stream uint32
	Kernel string
}

// StreamsIdleRequest says that every kernel launched on stream Stream of
// device Device (AllStreams: on every stream of it) has finished.
type StreamsIdleRequest struct {
	Device int32
	Stream uint32
}

func init() {
	requestDecoders[MsgStreamAttach] = func(r *WireReader) any {
		sa := StreamAttachRequest{Addr: r.U64("address"), Mode: core.AttachMode(r.u32("attach flags")), Device: r.i32("device"), Stream: r.u32("stream")}
		if r.err == nil && sa.Mode != core.AttachGlobal && sa.Mode != core.AttachHost && sa.Mode != core.AttachSingle {
			r.err = fmt.Errorf("%w: attach flags %#x: want %#x (global), %#x (host) or %#x (single)", core.ErrInvalidValue, uint32(sa.Mode), uint32(core.AttachGlobal), uint32(core.AttachHost), uint32(core.AttachSingle))
		}
		if r.err == nil && sa.Mode == core.AttachSingle && sa.Device < 0 {
			r.err = fmt.Errorf("%w: attach to a single stream of device %d: want a device", core.ErrInvalidValue, sa.Device)
		}
		return sa
	}
	requestDecoders[MsgLaunchBegin] = func(r *WireReader) any {
		lb := LaunchBeginRequest{Device: r.i32("device"), Stream: r.u32("stream"), Kernel: r.Str("kernel")}
		if r.err == nil && lb.Device < 0 {
			r.err = fmt.Errorf("%w: launch on device %d: want a device", core.ErrInvalidValue, lb.Device)
		}
		return lb
	}
	requestDecoders[MsgStreamsIdle] = func(r *WireReader) any {
		si := StreamsIdleRequest{Device: r.i32("device"), Stream: r.u32("stream")}
		if r.err == nil && si.Device < 0 {
			r.err = fmt.Errorf("%w: streams of device %d: want a device", core.ErrInvalidValue, si.Device)
		}
		return si
	}
}

func EncodeStreamAttach(seq uint32, sa StreamAttachRequest) []byte {
	w := NewMessage(Header{Typ: MsgStreamAttach, Seq: seq})
	w.u64(sa.Addr)
	w.u32(uint32(sa.Mode))
	w.i32(sa.Device)
	w.u32(sa.Stream)
	return w.B
}

func EncodeLaunchBegin(seq uint32, lb LaunchBeginRequest) []byte {
	w := NewMessage(Header{Typ: MsgLaunchBegin, Seq: seq})
	w.i32(lb.Device)
	w.u32(lb.Stream)
	w.str(lb.Kernel)
	return w.B
}

func EncodeStreamsIdle(seq uint32, si StreamsIdleRequest) []byte {
	w := NewMessage(Header{Typ: MsgStreamsIdle, Seq: seq})
	w.i32(si.Device)
	w.u32(si.Stream)
	return w.B
}
