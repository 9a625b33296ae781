package main

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"sort"
	"time"

	"github.com/softuvm/softuvm/devmem"
	"github.com/softuvm/softuvm/uvm"
)

// Kernels of the launch benchmark.
func init() {
	// touchPages: params = address, length; thread t of n touches one
	// byte of every page of its share, as the seed experiment's kernel.
	uvm.MustRegisterKernel("uvm-bench-touch", func(tid, n int, p []byte) {
		addr, length := uintptr(binary.LittleEndian.Uint64(p)), int64(binary.LittleEndian.Uint64(p[8:]))
		pages := length / uvm.PageSize
		b := devmem.BytesAt(addr, length)
		for pg := int64(tid) * pages / int64(n); pg < int64(tid+1)*pages/int64(n); pg++ {
			b[pg*uvm.PageSize]++
		}
	})
	uvm.MustRegisterKernel("uvm-bench-nothing", func(tid, n int, p []byte) {})
}

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
	// NullLaunchUS is a launch of an empty kernel plus synchronize;
	// PipeRTTUS a pipe ping-pong round trip between two processes, in the
	// same run.
	NullLaunchUS  float64 `json:"null_launch_us"`
	PipeRTTUS     float64 `json:"pipe_rtt_us"`
	NullLaunchRTT float64 `json:"null_launch_to_pipe_rtt"`
	Workers       int     `json:"device_workers"`
}

func benchLaunch(args []string) error {
	fs := newFlagSet("bench launch", "[--json] [--max-kb N] [--seconds S]",
		"Reproduce the launch-and-touch experiment (a kernel touches a managed buffer, the host touches it back), and time a null launch against a pipe round trip")
	asJSON := fs.Bool("json", false, "print one JSON object")
	maxKB := fs.Int("max-kb", 65536, "largest buffer, in KiB")
	seconds := fs.Float64("seconds", 0.3, "time spent on each size")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if *maxKB < 4 || *seconds <= 0 {
		return fmt.Errorf("want --max-kb >= 4 and --seconds > 0")
	}
	progress := func(format string, a ...any) { fmt.Fprintf(os.Stderr, "uvm bench: "+format+"\n", a...) }
	cfg := uvm.DefaultServerConfig()
	cfg.Devices = uvm.DeviceSpecs(1, []int64{max(uvm.DefaultArenaSize, 2*int64(*maxKB)<<10)}, cfg.Devices[0].Backend)
	s, err := uvm.Connect(uvm.Config{Server: "private", Private: cfg})
	if err != nil {
		return err
	}
	defer s.Close()
	workers, _ := s.DeviceGetAttribute(uvm.AttrWorkerCount, 0)
	rep := launchReport{Machine: machineSummary{CPUs: cpus(), Kernel: kernelRelease(), Go: goVersion()}, Workers: int(workers)}

	progress("null launch: an empty kernel plus synchronize")
	if rep.NullLaunchUS, err = nullLaunch(s); err != nil {
		return err
	}
	progress("pipe round trip between two processes")
	if rep.PipeRTTUS, err = pipeRTT(); err != nil {
		return err
	}
	rep.NullLaunchRTT = rep.NullLaunchUS / rep.PipeRTTUS

	sizes := []int{0}
	for kb := 4; kb <= *maxKB; kb *= 2 {
		sizes = append(sizes, kb)
	}
	for _, kb := range sizes {
		progress("launch and touch %d KiB", kb)
		row, err := launchTouch(s, kb, int(workers), time.Duration(*seconds*float64(time.Second)))
		if err != nil {
			return err
		}
		rep.Rows = append(rep.Rows, row)
	}
	if *asJSON {
		enc := json.NewEncoder(os.Stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(rep)
	}
	fmt.Printf("machine: %d CPUs, Linux %s, %s; device 0 has %d workers\n\n", rep.Machine.CPUs, rep.Machine.Kernel, rep.Machine.Go, rep.Workers)
	fmt.Printf("null launch + synchronize %7.2f us, pipe round trip %7.2f us, ratio %.2f\n\n", rep.NullLaunchUS, rep.PipeRTTUS, rep.NullLaunchRTT)
	fmt.Printf("%10s %12s %14s\n", "KB", "us/iter", "MB/s (back)")
	for _, r := range rep.Rows {
		mb := "-"
		if r.MBps != nil {
			mb = fmt.Sprintf("%.1f", *r.MBps)
		}
		fmt.Printf("%10d %12.2f %14s\n", r.KB, r.USPerIter, mb)
	}
	return nil
}

func medianDuration(d []time.Duration) time.Duration {
	sort.Slice(d, func(i, j int) bool { return d[i] < d[j] })
	return d[len(d)/2]
}

func nullLaunch(s *uvm.Session) (float64, error) {
	var lat []time.Duration
	for i := 0; i < 2200; i++ {
		t0 := time.Now()
		if err := s.Launch(0, nil, "uvm-bench-nothing", 1, nil); err != nil {
			return 0, err
		}
		if err := s.DefaultStreamSynchronize(0); err != nil {
			return 0, err
		}
		if i >= 200 { // the first ones start the device and warm up
			lat = append(lat, time.Since(t0))
		}
	}
	return float64(medianDuration(lat).Nanoseconds()) / 1e3, nil
}

// pipeRTT times a one-byte ping-pong with a child process over two pipes.
func pipeRTT() (float64, error) {
	exe, err := os.Executable()
	if err != nil {
		return 0, err
	}
	cmd := exec.Command(exe, "__pingpong")
	toChild, err := cmd.StdinPipe()
	if err != nil {
		return 0, err
	}
	fromChild, err := cmd.StdoutPipe()
	if err != nil {
		return 0, err
	}
	if err := cmd.Start(); err != nil {
		return 0, err
	}
	defer cmd.Wait()
	defer toChild.Close()
	var lat []time.Duration
	b := []byte{1}
	for i := 0; i < 2200; i++ {
		t0 := time.Now()
		if _, err := toChild.Write(b); err != nil {
			return 0, err
		}
		if _, err := io.ReadFull(fromChild, b); err != nil {
			return 0, err
		}
		if i >= 200 {
			lat = append(lat, time.Since(t0))
		}
	}
	return float64(medianDuration(lat).Nanoseconds()) / 1e3, nil
}

// pingPong is the child of pipeRTT: it echoes bytes until stdin closes.
func pingPong() int {
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
	kernel, threads := "uvm-bench-touch", max(1, min(workers, int(size/uvm.PageSize)))
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
	var lat []time.Duration
	start := time.Now()
	for len(lat) < 7 || time.Since(start) < budget {
		t0 := time.Now()
		if err := iter(); err != nil {
			return row, err
		}
		lat = append(lat, time.Since(t0))
	}
	row.USPerIter = float64(medianDuration(lat).Nanoseconds()) / 1e3
	if size > 0 {
		mbps := float64(size) / row.USPerIter // bytes per microsecond = MB/s
		row.MBps = &mbps
	}
	return row, nil
}
