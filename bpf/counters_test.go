package bpf

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/prometheus/procfs"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
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
	_, err = c.ReadCrossing(time.Now().Add(50 * time.Millisecond))
	assert.ErrorIs(t, err, os.ErrDeadlineExceeded, "a region is reported once, when it reaches the threshold")

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

// TestCloseLeavesNothing: after Close no map, program or link of the
// counters is left in the kernel.
func TestCloseLeavesNothing(t *testing.T) {
	c := loadOrSkip(t, DefaultThreshold)
	var mapIDs []ebpf.MapID
	for _, m := range []*ebpf.Map{c.objs.Processes, c.objs.ProcessFaults, c.objs.Regions, c.objs.FaultEntries, c.objs.Crossings} {
		info, err := m.Info()
		require.NoError(t, err)
		id, ok := info.ID()
		require.True(t, ok)
		mapIDs = append(mapIDs, id)
	}
	pinfo, err := c.objs.CountFault.Info()
	require.NoError(t, err)
	progID, ok := pinfo.ID()
	require.True(t, ok)
	linfo, err := c.link.Info()
	require.NoError(t, err)
	linkID := linfo.ID
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
	assert.Eventually(t, func() bool {
		p, err := ebpf.NewProgramFromID(progID)
		if err == nil {
			p.Close()
		}
		return gone(err)
	}, 2*time.Second, 10*time.Millisecond, "program left")
	assert.Eventually(t, func() bool {
		l, err := link.NewFromID(linkID)
		if err == nil {
			l.Close()
		}
		return gone(err)
	}, 2*time.Second, 10*time.Millisecond, "link left")
}

func TestLoadRefusesZeroThreshold(t *testing.T) {
	_, err := Load(0)
	assert.ErrorContains(t, err, "threshold 0")
}

func addrOf(b []byte) uintptr { return uintptr(unsafe.Pointer(unsafe.SliceData(b))) }
