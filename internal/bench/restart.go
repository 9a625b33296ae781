package bench

import (
	"fmt"
	"io"
	"slices"
	"syscall"
	"time"

	"github.com/softuvm/softuvm/internal/config"
	"github.com/softuvm/softuvm/uvm"
)

// RestartReport is what `uvm bench restart` measured, its JSON what
// --json prints.
type RestartReport struct {
	Machine Machine `json:"machine"`
	Kills   int     `json:"kills"`
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

// RestartOptions are what `uvm bench restart` measures: its flags.
type RestartOptions struct {
	Kills    int   // servers killed
	Size     int64 // managed memory the servers hold
	Progress Progress
}

// Restart is `uvm bench restart`: a private server killed Kills times
// under a client holding Size of managed memory (half on the host, half
// on device 0): the pause the client sees from the kill to an answer,
// the new server's rebuild of residency from the files, and every byte
// checked after.
func Restart(o RestartOptions) (*RestartReport, error) {
	progress := o.Progress.orQuiet()
	size := o.Size
	cfg := uvm.DefaultServerConfig()
	cfg.Devices = config.DeviceSpecs(1, []int64{size}, cfg.Devices[0].Backend)
	s, err := uvm.Connect(uvm.Config{Server: "private", Private: cfg})
	if err != nil {
		return nil, err
	}
	defer s.Close()
	a, err := s.MallocManaged(size)
	if err != nil {
		return nil, err
	}
	b := a.Bytes()
	pattern := func(i int) byte { return byte(i*31 + i>>12) }
	for i := range b {
		b[i] = pattern(i)
	}
	if err := s.Prefetch(a.Addr()+uintptr(size/2), size/2, 0); err != nil {
		return nil, err
	}
	rep := &RestartReport{Machine: ThisMachine(), Kills: o.Kills, ResidentBytes: size}
	var pauses, serverPauses, rebuilds []float64
	progress("killing the server %d times under %s of managed memory", o.Kills, uvm.FormatSize(size))
	for k := 0; k < o.Kills; k++ {
		in, err := s.Info()
		if err != nil {
			return nil, err
		}
		if err := syscall.Kill(in.PID, syscall.SIGKILL); err != nil {
			return nil, fmt.Errorf("kill server %d: %w", in.PID, err)
		}
		killed := time.Now()
		after, err := s.Info() // answered by the server that takes over
		if err != nil {
			return nil, fmt.Errorf("after kill %d: %w", k+1, err)
		}
		pauses = append(pauses, float64(time.Since(killed))/1e6)
		if after.PID == in.PID || after.Restart.Restarts != uint64(k+1) {
			return nil, fmt.Errorf("after kill %d: server %d (restart %d), want a new one (restart %d)", k+1, after.PID, after.Restart.Restarts, k+1)
		}
		serverPauses = append(serverPauses, after.Restart.PauseMS)
		rebuilds = append(rebuilds, after.Restart.RebuildMS)
		rep.AdoptedPages = after.Restart.AdoptedPages
		time.Sleep(50 * time.Millisecond) // the new server's handlers settle
	}
	for i := range b {
		if b[i] != pattern(i) {
			return nil, fmt.Errorf("byte %#x is %#x after the kills, want %#x", i, b[i], pattern(i))
		}
	}
	rep.Checked = true
	rep.PauseP50MS, rep.ServerPauseP50MS, rep.RebuildP50MS = median(pauses), median(serverPauses), median(rebuilds)
	rep.PauseMaxMS = slices.Max(pauses)
	if rep.RebuildP50MS > 0 {
		rep.AdoptedPagesPerSec = float64(rep.AdoptedPages) / (rep.RebuildP50MS / 1e3)
	}
	return rep, nil
}

// Print writes the report.
func (r *RestartReport) Print(w io.Writer) {
	fmt.Fprintf(w, "server killed %d times under %s of managed memory (half on the host, half on device 0)\n", r.Kills, uvm.FormatSize(r.ResidentBytes))
	fmt.Fprintf(w, "  pause seen by a client (kill to answer)  p50 %.1f ms, max %.1f ms\n", r.PauseP50MS, r.PauseMaxMS)
	fmt.Fprintf(w, "  pause seen by the new server             p50 %.1f ms\n", r.ServerPauseP50MS)
	fmt.Fprintf(w, "  residency rebuilt from the files         %d pages in %.1f ms (p50): %.0f pages/s\n", r.AdoptedPages, r.RebuildP50MS, r.AdoptedPagesPerSec)
	fmt.Fprintf(w, "  every byte right after the kills         %v\n", r.Checked)
}
