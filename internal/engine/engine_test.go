package engine

import (
	"errors"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/softuvm/softuvm/devmem"
)

// stageLog records what a job's stages did, from several goroutines.
type stageLog struct {
	mu                           sync.Mutex
	produced, released, restored []int
	installed                    []int
	releasedBeforeInstall        bool
	inFlight, maxInFlight        atomic.Int32
}

func TestCopyEngineRunsEveryStageOfEveryChunk(t *testing.T) {
	e := newCopyEngine(3, 0)
	defer e.stop()
	var l stageLog
	n, err := e.Run(l.job(100, -1))
	require.NoError(t, err)
	assert.Equal(t, 100, n)
	assert.ElementsMatch(t, seq(100), l.produced)
	assert.ElementsMatch(t, seq(100), l.released)
	assert.Equal(t, seq(100), l.installed, "installed in order")
	assert.True(t, l.releasedBeforeInstall, "every chunk's source released before it is installed")
	assert.Greater(t, l.maxInFlight.Load(), int32(1), "producers work on several chunks at once")
	assert.LessOrEqual(t, l.maxInFlight.Load(), int32(e.depth()), "no more chunks in flight than the queue holds")
}

func TestCopyEngineFailurePutsBackReleasedChunks(t *testing.T) {
	e := newCopyEngine(2, 0)
	defer e.stop()
	var l stageLog
	n, err := e.Run(l.job(50, 7))
	require.Error(t, err)
	assert.Equal(t, 7, n, "chunks installed before the failure")
	assert.Equal(t, seq(7), l.installed)
	// Every chunk released after 7 is put back; 7 itself is the install's
	// to put back, as transfer does.
	for _, i := range l.restored {
		assert.Greater(t, i, 7)
	}
	assert.Equal(t, len(l.released)-8, len(l.restored), "every released chunk is installed or put back")
	assert.Zero(t, l.inFlight.Load(), "every chunk produced was installed, failed or put back")
}

func TestCopyEngineProduceFailureStopsTheJob(t *testing.T) {
	e := newCopyEngine(2, 0)
	defer e.stop()
	var installed []int
	n, err := e.Run(&CopyJob{Chunks: 20, Bytes: 20 * ChunkBytes,
		Produce: func(i int, _ []byte) error {
			if i == 5 {
				return errors.New("read failed")
			}
			return nil
		},
		Install: func(i int, _ []byte) error { installed = append(installed, i); return nil },
	})
	assert.EqualError(t, err, "read failed")
	assert.Equal(t, 5, n)
	assert.Equal(t, seq(5), installed)
}

func TestCopyEngineDirectPathBelowItsSize(t *testing.T) {
	e := newCopyEngine(2, 1<<20)
	defer e.stop()
	caller := goroutineID()
	var others atomic.Int32
	job := &CopyJob{Chunks: 4, Bytes: 4 * (64 << 10), Produce: func(int, []byte) error {
		if goroutineID() != caller {
			others.Add(1)
		}
		return nil
	}}
	_, err := e.Run(job)
	require.NoError(t, err)
	assert.Zero(t, others.Load(), "a small job runs on its caller")
	job.Bytes = 4 << 20
	_, err = e.Run(job)
	require.NoError(t, err)
	assert.Positive(t, others.Load(), "a large one on the producers")
}

func TestCopyEngineStopLeavesNoGoroutines(t *testing.T) {
	before := runtime.NumGoroutine()
	e := newCopyEngine(4, 0)
	var l stageLog
	var wg sync.WaitGroup
	for range 3 { // jobs at once share the producers
		wg.Add(1)
		go func() {
			defer wg.Done()
			var l stageLog
			_, err := e.Run(l.job(40, -1))
			assert.NoError(t, err)
		}()
	}
	wg.Wait()
	assert.Greater(t, runtime.NumGoroutine(), before, "the engine's goroutines run")
	e.stop()
	// Polled here, not with assert.Eventually, whose own goroutine counts.
	for deadline := time.Now().Add(2 * time.Second); runtime.NumGoroutine() > before; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("goroutines left after stop: %d, were %d", runtime.NumGoroutine(), before)
		}
	}
	n, err := e.Run(l.job(10, -1))
	require.NoError(t, err, "a stopped engine still moves, on the caller's goroutine")
	assert.Equal(t, 10, n)
	assert.LessOrEqual(t, runtime.NumGoroutine(), before)
	e.stop() // twice is harmless
}

func TestProducersFor(t *testing.T) {
	for _, tc := range []struct {
		consumer, producer, memory float64
		cpus                       int
		want                       int
	}{
		{51, 12.6, 200, 16, 5}, // the H200's link against its host's memcpy
		{51, 12.6, 100, 16, 1}, // memory cannot feed more beside the link
		{2, 13, 40, 2, 1},      // this VM's migrations: the install is the slow stage
		{80, 6, 160, 16, 6},    // 80 + 2*6*6 <= 160 < 80 + 2*7*6
		{80, 6, 1000, 8, 8},    // no more than the CPUs
		{0, 6, 160, 8, 1},
	} {
		assert.Equal(t, tc.want, producersFor(tc.consumer, tc.producer, tc.memory, tc.cpus), "%+v", tc)
	}
}

func TestCopyProducersFor(t *testing.T) {
	assert.Equal(t, []int{1, 2}, threadCounts(2))
	assert.Equal(t, []int{1, 2, 4, 8, 16}, threadCounts(16))
	assert.Equal(t, []int{1, 2, 4, 6}, threadCounts(6))
	assert.Equal(t, []int{1}, threadCounts(1))
	assert.Equal(t, 2, copyProducersFor([]int{1, 2}, []float64{16, 25}), "this VM")
	assert.Equal(t, 16, copyProducersFor([]int{1, 2, 4, 8, 16}, []float64{8, 16, 30, 45, 56}), "the 16-core machine: 8 threads reach only 80%")
	assert.Equal(t, 1, copyProducersFor([]int{1, 2}, []float64{20, 21}), "memory saturated by one thread")
}

func TestBlockMoversFor(t *testing.T) {
	assert.Equal(t, 2, blockMoversFor(1.5, 41, 2), "this VM: the CPUs bound it")
	assert.Equal(t, 13, blockMoversFor(3, 80, 16), "80 / (2 * 3): memory bounds it")
	assert.Equal(t, 1, blockMoversFor(0, 80, 16))
	assert.Equal(t, 1, blockMoversFor(50, 80, 16), "at least one")
}

// goroutineID is the calling goroutine's number, from its stack header.
func goroutineID() string {
	var buf [64]byte
	b := buf[:runtime.Stack(buf[:], false)]
	b = b[len("goroutine "):]
	for i, c := range b {
		if c == ' ' {
			return string(b[:i])
		}
	}
	return string(b)
}

func seq(n int) []int {
	out := make([]int, n)
	for i := range out {
		out[i] = i
	}
	return out
}

func TestCopyEnginePinsProducersToTheDestinationNode(t *testing.T) {
	nodes, err := devmem.Nodes()
	require.NoError(t, err)
	engines := NewCopyEngines(2, 0)
	defer engines.Stop()
	for _, n := range nodes {
		if len(n.CPUs) > 0 {
			assert.Equal(t, n.CPUs, engines.ForNode(n.ID).cpus, "node %d's engine runs on its CPUs", n.ID)
		}
	}
	assert.Nil(t, engines.ForNode(-1).cpus, "no node: unpinned")
	assert.Same(t, engines.ForNode(-1), engines.ForNode(-1), "one engine per node")

	// The pinning itself, to a strict subset of the CPUs this process may
	// use (one node's CPUs are all of them on a machine of one node, where
	// an engine that pinned nothing would look right).
	allowed, err := devmem.AllowedCPUs()
	require.NoError(t, err)
	if len(allowed) < 2 {
		t.Skipf("one CPU allowed (%v): no strict subset to pin to", allowed)
	}
	e := newCopyEngine(2, 0)
	e.cpus = allowed[len(allowed)-1:]
	defer e.stop()
	var seen sync.Map
	_, err = e.Run(&CopyJob{Chunks: 8, Bytes: 8 * ChunkBytes, Produce: func(i int, _ []byte) error {
		cpus, err := devmem.AllowedCPUs()
		seen.Store(i, cpus)
		return err
	}})
	require.NoError(t, err)
	n := 0
	seen.Range(func(_, v any) bool {
		assert.Equal(t, e.cpus, v.([]int), "a producer runs on its engine's CPUs only")
		n++
		return true
	})
	assert.Equal(t, 8, n, "every chunk produced")
}

func (l *stageLog) job(chunks int, failInstallAt int) *CopyJob {
	l.releasedBeforeInstall = true
	released := make([]atomic.Bool, chunks)
	return &CopyJob{
		Chunks: chunks, Bytes: int64(chunks) * ChunkBytes, Staging: true,
		Produce: func(i int, buf []byte) error {
			n := l.inFlight.Add(1)
			for m := l.maxInFlight.Load(); n > m && !l.maxInFlight.CompareAndSwap(m, n); m = l.maxInFlight.Load() {
			}
			buf[0] = byte(i)
			time.Sleep(50 * time.Microsecond)
			l.mu.Lock()
			l.produced = append(l.produced, i)
			l.mu.Unlock()
			return nil
		},
		Release: func(i int, _ []byte) error {
			released[i].Store(true)
			l.mu.Lock()
			l.released = append(l.released, i)
			l.mu.Unlock()
			return nil
		},
		Install: func(i int, buf []byte) error {
			l.inFlight.Add(-1)
			if buf[0] != byte(i) {
				return errors.New("a chunk's buffer holds another chunk")
			}
			if !released[i].Load() {
				l.releasedBeforeInstall = false
			}
			if i == failInstallAt {
				return errors.New("install failed")
			}
			l.installed = append(l.installed, i)
			return nil
		},
		Restore: func(i int, buf []byte) {
			l.inFlight.Add(-1)
			l.mu.Lock()
			l.restored = append(l.restored, i)
			l.mu.Unlock()
		},
	}
}
