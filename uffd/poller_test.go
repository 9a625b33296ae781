//go:build linux

package uffd

import (
	"runtime"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func pollerT(t testing.TB) *Poller {
	t.Helper()
	p, err := NewPoller()
	require.NoError(t, err)
	t.Cleanup(func() { p.Close() })
	return p
}

// pendingFault registers a page on f and leaves a kernel-mode read fault
// pending on it; resolve serves it.
func pendingFault(t *testing.T, f *FD) (resolve func()) {
	t.Helper()
	mem := mmapAnon(t, 1)
	_, err := f.Register(addr(mem), uintptr(pageSize), RegisterMissing)
	require.NoError(t, err)
	fl, r := kernelRead(t, f, mem)
	return func() {
		_, err := f.ZeroPage(addr(mem), uintptr(pageSize), false)
		require.NoError(t, err)
		_, err = fl.wait(t)
		require.NoError(t, err)
		readPipe(t, r, pageSize)
	}
}

func TestPollerPendingFault(t *testing.T) {
	p := pollerT(t)
	f := handshakeT(t, 0)
	g := handshakeT(t, 0)
	const keyF, keyG = 0xdeadbeef_00000001, 7 // high bits survive the epoll data
	require.NoError(t, p.Add(f, keyF))
	require.NoError(t, p.Add(g, keyG))

	keys, woken, err := p.Wait(nil, 0)
	require.NoError(t, err)
	assert.False(t, woken)
	assert.Empty(t, keys, "nothing pending")

	resolve := pendingFault(t, f)
	keys, woken, err = p.Wait(keys, testTimeout)
	require.NoError(t, err)
	assert.False(t, woken)
	assert.Equal(t, []uint64{keyF}, keys)

	// Level-triggered: still ready until the message is read.
	keys, _, err = p.Wait(keys, 0)
	require.NoError(t, err)
	assert.Equal(t, []uint64{keyF}, keys)

	var msgs [4]Msg
	n, err := f.ReadMessages(msgs[:])
	require.NoError(t, err)
	require.Equal(t, 1, n)
	assert.Equal(t, EventPagefault, msgs[0].Event)
	keys, _, err = p.Wait(keys, 0)
	require.NoError(t, err)
	assert.Empty(t, keys, "read, so no longer ready")
	resolve()
}

// TestPollerShared: several Pollers holding one FD are all woken; the
// first reader gets the message and the others read nothing.
func TestPollerShared(t *testing.T) {
	f := handshakeT(t, 0)
	p1, p2 := pollerT(t), pollerT(t)
	require.NoError(t, p1.Add(f, 1))
	require.NoError(t, p2.Add(f, 2))
	resolve := pendingFault(t, f)
	k1, _, err := p1.Wait(nil, testTimeout)
	require.NoError(t, err)
	k2, _, err := p2.Wait(nil, testTimeout)
	require.NoError(t, err)
	assert.Equal(t, []uint64{1}, k1)
	assert.Equal(t, []uint64{2}, k2)
	var msgs [1]Msg
	n1, err := f.ReadMessages(msgs[:])
	require.NoError(t, err)
	n2, err := f.ReadMessages(msgs[:])
	require.NoError(t, err)
	assert.Equal(t, 1, n1, "the first reader wins")
	assert.Equal(t, 0, n2, "the second reads nothing and does not block")
	resolve()
}

func TestPollerWakeup(t *testing.T) {
	p := pollerT(t)
	done := make(chan bool)
	tid := make(chan int, 1)
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		tid <- unix.Gettid()
		keys, woken, err := p.Wait(nil, -1)
		assert.NoError(t, err)
		assert.Empty(t, keys)
		done <- woken
	}()
	waitWchan(t, <-tid, "do_epoll_wait") // Wait is blocked in epoll_wait
	require.NoError(t, p.Wakeup())
	select {
	case woken := <-done:
		assert.True(t, woken)
	case <-time.After(testTimeout):
		t.Fatal("Wakeup did not break Wait")
	}

	// A Wakeup with nobody waiting is seen by the next Wait, once.
	require.NoError(t, p.Wakeup())
	require.NoError(t, p.Wakeup())
	_, woken, err := p.Wait(nil, testTimeout)
	require.NoError(t, err)
	assert.True(t, woken)
	_, woken, err = p.Wait(nil, 0)
	require.NoError(t, err)
	assert.False(t, woken, "the wakeup was consumed")
}

func TestPollerTimeout(t *testing.T) {
	p := pollerT(t)
	start := time.Now()
	keys, woken, err := p.Wait(make([]uint64, 3), 30*time.Millisecond)
	require.NoError(t, err)
	assert.GreaterOrEqual(t, time.Since(start), 30*time.Millisecond)
	assert.False(t, woken)
	assert.Empty(t, keys, "keys[:0]")
	// A sub-millisecond timeout still waits rather than spinning.
	start = time.Now()
	_, _, err = p.Wait(nil, time.Microsecond)
	require.NoError(t, err)
	assert.GreaterOrEqual(t, time.Since(start), time.Microsecond)
}

func TestPollerRemove(t *testing.T) {
	p := pollerT(t)
	f := handshakeT(t, 0)
	require.NoError(t, p.Add(f, 3))
	resolve := pendingFault(t, f)
	keys, _, err := p.Wait(nil, testTimeout)
	require.NoError(t, err)
	require.Equal(t, []uint64{3}, keys)
	require.NoError(t, p.Remove(f))
	keys, _, err = p.Wait(keys, 20*time.Millisecond)
	require.NoError(t, err)
	assert.Empty(t, keys, "removed")
	require.Error(t, p.Remove(f), "removing twice")
	require.NoError(t, p.Add(f, 4))
	keys, _, err = p.Wait(keys, testTimeout)
	require.NoError(t, err)
	assert.Equal(t, []uint64{4}, keys)
	require.ErrorIs(t, p.Add(f, 5), ErrExist, "adding twice")
	resolve()
}

func TestPollerRefuses(t *testing.T) {
	p := pollerT(t)
	blocking := openT(t, CloseOnExec)
	_, err := blocking.Handshake(0)
	require.NoError(t, err)
	err = p.Add(blocking, 1)
	require.ErrorIs(t, err, ErrInvalid)
	assert.Contains(t, err.Error(), "open it with NonBlock")

	f := handshakeT(t, 0)
	err = p.Add(f, WakeupKey)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "reserved")
}

func TestPollerClose(t *testing.T) {
	f := handshakeT(t, 0)
	p, err := NewPoller()
	require.NoError(t, err)
	require.NoError(t, p.Add(f, 1))
	require.NoError(t, p.Close())
	require.NoError(t, p.Close(), "a second Close")
	_, _, err = p.Wait(nil, 0)
	require.Error(t, err)
	require.Error(t, p.Add(f, 2))
	// The FD outlives the Poller.
	_, err = f.ZeroPage(0, 0, false)
	require.ErrorIs(t, err, ErrInvalid, "the fd is still open (EINVAL, not EBADF)")
}
