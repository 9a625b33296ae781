//go:build linux

package uffd

import (
	"encoding/binary"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// rawMsg builds a struct uffd_msg by hand: the event byte, three reserved
// fields, then the arg union as 64-bit words. put32 sets the 32-bit fields
// (the fork's ufd at 8, the pagefault's ptid at 24).
func rawMsg(event byte, words ...uint64) []byte {
	b := make([]byte, MsgSize)
	b[0] = event
	for i, w := range words {
		binary.NativeEndian.PutUint64(b[8+8*i:], w)
	}
	return b
}

func put32(b []byte, off int, v uint32) []byte {
	binary.NativeEndian.PutUint32(b[off:], v)
	return b
}

func TestDecodeMsg(t *testing.T) {
	cases := []struct {
		name string
		raw  []byte
		want Msg
		str  string
	}{
		{
			name: "pagefault",
			raw:  put32(rawMsg(0x12, 0x3, 0x7f0000001000), 24, 4242),
			want: Msg{Event: EventPagefault, Flags: PagefaultWrite | PagefaultWP, Address: 0x7f0000001000, TID: 4242},
			str:  "PAGEFAULT 0x7f0000001000 flags=WRITE|WP tid=4242",
		},
		{
			name: "minor read fault without tid",
			raw:  rawMsg(0x12, 0x4, 0x1000),
			want: Msg{Event: EventPagefault, Flags: PagefaultMinor, Address: 0x1000},
			str:  "PAGEFAULT 0x1000 flags=MINOR",
		},
		{
			name: "fork",
			raw:  put32(rawMsg(0x13), 8, 17),
			want: Msg{Event: EventFork, ChildFD: 17},
			str:  "FORK childfd=17",
		},
		{
			name: "remap",
			raw:  rawMsg(0x14, 0x7f0000000000, 0x7f0000100000, 0x4000),
			want: Msg{Event: EventRemap, From: 0x7f0000000000, To: 0x7f0000100000, Len: 0x4000},
			str:  "REMAP from=0x7f0000000000 to=0x7f0000100000 len=16384",
		},
		{
			name: "remove",
			raw:  rawMsg(0x15, 0x7f0000000000, 0x7f0000002000),
			want: Msg{Event: EventRemove, Start: 0x7f0000000000, End: 0x7f0000002000},
			str:  "REMOVE 0x7f0000000000-0x7f0000002000",
		},
		{
			name: "unmap",
			raw:  rawMsg(0x16, 0x7f0000000000, 0x7f0000004000),
			want: Msg{Event: EventUnmap, Start: 0x7f0000000000, End: 0x7f0000004000},
			str:  "UNMAP 0x7f0000000000-0x7f0000004000",
		},
		{
			// Fields of other events are not decoded into the Msg.
			name: "remap ignores reserved bytes",
			raw:  func() []byte { b := rawMsg(0x14, 1, 2, 3); b[1], b[4] = 0xff, 0xff; return b }(),
			want: Msg{Event: EventRemap, From: 1, To: 2, Len: 3},
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			m, err := DecodeMsg(c.raw)
			require.NoError(t, err)
			assert.Equal(t, c.want, m)
			if c.str != "" {
				assert.Equal(t, c.str, m.String())
			}
		})
	}
}

func TestDecodeMsgErrors(t *testing.T) {
	m, err := DecodeMsg(rawMsg(0x42))
	require.Error(t, err)
	assert.Equal(t, "uffd: message with unknown event 0x42", err.Error())
	assert.Equal(t, Event(0x42), m.Event)
	assert.Equal(t, "Event(0x42)", m.String())

	_, err = DecodeMsg(rawMsg(0))
	assert.EqualError(t, err, "uffd: message with unknown event 0x0", "a zeroed message is not a valid one")

	for _, n := range []int{0, 31, 33, 64} {
		_, err := DecodeMsg(make([]byte, n))
		assert.Error(t, err, "length %d", n)
	}
	_, err = DecodeMsg(make([]byte, 31))
	assert.EqualError(t, err, "uffd: message is 31 bytes, want 32")
}

func FuzzDecodeMsg(f *testing.F) {
	f.Add(put32(rawMsg(0x12, 1, 0x1000), 24, 1))
	f.Add(rawMsg(0x13, 5))
	f.Add(rawMsg(0x14, 1, 2, 3))
	f.Add(rawMsg(0x15, 1, 2))
	f.Add(rawMsg(0x16, 1, 2))
	f.Add([]byte{0x12})
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := DecodeMsg(b)
		_ = m.String()
		if len(b) != MsgSize {
			if err == nil {
				t.Fatalf("DecodeMsg accepted %d bytes", len(b))
			}
			return
		}
		if err == nil {
			// A decoded message re-encodes to the bytes it was
			// decoded from, in the fields its event uses.
			switch m.Event {
			case EventPagefault:
				if m.Address != binary.NativeEndian.Uint64(b[16:]) {
					t.Fatal("address")
				}
			case EventRemap:
				if m.Len != binary.NativeEndian.Uint64(b[24:]) {
					t.Fatal("len")
				}
			}
		} else if b[0] >= 0x12 && b[0] <= 0x16 {
			t.Fatalf("known event 0x%x refused: %v", b[0], err)
		}
	})
}
