//go:build linux

package uffd

import (
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// TestClientGone: once the process that registered the memory has exited,
// its faults are gone and every resolution fails with ErrProcessGone. The
// fd stays valid, and poll reports nothing on it (no POLLHUP): a server
// learns of a client's exit some other way (its socket, a pidfd).
func TestClientGone(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: the helper handles kernel-mode faults with userfaultfd(2)")
	}
	h := startHelper(t, "faults", "2")
	f := h.f
	f.SetHandshaken(Feature(h.init["features"]), Ioctl(h.init["ioctls"]))
	h.proceed(t)
	m := waitMsg(t, f)
	require.Equal(t, EventPagefault, m.Event)
	require.NoError(t, h.cmd.Process.Kill())
	h.cmd.Wait()

	_, err := f.Copy(uintptr(m.Address), fill(pageSize, 1), 0)
	require.ErrorIs(t, err, ErrProcessGone)
	_, err = f.ZeroPage(uintptr(m.Address), uintptr(pageSize), false)
	require.ErrorIs(t, err, ErrProcessGone)
	pfd := []unix.PollFd{{Fd: int32(f.Fd()), Events: unix.POLLIN}}
	n, err := unix.Poll(pfd, 10)
	require.NoError(t, err)
	assert.Zero(t, n, "poll after the exit: revents %#x", pfd[0].Revents)
	requireNoMsg(t, f, 10*time.Millisecond)
	assert.True(t, isUserfaultfd(t, f.Fd()))
}
