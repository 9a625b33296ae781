package wire

import (
	"net"
	"os"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/softuvm/softuvm/internal/core"
)

// unixPair returns the two ends of a SOCK_SEQPACKET socket pair, as a
// device process and the server hold them.
func unixPair(t *testing.T) (*net.UnixConn, *net.UnixConn) {
	t.Helper()
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_SEQPACKET|syscall.SOCK_CLOEXEC, 0)
	require.NoError(t, err)
	conn := func(fd int) *net.UnixConn {
		f := os.NewFile(uintptr(fd), "layout-test")
		defer f.Close()
		c, err := net.FileConn(f)
		require.NoError(t, err)
		t.Cleanup(func() { c.Close() })
		return c.(*net.UnixConn)
	}
	return conn(fds[0]), conn(fds[1])
}

// TestLayoutOf100000Runs: a layout of 100,000 runs, more than a socket
// takes in one datagram, goes through a real socket in pieces of at
// most LayoutChunkRuns runs and comes out whole and in order, as the Go
// device reads it (internal/device mapLayout).
func TestLayoutOf100000Runs(t *testing.T) {
	const n = 100_000
	lay := Layout{MinorRemote: true}
	for i := range n {
		lay.Runs = append(lay.Runs, Mapping{Addr: goldenAddr + uint64(2*i)*core.PageSize, Length: core.PageSize, File: core.Device(i%3 - 1)})
	}
	h := Header{Typ: MsgDeviceHello, Seq: 1}
	msgs := EncodeLayout(h, lay)
	require.Len(t, msgs, (n+LayoutChunkRuns-1)/LayoutChunkRuns)
	whole := EncodeLayoutReply(h, lay)
	server, device := unixPair(t)
	require.Error(t, WriteMessage(server, whole, nil), "one datagram of %d bytes: the reason for the pieces", len(whole))

	sent := make(chan error, 1)
	go func() {
		for _, m := range msgs {
			if err := WriteMessage(server, m, nil); err != nil {
				sent <- err
				return
			}
		}
		sent <- nil
	}()
	buf := make([]byte, MaxMessageSize)
	b, _, err := ReadMessage(device, buf)
	require.NoError(t, err)
	r, err := ParseReply(b, h)
	require.NoError(t, err)
	got, err := DecodeLayoutReply(r)
	require.NoError(t, err)
	assert.True(t, got.MinorRemote)
	assert.False(t, got.MinorOwn)
	assert.Equal(t, uint32(n-LayoutChunkRuns), got.More)
	for got.More > 0 {
		b, _, err := ReadMessage(device, buf)
		require.NoError(t, err)
		mh, req, err := ParseRequest(b)
		require.NoError(t, err)
		require.Equal(t, MsgDeviceLayout, mh.Typ)
		more := req.(DeviceLayoutRequest).Runs
		require.LessOrEqual(t, len(more), LayoutChunkRuns)
		got.Runs = append(got.Runs, more...)
		got.More -= uint32(len(more))
	}
	require.NoError(t, <-sent)
	require.Equal(t, lay.Runs, got.Runs)
}

// TestDeviceLayoutBounds: a device-layout message of more runs than a
// piece holds is refused.
func TestDeviceLayoutBounds(t *testing.T) {
	runs := make([]Mapping, LayoutChunkRuns+1)
	for i := range runs {
		runs[i] = Mapping{Addr: goldenAddr, Length: core.PageSize}
	}
	_, _, err := ParseRequest(EncodeDeviceLayout(1, runs))
	require.ErrorIs(t, err, core.ErrInvalidValue)
	_, req, err := ParseRequest(EncodeDeviceLayout(1, runs[:LayoutChunkRuns]))
	require.NoError(t, err)
	assert.Len(t, req.(DeviceLayoutRequest).Runs, LayoutChunkRuns)
}
