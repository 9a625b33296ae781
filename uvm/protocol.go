package uvm

import (
	"encoding/binary"
	"fmt"
	"math"
	"unicode/utf8"
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
	maxMessageSize = 1 << 20
	maxStringLen   = 64 << 10
	maxDeviceList  = 1024
)

type msgType uint16

const (
	msgHello msgType = iota + 1
	msgAlloc
	msgFree
	msgPrefetch
	msgRangeAttrs
	msgStats
	msgInfo
	msgDeviceConnect // client -> server: a connection for a device process
	msgDeviceHello   // device process -> server, with its userfaultfd
	msgDeviceReady   // device process -> server: ranges mapped
	msgDeviceMap     // server -> device process: map a new range
	msgDeviceUnmap   // server -> device process: unmap a freed range
	msgLaunch        // client -> device process: run a kernel (no reply)
	msgSync          // client -> device process: wait for a stream
	msgStreamDestroy // client -> device process: forget a stream
	msgDeviceUp      // device process -> client: ready, with its workers
	msgAdvise        // client -> server: cuMemAdvise
	msgDeviceCopy    // client -> server: copy into, out of or between device memory
	msgStreamOpen    // client -> device process: a stream's connection
	msgDeviceFile    // client -> server: the session's file of a device, for copies
	msgDeviceHints   // server -> device process: drop the mappings of these runs (hint faults)
	msgRestarted     // server -> client, unsolicited: a new server took over; send a pending request again
	msgReplace       // a new daemon -> the running one: retire, and let me take over
	msgTypeEnd       // one past the last message type
)

var msgTypeNames = [...]string{
	msgHello: "hello", msgAlloc: "alloc", msgFree: "free", msgPrefetch: "prefetch",
	msgRangeAttrs: "range-attributes", msgStats: "stats", msgInfo: "info",
	msgDeviceConnect: "device-connect", msgDeviceHello: "device-hello", msgDeviceReady: "device-ready",
	msgDeviceMap: "device-map", msgDeviceUnmap: "device-unmap", msgLaunch: "launch", msgSync: "sync",
	msgStreamDestroy: "stream-destroy", msgDeviceUp: "device-up", msgAdvise: "advise",
	msgDeviceCopy: "device-copy", msgStreamOpen: "stream-open", msgDeviceFile: "device-file",
	msgDeviceHints: "device-hints", msgRestarted: "restarted", msgReplace: "replace",
}

func (t msgType) String() string {
	if t > 0 && t < msgTypeEnd {
		return msgTypeNames[t]
	}
	return fmt.Sprintf("message-type-%d", uint16(t))
}

type header struct {
	typ    msgType
	seq    uint32
	status errorCode
}

// requestRetried is the status of a request sent again after a restart:
// the server that took over may have read the first copy already, or the
// dead one may have carried it out.
const requestRetried errorCode = 1

// Session roles given in hello.
const (
	roleClient  = 1 // hands over a userfaultfd and a host file
	roleMonitor = 2 // reads statistics and configuration only
)

// Stats scopes.
const (
	scopeServer  = 0
	scopeSession = 1
	scopeRange   = 2
)

type helloRequest struct {
	role     uint8
	pid      uint32
	features uint64 // userfaultfd features the client wants (0: server default)
}

type helloReply struct {
	serverPID uint32
	sessionID uint64
	features  uint64
	devices   []DeviceInfo
}

type allocRequest struct {
	addr, length, size uint64
	flags              uint32
	trackPrefetch      bool
	prefetch           string
	kind               rangeKind
	device             int32 // the device of device memory
}

type adviseRequest struct {
	addr, length uint64
	advice       uint8
	device       int32
}

type rangeRequest struct {
	addr, length uint64
}

type prefetchRequest struct {
	addr, length uint64
	dst          int32
}

type prefetchReply struct {
	migrated, populated uint64
}

type statsRequest struct {
	scope uint8
	addr  uint64
}

type deviceConnectRequest struct{ device int32 }

type deviceHelloRequest struct {
	device uint32
	pid    uint32
}

type deviceReadyRequest struct{}

// deviceMapRequest asks a device process to map location loc's file over
// [addr, addr+length): its own (a new range), or another's (a remote
// mapping). The pages of wp (bit i: page i of the range, which is then at
// most a block long) are write-protected in the new mapping from its
// first instant.
type deviceMapRequest struct {
	addr, length uint64
	loc          uint8
	wp           PageMask
}

// hintsRequest asks a device process to drop its page-table entries over
// runs (the pages stay in their files), so that its next access to each
// is a fault the access counters see.
type hintsRequest struct {
	runs []mapping // loc unused
}

// mapping is a run of a device's layout: location loc's file over
// [addr, addr+length).
type mapping struct {
	addr, length uint64
	loc          uint8
}

// launchRequest runs kernel name with nthreads threads on stream, with a
// copy of params.
type launchRequest struct {
	stream   uint32
	nthreads uint32
	name     string
	params   []byte
	cpu      int32 // the launching thread's CPU, -1 if unknown
}

// streamRequest names a stream; allStreams means every stream.
type streamRequest struct{ stream uint32 }

const allStreams = ^uint32(0)

// maxLaunchThreads bounds a launch, as a CUDA grid is bounded.
const maxLaunchThreads = 1 << 30

// wireWriter appends a message.
type wireWriter struct{ b []byte }

func newMessage(h header) *wireWriter {
	w := &wireWriter{b: make([]byte, 0, 128)}
	w.u32(wireMagic)
	w.u16(wireVersion)
	w.u16(uint16(h.typ))
	w.u32(h.seq)
	w.u32(uint32(h.status))
	return w
}

func (w *wireWriter) u8(v uint8)   { w.b = append(w.b, v) }
func (w *wireWriter) u16(v uint16) { w.b = binary.LittleEndian.AppendUint16(w.b, v) }
func (w *wireWriter) u32(v uint32) { w.b = binary.LittleEndian.AppendUint32(w.b, v) }
func (w *wireWriter) u64(v uint64) { w.b = binary.LittleEndian.AppendUint64(w.b, v) }
func (w *wireWriter) i32(v int32)  { w.u32(uint32(v)) }
func (w *wireWriter) str(s string) {
	if len(s) > maxStringLen {
		s = s[:maxStringLen]
	}
	w.u32(uint32(len(s)))
	w.b = append(w.b, s...)
}
func (w *wireWriter) bytes(b []byte) {
	w.u32(uint32(len(b)))
	w.b = append(w.b, b...)
}
func (w *wireWriter) boolean(v bool) {
	if v {
		w.u8(1)
	} else {
		w.u8(0)
	}
}

// wireReader consumes a payload; the first problem sticks and later reads
// return zero values, so decoders check err once at the end.
type wireReader struct {
	b   []byte
	err error
}

func (r *wireReader) need(n int, what string) []byte {
	if r.err != nil {
		return nil
	}
	if len(r.b) < n {
		r.err = fmt.Errorf("%w: message truncated: %s needs %d bytes, %d left", ErrInvalidValue, what, n, len(r.b))
		return nil
	}
	v := r.b[:n]
	r.b = r.b[n:]
	return v
}

func (r *wireReader) u8(what string) uint8 {
	if v := r.need(1, what); v != nil {
		return v[0]
	}
	return 0
}
func (r *wireReader) u16(what string) uint16 {
	if v := r.need(2, what); v != nil {
		return binary.LittleEndian.Uint16(v)
	}
	return 0
}
func (r *wireReader) u32(what string) uint32 {
	if v := r.need(4, what); v != nil {
		return binary.LittleEndian.Uint32(v)
	}
	return 0
}
func (r *wireReader) u64(what string) uint64 {
	if v := r.need(8, what); v != nil {
		return binary.LittleEndian.Uint64(v)
	}
	return 0
}
func (r *wireReader) i32(what string) int32 { return int32(r.u32(what)) }

// bytes reads a length-prefixed byte string of at most limit bytes.
func (r *wireReader) bytes(what string, limit int) []byte {
	n := r.u32(what + " length")
	if r.err == nil && int64(n) > int64(limit) {
		r.err = fmt.Errorf("%w: %s of %d bytes: at most %d", ErrInvalidValue, what, n, limit)
		return nil
	}
	if v := r.need(int(n), what); v != nil {
		return append([]byte(nil), v...)
	}
	return nil
}
func (r *wireReader) boolean(what string) bool {
	v := r.u8(what)
	if v > 1 && r.err == nil {
		r.err = fmt.Errorf("%w: %s is %d, want 0 or 1", ErrInvalidValue, what, v)
	}
	return v == 1
}
func (r *wireReader) str(what string) string {
	n := r.u32(what + " length")
	if r.err != nil {
		return ""
	}
	if n > maxStringLen {
		r.err = fmt.Errorf("%w: %s length %d exceeds %d", ErrInvalidValue, what, n, maxStringLen)
		return ""
	}
	v := r.need(int(n), what)
	if r.err == nil && !utf8.Valid(v) {
		r.err = fmt.Errorf("%w: %s is not UTF-8", ErrInvalidValue, what)
		return ""
	}
	return string(v)
}

// done reports trailing garbage as an error: a message is exactly its
// fields.
func (r *wireReader) done(what string) error {
	if r.err == nil && len(r.b) != 0 {
		r.err = fmt.Errorf("%w: %s has %d unexpected trailing bytes", ErrInvalidValue, what, len(r.b))
	}
	return r.err
}

// parseHeader checks the fixed header and returns the payload.
func parseHeader(b []byte) (header, []byte, error) {
	if len(b) < wireHeaderSize {
		return header{}, nil, fmt.Errorf("%w: message of %d bytes is shorter than the %d-byte header", ErrInvalidValue, len(b), wireHeaderSize)
	}
	if len(b) > maxMessageSize {
		return header{}, nil, fmt.Errorf("%w: message of %d bytes exceeds %d", ErrInvalidValue, len(b), maxMessageSize)
	}
	if m := binary.LittleEndian.Uint32(b); m != wireMagic {
		return header{}, nil, fmt.Errorf("%w: bad magic %#x, want %#x (is this a softuvm client?)", ErrInvalidValue, m, wireMagic)
	}
	if v := binary.LittleEndian.Uint16(b[4:]); v != wireVersion {
		return header{}, nil, fmt.Errorf("%w: protocol version %d, this server speaks %d", ErrInvalidValue, v, wireVersion)
	}
	h := header{
		typ:    msgType(binary.LittleEndian.Uint16(b[6:])),
		seq:    binary.LittleEndian.Uint32(b[8:]),
		status: errorCode(binary.LittleEndian.Uint32(b[12:])),
	}
	return h, b[wireHeaderSize:], nil
}

// parseRequest decodes and validates one request datagram as the server
// receives it. It never panics, whatever the bytes (FuzzParseRequest).
func parseRequest(b []byte) (header, any, error) {
	h, payload, err := parseHeader(b)
	if err != nil {
		return h, nil, err
	}
	if h.status != codeOK && h.status != requestRetried {
		return h, nil, fmt.Errorf("%w: request with status %d, want 0 or %d (sent again)", ErrInvalidValue, h.status, requestRetried)
	}
	r := &wireReader{b: payload}
	var req any
	switch h.typ {
	case msgHello:
		hr := helloRequest{role: r.u8("role"), pid: r.u32("pid"), features: r.u64("features")}
		if r.err == nil && hr.role != roleClient && hr.role != roleMonitor {
			r.err = fmt.Errorf("%w: hello role %d, want %d (client) or %d (monitor)", ErrInvalidValue, hr.role, roleClient, roleMonitor)
		}
		req = hr
	case msgAlloc:
		ar := allocRequest{addr: r.u64("address"), length: r.u64("length"), size: r.u64("size"),
			flags: r.u32("flags"), trackPrefetch: r.boolean("track-prefetch"), prefetch: r.str("prefetch policy"),
			kind: rangeKind(r.u8("kind")), device: r.i32("device")}
		if r.err == nil {
			r.err = checkRange(ar.addr, ar.length, "alloc")
		}
		if r.err == nil && ar.kind > kindDevice {
			r.err = fmt.Errorf("%w: alloc of memory kind %d: want 0 (managed), 1 (pinned host) or 2 (device)", ErrInvalidValue, ar.kind)
		}
		if r.err == nil && (ar.size == 0 || ar.size > ar.length || ar.length-ar.size >= PageSize) {
			r.err = fmt.Errorf("%w: alloc size %d does not fit mapped length %d", ErrInvalidValue, ar.size, ar.length)
		}
		req = ar
	case msgFree:
		req = rangeRequest{addr: r.u64("address")}
	case msgPrefetch:
		pr := prefetchRequest{addr: r.u64("address"), length: r.u64("length"), dst: r.i32("destination")}
		if r.err == nil {
			r.err = checkRange(pr.addr, pr.length, "prefetch")
		}
		req = pr
	case msgRangeAttrs:
		rr := rangeRequest{addr: r.u64("address"), length: r.u64("length")}
		if r.err == nil {
			r.err = checkRange(rr.addr, rr.length, "range attributes")
		}
		req = rr
	case msgStats:
		sr := statsRequest{scope: r.u8("scope"), addr: r.u64("address")}
		if r.err == nil && sr.scope > scopeRange {
			r.err = fmt.Errorf("%w: stats scope %d, want 0 (server), 1 (session) or 2 (range)", ErrInvalidValue, sr.scope)
		}
		req = sr
	case msgInfo, msgReplace:
		req = struct{}{}
	case msgDeviceConnect, msgDeviceFile:
		req = deviceConnectRequest{device: r.i32("device")}
	case msgDeviceHello:
		req = deviceHelloRequest{device: r.u32("device"), pid: r.u32("pid")}
	case msgDeviceReady:
		req = deviceReadyRequest{}
	case msgDeviceMap:
		mr := deviceMapRequest{addr: r.u64("address"), length: r.u64("length"), loc: r.u8("location")}
		for i := range mr.wp {
			mr.wp[i] = r.u64("write-protect mask")
		}
		if r.err == nil {
			r.err = checkRange(mr.addr, mr.length, h.typ.String())
		}
		if r.err == nil && !mr.wp.Empty() && mr.length > BlockSize {
			r.err = fmt.Errorf("%w: map of %d bytes with write-protected pages: at most one block (%d bytes)", ErrInvalidValue, mr.length, BlockSize)
		}
		if r.err == nil && mr.loc > maxDevices {
			r.err = fmt.Errorf("%w: map of location %d: at most %d", ErrInvalidValue, mr.loc, maxDevices)
		}
		req = mr
	case msgDeviceHints:
		req = hintsRequest{runs: decodeRuns(r, false)}
	case msgDeviceUnmap:
		rr := rangeRequest{addr: r.u64("address"), length: r.u64("length")}
		if r.err == nil {
			r.err = checkRange(rr.addr, rr.length, h.typ.String())
		}
		req = rr
	case msgLaunch:
		lr := launchRequest{stream: r.u32("stream"), nthreads: r.u32("threads"), name: r.str("kernel name"), params: r.bytes("parameters", MaxKernelParams), cpu: r.i32("cpu")}
		if r.err == nil && (lr.nthreads == 0 || lr.nthreads > maxLaunchThreads) {
			r.err = fmt.Errorf("%w: launch of %q with %d threads: want 1 to %d", ErrInvalidValue, lr.name, lr.nthreads, maxLaunchThreads)
		}
		req = lr
	case msgSync, msgStreamDestroy, msgStreamOpen:
		req = streamRequest{stream: r.u32("stream")}
	case msgDeviceCopy:
		cr := deviceCopyRequest{op: r.u8("operation"), dst: r.u64("destination"), src: r.u64("source"), length: r.u64("length"), value: r.u8("value")}
		if r.err == nil && cr.op != deviceWritten {
			r.err = fmt.Errorf("%w: device copy operation %d: want %d (device memory written)", ErrInvalidValue, cr.op, deviceWritten)
		}
		if r.err == nil && (cr.length == 0 || cr.length > MaxAllocation) {
			r.err = fmt.Errorf("%w: device copy of %d bytes: want 1 to %d", ErrInvalidValue, cr.length, uint64(MaxAllocation))
		}
		req = cr
	case msgAdvise:
		ar := adviseRequest{addr: r.u64("address"), length: r.u64("length"), advice: r.u8("advice"), device: r.i32("device")}
		if r.err == nil {
			r.err = checkRange(ar.addr, ar.length, "advise")
		}
		req = ar
	default:
		return h, nil, fmt.Errorf("%w: unknown request type %d", ErrInvalidValue, uint16(h.typ))
	}
	if err := r.done(h.typ.String() + " request"); err != nil {
		return h, nil, err
	}
	return h, req, nil
}

// checkRange validates a page-aligned, nonempty range in the user half of
// the address space.
func checkRange(addr, length uint64, what string) error {
	const userTop = 1 << 47
	switch {
	case addr&pageMask != 0 || length&pageMask != 0:
		return fmt.Errorf("%w: %s range %#x+%d is not page-aligned", ErrInvalidValue, what, addr, length)
	case length == 0:
		return fmt.Errorf("%w: %s range at %#x is empty", ErrInvalidValue, what, addr)
	case addr == 0 || addr >= userTop || length > userTop-addr:
		return fmt.Errorf("%w: %s range %#x+%d is outside the user address space", ErrInvalidValue, what, addr, length)
	}
	return nil
}

// Request encoders, used by the client.

func encodeHello(seq uint32, hr helloRequest) []byte {
	w := newMessage(header{typ: msgHello, seq: seq})
	w.u8(hr.role)
	w.u32(hr.pid)
	w.u64(hr.features)
	return w.b
}

func encodeAlloc(seq uint32, ar allocRequest) []byte {
	w := newMessage(header{typ: msgAlloc, seq: seq})
	w.u64(ar.addr)
	w.u64(ar.length)
	w.u64(ar.size)
	w.u32(ar.flags)
	w.boolean(ar.trackPrefetch)
	w.str(ar.prefetch)
	w.u8(uint8(ar.kind))
	w.i32(ar.device)
	return w.b
}

func encodeDeviceCopy(seq uint32, cr deviceCopyRequest) []byte {
	w := newMessage(header{typ: msgDeviceCopy, seq: seq})
	w.u8(cr.op)
	w.u64(cr.dst)
	w.u64(cr.src)
	w.u64(cr.length)
	w.u8(cr.value)
	return w.b
}

func encodeAdvise(seq uint32, ar adviseRequest) []byte {
	w := newMessage(header{typ: msgAdvise, seq: seq})
	w.u64(ar.addr)
	w.u64(ar.length)
	w.u8(ar.advice)
	w.i32(ar.device)
	return w.b
}

func encodeFree(seq uint32, addr uint64) []byte {
	w := newMessage(header{typ: msgFree, seq: seq})
	w.u64(addr)
	return w.b
}

func encodePrefetch(seq uint32, pr prefetchRequest) []byte {
	w := newMessage(header{typ: msgPrefetch, seq: seq})
	w.u64(pr.addr)
	w.u64(pr.length)
	w.i32(pr.dst)
	return w.b
}

func encodeRangeAttrs(seq uint32, rr rangeRequest) []byte {
	w := newMessage(header{typ: msgRangeAttrs, seq: seq})
	w.u64(rr.addr)
	w.u64(rr.length)
	return w.b
}

func encodeStats(seq uint32, sr statsRequest) []byte {
	w := newMessage(header{typ: msgStats, seq: seq})
	w.u8(sr.scope)
	w.u64(sr.addr)
	return w.b
}

func encodeInfo(seq uint32) []byte {
	return newMessage(header{typ: msgInfo, seq: seq}).b
}

func encodeDeviceFile(seq uint32, d Device) []byte {
	w := newMessage(header{typ: msgDeviceFile, seq: seq})
	w.i32(int32(d))
	return w.b
}

func encodeDeviceConnect(seq uint32, d Device) []byte {
	w := newMessage(header{typ: msgDeviceConnect, seq: seq})
	w.i32(int32(d))
	return w.b
}

func encodeDeviceMap(seq uint32, mr deviceMapRequest) []byte {
	w := newMessage(header{typ: msgDeviceMap, seq: seq})
	w.u64(mr.addr)
	w.u64(mr.length)
	w.u8(mr.loc)
	for _, x := range mr.wp {
		w.u64(x)
	}
	return w.b
}

// encodeRestarted is the notice a new server sends each client it took
// over, with its pid and how many servers died before it.
func encodeRestarted(serverPID, restarts uint32) []byte {
	w := newMessage(header{typ: msgRestarted})
	w.u32(serverPID)
	w.u32(restarts)
	return w.b
}

func decodeRestarted(r *wireReader) (serverPID, restarts uint32, err error) {
	serverPID, restarts = r.u32("server pid"), r.u32("restarts")
	return serverPID, restarts, r.done("restarted notice")
}

func encodeDeviceUnmap(seq uint32, addr, length uint64) []byte {
	w := newMessage(header{typ: msgDeviceUnmap, seq: seq})
	w.u64(addr)
	w.u64(length)
	return w.b
}

func encodeDeviceHints(seq uint32, runs []mapping) []byte {
	w := newMessage(header{typ: msgDeviceHints, seq: seq})
	w.u32(uint32(len(runs)))
	for _, m := range runs {
		w.u64(m.addr)
		w.u64(m.length)
	}
	return w.b
}

func encodeDeviceHello(seq uint32, dh deviceHelloRequest) []byte {
	w := newMessage(header{typ: msgDeviceHello, seq: seq})
	w.u32(dh.device)
	w.u32(dh.pid)
	return w.b
}

func encodeLaunch(seq uint32, lr launchRequest) []byte {
	w := newMessage(header{typ: msgLaunch, seq: seq})
	w.u32(lr.stream)
	w.u32(lr.nthreads)
	w.str(lr.name)
	w.bytes(lr.params)
	w.i32(lr.cpu)
	return w.b
}

func encodeStreamRequest(typ msgType, seq uint32, stream uint32) []byte {
	w := newMessage(header{typ: typ, seq: seq})
	w.u32(stream)
	return w.b
}

// layout is what a device process maps when it attaches: each run maps
// its location's file over the addresses, later runs over earlier ones.
// With minorRemote, the process registers its mappings of other
// locations' files for MINOR faults too (the user-space fallback of the
// access counters).
type layout struct {
	runs        []mapping
	minorRemote bool
}

func encodeLayoutReply(h header, lay layout) []byte {
	w := newMessage(header{typ: h.typ, seq: h.seq})
	w.u32(uint32(len(lay.runs)))
	for _, m := range lay.runs {
		w.u64(m.addr)
		w.u64(m.length)
		w.u8(m.loc)
	}
	minor := uint8(0)
	if lay.minorRemote {
		minor = 1
	}
	w.u8(minor)
	return w.b
}

func decodeLayoutReply(r *wireReader) (layout, error) {
	lay := layout{runs: decodeRuns(r, true)}
	lay.minorRemote = r.boolean("minor-remote flag")
	return lay, r.done("layout reply")
}

// decodeRuns reads a count and that many runs, with their locations if
// withLoc.
func decodeRuns(r *wireReader, withLoc bool) []mapping {
	n := r.u32("run count")
	if r.err == nil && n > maxMessageSize/16 {
		r.err = fmt.Errorf("%w: %d runs in one message", ErrInvalidValue, n)
		return nil
	}
	out := make([]mapping, 0, n)
	for i := uint32(0); i < n && r.err == nil; i++ {
		m := mapping{addr: r.u64("run address"), length: r.u64("run length")}
		if withLoc {
			m.loc = r.u8("run location")
		}
		if r.err == nil {
			r.err = checkRange(m.addr, m.length, "mapping")
		}
		if r.err == nil && m.loc > maxDevices {
			r.err = fmt.Errorf("%w: mapping of location %d: at most %d", ErrInvalidValue, m.loc, maxDevices)
		}
		out = append(out, m)
	}
	return out
}

// Replies.

func encodeError(h header, err error) []byte {
	w := newMessage(header{typ: h.typ, seq: h.seq, status: codeOf(err)})
	w.str(err.Error())
	return w.b
}

func encodeHelloReply(h header, hr helloReply) []byte {
	w := newMessage(header{typ: h.typ, seq: h.seq})
	w.u32(hr.serverPID)
	w.u64(hr.sessionID)
	w.u64(hr.features)
	w.u32(uint32(len(hr.devices)))
	for _, d := range hr.devices {
		w.u64(uint64(d.Capacity))
		w.str(d.Backend)
		w.i32(int32(d.Node))
		w.u32(uint32(d.Workers))
	}
	return w.b
}

func encodeEmptyReply(h header) []byte { return newMessage(header{typ: h.typ, seq: h.seq}).b }

func encodeU64Reply(h header, vs ...uint64) []byte {
	w := newMessage(header{typ: h.typ, seq: h.seq})
	for _, v := range vs {
		w.u64(v)
	}
	return w.b
}

func encodeRangeAttrsReply(h header, a RangeAttributes) []byte {
	w := newMessage(header{typ: h.typ, seq: h.seq})
	w.boolean(a.ReadMostly)
	w.i32(int32(a.PreferredLocation))
	w.i32(int32(a.LastPrefetchLocation))
	w.u32(uint32(len(a.AccessedBy)))
	for _, d := range a.AccessedBy {
		w.i32(int32(d))
	}
	return w.b
}

func encodeStringReply(h header, s string) []byte {
	w := newMessage(header{typ: h.typ, seq: h.seq})
	w.u32(uint32(len(s)))
	w.b = append(w.b, s...)
	return w.b
}

// parseReply checks a reply against the request it answers and returns
// its payload, or the error the server sent.
func parseReply(b []byte, want header) (*wireReader, error) {
	h, payload, err := parseHeader(b)
	if err != nil {
		return nil, err
	}
	if h.typ != want.typ || h.seq != want.seq {
		return nil, fmt.Errorf("%w: reply %s #%d does not answer %s #%d", ErrInternal, h.typ, h.seq, want.typ, want.seq)
	}
	r := &wireReader{b: payload}
	if h.status != codeOK {
		msg := r.str("error message")
		if r.err != nil {
			msg = fmt.Sprintf("server error %d (unreadable message: %v)", h.status, r.err)
		}
		return nil, errorFromWire(h.status, msg)
	}
	return r, nil
}

func decodeHelloReply(r *wireReader) (helloReply, error) {
	hr := helloReply{serverPID: r.u32("server pid"), sessionID: r.u64("session"), features: r.u64("features")}
	n := r.u32("device count")
	if r.err == nil && n > maxDeviceList {
		return hr, fmt.Errorf("%w: %d devices exceeds %d", ErrInvalidValue, n, maxDeviceList)
	}
	for i := uint32(0); i < n && r.err == nil; i++ {
		capacity := r.u64("device capacity")
		if capacity > math.MaxInt64 {
			return hr, fmt.Errorf("%w: device %d capacity %d", ErrInvalidValue, i, capacity)
		}
		hr.devices = append(hr.devices, DeviceInfo{Device: Device(i), Capacity: int64(capacity), Backend: r.str("backend"), Node: int(r.i32("node")), Workers: int(r.u32("workers"))})
	}
	return hr, r.done("hello reply")
}

func decodeRangeAttrsReply(r *wireReader) (RangeAttributes, error) {
	a := RangeAttributes{ReadMostly: r.boolean("read-mostly"), PreferredLocation: Device(r.i32("preferred")), LastPrefetchLocation: Device(r.i32("last prefetch"))}
	n := r.u32("accessed-by count")
	if r.err == nil && n > maxDeviceList {
		return a, fmt.Errorf("%w: %d accessed-by devices exceeds %d", ErrInvalidValue, n, maxDeviceList)
	}
	a.AccessedBy = make([]Device, 0, n)
	for i := uint32(0); i < n && r.err == nil; i++ {
		a.AccessedBy = append(a.AccessedBy, Device(r.i32("accessed-by device")))
	}
	return a, r.done("range attributes reply")
}

func decodeStringReply(r *wireReader) (string, error) {
	n := r.u32("length")
	if r.err == nil && n > maxMessageSize {
		return "", fmt.Errorf("%w: string reply of %d bytes", ErrInvalidValue, n)
	}
	v := r.need(int(n), "string reply")
	return string(v), r.done("string reply")
}
