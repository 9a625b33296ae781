package wire

import (
	"fmt"
	"path/filepath"

	"github.com/softuvm/softuvm/internal/core"
)

// TraceControlRequest starts or stops recording the session's own events
// (the profiler API: uvmProfilerStart, uvmProfilerStop): TraceStart to
// the absolute Path (a later range, to Path.2 and on), TraceStop to end
// the recording and complete the file. Starting while recording, or
// stopping while not, changes nothing.
type TraceControlRequest struct {
	Op   uint8
	Path string // TraceStart's file; empty for TraceStop
}

// Trace control operations.
const (
	TraceStart = 1
	TraceStop  = 2
)

func init() {
	requestDecoders[MsgTraceControl] = func(r *WireReader) any {
		tc := TraceControlRequest{Op: r.u8("operation"), Path: r.Str("path")}
		switch {
		case r.err != nil:
		case tc.Op != TraceStart && tc.Op != TraceStop:
			r.err = fmt.Errorf("%w: trace control operation %d: want %d (start) or %d (stop)", core.ErrInvalidValue, tc.Op, TraceStart, TraceStop)
		case tc.Op == TraceStart && !filepath.IsAbs(tc.Path):
			r.err = fmt.Errorf("%w: trace start to %q: want an absolute path", core.ErrInvalidValue, tc.Path)
		}
		return tc
	}
}

func EncodeTraceControl(seq uint32, tc TraceControlRequest) []byte {
	w := NewMessage(Header{Typ: MsgTraceControl, Seq: seq})
	w.u8(tc.Op)
	w.str(tc.Path)
	return w.B
}
