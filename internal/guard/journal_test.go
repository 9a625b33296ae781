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
		req, err := DecodeRecord(rec)
		require.NoError(t, err)
		switch r := req.(type) {
		case wire.AllocRequest:
			out = append(out, "alloc "+core.FormatSize(int64(r.Addr))+"+"+core.FormatSize(int64(r.Length)))
		case wire.AdviseRequest:
			out = append(out, fmt.Sprintf("%v(%d) %s+%s", core.Advice(r.Advice), r.Device, core.FormatSize(int64(r.Addr)), core.FormatSize(int64(r.Length))))
		case Model:
			out = append(out, "launch model "+r.DirtyTracking)
		case wire.StreamAttachRequest:
			out = append(out, fmt.Sprintf("attach %s mode %d stream %d", core.FormatSize(int64(r.Addr)), r.Mode, r.Stream))
		case wire.PeerAccessRequest:
			out = append(out, fmt.Sprintf("peer %d->%d", r.Device, r.Peer))
		case Launch:
			var ranges []string
			for _, a := range r.Ranges {
				ranges = append(ranges, core.FormatSize(int64(a)))
			}
			out = append(out, fmt.Sprintf("kernel %s on %d/%d holding %v", r.Kernel, r.Device, r.Stream, ranges))
		case wire.TraceControlRequest:
			out = append(out, fmt.Sprintf("profiler %d %s", r.Op, r.Path))
		default:
			t.Fatalf("record %q decodes to %T", rec, req)
		}
	}
	return out
}

// TestJournalKeepsTheSessionsState: beyond ranges and advice, the journal
// keeps the launch model, attachments, the kernels running with the
// ranges they hold, peer access and the profiler's last request, each as
// long as it holds: a free drops a range's attachment and its place in
// kernels, a synchronize its streams' kernels, a disable its access, and
// a later profiler request the earlier one.
func TestJournalKeepsTheSessionsState(t *testing.T) {
	const mib = 1 << 20
	attach := func(addr uint64, mode core.AttachMode, stream uint32) []byte {
		return AttachRecord(wire.EncodeStreamAttach(0, wire.StreamAttachRequest{Addr: addr, Mode: mode, Stream: stream}))
	}
	idle := func(d int32, stream uint32) []byte {
		return IdleRecord(wire.EncodeStreamsIdle(0, wire.StreamsIdleRequest{Device: d, Stream: stream}))
	}
	peer := func(d, p int32, on bool) []byte {
		return PeerRecord(wire.EncodePeerAccess(0, wire.PeerAccessRequest{Device: d, Peer: p, Enable: on}))
	}
	profile := func(op uint8, path string) []byte {
		return ProfileRecord(wire.EncodeTraceControl(0, wire.TraceControlRequest{Op: op, Path: path}))
	}
	j := NewJournal()
	for _, rec := range [][]byte{
		ModelRecord("wp-fault"),
		AllocRecord(allocMsg(16*mib, mib)),
		AllocRecord(allocMsg(32*mib, mib)),
		AllocRecord(allocMsg(48*mib, mib)),
		attach(32*mib, core.AttachHost, 0),
		attach(48*mib, core.AttachSingle, 3),
		LaunchRecord(Launch{Device: 0, Stream: 1, Kernel: "a", Ranges: []uint64{16 * mib}}),
		LaunchRecord(Launch{Device: 0, Stream: 3, Kernel: "b", Ranges: []uint64{48 * mib}}),
		LaunchRecord(Launch{Device: 1, Stream: 1, Kernel: "c", Ranges: []uint64{16 * mib, 48 * mib}}),
		peer(0, 1, true),
		peer(1, 0, true),
		profile(wire.TraceStart, "/t/a.uvmtrace"),
	} {
		require.NoError(t, j.Apply(rec))
	}
	dirty, ok := j.LaunchModel()
	assert.True(t, ok)
	assert.Equal(t, "wp-fault", dirty)
	assert.Equal(t, []string{
		"launch model wp-fault",
		"alloc 16 MiB+1 MiB", "alloc 32 MiB+1 MiB", "alloc 48 MiB+1 MiB",
		"attach 32 MiB mode 2 stream 0", "attach 48 MiB mode 4 stream 3",
		"peer 0->1", "peer 1->0",
		"kernel a on 0/1 holding [16 MiB]", "kernel b on 0/3 holding [48 MiB]", "kernel c on 1/1 holding [16 MiB 48 MiB]",
		"profiler 1 /t/a.uvmtrace",
	}, replayed(t, j))

	for _, rec := range [][]byte{
		idle(0, 1),                  // a ends
		FreeRecord(48 * mib),        // its attachment goes, and its place in b and c
		peer(0, 1, false),           // disabled: forgotten
		profile(wire.TraceStop, ""), // the later request wins
	} {
		require.NoError(t, j.Apply(rec))
	}
	assert.Equal(t, []string{
		"launch model wp-fault",
		"alloc 16 MiB+1 MiB", "alloc 32 MiB+1 MiB",
		"attach 32 MiB mode 2 stream 0",
		"peer 1->0",
		"kernel b on 0/3 holding []", "kernel c on 1/1 holding [16 MiB]",
		"profiler 2 ",
	}, replayed(t, j))
	require.NoError(t, j.Apply(idle(1, wire.AllStreams)))
	require.NoError(t, j.Apply(idle(0, 3)))
	assert.NotContains(t, fmt.Sprint(replayed(t, j)), "kernel", "every stream synchronized")

	for _, bad := range [][]byte{
		{recordLaunch, 1, 2}, LaunchRecord(Launch{Ranges: []uint64{1}})[:14],
		append([]byte{recordAttach}, allocMsg(1, 1)...), append([]byte{recordIdle}, "x"...),
		append([]byte{recordPeer}, adviseMsg(1, 1, 0, 0)...), append([]byte{recordProfile}, "x"...),
	} {
		assert.Error(t, j.Apply(bad), "record %q", bad)
	}
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
	require.NoError(t, st.Apply(ViewMsg(7, 2, 98), []int{open(), open(), open()}), "with its report socket")
	require.NoError(t, st.Apply(RecordMsg(7, AllocRecord(allocMsg(1<<24, 1<<20))), nil))
	require.NoError(t, st.Apply(LocMsg(OpFile, 8, 1), []int{open()}), "a session not kept: ignored")
	ks := st.Sessions[7]
	require.NotNil(t, ks)
	assert.Equal(t, 1234, ks.PID)
	assert.Equal(t, uint64(0x55), ks.Features)
	assert.Len(t, ks.Files, 1)
	assert.Equal(t, 99, ks.Views[1].PID)
	assert.Equal(t, -1, ks.Views[1].Report)
	assert.Positive(t, ks.Views[2].Report)
	assert.Len(t, ks.Journal.Records(), 1)
	for _, m := range []struct {
		b   []byte
		fds int
	}{
		{[]byte{OpSession, 1, 2}, 3},
		{SessionMsg(9, 1, 0), 2},
		{LocMsg(OpFile, 7, 1), 0},
		{ViewMsg(7, 1, 5), 1},
		{ViewMsg(7, 1, 5), 4},
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
