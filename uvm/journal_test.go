package uvm

import (
	"fmt"
	"os"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func allocMsg(addr, length uint64) []byte {
	return encodeAlloc(0, allocRequest{addr: addr, length: length, size: length})
}

func adviseMsg(addr, length uint64, a Advice, d Device) []byte {
	return encodeAdvise(0, adviseRequest{addr: addr, length: length, advice: uint8(a), device: int32(d)})
}

// replayed lists what a journal would make a new server do: each
// record's kind, address and length, in order.
func replayed(t *testing.T, j *journal) []string {
	t.Helper()
	var out []string
	for _, rec := range j.records() {
		_, req, err := parseRequest(rec[1:])
		require.NoError(t, err)
		switch r := req.(type) {
		case allocRequest:
			out = append(out, "alloc "+FormatSize(int64(r.addr))+"+"+FormatSize(int64(r.length)))
		case adviseRequest:
			out = append(out, fmt.Sprintf("%v(%d) %s+%s", Advice(r.advice), r.device, FormatSize(int64(r.addr)), FormatSize(int64(r.length))))
		}
	}
	return out
}

// TestJournal: the journal keeps what a new server needs and nothing
// more: live ranges, and advice not covered by later advice of the same
// kind, in order.
func TestJournal(t *testing.T) {
	const mib = 1 << 20
	j := newJournal()
	for _, rec := range [][]byte{
		allocRecord(allocMsg(16*mib, 4*mib)),
		allocRecord(allocMsg(32*mib, 4*mib)),
		adviseRecord(adviseMsg(16*mib, mib, AdviseSetReadMostly, 0)),
		adviseRecord(adviseMsg(16*mib, 2*mib, AdviseSetPreferredLocation, 0)),
		adviseRecord(adviseMsg(16*mib, 2*mib, AdviseUnsetReadMostly, 0)), // covers the first: it goes
		adviseRecord(adviseMsg(17*mib, mib, AdviseSetAccessedBy, 0)),
		adviseRecord(adviseMsg(17*mib, mib, AdviseSetAccessedBy, 1)), // another device: both stay
		adviseRecord(adviseMsg(32*mib, mib, AdviseSetReadMostly, 0)),
	} {
		require.NoError(t, j.apply(rec))
	}
	assert.Equal(t, []string{
		"alloc 16 MiB+4 MiB", "alloc 32 MiB+4 MiB",
		"set-preferred-location(0) 16 MiB+2 MiB", "unset-read-mostly(0) 16 MiB+2 MiB",
		"set-accessed-by(0) 17 MiB+1 MiB", "set-accessed-by(1) 17 MiB+1 MiB",
		"set-read-mostly(0) 32 MiB+1 MiB",
	}, replayed(t, j))

	// A free drops the range and its advice.
	require.NoError(t, j.apply(freeRecord(32*mib)))
	assert.NotContains(t, replayed(t, j), "alloc 32 MiB+4 MiB")
	assert.NotContains(t, replayed(t, j), "set-read-mostly(0) 32 MiB+1 MiB")
	// A new range over an old one means the old was unmapped without a
	// free: it goes, with its advice.
	require.NoError(t, j.apply(allocRecord(allocMsg(14*mib, 4*mib))))
	assert.Equal(t, []string{"alloc 14 MiB+4 MiB"}, replayed(t, j))
	// A free of what the journal does not hold changes nothing.
	require.NoError(t, j.apply(freeRecord(64*mib)))
	assert.Len(t, j.records(), 1)

	for _, bad := range [][]byte{nil, {'z'}, {recordFree, 1, 2}, append([]byte{recordAlloc}, "garbage"...),
		adviseRecord(allocMsg(16*mib, mib)), allocRecord(adviseMsg(16*mib, mib, AdviseSetReadMostly, 0))} {
		assert.Error(t, j.apply(bad), "record %q", bad)
	}
	assert.Len(t, j.records(), 1, "a bad record changes nothing")
}

// TestKeptStateRefusesBadMessages: the guard keeps what it is sent, and
// a malformed message is refused without leaking its descriptors.
func TestKeptStateRefusesBadMessages(t *testing.T) {
	open := func() int {
		f, err := os.Open("/dev/null")
		require.NoError(t, err)
		fd, err := dupCloexec(f)
		f.Close()
		require.NoError(t, err)
		return fd
	}
	before := fdCount(t)
	st := newKeptState()
	require.NoError(t, st.apply(guardConfigMsg(modeDaemon, 3, `{"devices":[]}`), nil))
	assert.Equal(t, byte(modeDaemon), st.mode)
	assert.Equal(t, 3, st.attempts)
	require.NoError(t, st.apply(guardSessionMsg(7, 1234, 0x55), []int{open(), open(), open()}))
	require.NoError(t, st.apply(guardLocMsg(guardFile, 7, 1), []int{open()}))
	require.NoError(t, st.apply(guardViewMsg(7, 1, 99), []int{open(), open()}))
	require.NoError(t, st.apply(guardRecordMsg(7, allocRecord(allocMsg(1<<24, 1<<20))), nil))
	require.NoError(t, st.apply(guardLocMsg(guardFile, 8, 1), []int{open()}), "a session not kept: ignored")
	ks := st.sessions[7]
	require.NotNil(t, ks)
	assert.Equal(t, 1234, ks.pid)
	assert.Equal(t, uint64(0x55), ks.features)
	assert.Len(t, ks.files, 1)
	assert.Equal(t, 99, ks.views[1].pid)
	assert.Len(t, ks.journal.records(), 1)
	for _, m := range []struct {
		b   []byte
		fds int
	}{
		{[]byte{guardSession, 1, 2}, 3},
		{guardSessionMsg(9, 1, 0), 2},
		{guardLocMsg(guardFile, 7, 1), 0},
		{guardViewMsg(7, 1, 5), 1},
		{[]byte{'?'}, 1},
		{guardRecordMsg(7, []byte{'z'}), 0},
	} {
		fds := make([]int, m.fds)
		for i := range fds {
			fds[i] = open()
		}
		assert.Error(t, st.apply(m.b, fds), "message %q", m.b)
	}
	require.NoError(t, st.apply(guardIDMsg(guardEnd, 7), nil))
	assert.Empty(t, st.sessions)
	st.close()
	assert.Equal(t, before, fdCount(t), "every descriptor kept was closed, and every refused one too")
}
