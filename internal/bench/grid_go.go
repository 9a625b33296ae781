package bench

import (
	"encoding/binary"
	"fmt"
	"strconv"
	"time"
	"unsafe"

	"github.com/softuvm/softuvm/policy"
	"github.com/softuvm/softuvm/uvm"
)

// The Go side's kernels: the same work as grid_bench.c's.
func init() {
	uvm.MustRegisterGridKernel("uvm-bench-grid-empty", func(uvm.Thread, []byte) {})
	uvm.MustRegisterGridKernel("uvm-bench-grid-barriers", func(t uvm.Thread, p []byte) {
		for range binary.LittleEndian.Uint32(p) {
			t.SyncThreads()
		}
	})
	// params: input address, floats, partial sums' address.
	uvm.MustRegisterGridKernel("uvm-bench-grid-reduce", func(t uvm.Thread, p []byte) {
		in, n, out := uintptr(binary.LittleEndian.Uint64(p)), int(binary.LittleEndian.Uint64(p[8:])), uintptr(binary.LittleEndian.Uint64(p[16:]))
		threads := int(t.GridDim().X * t.BlockDim().X)
		me := int(t.BlockIdx().X*t.BlockDim().X + t.ThreadIdx().X)
		var sum float64
		for _, v := range uvm.SliceAt[float32](in, n)[n*me/threads : n*(me+1)/threads] {
			sum += float64(v)
		}
		raw := t.Shared()
		s := unsafe.Slice((*float64)(unsafe.Pointer(&raw[0])), t.BlockDim().X)
		s[t.ThreadIdx().X] = sum
		t.SyncThreads()
		for k := t.BlockDim().X / 2; k > 0; k >>= 1 {
			if t.ThreadIdx().X < k {
				s[t.ThreadIdx().X] += s[t.ThreadIdx().X+k]
			}
			t.SyncThreads()
		}
		if t.ThreadIdx().X == 0 {
			uvm.SliceAt[float64](out, int(t.GridDim().X))[t.BlockIdx().X] = s[0]
		}
	})
	uvm.MustRegisterKernel("uvm-bench-grid-reduce-threads", func(tid, nthreads int, p []byte) {
		in, n, out := uintptr(binary.LittleEndian.Uint64(p)), int(binary.LittleEndian.Uint64(p[8:])), uintptr(binary.LittleEndian.Uint64(p[16:]))
		var sum float64
		for _, v := range uvm.SliceAt[float32](in, n)[n*tid/nthreads : n*(tid+1)/nthreads] {
			sum += float64(v)
		}
		uvm.SliceAt[float64](out, nthreads)[tid] = sum
	})
	// params: address, length (as TouchKernel's).
	uvm.MustRegisterGridKernel("uvm-bench-grid-touch", func(t uvm.Thread, p []byte) {
		addr, length := uintptr(binary.LittleEndian.Uint64(p)), int64(binary.LittleEndian.Uint64(p[8:]))
		pages := (length + uvm.PageSize - 1) / uvm.PageSize
		threads, me := int64(t.GridDim().X*t.BlockDim().X), int64(t.BlockIdx().X*t.BlockDim().X+t.ThreadIdx().X)
		b := uvm.SliceAt[byte](addr, int(length))
		for pg := pages * me / threads; pg < pages*(me+1)/threads; pg++ {
			b[pg*uvm.PageSize]++
		}
	})
}

// gridBenchGo measures the Go runtime the way grid_bench.c measures C's,
// in this process: the null launch, barriers, the reduction and the
// launch and touch, each against the thread launch of the same work.
func gridBenchGo(rounds, reduceMiB int, touch []int, arena int64) (*GridRuntime, error) {
	off, err := policy.ParseThrashingSpec("off")
	if err != nil {
		return nil, err
	}
	s, err := oneDeviceSession(arena, off)
	if err != nil {
		return nil, err
	}
	defer s.Close()
	workers, err := s.DeviceGetAttribute(uvm.AttrMultiProcessorCount, 0)
	if err != nil {
		return nil, err
	}
	g := &goGrid{s: s, workers: int(workers), rounds: rounds}
	r := &GridRuntime{Workers: int(workers), BarrierNSPerThread: map[string]float64{}}
	if r.NullGridUS, r.NullThreadsUS, err = g.pair(g.launched(g.grid("uvm-bench-grid-empty", 1, 1, 0, nil), nil, nil),
		g.launched(g.plain("uvm-bench-nothing", 1, nil), nil, nil)); err != nil {
		return nil, err
	}
	if err := g.barriers(r); err != nil {
		return nil, err
	}
	if err := g.reduction(reduceMiB, r); err != nil {
		return nil, err
	}
	for _, kib := range touch {
		if err := g.launchAndTouch(kib, r); err != nil {
			return nil, err
		}
	}
	r.finish()
	return r, nil
}

// goGrid times the Go runtime's launches on a private server of one
// device, each measured step against the same work launched the other
// way (pair).
type goGrid struct {
	s       *uvm.Session
	workers int
	rounds  int
}

// gridStep is one measured step: a launch, its synchronize and what
// runs in the same iteration, timed (in us), then what checks it,
// untimed.
type gridStep func() (float64, error)

func (g *goGrid) launched(launch func() error, during func(), after func() error) gridStep {
	return func() (float64, error) {
		t0 := time.Now()
		if err := launch(); err != nil {
			return 0, err
		}
		if err := g.s.DeviceSynchronize(0); err != nil {
			return 0, err
		}
		if during != nil {
			during()
		}
		us := float64(time.Since(t0).Nanoseconds()) / 1e3
		if after != nil {
			return us, after()
		}
		return us, nil
	}
}

// grid launches name as a grid of blocks of threads.
func (g *goGrid) grid(name string, blocks, threads, shared int, params []byte) func() error {
	return func() error {
		return g.s.LaunchGrid(0, nil, name, uvm.LaunchConfig{Grid: uvm.Dim(blocks), Block: uvm.Dim(threads), SharedBytes: shared}, params)
	}
}

// plain launches name on n threads, the (tid, nthreads) launch.
func (g *goGrid) plain(name string, n int, params []byte) func() error {
	return func() error { return g.s.Launch(0, nil, name, n, params) }
}

// pair runs a and b in rounds, alternating which goes first, and
// returns their medians (after one warm-up round).
func (g *goGrid) pair(a, b gridStep) (float64, float64, error) {
	var ta, tb []float64
	for i := -1; i < g.rounds; i++ {
		x, y := 0.0, 0.0
		var err error
		if i%2 == 0 {
			if x, err = a(); err == nil {
				y, err = b()
			}
		} else if y, err = b(); err == nil {
			x, err = a()
		}
		if err != nil {
			return 0, 0, err
		}
		if i >= 0 {
			ta, tb = append(ta, x), append(tb, y)
		}
	}
	return median(ta), median(tb), nil
}

// barriers times one block waiting at 256 barriers against the same
// block without them, by block size: the cost per barrier and thread.
func (g *goGrid) barriers(r *GridRuntime) error {
	const count = 256
	for _, threads := range []int{32, 256, 1024} {
		with, without, err := g.pair(g.launched(g.grid("uvm-bench-grid-barriers", 1, threads, 0, binary.LittleEndian.AppendUint32(nil, count)), nil, nil),
			g.launched(g.grid("uvm-bench-grid-barriers", 1, threads, 0, binary.LittleEndian.AppendUint32(nil, 0)), nil, nil))
		if err != nil {
			return err
		}
		r.BarrierNSPerThread[strconv.Itoa(threads)] = (with - without) * 1e3 / count / float64(threads)
	}
	return nil
}

// reduction sums reduceMiB of floats on the device: blocks of 256
// threads in shared memory against one thread a worker, each sum checked.
func (g *goGrid) reduction(reduceMiB int, r *GridRuntime) error {
	s, workers := g.s, g.workers
	n := reduceMiB << 20 / 4
	in, err := s.MallocManaged(int64(n) * 4)
	if err != nil {
		return err
	}
	defer in.Free()
	blocks := 8 * workers
	partial, err := s.MallocManaged(int64(8 * max(blocks, workers)))
	if err != nil {
		return err
	}
	defer partial.Free()
	var want float64
	for i, f := 0, uvm.SliceAt[float32](in.Addr(), n); i < n; i++ {
		f[i] = float32(i%1000) * 0.5
		want += float64(f[i])
	}
	if err := in.Prefetch(0); err != nil {
		return err
	}
	params := binary.LittleEndian.AppendUint64(binary.LittleEndian.AppendUint64(binary.LittleEndian.AppendUint64(nil, uint64(in.Addr())), uint64(n)), uint64(partial.Addr()))
	// check adds the partial sums, and puts them back on the device, as
	// the input is.
	check := func(parts int) func() error {
		return func() error {
			var got float64
			for _, v := range uvm.SliceAt[float64](partial.Addr(), parts) {
				got += v
			}
			if got != want {
				return fmt.Errorf("the reduction summed %v, want %v", got, want)
			}
			return partial.Prefetch(0)
		}
	}
	gridUS, threadsUS, err := g.pair(g.launched(g.grid("uvm-bench-grid-reduce", blocks, 256, 256*8, params), nil, check(blocks)),
		g.launched(g.plain("uvm-bench-grid-reduce-threads", workers, params), nil, check(workers)))
	if err != nil {
		return err
	}
	r.ReduceMiB, r.ReduceBlocks, r.ReduceGridMS, r.ReduceThreadsMS = reduceMiB, blocks, gridUS/1e3, threadsUS/1e3
	return nil
}

// launchAndTouch is the seed's launch and touch of kib KiB through the
// grid launch (a block of one thread a worker) and through the thread
// launch, the host's touch in the iteration's time, as the seed's; every
// page checked touched by each iteration of both.
func (g *goGrid) launchAndTouch(kib int, r *GridRuntime) error {
	buf, err := g.s.MallocManaged(int64(kib) << 10)
	if err != nil {
		return err
	}
	b := buf.Bytes()
	p := binary.LittleEndian.AppendUint64(binary.LittleEndian.AppendUint64(nil, uint64(buf.Addr())), uint64(kib)<<10)
	touchBack := func() {
		for pg := 0; pg < len(b); pg += uvm.PageSize {
			b[pg]++
		}
	}
	gridUS, threadsUS, err := g.pair(g.launched(g.grid("uvm-bench-grid-touch", g.workers, 1, 0, p), touchBack, nil),
		g.launched(g.plain(TouchKernel, g.workers, p), touchBack, nil))
	if err != nil {
		buf.Free()
		return err
	}
	want := byte(4 * (g.rounds + 1))
	for pg := 0; pg < len(b); pg += uvm.PageSize {
		if b[pg] != want {
			buf.Free()
			return fmt.Errorf("launch and touch of %d KiB: page %d was touched %d times, want %d", kib, pg/uvm.PageSize, b[pg], want)
		}
	}
	r.Touch = append(r.Touch, GridTouchRow{KiB: kib, GridUS: gridUS, ThreadsUS: threadsUS})
	return buf.Free()
}
