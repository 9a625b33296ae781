package config

import (
	"strconv"
	"strings"

	"github.com/softuvm/softuvm/devmem"
	"github.com/softuvm/softuvm/internal/core"
	"github.com/softuvm/softuvm/policy"
)

// Setting is one variable of the environment that configures programs,
// their servers and libuvm-preload.so. Settings is the one table of
// them: `uvm help` prints it, the `uvm` flags of the same names take
// their defaults from it, and docs/usage.md's table of variables must
// agree with it (TestSettingsAreTheCodesDefaults and the cli's
// TestHelpDefaultsAreTheCodes check both).
type Setting struct {
	Env string
	// Flag is the flag that overrides the variable: a server flag
	// ("--devices"), a command's own ("uvm run --min-size"), or "".
	Flag string
	// Values says what the variable takes, for `uvm help`; it claims no
	// default (Default is the default).
	Values string
	// Default is what an unset variable means, as `uvm help` and
	// docs/usage.md print it: a value the variable takes where there is
	// one, else a phrase ("unbounded"); "" where unset means nothing
	// more than Values says (no trace recorded, say).
	Default string
	// Server marks a variable ServerConfigFromEnv reads, whose default
	// is therefore the configuration's without it.
	Server bool
}

// Variables that are not the server's: the preload library's, and
// UVM_BIN, the uvm a C program's private server runs from.
const (
	EnvMinSize      = "UVM_MIN_SIZE"
	EnvHeap         = "UVM_HEAP"
	EnvJemalloc     = "UVM_JEMALLOC"
	EnvStatics      = "UVM_STATICS"
	EnvPreload      = "UVM_PRELOAD"
	EnvPreloadStats = "UVM_PRELOAD_STATS"
	EnvBin          = "UVM_BIN"
	// EnvTrace=FILE records one client's own events to FILE: from its
	// session's start, or between the profiler API's start and stop.
	EnvTrace       = "UVM_TRACE"
	EnvTraceAccess = "UVM_TRACE_ACCESS"
)

// DefaultMinSize is the smallest allocation libuvm-preload.so makes a
// managed allocation of its own (preload.c's DEFAULT_MIN_SIZE).
const DefaultMinSize = 1 << 20

// Server modes of a client (UVM_SERVER).
const (
	ServerAuto    = "auto"
	ServerPrivate = "private"
	ServerDaemon  = "daemon"
)

// sizeText writes a size as the variables take it: "1GiB".
func sizeText(n int64) string { return strings.ReplaceAll(core.FormatSize(n), " ", "") }

// Settings lists every variable, in the order `uvm help` prints them.
var Settings = []Setting{
	{Env: EnvServer, Values: "auto (the daemon if one listens, else a private server), private or daemon", Default: ServerAuto},
	{Env: EnvSocket, Flag: "--socket", Values: "the daemon's socket, to use or to serve on",
		Default: "$XDG_RUNTIME_DIR/softuvm/uvm.sock, else /run/softuvm/uvm.sock for root and /tmp/softuvm-UID/uvm.sock for others"},
	{Env: EnvDevices, Flag: "--devices", Values: "number of devices", Default: strconv.Itoa(DefaultDevices), Server: true},
	{Env: EnvArenaSize, Flag: "--arena-size", Values: "each device's memory, or a comma list of one size per device", Default: sizeText(DefaultArenaSize), Server: true},
	{Env: EnvArenaBackend, Flag: "--arena-backend", Values: "auto, memfd or numa, or a comma list, one per device", Default: devmem.BackendAuto.String(), Server: true},
	{Env: EnvPrefetch, Flag: "--prefetch", Values: "density[:PERCENT] (PERCENT 51 where not given), window:PAGES, none, or a registered policy", Default: policy.DefaultPrefetch.String(), Server: true},
	{Env: EnvEviction, Flag: "--eviction", Values: "which blocks leave a full device or the host over its budget: clock, clock:copy, clock:regions, lru, 2q, reuse, or a registered policy", Default: policy.DefaultEviction, Server: true},
	{Env: EnvHandlers, Flag: "--handlers", Values: "follow, per-cpu or single", Default: string(HandlersFollow), Server: true},
	{Env: EnvTrackPrefetch, Flag: "--track-prefetch", Values: "1: record which prefetched pages get used", Default: "0", Server: true},
	{Env: EnvWorkers, Flag: "--device-workers", Values: "threads that run each device's kernels", Default: "one per CPU", Server: true},
	{Env: EnvHostBudget, Flag: "--host-budget", Values: "managed memory kept on the host before pages go to devices", Default: "unbounded", Server: true},
	{Env: EnvThrashing, Flag: "--thrashing", Values: "on, off, or settings: threshold=3,lapse=500us,nap=500us,pin-threshold=10,pin=150ms,epoch=1s,policy=NAME (pages bouncing between processors), refault=on,refault-distance=100,core=97,core-age=4 (a resident core where a processor evicts too early)", Default: "on", Server: true},
	{Env: EnvCopyThreads, Flag: "--copy-threads", Values: "the copy engine's producers per bulk move", Default: "calibrated", Server: true},
	{Env: EnvCopyCalibration, Values: "fresh: measure the copy engine's calibration again rather than read the one kept since boot"},
	{Env: EnvAccessCount, Flag: "--access-counting", Values: "auto (eBPF where it loads, else user space), ebpf, user or off", Default: AccessCountingAuto, Server: true},
	{Env: EnvAccessPolicy, Flag: "--access-policy", Values: "on, off (count only), or settings: hints=on,threshold=256,period=1s,sample=256MiB,decay=32s,anatomy=64,migration=NAME", Default: "on", Server: true},
	{Env: EnvCoherence, Flag: "--coherence", Values: "fault or launch: how host and devices share managed memory", Default: core.CoherenceFault.String(), Server: true},
	{Env: EnvLargeFolios, Flag: "--large-folios", Values: "auto (location files of 2 MiB folios where the server may make a tmpfs: as root) or off", Default: LargeFoliosAuto, Server: true},
	{Env: EnvTrace, Flag: "--trace", Values: "record a trace into this file"},
	{Env: EnvTraceAccess, Flag: "--trace-access", Values: "the traces' access mode: off, on (100ms,64MiB) or PERIOD[,SAMPLE]", Default: TraceAccess{}.String()},
	{Env: EnvDirtyTracking, Flag: "--dirty-tracking", Values: "auto (wp-async where the kernel has it), wp-async or wp-fault: how the launch model finds the pages the CPU wrote", Default: "auto", Server: true},
	{Env: EnvRestarts, Flag: "--restarts", Values: "when the server dies: on (" + strconv.Itoa(DefaultRestartAttempts) + " new servers in a row), a count, or off", Default: FormatRestarts(0), Server: true},
	{Env: EnvMinSize, Flag: "uvm run --min-size", Values: "under libuvm-preload.so: the smallest allocation made managed on its own", Default: sizeText(DefaultMinSize)},
	{Env: EnvHeap, Flag: "uvm run --heap", Values: "under libuvm-preload.so: managed (jemalloc arenas over managed memory) or system (glibc's) for smaller allocations", Default: "managed"},
	{Env: EnvJemalloc, Values: "under libuvm-preload.so, the managed heap: the jemalloc 5 library to load, a name or a path", Default: "libjemalloc.so.2"},
	{Env: EnvStatics, Flag: "uvm run --statics", Values: "under libuvm-preload.so: 1 to make large static arrays managed too, 0 not", Default: "1"},
	{Env: EnvPreload, Flag: "uvm run --preload", Values: "the path of libuvm-preload.so",
		Default: "next to uvm, else ../lib/, else built into the cache"},
	{Env: EnvPreloadStats, Values: "1: libuvm-preload.so prints its counters at exit", Default: "0"},
	{Env: EnvBin, Values: "the uvm binary a C program's private server runs from",
		Default: "the install prefix's bin/uvm, then PATH; under uvm run, the uvm that runs the program"},
}

// SettingOf returns the setting of the variable env; it panics for a
// variable that is not in Settings, a mistake in the code that asks.
func SettingOf(env string) Setting {
	for _, s := range Settings {
		if s.Env == env {
			return s
		}
	}
	panic("config: no setting " + env)
}

// Resolved is c with what an empty field means written out, as the
// server reads it: the eviction policy's name, the coherence model, the
// dirty tracking, large folios and access counting modes, and the access
// policy's settings. `uvm info` shows it; two configurations that
// resolve alike configure the same server.
func (c ServerConfig) Resolved() ServerConfig {
	if c.Eviction == "" {
		c.Eviction = policy.DefaultEviction
	}
	if m, err := core.ParseCoherence(c.Coherence); err == nil {
		c.Coherence = m.String()
	}
	if d, err := core.ParseDirtyTracking(c.DirtyTracking); err == nil && d == core.DirtyAuto {
		c.DirtyTracking = "auto"
	}
	if c.LargeFolios == "" {
		c.LargeFolios = LargeFoliosAuto
	}
	if c.AccessCounting == "" {
		c.AccessCounting = AccessCountingAuto
	}
	c.AccessPolicy = c.ParsedAccessPolicy()
	return c
}
