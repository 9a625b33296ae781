package uvm

import (
	"fmt"

	"github.com/prometheus/procfs"
	"github.com/softuvm/softuvm/bpf"
)

// Access counting: the eBPF program of package bpf counts the user faults
// of every process the server tracks (clients as the CPU, device
// processes as their device), per process and per 64 KiB region. The
// server keeps its pid-to-processor map current as sessions and device
// processes come and go, and shows the counts beside its own and the
// kernel's (minflt) in Info. What the counts drive (hint faults and
// delayed migration) is not built yet.

// Access-counting modes (ServerConfig.AccessCounting).
const (
	AccessCountingAuto = "auto" // eBPF where it loads, else off with the reason in Info
	AccessCountingEBPF = "ebpf" // eBPF or fail
	AccessCountingOff  = "off"
)

// startAccessCounting loads the counters as the configuration asks and
// records the mode Info reports.
func (s *Server) startAccessCounting() error {
	if s.cfg.AccessCounting == AccessCountingOff { // Validate refused any other value
		s.accessMode = "off (configured)"
		return nil
	}
	c, err := bpf.Load(bpf.DefaultThreshold)
	if err != nil {
		if s.cfg.AccessCounting == AccessCountingEBPF {
			return fmt.Errorf("%w: %v", ErrInitialization, err)
		}
		s.accessMode = fmt.Sprintf("off: %v (the user-space fallback, MINOR-mode counting, is not built yet)", err)
		return nil
	}
	s.counters = c
	s.accessMode = fmt.Sprintf("ebpf: exceptions:page_fault_user, 64 KiB regions, threshold %d", bpf.DefaultThreshold)
	return nil
}

// track starts counting pid's faults as location l's.
func (s *Server) track(pid int, l location) {
	if s.counters == nil {
		return
	}
	if err := s.counters.Track(pid, uint32(l)); err != nil {
		s.logger.Printf("access counters: %v", err)
	}
}

func (s *Server) untrack(pid int) {
	if s.counters != nil {
		s.counters.Untrack(pid)
	}
}

// minorFaults is the kernel's count of pid's minor faults (minflt).
func minorFaults(pid int) (uint64, bool) {
	p, err := procfs.NewProc(pid)
	if err != nil {
		return 0, false
	}
	st, err := p.Stat()
	if err != nil {
		return 0, false
	}
	return uint64(st.MinFlt), true
}

// faultCounts fills in the session's fault counts three ways: the
// server's (faults it served), eBPF's (every user fault of the process,
// served by the kernel or the server) and the kernel's minflt, each since
// the session began.
func (sess *session) faultCounts(in *SessionInfo) {
	if sess.role != roleClient {
		return
	}
	in.ServedFaults = sess.counters(nil).snapshot().FaultsBy(CPU).Total()
	if c := sess.srv.counters; c != nil {
		if n, err := c.ProcessFaults(sess.pid); err == nil {
			in.EBPFFaults = &n
		}
	}
	if n, ok := minorFaults(sess.pid); ok && n >= sess.minfltStart {
		d := n - sess.minfltStart
		in.MinorFaults = &d
	}
}
