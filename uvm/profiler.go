package uvm

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/softuvm/softuvm/internal/wire"
)

// ProfilerStart starts a trace of this session's managed memory, as
// cudaProfilerStart starts a profiler's capture and `uvm trace record`
// records: every fault, migration, prefetch, eviction, allocation and
// free from now on, and the kernels of device processes started while it
// records, in the format `uvm trace summary|export|plot FILE` read
// (docs/traces.md). The file is $UVM_TRACE if set (relative names are the
// working directory's), else PROGRAM.uvmtrace in the working directory;
// each later start after a stop records to FILE.2, FILE.3 and on. A
// program started with UVM_TRACE records from its first session already:
// then ProfilerStart changes nothing until ProfilerStop has ended that
// recording. Starting while recording is no error, as in CUDA. The server
// writes the file.
func (s *Session) ProfilerStart() error {
	name := os.Getenv(EnvTrace)
	if name == "" {
		name = filepath.Base(os.Args[0]) + ".uvmtrace"
	}
	path, err := filepath.Abs(name)
	if err != nil {
		return fmt.Errorf("%w: profiler start: the trace's path %s: %v", ErrInvalidValue, name, err)
	}
	return s.traceControl(wire.TraceControlRequest{Op: wire.TraceStart, Path: path}, "profiler start")
}

// ProfilerStop ends the trace ProfilerStart started (or UVM_TRACE's), as
// cudaProfilerStop: the file is complete when it returns. Stopping while
// not recording is no error.
func (s *Session) ProfilerStop() error {
	return s.traceControl(wire.TraceControlRequest{Op: wire.TraceStop}, "profiler stop")
}

func (s *Session) traceControl(tc wire.TraceControlRequest, what string) error {
	r, err := s.rpc.Request(wire.EncodeTraceControl(s.rpc.NextSeq(), tc), wire.MsgTraceControl)
	if err != nil {
		return err
	}
	return r.Done(what + " reply")
}
