package wire

import (
	"bytes"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/softuvm/softuvm/internal/core"
)

// The golden fixtures pin every message's bytes: testdata/golden holds one
// .hex file per message form, its bytes in hex with each field named.
// TestGolden checks the Go encoders and decoders against them, and
// libuvm/tests/wire_golden_test.c the C library's, so that the two sides
// agree byte for byte without either one's encoder standing in for the
// other. A change of layout is a change of these files, made with
//
//	go test ./internal/wire -run TestGolden -update
var updateGolden = flag.Bool("update", false, "rewrite testdata/golden from the Go encoders")

const goldenDir = "testdata/golden"

// field is one field of a message as it lies on the wire.
type field struct {
	name string
	// v is the value: uint8, uint16, uint32, uint64 or int32 are fixed
	// size; a string or []byte is a uint32 length, then the bytes.
	v    any
	note string // what the value means, where the number does not say
}

// golden is one message form, with fixed field values.
type golden struct {
	name   string // testdata/golden/<name>.hex
	about  string // who sends it to whom, for what
	c      string // what libuvm does with it
	h      Header
	fields []field // the payload, in order
	// enc is the Go encoder's output for the same values; nil for a
	// message Go never sends.
	enc []byte
	// decode is the Go decoder, as the receiver runs it on the whole
	// message; nil for a message Go never reads. Its result must equal
	// want.
	decode func(b []byte) (any, error)
	want   any
}

// errorReply is what a decoded error reply says.
type errorReply struct {
	class error
	msg   string
}

// The addresses the fixtures use: blocks in the managed window.
const (
	goldenAddr  = 0x600000200000
	goldenAddr2 = 0x600000400000
)

func request(b []byte) (any, error) {
	_, req, err := ParseRequest(b)
	return req, err
}

// reply decodes a reply to h with dec (nil: an empty reply).
func reply(h Header, dec func(r *WireReader) (any, error)) func(b []byte) (any, error) {
	return func(b []byte) (any, error) {
		r, err := ParseReply(b, h)
		if err != nil {
			var re *remoteError
			if errors.As(err, &re) {
				return errorReply{class: re.class, msg: re.msg}, nil
			}
			return nil, err
		}
		if dec == nil {
			return struct{}{}, r.Done(h.Typ.String() + " reply")
		}
		return dec(r)
	}
}

// goldenError is an error whose message is exactly msg, of class.
func goldenError(class error, msg string) error { return &remoteError{class: class, msg: msg} }

func goldens() []golden {
	hdr := func(t MsgType, seq uint32) Header { return Header{Typ: t, Seq: seq} }
	empty := func(name, about, c string, h Header) golden {
		return golden{name: name, about: about, c: c, h: h, enc: EncodeEmptyReply(h), decode: reply(h, nil), want: struct{}{}}
	}
	const goOnly = "never: a Go client, monitor or daemon only"
	hello := HelloReply{ServerPID: 4244, SessionID: 9, Features: 0x1a2, Coherence: core.CoherenceFault, Devices: []core.DeviceInfo{
		{Device: 0, Capacity: 64 << 20, Backend: "memfd", Node: -1, Workers: 2},
		{Device: 1, Capacity: 128 << 20, Backend: "numa", Node: 0, Workers: 4},
	}}
	attrs := core.RangeAttributes{ReadMostly: true, PreferredLocation: 1, LastPrefetchLocation: core.InvalidDevice, AccessedBy: []core.Device{core.CPU, 1}}
	layout := Layout{Runs: []Mapping{{Addr: goldenAddr, Length: core.BlockSize, File: 1}, {Addr: goldenAddr2, Length: 2 * core.PageSize, File: core.CPU}}, MinorRemote: true, MinorOwn: true, More: 1}
	layoutMore := []Mapping{{Addr: goldenAddr2 + core.BlockSize, Length: core.PageSize, File: 0}}
	mapReq := DeviceMapRequest{Addr: goldenAddr2, Length: core.BlockSize, File: 1, Wp: core.PageMask{0x5, 0, 0, 0, 0, 0, 0, 1 << 63}}
	var wp []field
	for i, w := range mapReq.Wp {
		wp = append(wp, field{name: fmt.Sprintf("write-protect mask word %d", i), v: w, note: map[int]string{0: "pages 0 and 2", 7: "page 511"}[i]})
	}
	hints := []Mapping{{Addr: goldenAddr, Length: 2 * core.PageSize}, {Addr: goldenAddr2, Length: core.PageSize}}
	launch := LaunchRequest{Stream: 2, Nthreads: 64, Name: "c:0x401000", Params: []byte{1, 2, 3, 4, 5}, Cpu: 1}
	launchGrid := LaunchGridRequest{Stream: 2, Grid: core.Dim3{X: 40, Y: 3, Z: 1}, Block: core.Dim3{X: 16, Y: 8, Z: 2}, SharedBytes: 4096, StackBytes: 1 << 20,
		Flags: core.GridCooperative, Name: "c:0x401000", Params: []byte{1, 2, 3, 4, 5}, Cpu: -1}
	allocErr := goldenError(core.ErrMemoryAllocation, "device 1's arena is full: 12032 bytes wanted, 4096 free")
	mapErr := goldenError(core.ErrInvalidValue, "map device 3: this session has 2 devices")
	syncErr := goldenError(core.ErrLaunchFailure, "device 1: kernel c:0x401000 is not a C kernel (want c:0x<address>)")
	upErr := goldenError(core.ErrInitialization, "userfaultfd: Operation not permitted")
	report := DeviceReport{Lost: 3, Records: []DeviceRecord{
		{Kind: ReportLaunch, Stream: 2, Threads: 64, Start: 5_000_000_000, End: 5_000_250_000, Name: "c:0x401000"},
		{Kind: ReportSync, Stream: 2, Start: 5_000_300_000, End: 5_000_301_500},
	}}

	return []golden{
		{name: "hello-request", about: "a client (or a monitor) to the server, first: its role and pid; a client's carries its userfaultfd and host file",
			c: "session.c hello sends it (uvm__encode_hello)", h: hdr(MsgHello, 1),
			fields: []field{{"role", uint8(RoleClient), "client"}, {"pid", uint32(4242), ""}, {"features", uint64(0), "the server's default"},
				{"coherence", uint8(core.CoherenceLaunch), "the launch model (0: the server's)"}},
			enc: EncodeHello(1, HelloRequest{Role: RoleClient, Pid: 4242, Coherence: core.CoherenceLaunch}), decode: request, want: HelloRequest{Role: RoleClient, Pid: 4242, Coherence: core.CoherenceLaunch}},
		{name: "hello-reply", about: "the server to a client: its pid, the session, the userfaultfd features, the devices",
			c: "session.c hello reads it", h: hdr(MsgHello, 1),
			fields: []field{{"server pid", uint32(4244), ""}, {"session", uint64(9), ""}, {"features", uint64(0x1a2), ""}, {"device count", uint32(2), ""},
				{"device 0 capacity", uint64(64 << 20), "64 MiB"}, {"device 0 backend", "memfd", ""}, {"device 0 NUMA node", int32(-1), "none"}, {"device 0 workers", uint32(2), ""},
				{"device 1 capacity", uint64(128 << 20), "128 MiB"}, {"device 1 backend", "numa", ""}, {"device 1 NUMA node", int32(0), ""}, {"device 1 workers", uint32(4), ""},
				{"coherence", uint8(core.CoherenceFault), "the session's model: fault"}},
			enc: EncodeHelloReply(hdr(MsgHello, 1), hello), decode: reply(hdr(MsgHello, 1), func(r *WireReader) (any, error) { return DecodeHelloReply(r) }), want: hello},
		{name: "alloc-request", about: "a client to the server: manage a range it mapped from its host file",
			c: "session.c register_range sends it (uvm__encode_alloc), with the server's default prefetch tracking and policy", h: hdr(MsgAlloc, 2),
			fields: []field{{"address", uint64(goldenAddr), ""}, {"length", uint64(0x3000), ""}, {"size", uint64(12032), ""}, {"flags", uint32(core.AttachHost), "attach host"},
				{"track prefetch", uint8(0), "the server's default"}, {"prefetch policy", "", "the server's default"}, {"kind", uint8(core.KindDevice), "device memory"}, {"device", int32(1), ""}},
			enc:    EncodeAlloc(2, AllocRequest{Addr: goldenAddr, Length: 0x3000, Size: 12032, Flags: uint32(core.AttachHost), Kind: core.KindDevice, Device: 1}),
			decode: request, want: AllocRequest{Addr: goldenAddr, Length: 0x3000, Size: 12032, Flags: uint32(core.AttachHost), Kind: core.KindDevice, Device: 1}},
		{name: "alloc-reply", about: "the server to a client: the range's buffer id",
			c: "session.c register_range reads it", h: hdr(MsgAlloc, 2), fields: []field{{"buffer id", uint64(77), ""}},
			enc: EncodeU64Reply(hdr(MsgAlloc, 2), 77), decode: reply(hdr(MsgAlloc, 2), func(r *WireReader) (any, error) { return r.U64("buffer id"), r.Done("alloc reply") }), want: uint64(77)},
		{name: "alloc-error", about: "the server to a client, for any request it refuses: the error's class as the status, and its message",
			c: "session.c uvm__request reads it, as the status's error code with the message", h: Header{Typ: MsgAlloc, Seq: 2, Status: codeMemoryAllocation},
			fields: []field{{"message", allocErr.Error(), ""}},
			enc:    EncodeError(hdr(MsgAlloc, 2), allocErr), decode: reply(hdr(MsgAlloc, 2), nil), want: errorReply{core.ErrMemoryAllocation, allocErr.Error()}},
		{name: "free-request", about: "a client to the server: forget the range at an address",
			c: "session.c uvm__release sends it (uvm__encode_free)", h: hdr(MsgFree, 3), fields: []field{{"address", uint64(goldenAddr), ""}},
			enc: EncodeFree(3, goldenAddr), decode: request, want: RangeRequest{Addr: goldenAddr}},
		empty("free-reply", "the server to a client: freed", "uvm__request reads it", hdr(MsgFree, 3)),
		{name: "prefetch-request", about: "a client to the server: move a range to a processor",
			c: "memory.c uvmMemPrefetchAsync sends it (uvm__encode_prefetch)", h: hdr(MsgPrefetch, 4),
			fields: []field{{"address", uint64(goldenAddr), ""}, {"length", uint64(core.BlockSize), ""}, {"destination", int32(core.CPU), "the CPU"}},
			enc:    EncodePrefetch(4, PrefetchRequest{Addr: goldenAddr, Length: core.BlockSize, Dst: int32(core.CPU)}),
			decode: request, want: PrefetchRequest{Addr: goldenAddr, Length: core.BlockSize, Dst: int32(core.CPU)}},
		empty("prefetch-reply", "the server to a client: moved", "uvm__request reads it", hdr(MsgPrefetch, 4)),
		{name: "discard-request", about: "a client to the server: drop every copy of a range's pages, which then read as zeros",
			c: "memory.c uvmMemDiscard and the preload's heap purge send it (uvm__encode_discard)", h: hdr(MsgDiscard, 33),
			fields: []field{{"address", uint64(goldenAddr), ""}, {"length", uint64(core.BlockSize), ""}},
			enc:    EncodeDiscard(33, RangeRequest{Addr: goldenAddr, Length: core.BlockSize}), decode: request, want: RangeRequest{Addr: goldenAddr, Length: core.BlockSize}},
		empty("discard-reply", "the server to a client: discarded", "uvm__request reads it", hdr(MsgDiscard, 33)),
		{name: "range-attributes-request", about: "a client to the server: the attributes of a range",
			c: "memory.c uvmMemRangeGetAttribute sends it (uvm__encode_range_attrs)", h: hdr(MsgRangeAttrs, 5),
			fields: []field{{"address", uint64(goldenAddr), ""}, {"length", uint64(core.BlockSize), ""}},
			enc:    EncodeRangeAttrs(5, RangeRequest{Addr: goldenAddr, Length: core.BlockSize}), decode: request, want: RangeRequest{Addr: goldenAddr, Length: core.BlockSize}},
		{name: "range-attributes-reply", about: "the server to a client: read-mostly, preferred location, last prefetch location, accessed-by",
			c: "memory.c uvmMemRangeGetAttribute reads it", h: hdr(MsgRangeAttrs, 5),
			fields: []field{{"read mostly", uint8(1), "true"}, {"preferred location", int32(1), ""}, {"last prefetch location", int32(core.InvalidDevice), "invalid: the pages disagree"},
				{"accessed-by count", uint32(2), ""}, {"accessed by", int32(core.CPU), "the CPU"}, {"accessed by", int32(1), ""}},
			enc: EncodeRangeAttrsReply(hdr(MsgRangeAttrs, 5), attrs), decode: reply(hdr(MsgRangeAttrs, 5), func(r *WireReader) (any, error) { return DecodeRangeAttrsReply(r) }), want: attrs},
		{name: "stats-request", about: "a client or monitor (uvm stat) to the server: the statistics of a scope",
			c: goOnly, h: hdr(MsgStats, 6), fields: []field{{"scope", uint8(ScopeRange), "a range"}, {"address", uint64(goldenAddr), ""}},
			enc: encodeStats(6, StatsRequest{Scope: ScopeRange, Addr: goldenAddr}), decode: request, want: StatsRequest{Scope: ScopeRange, Addr: goldenAddr}},
		{name: "stats-reply", about: "the server to a client or monitor: the statistics, JSON",
			c: goOnly, h: hdr(MsgStats, 6), fields: []field{{"statistics", `{"faults":3}`, ""}},
			enc: EncodeStringReply(hdr(MsgStats, 6), `{"faults":3}`), decode: reply(hdr(MsgStats, 6), func(r *WireReader) (any, error) { return decodeStringReply(r) }), want: `{"faults":3}`},
		{name: "info-request", about: "a client or monitor (uvm info) to the server: its configuration",
			c: goOnly, h: hdr(MsgInfo, 7), enc: EncodeInfo(7), decode: request, want: struct{}{}},
		{name: "info-reply", about: "the server to a client or monitor: its configuration, JSON",
			c: goOnly, h: hdr(MsgInfo, 7), fields: []field{{"configuration", `{"pid":4244}`, ""}},
			enc: EncodeStringReply(hdr(MsgInfo, 7), `{"pid":4244}`), decode: reply(hdr(MsgInfo, 7), func(r *WireReader) (any, error) { return decodeStringReply(r) }), want: `{"pid":4244}`},
		{name: "device-connect-request", about: "a client to the server: a connection for a new process of a device",
			c: "device.c start_process sends it (uvm__encode_processor)", h: hdr(MsgDeviceConnect, 8), fields: []field{{"device", int32(1), ""}},
			enc: EncodeDeviceConnect(8, 1), decode: request, want: DeviceConnectRequest{Device: 1}},
		empty("device-connect-reply", "the server to a client: the connection, as the descriptor it carries", "device.c start_process reads it", hdr(MsgDeviceConnect, 8)),
		{name: "device-hello-request", about: "a device process to the server, first on the connection its client got: which device, its pid; it carries the process's userfaultfd",
			c: "devproc.c attach sends it (uvm__encode_device_hello)", h: hdr(MsgDeviceHello, 1), fields: []field{{"device", uint32(1), ""}, {"pid", uint32(4243), ""}},
			enc: EncodeDeviceHello(1, DeviceHelloRequest{Device: 1, Pid: 4243}), decode: request, want: DeviceHelloRequest{Device: 1, Pid: 4243}},
		{name: "device-hello-reply", about: "the server to a device process: the layout to map, later runs over earlier ones; it carries one file per processor, the CPU's first",
			c: "devproc.c attach reads it", h: hdr(MsgDeviceHello, 1),
			fields: []field{{"run count", uint32(2), ""}, {"run 0 address", uint64(goldenAddr), ""}, {"run 0 length", uint64(core.BlockSize), ""}, {"run 0 file", int32(1), "device 1's"},
				{"run 1 address", uint64(goldenAddr2), ""}, {"run 1 length", uint64(2 * core.PageSize), ""}, {"run 1 file", int32(core.CPU), "the CPU's"}, {"minor remote", uint8(1), "true"}, {"minor own", uint8(1), "true"},
				{"runs to follow", uint32(1), "in one device-layout message"}},
			enc: EncodeLayoutReply(hdr(MsgDeviceHello, 1), layout), decode: reply(hdr(MsgDeviceHello, 1), func(r *WireReader) (any, error) { return DecodeLayoutReply(r) }), want: layout},
		{name: "device-layout-request", about: "the server to a device process, right after the device hello's reply: more runs of its layout, when it has more than one message holds (no reply)",
			c: "devproc.c attach reads it", h: hdr(MsgDeviceLayout, 1),
			fields: []field{{"run count", uint32(1), ""}, {"run 0 address", uint64(goldenAddr2 + core.BlockSize), ""}, {"run 0 length", uint64(core.PageSize), ""}, {"run 0 file", int32(0), "device 0's"}},
			enc:    EncodeDeviceLayout(1, layoutMore), decode: request, want: DeviceLayoutRequest{Runs: layoutMore}},
		{name: "device-ready-request", about: "a device process to the server: its layout is mapped",
			c: "devproc.c attach sends it (uvm__msg_start)", h: hdr(MsgDeviceReady, 2), enc: NewMessage(hdr(MsgDeviceReady, 2)).B, decode: request, want: DeviceReadyRequest{}},
		empty("device-ready-reply", "the server to a device process: it is watched; kernels may run", "devproc.c attach reads it", hdr(MsgDeviceReady, 2)),
		{name: "device-map-request", about: "the server to a device process: map a processor's file over a range, some pages write-protected",
			c: "devproc.c serve_server reads it", h: hdr(MsgDeviceMap, 11),
			fields: append([]field{{"address", uint64(mapReq.Addr), ""}, {"length", mapReq.Length, ""}, {"file", int32(mapReq.File), "device 1's"}}, wp...),
			enc:    EncodeDeviceMap(11, mapReq), decode: request, want: mapReq},
		empty("device-map-reply", "a device process to the server: mapped", "devproc.c serve_server sends it (uvm__encode_reply)", hdr(MsgDeviceMap, 11)),
		{name: "device-map-error", about: "a device process to the server: a request it refuses, with why",
			c: "devproc.c serve_server sends it (uvm__encode_reply)", h: Header{Typ: MsgDeviceMap, Seq: 11, Status: codeInvalidValue}, fields: []field{{"message", mapErr.Error(), ""}},
			enc: EncodeError(hdr(MsgDeviceMap, 11), mapErr), decode: reply(hdr(MsgDeviceMap, 11), nil), want: errorReply{core.ErrInvalidValue, mapErr.Error()}},
		{name: "device-unmap-request", about: "the server to a device process: unmap a freed range",
			c: "devproc.c serve_server reads it", h: hdr(MsgDeviceUnmap, 12), fields: []field{{"address", uint64(goldenAddr), ""}, {"length", uint64(core.BlockSize), ""}},
			enc: EncodeDeviceUnmap(12, goldenAddr, core.BlockSize), decode: request, want: RangeRequest{Addr: goldenAddr, Length: core.BlockSize}},
		empty("device-unmap-reply", "a device process to the server: unmapped", "devproc.c serve_server sends it (uvm__encode_reply)", hdr(MsgDeviceUnmap, 12)),
		{name: "launch-request", about: "a client to a device process, on a stream's socket: run a kernel; no reply",
			c: "device.c uvmLaunchKernel sends it (uvm__encode_launch), devproc.c launch reads it", h: hdr(msgLaunch, 13),
			fields: []field{{"stream", uint32(2), ""}, {"threads", uint32(64), ""}, {"kernel name", launch.Name, "a C kernel's address"}, {"parameters", launch.Params, ""}, {"cpu", int32(1), "the launching thread's"}},
			enc:    EncodeLaunch(13, launch), decode: request, want: launch},
		{name: "launch-grid-request", about: "a client to a device process, on a stream's socket: run a kernel as a grid of blocks; no reply",
			c: "grid.c uvmLaunchGrid and uvmLaunchCooperativeKernel send it (uvm__encode_launch_grid), devproc.c launch_grid reads it (uvm__decode_launch_grid)", h: hdr(MsgLaunchGrid, 15),
			fields: []field{{"stream", uint32(2), ""}, {"grid x", uint32(40), ""}, {"grid y", uint32(3), ""}, {"grid z", uint32(1), ""},
				{"block x", uint32(16), ""}, {"block y", uint32(8), ""}, {"block z", uint32(2), ""}, {"shared memory", uint32(4096), "bytes per block"},
				{"stack size", uint32(1 << 20), "bytes per thread"}, {"flags", uint32(core.GridCooperative), "cooperative"},
				{"kernel name", launchGrid.Name, "a C kernel's address"}, {"parameters", launchGrid.Params, ""}, {"cpu", int32(-1), "unknown"}},
			enc: EncodeLaunchGrid(15, launchGrid), decode: request, want: launchGrid},
		{name: "trace-control-request", about: "a client to the server: start recording the session's events to a file (uvmProfilerStart; stop: operation 2, no path)",
			c: "profiler.c uvmProfilerStart and uvmProfilerStop send it (uvm__encode_trace_control)", h: hdr(MsgTraceControl, 34),
			fields: []field{{"operation", uint8(TraceStart), "start"}, {"path", "/tmp/prog.uvmtrace", ""}},
			enc:    EncodeTraceControl(34, TraceControlRequest{Op: TraceStart, Path: "/tmp/prog.uvmtrace"}), decode: request,
			want: TraceControlRequest{Op: TraceStart, Path: "/tmp/prog.uvmtrace"}},
		empty("trace-control-reply", "the server to a client: recording started or stopped", "uvm__request reads it", hdr(MsgTraceControl, 34)),
		{name: "launch-crash", about: "a device process to its client, on the control socket, as a kernel crashes: the launch's only reply",
			c: "devproc.c on_crash sends it (uvm__encode_crash), device.c died reads it (uvm__decode_crash); Go never does: a Go device recovers a kernel's fault and reports it at the next synchronize",
			h: Header{Typ: msgLaunch, Status: codeLaunchFailure},
			fields: []field{{"kernel", uint64(0x401000), ""}, {"stream", uint32(2), ""}, {"thread", uint32(17), ""}, {"threads", uint32(64), ""},
				{"signal", int32(11), "SIGSEGV"}, {"si_code", int32(1), "SEGV_MAPERR"}, {"address", uint64(0x10), ""},
				{"block", uint64(5), "a grid launch's, linear"}, {"grid x", uint32(8), ""}, {"grid y", uint32(1), ""}, {"grid z", uint32(1), ""},
				{"block x", uint32(64), "0 in all three for a launch of threads"}, {"block y", uint32(1), ""}, {"block z", uint32(1), ""}}},
		{name: "stream-attach-request", about: "a client to the server: attach a managed allocation to the host, every stream or one stream (cudaStreamAttachMemAsync)",
			c: "coherence.c uvmStreamAttachMemAsync sends it (uvm__encode_stream_attach)", h: hdr(MsgStreamAttach, 30),
			fields: []field{{"address", uint64(goldenAddr), ""}, {"attach flags", uint32(core.AttachSingle), "single"}, {"device", int32(1), ""}, {"stream", uint32(3), ""}},
			enc:    EncodeStreamAttach(30, StreamAttachRequest{Addr: goldenAddr, Mode: core.AttachSingle, Device: 1, Stream: 3}),
			decode: request, want: StreamAttachRequest{Addr: goldenAddr, Mode: core.AttachSingle, Device: 1, Stream: 3}},
		empty("stream-attach-reply", "the server to a client: attached", "coherence.c reads it", hdr(MsgStreamAttach, 30)),
		{name: "launch-begin-request", about: "a client to the server, under the launch coherence model: a kernel is about to start; hand it its memory",
			c: "coherence.c uvm__coherence_before_launch sends it (uvm__encode_launch_begin)", h: hdr(MsgLaunchBegin, 31),
			fields: []field{{"device", int32(1), ""}, {"stream", uint32(3), ""}, {"kernel", "c:0x401000", ""}},
			enc:    EncodeLaunchBegin(31, LaunchBeginRequest{Device: 1, Stream: 3, Kernel: "c:0x401000"}),
			decode: request, want: LaunchBeginRequest{Device: 1, Stream: 3, Kernel: "c:0x401000"}},
		empty("launch-begin-reply", "the server to a client: the memory is the device's until its streams finish", "coherence.c reads it", hdr(MsgLaunchBegin, 31)),
		{name: "streams-idle-request", about: "a client to the server, under the launch coherence model: a stream (or every stream) of a device finished",
			c: "coherence.c uvm__coherence_after_sync sends it (uvm__encode_streams_idle)", h: hdr(MsgStreamsIdle, 32),
			fields: []field{{"device", int32(1), ""}, {"stream", uint32(AllStreams), "every stream"}},
			enc:    EncodeStreamsIdle(32, StreamsIdleRequest{Device: 1, Stream: AllStreams}),
			decode: request, want: StreamsIdleRequest{Device: 1, Stream: AllStreams}},
		empty("streams-idle-reply", "the server to a client: the CPU may touch what those streams held", "coherence.c reads it", hdr(MsgStreamsIdle, 32)),
		{name: "sync-request", about: "a client to a device process, on a stream's socket: answer once the stream's kernels ran",
			c: "device.c sync_locked sends it (uvm__encode_stream), devproc.c serve_stream reads it", h: hdr(MsgSync, 14), fields: []field{{"stream", uint32(2), ""}},
			enc: EncodeStreamRequest(MsgSync, 14, 2), decode: request, want: StreamRequest{Stream: 2}},
		empty("sync-reply", "a device process to its client: the stream's kernels ran without error",
			"devproc.c serve_stream sends it (uvm__encode_reply), device.c sync_locked reads it", hdr(MsgSync, 14)),
		{name: "sync-error", about: "a device process to its client: the errors of the stream's kernels since the last synchronize",
			c: "devproc.c serve_stream sends it (uvm__encode_reply), device.c sync_locked reads it", h: Header{Typ: MsgSync, Seq: 14, Status: codeLaunchFailure},
			fields: []field{{"message", syncErr.Error(), ""}},
			enc:    EncodeError(hdr(MsgSync, 14), syncErr), decode: reply(hdr(MsgSync, 14), nil), want: errorReply{core.ErrLaunchFailure, syncErr.Error()}},
		{name: "stream-destroy-request", about: "a client to a device process, on a stream's socket: run what is queued, then end the stream; no reply",
			c: "device.c uvmStreamDestroy sends it (uvm__encode_stream), devproc.c serve_stream reads it", h: hdr(MsgStreamDestroy, 15), fields: []field{{"stream", uint32(2), ""}},
			enc: EncodeStreamRequest(MsgStreamDestroy, 15, 2), decode: request, want: StreamRequest{Stream: 2}},
		{name: "device-up", about: "a device process to its client, on the control socket: every range is mapped",
			c: "devproc.c uvm__device_main sends it (uvm__encode_reply), device.c start_process reads it", h: hdr(MsgDeviceUp, 0),
			enc: NewMessage(hdr(MsgDeviceUp, 0)).B, decode: reply(hdr(MsgDeviceUp, 0), nil), want: struct{}{}},
		{name: "device-up-error", about: "a device process to its client: why it could not come up",
			c: "devproc.c setup_fail sends it (uvm__encode_reply), device.c start_process reads it; a Go device process exits instead", h: Header{Typ: MsgDeviceUp, Status: codeInitialization},
			fields: []field{{"message", upErr.Error(), ""}},
			enc:    EncodeError(hdr(MsgDeviceUp, 0), upErr), decode: reply(hdr(MsgDeviceUp, 0), nil), want: errorReply{core.ErrInitialization, upErr.Error()}},
		{name: "advise-request", about: "a client to the server: advice about a range",
			c: "memory.c uvmMemAdvise sends it (uvm__encode_advise)", h: hdr(MsgAdvise, 17),
			fields: []field{{"address", uint64(goldenAddr), ""}, {"length", uint64(core.BlockSize), ""}, {"advice", uint8(core.AdviseSetAccessedBy), "set accessed-by"}, {"device", int32(1), ""}},
			enc:    EncodeAdvise(17, AdviseRequest{Addr: goldenAddr, Length: core.BlockSize, Advice: uint8(core.AdviseSetAccessedBy), Device: 1}),
			decode: request, want: AdviseRequest{Addr: goldenAddr, Length: core.BlockSize, Advice: uint8(core.AdviseSetAccessedBy), Device: 1}},
		empty("advise-reply", "the server to a client: advice taken", "uvm__request reads it", hdr(MsgAdvise, 17)),
		{name: "device-copy-request", about: "a client to the server: it wrote device memory through its mapping of the device's file",
			c: "memory.c device_written sends it (uvm__encode_device_written)", h: hdr(MsgDeviceCopy, 18),
			fields: []field{{"operation", uint8(DeviceWritten), "device memory written"}, {"destination", uint64(goldenAddr), ""}, {"source", uint64(0), "none"}, {"length", uint64(100), ""}, {"value", uint8(0), "none"}},
			enc:    EncodeDeviceCopy(18, DeviceCopyRequest{Op: DeviceWritten, Dst: goldenAddr, Length: 100}),
			decode: request, want: DeviceCopyRequest{Op: DeviceWritten, Dst: goldenAddr, Length: 100}},
		empty("device-copy-reply", "the server to a client: the pages are recorded as populated", "uvm__request reads it", hdr(MsgDeviceCopy, 18)),
		{name: "stream-open-request", about: "a client to a device process, on the control socket: serve a stream on the socket it carries; no reply",
			c: "device.c stream_fd sends it (uvm__encode_stream), devproc.c serve_control reads it", h: hdr(MsgStreamOpen, 19), fields: []field{{"stream", uint32(3), ""}},
			enc: EncodeStreamRequest(MsgStreamOpen, 19, 3), decode: request, want: StreamRequest{Stream: 3}},
		{name: "device-file-request", about: "a client to the server: the session's file of a device, for copies",
			c: "memory.c device_file sends it (uvm__encode_processor)", h: hdr(MsgDeviceFile, 20), fields: []field{{"device", int32(1), ""}},
			enc: EncodeDeviceFile(20, 1), decode: request, want: DeviceConnectRequest{Device: 1}},
		{name: "device-file-reply", about: "the server to a client: the copy parameters; it carries the device's file",
			c: "memory.c device_file reads it", h: hdr(MsgDeviceFile, 20),
			fields: []field{{"copy producers", uint64(2), ""}, {"non-temporal above", uint64(1 << 20), "1 MiB"}, {"direct below", uint64(64 << 10), "64 KiB"}},
			enc:    EncodeU64Reply(hdr(MsgDeviceFile, 20), 2, 1<<20, 64<<10),
			decode: reply(hdr(MsgDeviceFile, 20), func(r *WireReader) (any, error) {
				v := [3]uint64{r.U64("copy producers"), r.U64("non-temporal size"), r.U64("direct-path size")}
				return v, r.Done("device file reply")
			}), want: [3]uint64{2, 1 << 20, 64 << 10}},
		{name: "device-hints-request", about: "the server to a device process: drop its mappings of these runs, so that its next access is a fault the access counters see",
			c: "devproc.c drop_mappings reads it", h: hdr(MsgDeviceHints, 21),
			fields: []field{{"run count", uint32(2), ""}, {"run 0 address", uint64(goldenAddr), ""}, {"run 0 length", uint64(2 * core.PageSize), ""},
				{"run 1 address", uint64(goldenAddr2), ""}, {"run 1 length", uint64(core.PageSize), ""}},
			enc: EncodeDeviceHints(21, hints), decode: request, want: HintsRequest{Runs: hints}},
		empty("device-hints-reply", "a device process to the server: dropped", "devproc.c serve_server sends it (uvm__encode_reply)", hdr(MsgDeviceHints, 21)),
		{name: "restarted", about: "a new server to each client it took over, unsolicited: its pid, and how many servers died before it",
			c: "session.c uvm__request reads it, and sends its pending request again", h: hdr(msgRestarted, 0),
			fields: []field{{"server pid", uint32(4245), ""}, {"restarts", uint32(2), ""}},
			enc:    EncodeRestarted(4245, 2),
			decode: func(b []byte) (any, error) {
				_, payload, err := ParseHeader(b)
				if err != nil {
					return nil, err
				}
				pid, restarts, err := decodeRestarted(&WireReader{B: payload})
				return [2]uint32{pid, restarts}, err
			}, want: [2]uint32{4245, 2}},
		{name: "replace-request", about: "a new daemon to the running one: retire, and let me take over; it carries the new daemon's guard link",
			c: goOnly, h: hdr(MsgReplace, 23), enc: NewMessage(hdr(MsgReplace, 23)).B, decode: request, want: struct{}{}},
		empty("replace-reply", "the running daemon to the new one: retired", goOnly, hdr(MsgReplace, 23)),
		{name: "device-trace", about: "the server to a device process of a traced session, unsolicited and first on its connection (before the device hello's reply): report launches and synchronizations; it carries the report socket",
			c: "devproc.c attach reads it", h: hdr(MsgDeviceTrace, 0), fields: []field{{"flags", uint32(TraceLaunches), "launches and synchronizations"}},
			enc: EncodeDeviceTrace(DeviceTraceNotice{Flags: TraceLaunches}), decode: request, want: DeviceTraceNotice{Flags: TraceLaunches}},
		{name: "device-report", about: "a device process to the server, on the report socket: the kernels it ran and the synchronizations it answered since its last report (CLOCK_MONOTONIC nanoseconds); no reply",
			c: "devproc.c report_flush sends it (uvm__report_add, uvm__report_message)", h: hdr(MsgDeviceReport, 0),
			fields: []field{{"lost records", uint32(3), "dropped since the last report: the socket was full"}, {"record count", uint32(2), ""},
				{"record 0 kind", uint8(ReportLaunch), "a launch"}, {"record 0 stream", uint32(2), ""}, {"record 0 threads", uint32(64), ""},
				{"record 0 start", uint64(5_000_000_000), ""}, {"record 0 end", uint64(5_000_250_000), ""}, {"record 0 kernel", "c:0x401000", ""},
				{"record 1 kind", uint8(ReportSync), "a synchronization"}, {"record 1 stream", uint32(2), ""}, {"record 1 threads", uint32(0), "none"},
				{"record 1 start", uint64(5_000_300_000), ""}, {"record 1 end", uint64(5_000_301_500), ""}, {"record 1 kernel", "", "none"}},
			enc: EncodeDeviceReport(report), decode: request, want: report},
		{name: "peer-access-request", about: "a client to the server: enable or disable a device's access to a peer's device memory (cudaDeviceEnablePeerAccess, cudaDeviceDisablePeerAccess)",
			c: "props.c peer_access sends it (uvm__encode_peer_access)", h: hdr(MsgPeerAccess, 33),
			fields: []field{{"device", int32(1), "the device that gains access"}, {"peer", int32(0), "the device whose memory it reaches"}, {"enable", uint8(1), "enable"}, {"flags", uint32(0), ""}},
			enc:    EncodePeerAccess(33, PeerAccessRequest{Device: 1, Peer: 0, Enable: true}),
			decode: request, want: PeerAccessRequest{Device: 1, Peer: 0, Enable: true}},
		{name: "peer-access-reply", about: "the server to a client: whether the access was enabled before the request",
			c: "props.c peer_access reads it", h: hdr(MsgPeerAccess, 33), fields: []field{{"was enabled", uint8(0), "false"}},
			enc:    EncodePeerAccessReply(hdr(MsgPeerAccess, 33), PeerAccessReply{}),
			decode: reply(hdr(MsgPeerAccess, 33), func(r *WireReader) (any, error) { return DecodePeerAccessReply(r) }), want: PeerAccessReply{}},
	}
}

// bytes is the field as it lies on the wire.
func (f field) bytes() []byte {
	le := binary.LittleEndian
	switch v := f.v.(type) {
	case uint8:
		return []byte{v}
	case uint16:
		return le.AppendUint16(nil, v)
	case uint32:
		return le.AppendUint32(nil, v)
	case int32:
		return le.AppendUint32(nil, uint32(v))
	case uint64:
		return le.AppendUint64(nil, v)
	case string:
		return append(le.AppendUint32(nil, uint32(len(v))), v...)
	case []byte:
		return append(le.AppendUint32(nil, uint32(len(v))), v...)
	}
	panic(fmt.Sprintf("field %s: a %T", f.name, f.v))
}

// headerFields is h as fields, with the magic and version.
func headerFields(h Header) []field {
	status := "ok"
	if h.Status != CodeOK {
		status = codeErrors[h.Status].Error()
	}
	return []field{{"magic", uint32(wireMagic), `"SUVM"`}, {"version", uint16(wireVersion), ""}, {"type", uint16(h.Typ), h.Typ.String()},
		{"sequence", h.Seq, ""}, {"status", uint32(h.Status), status}}
}

// layout is g's bytes as its fields lay them out, and which field each
// byte belongs to.
func (g golden) layout() ([]byte, []string) {
	var b []byte
	var owner []string
	for _, f := range append(headerFields(g.h), g.fields...) {
		fb := f.bytes()
		b = append(b, fb...)
		for range fb {
			owner = append(owner, f.name)
		}
	}
	return b, owner
}

// text is g's fixture: a comment saying what the message is, then one
// line per field (strings over several), its bytes in hex and what they
// hold.
func (g golden) text() string {
	var s strings.Builder
	fmt.Fprintf(&s, "# %s: %s.\n# libuvm: %s.\n", g.name, g.about, g.c)
	s.WriteString("# Written by TestGolden (go test ./internal/wire -run TestGolden -update): one field a line, its bytes in hex, then what it holds.\n")
	line := func(b []byte, comment string) {
		h := make([]string, len(b))
		for i, x := range b {
			h[i] = fmt.Sprintf("%02x", x)
		}
		fmt.Fprintf(&s, "%-24s# %s\n", strings.Join(h, " "), comment)
	}
	for _, f := range append(headerFields(g.h), g.fields...) {
		b := f.bytes()
		note := ""
		if f.note != "" {
			note = " (" + f.note + ")"
		}
		switch v := f.v.(type) {
		case uint32, uint64:
			u := asUint64(v)
			what := strconv.FormatUint(u, 10)
			if u >= 1<<16 {
				what = fmt.Sprintf("%#x", u)
			}
			line(b, f.name+": "+what+note)
		case string, []byte:
			line(b[:4], fmt.Sprintf("%s: length %d%s", f.name, len(b)-4, note))
			for i := 4; i < len(b); i += 8 {
				comment := "..."
				if i == 4 {
					comment = fmt.Sprintf("%s: %q", f.name, f.v)
					if bs, ok := f.v.([]byte); ok {
						comment = fmt.Sprintf("%s: % x", f.name, bs)
					}
				}
				line(b[i:min(i+8, len(b))], comment)
			}
		default:
			line(b, fmt.Sprintf("%s: %v%s", f.name, v, note))
		}
	}
	return s.String()
}

func asUint64(v any) uint64 {
	if u, ok := v.(uint32); ok {
		return uint64(u)
	}
	return v.(uint64)
}

// parseHex reads a fixture: hex bytes, with comments from # to the end of
// the line.
func parseHex(text string) ([]byte, error) {
	var b []byte
	for n, l := range strings.Split(text, "\n") {
		if i := strings.IndexByte(l, '#'); i >= 0 {
			l = l[:i]
		}
		for _, tok := range strings.Fields(l) {
			v, err := strconv.ParseUint(tok, 16, 8)
			if err != nil || len(tok) != 2 {
				return nil, fmt.Errorf("line %d: %q is not a byte in two hex digits", n+1, tok)
			}
			b = append(b, byte(v))
		}
	}
	return b, nil
}

// TestGolden: each message form's fixture holds the bytes its fields lay
// out, the Go encoder writes exactly those, and the Go decoder reads back
// every field.
func TestGolden(t *testing.T) {
	gs := goldens()
	names := map[string]bool{}
	for _, g := range gs {
		t.Run(g.name, func(t *testing.T) {
			require.False(t, names[g.name], "two fixtures named %s", g.name)
			names[g.name] = true
			want, owner := g.layout()
			path := filepath.Join(goldenDir, g.name+".hex")
			if *updateGolden {
				require.NoError(t, os.MkdirAll(goldenDir, 0o755))
				require.NoError(t, os.WriteFile(path, []byte(g.text()), 0o644))
			}
			text, err := os.ReadFile(path)
			require.NoError(t, err, "run go test ./internal/wire -run TestGolden -update")
			got, err := parseHex(string(text))
			require.NoError(t, err, path)
			if g.enc != nil {
				if i, ok := firstDifference(g.enc, want); ok {
					t.Errorf("the Go encoder of %s writes %s, the fields lay out %s", g.name, describeAt(g.enc, i, owner), describeAt(want, i, owner))
				}
			}
			if i, ok := firstDifference(got, want); ok {
				t.Fatalf("%s holds %s, the fields lay out %s: if the layout changed on purpose, run with -update and review the diff", path, describeAt(got, i, owner), describeAt(want, i, owner))
			}
			assert.Equal(t, g.text(), string(text), "%s: the fixture's comments are not what its fields give: run with -update", path)
			h, _, err := ParseHeader(got)
			require.NoError(t, err)
			assert.Equal(t, g.h, h, "%s: header", path)
			if g.decode != nil {
				v, err := g.decode(got)
				require.NoError(t, err, "%s: decode", path)
				assert.Equal(t, g.want, v, "%s: decoded", path)
			}
		})
	}

	// Every message type has a fixture, and every fixture a message.
	types := map[MsgType]bool{}
	for _, g := range gs {
		types[g.h.Typ] = true
	}
	for typ := MsgHello; typ < msgTypeEnd; typ++ {
		assert.True(t, types[typ], "no golden fixture of a %s message", typ)
	}
	files, err := filepath.Glob(filepath.Join(goldenDir, "*"))
	require.NoError(t, err)
	for _, f := range files {
		assert.True(t, names[strings.TrimSuffix(filepath.Base(f), ".hex")], "%s is no message form of goldens(): remove it", f)
	}
}

// firstDifference returns the first offset where a and b differ.
func firstDifference(a, b []byte) (int, bool) {
	if bytes.Equal(a, b) {
		return 0, false
	}
	i := 0
	for i < len(a) && i < len(b) && a[i] == b[i] {
		i++
	}
	return i, true
}

// describeAt says what b holds at offset i, and in which field.
func describeAt(b []byte, i int, owner []string) string {
	what := "the end of the message"
	if i < len(b) {
		what = fmt.Sprintf("0x%02x", b[i])
	}
	in := "past the last field"
	if i < len(owner) {
		in = "field " + owner[i]
	}
	return fmt.Sprintf("%s at byte %d (%s; %d bytes in all)", what, i, in, len(b))
}
