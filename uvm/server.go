package uvm

import (
	"encoding/json"
	"errors"
	"fmt"
	"log"
	"net"
	"os"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/softuvm/softuvm/devmem"
	"github.com/softuvm/softuvm/uffd"
)

// Server is the fault server: it owns every client's userfaultfd, the
// location files and the residency of every page, and serves faults on
// handler threads that never touch managed memory themselves.
type Server struct {
	cfg      ServerConfig
	arenas   []*devmem.Arena
	prefetch PrefetchPolicy
	stats    *counters
	features uffd.Feature // what the server asks of each client's userfaultfd
	started  time.Time
	logger   *log.Logger

	cpus []int // where each session's handler threads go; -1 unpinned

	lrus      []lru        // per location: blocks by last migration in
	hostPages atomic.Int64 // pages resident on the host, all sessions

	sessionsMu    sync.Mutex
	sessions      map[uint64]*session // guarded by sessionsMu
	nextSessionID atomic.Uint64
	strayFaults   atomic.Uint64 // faults on addresses no range owns
	poisoned      atomic.Uint64 // pages poisoned because a fault could not be served

	guard   *guardLink
	staging *stagingArea // the buffers migrations carry pages in (staging.go)
	mode    byte         // modePrivate or modeDaemon: what the guard restarts
	restart restartStats // this server's takeover, if it took over
	// keptListeners are the listening sockets the guard holds too.
	keptMu        sync.Mutex
	keptListeners []keptListenerRef
	idle          chan struct{} // signalled when the last session ends
	// crashAfterPunch counts down to a self-inflicted SIGKILL after a
	// punch (tests only; 0: never).
	crashAfterPunch atomic.Int64

	listenersMu sync.Mutex
	listeners   []net.Listener
	closeOnce   sync.Once
	done        chan struct{}

	access      *accessState      // access counting and what it drives
	vmstatStart map[string]uint64 // /proc/vmstat when the server started

	calibrated chan struct{} // closed once the copy calibration is done
	// engines are the migrations' copy engines, one per node; byLocation
	// the one for each location. Made once, at the first move, so that a
	// move on the fault path finds its engine without a lock.
	enginesOnce sync.Once
	engines     *copyEngines
	byLocation  []*copyEngine
}

// RequiredFeatures are the userfaultfd features the server cannot work
// without; wantedFeatures it uses when present.
const (
	RequiredFeatures = uffd.FeatureMissingShmem | uffd.FeatureWPHugetlbfsShmem | uffd.FeatureThreadID
	// Unmap and remove events are not asked for: each makes the client's
	// munmap or madvise wait until a handler reads it, and every ioctl
	// on the userfaultfd fail with EAGAIN meanwhile. Free goes through
	// the control socket instead. Remap events are, so that an mremap of
	// managed memory (unsupported) fails loudly rather than leaving the
	// moved pages unregistered, where holes would fill with zeros.
	wantedFeatures = RequiredFeatures | uffd.FeatureEventRemap | uffd.FeaturePoison |
		uffd.FeatureWPUnpopulated | uffd.FeatureMinorShmem
)

// NewServer creates the arenas and starts the handler threads. It serves
// nobody until Serve or ServeConn is called.
func NewServer(cfg ServerConfig) (*Server, error) {
	return newServer(cfg, serverStart{mode: modePrivate})
}

// serverStart is how a server begins: fresh, or taking over from one that
// died (adopt.go), with the dead one's guard and staging area.
type serverStart struct {
	guard    *guardLink
	staging  *stagingArea
	mode     byte
	attempts int
}

// keptListenerRef is a listener the guard holds a copy of.
type keptListenerRef struct {
	path string
	l    *net.UnixListener
}

func newServer(cfg ServerConfig, start serverStart) (*Server, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	supported, err := uffd.Supported()
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrInitialization, err)
	}
	if missing := RequiredFeatures &^ supported; missing != 0 {
		return nil, fmt.Errorf("%w: this kernel's userfaultfd lacks %v, which the fault server needs", ErrNotSupported, missing)
	}
	prefetch, err := NewPrefetchPolicy(cfg.Prefetch)
	if err != nil {
		return nil, err
	}
	s := &Server{
		cfg:      cfg,
		prefetch: prefetch,
		features: wantedFeatures & supported,
		started:  time.Now(),
		logger:   log.New(os.Stderr, fmt.Sprintf("softuvm server[%d]: ", os.Getpid()), 0),
		sessions: map[uint64]*session{},
		done:     make(chan struct{}),
		idle:     make(chan struct{}, 1),
		mode:     start.mode,
		staging:  start.staging,
	}
	if s.staging == nil {
		if s.staging, err = newStagingArea(); err != nil {
			return nil, err
		}
	}
	if v := os.Getenv(crashAfterPunchEnv); v != "" {
		n, _ := strconv.Atoi(v)
		s.crashAfterPunch.Store(int64(n))
		os.Unsetenv(crashAfterPunchEnv) // not for the guard and the servers it starts
	}
	for _, spec := range cfg.Devices {
		a, err := devmem.NewArena(spec)
		if err != nil {
			s.closeArenas()
			return nil, fmt.Errorf("%w: device %d: %v", ErrInitialization, spec.Device, err)
		}
		s.arenas = append(s.arenas, a)
	}
	s.calibrated = make(chan struct{})
	go func() { // the engine needs it at the first bulk move, not before
		defer close(s.calibrated)
		copyCalibration()
	}()
	s.stats = newCounters(s.locations())
	s.lrus = make([]lru, s.locations())
	if s.cpus, err = s.handlerCPUs(); err != nil {
		return nil, err
	}
	if err := s.startAccessCounting(); err != nil {
		return nil, err
	}
	s.vmstatStart = readVMStat()
	// Handler threads wait in read(2); when one returns it needs a P at
	// once, so keep a few more Ps than CPUs.
	if n := runtime.NumCPU() + 2; runtime.GOMAXPROCS(0) < n {
		runtime.GOMAXPROCS(n)
	}

	switch {
	case start.guard != nil:
		s.guard = start.guard
		go s.watchGuard()
	case cfg.Guard:
		g, err := startGuard()
		if err != nil {
			// Without a guard the server still works; only its death
			// would be handled less well. Say so and go on.
			s.logger.Printf("no guard process (%v): if this server dies, its clients' data not on the host is lost", err)
			break
		}
		s.guard = g
		g.send(guardConfigMsg(s.mode, cfg.restartAttempts(), cfg.marshal()))
		g.send([]byte{guardStaging}, s.staging.file.Fd())
		go s.watchGuard()
	}
	return s, nil
}

// afterPunch is where a test makes the server die with pages in flight.
func (s *Server) afterPunch() {
	if s.crashAfterPunch.Load() > 0 && s.crashAfterPunch.Add(-1) == 0 {
		syscall.Kill(os.Getpid(), syscall.SIGKILL)
	}
}

// locations is the number of places a page can live: the host and each
// device.
func (s *Server) locations() int { return 1 + len(s.arenas) }

// closeArenas reports arenas whose accounting went wrong: every session
// has ended by now, so each should be empty.
func (s *Server) closeArenas() {
	for i, a := range s.arenas {
		if used := a.UsedBytes(); used != 0 || a.AccountingErrors() != 0 {
			s.logger.Printf("device %d arena: %d bytes still accounted after every session ended (%d accounting errors: %s)", i, used, a.AccountingErrors(), a.LastAccountingError())
		}
	}
}

// Devices describes the configured devices.
func (s *Server) Devices() []DeviceInfo {
	out := make([]DeviceInfo, len(s.arenas))
	for i, a := range s.arenas {
		spec := a.Spec()
		out[i] = DeviceInfo{Device: Device(i), Capacity: a.Capacity(), Backend: spec.Backend.String(), Node: spec.Node, Workers: s.cfg.workers()}
	}
	return out
}

// Serve accepts connections on l until Close. Each connection is one
// session: a client, or a monitor such as `uvm stat`.
func (s *Server) Serve(l *net.UnixListener) error {
	s.listenersMu.Lock()
	s.listeners = append(s.listeners, l)
	s.listenersMu.Unlock()
	for {
		c, err := l.AcceptUnix()
		if err != nil {
			select {
			case <-s.done:
				return nil
			default:
			}
			if errors.Is(err, net.ErrClosed) {
				return nil
			}
			s.logger.Printf("accept: %v", err)
			time.Sleep(10 * time.Millisecond)
			continue
		}
		go s.ServeConn(c)
	}
}

// ServeConn runs one session on an established connection and returns
// when the peer goes away.
func (s *Server) ServeConn(c *net.UnixConn) {
	defer c.Close()
	peer, err := checkPeer(c)
	if err != nil {
		s.logger.Printf("refusing connection: %v", err)
		return
	}
	sess, err := s.handshake(c, peer)
	if err != nil {
		if !errors.Is(err, errPeerGone) {
			s.logger.Printf("handshake: %v", err)
		}
		return
	}
	defer s.endSession(sess)
	sess.controlLoop()
}

// Done is closed when the server has been closed.
func (s *Server) Done() <-chan struct{} { return s.done }

// Close ends every session, stops the handler threads and releases the
// arenas. Clients' managed memory that is not on the host is lost.
func (s *Server) Close() error {
	s.closeOnce.Do(func() {
		close(s.done)
		if s.access != nil {
			s.stopAccessCounting() // no delayed migration while sessions end
		}
		s.listenersMu.Lock()
		for _, l := range s.listeners {
			l.Close()
		}
		s.listenersMu.Unlock()
		for _, sess := range s.sessionList() {
			hangUpConn(sess.conn) // its control loop ends and cleans up
		}
		s.waitSessions(5 * time.Second)
		s.enginesOnce.Do(func() {}) // none made from now on
		if s.engines != nil {
			s.engines.stop() // every move has ended with its session
		}
		s.guard.quit()
		s.staging.close()
		s.closeArenas()
	})
	return nil
}

func (s *Server) waitSessions(timeout time.Duration) {
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		s.sessionsMu.Lock()
		n := len(s.sessions)
		s.sessionsMu.Unlock()
		if n == 0 {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// SessionCount is the number of connected sessions.
func (s *Server) SessionCount() int {
	s.sessionsMu.Lock()
	defer s.sessionsMu.Unlock()
	return len(s.sessions)
}

var errPeerGone = errors.New("peer closed the connection")

// checkPeer accepts only processes of the server's own user, or root,
// and returns the peer's process id. The socket's permissions already say
// so; this is the second lock.
func checkPeer(c *net.UnixConn) (int, error) {
	raw, err := c.SyscallConn()
	if err != nil {
		return 0, err
	}
	var cred *syscall.Ucred
	var credErr error
	if err := raw.Control(func(fd uintptr) {
		cred, credErr = syscall.GetsockoptUcred(int(fd), syscall.SOL_SOCKET, syscall.SO_PEERCRED)
	}); err != nil {
		return 0, err
	}
	if credErr != nil {
		return 0, fmt.Errorf("peer credentials: %w", credErr)
	}
	if me := uint32(os.Geteuid()); cred.Uid != me && cred.Uid != 0 {
		return 0, fmt.Errorf("peer pid %d runs as uid %d; this server (uid %d) serves only its own user", cred.Pid, cred.Uid, me)
	}
	return int(cred.Pid), nil
}

// Info is the server's configuration and state, for `uvm info` and
// `uvm stat`.
type Info struct {
	PID          int              `json:"pid"`
	Uptime       string           `json:"uptime"`
	Features     string           `json:"userfaultfd_features"`
	Prefetch     string           `json:"prefetch"`
	Handlers     HandlerPlacement `json:"handlers"`
	HandlerCPUs  []int            `json:"handler_cpus"`
	Guard        bool             `json:"guard"`
	Sessions     []SessionInfo    `json:"sessions"`
	Devices      []ArenaInfo      `json:"devices"`
	StrayFaults  uint64           `json:"stray_faults"`
	PoisonedPage uint64           `json:"poisoned_pages"`
	GoMaxProcs   int              `json:"gomaxprocs"`
	// CopyEngine is the copy engine's calibration, with the
	// configuration's overrides applied.
	CopyEngine CopyCalibration `json:"copy_engine"`
	// AccessCounting says how accesses are counted, or why they are not.
	AccessCounting string `json:"access_counting"`
	// Anatomy is the fault anatomy's histograms (nil without eBPF or
	// sampling).
	Anatomy *FaultAnatomy `json:"anatomy,omitempty"`
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
	ID          uint64 `json:"id"`
	PID         int    `json:"pid"`
	Role        string `json:"role"`
	Allocations int    `json:"allocations"`
	// ManagedBytes is the sum of the allocations' sizes; HostBytes the
	// memory their host file holds.
	ManagedBytes int64 `json:"managed_bytes"`
	HostBytes    int64 `json:"host_bytes"`
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
	DeviceInfo
	UsedBytes int64 `json:"used_bytes"`
	// FileBytes is what the arena's files really hold (st_blocks): equal
	// to UsedBytes unless accounting went wrong.
	FileBytes int64 `json:"file_bytes"`
}

func (s *Server) info() Info {
	in := Info{
		PID: os.Getpid(), Uptime: time.Since(s.started).Round(time.Second).String(),
		Features: s.features.String(), Prefetch: s.prefetch.Name(), Handlers: s.cfg.Handlers,
		Guard: s.guard != nil, StrayFaults: s.strayFaults.Load(), PoisonedPage: s.poisoned.Load(),
		GoMaxProcs: runtime.GOMAXPROCS(0), CopyEngine: s.copyCalibration(), AccessCounting: s.access.mode,
		VMStat: vmstatSince(s.vmstatStart),
		Restart: RestartInfo{
			Restarts: s.restart.count.Load(), PauseMS: float64(s.restart.lastPause.Load()) / 1e6,
			AdoptedPages: s.restart.adoptedPages.Load(), RebuildMS: float64(s.restart.rebuild.Load()) / 1e6,
			RecoveredPages: s.restart.recoveredPages.Load(), Policy: FormatRestarts(s.cfg.Restarts), GuardPID: s.guard.PID(),
		},
	}
	in.HandlerCPUs = append(in.HandlerCPUs, s.cpus...)
	if an := s.access.anatomy; an != nil {
		in.Anatomy = an.snapshot()
	}
	fileBytes := make([]int64, len(s.arenas))
	s.sessionsMu.Lock()
	for _, sess := range s.sessions {
		in.Sessions = append(in.Sessions, sess.info())
		for d, n := range sess.deviceFileBytes() {
			fileBytes[d] += n
		}
	}
	s.sessionsMu.Unlock()
	for i, d := range s.Devices() {
		in.Devices = append(in.Devices, ArenaInfo{DeviceInfo: d, UsedBytes: s.arenas[i].UsedBytes(), FileBytes: fileBytes[i]})
	}
	return in
}

// sessionList returns the sessions connected now.
func (s *Server) sessionList() []*session {
	s.sessionsMu.Lock()
	defer s.sessionsMu.Unlock()
	all := make([]*session, 0, len(s.sessions))
	for _, sess := range s.sessions {
		all = append(all, sess)
	}
	return all
}

// quiesce orders the caller after every fault being served now.
func (s *Server) quiesce() {
	for _, sess := range s.sessionList() {
		for _, r := range sess.ranges.Load().ranges {
			r.quiesce()
		}
	}
}

func (s *Server) infoJSON() string {
	b, _ := json.Marshal(s.info())
	return string(b)
}

// copyCalibration is this machine's copy calibration with the
// configuration's overrides applied. It waits for the calibration that
// NewServer started.
func (s *Server) copyCalibration() CopyCalibration {
	<-s.calibrated
	c := copyCalibration()
	if n := s.cfg.CopyProducers; n > 0 {
		c.MigrationProducers, c.CopyProducers, c.BlockMovers = n, n, n
	}
	if n := s.cfg.CopyDirectBelow; n > 0 {
		c.DirectBelow, c.CopyDirectBelow = n, n
	}
	return c
}

// copyEngine is the server's engine for migrations to location l, made
// at the first move and stopped by Close: its producers run near l's
// memory where the machine has several NUMA nodes. Nil once the server
// closed before any move: moves then run on their own goroutines.
func (s *Server) copyEngine(l location) *copyEngine {
	s.enginesOnce.Do(func() {
		c := s.copyCalibration()
		s.engines = newCopyEngines(c.MigrationProducers, c.DirectBelow)
		s.byLocation = make([]*copyEngine, s.locations())
		for l := range s.byLocation {
			s.byLocation[l] = s.engines.forNode(s.nodeOf(location(l)))
		}
	})
	if s.byLocation == nil {
		return nil
	}
	return s.byLocation[l]
}

// nodeOf is the NUMA node that holds location l's memory, where the
// machine has several nodes and l is a NUMA arena; -1 otherwise.
func (s *Server) nodeOf(l location) int {
	if l == hostLoc {
		return -1
	}
	spec := s.arenas[l-1].Spec()
	return arenaNode(spec.Backend.String(), spec.Node)
}

// arenaNode is the node to run copies into an arena of backend on: its
// node for a NUMA arena of a machine with several nodes, else -1.
func arenaNode(backend string, node int) int {
	if backend != devmem.BackendNUMA.String() || !multiNode() {
		return -1
	}
	return node
}

var (
	multiNodeOnce sync.Once
	multiNodeMemo bool
)

// multiNode reports whether this machine has more than one NUMA node, the
// only case where pinning copy threads to one matters.
func multiNode() bool {
	multiNodeOnce.Do(func() {
		nodes, err := devmem.Nodes()
		multiNodeMemo = err == nil && len(nodes) > 1
	})
	return multiNodeMemo
}
