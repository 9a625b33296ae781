package cli

import (
	"flag"
	"fmt"
	"os"

	"github.com/softuvm/softuvm/lab"
	"github.com/softuvm/softuvm/uvm"
)

// replayFlags are the flags that choose what a replay runs, shared by
// `uvm trace replay` and `uvm lab score`.
type replayFlags struct {
	prefetch, eviction, thrashing *string
	hostBudget, arenaSize         *string
	devices                       *int
	largeFolios                   *string
	costs                         *string
}

func addReplayFlags(fs *flag.FlagSet) *replayFlags {
	return &replayFlags{
		prefetch:    fs.String("prefetch", "", "prefetch policy (as uvm serve takes it; \"oracle\": exactly the pages of the block needed soon); default: the trace's"),
		eviction:    fs.String("eviction", "", "eviction policy (as uvm serve takes it; \"opt\": Belady's MIN, which knows the future); default: the trace's"),
		thrashing:   fs.String("thrashing", "", "thrashing setting (as uvm serve takes it, or off); default: the trace's"),
		hostBudget:  fs.String("host-budget", "", "host budget (SIZE, or none); default: the trace's"),
		arenaSize:   fs.String("arena-size", "", "each device's memory (SIZE); default: the trace's"),
		devices:     fs.Int("devices", 0, "devices (default: the trace's)"),
		largeFolios: fs.String("large-folios", "", "on or off: whether blocks move whole as 2 MiB folios; default: the trace's"),
		costs:       fs.String("costs", "", "a JSON file of costs to price the estimated time: the output of `uvm bench faults --json` on the machine wanted, or fault_ns, minor_fault_ns, wp_fault_ns, page_to_device_ns, page_to_host_ns, page_peer_ns, populate_ns; default: what the trace measured"),
	}
}

// config turns the flags into a replay's configuration.
func (f *replayFlags) config() (lab.Config, error) {
	cfg := lab.Config{Prefetch: *f.prefetch, Eviction: *f.eviction, Thrashing: *f.thrashing, Devices: *f.devices, LargeFolios: *f.largeFolios}
	switch *f.hostBudget {
	case "":
	case "none", "0":
		cfg.HostBudget = -1
	default:
		n, err := uvm.ParseSize(*f.hostBudget)
		if err != nil {
			return cfg, fmt.Errorf("--host-budget: %w", err)
		}
		cfg.HostBudget = n
	}
	if *f.arenaSize != "" {
		n, err := uvm.ParseSize(*f.arenaSize)
		if err != nil || n < 1 {
			return cfg, fmt.Errorf("--arena-size %q: want a size above 0", *f.arenaSize)
		}
		cfg.DeviceBytes = n
	}
	if *f.devices < 0 {
		return cfg, fmt.Errorf("--devices %d: want 1 or more (0: the trace's)", *f.devices)
	}
	if *f.costs != "" {
		b, err := os.ReadFile(*f.costs)
		if err != nil {
			return cfg, fmt.Errorf("--costs: %w", err)
		}
		c, err := lab.ParseCosts(b)
		if err != nil {
			return cfg, fmt.Errorf("--costs %s: %w", *f.costs, err)
		}
		cfg.Costs = &c
	}
	return cfg, nil
}

func runTraceReplay(args []string) error {
	fs := newFlagSet("trace replay", "[--prefetch P] [--eviction E] [--thrashing T] [--host-budget B] [--arena-size S] [--json] TRACE",
		"Replay policies over a recorded trace with residency simulated in memory (no root, no userfaultfd): the faults its references would take, the pages moved each way, evictions, and an estimated time. Without policy flags it replays the trace's own policies, and compares with what the recorded run did (fidelity)")
	rf := addReplayFlags(fs)
	asJSON := fs.Bool("json", false, "print JSON")
	if _, err := parseArgs(fs, args); err != nil {
		return err
	}
	if fs.NArg() != 1 {
		fmt.Fprintf(fs.Output(), "uvm trace replay: want one TRACE file, got %d arguments\n", fs.NArg())
		return errUsage
	}
	cfg, err := rf.config()
	if err != nil {
		return err
	}
	res, err := lab.ReplayFile(fs.Arg(0), cfg)
	if err != nil {
		return err
	}
	if *asJSON {
		return writeJSON(os.Stdout, res)
	}
	res.Write(os.Stdout)
	return nil
}
