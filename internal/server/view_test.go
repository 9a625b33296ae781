package server

import (
	"io"
	"log"
	"os"
	"os/exec"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/softuvm/softuvm/internal/core"
	"github.com/softuvm/softuvm/internal/device"
	"github.com/softuvm/softuvm/internal/wire"
	"github.com/softuvm/softuvm/uffd"
)

// TestAwaitExitedView: a device process's hello waits for the view of an
// exited predecessor to go (a DeviceReset then a launch, on a loaded
// machine, was refused with "already has a process"), and leaves alone
// the view of a process that lives.
func TestAwaitExitedView(t *testing.T) {
	exited := exec.Command("true")
	require.NoError(t, exited.Run()) // reaped: its pid is gone
	l := core.Device(0)
	sess := &session{srv: &Server{logger: log.New(io.Discard, "", 0)}, views: make([]atomic.Pointer[view], l.Slot()+1)}
	place := func(pid int) *view {
		u, err := uffd.Open(0)
		if err != nil {
			t.Skipf("no userfaultfd here: %v", err)
		}
		v := &view{sess: sess, loc: l, pid: pid, uffd: u, connDone: make(chan struct{})}
		sess.views[l.Slot()].Store(v)
		return v
	}

	// Its process exited and the reader saw the end, but has not
	// detached it yet: the hello detaches it (or waits for the reader's
	// detach) and finds the slot free.
	old := place(exited.Process.Pid)
	close(old.connDone)
	sess.awaitExitedView(l, time.Minute)
	assert.Nil(t, sess.views[l.Slot()].Load(), "the exited process's view is gone")
	assert.True(t, old.gone)

	// Its process exited and the reader has not seen the end yet: the
	// hello waits for it.
	old = place(exited.Process.Pid)
	done := make(chan struct{})
	go func() {
		sess.awaitExitedView(l, time.Minute)
		close(done)
	}()
	close(old.connDone)
	<-done
	assert.Nil(t, sess.views[l.Slot()].Load(), "the exited process's view is gone")

	// Its process exited and its connection never ends: the wait is
	// bounded, and the view stays (the hello is then refused).
	old = place(exited.Process.Pid)
	sess.awaitExitedView(l, 10*time.Millisecond)
	assert.Same(t, old, sess.views[l.Slot()].Load())
	close(old.connDone)
	sess.detach(old)

	// A live process's view stays, even with its connection ended: the
	// hello is refused, not let in beside it.
	live := place(os.Getpid())
	close(live.connDone)
	sess.awaitExitedView(l, time.Minute)
	assert.Same(t, live, sess.views[l.Slot()].Load(), "a live process keeps its view")
	assert.False(t, live.gone)
	sess.detach(live)
}

// TestOnlyTheAwaitedReplyIsDelivered: a device process's reply to a
// request of a server that died waits in the connection the guard kept,
// and is the first thing the server that took over reads there. It must
// not be delivered: it took the one place for replies, the reply to the
// new server's first request (read right after it) was dropped as
// unexpected, that request timed out after 10 s and the device process
// was hung up on (`uvm bench soak`, 2026-12-07).
func TestOnlyTheAwaitedReplyIsDelivered(t *testing.T) {
	srvEnd, devFile, err := wire.SocketPair("test-device")
	require.NoError(t, err)
	dev, err := device.FileConn(devFile.Fd())
	devFile.Close()
	require.NoError(t, err)
	var logged strings.Builder
	l := core.Device(0)
	sess := &session{srv: &Server{logger: log.New(&logged, "", 0)}, views: make([]atomic.Pointer[view], l.Slot()+1)}
	v := &view{sess: sess, loc: l, pid: os.Getpid(), uffd: uffd.NewFD(-1), conn: srvEnd, replies: make(chan []byte, 1), connDone: make(chan struct{})}
	v.seq.Store(1 << 24) // a view adopted by the first server to take over (adoptDevice)
	sess.views[l.Slot()].Store(v)
	reply := func(seq uint32) []byte { return wire.EncodeEmptyReply(wire.Header{Typ: wire.MsgDeviceMap, Seq: seq}) }

	// The decision, message by message.
	assert.False(t, v.deliver(reply(7)), "the dead server's reply, no request in flight")
	assert.Empty(t, v.replies)
	v.awaited.Store(1<<24 + 1)
	assert.False(t, v.deliver(reply(7)), "the dead server's reply, a request of this server in flight")
	assert.True(t, v.deliver(reply(1<<24+1)), "the reply awaited")
	assert.Len(t, v.replies, 1)
	<-v.replies
	v.awaited.Store(0)

	// Through the connection: the stale reply first, then a request
	// whose reply the device sends at once.
	go sess.readDeviceReplies(v)
	require.NoError(t, wire.WriteMessage(dev, reply(7), nil))
	go func() {
		buf := make([]byte, wire.MaxMessageSize)
		b, _, err := wire.ReadMessage(dev, buf)
		if err != nil {
			return
		}
		h, _, _ := wire.ParseHeader(b)
		wire.WriteMessage(dev, reply(h.Seq), nil)
	}()
	start := time.Now()
	err = v.request(wire.EncodeDeviceMap(v.seq.Add(1), wire.DeviceMapRequest{Addr: 1 << 30, Length: core.PageSize, File: core.CPU}), wire.MsgDeviceMap)
	assert.NoError(t, err)
	assert.Less(t, time.Since(start), deviceRequestTimeout/2, "answered, not timed out")
	dev.Close()
	<-v.connDone // the reader is done: the log is still
	assert.NotContains(t, logged.String(), "unexpected message")
}
