package engine

import (
	"bytes"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/softuvm/softuvm/internal/config"
)

func TestCopyCalibration(t *testing.T) {
	c := calibrate(func() {})
	require.Empty(t, c.Err)
	assert.Positive(t, c.HostCopyGBps)
	assert.GreaterOrEqual(t, c.MemoryGBps, c.HostCopyGBps, "every CPU together moves at least what one does")
	assert.Positive(t, c.InstallGBps)
	assert.GreaterOrEqual(t, c.MigrationProducers, 1)
	assert.LessOrEqual(t, c.MigrationProducers, c.CPUs)
	assert.GreaterOrEqual(t, c.CopyProducers, 1)
	assert.LessOrEqual(t, c.CopyProducers, c.CPUs)
	assert.Len(t, c.CopyThreadsGBps, len(threadCounts(c.CPUs)))
	assert.Positive(t, c.BlockMovers)
	b, _ := json.Marshal(c)
	t.Logf("%s", b)
}

func TestCopyCalibrationIsKeptForLaterServers(t *testing.T) {
	path := filepath.Join(t.TempDir(), "copy-calibration.json")
	c := config.CopyCalibration{CPUs: 2, HostCopyGBps: 13, CopyProducers: 2, MigrationProducers: 1, BlockMovers: 2}
	storeCalibration(path, c)
	got, ok := loadCalibration(path)
	require.True(t, ok)
	assert.Equal(t, path, got.Kept)
	assert.Equal(t, "kept "+path, got.Source)
	got.Kept, got.Source = "", ""
	assert.Equal(t, c, got)

	// Another boot, machine or version of the calibration is measured
	// again; so is a damaged file.
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(path, bytes.Replace(b, []byte("boot="), []byte("boot=x"), 1), 0o600))
	_, ok = loadCalibration(path)
	assert.False(t, ok, "a calibration of another boot")
	require.NoError(t, os.WriteFile(path, b[:len(b)/2], 0o600))
	_, ok = loadCalibration(path)
	assert.False(t, ok, "half a file")
	_, ok = loadCalibration(filepath.Join(t.TempDir(), "none"))
	assert.False(t, ok)
}

// TestCalibrationDefaultsAtOnce: with nothing kept, every caller gets the
// defaults at once while the measurement runs; when it is done, it is
// swapped in and kept, and a later calibrator reads it without measuring.
func TestCalibrationDefaultsAtOnce(t *testing.T) {
	t.Setenv("XDG_RUNTIME_DIR", t.TempDir())
	t.Setenv(config.EnvCopyCalibration, "")
	path := calibrationPath()
	measured := config.CopyCalibration{CPUs: 2, HostCopyGBps: 13, CopyProducers: 2, MigrationProducers: 1, BlockMovers: 2, DirectBelow: math.MaxInt64}
	release := make(chan struct{})
	k := newCalibrator(path, func() config.CopyCalibration { <-release; return measured })

	// The measurement cannot be done: it waits for release. A get that
	// waits for it fails here instead of hanging.
	got := make(chan config.CopyCalibration, 1)
	go func() { got <- k.get() }()
	var c config.CopyCalibration
	select {
	case c = <-got:
	case <-time.After(10 * time.Second):
		close(release)
		t.Fatal("Calibration waits for the measurement")
	}
	assert.Equal(t, defaultCalibration(runtime.NumCPU(), "defaults (measuring in the background)"), c)
	assert.True(t, strings.HasPrefix(c.Source, "defaults"), c.Source)
	assert.GreaterOrEqual(t, c.CopyProducers, 1)
	assert.LessOrEqual(t, c.CopyProducers, min(2, runtime.NumCPU()))
	assert.Equal(t, 1, c.MigrationProducers)
	assert.GreaterOrEqual(t, c.BlockMovers, 1)
	select {
	case <-k.done:
		t.Fatal("done before the measurement")
	default:
	}
	_, err := os.Stat(path)
	assert.True(t, os.IsNotExist(err), "nothing kept before the measurement")

	close(release)
	<-k.done
	now := k.get()
	assert.Equal(t, "measured", now.Source)
	now.Source = ""
	assert.Equal(t, measured, now, "the measurement is swapped in")

	later := newCalibrator(path, func() config.CopyCalibration { t.Error("measured again"); return measured })
	now = later.get()
	assert.Equal(t, "kept "+path, now.Source)
	assert.Equal(t, measured.HostCopyGBps, now.HostCopyGBps)
	select {
	case <-later.done:
	default:
		t.Error("a kept calibration is done at once")
	}
}

// TestCalibrationFailedKeepsDefaults: a measurement that fails leaves the
// defaults in place, saying why, and keeps nothing.
func TestCalibrationFailedKeepsDefaults(t *testing.T) {
	t.Setenv(config.EnvCopyCalibration, "")
	path := filepath.Join(t.TempDir(), "copy-calibration.json")
	k := newCalibrator(path, func() config.CopyCalibration { return config.CopyCalibration{CPUs: 2, Err: "no memfd"} })
	k.get()
	<-k.done
	c := k.get()
	assert.Equal(t, "defaults (measuring failed: no memfd)", c.Source)
	assert.Equal(t, "no memfd", c.Err)
	assert.GreaterOrEqual(t, c.CopyProducers, 1)
	_, err := os.Stat(path)
	assert.True(t, os.IsNotExist(err))
}

// TestCalibrationRunsAtIdlePriority: the calibrating thread, the threads
// of its multi-thread measurements and its engines' producers run at
// SCHED_IDLE; the caller's thread does not.
func TestCalibrationRunsAtIdlePriority(t *testing.T) {
	t.Setenv(config.EnvCopyCalibration, "")
	policyOf := func(tid int) uint32 {
		a, err := unix.SchedGetAttr(tid, 0)
		require.NoError(t, err)
		return a.Policy
	}
	tids := make(chan int)
	release := make(chan struct{})
	k := newCalibrator(filepath.Join(t.TempDir(), "copy-calibration.json"), func() config.CopyCalibration {
		tids <- unix.Gettid()
		<-release
		return config.CopyCalibration{CPUs: 1, CopyProducers: 1, MigrationProducers: 1, BlockMovers: 1}
	})
	k.get()
	tid := <-tids
	assert.Equal(t, uint32(unix.SCHED_IDLE), policyOf(tid), "the calibrating thread")
	close(release)
	<-k.done

	threads := newIdleThreads(3)
	var mu sync.Mutex
	var seen []int
	threads.run(3, func(int) {
		mu.Lock()
		defer mu.Unlock()
		seen = append(seen, unix.Gettid())
		a, err := unix.SchedGetAttr(0, 0)
		if assert.NoError(t, err) {
			assert.Equal(t, uint32(unix.SCHED_IDLE), a.Policy, "a measurement thread")
		}
	})
	threads.stop()
	assert.Len(t, seen, 3)

	one := newIdleEngine(1) // its first job must not run on this thread
	one.stop()
	e := newIdleEngine(2)
	defer e.stop()
	var producers sync.Map
	_, err := e.Run(&CopyJob{Chunks: 16, Bytes: math.MaxInt64, Produce: func(int, []byte) error {
		a, err := unix.SchedGetAttr(0, 0)
		if err == nil {
			producers.Store(unix.Gettid(), a.Policy)
		}
		time.Sleep(time.Millisecond) // so that both producers take chunks
		return err
	}})
	require.NoError(t, err)
	n := 0
	producers.Range(func(_, policy any) bool {
		n++
		assert.Equal(t, uint32(unix.SCHED_IDLE), policy, "a producer of the calibration's engine")
		return true
	})
	assert.Positive(t, n)

	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	assert.NotEqual(t, uint32(unix.SCHED_IDLE), policyOf(unix.Gettid()), "no other thread is touched")
}

func TestDefaultCalibration(t *testing.T) {
	for _, cpus := range []int{1, 2, 16, 128} {
		c := defaultCalibration(cpus, "defaults (test)")
		assert.Equal(t, min(2, cpus), c.CopyProducers, "cpus %d", cpus)
		assert.Equal(t, map[int]int{1: 1, 2: 2, 16: 8, 128: 8}[cpus], c.BlockMovers, "cpus %d", cpus)
		assert.Equal(t, 1, c.MigrationProducers)
		assert.Equal(t, int64(math.MaxInt64), c.DirectBelow)
		assert.Zero(t, c.NonTemporalAbove)
		if cpus == 1 {
			assert.Equal(t, int64(math.MaxInt64), c.CopyDirectBelow)
		} else {
			assert.Equal(t, int64(2<<20), c.CopyDirectBelow)
		}
	}
}

func TestCPUTicks(t *testing.T) {
	busy, total, err := cpuTicks()
	require.NoError(t, err)
	assert.Positive(t, total)
	assert.LessOrEqual(t, busy, total)
}
