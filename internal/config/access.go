package config

import "github.com/softuvm/softuvm/internal/core"

// Access-counting modes (ServerConfig.AccessCounting).
const (
	AccessCountingAuto = "auto" // eBPF where it loads, else user space, with the reason in Info
	AccessCountingEBPF = "ebpf" // eBPF or fail
	AccessCountingUser = "user" // user space: MINOR-mode hint faults counted by the server
	AccessCountingOff  = "off"
)

// ProcessFaults counts one process's faults since the server began
// tracking it, as the eBPF counters saw them (nil when they are off) and
// as the kernel's minflt has it (nil if unreadable).
type ProcessFaults struct {
	Processor core.Device `json:"processor"`
	PID       int         `json:"pid"`
	// Served counts the faults the server served for the processor.
	Served      uint64  `json:"served_faults"`
	EBPFFaults  *uint64 `json:"ebpf_faults,omitempty"`
	MinorFaults *uint64 `json:"minflt,omitempty"`
}
