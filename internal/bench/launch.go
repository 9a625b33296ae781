package bench

import (
	"encoding/binary"
	"fmt"
	"io"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/softuvm/softuvm/devmem"
	"github.com/softuvm/softuvm/internal/config"
	"github.com/softuvm/softuvm/policy"
	"github.com/softuvm/softuvm/uvm"
)

// LaunchRow is one size of the launch-and-touch experiment.
type LaunchRow struct {
	KB        int      `json:"kb"`
	USPerIter float64  `json:"us_per_iter"`
	MBps      *float64 `json:"mbps"` // bytes brought back to the host per second; none at 0 KB
}

// LaunchReport is what `uvm bench launch` measured, its JSON what --json
// prints.
type LaunchReport struct {
	Machine Machine `json:"machine"`
	// Rows reproduce the experiment of "Managed Memory: Belated Comments
	// on Implementation": per iteration a kernel on device 0 touches one
	// byte per 4 KiB page of an N KiB managed buffer, synchronize, then the
	// host touches one byte per page.
	Rows []LaunchRow `json:"rows"`
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
	LaunchRows []LaunchRow `json:"launch_rows,omitempty"`
	// DirtyTracking is the cost of finding what the CPU wrote, with
	// --coherence launch.
	DirtyTracking []DirtyRow `json:"dirty_tracking,omitempty"`
	// Schedules are the null launch under each schedule flag of
	// --schedule (SetDeviceFlags), timed in rounds taken in turn with
	// the pipe round trip, so that a burst of other work slows a round
	// rather than one row.
	Schedules []ScheduleRow `json:"schedules"`
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

	oversubArena int64 // OversubArena's bytes
}

// ScheduleRow is the null launch under one schedule flag.
type ScheduleRow struct {
	Schedule     string  `json:"schedule"`
	Flags        uint32  `json:"flags"`
	NullLaunchUS float64 `json:"null_launch_us"`
	ToPipeRTT    float64 `json:"null_launch_to_pipe_rtt"`
}

// scheduleFlags are --schedule's names, in their default order.
var scheduleFlags = []ScheduleRow{{Schedule: "auto", Flags: uvm.DeviceScheduleAuto}, {Schedule: "spin", Flags: uvm.DeviceScheduleSpin},
	{Schedule: "yield", Flags: uvm.DeviceScheduleYield}, {Schedule: "blocking", Flags: uvm.DeviceScheduleBlockingSync}}

// ParseSchedules reads --schedule: a comma-separated list of schedule
// names.
func ParseSchedules(list string) ([]ScheduleRow, error) {
	var rows []ScheduleRow
	for _, name := range strings.Split(list, ",") {
		name = strings.TrimSpace(name)
		i := slices.IndexFunc(scheduleFlags, func(r ScheduleRow) bool { return r.Schedule == name })
		if i < 0 {
			return nil, fmt.Errorf("--schedule %q: unknown schedule %q; want a list of auto, spin, yield and blocking", list, name)
		}
		if slices.ContainsFunc(rows, func(r ScheduleRow) bool { return r.Schedule == name }) {
			return nil, fmt.Errorf("--schedule %q: %s twice", list, name)
		}
		rows = append(rows, scheduleFlags[i])
	}
	return rows, nil
}

// scheduleNames writes schedules as --schedule takes them.
func scheduleNames(schedules []ScheduleRow) string {
	var names []string
	for _, sc := range schedules {
		names = append(names, sc.Schedule)
	}
	return strings.Join(names, ",")
}

// LaunchOptions are what `uvm bench launch` measures: its flags.
type LaunchOptions struct {
	Schedules []ScheduleRow // the schedule flags to time the null launch under (ParseSchedules)
	Rounds    int           // rounds of the null launch and the pipe round trip, taken in turn
	Models    []string      // coherence models of the launch-and-touch rows (ParseModels)
	DirtySize int64         // memory the dirty-tracking measurement writes (with the launch model)
	MaxKB     int           // the largest buffer of the launch-and-touch rows, in KiB
	PerSize   time.Duration // time spent on each size
	// OversubArena is the arena of the oversubscription run, which
	// streams through twice as much, Runs times.
	OversubArena int64
	Runs         int
	Thrashing    policy.ThrashingSpec // the server's thrashing detection
	PlotDir      string               // "": no figures
	Progress     Progress
}

// Launch is `uvm bench launch`: the launch-and-touch experiment (a kernel
// touches a managed buffer, the host touches it back) under each
// coherence model asked for, a null launch under each schedule flag
// against a pipe round trip, the cost of dirty tracking, and a kernel
// streaming through twice its device's arena; then, with a PlotDir, the
// figures.
func Launch(o LaunchOptions) (*LaunchReport, error) {
	if err := checkPlotDir(o.PlotDir); err != nil {
		return nil, err
	}
	progress := o.Progress.orQuiet()
	arena := max(config.DefaultArenaSize, 2*int64(o.MaxKB)<<10)
	s, err := oneDeviceSession(arena, o.Thrashing)
	if err != nil {
		return nil, err
	}
	defer s.Close()
	workers, _ := s.DeviceGetAttribute(uvm.AttrWorkerCount, 0)
	rep := &LaunchReport{Machine: ThisMachine(), Workers: int(workers), Thrashing: o.Thrashing.String(), oversubArena: o.OversubArena}

	progress("null launch (an empty kernel plus synchronize) under %s, and a pipe round trip, %d rounds", scheduleNames(o.Schedules), o.Rounds)
	if err := pinnedNullLaunches(s, o.Schedules, o.Rounds, rep); err != nil {
		return nil, err
	}
	// The rows below run under the program's default.
	if err := s.SetDeviceFlags(uvm.DeviceScheduleAuto); err != nil {
		return nil, err
	}
	for _, model := range o.Models {
		if err := launchTouchRows(s, model, arena, int(workers), o, progress, rep); err != nil {
			return nil, err
		}
	}
	s.Close()
	if slices.Contains(o.Models, "launch") {
		progress("dirty tracking: one pass of writes over %s the host got back from the device, three ways, %d runs", uvm.FormatSize(o.DirtySize), o.Runs)
		if rep.DirtyTracking, err = dirtyTrackingCost(o.DirtySize, o.Runs, o.Thrashing); err != nil {
			return nil, err
		}
	}
	progress("oversubscription: a kernel streams once through %s of managed memory on a %s arena, %d runs", uvm.FormatSize(2*o.OversubArena), uvm.FormatSize(o.OversubArena), o.Runs)
	if err := oversubStream(o.OversubArena, o.Runs, o.Thrashing, rep); err != nil {
		return nil, err
	}
	if _, err := plotLaunch(o.PlotDir, rep, progress); err != nil {
		return nil, err
	}
	return rep, nil
}

// pinnedNullLaunches times the null launches and the pipe round trip
// (nullLaunches) both on one thread pinned to one CPU, the pipe's child
// pinned there too: the null launch and the round trip it is compared
// with are measured from the same place. The thread ends with the
// goroutine, so the pinning does not outlive the two measurements.
func pinnedNullLaunches(s *uvm.Session, schedules []ScheduleRow, rounds int, rep *LaunchReport) error {
	done := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // not unlocked: the thread exits with the goroutine
		cpu, err := devmem.CurrentCPU()
		if err == nil {
			err = devmem.PinCurrentThread(cpu)
		}
		if err == nil {
			rep.MeasureCPU = cpu
			err = nullLaunches(s, cpu, schedules, rounds, rep)
		}
		done <- err
	}()
	return <-done
}

// launchTouchRows runs the launch-and-touch rows of one coherence model,
// 0 KiB and 4 KiB to MaxKB, doubling: on s under the fault model, on a
// server of its own under the launch model.
func launchTouchRows(s *uvm.Session, model string, arena int64, workers int, o LaunchOptions, progress Progress, rep *LaunchReport) error {
	if model == "launch" {
		ms, err := coherenceSession(arena, o.Thrashing, "launch", "")
		if err != nil {
			return err
		}
		defer ms.Close()
		s = ms
	}
	sizes := []int{0}
	for kb := 4; kb <= o.MaxKB; kb *= 2 {
		sizes = append(sizes, kb)
	}
	for _, kb := range sizes {
		progress("launch and touch %d KiB, %s coherence", kb, model)
		row, err := launchTouch(s, kb, workers, o.PerSize)
		if err != nil {
			return err
		}
		if model == "launch" {
			rep.LaunchRows = append(rep.LaunchRows, row)
		} else {
			rep.Rows = append(rep.Rows, row)
		}
	}
	return nil
}

// Print writes the report as tables.
func (r *LaunchReport) Print(w io.Writer) {
	fmt.Fprintf(w, "machine: %d CPUs, Linux %s, %s; device 0 has %d workers; thrashing detection %s\n\n", r.Machine.CPUs, r.Machine.Kernel, r.Machine.Go, r.Workers, r.Thrashing)
	fmt.Fprintf(w, "null launch + synchronize against a pipe round trip of %.2f us (same run, from CPU %d):\n", r.PipeRTTUS, r.MeasureCPU)
	fmt.Fprintf(w, "%10s %12s %8s\n", "schedule", "us", "ratio")
	for _, sc := range r.Schedules {
		fmt.Fprintf(w, "%10s %12.2f %8.2f\n", sc.Schedule, sc.NullLaunchUS, sc.ToPipeRTT)
	}
	fmt.Fprintln(w)
	r.printRows(w)
	fmt.Fprintf(w, "\noversubscription: a kernel streams once through %s on a %s arena: %.2f GB/s, the same read of warm memory on as many threads %.2f GB/s, fraction %.3f\n",
		uvm.FormatSize(2*r.oversubArena), r.OversubArena, r.OversubGBps, r.OversubMemcpyGBps, r.OversubMemcpyFraction)
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
func oversubStream(arena int64, runs int, thrash policy.ThrashingSpec, rep *LaunchReport) error {
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

// nullLaunches times the null launch under each schedule and the pipe
// round trip in rounds taken in turn, 400 of each per round after 50 to
// warm up (the first round's also start the device), and fills rep with
// the medians.
func nullLaunches(s *uvm.Session, cpu int, schedules []ScheduleRow, rounds int, rep *LaunchReport) error {
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
	if i := slices.IndexFunc(schedules, func(r ScheduleRow) bool { return r.Flags == uvm.DeviceScheduleAuto }); i >= 0 {
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

func launchTouch(s *uvm.Session, kb, workers int, budget time.Duration) (LaunchRow, error) {
	row := LaunchRow{KB: kb}
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
	kernel, threads := TouchKernel, max(1, min(workers, int(size/uvm.PageSize)))
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
