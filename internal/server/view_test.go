package server

import (
	"io"
	"log"
	"os"
	"os/exec"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/softuvm/softuvm/internal/core"
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
