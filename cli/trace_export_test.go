package cli

import (
	"bytes"
	"encoding/csv"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/softuvm/softuvm/trace"
)

func writeTestTrace(t *testing.T, path string) {
	w, err := trace.Create(path, trace.Header{Devices: 1})
	require.NoError(t, err)
	for _, e := range []trace.Event{
		{Kind: trace.KindFault, Time: 1500, PID: 7, Thread: 8, Processor: trace.CPU, Range: 1, Addr: 0x7f0000001000, Duration: 2000},
		{Kind: trace.KindMigration, Time: 1800, PID: 7, From: 0, To: trace.CPU, Cause: trace.CauseFault, Range: 1, Addr: 0x7f0000000000, Pages: 4, Duration: 500},
		{Kind: trace.KindLaunch, Time: 4000, PID: 7, Processor: 0, Name: "k"},
	} {
		w.Emit(&e)
	}
	require.NoError(t, w.Close())
}

func TestTraceExport(t *testing.T) {
	dir := t.TempDir()
	src := filepath.Join(dir, "run.uvmtrace")
	writeTestTrace(t, src)

	var stdout, stderr bytes.Buffer
	require.NoError(t, traceExport([]string{src}, &stdout, &stderr))
	data, err := os.ReadFile(filepath.Join(dir, "run.json"))
	require.NoError(t, err, "perfetto by default, beside the trace")
	var doc struct {
		TraceEvents []map[string]any `json:"traceEvents"`
	}
	require.NoError(t, json.Unmarshal(data, &doc))
	assert.NotEmpty(t, doc.TraceEvents)
	assert.Contains(t, stderr.String(), "3 events to "+filepath.Join(dir, "run.json"))
	assert.Empty(t, stdout.String())

	// The operand before the flags, and CSV to standard output.
	stdout.Reset()
	stderr.Reset()
	require.NoError(t, traceExport([]string{src, "--format", "csv", "--out", "-"}, &stdout, &stderr))
	rows, err := csv.NewReader(&stdout).ReadAll()
	require.NoError(t, err)
	assert.Len(t, rows, 4)
	assert.Equal(t, "launch", rows[3][0])
	assert.Contains(t, stderr.String(), "3 events to standard output (csv,")

	require.NoError(t, traceExport([]string{"--format=csv", src}, &stdout, &stderr))
	assert.FileExists(t, filepath.Join(dir, "run.csv"))
}

func TestTraceExportErrors(t *testing.T) {
	dir := t.TempDir()
	src := filepath.Join(dir, "run.uvmtrace")
	writeTestTrace(t, src)
	var stdout, stderr bytes.Buffer

	err := traceExport([]string{"--format", "xml", src}, &stdout, &stderr)
	require.ErrorContains(t, err, `--format "xml": want perfetto or csv`)

	stderr.Reset()
	err = traceExport([]string{"--format", "csv"}, &stdout, &stderr)
	require.ErrorIs(t, err, errUsage)
	assert.Contains(t, stderr.String(), "missing the TRACE argument")

	err = traceExport([]string{src, src}, &stdout, &stderr)
	require.ErrorIs(t, err, errUsage)

	err = traceExport([]string{filepath.Join(dir, "nothing.uvmtrace")}, &stdout, &stderr)
	require.ErrorContains(t, err, "nothing.uvmtrace")
	require.ErrorIs(t, err, os.ErrNotExist)
	assert.NoFileExists(t, filepath.Join(dir, "nothing.json"), "no output for a trace that cannot be read")

	notTrace := filepath.Join(dir, "notes.txt")
	require.NoError(t, os.WriteFile(notTrace, []byte("hello"), 0o644))
	err = traceExport([]string{notTrace}, &stdout, &stderr)
	require.ErrorContains(t, err, "not a softuvm trace")

	err = traceExport([]string{"--out", src, src}, &stdout, &stderr)
	require.ErrorContains(t, err, "is the trace itself")
	_, _, err = trace.ReadFile(src)
	require.NoError(t, err, "the trace is untouched")
}
