package cli

import (
	"fmt"
	"os"
	"slices"
	"syscall"
	"time"

	"github.com/softuvm/softuvm/internal/config"
	"github.com/softuvm/softuvm/uvm"
)

// restartReport is what `uvm bench restart --json` prints.
type restartReport struct {
	Machine machineSummary `json:"machine"`
	Kills   int            `json:"kills"`
	// ResidentBytes is the managed memory the killed servers held, half
	// on the host and half on device 0.
	ResidentBytes int64 `json:"resident_bytes"`
	// The pause a client sees: from the SIGKILL to the answer of a
	// request sent right after it (the guard notices, starts a server,
	// which takes over and answers the request sent again).
	PauseP50MS float64 `json:"pause_p50_ms"`
	PauseMaxMS float64 `json:"pause_max_ms"`
	// The new servers' own figure: from the guard seeing the death to
	// service resumed.
	ServerPauseP50MS float64 `json:"server_pause_p50_ms"`
	// Residency rebuilt from the files: pages found, time, rate.
	AdoptedPages       int64   `json:"adopted_pages"`
	RebuildP50MS       float64 `json:"rebuild_p50_ms"`
	AdoptedPagesPerSec float64 `json:"adopted_pages_per_second"`
	// Checked is true when every byte read back right after the kills.
	Checked bool `json:"checked"`
}

func benchRestart(args []string) error {
	fs := newFlagSet("bench restart", "[--json] [--kills N] [--size SIZE]",
		"Kill a private server N times under a client holding SIZE of managed memory (half on the host, half on device 0): the pause a client sees from the kill to an answer, the new server's rebuild of residency from the files, and every byte checked after")
	asJSON := fs.Bool("json", false, "print one JSON object")
	kills := fs.Int("kills", 20, "servers killed")
	sizeText := fs.String("size", "512MiB", "managed memory the servers hold")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	size, err := uvm.ParseSize(*sizeText)
	if err != nil {
		return fmt.Errorf("--size: %w", err)
	}
	if *kills < 1 || size < 1<<20 {
		return fmt.Errorf("want --kills >= 1 and --size >= 1MiB")
	}
	progress := func(format string, a ...any) { fmt.Fprintf(os.Stderr, "uvm bench: "+format+"\n", a...) }
	cfg := uvm.DefaultServerConfig()
	cfg.Devices = config.DeviceSpecs(1, []int64{size}, cfg.Devices[0].Backend)
	s, err := uvm.Connect(uvm.Config{Server: "private", Private: cfg})
	if err != nil {
		return err
	}
	defer s.Close()
	a, err := s.MallocManaged(size)
	if err != nil {
		return err
	}
	b := a.Bytes()
	pattern := func(i int) byte { return byte(i*31 + i>>12) }
	for i := range b {
		b[i] = pattern(i)
	}
	if err := s.Prefetch(a.Addr()+uintptr(size/2), size/2, 0); err != nil {
		return err
	}
	rep := restartReport{Machine: machineSummary{CPUs: cpus(), Kernel: kernelRelease(), Go: goVersion()}, Kills: *kills, ResidentBytes: size}
	var pauses, serverPauses, rebuilds []float64
	progress("killing the server %d times under %s of managed memory", *kills, uvm.FormatSize(size))
	for k := 0; k < *kills; k++ {
		in, err := s.Info()
		if err != nil {
			return err
		}
		if err := syscall.Kill(in.PID, syscall.SIGKILL); err != nil {
			return fmt.Errorf("kill server %d: %w", in.PID, err)
		}
		killed := time.Now()
		after, err := s.Info() // answered by the server that takes over
		if err != nil {
			return fmt.Errorf("after kill %d: %w", k+1, err)
		}
		pauses = append(pauses, float64(time.Since(killed))/1e6)
		if after.PID == in.PID || after.Restart.Restarts != uint64(k+1) {
			return fmt.Errorf("after kill %d: server %d (restart %d), want a new one (restart %d)", k+1, after.PID, after.Restart.Restarts, k+1)
		}
		serverPauses = append(serverPauses, after.Restart.PauseMS)
		rebuilds = append(rebuilds, after.Restart.RebuildMS)
		rep.AdoptedPages = after.Restart.AdoptedPages
		time.Sleep(50 * time.Millisecond) // the new server's handlers settle
	}
	for i := range b {
		if b[i] != pattern(i) {
			return fmt.Errorf("byte %#x is %#x after the kills, want %#x", i, b[i], pattern(i))
		}
	}
	rep.Checked = true
	rep.PauseP50MS, rep.ServerPauseP50MS, rep.RebuildP50MS = median(pauses), median(serverPauses), median(rebuilds)
	rep.PauseMaxMS = slices.Max(pauses)
	if rep.RebuildP50MS > 0 {
		rep.AdoptedPagesPerSec = float64(rep.AdoptedPages) / (rep.RebuildP50MS / 1e3)
	}
	if *asJSON {
		return writeJSON(os.Stdout, rep)
	}
	fmt.Printf("server killed %d times under %s of managed memory (half on the host, half on device 0)\n", rep.Kills, uvm.FormatSize(size))
	fmt.Printf("  pause seen by a client (kill to answer)  p50 %.1f ms, max %.1f ms\n", rep.PauseP50MS, rep.PauseMaxMS)
	fmt.Printf("  pause seen by the new server             p50 %.1f ms\n", rep.ServerPauseP50MS)
	fmt.Printf("  residency rebuilt from the files         %d pages in %.1f ms (p50): %.0f pages/s\n", rep.AdoptedPages, rep.RebuildP50MS, rep.AdoptedPagesPerSec)
	fmt.Printf("  every byte right after the kills         %v\n", rep.Checked)
	return nil
}
