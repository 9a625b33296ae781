package uvm

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/softuvm/softuvm/trace"
)

// TestProfilerStartStop: ProfilerStart and ProfilerStop record the
// session's events between them, and only those, to UVM_TRACE's file (as
// the process reads it now; the server found no UVM_TRACE in the
// environment the process started with, so nothing recorded before); a
// second range goes to FILE.2.
func TestProfilerStartStop(t *testing.T) {
	s := newSession(t, testServerConfig())
	path := filepath.Join(t.TempDir(), "profiled.uvmtrace")
	t.Setenv(EnvTrace, path)
	const size = 2 << 20
	before, err := s.MallocManaged(size)
	require.NoError(t, err)
	require.NoError(t, before.Prefetch(0))
	require.NoError(t, s.ProfilerStop(), "stopping while nothing records is no error")
	_, err = os.Stat(path)
	require.True(t, os.IsNotExist(err), "nothing recorded yet")

	require.NoError(t, s.ProfilerStart())
	require.NoError(t, s.ProfilerStart(), "starting twice is no error")
	during, err := s.MallocManaged(size)
	require.NoError(t, err)
	fillBytes(during.Bytes(), 3) // on the host: the prefetch migrates every page
	require.NoError(t, during.Prefetch(0))
	require.NoError(t, during.Prefetch(CPU))
	require.NoError(t, s.Launch(0, nil, "nothing", 1, nil))
	require.NoError(t, s.DeviceSynchronize(0))
	require.NoError(t, s.ProfilerStop())

	after, err := s.MallocManaged(size)
	require.NoError(t, err)
	require.NoError(t, after.Prefetch(0))

	_, c := readTraceCounts(t, path)
	ranges := map[uint64]uint64{} // the recorded allocations: range number to address
	for _, e := range c.events {
		if e.Kind == trace.KindAlloc {
			ranges[e.Range] = e.Addr
		}
	}
	require.Len(t, ranges, 1, "one allocation in the range: %v", ranges)
	for _, addr := range ranges {
		assert.Equal(t, uint64(during.Addr()), addr, "the allocation made between start and stop")
	}
	const pages = size / PageSize
	assert.EqualValues(t, pages, c.byCause[[2]Device{CPU, 0}]["prefetch"], "the prefetch to the device, once: not the one before, nor after")
	assert.EqualValues(t, pages, c.byCause[[2]Device{0, CPU}]["prefetch"], "the prefetch back")
	assert.Equal(t, 1, c.kinds[trace.KindSession], "the recording's start")

	// A second range: FILE.2, the first left as it was.
	fi, err := os.Stat(path)
	require.NoError(t, err)
	require.NoError(t, s.ProfilerStart())
	require.NoError(t, after.Prefetch(CPU))
	require.NoError(t, s.ProfilerStop())
	_, c2 := readTraceCounts(t, path+".2")
	assert.EqualValues(t, pages, c2.byCause[[2]Device{0, CPU}]["prefetch"])
	fi2, err := os.Stat(path)
	require.NoError(t, err)
	assert.Equal(t, fi.ModTime(), fi2.ModTime(), "the first range's file is untouched")
}
