package cli

import (
	"encoding/binary"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/softuvm/softuvm/devmem"
	"github.com/softuvm/softuvm/internal/config"
	"github.com/softuvm/softuvm/policy"
	"github.com/softuvm/softuvm/uvm"
)

// touchKernel is the name of the kernel that touches every page of a
// range once.
const touchKernel = "uvm-bench-touch"

// Kernels of the launch benchmark.
func init() {
	// touchPages: params = address, length; thread t of n adds one to the
	// first byte of every page of its share, as the seed experiment's
	// kernel. `uvm demo` runs it too.
	uvm.MustRegisterKernel(touchKernel, func(tid, n int, p []byte) {
		addr, length := uintptr(binary.LittleEndian.Uint64(p)), int64(binary.LittleEndian.Uint64(p[8:]))
		pages := (length + uvm.PageSize - 1) / uvm.PageSize
		b := devmem.BytesAt(addr, length)
		for pg := int64(tid) * pages / int64(n); pg < int64(tid+1)*pages/int64(n); pg++ {
			b[pg*uvm.PageSize]++
		}
	})
	uvm.MustRegisterKernel("uvm-bench-nothing", func(tid, n int, p []byte) {})
	// stream: params = address, length; thread t of n reads its share,
	// eight bytes at a time, once.
	uvm.MustRegisterKernel("uvm-bench-stream", func(tid, n int, p []byte) {
		addr, length := uintptr(binary.LittleEndian.Uint64(p)), int64(binary.LittleEndian.Uint64(p[8:]))
		b := devmem.BytesAt(addr, length)
		lo, hi := length*int64(tid)/int64(n)&^7, length*int64(tid+1)/int64(n)&^7
		streamSink.Add(sumWords(b[lo:hi]))
	})
}

var streamSink atomic.Uint64

// launchRow is one size of the launch-and-touch experiment.
type launchRow struct {
	KB        int      `json:"kb"`
	USPerIter float64  `json:"us_per_iter"`
	MBps      *float64 `json:"mbps"` // bytes brought back to the host per second; none at 0 KB
}

type launchReport struct {
	Machine machineSummary `json:"machine"`
	// Rows reproduce the experiment of "Managed Memory: Belated Comments
	// on Implementation": per iteration a kernel on device 0 touches one
	// byte per 4 KiB page of an N KiB managed buffer, synchronize, then the
	// host touches one byte per page.
	Rows []launchRow `json:"rows"`
	// NullLaunchUS is a launch of an empty kernel plus synchronize
	// under the default schedule flag (DeviceScheduleAuto), or the first
	// of --schedule without it; PipeRTTUS a pipe ping-pong round trip
	// between two processes, in the same run.
	NullLaunchUS  float64 `json:"null_launch_us"`
	PipeRTTUS     float64 `json:"pipe_rtt_us"`
	NullLaunchRTT float64 `json:"null_launch_to_pipe_rtt"`
	// LaunchRows are Rows under the launch coherence model (a launch
	// copies what the host wrote to the device, the host's touch copies
	// it back), with --coherence launch.
	LaunchRows []launchRow `json:"launch_rows,omitempty"`
	// DirtyTracking is the cost of finding what the CPU wrote, with
	// --coherence launch.
	DirtyTracking []dirtyRow `json:"dirty_tracking,omitempty"`
	// Schedules are the null launch under each schedule flag of
	// --schedule (SetDeviceFlags), timed in rounds taken in turn with
	// the pipe round trip, so that a burst of other work slows a round
	// rather than one row.
	Schedules []scheduleRow `json:"schedules"`
	// MeasureCPU is where the thread timing both the null launch and
	// the round trip is pinned, and the pipe's child with it, so that the
	// round trip is its fastest, between two threads of one CPU. The
	// device's stream thread is not pinned: the scheduler wakes it near
	// the launching thread, as it would in a program. Unpinned, the child
	// lands on the other CPU about half the time and a round trip costs
	// 35-45 us, not 5-7: the ratio would say nothing.
	MeasureCPU int `json:"pipe_child_cpu"`
	Workers    int `json:"device_workers"`
	// OversubMemcpyFraction is the bandwidth of a kernel reading once
	// through a managed range twice the device's arena (faulting it in,
	// evicting as it goes), as a fraction of the same read of warm host
	// memory on as many threads (OversubReadGBps) in the same run.
	OversubMemcpyFraction float64 `json:"oversub_memcpy_fraction"`
	OversubGBps           float64 `json:"oversub_gbps"`
	OversubMemcpyGBps     float64 `json:"oversub_read_gbps"`
	OversubArena          string  `json:"oversub_arena"`
	// Thrashing is the server's thrashing detection: off by default here,
	// because the experiment is a page taken back and forth every
	// iteration, which the detector exists to stop (it would pin the
	// pages and map them remotely, and nothing would come back).
	Thrashing string `json:"thrashing"`
}

// scheduleRow is the null launch under one schedule flag.
type scheduleRow struct {
	Schedule     string  `json:"schedule"`
	Flags        uint32  `json:"flags"`
	NullLaunchUS float64 `json:"null_launch_us"`
	ToPipeRTT    float64 `json:"null_launch_to_pipe_rtt"`
}

// scheduleFlags are --schedule's names, in their default order.
var scheduleFlags = []scheduleRow{{Schedule: "auto", Flags: uvm.DeviceScheduleAuto}, {Schedule: "spin", Flags: uvm.DeviceScheduleSpin},
	{Schedule: "yield", Flags: uvm.DeviceScheduleYield}, {Schedule: "blocking", Flags: uvm.DeviceScheduleBlockingSync}}

// parseSchedules reads --schedule: a comma-separated list of schedule
// names.
func parseSchedules(list string) ([]scheduleRow, error) {
	var rows []scheduleRow
	for _, name := range strings.Split(list, ",") {
		name = strings.TrimSpace(name)
		i := slices.IndexFunc(scheduleFlags, func(r scheduleRow) bool { return r.Schedule == name })
		if i < 0 {
			return nil, fmt.Errorf("--schedule %q: unknown schedule %q; want a list of auto, spin, yield and blocking", list, name)
		}
		if slices.ContainsFunc(rows, func(r scheduleRow) bool { return r.Schedule == name }) {
			return nil, fmt.Errorf("--schedule %q: %s twice", list, name)
		}
		rows = append(rows, scheduleFlags[i])
	}
	return rows, nil
}

func benchLaunch(args []string) error {
	fs := newFlagSet("bench launch", "[--json] [--max-kb N] [--seconds S] [--schedule auto,spin,yield,blocking] [--plot DIR]",
		"Reproduce the launch-and-touch experiment (a kernel touches a managed buffer, the host touches it back), and time a null launch under each schedule flag against a pipe round trip")
	asJSON := fs.Bool("json", false, "print one JSON object")
	schedule := fs.String("schedule", "auto,spin,yield,blocking", "schedule flags (SetDeviceFlags) to time the null launch under, a row each: a list of auto, spin, yield and blocking; the launch-and-touch rows run under auto, the default")
	rounds := fs.Int("rounds", 5, "rounds of the null launch and pipe round trip, taken in turn (median of all)")
	coherence := fs.String("coherence", "fault", "coherence models to run the launch-and-touch rows under: fault, launch, or fault,launch (then side by side, with the seed's GM200 and GP100 figures and the cost of dirty tracking)")
	dirtySize := fs.String("dirty-size", "64MiB", "memory the dirty-tracking measurement writes (with --coherence launch)")
	maxKB := fs.Int("max-kb", 65536, "largest buffer, in KiB")
	seconds := fs.Float64("seconds", 0.3, "time spent on each size")
	oversubArena := fs.String("oversub-arena", "64MiB", "arena of the oversubscription run, which streams through twice as much")
	runs := fs.Int("runs", 5, "runs of the oversubscription stream (median)")
	thrashing := fs.String("thrashing", "off", "thrashing detection of the server (on, off, or settings); off measures migration every iteration, as the experiment means to")
	plotDir := fs.String("plot", "", "also draw the tables into `DIR` (created if missing), as PNG and SVG: launch-touch (us per iteration against the size touched, log-log, each coherence model run beside the H200 and the seed's GM200 and GP100 at the sizes run) and launch-null (the null launch under each schedule against the pipe round trip and the reference GPUs)")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	thrash, err := policy.ParseThrashingSpec(*thrashing)
	if err != nil {
		return fmt.Errorf("--thrashing: %w", err)
	}
	arena, err := uvm.ParseSize(*oversubArena)
	if err != nil || arena < uvm.BlockSize || *runs < 1 {
		return fmt.Errorf("want --oversub-arena of at least 2 MiB and --runs >= 1 (have %q, %d)", *oversubArena, *runs)
	}
	if *maxKB < 4 || *seconds <= 0 || *rounds < 1 {
		return fmt.Errorf("want --max-kb >= 4, --seconds > 0 and --rounds >= 1")
	}
	schedules, err := parseSchedules(*schedule)
	if err != nil {
		return err
	}
	models, err := parseModels(*coherence)
	if err != nil {
		return err
	}
	dirtyBytes, err := uvm.ParseSize(*dirtySize)
	if err != nil || dirtyBytes < uvm.PageSize {
		return fmt.Errorf("--dirty-size %q: want a size of at least a page", *dirtySize)
	}
	if err := checkPlotDir(*plotDir); err != nil {
		return err
	}
	progress := func(format string, a ...any) { fmt.Fprintf(os.Stderr, "uvm bench: "+format+"\n", a...) }
	s, err := oneDeviceSession(max(config.DefaultArenaSize, 2*int64(*maxKB)<<10), thrash)
	if err != nil {
		return err
	}
	defer s.Close()
	workers, _ := s.DeviceGetAttribute(uvm.AttrWorkerCount, 0)
	rep := launchReport{Machine: machineSummary{CPUs: cpus(), Kernel: kernelRelease(), Go: goVersion()}, Workers: int(workers), Thrashing: thrash.String()}

	progress("null launch (an empty kernel plus synchronize) under %s, and a pipe round trip, %d rounds", *schedule, *rounds)
	// Both on one thread pinned to one CPU, the pipe's child pinned
	// there too: the null launch and the round trip it is compared with
	// are measured from the same place. The thread ends with the
	// goroutine, so the pinning does not outlive the two measurements.
	done := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // not unlocked: the thread exits with the goroutine
		cpu, err := devmem.CurrentCPU()
		if err == nil {
			err = devmem.PinCurrentThread(cpu)
		}
		if err == nil {
			rep.MeasureCPU = cpu
			err = nullLaunches(s, cpu, schedules, *rounds, &rep)
		}
		done <- err
	}()
	if err := <-done; err != nil {
		return err
	}
	// The rows below run under the program's default.
	if err := s.SetDeviceFlags(uvm.DeviceScheduleAuto); err != nil {
		return err
	}

	sizes := []int{0}
	for kb := 4; kb <= *maxKB; kb *= 2 {
		sizes = append(sizes, kb)
	}
	budget := time.Duration(*seconds * float64(time.Second))
	for _, model := range models {
		ms := s
		if model == "launch" {
			if ms, err = coherenceSession(max(config.DefaultArenaSize, 2*int64(*maxKB)<<10), thrash, "launch", ""); err != nil {
				return err
			}
		}
		for _, kb := range sizes {
			progress("launch and touch %d KiB, %s coherence", kb, model)
			row, err := launchTouch(ms, kb, int(workers), budget)
			if err != nil {
				return err
			}
			if model == "launch" {
				rep.LaunchRows = append(rep.LaunchRows, row)
			} else {
				rep.Rows = append(rep.Rows, row)
			}
		}
		if ms != s {
			ms.Close()
		}
	}
	s.Close()
	if slices.Contains(models, "launch") {
		progress("dirty tracking: one pass of writes over %s the host got back from the device, three ways, %d runs", uvm.FormatSize(dirtyBytes), *runs)
		if rep.DirtyTracking, err = dirtyTrackingCost(dirtyBytes, *runs, thrash); err != nil {
			return err
		}
	}
	progress("oversubscription: a kernel streams once through %s of managed memory on a %s arena, %d runs", uvm.FormatSize(2*arena), uvm.FormatSize(arena), *runs)
	if err := oversubStream(arena, *runs, thrash, &rep); err != nil {
		return err
	}
	if _, err := plotLaunch(*plotDir, rep); err != nil {
		return err
	}
	if *asJSON {
		return writeJSON(os.Stdout, rep)
	}
	fmt.Printf("machine: %d CPUs, Linux %s, %s; device 0 has %d workers; thrashing detection %s\n\n", rep.Machine.CPUs, rep.Machine.Kernel, rep.Machine.Go, rep.Workers, rep.Thrashing)
	fmt.Printf("null launch + synchronize against a pipe round trip of %.2f us (same run, from CPU %d):\n", rep.PipeRTTUS, rep.MeasureCPU)
	fmt.Printf("%10s %12s %8s\n", "schedule", "us", "ratio")
	for _, r := range rep.Schedules {
		fmt.Printf("%10s %12.2f %8.2f\n", r.Schedule, r.NullLaunchUS, r.ToPipeRTT)
	}
	fmt.Println()
	printLaunchRows(rep)
	fmt.Printf("\noversubscription: a kernel streams once through %s on a %s arena: %.2f GB/s, the same read of warm memory on as many threads %.2f GB/s, fraction %.3f\n",
		uvm.FormatSize(2*arena), rep.OversubArena, rep.OversubGBps, rep.OversubMemcpyGBps, rep.OversubMemcpyFraction)
	return nil
}

// oneDeviceSession starts a private server with one device.
func oneDeviceSession(arena int64, thrash policy.ThrashingSpec) (*uvm.Session, error) {
	cfg := uvm.DefaultServerConfig()
	cfg.Devices = config.DeviceSpecs(1, []int64{arena}, cfg.Devices[0].Backend)
	cfg.Thrashing = thrash
	return uvm.Connect(uvm.Config{Server: "private", Private: cfg})
}

// oversubStream times a kernel reading once through a managed range twice
// the arena's size, which the host wrote first (so every page comes from
// the host and half of them are evicted again on the way), against the
// same read of warm host memory on as many threads.
func oversubStream(arena int64, runs int, thrash policy.ThrashingSpec, rep *launchReport) error {
	s, err := oneDeviceSession(arena, thrash)
	if err != nil {
		return err
	}
	defer s.Close()
	workers, _ := s.DeviceGetAttribute(uvm.AttrWorkerCount, 0)
	size := 2 * arena
	src, dst := make([]byte, size), make([]byte, size)
	for i := range src {
		src[i] = byte(i)
	}
	copy(dst, src)
	var bw, mc []float64
	params := make([]byte, 16)
	for r := 0; r <= runs; r++ { // run 0 warms up
		a, err := s.MallocManaged(size)
		if err != nil {
			return err
		}
		copy(a.Bytes(), src) // resident on the host
		binary.LittleEndian.PutUint64(params, uint64(a.Addr()))
		binary.LittleEndian.PutUint64(params[8:], uint64(size))
		t0 := time.Now()
		err = s.Launch(0, nil, "uvm-bench-stream", int(workers), params)
		if err == nil {
			err = s.DefaultStreamSynchronize(0)
		}
		secs := time.Since(t0).Seconds()
		if ferr := a.Free(); err == nil {
			err = ferr
		}
		if err != nil {
			return err
		}
		// The baseline does what the kernel does, on as many threads:
		// each reads its share of the same bytes once, from warm host
		// memory. The launch and synchronize the figure includes cost
		// some 30 us against the stream's tenths of a second.
		t0 = time.Now()
		parallelRead(src, int(workers))
		mcSecs := time.Since(t0).Seconds()
		if r > 0 {
			bw = append(bw, float64(size)/secs/1e9)
			mc = append(mc, float64(size)/mcSecs/1e9)
		}
	}
	rep.OversubGBps, rep.OversubMemcpyGBps = median(bw), median(mc)
	rep.OversubMemcpyFraction = rep.OversubGBps / rep.OversubMemcpyGBps
	rep.OversubArena = uvm.FormatSize(arena)
	return nil
}

// parallelRead reads b once on threads threads, each its own share, as
// uvm-bench-stream's workers do.
func parallelRead(b []byte, threads int) {
	threads = max(1, threads)
	var wg sync.WaitGroup
	for t := 0; t < threads; t++ {
		lo, hi := len(b)*t/threads/8*8, len(b)*(t+1)/threads/8*8
		wg.Add(1)
		go func() {
			defer wg.Done()
			streamSink.Add(sumWords(b[lo:hi]))
		}()
	}
	wg.Wait()
}

func medianDuration(d []time.Duration) time.Duration {
	sort.Slice(d, func(i, j int) bool { return d[i] < d[j] })
	return d[len(d)/2]
}

// nullLaunches times the null launch under each schedule and the pipe
// round trip in rounds taken in turn, 400 of each per round after 50 to
// warm up (the first round's also start the device), and fills rep with
// the medians.
func nullLaunches(s *uvm.Session, cpu int, schedules []scheduleRow, rounds int, rep *launchReport) error {
	pipe, err := startPingPong(cpu)
	if err != nil {
		return err
	}
	defer pipe.stop()
	const warm, timed = 50, 400
	pipeLat := []time.Duration{}
	lat := make([][]time.Duration, len(schedules))
	for r := 0; r < rounds; r++ {
		got, err := pipe.roundTrips(warm, timed)
		if err != nil {
			return err
		}
		pipeLat = append(pipeLat, got...)
		for i, sc := range schedules {
			if err := s.SetDeviceFlags(sc.Flags); err != nil {
				return err
			}
			got, err := nullLaunch(s, warm, timed)
			if err != nil {
				return err
			}
			lat[i] = append(lat[i], got...)
		}
	}
	rep.PipeRTTUS = float64(medianDuration(pipeLat).Nanoseconds()) / 1e3
	for i := range schedules {
		sc := &schedules[i]
		sc.NullLaunchUS = float64(medianDuration(lat[i]).Nanoseconds()) / 1e3
		sc.ToPipeRTT = sc.NullLaunchUS / rep.PipeRTTUS
	}
	rep.Schedules = schedules
	main := schedules[0]
	if i := slices.IndexFunc(schedules, func(r scheduleRow) bool { return r.Flags == uvm.DeviceScheduleAuto }); i >= 0 {
		main = schedules[i]
	}
	rep.NullLaunchUS, rep.NullLaunchRTT = main.NullLaunchUS, main.ToPipeRTT
	return nil
}

// nullLaunch times timed launches of an empty kernel, each with the
// synchronize of its stream, after warm untimed ones.
func nullLaunch(s *uvm.Session, warm, timed int) ([]time.Duration, error) {
	lat := make([]time.Duration, 0, timed)
	for i := 0; i < warm+timed; i++ {
		t0 := time.Now()
		if err := s.Launch(0, nil, "uvm-bench-nothing", 1, nil); err != nil {
			return nil, err
		}
		if err := s.DefaultStreamSynchronize(0); err != nil {
			return nil, err
		}
		if i >= warm {
			lat = append(lat, time.Since(t0))
		}
	}
	return lat, nil
}

// pingPongChild is a child process, pinned to a CPU, that echoes bytes
// over two pipes (pingPong), for the pipe round trip.
type pingPongChild struct {
	cmd       *exec.Cmd
	toChild   io.WriteCloser
	fromChild io.Reader
}

func startPingPong(cpu int) (*pingPongChild, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(exe, "__pingpong", strconv.Itoa(cpu))
	toChild, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	fromChild, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	return &pingPongChild{cmd: cmd, toChild: toChild, fromChild: fromChild}, nil
}

// roundTrips times timed one-byte round trips after warm untimed ones.
func (p *pingPongChild) roundTrips(warm, timed int) ([]time.Duration, error) {
	lat := make([]time.Duration, 0, timed)
	b := []byte{1}
	for i := 0; i < warm+timed; i++ {
		t0 := time.Now()
		if _, err := p.toChild.Write(b); err != nil {
			return nil, err
		}
		if _, err := io.ReadFull(p.fromChild, b); err != nil {
			return nil, err
		}
		if i >= warm {
			lat = append(lat, time.Since(t0))
		}
	}
	return lat, nil
}

func (p *pingPongChild) stop() {
	p.toChild.Close()
	p.cmd.Wait()
}

// pingPong is the child of pipeRTT: pinned to the CPU it is given, it
// echoes bytes until stdin closes.
func pingPong(cpuArg string) int {
	runtime.LockOSThread()
	if cpu, err := strconv.Atoi(cpuArg); err == nil {
		devmem.PinCurrentThread(cpu) // best effort: unpinned, it still echoes
	}
	b := make([]byte, 1)
	for {
		if _, err := os.Stdin.Read(b); err != nil {
			return 0
		}
		if _, err := os.Stdout.Write(b); err != nil {
			return 1
		}
	}
}

func launchTouch(s *uvm.Session, kb, workers int, budget time.Duration) (launchRow, error) {
	row := launchRow{KB: kb}
	size := int64(kb) << 10
	var a *uvm.Allocation
	params := make([]byte, 16)
	var b []byte
	if size > 0 {
		var err error
		if a, err = s.MallocManaged(size); err != nil {
			return row, err
		}
		defer a.Free()
		b = a.Bytes()
		binary.LittleEndian.PutUint64(params, uint64(a.Addr()))
		binary.LittleEndian.PutUint64(params[8:], uint64(size))
	}
	kernel, threads := touchKernel, max(1, min(workers, int(size/uvm.PageSize)))
	if size == 0 {
		kernel = "uvm-bench-nothing"
	}
	iter := func() error {
		if err := s.Launch(0, nil, kernel, threads, params); err != nil {
			return err
		}
		if err := s.DefaultStreamSynchronize(0); err != nil {
			return err
		}
		for i := 0; i < len(b); i += uvm.PageSize {
			b[i]++
		}
		return nil
	}
	for i := 0; i < 3; i++ { // warm up: first touch, device start
		if err := iter(); err != nil {
			return row, err
		}
	}
	var before uvm.Stats
	if a != nil {
		var err error
		if before, err = a.Stats(); err != nil {
			return row, err
		}
	}
	var lat []time.Duration
	start := time.Now()
	for len(lat) < 7 || time.Since(start) < budget {
		t0 := time.Now()
		if err := iter(); err != nil {
			return row, err
		}
		lat = append(lat, time.Since(t0))
	}
	// Every iteration moves every page to the device and back; pages
	// the thrashing detector pinned, or that stayed put, would make the
	// figure time something else. Moves beyond that (a page prefetched
	// along and moved again) are part of what is timed. The server
	// counts a move once it has woken the faulting thread, so the last
	// iteration's may not be counted yet.
	if a != nil {
		after, err := a.Stats()
		if err != nil {
			return row, err
		}
		pages := uint64(size / uvm.PageSize)
		want := uint64(len(lat)) * pages
		// Under the launch coherence model pages go to the device at
		// the launch (copied: the host wrote them) and come back as
		// copies the device keeps.
		moves := []struct {
			what   string
			before uint64
			after  uint64
		}{
			{"moved from the host to device 0", before.MigratedPages(uvm.CPU, 0), after.MigratedPages(uvm.CPU, 0)},
			{"moved from device 0 to the host", before.MigratedPages(0, uvm.CPU), after.MigratedPages(0, uvm.CPU)},
		}
		if s.Coherence() == "launch" {
			moves[0].what, moves[0].before, moves[0].after = "copied to device 0 at launches", before.LaunchCopiedPages, after.LaunchCopiedPages
			moves[1].what, moves[1].before, moves[1].after = "copied back to the host", before.ReadDuplicatedPages(uvm.CPU), after.ReadDuplicatedPages(uvm.CPU)
		}
		for _, m := range moves {
			if moved := m.after - m.before; moved+pages < want {
				return row, fmt.Errorf("launch and touch of %d KiB: %d pages %s in %d iterations, want at least %d (less the last iteration's %d)",
					kb, moved, m.what, len(lat), want, pages)
			}
		}
	}
	row.USPerIter = float64(medianDuration(lat).Nanoseconds()) / 1e3
	if size > 0 {
		mbps := float64(size) / row.USPerIter // bytes per microsecond = MB/s
		row.MBps = &mbps
	}
	return row, nil
}
