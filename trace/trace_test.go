package trace

import (
	"bytes"
	"compress/gzip"
	"encoding/binary"
	"errors"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// randomEvent makes an event of kind k with every field of its kind set
// from rng, and the others zero, as a reader returns it.
func randomEvent(rng *rand.Rand, k Kind, at time.Duration) Event {
	e := Event{Kind: k, Time: at}
	for _, f := range fields[k] {
		switch f {
		case fPID:
			e.PID = rng.Int32()
		case fThread:
			e.Thread = rng.Int32()
		case fProcessor:
			e.Processor = rng.Int32N(40) - 1
		case fFrom:
			e.From = rng.Int32N(40) - 1
		case fTo:
			e.To = rng.Int32N(40) - 1
		case fRange:
			e.Range = rng.Uint64()
		case fAddr:
			e.Addr = rng.Uint64() &^ 0xfff
		case fPages:
			e.Pages = rng.Uint32()
		case fBytes:
			e.Bytes = rng.Uint64()
		case fFaultFlags:
			e.FaultKind, e.Write = FaultKind(rng.IntN(3)), rng.IntN(2) == 1
		case fPrefetched:
			e.Prefetched = rng.Uint32()
		case fCause:
			e.Cause = Cause(1 + rng.IntN(6))
		case fDuration:
			e.Duration = time.Duration(rng.Int64N(int64(time.Hour)))
		case fStream:
			e.Stream = rng.Uint64()
		case fName:
			e.Name = string(rune('a'+rng.IntN(26))) + "kernel\x00é"
		}
	}
	return e
}

func TestRoundTripEveryKindAndField(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	var buf bytes.Buffer
	w, err := NewRecorder(&buf, Header{Devices: 2, Command: []string{"prog", "arg"}, Policies: map[string]string{"eviction": "lru"}})
	require.NoError(t, err)
	var want []Event
	at := time.Duration(0)
	for i := 0; i < 5000; i++ {
		// Times go backwards now and then, as racing threads hand
		// events over out of order.
		at += time.Duration(rng.Int64N(2000)) - 300
		e := randomEvent(rng, Kinds()[rng.IntN(len(Kinds()))], max(at, 1))
		want = append(want, e)
		w.Emit(&e)
	}
	require.NoError(t, w.Close())
	events, dropped := w.Counts()
	assert.EqualValues(t, len(want), events)
	assert.Zero(t, dropped)

	r, err := NewReader(&buf)
	require.NoError(t, err)
	assert.Equal(t, 2, r.Header().Devices)
	assert.Equal(t, []string{"prog", "arg"}, r.Header().Command)
	assert.Equal(t, "lru", r.Header().Policies["eviction"])
	assert.Equal(t, PageSize, r.Header().PageSize)
	var got []Event
	for {
		var e Event
		err := r.Next(&e)
		if errors.Is(err, io.EOF) {
			break
		}
		require.NoError(t, err)
		got = append(got, e)
	}
	require.Equal(t, len(want), len(got))
	for i := range want {
		require.Equal(t, want[i], got[i], "event %d", i)
	}
	assert.Zero(t, r.Dropped())
}

func TestEmptyTraceAndFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "t.uvmtrace")
	w, err := Create(path, Header{Scope: "server"})
	require.NoError(t, err)
	require.NoError(t, w.Close())
	h, events, err := ReadFile(path)
	require.NoError(t, err)
	assert.Empty(t, events)
	assert.Equal(t, "server", h.Scope)
	assert.False(t, h.Started.IsZero())
}

func TestCutShortTraceReadsWholeEventsThenSaysSo(t *testing.T) {
	var buf bytes.Buffer
	w, err := NewRecorder(&buf, Header{})
	require.NoError(t, err)
	e := Event{Kind: KindFault, Time: 5, PID: 7, Addr: 0x1000, Duration: 3000}
	w.Emit(&e)
	e2 := Event{Kind: KindMigration, Time: 9, From: -1, To: 0, Pages: 16, Cause: CauseEviction}
	w.Emit(&e2)
	require.NoError(t, w.Close())
	data := buf.Bytes()
	// Cut inside the second record: the first still reads.
	cut := data[:len(data)-6]
	r, err := NewReader(bytes.NewReader(cut))
	require.NoError(t, err)
	var got Event
	require.NoError(t, r.Next(&got))
	assert.Equal(t, e, got)
	err = r.Next(&got)
	require.ErrorIs(t, err, io.ErrUnexpectedEOF)

	_, err = NewReader(bytes.NewReader([]byte("not a trace at all")))
	require.ErrorContains(t, err, "not a softuvm trace")
}

func TestEmitAfterCloseIsIgnoredAndTimeDefaultsToNow(t *testing.T) {
	var buf bytes.Buffer
	w, err := NewRecorder(&buf, Header{})
	require.NoError(t, err)
	e := Event{Kind: KindSession, PID: 1, Name: "x"}
	w.Emit(&e)
	assert.Positive(t, e.Time, "Emit fills in the time")
	require.NoError(t, w.Close())
	late := Event{Kind: KindSessionEnd, PID: 1}
	w.Emit(&late)
	n, _ := w.Counts()
	assert.EqualValues(t, 1, n)
}

func BenchmarkEmitFault(b *testing.B) {
	w, err := NewRecorder(io.Discard, Header{})
	require.NoError(b, err)
	defer w.Close()
	e := Event{Kind: KindFault, PID: 1234, Thread: 1240, Processor: -1, Range: 3, Addr: 0x7f0000123000, Duration: 12 * time.Microsecond, Prefetched: 15}
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		e.Time = time.Duration(i) * time.Microsecond
		e.Addr += 4096
		w.Emit(&e)
	}
}

// TestGzippedTraceReads: a trace compressed with gzip (as the lab ships
// them) reads as the plain one, header and events.
func TestGzippedTraceReads(t *testing.T) {
	var plain bytes.Buffer
	w, err := NewRecorder(&plain, Header{Devices: 1, LargeFolios: true})
	require.NoError(t, err)
	want := []Event{
		{Kind: KindFault, Time: 5, Processor: CPU, Range: 1, Addr: 0x7000, Write: true},
		{Kind: KindMigration, Time: 9, From: CPU, To: 0, Range: 1, Addr: 0x8000, Pages: 16, Cause: CauseEviction},
	}
	for i := range want {
		w.Emit(&want[i])
	}
	require.NoError(t, w.Close())
	path := filepath.Join(t.TempDir(), "t.uvmtrace.gz")
	f, err := os.Create(path)
	require.NoError(t, err)
	zw := gzip.NewWriter(f)
	_, err = zw.Write(plain.Bytes())
	require.NoError(t, err)
	require.NoError(t, zw.Close())
	require.NoError(t, f.Close())

	h, got, err := ReadFile(path)
	require.NoError(t, err)
	assert.Equal(t, 1, h.Devices)
	assert.True(t, h.LargeFolios)
	assert.Equal(t, want, got)
}

// TestVersion2TraceReads: a trace written by version 2 (populate without
// its cause, launch without its duration) reads, those fields 0, and the
// records after them in place.
func TestVersion2TraceReads(t *testing.T) {
	events := []Event{
		{Kind: KindPopulate, Time: 10, PID: 7, To: -1, Range: 1, Addr: 0x1000, Pages: 3},
		{Kind: KindLaunch, Time: 20, PID: 7, Processor: 0, Stream: 2, Name: "k"},
		{Kind: KindFault, Time: 30, PID: 7, Processor: -1, Range: 1, Addr: 0x5000, Write: true, Duration: 4},
	}
	buf := append([]byte(magic), binary.AppendUvarint(nil, 2)...)
	buf = binary.AppendUvarint(buf, 2)
	buf = append(buf, "{}"...)
	var prev time.Duration
	for i := range events {
		// Write each record as version 2 did: its old field list.
		saved := fields[events[i].Kind]
		if old, ok := fieldsBefore3[events[i].Kind]; ok {
			fields[events[i].Kind] = old
		}
		buf = appendEvent(buf, &events[i], prev, 0)
		fields[events[i].Kind] = saved
		prev = events[i].Time
	}
	buf = appendEvent(buf, &Event{Kind: kindEnd, Time: prev}, prev, 0)

	r, err := NewReader(bytes.NewReader(buf))
	require.NoError(t, err)
	var got []Event
	for {
		var e Event
		if err := r.Next(&e); errors.Is(err, io.EOF) {
			break
		} else {
			require.NoError(t, err)
		}
		got = append(got, e)
	}
	assert.Equal(t, events, got)
}
