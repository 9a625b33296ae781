package guard

import (
	"fmt"
	"os"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/softuvm/softuvm/internal/core"
	"github.com/softuvm/softuvm/internal/fdleak"
	"github.com/softuvm/softuvm/internal/wire"
)

func allocMsg(addr, length uint64) []byte {
	return wire.EncodeAlloc(0, wire.AllocRequest{Addr: addr, Length: length, Size: length})
}

func adviseMsg(addr, length uint64, a core.Advice, d core.Device) []byte {
	return wire.EncodeAdvise(0, wire.AdviseRequest{Addr: addr, Length: length, Advice: uint8(a), Device: int32(d)})
}

// replayed lists what a journal would make a new server do: each
// record's kind, address and length, in order.
func replayed(t *testing.T, j *Journal) []string {
	t.Helper()
	var out []string
	for _, rec := range j.Records() {
		_, req, err := wire.ParseRequest(rec[1:])
		require.NoError(t, err)
		switch r := req.(type) {
		case wire.AllocRequest:
			out = append(out, "alloc "+core.FormatSize(int64(r.Addr))+"+"+core.FormatSize(int64(r.Length)))
		case wire.AdviseRequest:
			out = append(out, fmt.Sprintf("%v(%d) %s+%s", core.Advice(r.Advice), r.Device, core.FormatSize(int64(r.Addr)), core.FormatSize(int64(r.Length))))
		}
	}
	return out
}

// TestJournal: the journal keeps what a new server needs and nothing
// more: live ranges, and advice not covered by later advice of the same
// kind, in order.
func TestJournal(t *testing.T) {
	const mib = 1 << 20
	j := NewJournal()
	for _, rec := range [][]byte{
		AllocRecord(allocMsg(16*mib, 4*mib)),
		AllocRecord(allocMsg(32*mib, 4*mib)),
		AdviseRecord(adviseMsg(16*mib, mib, core.AdviseSetReadMostly, 0)),
		AdviseRecord(adviseMsg(16*mib, 2*mib, core.AdviseSetPreferredLocation, 0)),
		AdviseRecord(adviseMsg(16*mib, 2*mib, core.AdviseUnsetReadMostly, 0)), // covers the first: it goes
		AdviseRecord(adviseMsg(17*mib, mib, core.AdviseSetAccessedBy, 0)),
		AdviseRecord(adviseMsg(17*mib, mib, core.AdviseSetAccessedBy, 1)), // another device: both stay
		AdviseRecord(adviseMsg(32*mib, mib, core.AdviseSetReadMostly, 0)),
	} {
		require.NoError(t, j.Apply(rec))
	}
	assert.Equal(t, []string{
		"alloc 16 MiB+4 MiB", "alloc 32 MiB+4 MiB",
		"set-preferred-location(0) 16 MiB+2 MiB", "unset-read-mostly(0) 16 MiB+2 MiB",
		"set-accessed-by(0) 17 MiB+1 MiB", "set-accessed-by(1) 17 MiB+1 MiB",
		"set-read-mostly(0) 32 MiB+1 MiB",
	}, replayed(t, j))

	// A free drops the range and its advice.
	require.NoError(t, j.Apply(FreeRecord(32*mib)))
	assert.NotContains(t, replayed(t, j), "alloc 32 MiB+4 MiB")
	assert.NotContains(t, replayed(t, j), "set-read-mostly(0) 32 MiB+1 MiB")
	// A new range over an old one means the old was unmapped without a
	// free: it goes, with its advice.
	require.NoError(t, j.Apply(AllocRecord(allocMsg(14*mib, 4*mib))))
	assert.Equal(t, []string{"alloc 14 MiB+4 MiB"}, replayed(t, j))
	// A free of what the journal does not hold changes nothing.
	require.NoError(t, j.Apply(FreeRecord(64*mib)))
	assert.Len(t, j.Records(), 1)

	for _, bad := range [][]byte{nil, {'z'}, {recordFree, 1, 2}, append([]byte{recordAlloc}, "garbage"...),
		AdviseRecord(allocMsg(16*mib, mib)), AllocRecord(adviseMsg(16*mib, mib, core.AdviseSetReadMostly, 0))} {
		assert.Error(t, j.Apply(bad), "record %q", bad)
	}
	assert.Len(t, j.Records(), 1, "a bad record changes nothing")
}

// TestKeptStateRefusesBadMessages: the guard keeps what it is sent, and
// a malformed message is refused without leaking its descriptors.
func TestKeptStateRefusesBadMessages(t *testing.T) {
	open := func() int {
		f, err := os.Open("/dev/null")
		require.NoError(t, err)
		fd, err := syscall.Dup(int(f.Fd()))
		f.Close()
		require.NoError(t, err)
		return fd
	}
	before := fdCount(t)
	st := NewState()
	require.NoError(t, st.Apply(ConfigMsg(ModeDaemon, 3, `{"devices":[]}`), nil))
	assert.Equal(t, byte(ModeDaemon), st.Mode)
	assert.Equal(t, 3, st.Attempts)
	require.NoError(t, st.Apply(SessionMsg(7, 1234, 0x55), []int{open(), open(), open()}))
	require.NoError(t, st.Apply(LocMsg(OpFile, 7, 1), []int{open()}))
	require.NoError(t, st.Apply(ViewMsg(7, 1, 99), []int{open(), open()}))
	require.NoError(t, st.Apply(RecordMsg(7, AllocRecord(allocMsg(1<<24, 1<<20))), nil))
	require.NoError(t, st.Apply(LocMsg(OpFile, 8, 1), []int{open()}), "a session not kept: ignored")
	ks := st.Sessions[7]
	require.NotNil(t, ks)
	assert.Equal(t, 1234, ks.PID)
	assert.Equal(t, uint64(0x55), ks.Features)
	assert.Len(t, ks.Files, 1)
	assert.Equal(t, 99, ks.Views[1].PID)
	assert.Len(t, ks.Journal.Records(), 1)
	for _, m := range []struct {
		b   []byte
		fds int
	}{
		{[]byte{OpSession, 1, 2}, 3},
		{SessionMsg(9, 1, 0), 2},
		{LocMsg(OpFile, 7, 1), 0},
		{ViewMsg(7, 1, 5), 1},
		{[]byte{'?'}, 1},
		{RecordMsg(7, []byte{'z'}), 0},
	} {
		fds := make([]int, m.fds)
		for i := range fds {
			fds[i] = open()
		}
		assert.Error(t, st.Apply(m.b, fds), "message %q", m.b)
	}
	require.NoError(t, st.Apply(IDMsg(OpEnd, 7), nil))
	assert.Empty(t, st.Sessions)
	st.Close()
	assert.Equal(t, before, fdCount(t), "every descriptor kept was closed, and every refused one too")
}

// fdCount is the number of descriptors this process holds.
func fdCount(t testing.TB) int {
	fds, err := fdleak.Snapshot()
	require.NoError(t, err)
	return len(fds)
}
