package bpf

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime"
	"runtime/debug"
	"strconv"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/cilium/ebpf/ringbuf"
	"github.com/prometheus/procfs"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// touchEnv makes the test binary a child that, on each line it reads,
// touches pages: "N" touches N fresh anonymous pages once, "R K" drops and
// touches one 64 KiB region K times. It prints "ok" after each.
const touchEnv = "SOFTUVM_BPF_TEST_TOUCH"

func TestMain(m *testing.M) {
	if os.Getenv(touchEnv) != "" {
		os.Exit(touchChild())
	}
	os.Exit(m.Run())
}

func touchChild() int {
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		var n, k int
		if _, err := fmt.Sscanf(in.Text(), "R %d", &k); err == nil {
			region, err := syscall.Mmap(-1, 0, 2<<RegionShift, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_PRIVATE|syscall.MAP_ANONYMOUS)
			if err != nil {
				return 1
			}
			// The 64 KiB-aligned half of a 128 KiB mapping.
			off := (1<<RegionShift - int(addrOf(region))%(1<<RegionShift)) % (1 << RegionShift)
			r := region[off : off+1<<RegionShift]
			for range k {
				for p := 0; p < len(r); p += os.Getpagesize() {
					r[p] = 1
				}
				if err := syscall.Madvise(r, 4 /* MADV_DONTNEED */); err != nil {
					return 1
				}
			}
			fmt.Printf("ok %d\n", addrOf(r)>>RegionShift)
			continue
		}
		n, _ = strconv.Atoi(in.Text())
		b, err := syscall.Mmap(-1, 0, n*os.Getpagesize(), syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_PRIVATE|syscall.MAP_ANONYMOUS)
		if err != nil {
			return 1
		}
		for p := 0; p < len(b); p += os.Getpagesize() {
			b[p] = 1
		}
		fmt.Println("ok")
	}
	return 0
}

// toucher is a running touch child.
type toucher struct {
	cmd *exec.Cmd
	in  io.WriteCloser
	out *bufio.Reader
}

func startToucher(t *testing.T) *toucher {
	t.Helper()
	exe, err := os.Executable()
	require.NoError(t, err)
	cmd := exec.Command(exe)
	cmd.Env = append(os.Environ(), touchEnv+"=1")
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	require.NoError(t, err)
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { in.Close(); cmd.Wait() })
	return &toucher{cmd: cmd, in: in, out: bufio.NewReader(out)}
}

func (c *toucher) do(t *testing.T, line string) string {
	t.Helper()
	_, err := fmt.Fprintln(c.in, line)
	require.NoError(t, err)
	reply, err := c.out.ReadString('\n')
	require.NoError(t, err)
	return reply
}

func minflt(t *testing.T, pid int) uint64 {
	t.Helper()
	p, err := procfs.NewProc(pid)
	require.NoError(t, err)
	st, err := p.Stat()
	require.NoError(t, err)
	return uint64(st.MinFlt)
}

func loadOrSkip(t *testing.T, threshold uint64) *Counters {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root to load eBPF programs")
	}
	c, err := Load(threshold)
	require.NoError(t, err)
	return c
}

// TestCountsAgreeWithMinflt: a process's eBPF fault count agrees with the
// kernel's minflt within 1% over 20,000 faults.
func TestCountsAgreeWithMinflt(t *testing.T) {
	c := loadOrSkip(t, DefaultThreshold)
	defer c.Close()
	child := startToucher(t)
	pid := child.cmd.Process.Pid
	child.do(t, "1") // the child is running and has faulted in what it needs
	require.NoError(t, c.Track(pid, 0))
	before := minflt(t, pid)
	child.do(t, "20000")
	delta := minflt(t, pid) - before
	counted, err := c.ProcessFaults(pid)
	require.NoError(t, err)
	t.Logf("minflt delta %d, eBPF %d", delta, counted)
	require.GreaterOrEqual(t, delta, uint64(20000))
	assert.InEpsilon(t, float64(delta), float64(counted), 0.01, "eBPF counts %d faults, minflt %d", counted, delta)

	c.Untrack(pid)
	child.do(t, "100")
	_, err = c.ProcessFaults(pid)
	assert.Error(t, err, "an untracked process is not counted")
}

// TestRegionCountsAndCrossings: faults are counted per processor and 64
// KiB region, a region that reaches the threshold is reported once
// through the ring buffer, and decay halves the counts.
func TestRegionCountsAndCrossings(t *testing.T) {
	c := loadOrSkip(t, 64)
	defer c.Close()
	child := startToucher(t)
	pid := child.cmd.Process.Pid
	require.NoError(t, c.Track(pid, 2))
	var region uint64
	_, err := fmt.Sscanf(child.do(t, "R 10"), "ok %d", &region) // 16 pages 10 times: 160 faults
	require.NoError(t, err)
	x, err := c.ReadCrossing(time.Now().Add(2 * time.Second))
	require.NoError(t, err)
	assert.Equal(t, Crossing{Processor: 2, PID: pid, Region: region, Count: 64, At: x.At}, x)
	x, err = c.ReadCrossing(time.Now().Add(2 * time.Second))
	require.NoError(t, err)
	assert.Equal(t, Crossing{Processor: 2, PID: pid, Region: region, Count: 128, At: x.At}, x, "reported again at twice the threshold")
	_, err = c.ReadCrossing(time.Now().Add(50 * time.Millisecond))
	assert.ErrorIs(t, err, os.ErrDeadlineExceeded, "a region is reported at each multiple of the threshold, and only then")

	count := func() uint64 {
		regions, err := c.Regions()
		require.NoError(t, err)
		for _, r := range regions {
			if r.Processor == 2 && r.Region == region {
				return r.Count
			}
		}
		return 0
	}
	n := count()
	assert.GreaterOrEqual(t, n, uint64(160))
	require.NoError(t, c.Decay())
	assert.Equal(t, n/2, count())
}

// TestResetRemovesOneRegion: Reset drops the count of the region it is
// given and leaves every other region's.
func TestResetRemovesOneRegion(t *testing.T) {
	c := loadOrSkip(t, DefaultThreshold)
	defer c.Close()
	child := startToucher(t)
	pid := child.cmd.Process.Pid
	require.NoError(t, c.Track(pid, 3))
	var a, b uint64
	_, err := fmt.Sscanf(child.do(t, "R 2"), "ok %d", &a) // 32 faults in region a
	require.NoError(t, err)
	_, err = fmt.Sscanf(child.do(t, "R 2"), "ok %d", &b) // and in b, another mapping
	require.NoError(t, err)
	require.NotEqual(t, a, b)

	counts := func() map[RegionCount]bool {
		regions, err := c.Regions()
		require.NoError(t, err)
		m := map[RegionCount]bool{}
		for _, r := range regions {
			if r.Processor == 3 {
				m[RegionCount{Processor: r.Processor, Region: r.Region}] = true
			}
		}
		return m
	}
	before := counts()
	require.True(t, before[RegionCount{Processor: 3, Region: a}])
	require.True(t, before[RegionCount{Processor: 3, Region: b}])

	c.Reset(3, a)
	after := counts()
	assert.False(t, after[RegionCount{Processor: 3, Region: a}], "region a reset")
	for k := range before {
		if k.Region != a {
			assert.True(t, after[k], "region %#x of processor 3 kept", k.Region)
		}
	}
	c.Reset(3, a) // already reset: nothing to do, no panic
	c.Reset(2, b) // another processor's code: b of 3 is kept
	assert.True(t, counts()[RegionCount{Processor: 3, Region: b}])
}

// monotonic is CLOCK_MONOTONIC now, the clock of bpf_ktime_get_ns.
func monotonic(t *testing.T) time.Duration {
	t.Helper()
	var ts unix.Timespec
	require.NoError(t, unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts))
	return time.Duration(ts.Nano())
}

// TestAnatomyResume: a thread faults, the test samples the fault while
// the thread is blocked, and when the thread runs again the resume is
// reported with the fault's entry.
func TestAnatomyResume(t *testing.T) {
	c := loadOrSkip(t, DefaultThreshold)
	defer c.Close()
	pid := os.Getpid()
	require.NoError(t, c.Track(pid, 9))
	defer c.Untrack(pid)

	page, err := unix.Mmap(-1, 0, os.Getpagesize(), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	require.NoError(t, err)
	defer unix.Munmap(page)

	// Off until enabled: nothing is sampled, nothing read.
	_, _, ok := c.Sample(unix.Gettid())
	assert.False(t, ok, "Sample before EnableAnatomy")
	_, err = c.ReadResume(time.Now().Add(10 * time.Millisecond))
	assert.ErrorIs(t, err, errAnatomyOff)

	require.NoError(t, c.EnableAnatomy())
	require.NoError(t, c.EnableAnatomy(), "a second call does nothing")

	// Between its fault and Sample the thread must fault nowhere else, as
	// a thread blocked in a userfaultfd fault does not. So it says it
	// faulted and waits through raw pipe syscalls: not channels, whose
	// wake-up may start an M on the waking thread and fault in fresh heap
	// for it, and not unix.Write and unix.Read, whose entry to and exit
	// from a syscall may run the scheduler on the thread's g0 stack and
	// fault in a page of it. The collector is off for the while, so no
	// preemption signal runs a handler on a fresh signal stack. A raw
	// syscall that blocks keeps its P, so the test needs a second one.
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(max(2, runtime.GOMAXPROCS(0))))
	defer debug.SetGCPercent(debug.SetGCPercent(-1))
	var notify, wake [2]int
	require.NoError(t, unix.Pipe2(notify[:], unix.O_CLOEXEC))
	require.NoError(t, unix.Pipe2(wake[:], unix.O_CLOEXEC))
	for _, fd := range append(notify[:], wake[:]...) {
		defer unix.Close(fd)
	}
	defer unix.Write(wake[1], []byte{1}) // the thread is not left blocked if the test fails early
	done := make(chan struct{})
	go func() {
		defer close(done)
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		msg := binary.NativeEndian.AppendUint32(nil, uint32(unix.Gettid()))
		touch(page) // the one fault
		unix.RawSyscall(unix.SYS_WRITE, uintptr(notify[1]), uintptr(unsafe.Pointer(&msg[0])), uintptr(len(msg)))
		unix.RawSyscall(unix.SYS_READ, uintptr(wake[0]), uintptr(unsafe.Pointer(&msg[0])), 1) // blocks: switched out until the test writes
	}()
	msg := make([]byte, 4)
	n, err := unix.Read(notify[0], msg)
	require.NoError(t, err)
	require.Equal(t, 4, n)
	tid := int(binary.NativeEndian.Uint32(msg))
	entry, addr, ok := c.Sample(tid)
	require.True(t, ok, "thread %d's fault recorded", tid)
	assert.Equal(t, uint64(addrOf(page)), addr)
	assert.Less(t, entry, monotonic(t))
	waitAsleep(t, tid)
	_, err = unix.Write(wake[1], []byte{1})
	require.NoError(t, err)
	<-done

	r, err := c.ReadResume(time.Now().Add(3 * time.Second))
	require.NoError(t, err)
	assert.Equal(t, tid, r.TID)
	assert.Equal(t, entry, r.Entry)
	assert.Greater(t, r.Resumed, r.Entry)
	assert.Less(t, r.Resumed, monotonic(t))
	t.Logf("fault entry to resume: %v", r.Resumed-r.Entry)

	var left uint64
	assert.ErrorIs(t, c.objs.Sampled.Lookup(uint32(tid), &left), ebpf.ErrKeyNotExist, "the sample is taken out when reported")
	_, err = c.ReadResume(time.Now().Add(50 * time.Millisecond))
	assert.ErrorIs(t, err, os.ErrDeadlineExceeded, "reported once")

	require.NoError(t, c.Close())
	_, err = c.ReadResume(time.Time{})
	assert.ErrorIs(t, err, ringbuf.ErrClosed)
}

// TestCloseLeavesNothing: after Close no map, program or link of the
// counters is left in the kernel, the fault anatomy's included.
func TestCloseLeavesNothing(t *testing.T) {
	c := loadOrSkip(t, DefaultThreshold)
	require.NoError(t, c.EnableAnatomy())
	var mapIDs []ebpf.MapID
	for _, m := range []*ebpf.Map{c.objs.Processes, c.objs.ProcessFaults, c.objs.Regions, c.objs.FaultEntries, c.objs.Crossings, c.objs.Sampled, c.objs.Resumes} {
		info, err := m.Info()
		require.NoError(t, err)
		id, ok := info.ID()
		require.True(t, ok)
		mapIDs = append(mapIDs, id)
	}
	progIDs, err := c.ProgramIDs()
	require.NoError(t, err)
	require.Len(t, progIDs, 2)
	var linkIDs []link.ID
	for _, l := range []link.Link{c.link, c.switchLink} {
		linfo, err := l.Info()
		require.NoError(t, err)
		linkIDs = append(linkIDs, linfo.ID)
	}
	require.NoError(t, c.Close())

	gone := func(err error) bool { return errors.Is(err, os.ErrNotExist) }
	for _, id := range mapIDs {
		assert.Eventually(t, func() bool {
			m, err := ebpf.NewMapFromID(id)
			if err == nil {
				m.Close()
			}
			return gone(err)
		}, 2*time.Second, 10*time.Millisecond, "map %d left", id)
	}
	for _, id := range progIDs {
		assert.Eventually(t, func() bool {
			p, err := ebpf.NewProgramFromID(id)
			if err == nil {
				p.Close()
			}
			return gone(err)
		}, 2*time.Second, 10*time.Millisecond, "program %d left", id)
	}
	for _, id := range linkIDs {
		assert.Eventually(t, func() bool {
			l, err := link.NewFromID(id)
			if err == nil {
				l.Close()
			}
			return gone(err)
		}, 2*time.Second, 10*time.Millisecond, "link %d left", id)
	}
}

func TestLoadRefusesZeroThreshold(t *testing.T) {
	_, err := Load(0)
	assert.ErrorContains(t, err, "threshold 0")
}

// touch writes b's first byte; norace, so that under -race the last
// fault is b's page and not the race detector's shadow of it.
//
//go:norace
func touch(b []byte) { b[0] = 1 }

// waitAsleep returns once thread tid is asleep (state S in /proc), so
// that its next run is a switch back in.
func waitAsleep(t *testing.T, tid int) {
	t.Helper()
	thread, err := procfs.NewProc(tid) // /proc/TID is the thread's own view
	require.NoError(t, err)
	deadline := time.Now().Add(3 * time.Second)
	for {
		stat, err := thread.Stat()
		require.NoError(t, err)
		if stat.State == "S" {
			return
		}
		require.True(t, time.Now().Before(deadline), "thread %d in state %s, not asleep, after 3s", tid, stat.State)
		runtime.Gosched()
	}
}

func addrOf(b []byte) uintptr { return uintptr(unsafe.Pointer(unsafe.SliceData(b))) }
