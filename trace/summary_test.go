package trace_test

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/softuvm/softuvm/trace"
)

// TestTraceSummaryAccessModeAndCutShort: the summary counts the access
// mode's rounds, armed and touched pages per processor as the events say
// (two CPU rounds of 10 + 6 armed pages, 4 of them touched; one device
// round of 8, none touched), and a trace whose end is missing is summed
// up to its last whole event, saying so.
func TestTraceSummaryAccessModeAndCutShort(t *testing.T) {
	path := filepath.Join(t.TempDir(), "a.uvmtrace")
	rec, err := trace.Create(path, trace.Header{AccessPeriod: 100 * time.Millisecond, AccessSample: 64 << 20})
	require.NoError(t, err)
	ms := time.Millisecond
	events := []trace.Event{
		{Kind: trace.KindArm, Time: 100 * ms, Processor: trace.CPU, Addr: 0x10000, Pages: 6},
		{Kind: trace.KindArm, Time: 100 * ms, Processor: trace.CPU, Addr: 0x20000, Pages: 4},
		{Kind: trace.KindArm, Time: 101 * ms, Processor: 0, Addr: 0x10000, Pages: 8},
		{Kind: trace.KindAccess, Time: 200 * ms, Duration: 100 * ms, Processor: trace.CPU, Addr: 0x10000, Pages: 3},
		{Kind: trace.KindAccess, Time: 200 * ms, Duration: 100 * ms, Processor: trace.CPU, Addr: 0x20000, Pages: 1},
		{Kind: trace.KindArm, Time: 200 * ms, Processor: trace.CPU, Addr: 0x10000, Pages: 6},
	}
	for i := range events {
		rec.Emit(&events[i])
	}
	require.NoError(t, rec.Close())

	s, err := trace.Summarize(path)
	require.NoError(t, err)
	require.Empty(t, s.CutShort)
	require.Equal(t, []trace.AccessSummary{
		{Processor: "cpu", Rounds: 2, Armed: 16, Accessed: 4, Touched: 0.25},
		{Processor: "device 0", Rounds: 1, Armed: 8},
	}, s.Access)
	require.Equal(t, 200*ms-100*ms, s.Span, "an access's window lies before its time")

	// Without its end record and the last event's last byte.
	whole, err := os.ReadFile(path)
	require.NoError(t, err)
	_, all, err := trace.ReadFile(path)
	require.NoError(t, err)
	require.Len(t, all, len(events))
	cut := filepath.Join(t.TempDir(), "cut.uvmtrace")
	for n := len(whole) - 1; n > 0; n-- {
		require.NoError(t, os.WriteFile(cut, whole[:n], 0o644))
		if s, err = trace.Summarize(cut); err == nil && s.Events < uint64(len(events)) {
			break
		}
	}
	require.NoError(t, err)
	require.EqualValues(t, len(events)-1, s.Events, "every whole event before the cut")
	require.NotEmpty(t, s.CutShort)
}
