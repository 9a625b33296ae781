package uffd

import (
	"fmt"
	"os"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
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
	waitWchan(t, int(r.tid.Load()), "userfaultfd_read_iter")
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

// TestReaderAllocs: reading fault messages allocates nothing. The count
// is the whole process's, so other goroutines can only add to it: the
// least of three rounds is the reader's.
func TestReaderAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector moves stack buffers to the heap")
	}
	f := handshakeT(t, 0)
	require.NoError(t, f.SetNonblock(false))
	const pages = 8
	mem := mmapAnon(t, pages)
	_, err := f.Register(addr(mem), uintptr(len(mem)), RegisterMissing)
	require.NoError(t, err)
	r, err := f.NewReader()
	require.NoError(t, err)
	defer r.Stop(time.Second)
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	least := uint64(1 << 63)
	for round := 0; round < 3; round++ {
		// A fault per page, each a kernel read blocked until resolved;
		// the messages wait in the userfaultfd.
		var fls []*faulter
		for p := 0; p < pages; p++ {
			fl, _ := kernelRead(t, f, mem[p*pageSize:(p+1)*pageSize])
			fls = append(fls, fl)
		}
		waitPending(t, f, pages)
		var msgs [1]Msg
		var before, after runtime.MemStats
		procs := runtime.GOMAXPROCS(1) // as testing.AllocsPerRun: nobody else runs meanwhile
		runtime.ReadMemStats(&before)
		for got := 0; got < pages; {
			n, err := r.Read(msgs[:])
			require.NoError(t, err)
			got += n
		}
		runtime.ReadMemStats(&after)
		runtime.GOMAXPROCS(procs)
		least = min(least, after.Mallocs-before.Mallocs)
		_, err = f.ZeroPage(addr(mem), uintptr(len(mem)), false)
		require.NoError(t, err)
		for _, fl := range fls {
			_, err := fl.wait(t)
			require.NoError(t, err)
		}
		require.NoError(t, unix.Madvise(mem, unix.MADV_DONTNEED)) // holes again, for the next round
	}
	assert.Zero(t, least, "allocations while reading %d fault messages (the least of three rounds)", pages)
}

// waitWchan waits until thread tid of this process sleeps in the kernel
// function fn (its wchan).
func waitWchan(t testing.TB, tid int, fn string) {
	t.Helper()
	path := fmt.Sprintf("/proc/self/task/%d/wchan", tid)
	deadline := time.Now().Add(testTimeout)
	for {
		if b, _ := os.ReadFile(path); string(b) == fn {
			return
		}
		if time.Now().After(deadline) {
			b, _ := os.ReadFile(path)
			t.Fatalf("thread %d sleeps in %q, not %q", tid, b, fn)
		}
		time.Sleep(time.Millisecond)
	}
}

// waitPending waits until n fault messages wait in f, unread, as its
// fdinfo says.
func waitPending(t testing.TB, f *FD, n int) {
	t.Helper()
	path := fmt.Sprintf("/proc/self/fdinfo/%d", f.Fd())
	want := fmt.Sprintf("pending:\t%d\n", n)
	deadline := time.Now().Add(testTimeout)
	for {
		b, _ := os.ReadFile(path)
		if strings.Contains(string(b), want) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("want %q in %s:\n%s", want, path, b)
		}
		time.Sleep(time.Millisecond)
	}
}
