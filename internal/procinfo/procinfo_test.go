package procinfo

import (
	"os"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/softuvm/softuvm/devmem"
)

func TestParseStatCPU(t *testing.T) {
	line := "4242 (a (weird) name) S 1 4242 4242 0 -1 4194560 100 0 0 0 5 3 0 0 20 0 1 0 12345 1000000 100 18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 0 17 7 0 0 0 0 0 0 0 0 0 0 0 0 0\n"
	cpu, err := parseStatCPU([]byte(line))
	require.NoError(t, err)
	assert.Equal(t, 7, cpu)
	_, err = parseStatCPU([]byte("4242 (short) S 1 2 3"))
	assert.ErrorContains(t, err, "fields after the command")
	_, err = parseStatCPU([]byte("no command"))
	assert.ErrorContains(t, err, "without a command name")
}

// TestThreadCPU reads this thread's CPU from /proc while pinned to each
// CPU in turn, twice around, through the one stat file the reader
// keeps open: each read must see where the thread is now. A thread that
// has exited reads as an error, and its file is let go.
func TestThreadCPU(t *testing.T) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	cpus, err := devmem.OnlineCPUs()
	require.NoError(t, err)
	p := NewThreadCPUs()
	defer p.Close()
	tid := uint32(syscall.Gettid())
	for range 2 {
		for _, c := range cpus {
			require.NoError(t, devmem.PinCurrentThread(c))
			got, err := p.Read(os.Getpid(), tid)
			require.NoError(t, err)
			assert.Equal(t, c, got)
		}
	}
	assert.Len(t, p.files, 1, "one file kept for the thread")

	// A goroutine that ends locked to its thread ends the thread, but
	// for the process's main thread, which the runtime parks for good
	// instead: a goroutine that ran there is tried again, on another.
	var other uint32
	for other == 0 || other == uint32(os.Getpid()) {
		gone := make(chan uint32)
		go func() {
			runtime.LockOSThread() // never unlocked: the thread exits with the goroutine
			tid := uint32(syscall.Gettid())
			_, err := p.Read(os.Getpid(), tid)
			assert.NoError(t, err)
			gone <- tid
		}()
		other = <-gone
	}
	// The runtime ends the thread once the goroutine is gone, as soon as
	// the scheduler gets to it: the task's directory going is the event,
	// and the test's own deadline bounds the wait.
	for {
		_, err := os.Stat("/proc/self/task/" + strconv.FormatUint(uint64(other), 10))
		if os.IsNotExist(err) {
			break
		}
		time.Sleep(time.Millisecond)
	}
	_, err = p.Read(os.Getpid(), other)
	assert.Error(t, err, "a thread that exited")
	assert.NotContains(t, p.files, other, "its file is let go")
	assert.Contains(t, p.files, tid)
}

// TestProcessFacts reads this process's facts and those of a process
// that does not exist, each against the file it comes from.
func TestProcessFacts(t *testing.T) {
	self := os.Getpid()
	const gone = 1 << 30 // past pid_max

	n, ok := MinorFaults(self)
	assert.True(t, ok)
	assert.Positive(t, n, "a Go process has touched pages")
	_, ok = MinorFaults(gone)
	assert.False(t, ok)

	env, err := os.ReadFile("/proc/self/environ")
	require.NoError(t, err)
	first, _, _ := strings.Cut(string(env), "\x00")
	name, value, _ := strings.Cut(first, "=")
	got, err := Env(self, name)
	require.NoError(t, err)
	assert.Equal(t, value, got, "%s as the process started with it", name)
	got, err = Env(self, "SOFTUVM_NO_SUCH_VARIABLE")
	assert.NoError(t, err)
	assert.Empty(t, got)
	got, err = Env(gone, "PATH")
	assert.NoError(t, err, "a process that is gone has no environment, and that is no error")
	assert.Empty(t, got)

	limit, err := readInt("/proc/sys/vm/max_map_count")
	require.NoError(t, err)
	assert.Equal(t, limit-100, MappingsLeft(gone, 100), "no mappings listed: the limit less the reserve")
	assert.Equal(t, 0, MappingsLeft(gone, limit+1), "never below 0")
	left := MappingsLeft(self, 0)
	assert.Less(t, left, limit, "this process has mappings")
	assert.Positive(t, left)

	release, err := os.ReadFile("/proc/sys/kernel/osrelease")
	require.NoError(t, err)
	assert.Equal(t, strings.TrimSpace(string(release)), KernelRelease())
}
