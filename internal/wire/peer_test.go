package wire

import (
	"encoding/binary"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/softuvm/softuvm/internal/core"
)

// TestPeerAccessRequest: the request round-trips, field by field at the
// offsets the layout gives, and the decoder refuses devices no server can
// have, a boolean that is neither 0 nor 1, and a short or long payload.
func TestPeerAccessRequest(t *testing.T) {
	for _, want := range []PeerAccessRequest{
		{Device: 1, Peer: 0, Enable: true},
		{Device: 0, Peer: core.MaxDevices - 1, Enable: false, Flags: 7}, // flags are the server's to refuse
	} {
		b := EncodePeerAccess(9, want)
		require.Len(t, b, wireHeaderSize+4+4+1+4)
		p := b[wireHeaderSize:]
		assert.Equal(t, uint32(want.Device), binary.LittleEndian.Uint32(p[0:]))
		assert.Equal(t, uint32(want.Peer), binary.LittleEndian.Uint32(p[4:]))
		assert.Equal(t, want.Enable, p[8] == 1)
		assert.Equal(t, want.Flags, binary.LittleEndian.Uint32(p[9:]))
		h, req, err := ParseRequest(b)
		require.NoError(t, err)
		assert.Equal(t, Header{Typ: MsgPeerAccess, Seq: 9}, h)
		assert.Equal(t, want, req)
	}

	good := EncodePeerAccess(3, PeerAccessRequest{Device: 1, Peer: 0, Enable: true})
	put := func(off int, v uint32) []byte {
		b := append([]byte(nil), good...)
		binary.LittleEndian.PutUint32(b[wireHeaderSize+off:], v)
		return b
	}
	for _, tc := range []struct {
		name string
		b    []byte
		err  error
		msg  string
	}{
		{"negative device", put(0, ^uint32(0)), core.ErrInvalidDevice, "device -1"},
		{"device past the limit", put(0, core.MaxDevices), core.ErrInvalidDevice, "device 31"},
		{"negative peer", put(4, ^uint32(1)), core.ErrInvalidDevice, "peer -2"},
		{"bad boolean", func() []byte { b := append([]byte(nil), good...); b[wireHeaderSize+8] = 2; return b }(), core.ErrInvalidValue, "enable is 2"},
		{"short", good[:len(good)-1], core.ErrInvalidValue, "truncated"},
		{"long", append(append([]byte(nil), good...), 0), core.ErrInvalidValue, "trailing"},
	} {
		_, _, err := ParseRequest(tc.b)
		require.Error(t, err, tc.name)
		assert.ErrorIs(t, err, tc.err, tc.name)
		assert.Contains(t, err.Error(), tc.msg, tc.name)
	}
}

// TestPeerAccessReply: the reply carries the earlier state, and nothing
// else.
func TestPeerAccessReply(t *testing.T) {
	h := Header{Typ: MsgPeerAccess, Seq: 4}
	for _, was := range []bool{false, true} {
		r, err := ParseReply(EncodePeerAccessReply(h, PeerAccessReply{WasEnabled: was}), h)
		require.NoError(t, err)
		got, err := DecodePeerAccessReply(r)
		require.NoError(t, err)
		assert.Equal(t, was, got.WasEnabled)
	}
	r, err := ParseReply(EncodeEmptyReply(h), h)
	require.NoError(t, err)
	_, err = DecodePeerAccessReply(r)
	assert.ErrorIs(t, err, core.ErrInvalidValue, "an empty reply is not a peer-access reply")
}

// FuzzParsePeerAccess: whatever the bytes, the request decoder returns a
// value or an error, and a request that decodes re-encodes to the same
// bytes.
func FuzzParsePeerAccess(f *testing.F) {
	f.Add(EncodePeerAccess(1, PeerAccessRequest{Device: 1, Peer: 0, Enable: true}))
	f.Add(retried(EncodePeerAccess(2, PeerAccessRequest{Device: 2, Peer: 3, Flags: 1})))
	f.Fuzz(func(t *testing.T, b []byte) {
		h, req, err := ParseRequest(b)
		if err != nil {
			return
		}
		pa, ok := req.(PeerAccessRequest)
		if !ok {
			return // another request: FuzzParseRequest's
		}
		again := EncodePeerAccess(h.Seq, pa)
		if h.Status == RequestRetried {
			again = retried(again)
		}
		if string(again) != string(b) {
			t.Fatalf("peer-access request re-encodes differently:\n% x\n% x", b, again)
		}
	})
}
