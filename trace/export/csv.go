package export

import (
	"encoding/csv"
	"errors"
	"fmt"
	"io"
	"strconv"

	"github.com/softuvm/softuvm/trace"
)

// Columns are the CSV export's columns, in order.
var Columns = []string{"kind", "time_ns", "pid", "thread", "processor", "from", "to", "range", "addr", "pages",
	"bytes", "fault_kind", "write", "prefetched", "cause", "duration_ns", "stream", "name"}

// column numbers, as in Columns.
const (
	cKind = iota
	cTime
	cPID
	cThread
	cProcessor
	cFrom
	cTo
	cRange
	cAddr
	cPages
	cBytes
	cFaultKind
	cWrite
	cPrefetched
	cCause
	cDuration
	cStream
	cName
	nColumns
)

// kindColumns lists the columns that mean something for each kind (as
// the trace package's Kind comments say), beyond kind and time_ns, so
// that a zero the kind does not have stays an empty cell rather than
// reading as a value. bytes is an allocation's length, and for the
// kinds that count pages, the pages' bytes.
var kindColumns = map[trace.Kind][]int{
	trace.KindFault:      {cPID, cThread, cProcessor, cRange, cAddr, cFaultKind, cWrite, cPrefetched, cDuration},
	trace.KindMigration:  {cPID, cFrom, cTo, cCause, cRange, cAddr, cPages, cBytes, cDuration},
	trace.KindEviction:   {cPID, cFrom, cRange, cAddr, cPages, cBytes},
	trace.KindPopulate:   {cPID, cTo, cRange, cAddr, cPages, cBytes},
	trace.KindRemoteMap:  {cPID, cProcessor, cRange, cAddr, cPages, cBytes},
	trace.KindDuplicate:  {cPID, cTo, cRange, cAddr, cPages, cBytes},
	trace.KindLaunch:     {cPID, cProcessor, cStream, cName},
	trace.KindSync:       {cPID, cProcessor, cStream, cDuration},
	trace.KindAlloc:      {cPID, cRange, cAddr, cBytes},
	trace.KindFree:       {cPID, cRange, cAddr},
	trace.KindSession:    {cPID, cName},
	trace.KindSessionEnd: {cPID},
	trace.KindArm:        {cPID, cProcessor, cRange, cAddr, cPages, cBytes},
	trace.KindAccess:     {cPID, cProcessor, cRange, cAddr, cPages, cBytes, cDuration},
	trace.KindDiscard:    {cPID, cRange, cAddr, cPages, cBytes},
	trace.KindProtect:    {cPID, cProcessor, cRange, cAddr, cPages, cBytes},
}

// CSV writes a header row naming Columns, then a row per event.
func CSV(w io.Writer, events []trace.Event) error {
	c := newCSV(w)
	for i := range events {
		c.row(&events[i])
	}
	return c.finish()
}

// CSVFrom writes the events r has left as CSV does, one at a time, and
// returns how many it wrote. When reading fails, the rows before the
// failure are written and the error is returned: for a trace cut short
// (its writer killed) it wraps io.ErrUnexpectedEOF.
func CSVFrom(w io.Writer, r *trace.Reader) (int, error) {
	c := newCSV(w)
	var e trace.Event
	n := 0
	for {
		err := r.Next(&e)
		if errors.Is(err, io.EOF) {
			return n, c.finish()
		}
		if err != nil {
			if ferr := c.finish(); ferr != nil {
				return n, ferr
			}
			return n, err
		}
		c.row(&e)
		n++
	}
}

type csvWriter struct {
	w   *csv.Writer
	rec []string
	err error
}

func newCSV(w io.Writer) *csvWriter {
	c := &csvWriter{w: csv.NewWriter(w), rec: make([]string, nColumns)}
	c.err = c.w.Write(Columns)
	return c
}

func (c *csvWriter) row(e *trace.Event) {
	if c.err != nil {
		return
	}
	clear(c.rec)
	c.rec[cKind] = e.Kind.String()
	c.rec[cTime] = strconv.FormatInt(int64(e.Time), 10)
	for _, col := range kindColumns[e.Kind] {
		c.rec[col] = field(e, col)
	}
	c.err = c.w.Write(c.rec)
}

func field(e *trace.Event, col int) string {
	switch col {
	case cPID:
		return strconv.FormatInt(int64(e.PID), 10)
	case cThread:
		return strconv.FormatInt(int64(e.Thread), 10)
	case cProcessor:
		return trace.ProcessorName(e.Processor)
	case cFrom:
		return trace.ProcessorName(e.From)
	case cTo:
		return trace.ProcessorName(e.To)
	case cRange:
		return strconv.FormatUint(e.Range, 10)
	case cAddr:
		return hex(e.Addr)
	case cPages:
		return strconv.FormatUint(uint64(e.Pages), 10)
	case cBytes:
		if e.Kind == trace.KindAlloc {
			return strconv.FormatUint(e.Bytes, 10)
		}
		return strconv.FormatUint(e.MovedBytes(), 10)
	case cFaultKind:
		return e.FaultKind.String()
	case cWrite:
		return strconv.FormatBool(e.Write)
	case cPrefetched:
		return strconv.FormatUint(uint64(e.Prefetched), 10)
	case cCause:
		return e.Cause.String()
	case cDuration:
		return strconv.FormatInt(int64(e.Duration), 10)
	case cStream:
		return strconv.FormatUint(e.Stream, 10)
	case cName:
		return e.Name
	}
	return ""
}

func (c *csvWriter) finish() error {
	if c.err == nil {
		c.w.Flush()
		c.err = c.w.Error()
	}
	if c.err != nil {
		return fmt.Errorf("csv export: %w", c.err)
	}
	return nil
}
