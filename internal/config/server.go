package config

import "github.com/softuvm/softuvm/internal/core"

// Info is the server's configuration and state, for `uvm info` and
// `uvm stat`.
type Info struct {
	PID      int    `json:"pid"`
	Uptime   string `json:"uptime"`
	Features string `json:"userfaultfd_features"`
	Prefetch string `json:"prefetch"`
	Eviction string `json:"eviction"`
	// EvictionUse says, for an eviction policy that watches how the
	// host uses its blocks (clock), whether it can now, or why not;
	// empty for a policy that does not.
	EvictionUse string           `json:"eviction_use,omitempty"`
	Handlers    HandlerPlacement `json:"handlers"`
	// Coherence is the model of clients that do not choose, and
	// DirtyTracking how the launch model finds written pages on this
	// kernel (wp-async or wp-fault).
	Coherence     string `json:"coherence"`
	DirtyTracking string `json:"dirty_tracking"`
	// LargeFolios says whether location files take 2 MiB folios, or
	// why not ("off: ...").
	LargeFolios string `json:"large_folios"`
	// FoliosRebuilt counts blocks a location held in a large folio and
	// rebuilt in 4 KiB folios before part of them left it.
	FoliosRebuilt uint64 `json:"folios_rebuilt"`
	// StrayPresentPages counts pages a move found already in the file
	// it installed them in, though the residency table had them
	// elsewhere (a large folio's zeroed remainder, say), and wrote
	// over. LostPages counts pages the table held resident whose file
	// had lost them: they read as zeros. Both stay zero unless the
	// server has a bug; the server log names each page.
	StrayPresentPages uint64 `json:"stray_present_pages"`
	LostPages         uint64 `json:"lost_pages"`
	// HostResidentBytes is the managed memory resident on the host now,
	// every session's, what a host budget bounds; HostPeakBytes the
	// most that was resident there at once since this server started
	// (a takeover starts again from what it adopted). Under a budget the
	// peak may pass it a little (eviction runs after pages arrive, and
	// the budget is soft); without one it is the managed peak a budget
	// would constrain.
	HostResidentBytes int64         `json:"host_resident_bytes"`
	HostPeakBytes     int64         `json:"host_peak_bytes"`
	HandlerCPUs       []int         `json:"handler_cpus"`
	Guard             bool          `json:"guard"`
	Sessions          []SessionInfo `json:"sessions"`
	Devices           []ArenaInfo   `json:"devices"`
	StrayFaults       uint64        `json:"stray_faults"`
	PoisonedPage      uint64        `json:"poisoned_pages"`
	GoMaxProcs        int           `json:"gomaxprocs"`
	// CopyEngine is the copy engine's calibration, with the
	// configuration's overrides applied.
	CopyEngine CopyCalibration `json:"copy_engine"`
	// AccessCounting says how accesses are counted, or why they are not.
	AccessCounting string `json:"access_counting"`
	// Anatomy is the fault anatomy's histograms (nil without eBPF or
	// sampling).
	Anatomy *core.FaultAnatomy `json:"anatomy,omitempty"`
	// Restart describes the server's takeovers.
	Restart RestartInfo `json:"restart"`
	// VMStat is the growth of the kernel's system-wide counters
	// (/proc/vmstat: pgfault, pgmajfault, pgalloc_normal, pgfree) since
	// the server started.
	VMStat map[string]uint64 `json:"vmstat,omitempty"`
}

// RestartInfo says whether this server took over from one that died, and
// how long that took.
type RestartInfo struct {
	// Restarts counts the servers that died (or retired) before this one
	// in its line; 0 for a server that started fresh.
	Restarts uint64 `json:"restarts"`
	// PauseMS is the time from the death of the last one to service
	// resumed here.
	PauseMS float64 `json:"pause_ms"`
	// AdoptedPages is the number of pages found in the files when
	// residency was rebuilt, and RebuildMS the time that took.
	AdoptedPages int64   `json:"adopted_pages"`
	RebuildMS    float64 `json:"rebuild_ms"`
	// RecoveredPages were carried by migrations when the server died and
	// put back in the host file from the staging file.
	RecoveredPages int64 `json:"recovered_pages"`
	// Policy is how many new servers in a row the guard starts ("off":
	// none, pages not on the host are poisoned).
	Policy string `json:"policy"`
	// GuardPID is the guard process holding every session's state, 0
	// without one.
	GuardPID int `json:"guard_pid"`
}

// SessionInfo describes one connected process.
type SessionInfo struct {
	ID   uint64 `json:"id"`
	PID  int    `json:"pid"`
	Role string `json:"role"`
	// Coherence is the client's model (fault or launch) and, under
	// launch, DirtyTracking how its written pages are found.
	Coherence     string `json:"coherence,omitempty"`
	DirtyTracking string `json:"dirty_tracking,omitempty"`
	Allocations   int    `json:"allocations"`
	// ManagedBytes is the sum of the allocations' sizes; HostBytes the
	// memory their host file holds.
	ManagedBytes int64 `json:"managed_bytes"`
	HostBytes    int64 `json:"host_bytes"`
	// ResidentBytes is what the allocations have resident, on the host
	// and on devices; FileBytes what the session's location files hold.
	// The difference is memory that large folios hold beyond resident
	// pages (a folio the kernel could not split), or allocated pages of
	// device memory.
	ResidentBytes int64 `json:"resident_bytes"`
	FileBytes     int64 `json:"file_bytes"`
	// Faults of a client since it connected, three ways: those the
	// server served, every user fault the eBPF counters saw (nil when
	// they are off), and the kernel's minflt (nil if unreadable).
	ServedFaults uint64  `json:"served_faults"`
	EBPFFaults   *uint64 `json:"ebpf_faults,omitempty"`
	MinorFaults  *uint64 `json:"minflt,omitempty"`
	// Devices counts the faults of the client's device processes the
	// same three ways, since each started.
	Devices []ProcessFaults `json:"device_processes,omitempty"`
}

// ArenaInfo describes one device's arena.
type ArenaInfo struct {
	core.DeviceInfo
	UsedBytes int64 `json:"used_bytes"`
	// FileBytes is what the arena's files really hold (st_blocks): equal
	// to UsedBytes unless accounting went wrong.
	FileBytes int64 `json:"file_bytes"`
}
