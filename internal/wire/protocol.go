package wire

import (
	"encoding/binary"
	"fmt"
	"math"
	"unicode/utf8"

	"github.com/softuvm/softuvm/internal/core"
)

// The control protocol between a client (or a monitor such as `uvm stat`)
// and the fault server. Each message is one SOCK_SEQPACKET datagram: a
// 16-byte header, then a payload of little-endian fixed-size fields and
// length-prefixed strings. It is binary and fixed-layout so that the C
// library can speak it without a parser. Faults never travel here: they
// reach the server through the client's userfaultfd.
//
//	header: magic "SUVM" (uint32), version (uint16), type (uint16),
//	        sequence (uint32), status (uint32: 0 in requests, an
//	        errorCode in replies)
const (
	wireMagic      = 0x4d565553 // "SUVM" little-endian
	wireVersion    = 1
	wireHeaderSize = 16
	// maxMessageSize bounds every datagram; larger ones are refused
	// before they are parsed.
	MaxMessageSize = 1 << 20
	maxStringLen   = 64 << 10
	maxDeviceList  = 1024
)

type MsgType uint16

const (
	MsgHello MsgType = iota + 1
	MsgAlloc
	MsgFree
	MsgPrefetch
	MsgRangeAttrs
	MsgStats
	MsgInfo
	MsgDeviceConnect // client -> server: a connection for a device process
	MsgDeviceHello   // device process -> server, with its userfaultfd
	MsgDeviceReady   // device process -> server: ranges mapped
	MsgDeviceMap     // server -> device process: map a new range
	MsgDeviceUnmap   // server -> device process: unmap a freed range
	msgLaunch        // client -> device process: run a kernel (no reply)
	MsgSync          // client -> device process: wait for a stream
	MsgStreamDestroy // client -> device process: forget a stream
	MsgDeviceUp      // device process -> client: ready, with its workers
	MsgAdvise        // client -> server: cuMemAdvise
	MsgDeviceCopy    // client -> server: copy into, out of or between device memory
	MsgStreamOpen    // client -> device process: a stream's connection
	MsgDeviceFile    // client -> server: the session's file of a device, for copies
	MsgDeviceHints   // server -> device process: drop the mappings of these runs (hint faults)
	msgRestarted     // server -> client, unsolicited: a new server took over; send a pending request again
	MsgReplace       // a new daemon -> the running one: retire, and let me take over
	MsgStreamAttach  // client -> server: attach managed memory to the host, a stream or every stream
	MsgLaunchBegin   // client -> server: a kernel is about to start (launch coherence)
	MsgStreamsIdle   // client -> server: a device's streams have finished (launch coherence)
	MsgPeerAccess    // client -> server: enable or disable a device's access to a peer's memory
	MsgDeviceTrace   // server -> device process, first and unsolicited: report launches (devicetrace.go)
	MsgDeviceReport  // device process -> server, on the report socket: launches and synchronizations (no reply)
	MsgDiscard       // client -> server: drop every copy of a range's pages; the next touch reads zeros
	MsgLaunchGrid    // client -> device process: run a kernel as a grid of blocks (no reply; grid.go)
	MsgTraceControl  // client -> server: start or stop recording the session's events (uvmProfilerStart/Stop; tracecontrol.go)
	MsgDeviceLayout  // server -> device process, after the device hello's reply: more of its layout (no reply)
	msgTypeEnd       // one past the last message type
)

var msgTypeNames = [...]string{
	MsgHello: "hello", MsgAlloc: "alloc", MsgFree: "free", MsgPrefetch: "prefetch",
	MsgRangeAttrs: "range-attributes", MsgStats: "stats", MsgInfo: "info",
	MsgDeviceConnect: "device-connect", MsgDeviceHello: "device-hello", MsgDeviceReady: "device-ready",
	MsgDeviceMap: "device-map", MsgDeviceUnmap: "device-unmap", msgLaunch: "launch", MsgSync: "sync",
	MsgStreamDestroy: "stream-destroy", MsgDeviceUp: "device-up", MsgAdvise: "advise",
	MsgDeviceCopy: "device-copy", MsgStreamOpen: "stream-open", MsgDeviceFile: "device-file",
	MsgDeviceHints: "device-hints", msgRestarted: "restarted", MsgReplace: "replace",
	MsgStreamAttach: "stream-attach", MsgLaunchBegin: "launch-begin", MsgStreamsIdle: "streams-idle",
	MsgPeerAccess: "peer-access", MsgDeviceTrace: "device-trace", MsgDeviceReport: "device-report",
	MsgDiscard: "discard", MsgLaunchGrid: "launch-grid", MsgTraceControl: "trace-control",
	MsgDeviceLayout: "device-layout",
}

type Header struct {
	Typ    MsgType
	Seq    uint32
	Status errorCode
}

// requestRetried is the status of a request sent again after a restart:
// the server that took over may have read the first copy already, or the
// dead one may have carried it out.
const RequestRetried errorCode = 1

// Session roles given in hello.
const (
	RoleClient  = 1 // hands over a userfaultfd and a host file
	RoleMonitor = 2 // reads statistics and configuration only
)

// Stats scopes.
const (
	ScopeServer  = 0
	ScopeSession = 1
	ScopeRange   = 2
)

type HelloRequest struct {
	Role     uint8
	Pid      uint32
	features uint64 // userfaultfd features the client wants (0: server default)
	// Coherence is the model the client wants (0: the server's).
	Coherence core.Coherence
}

type HelloReply struct {
	ServerPID uint32
	SessionID uint64
	Features  uint64
	Devices   []core.DeviceInfo
	// Coherence is the session's model, never CoherenceDefault.
	Coherence core.Coherence
}

type AllocRequest struct {
	Addr, Length, Size uint64
	Flags              uint32
	TrackPrefetch      bool
	Prefetch           string
	Kind               core.RangeKind
	Device             int32 // the device of device memory
}

type AdviseRequest struct {
	Addr, Length uint64
	Advice       uint8
	Device       int32
}

type RangeRequest struct {
	Addr, Length uint64
}

type PrefetchRequest struct {
	Addr, Length uint64
	Dst          int32
}

type prefetchReply struct {
	migrated, populated uint64
}

type StatsRequest struct {
	Scope uint8
	Addr  uint64
}

type DeviceConnectRequest struct{ Device int32 }

type DeviceHelloRequest struct {
	Device uint32
	Pid    uint32
}

type DeviceReadyRequest struct{}

// DeviceMapRequest asks a device process to map processor File's file
// over [addr, addr+length): its own (a new range), or another's (a remote
// mapping). The pages of wp (bit i: page i of the range, which is then at
// most a block long) are write-protected in the new mapping from its
// first instant.
type DeviceMapRequest struct {
	Addr, Length uint64
	File         core.Device // int32 on the wire, as every processor
	Wp           core.PageMask
}

// hintsRequest asks a device process to drop its page-table entries over
// runs (the pages stay in their files), so that its next access to each
// is a fault the access counters see.
type HintsRequest struct {
	Runs []Mapping // File unused
}

// Mapping is a run of a device's layout: processor File's file over
// [addr, addr+length).
type Mapping struct {
	Addr, Length uint64
	File         core.Device // int32 on the wire, as every processor
}

// launchRequest runs kernel name with nthreads threads on stream, with a
// copy of params.
type LaunchRequest struct {
	Stream   uint32
	Nthreads uint32
	Name     string
	Params   []byte
	Cpu      int32 // the launching thread's CPU, -1 if unknown
}

// streamRequest names a stream; allStreams means every stream.
type StreamRequest struct{ Stream uint32 }

const AllStreams = ^uint32(0)

// maxLaunchThreads bounds a launch, as a CUDA grid is bounded.
const MaxLaunchThreads = 1 << 30

// wireWriter appends a message.
type wireWriter struct{ B []byte }

func NewMessage(h Header) *wireWriter {
	w := &wireWriter{B: make([]byte, 0, 128)}
	w.u32(wireMagic)
	w.u16(wireVersion)
	w.u16(uint16(h.Typ))
	w.u32(h.Seq)
	w.u32(uint32(h.Status))
	return w
}

// wireReader consumes a payload; the first problem sticks and later reads
// return zero values, so decoders check err once at the end.
type WireReader struct {
	B   []byte
	err error
}

// parseHeader checks the fixed header and returns the payload.
func ParseHeader(b []byte) (Header, []byte, error) {
	if len(b) < wireHeaderSize {
		return Header{}, nil, fmt.Errorf("%w: message of %d bytes is shorter than the %d-byte header", core.ErrInvalidValue, len(b), wireHeaderSize)
	}
	if len(b) > MaxMessageSize {
		return Header{}, nil, fmt.Errorf("%w: message of %d bytes exceeds %d", core.ErrInvalidValue, len(b), MaxMessageSize)
	}
	if m := binary.LittleEndian.Uint32(b); m != wireMagic {
		return Header{}, nil, fmt.Errorf("%w: bad magic %#x, want %#x (is this a softuvm client?)", core.ErrInvalidValue, m, wireMagic)
	}
	if v := binary.LittleEndian.Uint16(b[4:]); v != wireVersion {
		return Header{}, nil, fmt.Errorf("%w: protocol version %d, this server speaks %d", core.ErrInvalidValue, v, wireVersion)
	}
	h := Header{
		Typ:    MsgType(binary.LittleEndian.Uint16(b[6:])),
		Seq:    binary.LittleEndian.Uint32(b[8:]),
		Status: errorCode(binary.LittleEndian.Uint32(b[12:])),
	}
	return h, b[wireHeaderSize:], nil
}

// requestDecoders decode and validate the requests that files of their own
// define (coherence.go, peer.go), as the switch below does the rest: each
// sets r's error on a bad field. Filled in by init functions.
var requestDecoders = map[MsgType]func(r *WireReader) any{}

// parseRequest decodes and validates one request datagram as the server
// receives it. It never panics, whatever the bytes (FuzzParseRequest).
func ParseRequest(b []byte) (Header, any, error) {
	h, payload, err := ParseHeader(b)
	if err != nil {
		return h, nil, err
	}
	if h.Status != CodeOK && h.Status != RequestRetried {
		return h, nil, fmt.Errorf("%w: request with status %d, want 0 or %d (sent again)", core.ErrInvalidValue, h.Status, RequestRetried)
	}
	r := &WireReader{B: payload}
	var req any
	switch h.Typ {
	case MsgHello:
		hr := HelloRequest{Role: r.u8("role"), Pid: r.u32("pid"), features: r.U64("features"), Coherence: core.Coherence(r.u8("coherence"))}
		if r.err == nil && hr.Role != RoleClient && hr.Role != RoleMonitor {
			r.err = fmt.Errorf("%w: hello role %d, want %d (client) or %d (monitor)", core.ErrInvalidValue, hr.Role, RoleClient, RoleMonitor)
		}
		if r.err == nil && hr.Coherence > core.CoherenceLaunch {
			r.err = fmt.Errorf("%w: hello asks for coherence model %d, want 0 (the server's), 1 (fault) or 2 (launch)", core.ErrInvalidValue, hr.Coherence)
		}
		req = hr
	case MsgAlloc:
		ar := AllocRequest{Addr: r.U64("address"), Length: r.U64("length"), Size: r.U64("size"),
			Flags: r.u32("flags"), TrackPrefetch: r.boolean("track-prefetch"), Prefetch: r.Str("prefetch policy"),
			Kind: core.RangeKind(r.u8("kind")), Device: r.i32("device")}
		if r.err == nil {
			r.err = checkRange(ar.Addr, ar.Length, "alloc")
		}
		if r.err == nil && ar.Kind > core.KindDevice {
			r.err = fmt.Errorf("%w: alloc of memory kind %d: want 0 (managed), 1 (pinned host) or 2 (device)", core.ErrInvalidValue, ar.Kind)
		}
		if r.err == nil && (ar.Size == 0 || ar.Size > ar.Length || ar.Length-ar.Size >= core.PageSize) {
			r.err = fmt.Errorf("%w: alloc size %d does not fit mapped length %d", core.ErrInvalidValue, ar.Size, ar.Length)
		}
		req = ar
	case MsgFree:
		req = RangeRequest{Addr: r.U64("address")}
	case MsgPrefetch:
		pr := PrefetchRequest{Addr: r.U64("address"), Length: r.U64("length"), Dst: r.i32("destination")}
		if r.err == nil {
			r.err = checkRange(pr.Addr, pr.Length, "prefetch")
		}
		req = pr
	case MsgRangeAttrs, MsgDiscard:
		rr := RangeRequest{Addr: r.U64("address"), Length: r.U64("length")}
		if r.err == nil {
			r.err = checkRange(rr.Addr, rr.Length, h.Typ.String())
		}
		req = rr
	case MsgStats:
		sr := StatsRequest{Scope: r.u8("scope"), Addr: r.U64("address")}
		if r.err == nil && sr.Scope > ScopeRange {
			r.err = fmt.Errorf("%w: stats scope %d, want 0 (server), 1 (session) or 2 (range)", core.ErrInvalidValue, sr.Scope)
		}
		req = sr
	case MsgInfo, MsgReplace:
		req = struct{}{}
	case MsgDeviceConnect, MsgDeviceFile:
		req = DeviceConnectRequest{Device: r.i32("device")}
	case MsgDeviceHello:
		req = DeviceHelloRequest{Device: r.u32("device"), Pid: r.u32("pid")}
	case MsgDeviceReady:
		req = DeviceReadyRequest{}
	case MsgDeviceMap:
		mr := DeviceMapRequest{Addr: r.U64("address"), Length: r.U64("length"), File: r.processor("file")}
		for i := range mr.Wp {
			mr.Wp[i] = r.U64("write-protect mask")
		}
		if r.err == nil {
			r.err = checkRange(mr.Addr, mr.Length, h.Typ.String())
		}
		if r.err == nil && !mr.Wp.Empty() && mr.Length > core.BlockSize {
			r.err = fmt.Errorf("%w: map of %d bytes with write-protected pages: at most one block (%d bytes)", core.ErrInvalidValue, mr.Length, core.BlockSize)
		}
		req = mr
	case MsgDeviceHints:
		req = HintsRequest{Runs: decodeRuns(r, false)}
	case MsgDeviceLayout:
		lr := DeviceLayoutRequest{Runs: decodeRuns(r, true)}
		if r.err == nil && len(lr.Runs) > LayoutChunkRuns {
			r.err = fmt.Errorf("%w: %d runs in one device-layout message, at most %d", core.ErrInvalidValue, len(lr.Runs), LayoutChunkRuns)
		}
		req = lr
	case MsgDeviceUnmap:
		rr := RangeRequest{Addr: r.U64("address"), Length: r.U64("length")}
		if r.err == nil {
			r.err = checkRange(rr.Addr, rr.Length, h.Typ.String())
		}
		req = rr
	case msgLaunch:
		lr := LaunchRequest{Stream: r.u32("stream"), Nthreads: r.u32("threads"), Name: r.Str("kernel name"), Params: r.bytes("parameters", core.MaxKernelParams), Cpu: r.i32("cpu")}
		if r.err == nil && (lr.Nthreads == 0 || lr.Nthreads > MaxLaunchThreads) {
			r.err = fmt.Errorf("%w: launch of %q with %d threads: want 1 to %d", core.ErrInvalidValue, lr.Name, lr.Nthreads, MaxLaunchThreads)
		}
		req = lr
	case MsgSync, MsgStreamDestroy, MsgStreamOpen:
		req = StreamRequest{Stream: r.u32("stream")}
	case MsgDeviceCopy:
		cr := DeviceCopyRequest{Op: r.u8("operation"), Dst: r.U64("destination"), src: r.U64("source"), Length: r.U64("length"), value: r.u8("value")}
		if r.err == nil && cr.Op != DeviceWritten {
			r.err = fmt.Errorf("%w: device copy operation %d: want %d (device memory written)", core.ErrInvalidValue, cr.Op, DeviceWritten)
		}
		if r.err == nil && (cr.Length == 0 || cr.Length > core.MaxAllocation) {
			r.err = fmt.Errorf("%w: device copy of %d bytes: want 1 to %d", core.ErrInvalidValue, cr.Length, uint64(core.MaxAllocation))
		}
		req = cr
	case MsgAdvise:
		ar := AdviseRequest{Addr: r.U64("address"), Length: r.U64("length"), Advice: r.u8("advice"), Device: r.i32("device")}
		if r.err == nil {
			r.err = checkRange(ar.Addr, ar.Length, "advise")
		}
		req = ar
	default:
		decode := requestDecoders[h.Typ]
		if decode == nil {
			return h, nil, fmt.Errorf("%w: unknown request type %d", core.ErrInvalidValue, uint16(h.Typ))
		}
		req = decode(r)
	}
	if err := r.Done(h.Typ.String() + " request"); err != nil {
		return h, nil, err
	}
	return h, req, nil
}

// checkRange validates a page-aligned, nonempty range in the user half of
// the address space.
func checkRange(addr, length uint64, what string) error {
	const userTop = 1 << 47
	switch {
	case addr&core.PageOffsetMask != 0 || length&core.PageOffsetMask != 0:
		return fmt.Errorf("%w: %s range %#x+%d is not page-aligned", core.ErrInvalidValue, what, addr, length)
	case length == 0:
		return fmt.Errorf("%w: %s range at %#x is empty", core.ErrInvalidValue, what, addr)
	case addr == 0 || addr >= userTop || length > userTop-addr:
		return fmt.Errorf("%w: %s range %#x+%d is outside the user address space", core.ErrInvalidValue, what, addr, length)
	}
	return nil
}

func EncodeHello(seq uint32, hr HelloRequest) []byte {
	w := NewMessage(Header{Typ: MsgHello, Seq: seq})
	w.u8(hr.Role)
	w.u32(hr.Pid)
	w.u64(hr.features)
	w.u8(uint8(hr.Coherence))
	return w.B
}

func EncodeAlloc(seq uint32, ar AllocRequest) []byte {
	w := NewMessage(Header{Typ: MsgAlloc, Seq: seq})
	w.u64(ar.Addr)
	w.u64(ar.Length)
	w.u64(ar.Size)
	w.u32(ar.Flags)
	w.boolean(ar.TrackPrefetch)
	w.str(ar.Prefetch)
	w.u8(uint8(ar.Kind))
	w.i32(ar.Device)
	return w.B
}

func EncodeDeviceCopy(seq uint32, cr DeviceCopyRequest) []byte {
	w := NewMessage(Header{Typ: MsgDeviceCopy, Seq: seq})
	w.u8(cr.Op)
	w.u64(cr.Dst)
	w.u64(cr.src)
	w.u64(cr.Length)
	w.u8(cr.value)
	return w.B
}

func EncodeAdvise(seq uint32, ar AdviseRequest) []byte {
	w := NewMessage(Header{Typ: MsgAdvise, Seq: seq})
	w.u64(ar.Addr)
	w.u64(ar.Length)
	w.u8(ar.Advice)
	w.i32(ar.Device)
	return w.B
}

func EncodeFree(seq uint32, addr uint64) []byte {
	w := NewMessage(Header{Typ: MsgFree, Seq: seq})
	w.u64(addr)
	return w.B
}

func EncodePrefetch(seq uint32, pr PrefetchRequest) []byte {
	w := NewMessage(Header{Typ: MsgPrefetch, Seq: seq})
	w.u64(pr.Addr)
	w.u64(pr.Length)
	w.i32(pr.Dst)
	return w.B
}

func EncodeRangeAttrs(seq uint32, rr RangeRequest) []byte {
	w := NewMessage(Header{Typ: MsgRangeAttrs, Seq: seq})
	w.u64(rr.Addr)
	w.u64(rr.Length)
	return w.B
}

// EncodeDiscard asks the server to drop every copy of the pages of
// rr, as cudaMemDiscardBatchAsync: their next touch reads zeros.
func EncodeDiscard(seq uint32, rr RangeRequest) []byte {
	w := NewMessage(Header{Typ: MsgDiscard, Seq: seq})
	w.u64(rr.Addr)
	w.u64(rr.Length)
	return w.B
}

func encodeStats(seq uint32, sr StatsRequest) []byte {
	w := NewMessage(Header{Typ: MsgStats, Seq: seq})
	w.u8(sr.Scope)
	w.u64(sr.Addr)
	return w.B
}

func EncodeInfo(seq uint32) []byte {
	return NewMessage(Header{Typ: MsgInfo, Seq: seq}).B
}

func EncodeDeviceFile(seq uint32, d core.Device) []byte {
	w := NewMessage(Header{Typ: MsgDeviceFile, Seq: seq})
	w.i32(int32(d))
	return w.B
}

func EncodeDeviceConnect(seq uint32, d core.Device) []byte {
	w := NewMessage(Header{Typ: MsgDeviceConnect, Seq: seq})
	w.i32(int32(d))
	return w.B
}

func EncodeDeviceMap(seq uint32, mr DeviceMapRequest) []byte {
	w := NewMessage(Header{Typ: MsgDeviceMap, Seq: seq})
	w.u64(mr.Addr)
	w.u64(mr.Length)
	w.i32(int32(mr.File))
	for _, x := range mr.Wp {
		w.u64(x)
	}
	return w.B
}

// encodeRestarted is the notice a new server sends each client it took
// over, with its pid and how many servers died before it.
func EncodeRestarted(serverPID, restarts uint32) []byte {
	w := NewMessage(Header{Typ: msgRestarted})
	w.u32(serverPID)
	w.u32(restarts)
	return w.B
}

func decodeRestarted(r *WireReader) (serverPID, restarts uint32, err error) {
	serverPID, restarts = r.u32("server pid"), r.u32("restarts")
	return serverPID, restarts, r.Done("restarted notice")
}

func EncodeDeviceUnmap(seq uint32, addr, length uint64) []byte {
	w := NewMessage(Header{Typ: MsgDeviceUnmap, Seq: seq})
	w.u64(addr)
	w.u64(length)
	return w.B
}

func EncodeDeviceHints(seq uint32, runs []Mapping) []byte {
	w := NewMessage(Header{Typ: MsgDeviceHints, Seq: seq})
	w.u32(uint32(len(runs)))
	for _, m := range runs {
		w.u64(m.Addr)
		w.u64(m.Length)
	}
	return w.B
}

func EncodeDeviceHello(seq uint32, dh DeviceHelloRequest) []byte {
	w := NewMessage(Header{Typ: MsgDeviceHello, Seq: seq})
	w.u32(dh.Device)
	w.u32(dh.Pid)
	return w.B
}

func EncodeLaunch(seq uint32, lr LaunchRequest) []byte {
	w := NewMessage(Header{Typ: msgLaunch, Seq: seq})
	w.u32(lr.Stream)
	w.u32(lr.Nthreads)
	w.str(lr.Name)
	w.bytes(lr.Params)
	w.i32(lr.Cpu)
	return w.B
}

func EncodeStreamRequest(typ MsgType, seq uint32, stream uint32) []byte {
	w := NewMessage(Header{Typ: typ, Seq: seq})
	w.u32(stream)
	return w.B
}

// layout is what a device process maps when it attaches: each run maps
// its location's file over the addresses, later runs over earlier ones.
// With MinorRemote, the process registers its mappings of other
// locations' files for MINOR faults too (the user-space fallback of the
// access counters). With MinorOwn, it registers its mappings of its own
// file for MINOR faults too, so that the server maps a block its file
// takes whole with one UFFDIO_CONTINUE (the arena takes large folios).
//
// A layout has as many runs as advice and residency cut the ranges
// into: a hundred thousand and more where advice alternates page by
// page, more than one datagram holds (a socket's send buffer bounds it,
// a few hundred KiB). So it travels in pieces (EncodeLayout): the
// device hello's reply carries the flags, the first LayoutChunkRuns runs
// and More, how many runs follow in device-layout messages of at most
// LayoutChunkRuns runs each, which the server writes right after the
// reply and the device reads before it maps anything.
type Layout struct {
	Runs        []Mapping
	MinorRemote bool
	MinorOwn    bool
	More        uint32
}

// LayoutChunkRuns is the most runs one layout message carries: 40 KiB of
// runs, well inside a socket's default send buffer.
const LayoutChunkRuns = 2048

// DeviceLayoutRequest is more of a device's layout: runs that follow
// those of the device hello's reply and of the device-layout messages
// before it.
type DeviceLayoutRequest struct{ Runs []Mapping }

// EncodeLayout returns the messages that carry lay to a device process:
// the device hello's reply (h), then the device-layout messages, in the
// order they must be sent.
func EncodeLayout(h Header, lay Layout) [][]byte {
	runs := lay.Runs
	first := runs[:min(len(runs), LayoutChunkRuns)]
	rest := runs[len(first):]
	msgs := [][]byte{EncodeLayoutReply(h, Layout{Runs: first, MinorRemote: lay.MinorRemote, MinorOwn: lay.MinorOwn, More: uint32(len(rest))})}
	for len(rest) > 0 {
		n := min(len(rest), LayoutChunkRuns)
		msgs = append(msgs, EncodeDeviceLayout(h.Seq, rest[:n]))
		rest = rest[n:]
	}
	return msgs
}

// EncodeLayoutReply encodes one layout message: the reply to the device
// hello, with lay.More as it is (EncodeLayout sets it).
func EncodeLayoutReply(h Header, lay Layout) []byte {
	w := NewMessage(Header{Typ: h.Typ, Seq: h.Seq})
	encodeRuns(w, lay.Runs)
	w.boolean(lay.MinorRemote)
	w.boolean(lay.MinorOwn)
	w.u32(lay.More)
	return w.B
}

// EncodeDeviceLayout encodes a device-layout message of runs.
func EncodeDeviceLayout(seq uint32, runs []Mapping) []byte {
	w := NewMessage(Header{Typ: MsgDeviceLayout, Seq: seq})
	encodeRuns(w, runs)
	return w.B
}

func encodeRuns(w *wireWriter, runs []Mapping) {
	w.u32(uint32(len(runs)))
	for _, m := range runs {
		w.u64(m.Addr)
		w.u64(m.Length)
		w.i32(int32(m.File))
	}
}

func DecodeLayoutReply(r *WireReader) (Layout, error) {
	lay := Layout{Runs: decodeRuns(r, true)}
	lay.MinorRemote = r.boolean("minor-remote flag")
	lay.MinorOwn = r.boolean("minor-own flag")
	lay.More = r.u32("runs to follow")
	if r.err == nil && len(lay.Runs) > LayoutChunkRuns {
		r.err = fmt.Errorf("%w: %d runs in the device hello's reply, at most %d", core.ErrInvalidValue, len(lay.Runs), LayoutChunkRuns)
	}
	return lay, r.Done("layout reply")
}

// decodeRuns reads a count and that many runs, with their files if
// withFile.
func decodeRuns(r *WireReader, withFile bool) []Mapping {
	n := r.u32("run count")
	if r.err == nil && n > MaxMessageSize/16 {
		r.err = fmt.Errorf("%w: %d runs in one message", core.ErrInvalidValue, n)
		return nil
	}
	out := make([]Mapping, 0, n)
	for i := uint32(0); i < n && r.err == nil; i++ {
		m := Mapping{Addr: r.U64("run address"), Length: r.U64("run length")}
		if withFile {
			m.File = r.processor("run file")
		}
		if r.err == nil {
			r.err = checkRange(m.Addr, m.Length, "mapping")
		}
		out = append(out, m)
	}
	return out
}

func EncodeError(h Header, err error) []byte {
	w := NewMessage(Header{Typ: h.Typ, Seq: h.Seq, Status: codeOf(err)})
	w.str(err.Error())
	return w.B
}

func EncodeHelloReply(h Header, hr HelloReply) []byte {
	w := NewMessage(Header{Typ: h.Typ, Seq: h.Seq})
	w.u32(hr.ServerPID)
	w.u64(hr.SessionID)
	w.u64(hr.Features)
	w.u32(uint32(len(hr.Devices)))
	for _, d := range hr.Devices {
		w.u64(uint64(d.Capacity))
		w.str(d.Backend)
		w.i32(int32(d.Node))
		w.u32(uint32(d.Workers))
	}
	w.u8(uint8(hr.Coherence))
	return w.B
}

func EncodeEmptyReply(h Header) []byte { return NewMessage(Header{Typ: h.Typ, Seq: h.Seq}).B }

func EncodeU64Reply(h Header, vs ...uint64) []byte {
	w := NewMessage(Header{Typ: h.Typ, Seq: h.Seq})
	for _, v := range vs {
		w.u64(v)
	}
	return w.B
}

func EncodeRangeAttrsReply(h Header, a core.RangeAttributes) []byte {
	w := NewMessage(Header{Typ: h.Typ, Seq: h.Seq})
	w.boolean(a.ReadMostly)
	w.i32(int32(a.PreferredLocation))
	w.i32(int32(a.LastPrefetchLocation))
	w.u32(uint32(len(a.AccessedBy)))
	for _, d := range a.AccessedBy {
		w.i32(int32(d))
	}
	return w.B
}

func EncodeStringReply(h Header, s string) []byte {
	w := NewMessage(Header{Typ: h.Typ, Seq: h.Seq})
	w.u32(uint32(len(s)))
	w.B = append(w.B, s...)
	return w.B
}

// parseReply checks a reply against the request it answers and returns
// its payload, or the error the server sent.
func ParseReply(b []byte, want Header) (*WireReader, error) {
	h, payload, err := ParseHeader(b)
	if err != nil {
		return nil, err
	}
	if h.Typ != want.Typ || h.Seq != want.Seq {
		return nil, fmt.Errorf("%w: reply %s #%d does not answer %s #%d", core.ErrInternal, h.Typ, h.Seq, want.Typ, want.Seq)
	}
	r := &WireReader{B: payload}
	if h.Status != CodeOK {
		msg := r.Str("error message")
		if r.err != nil {
			msg = fmt.Sprintf("server error %d (unreadable message: %v)", h.Status, r.err)
		}
		return nil, errorFromWire(h.Status, msg)
	}
	return r, nil
}

func DecodeHelloReply(r *WireReader) (HelloReply, error) {
	hr := HelloReply{ServerPID: r.u32("server pid"), SessionID: r.U64("session"), Features: r.U64("features")}
	n := r.u32("device count")
	if r.err == nil && n > maxDeviceList {
		return hr, fmt.Errorf("%w: %d devices exceeds %d", core.ErrInvalidValue, n, maxDeviceList)
	}
	for i := uint32(0); i < n && r.err == nil; i++ {
		capacity := r.U64("device capacity")
		if capacity > math.MaxInt64 {
			return hr, fmt.Errorf("%w: device %d capacity %d", core.ErrInvalidValue, i, capacity)
		}
		hr.Devices = append(hr.Devices, core.DeviceInfo{Device: core.Device(i), Capacity: int64(capacity), Backend: r.Str("backend"), Node: int(r.i32("node")), Workers: int(r.u32("workers"))})
	}
	hr.Coherence = core.Coherence(r.u8("coherence"))
	return hr, r.Done("hello reply")
}

func DecodeRangeAttrsReply(r *WireReader) (core.RangeAttributes, error) {
	a := core.RangeAttributes{ReadMostly: r.boolean("read-mostly"), PreferredLocation: core.Device(r.i32("preferred")), LastPrefetchLocation: core.Device(r.i32("last prefetch"))}
	n := r.u32("accessed-by count")
	if r.err == nil && n > maxDeviceList {
		return a, fmt.Errorf("%w: %d accessed-by devices exceeds %d", core.ErrInvalidValue, n, maxDeviceList)
	}
	a.AccessedBy = make([]core.Device, 0, n)
	for i := uint32(0); i < n && r.err == nil; i++ {
		a.AccessedBy = append(a.AccessedBy, core.Device(r.i32("accessed-by device")))
	}
	return a, r.Done("range attributes reply")
}

func decodeStringReply(r *WireReader) (string, error) {
	n := r.u32("length")
	if r.err == nil && n > MaxMessageSize {
		return "", fmt.Errorf("%w: string reply of %d bytes", core.ErrInvalidValue, n)
	}
	v := r.need(int(n), "string reply")
	return string(v), r.Done("string reply")
}

func (t MsgType) String() string {
	if t > 0 && t < msgTypeEnd {
		return msgTypeNames[t]
	}
	return fmt.Sprintf("message-type-%d", uint16(t))
}

func (w *wireWriter) u8(v uint8) { w.B = append(w.B, v) }

func (w *wireWriter) u16(v uint16) { w.B = binary.LittleEndian.AppendUint16(w.B, v) }

func (w *wireWriter) u32(v uint32) { w.B = binary.LittleEndian.AppendUint32(w.B, v) }

func (w *wireWriter) u64(v uint64) { w.B = binary.LittleEndian.AppendUint64(w.B, v) }

func (w *wireWriter) i32(v int32) { w.u32(uint32(v)) }

func (w *wireWriter) str(s string) {
	if len(s) > maxStringLen {
		s = s[:maxStringLen]
	}
	w.u32(uint32(len(s)))
	w.B = append(w.B, s...)
}

func (w *wireWriter) bytes(b []byte) {
	w.u32(uint32(len(b)))
	w.B = append(w.B, b...)
}

func (w *wireWriter) boolean(v bool) {
	if v {
		w.u8(1)
	} else {
		w.u8(0)
	}
}

func (r *WireReader) need(n int, what string) []byte {
	if r.err != nil {
		return nil
	}
	if len(r.B) < n {
		r.err = fmt.Errorf("%w: message truncated: %s needs %d bytes, %d left", core.ErrInvalidValue, what, n, len(r.B))
		return nil
	}
	v := r.B[:n]
	r.B = r.B[n:]
	return v
}

func (r *WireReader) u8(what string) uint8 {
	if v := r.need(1, what); v != nil {
		return v[0]
	}
	return 0
}

func (r *WireReader) u16(what string) uint16 {
	if v := r.need(2, what); v != nil {
		return binary.LittleEndian.Uint16(v)
	}
	return 0
}

func (r *WireReader) u32(what string) uint32 {
	if v := r.need(4, what); v != nil {
		return binary.LittleEndian.Uint32(v)
	}
	return 0
}

func (r *WireReader) U64(what string) uint64 {
	if v := r.need(8, what); v != nil {
		return binary.LittleEndian.Uint64(v)
	}
	return 0
}

func (r *WireReader) i32(what string) int32 { return int32(r.u32(what)) }

// processor reads a processor (an int32: CPU, -1, or a device index) and
// refuses one no server can have.
func (r *WireReader) processor(what string) core.Device {
	d := core.Device(r.i32(what))
	if r.err == nil && (d < core.CPU || d >= core.MaxDevices) {
		r.err = fmt.Errorf("%w: %s processor %d: want -1 (the CPU) or a device from 0 to %d", core.ErrInvalidValue, what, int(d), core.MaxDevices-1)
	}
	return d
}

// bytes reads a length-prefixed byte string of at most limit bytes.
func (r *WireReader) bytes(what string, limit int) []byte {
	n := r.u32(what + " length")
	if r.err == nil && int64(n) > int64(limit) {
		r.err = fmt.Errorf("%w: %s of %d bytes: at most %d", core.ErrInvalidValue, what, n, limit)
		return nil
	}
	if v := r.need(int(n), what); v != nil {
		return append([]byte(nil), v...)
	}
	return nil
}

func (r *WireReader) boolean(what string) bool {
	v := r.u8(what)
	if v > 1 && r.err == nil {
		r.err = fmt.Errorf("%w: %s is %d, want 0 or 1", core.ErrInvalidValue, what, v)
	}
	return v == 1
}

func (r *WireReader) Str(what string) string {
	n := r.u32(what + " length")
	if r.err != nil {
		return ""
	}
	if n > maxStringLen {
		r.err = fmt.Errorf("%w: %s length %d exceeds %d", core.ErrInvalidValue, what, n, maxStringLen)
		return ""
	}
	v := r.need(int(n), what)
	if r.err == nil && !utf8.Valid(v) {
		r.err = fmt.Errorf("%w: %s is not UTF-8", core.ErrInvalidValue, what)
		return ""
	}
	return string(v)
}

// done reports trailing garbage as an error: a message is exactly its
// fields.
func (r *WireReader) Done(what string) error {
	if r.err == nil && len(r.B) != 0 {
		r.err = fmt.Errorf("%w: %s has %d unexpected trailing bytes", core.ErrInvalidValue, what, len(r.B))
	}
	return r.err
}
