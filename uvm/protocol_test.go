package uvm

import (
	"encoding/binary"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestRequestRoundTrips(t *testing.T) {
	const a, n = 0x7f0000000000, 1 << 21
	for _, tc := range []struct {
		b    []byte
		typ  msgType
		want any
	}{
		{encodeHello(1, helloRequest{role: roleClient, pid: 42, features: 7}), msgHello, helloRequest{role: roleClient, pid: 42, features: 7}},
		{encodeAlloc(2, allocRequest{addr: a, length: n, size: n - 100, flags: AttachGlobal, trackPrefetch: true, prefetch: "window:4"}), msgAlloc,
			allocRequest{addr: a, length: n, size: n - 100, flags: AttachGlobal, trackPrefetch: true, prefetch: "window:4"}},
		{encodeFree(3, a), msgFree, rangeRequest{addr: a}},
		{encodePrefetch(4, prefetchRequest{addr: a, length: n, dst: -1}), msgPrefetch, prefetchRequest{addr: a, length: n, dst: -1}},
		{encodeRangeAttrs(5, rangeRequest{addr: a, length: n}), msgRangeAttrs, rangeRequest{addr: a, length: n}},
		{encodeStats(6, statsRequest{scope: scopeRange, addr: a}), msgStats, statsRequest{scope: scopeRange, addr: a}},
		{encodeInfo(7), msgInfo, struct{}{}},
	} {
		h, req, err := parseRequest(tc.b)
		require.NoError(t, err, tc.typ)
		assert.Equal(t, tc.typ, h.typ)
		assert.Equal(t, tc.want, req)
	}
}

func TestRequestErrorsNameTheValue(t *testing.T) {
	hello := encodeHello(1, helloRequest{role: roleClient})
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
		{"role", encodeHello(1, helloRequest{role: 7}), "hello role 7"},
		{"truncated", encodeAlloc(1, allocRequest{addr: 1 << 30, length: 4096, size: 1})[:30], "message truncated"},
		{"trailing", append(encodeFree(1, 1<<30), 0), "1 unexpected trailing bytes"},
		{"unaligned", encodePrefetch(1, prefetchRequest{addr: 0x1001, length: 4096}), "not page-aligned"},
		{"empty", encodeRangeAttrs(1, rangeRequest{addr: 0x1000}), "is empty"},
		{"kernel half", encodePrefetch(1, prefetchRequest{addr: 1 << 47, length: 4096}), "outside the user address space"},
		{"size", encodeAlloc(1, allocRequest{addr: 1 << 30, length: 4096, size: 8192}), "alloc size 8192 does not fit"},
		{"scope", encodeStats(1, statsRequest{scope: 9}), "stats scope 9"},
	} {
		_, _, err := parseRequest(tc.b)
		require.Error(t, err, tc.name)
		assert.ErrorIs(t, err, ErrInvalidValue, tc.name)
		assert.Contains(t, err.Error(), tc.want, tc.name)
	}
}

func TestReplies(t *testing.T) {
	h := header{typ: msgRangeAttrs, seq: 9}
	a := RangeAttributes{ReadMostly: true, PreferredLocation: 1, AccessedBy: []Device{0, CPU}, LastPrefetchLocation: InvalidDevice}
	r, err := parseReply(encodeRangeAttrsReply(h, a), h)
	require.NoError(t, err)
	got, err := decodeRangeAttrsReply(r)
	require.NoError(t, err)
	assert.Equal(t, a, got)

	hh := header{typ: msgHello, seq: 1}
	devs := []DeviceInfo{{Device: 0, Capacity: 1 << 30, Backend: "memfd", Node: -1}}
	r, err = parseReply(encodeHelloReply(hh, helloReply{serverPID: 5, sessionID: 6, features: 7, devices: devs}), hh)
	require.NoError(t, err)
	hr, err := decodeHelloReply(r)
	require.NoError(t, err)
	assert.Equal(t, helloReply{serverPID: 5, sessionID: 6, features: 7, devices: devs}, hr)

	_, err = parseReply(encodeError(h, ErrInvalidDevice), h)
	assert.ErrorIs(t, err, ErrInvalidDevice, "the error class survives the wire")
	_, err = parseReply(encodeEmptyReply(header{typ: msgFree, seq: 3}), h)
	assert.ErrorIs(t, err, ErrInternal, "a reply to another request is refused")
}

// FuzzParseRequest: whatever a client sends, the decoder returns a request
// or an error, never panics, and an accepted request re-encodes to itself.
func FuzzParseRequest(f *testing.F) {
	for _, b := range [][]byte{
		encodeHello(1, helloRequest{role: roleClient, pid: 1}),
		encodeAlloc(2, allocRequest{addr: 1 << 30, length: 8192, size: 5000, prefetch: "none"}),
		encodeFree(3, 1<<30),
		encodePrefetch(4, prefetchRequest{addr: 1 << 30, length: 4096, dst: 0}),
		encodeRangeAttrs(5, rangeRequest{addr: 1 << 30, length: 4096}),
		encodeStats(6, statsRequest{scope: 1}),
		encodeInfo(7),
		encodeDeviceConnect(8, 1),
		encodeDeviceHello(9, deviceHelloRequest{device: 1, pid: 42}),
		encodeLaunch(10, launchRequest{stream: 2, nthreads: 8, name: "k", params: []byte{1, 2}}),
		encodeStreamRequest(msgSync, 11, allStreams),
		encodeStreamRequest(msgStreamOpen, 12, 3),
		encodeAdvise(13, adviseRequest{addr: 1 << 30, length: 4096, advice: uint8(AdviseSetAccessedBy), device: 1}),
		encodeDeviceCopy(14, deviceCopyRequest{op: deviceWritten, dst: 1 << 30, length: 100}),
		encodeDeviceFile(18, 0),
		encodeDeviceMap(15, deviceMapRequest{addr: 1 << 30, length: 8192, loc: 2, wp: PageMask{3}}),
		encodeDeviceUnmap(16, 1<<30, 8192),
		encodeAlloc(17, allocRequest{addr: 1 << 30, length: 4096, size: 4096, kind: kindDevice, device: 1}),
	} {
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		h, req, err := parseRequest(b)
		if err != nil {
			return
		}
		var again []byte
		switch r := req.(type) {
		case helloRequest:
			again = encodeHello(h.seq, r)
		case allocRequest:
			again = encodeAlloc(h.seq, r)
		case prefetchRequest:
			again = encodePrefetch(h.seq, r)
		case statsRequest:
			again = encodeStats(h.seq, r)
		case rangeRequest:
			switch h.typ {
			case msgFree:
				again = encodeFree(h.seq, r.addr)
			case msgRangeAttrs:
				again = encodeRangeAttrs(h.seq, r)
			default: // device unmap
				again = encodeDeviceUnmap(h.seq, r.addr, r.length)
			}
		case adviseRequest:
			again = encodeAdvise(h.seq, r)
		case deviceCopyRequest:
			again = encodeDeviceCopy(h.seq, r)
		case deviceMapRequest:
			again = encodeDeviceMap(h.seq, r)
		case struct{}:
			again = encodeInfo(h.seq)
		case deviceConnectRequest:
			if h.typ == msgDeviceFile {
				again = encodeDeviceFile(h.seq, Device(r.device))
			} else {
				again = encodeDeviceConnect(h.seq, Device(r.device))
			}
		case deviceHelloRequest:
			again = encodeDeviceHello(h.seq, r)
		case deviceReadyRequest:
			again = newMessage(h).b
		case launchRequest:
			again = encodeLaunch(h.seq, r)
		case streamRequest:
			again = encodeStreamRequest(h.typ, h.seq, r.stream)
		default:
			t.Fatalf("unexpected request %T", req)
		}
		if string(again) != string(b) {
			t.Fatalf("%s request re-encodes differently:\n% x\n% x", h.typ, b, again)
		}
	})
}
