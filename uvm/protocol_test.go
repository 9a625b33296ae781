package uvm

import (
	"encoding/binary"
	"fmt"
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
		encodeDeviceHints(19, []mapping{{addr: 1 << 30, length: 8192}}),
		newMessage(header{typ: msgReplace, seq: 20}).b,
		retried(encodeFree(21, 1<<30)),
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
			again = newMessage(header{typ: h.typ, seq: h.seq}).b // info, replace
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
		case hintsRequest:
			again = encodeDeviceHints(h.seq, r.runs)
		case streamRequest:
			again = encodeStreamRequest(h.typ, h.seq, r.stream)
		default:
			t.Fatalf("unexpected request %T", req)
		}
		if h.status == requestRetried {
			again = retried(again)
		}
		if string(again) != string(b) {
			t.Fatalf("%s request re-encodes differently:\n% x\n% x", h.typ, b, again)
		}
	})
}

// retried marks a request as sent again after a restart.
func retried(b []byte) []byte {
	b = append([]byte(nil), b...)
	binary.LittleEndian.PutUint32(b[12:], uint32(requestRetried))
	return b
}

// FuzzParseReply decodes replies as a client (and a server reading a
// device's replies) does: whatever the bytes, every decoder returns a
// value or an error, never a panic, and a reply that decodes re-encodes
// to the same bytes.
func FuzzParseReply(f *testing.F) {
	h := header{typ: msgHello, seq: 3}
	for _, b := range [][]byte{
		encodeHelloReply(h, helloReply{serverPID: 7, sessionID: 9, features: 0x55, devices: []DeviceInfo{{Device: 0, Capacity: 1 << 30, Backend: "memfd", Node: -1, Workers: 2}}}),
		encodeRangeAttrsReply(header{typ: msgRangeAttrs, seq: 4}, RangeAttributes{ReadMostly: true, PreferredLocation: 1, LastPrefetchLocation: CPU, AccessedBy: []Device{0, 1}}),
		encodeStringReply(header{typ: msgInfo, seq: 5}, `{"pid":1}`),
		encodeLayoutReply(header{typ: msgDeviceHello, seq: 1}, layout{runs: []mapping{{addr: 1 << 30, length: 8192, loc: 1}}, minorRemote: true}),
		encodeU64Reply(header{typ: msgAlloc, seq: 6}, 42),
		encodeError(header{typ: msgFree, seq: 8}, fmt.Errorf("%w: free 0x1: not managed", ErrInvalidValue)),
		encodeRestarted(1234, 2),
		encodeEmptyReply(header{typ: msgDeviceMap, seq: 9}),
	} {
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		rh, _, err := parseHeader(b)
		if err != nil {
			return
		}
		r, err := parseReply(b, header{typ: rh.typ, seq: rh.seq})
		if err != nil {
			return
		}
		payload := append([]byte(nil), r.b...)
		check := func(name string, again []byte, err error) {
			if err == nil && string(again[wireHeaderSize:]) != string(payload) {
				t.Fatalf("%s re-encodes differently:\n% x\n% x", name, payload, again[wireHeaderSize:])
			}
		}
		hr, err := decodeHelloReply(&wireReader{b: payload})
		check("hello reply", encodeHelloReply(rh, hr), err)
		ra, err := decodeRangeAttrsReply(&wireReader{b: payload})
		check("range attributes", encodeRangeAttrsReply(rh, ra), err)
		str, err := decodeStringReply(&wireReader{b: payload})
		check("string", encodeStringReply(rh, str), err)
		lay, err := decodeLayoutReply(&wireReader{b: payload})
		check("layout", encodeLayoutReply(rh, lay), err)
		pid, n, err := decodeRestarted(&wireReader{b: payload})
		check("restarted", encodeRestarted(pid, n), err)
	})
}

// FuzzGuardMessage feeds the guard's state whatever bytes (without
// descriptors, which it refuses where they are wanted): it keeps what is
// well formed, refuses the rest, and never panics.
func FuzzGuardMessage(f *testing.F) {
	for _, b := range [][]byte{
		guardConfigMsg(modeDaemon, 5, `{"devices":[]}`),
		guardSessionMsg(1, 100, 0x1ff),
		guardLocMsg(guardFile, 1, 1),
		guardViewMsg(1, 1, 101),
		guardLocMsg(guardViewGone, 1, 1),
		guardRecordMsg(1, allocRecord(encodeAlloc(0, allocRequest{addr: 1 << 30, length: 8192, size: 8000}))),
		guardRecordMsg(1, adviseRecord(encodeAdvise(0, adviseRequest{addr: 1 << 30, length: 4096, advice: uint8(AdviseSetReadMostly)}))),
		guardRecordMsg(1, freeRecord(1<<30)),
		guardIDMsg(guardEnd, 1),
		{guardQuit}, {guardStaging},
	} {
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		st := newKeptState()
		// A session to address, as the server would have sent first.
		st.sessions[1] = &keptSession{id: 1, conn: -1, uffd: -1, host: -1, files: map[location]int{}, views: map[location]*keptView{}, journal: newJournal()}
		st.apply(b, nil)
		for _, ks := range st.sessions {
			for _, rec := range ks.journal.records() {
				if _, _, err := parseRequest(rec[1:]); err != nil {
					t.Fatalf("the journal kept a record that does not parse: % x", rec)
				}
			}
		}
	})
}
