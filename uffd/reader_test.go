package uffd

import (
	"runtime"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// readerT starts a goroutine, locked to its thread, that serves faults on
// f with a Reader until stopped, resolving each with fill-byte copies.
func readerT(t *testing.T, f *FD, fillByte byte) (*Reader, chan Msg, chan error) {
	t.Helper()
	r, err := f.NewReader()
	require.NoError(t, err)
	got := make(chan Msg, 16)
	done := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		var msgs [4]Msg
		for {
			n, err := r.Read(msgs[:])
			if err != nil {
				done <- err
				return
			}
			for _, m := range msgs[:n] {
				got <- m
				if m.Event == EventPagefault {
					f.Copy(uintptr(m.Address)&^uintptr(pageSize-1), fill(pageSize, fillByte), 0)
				}
			}
		}
	}()
	return r, got, done
}

// TestReaderServesAndStops: a Reader blocked in read(2) receives a fault,
// and Stop interrupts it while it waits for the next one.
func TestReaderServesAndStops(t *testing.T) {
	f := handshakeT(t, FeatureThreadID)
	require.NoError(t, f.SetNonblock(false))
	mem := mmapAnon(t, 1)
	_, err := f.Register(addr(mem), uintptr(pageSize), RegisterMissing)
	require.NoError(t, err)

	r, got, done := readerT(t, f, 'R')
	fl, pr := kernelRead(t, f, mem)
	select {
	case m := <-got:
		assert.Equal(t, EventPagefault, m.Event)
		assert.Equal(t, uint64(addr(mem)), m.Address)
		assert.Equal(t, uint32(fl.tid), m.TID)
	case <-time.After(testTimeout):
		t.Fatal("the reader did not receive the fault")
	}
	n, err := fl.wait(t)
	require.NoError(t, err)
	assert.Equal(t, fill(pageSize, 'R'), readPipe(t, pr, n))

	// Now it waits in read(2) with nothing to come.
	time.Sleep(20 * time.Millisecond)
	select {
	case err := <-done:
		t.Fatalf("reader returned early: %v", err)
	default:
	}
	require.NoError(t, r.Stop(testTimeout))
	select {
	case err := <-done:
		assert.ErrorIs(t, err, ErrStopped)
	case <-time.After(testTimeout):
		t.Fatal("Stop returned but Read did not")
	}
}

// TestReaderStopBeforeRead: stopping a reader that never read is immediate.
func TestReaderStopBeforeRead(t *testing.T) {
	f := handshakeT(t, 0)
	r, err := f.NewReader()
	require.NoError(t, err)
	require.NoError(t, r.Stop(time.Second))
	var msgs [1]Msg
	n, err := r.Read(msgs[:])
	assert.Zero(t, n)
	assert.ErrorIs(t, err, ErrStopped)
}

// TestReaderNeedsBlockingFD: on a NonBlock fd the reader says why it
// cannot wait instead of spinning.
func TestReaderNeedsBlockingFD(t *testing.T) {
	f := handshakeT(t, 0)
	r, err := f.NewReader()
	require.NoError(t, err)
	var msgs [1]Msg
	_, err = r.Read(msgs[:])
	require.ErrorIs(t, err, ErrAgain)
	assert.Contains(t, err.Error(), "blocking userfaultfd")
}

// TestSetNonblock toggles O_NONBLOCK and a Poller accepts the fd again.
func TestSetNonblock(t *testing.T) {
	f := handshakeT(t, 0)
	require.NoError(t, f.SetNonblock(false))
	p, err := NewPoller()
	require.NoError(t, err)
	defer p.Close()
	require.ErrorIs(t, p.Add(f, 1), ErrInvalid, "a blocking fd is refused by the poller")
	require.NoError(t, f.SetNonblock(true))
	require.NoError(t, p.Add(f, 1))
}

// TestReaderAllocs: a read allocates nothing.
func TestReaderAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector moves stack buffers to the heap")
	}
	f := handshakeT(t, 0)
	r, err := f.NewReader()
	require.NoError(t, err)
	r.Stop(time.Second)
	var msgs [4]Msg
	assert.Zero(t, testing.AllocsPerRun(100, func() { r.Read(msgs[:]) }))
}
