package config

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/softuvm/softuvm/devmem"
	"github.com/softuvm/softuvm/internal/core"
	"github.com/softuvm/softuvm/policy"
)

// Environment variables that configure the runtime. A private server
// inherits them from its client; `uvm serve` flags override them.
const (
	EnvSocket        = "UVM_SOCKET"          // daemon socket to use (or serve on)
	EnvServer        = "UVM_SERVER"          // "auto" (default), "private" or "daemon"
	EnvDevices       = "UVM_DEVICES"         // number of devices
	EnvArenaSize     = "UVM_ARENA_SIZE"      // bytes per device, or a comma list, e.g. "1GiB" or "512MiB,2GiB"
	EnvArenaBackend  = "UVM_ARENA_BACKEND"   // auto, memfd or numa, or a comma list, one per device
	EnvPrefetch      = "UVM_PREFETCH"        // density[:PERCENT], window:PAGES, none
	EnvHandlers      = "UVM_HANDLERS"        // follow (default), per-cpu or single
	EnvTrackPrefetch = "UVM_TRACK_PREFETCH"  // 1: track which prefetched pages get used
	EnvWorkers       = "UVM_DEVICE_WORKERS"  // threads per device process (default: one per CPU)
	EnvHostBudget    = "UVM_HOST_BUDGET"     // bytes of managed memory kept on the host (default: unbounded)
	EnvEviction      = "UVM_EVICTION"        // clock (default), lru, 2q, reuse, or a registered eviction policy
	EnvThrashing     = "UVM_THRASHING"       // on (default), off, or settings: threshold=3,lapse=500us,...,refault=on,core=97,...
	EnvCopyThreads   = "UVM_COPY_THREADS"    // the copy engine's producer threads (default: calibrated)
	EnvAccessCount   = "UVM_ACCESS_COUNTING" // auto (default), ebpf, user or off
	EnvAccessPolicy  = "UVM_ACCESS_POLICY"   // on (default), off, or settings: threshold=256,period=1s,...
	EnvRestarts      = "UVM_RESTARTS"        // new servers in a row the guard starts when one dies (default 5), or off
	EnvCoherence     = "UVM_COHERENCE"       // fault (default) or launch: how host and devices share managed memory
	EnvDirtyTracking = "UVM_DIRTY_TRACKING"  // auto (default), wp-async or wp-fault: how the launch model finds written pages
	EnvLargeFolios   = "UVM_LARGE_FOLIOS"    // auto (default) or off: location files of 2 MiB folios
	// EnvCopyCalibration=fresh makes a server measure the copy engine's
	// calibration again instead of reading the one kept since boot.
	EnvCopyCalibration = "UVM_COPY_CALIBRATION"

	RoleEnv         = "SOFTUVM_ROLE"          // set in re-executed server and guard processes
	ServerConfigEnv = "SOFTUVM_SERVER_CONFIG" // a private server's configuration, JSON
	testDelayEnv    = "SOFTUVM_TEST_FAULT_DELAY"
	// crashAfterPunchEnv=N makes a server kill itself right after the
	// Nth punch of a migration's source, before the pages are installed
	// (a test of the staging file); servers that take over do not see it.
	CrashAfterPunchEnv = "SOFTUVM_TEST_CRASH_AFTER_PUNCH"
	// CrashInMoveEnv=written:N makes a server kill itself in the Nth
	// whole move that writes its destination from its source, right
	// after the write; copied:N, after it recorded the write as done,
	// before it punches the source; torn:N, as written:N after spoiling
	// the second half of the destination, as an unfinished write would
	// (tests of the staging file's move intents). Servers that take
	// over do not see it.
	CrashInMoveEnv = "SOFTUVM_TEST_CRASH_IN_MOVE"
	// adoptFailEnv makes every server the guard starts fail before it
	// takes over (a test of the guard's bounded retries).
	AdoptFailEnv = "SOFTUVM_TEST_ADOPT_FAIL"
)

// Default device configuration: one device with a 1 GiB arena.
const (
	DefaultDevices   = 1
	DefaultArenaSize = 1 << 30
)

// HandlerPlacement says how the server's fault-handling threads are laid
// out over CPUs.
type HandlerPlacement string

const (
	// HandlersFollow (the default) runs one handler thread pinned to each
	// CPU but keeps waiting only those on CPUs the session's threads fault
	// on, so that a fault is served on the CPU that took it without waking
	// the others. On this kind of VM a fault served on the same CPU costs
	// about 8.5 us, one served on another CPU 45-50 us, and each extra
	// waiting handler on an idle CPU adds several microseconds of wake-up.
	HandlersFollow HandlerPlacement = "follow"
	// HandlersPerCPU keeps a handler waiting on every CPU, for comparison.
	HandlersPerCPU HandlerPlacement = "per-cpu"
	// HandlersSingle runs one unpinned handler thread, for comparison.
	HandlersSingle HandlerPlacement = "single"
)

// ServerConfig configures a fault server. It is plain data.
type ServerConfig struct {
	Devices  []devmem.ArenaSpec  `json:"devices"`
	Prefetch policy.PrefetchSpec `json:"prefetch"`
	// Eviction names the policy that picks which blocks leave a full
	// location: "clock" (the default, also ""), "lru", "2q", "reuse", or
	// "name[:arg]" of a policy given to policy.RegisterEviction.
	Eviction string           `json:"eviction,omitempty"`
	Handlers HandlerPlacement `json:"handlers"`
	// Coherence is the model of clients that do not choose: fault (the
	// default) or launch. A client's UVM_COHERENCE chooses for itself.
	Coherence string `json:"coherence,omitempty"`
	// DirtyTracking is how the launch model learns which pages the CPU
	// wrote: wp-async where the kernel has it (the default), or wp-fault.
	DirtyTracking string `json:"dirty_tracking,omitempty"`
	// LargeFolios is whether location files take 2 MiB folios, so that
	// a block moving whole costs one allocation and one free: auto (the
	// default, and "": where a private huge=always tmpfs can be made,
	// which needs root) or off.
	LargeFolios string `json:"large_folios,omitempty"`
	// TrackPrefetchUse makes allocations that do not choose track
	// whether prefetched pages get used (see Stats.PrefetchedUsed).
	TrackPrefetchUse bool `json:"track_prefetch_use"`
	// Guard starts the guard process that turns the faults of clients
	// into SIGBUS, with a message, if this server dies.
	Guard bool `json:"guard"`
	// HostBudget bounds the managed memory resident on the host, in bytes
	// (0: unbounded): above it, the least recently migrated host pages go
	// to the device with the most room, and fault back on use.
	HostBudget int64 `json:"host_budget,omitempty"`
	// DeviceWorkers is the number of threads each device process runs
	// kernels on; 0 means one per CPU.
	DeviceWorkers int `json:"device_workers,omitempty"`
	// CopyProducers overrides the copy engine's N_P, the number of
	// producer threads of a bulk move, and the number of blocks a move of
	// many blocks moves at once (0: chosen from the calibration).
	CopyProducers int `json:"copy_producers,omitempty"`
	// CopyDirectBelow overrides the size under which a migration or a
	// copy does not use the copy engine (0: calibrated).
	CopyDirectBelow int64 `json:"copy_direct_below,omitempty"`
	// AccessCounting is "auto" (eBPF access counters where they load,
	// else counting in user space, with the reason in Info), "ebpf" (or
	// fail), "user" (user space: MINOR-mode faults on remote mappings,
	// counted by the server) or "off".
	AccessCounting string `json:"access_counting,omitempty"`
	// AccessPolicy configures hint faults, delayed migration and the
	// fault anatomy (accesspolicy.go); the zero value means the defaults.
	AccessPolicy policy.AccessPolicy `json:"access_policy"`
	// Thrashing configures thrashing detection (thrash.go).
	Thrashing policy.ThrashingSpec `json:"thrashing"`
	// Mechanism holds the block engine's numbers (read-ahead depth, the
	// whole-move share, pin waits, eviction rounds and waits); the zero
	// value means the defaults, policy.DefaultMechanism.
	Mechanism policy.Mechanism `json:"mechanism,omitzero"`
	// Restarts is how many new servers in a row the guard starts to take
	// over when the server dies, each failing before it has taken over,
	// before it gives up and poisons every page not on the host. 0 means
	// the default (5); a negative number turns takeover off.
	Restarts int `json:"restarts,omitempty"`
	// FaultDelay stalls every fault this long before serving it. Tests
	// use it to hold a thread inside a fault.
	FaultDelay core.Duration `json:"fault_delay,omitempty"`
	// Trace is a file the server records every session's faults,
	// migrations and other events into (package trace), "" for none.
	// TraceCommand is the program recorded, for the trace's header.
	Trace        string   `json:"trace,omitempty"`
	TraceCommand []string `json:"trace_command,omitempty"`
	// TraceAccess turns on the traces' access mode (a zero Period: off),
	// for the server's trace and for clients recording their own.
	TraceAccess TraceAccess `json:"trace_access,omitzero"`
	// Metrics is the address (host:port, as bound) at which a daemon
	// serves its statistics in the Prometheus text format (uvm serve
	// --metrics), "" for none; MetricsAnyAddress lets it be other than a
	// loopback address. Kept with the rest, so that a server that takes
	// the daemon over, or replaces it, serves them there too.
	Metrics           string `json:"metrics,omitempty"`
	MetricsAnyAddress bool   `json:"metrics_any_address,omitempty"`
}

// TraceAccess configures a trace's access mode: every Period, in each
// processor's view of a traced client, up to Sample bytes of managed
// memory are unmapped while staying where they are, and the next round
// records which of them the processor mapped again by touching them.
type TraceAccess struct {
	Period core.Duration `json:"period,omitempty"`
	Sample int64         `json:"sample,omitempty"`
}

// DefaultTraceAccessSample is the bytes a round arms in each view when a
// setting names only the period, and DefaultTraceAccessPeriod the period
// of "on".
const (
	DefaultTraceAccessSample = 64 << 20
	DefaultTraceAccessPeriod = 100 * time.Millisecond
)

// Access-mode periods: shorter rounds would spend a CPU re-arming, and a
// longer one sees too little to be worth it.
const (
	minTraceAccessPeriod = 10 * time.Millisecond
	maxTraceAccessPeriod = time.Minute
)

// ParseTraceAccess reads an access mode setting: "off" (or empty), "on",
// or PERIOD[,SAMPLE] such as "100ms" or "100ms,16MiB".
func ParseTraceAccess(s string) (TraceAccess, error) {
	v := strings.TrimSpace(s)
	switch v {
	case "", "off":
		return TraceAccess{}, nil
	case "on":
		return TraceAccess{Period: core.Duration(DefaultTraceAccessPeriod), Sample: DefaultTraceAccessSample}, nil
	}
	want := "want off, on (100ms,64MiB), or PERIOD[,SAMPLE] such as 100ms or 100ms,16MiB, with a period from 10ms to 1m"
	periodText, sampleText, hasSample := strings.Cut(v, ",")
	period, err := time.ParseDuration(strings.TrimSpace(periodText))
	if err != nil || period < minTraceAccessPeriod || period > maxTraceAccessPeriod {
		return TraceAccess{}, fmt.Errorf("%w: access mode %q: period %q: %s", core.ErrInvalidValue, s, periodText, want)
	}
	a := TraceAccess{Period: core.Duration(period), Sample: DefaultTraceAccessSample}
	if hasSample {
		n, err := core.ParseSize(sampleText)
		if err != nil || n < core.PageSize {
			return TraceAccess{}, fmt.Errorf("%w: access mode %q: sample %q: want a size of at least 4KiB", core.ErrInvalidValue, s, sampleText)
		}
		a.Sample = n
	}
	return a, nil
}

// On reports whether the access mode is on.
func (a TraceAccess) On() bool { return a.Period > 0 }

// String is the inverse of ParseTraceAccess.
func (a TraceAccess) String() string {
	if !a.On() {
		return "off"
	}
	return fmt.Sprintf("%v,%s", time.Duration(a.Period), strings.ReplaceAll(core.FormatSize(a.Sample), " ", ""))
}

// ParseRestarts reads a restart setting: "off", "on" (the default) or a
// count of new servers in a row, 1 to 1000.
func ParseRestarts(s string) (int, error) {
	switch v := strings.TrimSpace(s); v {
	case "off", "0":
		return -1, nil
	case "on", "":
		return 0, nil
	default:
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 1000 {
			return 0, fmt.Errorf("%w: restarts %q: want off, on, or a count from 1 to 1000", core.ErrInvalidValue, s)
		}
		return n, nil
	}
}

// FormatRestarts is the inverse of ParseRestarts.
func FormatRestarts(n int) string {
	switch {
	case n < 0:
		return "off"
	case n == 0:
		return "on"
	}
	return strconv.Itoa(n)
}

// DeviceWorkers is the number of threads each device process of a server
// configured with c runs kernels on.
func DeviceWorkers(c ServerConfig) int { return c.Workers() }

// DefaultServerConfig is the configuration without flags or environment.
func DefaultServerConfig() ServerConfig {
	return ServerConfig{
		Devices:      []devmem.ArenaSpec{{Device: 0, Capacity: DefaultArenaSize, Backend: devmem.BackendAuto, Node: -1}},
		Prefetch:     policy.DefaultPrefetch,
		Handlers:     HandlersFollow,
		Guard:        true,
		Thrashing:    policy.DefaultThrashing,
		AccessPolicy: policy.DefaultAccessPolicy,
	}
}

// ServerConfigFromEnv starts from the defaults and applies the UVM_*
// environment variables.
func ServerConfigFromEnv() (ServerConfig, error) {
	c := DefaultServerConfig()
	return c, c.applyEnv(os.Getenv)
}

// DeviceSpecs builds n device specs with one backend; device i gets
// sizes[i], or the last size given when there are fewer sizes than
// devices.
func DeviceSpecs(n int, sizes []int64, backend devmem.Backend) []devmem.ArenaSpec {
	return DeviceSpecsEach(n, sizes, []devmem.Backend{backend})
}

// DeviceSpecsEach is DeviceSpecs with a backend per device, the last one
// given repeating.
func DeviceSpecsEach(n int, sizes []int64, backends []devmem.Backend) []devmem.ArenaSpec {
	specs := make([]devmem.ArenaSpec, n)
	for i := range specs {
		size := int64(DefaultArenaSize)
		if len(sizes) > 0 {
			size = sizes[min(i, len(sizes)-1)]
		}
		backend := devmem.BackendAuto
		if len(backends) > 0 {
			backend = backends[min(i, len(backends)-1)]
		}
		specs[i] = devmem.ArenaSpec{Device: i, Capacity: size, Backend: backend, Node: -1}
	}
	return specs
}

// ParseBackends reads one arena backend, or a comma list of one per
// device.
func ParseBackends(text string) ([]devmem.Backend, error) {
	var out []devmem.Backend
	for _, part := range strings.Split(text, ",") {
		b, err := devmem.ParseBackend(strings.TrimSpace(part))
		if err != nil {
			return nil, fmt.Errorf("%w: arena backend %q: %v", core.ErrInvalidValue, part, err)
		}
		out = append(out, b)
	}
	return out, nil
}

func UnmarshalServerConfig(s string) (ServerConfig, error) {
	var c ServerConfig
	if err := json.Unmarshal([]byte(s), &c); err != nil {
		return c, fmt.Errorf("%w: server configuration: %v", core.ErrInvalidValue, err)
	}
	return c, c.Validate()
}

// DefaultSocketPath is where `uvm serve` listens and clients look for a
// daemon: $UVM_SOCKET, else $XDG_RUNTIME_DIR/softuvm/uvm.sock, else
// /run/softuvm/uvm.sock for root and /tmp/softuvm-UID/uvm.sock for others.
func DefaultSocketPath() string {
	if p := os.Getenv(EnvSocket); p != "" {
		return p
	}
	return filepath.Join(RuntimeDir(), "uvm.sock")
}

// runtimeDir holds the daemon socket and the monitor sockets of private
// servers (uvm-PID.sock), so that `uvm stat` can find every server.
func RuntimeDir() string {
	if d := os.Getenv("XDG_RUNTIME_DIR"); d != "" {
		return filepath.Join(d, "softuvm")
	}
	if os.Geteuid() == 0 {
		return "/run/softuvm"
	}
	return filepath.Join(os.TempDir(), fmt.Sprintf("softuvm-%d", os.Geteuid()))
}

// PrivateServerSocketPath is the monitor socket of the private server
// with the given process id.
func PrivateServerSocketPath(pid int) string {
	return filepath.Join(RuntimeDir(), fmt.Sprintf("uvm-%d.sock", pid))
}

// PrivateServerSocketDir holds the monitor sockets of private servers.
func PrivateServerSocketDir() string { return RuntimeDir() }

// restartAttempts is the configured Restarts as the guard counts them.
func (c ServerConfig) RestartAttempts() int {
	switch {
	case c.Restarts < 0:
		return 0
	case c.Restarts == 0:
		return DefaultRestartAttempts
	}
	return c.Restarts
}

func (c ServerConfig) Workers() int {
	if c.DeviceWorkers > 0 {
		return c.DeviceWorkers
	}
	return runtime.NumCPU()
}

// accessPolicy is the configured access policy, the defaults for a
// configuration that names none.
func (c ServerConfig) ParsedAccessPolicy() policy.AccessPolicy {
	if c.AccessPolicy == (policy.AccessPolicy{}) {
		return policy.DefaultAccessPolicy
	}
	return c.AccessPolicy
}

// Policies is the choice of policies c holds, as NewSet takes it: the
// one description a server builds its policy set from.
func (c ServerConfig) Policies() policy.Specs {
	return policy.Specs{Prefetch: c.Prefetch, Eviction: c.Eviction, Thrashing: c.Thrashing, Access: c.ParsedAccessPolicy(), Mechanism: c.Mechanism}
}

// Validate checks every field and names the first bad value.
func (c ServerConfig) Validate() error {
	if err := c.ValidateSettings(); err != nil {
		return err
	}
	return c.Policies().Validate()
}

// ValidateSettings checks every field but the policies, which building
// them checks (policy.NewSet): a server checks its configuration this
// way and builds its policies once.
func (c ServerConfig) ValidateSettings() error {
	if len(c.Devices) > core.MaxDevices {
		return fmt.Errorf("%w: %d devices: at most %d are supported", core.ErrInvalidValue, len(c.Devices), core.MaxDevices)
	}
	for i, d := range c.Devices {
		if d.Device != i {
			return fmt.Errorf("%w: device spec %d has index %d, want %d", core.ErrInvalidValue, i, d.Device, i)
		}
		if err := d.Validate(); err != nil {
			return fmt.Errorf("%w: device %d: %v", core.ErrInvalidValue, i, err)
		}
	}
	switch c.Handlers {
	case HandlersFollow, HandlersPerCPU, HandlersSingle:
	default:
		return fmt.Errorf("%w: handler placement %q: want %q, %q or %q", core.ErrInvalidValue, c.Handlers, HandlersFollow, HandlersPerCPU, HandlersSingle)
	}
	if _, err := core.ParseCoherence(c.Coherence); err != nil {
		return err
	}
	if _, err := core.ParseDirtyTracking(c.DirtyTracking); err != nil {
		return err
	}
	if err := CheckLargeFolios(c.LargeFolios); err != nil {
		return err
	}
	if c.HostBudget < 0 {
		return fmt.Errorf("%w: host budget %d: must not be negative", core.ErrInvalidValue, c.HostBudget)
	}
	if c.Restarts > 1000 {
		return fmt.Errorf("%w: %d restarts: want at most 1000 (or off)", core.ErrInvalidValue, c.Restarts)
	}
	if c.DeviceWorkers < 0 || c.DeviceWorkers > 1024 {
		return fmt.Errorf("%w: %d device workers: want 0 (one per CPU) to 1024", core.ErrInvalidValue, c.DeviceWorkers)
	}
	if c.FaultDelay < 0 {
		return fmt.Errorf("%w: fault delay %d: must not be negative", core.ErrInvalidValue, c.FaultDelay)
	}
	if c.CopyProducers < 0 || c.CopyProducers > 1024 {
		return fmt.Errorf("%w: %d copy threads: want 0 (calibrated) to 1024", core.ErrInvalidValue, c.CopyProducers)
	}
	switch c.AccessCounting {
	case "", AccessCountingAuto, AccessCountingEBPF, AccessCountingUser, AccessCountingOff:
	default:
		return fmt.Errorf("%w: access counting %q: want %q, %q, %q or %q", core.ErrInvalidValue, c.AccessCounting, AccessCountingAuto, AccessCountingEBPF, AccessCountingUser, AccessCountingOff)
	}
	if c.CopyDirectBelow < 0 {
		return fmt.Errorf("%w: copy direct-path size %d: must not be negative", core.ErrInvalidValue, c.CopyDirectBelow)
	}
	return nil
}

func (c *ServerConfig) applyEnv(getenv func(string) string) error {
	devices := len(c.Devices)
	if v := getenv(EnvDevices); v != "" {
		n, err := strconv.Atoi(strings.TrimSpace(v))
		if err != nil || n < 0 || n > core.MaxDevices {
			return fmt.Errorf("%w: %s=%q: want a device count from 0 to %d", core.ErrInvalidValue, EnvDevices, v, core.MaxDevices)
		}
		devices = n
	}
	sizes := []int64{DefaultArenaSize}
	if len(c.Devices) > 0 {
		sizes = []int64{c.Devices[0].Capacity}
	}
	if v := getenv(EnvArenaSize); v != "" {
		sizes = sizes[:0]
		for _, part := range strings.Split(v, ",") {
			n, err := core.ParseSize(part)
			if err != nil {
				return fmt.Errorf("%s=%q: %w", EnvArenaSize, v, err)
			}
			sizes = append(sizes, n)
		}
	}
	backends := []devmem.Backend{devmem.BackendAuto}
	if len(c.Devices) > 0 {
		backends = []devmem.Backend{c.Devices[0].Backend}
	}
	if v := getenv(EnvArenaBackend); v != "" {
		var err error
		if backends, err = ParseBackends(v); err != nil {
			return fmt.Errorf("%s=%q: %w", EnvArenaBackend, v, err)
		}
	}
	c.Devices = DeviceSpecsEach(devices, sizes, backends)
	if v := getenv(EnvPrefetch); v != "" {
		p, err := policy.ParsePrefetchSpec(v)
		if err != nil {
			return fmt.Errorf("%s: %w", EnvPrefetch, err)
		}
		c.Prefetch = p
	}
	if v := getenv(EnvHandlers); v != "" {
		c.Handlers = HandlerPlacement(v)
	}
	if v := getenv(EnvCoherence); v != "" {
		if _, err := core.ParseCoherence(v); err != nil {
			return fmt.Errorf("%s: %w", EnvCoherence, err)
		}
		c.Coherence = v
	}
	if v := getenv(EnvDirtyTracking); v != "" {
		if _, err := core.ParseDirtyTracking(v); err != nil {
			return fmt.Errorf("%s: %w", EnvDirtyTracking, err)
		}
		c.DirtyTracking = v
	}
	if v := getenv(EnvLargeFolios); v != "" {
		if err := CheckLargeFolios(v); err != nil {
			return fmt.Errorf("%s: %w", EnvLargeFolios, err)
		}
		c.LargeFolios = v
	}
	if v := getenv(EnvHostBudget); v != "" {
		n, err := core.ParseSize(v)
		if err != nil {
			return fmt.Errorf("%s=%q: %w", EnvHostBudget, v, err)
		}
		c.HostBudget = n
	}
	if v := getenv(EnvRestarts); v != "" {
		n, err := ParseRestarts(v)
		if err != nil {
			return fmt.Errorf("%s=%q: %w", EnvRestarts, v, err)
		}
		c.Restarts = n
	}
	if v := getenv(EnvWorkers); v != "" {
		n, err := strconv.Atoi(strings.TrimSpace(v))
		if err != nil || n < 1 || n > 1024 {
			return fmt.Errorf("%w: %s=%q: want 1 to 1024 threads", core.ErrInvalidValue, EnvWorkers, v)
		}
		c.DeviceWorkers = n
	}
	if v := getenv(EnvAccessCount); v != "" {
		c.AccessCounting = strings.TrimSpace(v)
	}
	if v := getenv(EnvAccessPolicy); v != "" {
		a, err := policy.ParseAccessPolicy(v)
		if err != nil {
			return fmt.Errorf("%s=%q: %w", EnvAccessPolicy, v, err)
		}
		c.AccessPolicy = a
	}
	if v := getenv(EnvCopyThreads); v != "" {
		n, err := strconv.Atoi(strings.TrimSpace(v))
		if err != nil || n < 1 || n > 1024 {
			return fmt.Errorf("%w: %s=%q: want 1 to 1024 threads", core.ErrInvalidValue, EnvCopyThreads, v)
		}
		c.CopyProducers = n
	}
	if v := getenv(EnvEviction); v != "" {
		if err := policy.ValidateEviction(v); err != nil {
			return fmt.Errorf("%s: %w", EnvEviction, err)
		}
		c.Eviction = v
	}
	if v := getenv(EnvThrashing); v != "" {
		t, err := policy.ParseThrashingSpec(v)
		if err != nil {
			return fmt.Errorf("%s=%q: %w", EnvThrashing, v, err)
		}
		c.Thrashing = t
	}
	if v := getenv(EnvTrackPrefetch); v != "" {
		b, err := strconv.ParseBool(v)
		if err != nil {
			return fmt.Errorf("%w: %s=%q: want 0 or 1", core.ErrInvalidValue, EnvTrackPrefetch, v)
		}
		c.TrackPrefetchUse = b
	}
	return c.Validate()
}

func (c ServerConfig) Marshal() string {
	b, err := json.Marshal(c)
	if err != nil {
		panic(err) // plain data always marshals
	}
	return string(b)
}

// Large folio settings (ServerConfig.LargeFolios).
const (
	LargeFoliosAuto = "auto"
	LargeFoliosOff  = "off"
)

// CheckLargeFolios accepts "", auto and off.
func CheckLargeFolios(s string) error {
	switch s {
	case "", LargeFoliosAuto, LargeFoliosOff:
		return nil
	}
	return fmt.Errorf("%w: large folios %q: want %s or %s", core.ErrInvalidValue, s, LargeFoliosAuto, LargeFoliosOff)
}
