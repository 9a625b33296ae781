package cli

import (
	"fmt"
	"math"
	"os"
	"strconv"
	"strings"

	"github.com/softuvm/softuvm/devmem"
	"github.com/softuvm/softuvm/internal/config"
	"github.com/softuvm/softuvm/internal/core"
	"github.com/softuvm/softuvm/internal/wire"
	"github.com/softuvm/softuvm/uffd"
	"github.com/softuvm/softuvm/uvm"
)

// machineInfo is what `uvm info` reports.
type machineInfo struct {
	Kernel          string         `json:"kernel"`
	OpenDevice      string         `json:"open_dev_userfaultfd"`
	OpenSyscall     string         `json:"open_syscall"`
	Features        string         `json:"features_supported"`
	FeaturesMissing string         `json:"features_missing_for_server,omitempty"`
	Nodes           []devmem.Node  `json:"numa_nodes"`
	Daemon          *serverSummary `json:"daemon,omitempty"`
	Private         []int          `json:"private_servers"`
	// What the UVM_* environment configures a server to be, every empty
	// setting written out as the server reads it (config.Resolved): one
	// configured_* for each server variable of config.Settings.
	Configured     []arenaPlan `json:"configured_devices"`
	Prefetch       string      `json:"configured_prefetch"`
	Eviction       string      `json:"configured_eviction"`
	Handlers       string      `json:"configured_handlers"`
	TrackPrefetch  bool        `json:"configured_track_prefetch"`
	Workers        int         `json:"configured_device_workers"`
	HostBudget     int64       `json:"configured_host_budget"` // bytes; 0: unbounded
	Thrashing      string      `json:"configured_thrashing"`
	CopyThreads    int         `json:"configured_copy_threads"` // 0: calibrated
	AccessCounting string      `json:"configured_access_counting"`
	AccessPolicy   string      `json:"configured_access_policy"`
	// Coherence is the model of clients that do not choose; a client's
	// own UVM_COHERENCE chooses for itself.
	Coherence     string `json:"configured_coherence"`
	LargeFolios   string `json:"configured_large_folios"`
	DirtyTracking string `json:"configured_dirty_tracking"`
	Restarts      string `json:"configured_restarts"`
	// Policies are those this binary knows: a uvm built with package cli
	// lists the ones its packages register too.
	Policies []policyKind `json:"policies"`

	cannotOpen error // why this user cannot use userfaultfd, where neither way opens it
}

type serverSummary struct {
	Socket string   `json:"socket"`
	Info   uvm.Info `json:"info"`
}

type arenaPlan struct {
	Spec     string `json:"spec"`
	Resolved string `json:"resolved,omitempty"`
	Error    string `json:"error,omitempty"`
}

func errText(err error) string {
	if err == nil {
		return "ok"
	}
	return err.Error()
}

func runInfo(args []string) error {
	fs := newFlagSet("info", "[--json]", "Show what this machine offers softuvm: the kernel's userfaultfd features, NUMA nodes, the devices a server would create, and the servers running")
	asJSON := fs.Bool("json", false, "print JSON")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	mi := probeMachine()
	mi.Policies = policyKinds()
	cfgErr := mi.readConfig()
	if *asJSON {
		return writeJSON(os.Stdout, mi)
	}
	mi.printMachine()
	if cfgErr != nil {
		fmt.Printf("configuration   %v\n", cfgErr)
	} else {
		mi.printConfig()
	}
	mi.printServers()
	return nil
}

// probeMachine asks the kernel what it offers (userfaultfd, its features,
// NUMA nodes) and finds the servers running.
func probeMachine() *machineInfo {
	mi := &machineInfo{}
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		mi.Kernel = strings.TrimSpace(string(b))
	}
	dev, sys := uffd.OpenMethods()
	mi.OpenDevice, mi.OpenSyscall = errText(dev), errText(sys)
	if dev != nil && sys != nil {
		mi.cannotOpen = dev
	}
	if f, err := uffd.Supported(); err == nil {
		mi.Features = f.String()
		if missing := core.RequiredFeatures &^ f; missing != 0 {
			mi.FeaturesMissing = missing.String()
		}
	} else {
		mi.Features = "unknown: " + err.Error()
	}
	mi.Nodes, _ = devmem.Nodes()
	if m, err := wire.ConnectMonitor(config.DefaultSocketPath()); err == nil {
		if in, err := m.Info(); err == nil {
			mi.Daemon = &serverSummary{Socket: config.DefaultSocketPath(), Info: in}
		}
		m.Close()
	}
	mi.Private = privateServers()
	if mi.Private == nil {
		mi.Private = []int{}
	}
	return mi
}

// readConfig reads what the UVM_* environment configures a server to
// be, and what each device's arena would be here.
func (mi *machineInfo) readConfig() error {
	cfg, err := uvm.ServerConfigFromEnv()
	if err != nil {
		return err
	}
	cfg = cfg.Resolved()
	mi.Prefetch = cfg.Prefetch.String()
	mi.Eviction = cfg.Eviction
	mi.Handlers = string(cfg.Handlers)
	mi.TrackPrefetch = cfg.TrackPrefetchUse
	mi.Workers = config.DeviceWorkers(cfg)
	mi.HostBudget = cfg.HostBudget
	mi.Thrashing = cfg.Thrashing.String()
	mi.CopyThreads = cfg.CopyProducers
	mi.AccessCounting = cfg.AccessCounting
	mi.AccessPolicy = cfg.AccessPolicy.String()
	mi.Coherence = cfg.Coherence
	mi.LargeFolios = cfg.LargeFolios
	mi.DirtyTracking = cfg.DirtyTracking
	mi.Restarts = config.FormatRestarts(cfg.Restarts)
	for _, spec := range cfg.Devices {
		plan := arenaPlan{Spec: spec.String()}
		if a, err := devmem.NewArena(spec); err != nil {
			plan.Error = err.Error()
		} else {
			plan.Resolved = a.Spec().String()
			if r := a.FallbackReason(); r != nil {
				plan.Resolved += " (" + r.Error() + ")"
			}
		}
		mi.Configured = append(mi.Configured, plan)
	}
	return nil
}

// printMachine prints what the kernel offers.
func (mi *machineInfo) printMachine() {
	fmt.Printf("kernel          %s\n", mi.Kernel)
	fmt.Printf("userfaultfd     /dev/userfaultfd: %s\n", mi.OpenDevice)
	fmt.Printf("                userfaultfd(2):   %s\n", mi.OpenSyscall)
	fmt.Printf("features        %s\n", mi.Features)
	if mi.FeaturesMissing != "" {
		fmt.Printf("                MISSING for the server: %s\n", mi.FeaturesMissing)
	}
	if mi.cannotOpen != nil {
		fmt.Printf("                this user cannot use userfaultfd: %v\n", mi.cannotOpen)
	}
	fmt.Printf("numa nodes      %d\n", len(mi.Nodes))
	for _, n := range mi.Nodes {
		fmt.Printf("  node %d        cpus %v, memory %s (%s free)\n", n.ID, n.CPUs, uvm.FormatSize(n.MemTotal), uvm.FormatSize(n.MemFree))
	}
}

// printConfig prints what the environment configures.
func (mi *machineInfo) printConfig() {
	fmt.Printf("devices         %d configured (UVM_DEVICES, UVM_ARENA_SIZE, UVM_ARENA_BACKEND), prefetch %s\n", len(mi.Configured), mi.Prefetch)
	for i, p := range mi.Configured {
		if p.Error != "" {
			fmt.Printf("  device %d      %s: %s\n", i, p.Spec, p.Error)
		} else {
			fmt.Printf("  device %d      %s, %d workers\n", i, p.Resolved, mi.Workers)
		}
	}
	budget := "unbounded"
	if mi.HostBudget > 0 {
		budget = uvm.FormatSize(mi.HostBudget)
	}
	copyThreads := "calibrated"
	if mi.CopyThreads > 0 {
		copyThreads = strconv.Itoa(mi.CopyThreads)
	}
	fmt.Printf("eviction        %s (UVM_EVICTION), host budget %s (UVM_HOST_BUDGET)\n", mi.Eviction, budget)
	fmt.Printf("handlers        %s (UVM_HANDLERS), copy threads %s (UVM_COPY_THREADS), track prefetch use %t (UVM_TRACK_PREFETCH)\n", mi.Handlers, copyThreads, mi.TrackPrefetch)
	fmt.Printf("thrashing       %s\n", mi.Thrashing)
	fmt.Printf("access          counting %s (UVM_ACCESS_COUNTING), policy %s (UVM_ACCESS_POLICY)\n", mi.AccessCounting, mi.AccessPolicy)
	fmt.Printf("coherence       %s for clients that do not choose (UVM_COHERENCE); the launch model's dirty tracking %s (UVM_DIRTY_TRACKING)\n", mi.Coherence, mi.DirtyTracking)
	fmt.Printf("large folios    %s (UVM_LARGE_FOLIOS)%s\n", mi.LargeFolios, largeFoliosHere(mi.LargeFolios))
	fmt.Printf("restarts        %s (UVM_RESTARTS)\n", mi.Restarts)
}

// printServers prints the policies this binary knows and the servers
// running: the daemon and the private servers.
func (mi *machineInfo) printServers() {
	for i, k := range mi.Policies {
		label := ""
		if i == 0 {
			label = "policies"
		}
		fmt.Printf("%-15s %-17s %s\n", label, k.Kind, strings.Join(k.Names, ", "))
	}
	if mi.Daemon == nil {
		fmt.Printf("daemon          none at %s (programs start a private server)\n", config.DefaultSocketPath())
	} else {
		printServer("daemon", mi.Daemon.Socket, mi.Daemon.Info)
	}
	for _, pid := range mi.Private {
		if m, err := wire.ConnectMonitor(config.PrivateServerSocketPath(pid)); err == nil {
			if in, err := m.Info(); err == nil {
				printServer("private server", config.PrivateServerSocketPath(pid), in)
			}
			m.Close()
		}
	}
}

func printServer(kind, socket string, in uvm.Info) {
	eviction := in.Eviction
	if in.EvictionUse != "" {
		eviction += " (" + in.EvictionUse + ")"
	}
	fmt.Printf("%-15s pid %d on %s, up %s, handlers %s on CPUs %v, prefetch %s, eviction %s\n", kind, in.PID, socket, in.Uptime, in.Handlers, in.HandlerCPUs, in.Prefetch, eviction)
	fmt.Printf("                features granted to clients: %s\n", in.Features)
	fmt.Printf("                access counting: %s\n", in.AccessCounting)
	fmt.Printf("                coherence for clients that do not choose: %s (the launch model finds written pages by %s; concurrent managed access %d)\n",
		in.Coherence, in.DirtyTracking, concurrentManagedAccess(in.Coherence))
	fmt.Printf("                large folios: %s; blocks broken into 4 KiB folios as part of one left: %d\n", in.LargeFolios, in.FoliosRebuilt)
	fmt.Printf("                managed memory on the host: %s now, at most %s at once since the server started\n",
		humanSize(uint64(in.HostResidentBytes)), humanSize(uint64(in.HostPeakBytes)))
	if in.StrayPresentPages+in.LostPages > 0 {
		fmt.Printf("                WARNING: %d pages found present where a move put them (written over), %d resident pages missing from their file (read as zeros): a server bug; its log names each page\n",
			in.StrayPresentPages, in.LostPages)
	}
	c := in.CopyEngine
	source := c.Source
	switch {
	case strings.HasPrefix(source, "defaults"):
		copies := "never"
		if c.CopyDirectBelow != math.MaxInt64 {
			copies = uvm.FormatSize(c.CopyDirectBelow)
		}
		fmt.Printf("                copy engine: %d producers for copies, %d for migrations, %d block movers; engine from %s for copies, never for migrations\n",
			c.CopyProducers, c.MigrationProducers, c.BlockMovers, copies)
		source += ", chosen from the CPU count"
	default:
		fmt.Printf("                copy engine: %d producers for copies, %d for migrations (memcpy %.1f GB/s on one CPU, %.1f on all %d; new pages %.1f GB/s); engine from %s for copies, %s for migrations\n",
			c.CopyProducers, c.MigrationProducers, c.HostCopyGBps, c.AllCopyGBps, c.CPUs, c.InstallGBps, config.FormatDirectBelow(c.CopyDirectBelow), config.FormatDirectBelow(c.DirectBelow))
		if c.Kept != "" {
			source = "kept: measured by an earlier server since boot, " + c.Kept
		} else {
			source = fmt.Sprintf("measured by this server (in %.2f s, at idle priority)", float64(c.Took)/1e9)
		}
	}
	fmt.Printf("                copy engine figures: %s (UVM_COPY_CALIBRATION=fresh measures again)\n", source)
	for _, d := range in.Devices {
		fmt.Printf("  %-13v %s used of %s (%s, node %d, %d workers)\n", d.Device, uvm.FormatSize(d.UsedBytes), uvm.FormatSize(d.Capacity), d.Backend, d.Node, d.Workers)
	}
	for _, s := range in.Sessions {
		if s.Role == "client" {
			model := s.Coherence
			if s.DirtyTracking != "" {
				model += ", dirty tracking " + s.DirtyTracking
			}
			fmt.Printf("  client pid %d (coherence %s): %d allocations, %s managed, %s on the host; faults served %d, seen by eBPF %s, minflt %s\n", s.PID, model, s.Allocations, uvm.FormatSize(s.ManagedBytes), uvm.FormatSize(s.HostBytes),
				s.ServedFaults, optCount(s.EBPFFaults), optCount(s.MinorFaults))
			fmt.Printf("    resident %s; location files hold %s (%s beyond what is resident)\n", uvm.FormatSize(s.ResidentBytes), uvm.FormatSize(s.FileBytes), uvm.FormatSize(max(0, s.FileBytes-s.ResidentBytes)))
			for _, d := range s.Devices {
				fmt.Printf("    %v process pid %d: faults served %d, seen by eBPF %s, minflt %s\n", d.Processor, d.PID, d.Served, optCount(d.EBPFFaults), optCount(d.MinorFaults))
			}
		}
	}
}

// largeFoliosHere says what "auto" gives on this machine.
func largeFoliosHere(setting string) string {
	if setting != config.LargeFoliosAuto {
		return ""
	}
	if err := devmem.LargeFoliosAvailable(); err != nil {
		return ": here off, " + err.Error()
	}
	return ": here on"
}

// concurrentManagedAccess is cudaDevAttrConcurrentManagedAccess under a
// coherence model: 1 where the CPU and devices may touch managed memory at
// the same time.
func concurrentManagedAccess(coherence string) int {
	if coherence == "launch" {
		return 0
	}
	return 1
}

// optCount prints a count that may be missing.
func optCount(n *uint64) string {
	if n == nil {
		return "-"
	}
	return strconv.FormatUint(*n, 10)
}
