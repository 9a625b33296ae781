package wire

import (
	"errors"
	"os"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/softuvm/softuvm/internal/core"
	"github.com/softuvm/softuvm/internal/fdleak"
)

// socketPairs returns the two kinds of socket recvMsg and sendMsg serve,
// each as a connected pair: the runtime poller's (Client, servers,
// guards) and raw blocking descriptors (DirectConn).
func socketPairs(t *testing.T) map[string][2]socket {
	t.Helper()
	local, remote, err := SocketPair("rights-test")
	require.NoError(t, err)
	peer, err := NewDirectConn(remote)
	require.NoError(t, err)
	a, bf, err := DirectSocketPair("rights-test-direct")
	require.NoError(t, err)
	b, err := NewDirectConn(bf)
	require.NoError(t, err)
	t.Cleanup(func() { local.Close(); peer.Close(); a.Close(); b.Close() })
	return map[string][2]socket{
		"poller": {{conn: local}, {fd: peer.Fd}},
		"direct": {{fd: a.Fd}, {fd: b.Fd}},
	}
}

// files opens n descriptors of distinct files, closed at the end of the
// test.
func files(t *testing.T, n int) []int {
	t.Helper()
	var fds []int
	for range n {
		f, err := os.CreateTemp(t.TempDir(), "rights")
		require.NoError(t, err)
		t.Cleanup(func() { f.Close() })
		fds = append(fds, int(f.Fd()))
	}
	return fds
}

// sameFile reports whether descriptors a and b refer to the same file.
func sameFile(t *testing.T, a, b int) bool {
	t.Helper()
	var sa, sb syscall.Stat_t
	require.NoError(t, syscall.Fstat(a, &sa))
	require.NoError(t, syscall.Fstat(b, &sb))
	return sa.Dev == sb.Dev && sa.Ino == sb.Ino
}

// noLeak fails the test if descriptors opened since before are still
// open.
func noLeak(t *testing.T, before map[int]string) {
	t.Helper()
	after, err := fdleak.Snapshot()
	require.NoError(t, err)
	assert.Empty(t, fdleak.Leaked(before, after), "descriptors left open")
}

// TestRightsPassed: descriptors sent with a datagram arrive, in order,
// refer to the files sent, and are close-on-exec; both ways, on both
// kinds of socket.
func TestRightsPassed(t *testing.T) {
	for kind, pair := range socketPairs(t) {
		for dir, ends := range [][2]socket{{pair[0], pair[1]}, {pair[1], pair[0]}} {
			sent := files(t, 3)
			require.NoError(t, ends[0].sendMsg([]byte("hello"), sent))
			buf := make([]byte, 64)
			b, got, err := ends[1].recvMsg(buf, maxMessageFDs)
			require.NoError(t, err, "%s socket, direction %d", kind, dir)
			assert.Equal(t, "hello", string(b))
			require.Len(t, got, len(sent), "%s socket, direction %d: descriptors received", kind, dir)
			for i := range got {
				assert.NotEqual(t, sent[i], got[i], "a received descriptor is a new one")
				assert.True(t, sameFile(t, sent[i], got[i]), "%s socket: received descriptor %d (fd %d) is not the file sent as fd %d", kind, i, got[i], sent[i])
				flags, err := fcntl(got[i], syscall.F_GETFD)
				require.NoError(t, err)
				assert.Equal(t, syscall.FD_CLOEXEC, flags&syscall.FD_CLOEXEC, "%s socket: received fd %d is not close-on-exec", kind, got[i])
			}
			CloseFDs(got)

			// No descriptors: none received, not an empty slice.
			require.NoError(t, ends[0].sendMsg([]byte("plain"), nil))
			b, got, err = ends[1].recvMsg(buf, maxMessageFDs)
			require.NoError(t, err)
			assert.Equal(t, "plain", string(b))
			assert.Nil(t, got)
		}
	}
}

func fcntl(fd, cmd int) (int, error) {
	r, _, e := syscall.Syscall(syscall.SYS_FCNTL, uintptr(fd), uintptr(cmd), 0)
	if e != 0 {
		return 0, e
	}
	return int(r), nil
}

// TestRightsBeyondKeepClosed: descriptors beyond what the receiver keeps
// are closed, not leaked; the first ones are kept.
func TestRightsBeyondKeepClosed(t *testing.T) {
	for kind, pair := range socketPairs(t) {
		sent := files(t, 3)
		before, err := fdleak.Snapshot()
		require.NoError(t, err)
		require.NoError(t, pair[0].sendMsg([]byte("three"), sent))
		_, got, err := pair[1].recvMsg(make([]byte, 64), 1)
		require.NoError(t, err)
		require.Len(t, got, 1, "%s socket: kept descriptors", kind)
		assert.True(t, sameFile(t, sent[0], got[0]), "%s socket: the kept descriptor is not the first one sent", kind)
		CloseFDs(got)
		noLeak(t, before)
	}

	// DirectConn.Read keeps none.
	a, bf, err := DirectSocketPair("rights-test")
	require.NoError(t, err)
	b, err := NewDirectConn(bf)
	require.NoError(t, err)
	defer a.Close()
	defer b.Close()
	sent := files(t, 2)
	before, err := fdleak.Snapshot()
	require.NoError(t, err)
	require.NoError(t, a.WriteFDs([]byte("two"), sent))
	got, err := b.Read(make([]byte, 64), 0)
	require.NoError(t, err)
	assert.Equal(t, "two", string(got))
	noLeak(t, before)
}

// TestRightsTruncated: as many descriptors as a message may carry all
// arrive; a datagram with one more comes with truncated control data
// (MSG_CTRUNC), and one longer than the buffer truncated (MSG_TRUNC):
// each is an error naming the flag, and no descriptor of it stays open.
func TestRightsTruncated(t *testing.T) {
	for kind, pair := range socketPairs(t) {
		sent := files(t, maxMessageFDs+1)
		before, err := fdleak.Snapshot()
		require.NoError(t, err)
		// As many as a device hello's reply to a device of a server with
		// every device: all arrive.
		require.NoError(t, pair[1].sendMsg([]byte("most"), sent[:maxMessageFDs]))
		_, got, err := pair[0].recvMsg(make([]byte, 64), maxMessageFDs)
		require.NoError(t, err, "%s socket: %d descriptors", kind, maxMessageFDs)
		require.Len(t, got, maxMessageFDs)
		assert.True(t, sameFile(t, sent[maxMessageFDs-1], got[maxMessageFDs-1]))
		CloseFDs(got)
		// Sent by hand: sendMsg refuses so many.
		require.NoError(t, syscall.Sendmsg(pair[1].fd, []byte("many"), syscall.UnixRights(sent...), nil, 0))
		b, got, err := pair[0].recvMsg(make([]byte, 64), maxMessageFDs)
		require.Error(t, err, "%s socket: %d descriptors", kind, len(sent))
		assert.ErrorIs(t, err, core.ErrInvalidValue)
		assert.Contains(t, err.Error(), "MSG_CTRUNC")
		assert.Nil(t, b)
		assert.Nil(t, got)
		noLeak(t, before)

		require.NoError(t, syscall.Sendmsg(pair[1].fd, make([]byte, 100), syscall.UnixRights(sent[:2]...), nil, 0))
		b, got, err = pair[0].recvMsg(make([]byte, 64), maxMessageFDs)
		require.Error(t, err, "%s socket: 100 bytes into 64", kind)
		assert.ErrorIs(t, err, core.ErrInvalidValue)
		assert.Contains(t, err.Error(), "MSG_TRUNC")
		assert.Nil(t, b)
		assert.Nil(t, got)
		noLeak(t, before)
	}

	err := socket{fd: -1}.sendMsg([]byte("x"), make([]int, maxMessageFDs+1))
	require.Error(t, err)
	assert.ErrorIs(t, err, core.ErrInvalidValue)
	assert.Contains(t, err.Error(), "33 descriptors: at most 32")
}

// TestRightsPeerGone: a peer that closed its end is ErrPeerGone.
func TestRightsPeerGone(t *testing.T) {
	for kind, pair := range socketPairs(t) {
		require.NoError(t, syscall.Shutdown(pair[1].fd, syscall.SHUT_WR))
		_, _, err := pair[0].recvMsg(make([]byte, 64), maxMessageFDs)
		assert.True(t, errors.Is(err, ErrPeerGone), "%s socket: got %v, want ErrPeerGone", kind, err)
	}
}

// TestRightsSpace: the receive buffer holds exactly maxMessageFDs
// descriptors' control message.
func TestRightsSpace(t *testing.T) {
	assert.Equal(t, syscall.CmsgSpace(4*maxMessageFDs), rightsSpace)
}

// TestReadAllocs: reading a message without descriptors allocates
// nothing, on either kind of socket: the launch path reads one per
// synchronize.
func TestReadAllocs(t *testing.T) {
	for kind, pair := range socketPairs(t) {
		msg, buf := make([]byte, 64), make([]byte, 4096)
		allocs := testing.AllocsPerRun(100, func() {
			if err := pair[1].sendMsg(msg, nil); err != nil {
				t.Fatal(err)
			}
			if _, _, err := pair[0].recvMsg(buf, maxMessageFDs); err != nil {
				t.Fatal(err)
			}
		})
		assert.Zero(t, allocs, "%s socket: allocations per message sent and read", kind)
	}
	a, bf, err := DirectSocketPair("rights-test")
	require.NoError(t, err)
	b, err := NewDirectConn(bf)
	require.NoError(t, err)
	defer a.Close()
	defer b.Close()
	msg, buf := make([]byte, 64), make([]byte, 4096)
	allocs := testing.AllocsPerRun(100, func() {
		if err := a.Write(msg); err != nil {
			t.Fatal(err)
		}
		if _, err := b.Read(buf, 0); err != nil {
			t.Fatal(err)
		}
	})
	assert.Zero(t, allocs, "DirectConn.Write and Read: allocations per message")
}
