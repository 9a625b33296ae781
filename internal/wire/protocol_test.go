package wire

import (
	"encoding/binary"
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/softuvm/softuvm/internal/core"
)

func TestRequestRoundTrips(t *testing.T) {
	const a, n = 0x7f0000000000, 1 << 21
	for _, tc := range []struct {
		b    []byte
		typ  MsgType
		want any
	}{
		{EncodeHello(1, HelloRequest{Role: RoleClient, Pid: 42, features: 7}), MsgHello, HelloRequest{Role: RoleClient, Pid: 42, features: 7}},
		{EncodeAlloc(2, AllocRequest{Addr: a, Length: n, Size: n - 100, Flags: uint32(core.AttachGlobal), TrackPrefetch: true, Prefetch: "window:4"}), MsgAlloc,
			AllocRequest{Addr: a, Length: n, Size: n - 100, Flags: uint32(core.AttachGlobal), TrackPrefetch: true, Prefetch: "window:4"}},
		{EncodeFree(3, a), MsgFree, RangeRequest{Addr: a}},
		{EncodePrefetch(4, PrefetchRequest{Addr: a, Length: n, Dst: -1}), MsgPrefetch, PrefetchRequest{Addr: a, Length: n, Dst: -1}},
		{EncodeRangeAttrs(5, RangeRequest{Addr: a, Length: n}), MsgRangeAttrs, RangeRequest{Addr: a, Length: n}},
		{encodeStats(6, StatsRequest{Scope: ScopeRange, Addr: a}), MsgStats, StatsRequest{Scope: ScopeRange, Addr: a}},
		{EncodeInfo(7), MsgInfo, struct{}{}},
	} {
		h, req, err := ParseRequest(tc.b)
		require.NoError(t, err, tc.typ)
		assert.Equal(t, tc.typ, h.Typ)
		assert.Equal(t, tc.want, req)
	}
}

func TestRequestErrorsNameTheValue(t *testing.T) {
	hello := EncodeHello(1, HelloRequest{Role: RoleClient})
	badMagic := append([]byte(nil), hello...)
	binary.LittleEndian.PutUint32(badMagic, 0xdeadbeef)
	badVersion := append([]byte(nil), hello...)
	binary.LittleEndian.PutUint16(badVersion[4:], 9)
	badType := append([]byte(nil), hello...)
	binary.LittleEndian.PutUint16(badType[6:], 99)
	for _, tc := range []struct {
		name string
		b    []byte
		want string
	}{
		{"short", hello[:5], "shorter than the 16-byte header"},
		{"magic", badMagic, "bad magic 0xdeadbeef"},
		{"version", badVersion, "protocol version 9"},
		{"type", badType, "unknown request type 99"},
		{"role", EncodeHello(1, HelloRequest{Role: 7}), "hello role 7"},
		{"truncated", EncodeAlloc(1, AllocRequest{Addr: 1 << 30, Length: 4096, Size: 1})[:30], "message truncated"},
		{"trailing", append(EncodeFree(1, 1<<30), 0), "1 unexpected trailing bytes"},
		{"unaligned", EncodePrefetch(1, PrefetchRequest{Addr: 0x1001, Length: 4096}), "not page-aligned"},
		{"empty", EncodeRangeAttrs(1, RangeRequest{Addr: 0x1000}), "is empty"},
		{"kernel half", EncodePrefetch(1, PrefetchRequest{Addr: 1 << 47, Length: 4096}), "outside the user address space"},
		{"size", EncodeAlloc(1, AllocRequest{Addr: 1 << 30, Length: 4096, Size: 8192}), "alloc size 8192 does not fit"},
		{"scope", encodeStats(1, StatsRequest{Scope: 9}), "stats scope 9"},
	} {
		_, _, err := ParseRequest(tc.b)
		require.Error(t, err, tc.name)
		assert.ErrorIs(t, err, core.ErrInvalidValue, tc.name)
		assert.Contains(t, err.Error(), tc.want, tc.name)
	}
}

func TestReplies(t *testing.T) {
	h := Header{Typ: MsgRangeAttrs, Seq: 9}
	a := core.RangeAttributes{ReadMostly: true, PreferredLocation: 1, AccessedBy: []core.Device{0, core.CPU}, LastPrefetchLocation: core.InvalidDevice}
	r, err := ParseReply(EncodeRangeAttrsReply(h, a), h)
	require.NoError(t, err)
	got, err := DecodeRangeAttrsReply(r)
	require.NoError(t, err)
	assert.Equal(t, a, got)

	hh := Header{Typ: MsgHello, Seq: 1}
	devs := []core.DeviceInfo{{Device: 0, Capacity: 1 << 30, Backend: "memfd", Node: -1}}
	r, err = ParseReply(EncodeHelloReply(hh, HelloReply{ServerPID: 5, SessionID: 6, Features: 7, Devices: devs}), hh)
	require.NoError(t, err)
	hr, err := DecodeHelloReply(r)
	require.NoError(t, err)
	assert.Equal(t, HelloReply{ServerPID: 5, SessionID: 6, Features: 7, Devices: devs}, hr)

	_, err = ParseReply(EncodeError(h, core.ErrInvalidDevice), h)
	assert.ErrorIs(t, err, core.ErrInvalidDevice, "the error class survives the wire")
	_, err = ParseReply(EncodeEmptyReply(Header{Typ: MsgFree, Seq: 3}), h)
	assert.ErrorIs(t, err, core.ErrInternal, "a reply to another request is refused")
}

// FuzzParseRequest: whatever a client sends, the decoder returns a request
// or an error, never panics, and an accepted request re-encodes to itself.
func FuzzParseRequest(f *testing.F) {
	for _, b := range [][]byte{
		EncodeHello(1, HelloRequest{Role: RoleClient, Pid: 1}),
		EncodeAlloc(2, AllocRequest{Addr: 1 << 30, Length: 8192, Size: 5000, Prefetch: "none"}),
		EncodeFree(3, 1<<30),
		EncodePrefetch(4, PrefetchRequest{Addr: 1 << 30, Length: 4096, Dst: 0}),
		EncodeRangeAttrs(5, RangeRequest{Addr: 1 << 30, Length: 4096}),
		EncodeDiscard(6, RangeRequest{Addr: 1 << 30, Length: 8192}),
		encodeStats(6, StatsRequest{Scope: 1}),
		EncodeInfo(7),
		EncodeDeviceConnect(8, 1),
		EncodeDeviceHello(9, DeviceHelloRequest{Device: 1, Pid: 42}),
		EncodeLaunch(10, LaunchRequest{Stream: 2, Nthreads: 8, Name: "k", Params: []byte{1, 2}}),
		EncodeStreamRequest(MsgSync, 11, AllStreams),
		EncodeStreamRequest(MsgStreamOpen, 12, 3),
		EncodeAdvise(13, AdviseRequest{Addr: 1 << 30, Length: 4096, Advice: uint8(core.AdviseSetAccessedBy), Device: 1}),
		EncodeDeviceCopy(14, DeviceCopyRequest{Op: DeviceWritten, Dst: 1 << 30, Length: 100}),
		EncodeDeviceFile(18, 0),
		EncodeDeviceMap(15, DeviceMapRequest{Addr: 1 << 30, Length: 8192, File: 1, Wp: core.PageMask{3}}),
		EncodeDeviceUnmap(16, 1<<30, 8192),
		EncodeAlloc(17, AllocRequest{Addr: 1 << 30, Length: 4096, Size: 4096, Kind: core.KindDevice, Device: 1}),
		EncodeDeviceHints(19, []Mapping{{Addr: 1 << 30, Length: 8192}}),
		NewMessage(Header{Typ: MsgReplace, Seq: 20}).B,
		retried(EncodeFree(21, 1<<30)),
		EncodePeerAccess(22, PeerAccessRequest{Device: 1, Peer: 0, Enable: true}),
		EncodeStreamAttach(23, StreamAttachRequest{Addr: 1 << 30, Mode: core.AttachSingle, Device: 1, Stream: 2}),
		EncodeLaunchBegin(24, LaunchBeginRequest{Device: 0, Stream: 3, Kernel: "k"}),
		EncodeStreamsIdle(25, StreamsIdleRequest{Device: 1, Stream: AllStreams}),
		EncodeDeviceTrace(DeviceTraceNotice{Flags: TraceLaunches}),
		EncodeDeviceReport(DeviceReport{Lost: 1, Records: []DeviceRecord{{Kind: ReportLaunch, Stream: 1, Threads: 4, Start: 10, End: 20, Name: "k"}, {Kind: ReportSync, Stream: 1, Start: 30, End: 30}}}),
	} {
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		h, req, err := ParseRequest(b)
		if err != nil {
			return
		}
		var again []byte
		switch r := req.(type) {
		case HelloRequest:
			again = EncodeHello(h.Seq, r)
		case AllocRequest:
			again = EncodeAlloc(h.Seq, r)
		case PrefetchRequest:
			again = EncodePrefetch(h.Seq, r)
		case StatsRequest:
			again = encodeStats(h.Seq, r)
		case RangeRequest:
			switch h.Typ {
			case MsgFree:
				again = EncodeFree(h.Seq, r.Addr)
			case MsgRangeAttrs:
				again = EncodeRangeAttrs(h.Seq, r)
			case MsgDiscard:
				again = EncodeDiscard(h.Seq, r)
			default: // device unmap
				again = EncodeDeviceUnmap(h.Seq, r.Addr, r.Length)
			}
		case AdviseRequest:
			again = EncodeAdvise(h.Seq, r)
		case DeviceCopyRequest:
			again = EncodeDeviceCopy(h.Seq, r)
		case DeviceMapRequest:
			again = EncodeDeviceMap(h.Seq, r)
		case struct{}:
			again = NewMessage(Header{Typ: h.Typ, Seq: h.Seq}).B // info, replace
		case DeviceConnectRequest:
			if h.Typ == MsgDeviceFile {
				again = EncodeDeviceFile(h.Seq, core.Device(r.Device))
			} else {
				again = EncodeDeviceConnect(h.Seq, core.Device(r.Device))
			}
		case DeviceHelloRequest:
			again = EncodeDeviceHello(h.Seq, r)
		case DeviceReadyRequest:
			again = NewMessage(h).B
		case LaunchRequest:
			again = EncodeLaunch(h.Seq, r)
		case HintsRequest:
			again = EncodeDeviceHints(h.Seq, r.Runs)
		case StreamRequest:
			again = EncodeStreamRequest(h.Typ, h.Seq, r.Stream)
		case PeerAccessRequest:
			again = EncodePeerAccess(h.Seq, r)
		case StreamAttachRequest:
			again = EncodeStreamAttach(h.Seq, r)
		case LaunchBeginRequest:
			again = EncodeLaunchBegin(h.Seq, r)
		case StreamsIdleRequest:
			again = EncodeStreamsIdle(h.Seq, r)
		case DeviceTraceNotice:
			again = EncodeDeviceTrace(r)
			binary.LittleEndian.PutUint32(again[8:], h.Seq) // a notice is sent with sequence 0, any decodes
		case DeviceReport:
			again = EncodeDeviceReport(r)
			binary.LittleEndian.PutUint32(again[8:], h.Seq)
		default:
			t.Fatalf("unexpected request %T", req)
		}
		if h.Status == RequestRetried {
			again = retried(again)
		}
		if string(again) != string(b) {
			t.Fatalf("%s request re-encodes differently:\n% x\n% x", h.Typ, b, again)
		}
	})
}

// retried marks a request as sent again after a restart.
func retried(b []byte) []byte {
	b = append([]byte(nil), b...)
	binary.LittleEndian.PutUint32(b[12:], uint32(RequestRetried))
	return b
}

// FuzzParseReply decodes replies as a client (and a server reading a
// device's replies) does: whatever the bytes, every decoder returns a
// value or an error, never a panic, and a reply that decodes re-encodes
// to the same bytes.
func FuzzParseReply(f *testing.F) {
	h := Header{Typ: MsgHello, Seq: 3}
	for _, b := range [][]byte{
		EncodeHelloReply(h, HelloReply{ServerPID: 7, SessionID: 9, Features: 0x55, Devices: []core.DeviceInfo{{Device: 0, Capacity: 1 << 30, Backend: "memfd", Node: -1, Workers: 2}}}),
		EncodeRangeAttrsReply(Header{Typ: MsgRangeAttrs, Seq: 4}, core.RangeAttributes{ReadMostly: true, PreferredLocation: 1, LastPrefetchLocation: core.CPU, AccessedBy: []core.Device{0, 1}}),
		EncodeStringReply(Header{Typ: MsgInfo, Seq: 5}, `{"pid":1}`),
		EncodeLayoutReply(Header{Typ: MsgDeviceHello, Seq: 1}, Layout{Runs: []Mapping{{Addr: 1 << 30, Length: 8192, File: 0}}, MinorRemote: true, MinorOwn: true}),
		EncodeU64Reply(Header{Typ: MsgAlloc, Seq: 6}, 42),
		EncodeError(Header{Typ: MsgFree, Seq: 8}, fmt.Errorf("%w: free 0x1: not managed", core.ErrInvalidValue)),
		EncodeRestarted(1234, 2),
		EncodeEmptyReply(Header{Typ: MsgDeviceMap, Seq: 9}),
	} {
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		rh, _, err := ParseHeader(b)
		if err != nil {
			return
		}
		r, err := ParseReply(b, Header{Typ: rh.Typ, Seq: rh.Seq})
		if err != nil {
			return
		}
		payload := append([]byte(nil), r.B...)
		check := func(name string, again []byte, err error) {
			if err == nil && string(again[wireHeaderSize:]) != string(payload) {
				t.Fatalf("%s re-encodes differently:\n% x\n% x", name, payload, again[wireHeaderSize:])
			}
		}
		hr, err := DecodeHelloReply(&WireReader{B: payload})
		check("hello reply", EncodeHelloReply(rh, hr), err)
		ra, err := DecodeRangeAttrsReply(&WireReader{B: payload})
		check("range attributes", EncodeRangeAttrsReply(rh, ra), err)
		str, err := decodeStringReply(&WireReader{B: payload})
		check("string", EncodeStringReply(rh, str), err)
		lay, err := DecodeLayoutReply(&WireReader{B: payload})
		check("layout", EncodeLayoutReply(rh, lay), err)
		pid, n, err := decodeRestarted(&WireReader{B: payload})
		check("restarted", EncodeRestarted(pid, n), err)
	})
}

// TestDeviceReport: a batch built a record at a time decodes to its
// records, a long kernel name cut to MaxReportName bytes on a rune
// boundary; Reset reuses the buffer; bad records are refused, naming the
// value.
func TestDeviceReport(t *testing.T) {
	long := strings.Repeat("é", MaxReportName) // two bytes a rune
	var b ReportBatch
	recs := []DeviceRecord{
		{Kind: ReportLaunch, Stream: 3, Threads: 7, Start: 100, End: 250, Name: "k"},
		{Kind: ReportLaunch, Stream: 0, Threads: 1, Start: 300, End: 300, Name: long},
		{Kind: ReportSync, Stream: 3, Start: 400, End: 410},
	}
	for _, r := range recs {
		b.Add(r)
	}
	require.Equal(t, 3, b.Len())
	h, req, err := ParseRequest(b.Message(5))
	require.NoError(t, err)
	assert.Equal(t, MsgDeviceReport, h.Typ)
	want := append([]DeviceRecord(nil), recs...)
	want[1].Name = long[:MaxReportName]
	assert.Equal(t, DeviceReport{Lost: 5, Records: want}, req)
	odd := strings.Repeat("a", MaxReportName-1) + "é" // the rune straddles the limit
	b.Reset()
	b.Add(DeviceRecord{Kind: ReportLaunch, Threads: 1, Name: odd})
	_, req, err = ParseRequest(b.Message(0))
	require.NoError(t, err)
	assert.Equal(t, odd[:MaxReportName-1], req.(DeviceReport).Records[0].Name)
	assert.Equal(t, EncodeDeviceReport(DeviceReport{Records: []DeviceRecord{{Kind: ReportLaunch, Threads: 1, Name: odd[:MaxReportName-1]}}}), b.Message(0))

	var full ReportBatch
	for range MaxReportRecords + 1 {
		full.Add(DeviceRecord{Kind: ReportSync})
	}
	for _, tc := range []struct {
		name string
		b    []byte
		want string
	}{
		{"kind", EncodeDeviceReport(DeviceReport{Records: []DeviceRecord{{Kind: 9}}}), "of kind 9"},
		{"backwards", EncodeDeviceReport(DeviceReport{Records: []DeviceRecord{{Kind: ReportSync, Start: 2, End: 1}}}), "ends at 1, before its start 2"},
		{"threads", EncodeDeviceReport(DeviceReport{Records: []DeviceRecord{{Kind: ReportLaunch, Name: "k"}}}), "a launch of 0 threads"},
		{"sync name", EncodeDeviceReport(DeviceReport{Records: []DeviceRecord{{Kind: ReportSync, Name: "k"}}}), "a synchronization with threads or a name"},
		{"records", full.Message(0), "of 65 records"},
		{"flags", EncodeDeviceTrace(DeviceTraceNotice{Flags: 6}), "device-trace flags 0x6"},
	} {
		_, _, err := ParseRequest(tc.b)
		require.Error(t, err, tc.name)
		assert.ErrorIs(t, err, core.ErrInvalidValue, tc.name)
		assert.Contains(t, err.Error(), tc.want, tc.name)
	}
}
