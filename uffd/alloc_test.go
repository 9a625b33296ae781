//go:build linux

package uffd

import (
	"errors"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The fault path must not allocate: these tests measure it with
// testing.AllocsPerRun, which counts the allocations of the whole process.

func skipIfRace(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation counts are meaningless under the race detector, which moves stack buffers to the heap")
	}
}

func TestReadMessagesNoAlloc(t *testing.T) {
	skipIfRace(t)
	f := handshakeT(t, 0)
	msgs := make([]Msg, 8)
	var failure error
	allocs := testing.AllocsPerRun(100, func() {
		if n, err := f.ReadMessages(msgs); n != 0 || err != nil {
			failure = errors.New("unexpected message or error")
		}
	})
	require.NoError(t, failure)
	assert.Zero(t, allocs, "ReadMessages with nothing pending")
	allocs = testing.AllocsPerRun(100, func() {
		if n, err := f.ReadMessagesNoWait(msgs); n != 0 || err != nil {
			failure = errors.New("unexpected message or error")
		}
	})
	require.NoError(t, failure)
	assert.Zero(t, allocs, "ReadMessagesNoWait with nothing pending")
}

func TestPollerWaitNoAlloc(t *testing.T) {
	skipIfRace(t)
	p := pollerT(t)
	f := handshakeT(t, 0)
	require.NoError(t, p.Add(f, 1))
	keys := make([]uint64, 0, 8)
	var failure error
	allocs := testing.AllocsPerRun(100, func() {
		if err := p.Wakeup(); err != nil {
			failure = err
		}
		var woken bool
		var err error
		keys, woken, err = p.Wait(keys, time.Second)
		if err != nil || !woken || len(keys) != 0 {
			failure = errors.New("Wait did not report the wakeup alone")
		}
	})
	require.NoError(t, failure)
	assert.Zero(t, allocs, "Wakeup and Wait")
}

// faultServer is the steady-state loop of a fault server: wait for a
// client, read its messages, resolve each with Copy.
type faultServer struct {
	p      *Poller
	f      *FD
	keys   []uint64
	msgs   []Msg
	page   []byte
	served int
	err    error
}

func newFaultServer(t testing.TB, h *helperProc) *faultServer {
	t.Helper()
	h.f.SetHandshaken(Feature(h.init["features"]), Ioctl(h.init["ioctls"]))
	s := &faultServer{p: pollerT(t), f: h.f, keys: make([]uint64, 0, 4), msgs: make([]Msg, 4), page: fill(pageSize, 1)}
	require.NoError(t, s.p.Add(s.f, 1))
	return s
}

// serveOne serves at least one fault; it stops at the first error.
func (s *faultServer) serveOne() {
	for s.err == nil {
		var err error
		if s.keys, _, err = s.p.Wait(s.keys, testTimeout); err != nil {
			s.err = err
			return
		}
		if len(s.keys) == 0 {
			s.err = errors.New("no fault within the timeout")
			return
		}
		n, err := s.f.ReadMessages(s.msgs)
		if err != nil {
			s.err = err
			return
		}
		for _, m := range s.msgs[:n] {
			if _, err := s.f.Copy(uintptr(m.Address), s.page, 0); err != nil {
				s.err = err
				return
			}
			s.served++
		}
		if n > 0 {
			return
		}
	}
}

// TestServeFaultsNoAlloc serves the faults of a client process (the C
// helper reads page after page) and checks the loop allocates nothing.
func TestServeFaultsNoAlloc(t *testing.T) {
	skipIfRace(t)
	if os.Geteuid() != 0 {
		t.Skip("needs root: the helper handles kernel-mode faults with userfaultfd(2)")
	}
	const runs = 50
	h := startHelper(t, "faults", strconv.Itoa(runs+1))
	s := newFaultServer(t, h)
	h.proceed(t)
	allocs := testing.AllocsPerRun(runs, s.serveOne) // runs+1 calls
	require.NoError(t, s.err)
	assert.Equal(t, runs+1, s.served)
	assert.Equal(t, uint64(runs+1), h.expect(t, "done")["sum"], "the client read every copied page")
	h.exit(t)
	assert.Zero(t, allocs, "Wait, ReadMessages and Copy per fault")
}

// BenchmarkServeFault measures a fault served for another process, end to
// end, and reports the time the server spends in ReadMessages and Copy.
func BenchmarkServeFault(b *testing.B) {
	if os.Geteuid() != 0 {
		b.Skip("needs root: the helper handles kernel-mode faults with userfaultfd(2)")
	}
	h := startHelper(b, "faults", strconv.Itoa(b.N))
	s := newFaultServer(b, h)
	var read, cp time.Duration
	b.ReportAllocs()
	b.ResetTimer()
	h.proceed(b)
	for s.served < b.N {
		var err error
		if s.keys, _, err = s.p.Wait(s.keys, testTimeout); err != nil || len(s.keys) == 0 {
			b.Fatal("wait:", err)
		}
		t0 := time.Now()
		n, err := s.f.ReadMessages(s.msgs)
		t1 := time.Now()
		require.NoError(b, err)
		for _, m := range s.msgs[:n] {
			_, err := s.f.Copy(uintptr(m.Address), s.page, 0)
			require.NoError(b, err)
			s.served++
		}
		read += t1.Sub(t0)
		cp += time.Since(t1)
	}
	b.StopTimer()
	b.ReportMetric(float64(read.Nanoseconds())/float64(b.N), "read-ns/fault")
	b.ReportMetric(float64(cp.Nanoseconds())/float64(b.N), "copy-ns/fault")
	h.expect(b, "done")
	h.exit(b)
}

func BenchmarkDecodeMsg(b *testing.B) {
	raw := put32(rawMsg(0x12, 1, 0x7f0000001000), 24, 42)
	var m Msg
	for b.Loop() {
		m = Msg{}
		if err := decodeMsg(&m, (*[MsgSize]byte)(raw)); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkReadMessagesEmpty(b *testing.B) {
	f := handshakeT(b, 0)
	msgs := make([]Msg, 16)
	b.ReportAllocs()
	for b.Loop() {
		f.ReadMessages(msgs)
	}
}
