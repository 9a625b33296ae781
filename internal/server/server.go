package server

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"log"
	"net"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/softuvm/softuvm/devmem"
	"github.com/softuvm/softuvm/internal/block"
	"github.com/softuvm/softuvm/internal/config"
	"github.com/softuvm/softuvm/internal/core"
	"github.com/softuvm/softuvm/internal/engine"
	"github.com/softuvm/softuvm/internal/guard"
	"github.com/softuvm/softuvm/internal/wire"
	"github.com/softuvm/softuvm/policy"
	"github.com/softuvm/softuvm/trace"
	"github.com/softuvm/softuvm/uffd"
)

// Server is the fault server: it owns every client's userfaultfd, the
// location files and the residency of every page, and serves faults on
// handler threads that never touch managed memory themselves.
type Server struct {
	cfg config.ServerConfig
	// tracer records every session's events (trace.go), nil when not
	// tracing. Set before the server serves, closed after the last
	// session ended.
	tracer *trace.Recorder
	arenas []*devmem.Arena
	// eng is the block engine: the residency of every page, every move
	// and what decides it, with the policies (package block).
	eng *block.Engine
	// retired holds the statistics of the sessions that ended. Every
	// event is counted once, in its allocation's counters (retired into
	// its session's when freed); the server's figures are sums of those,
	// taken when asked (see counters). Guarded by sessionsMu.
	retired  *core.Counters
	features uffd.Feature // what the server asks of each client's userfaultfd
	started  time.Time
	logger   *log.Logger
	// mapsFullLogged: a device process ran out of mappings for remote
	// runs, and the log said so (remote.go mapsFull): once is enough.
	mapsFullLogged atomic.Bool

	cpus []int // where each session's handler threads go; -1 unpinned

	sessionsMu    sync.Mutex
	sessions      map[uint64]*session // guarded by sessionsMu
	nextSessionID atomic.Uint64
	strayFaults   atomic.Uint64 // faults on addresses no range owns
	poisoned      atomic.Uint64 // pages poisoned because a fault could not be served
	foliosRebuilt atomic.Uint64 // blocks rebuilt in 4 KiB folios before part of them left (block.EvRebuilt)
	// Pages a move found already present where it installed them
	// (migrate.go: install), which it overwrote, and pages the table
	// held resident whose file had lost them, which read as zeros
	// (block.EvLostPage). Both are zero unless something is wrong.
	strayPresent atomic.Uint64
	lostPages    atomic.Uint64

	guard   *guard.Link
	staging *block.Staging // the buffers migrations carry pages in (staging.go)
	// largeFolios is nil where location files take 2 MiB folios, else
	// why they do not (devmem.CreateLargeFolioFile; migrate.go).
	largeFolios error
	mode        byte         // guard.ModePrivate or modeDaemon: what the guard restarts
	restart     restartStats // this server's takeover, if it took over
	// keptListeners are the listening sockets the guard holds too.
	keptMu        sync.Mutex
	keptListeners []keptListenerRef
	idle          chan struct{} // signalled when the last session ends
	// crashAfterPunch counts down to a self-inflicted SIGKILL after a
	// punch (tests only; 0: never).
	crashAfterPunch atomic.Int64
	// crashInMove counts down to one in a whole move, at the step
	// crashMoveStep names (CrashInMoveEnv).
	crashInMove   atomic.Int64
	crashMoveStep string

	listenersMu sync.Mutex
	listeners   []net.Listener
	closeOnce   sync.Once
	done        chan struct{}

	Access      *accessState      // access counting and what it drives
	vmstatStart map[string]uint64 // /proc/vmstat when the server started

	// engines are the migrations' copy engines, one per node; byLocation
	// the one for each location. Made once, at the first move, so that a
	// move on the fault path finds its engine without a lock.
	enginesOnce sync.Once
	engines     *engine.CopyEngines
	byLocation  []*engine.CopyEngine
}

// NewServer creates the arenas and starts the handler threads. It serves
// nobody until Serve or ServeConn is called.
func NewServer(cfg config.ServerConfig) (*Server, error) {
	return newServer(cfg, serverStart{mode: guard.ModePrivate})
}

// serverStart is how a server begins: fresh, or taking over from one that
// died (adopt.go), with the dead one's guard and staging area.
type serverStart struct {
	guard    *guard.Link
	staging  *block.Staging
	mode     byte
	attempts int
}

// keptListenerRef is a listener the guard holds a copy of.
type keptListenerRef struct {
	path string
	l    *net.UnixListener
}

func newServer(cfg config.ServerConfig, start serverStart) (*Server, error) {
	if err := cfg.ValidateSettings(); err != nil {
		return nil, err
	}
	// The one place this server's policies are built.
	policies, err := policy.NewSet(cfg.Policies())
	if err != nil {
		return nil, err
	}
	supported, err := uffd.Supported()
	if err != nil {
		return nil, fmt.Errorf("%w: %v", core.ErrInitialization, err)
	}
	if missing := core.RequiredFeatures &^ supported; missing != 0 {
		return nil, fmt.Errorf("%w: this kernel's userfaultfd lacks %v, which the fault server needs", core.ErrNotSupported, missing)
	}
	s := &Server{
		cfg:      cfg,
		features: core.WantedFeatures & supported,
		started:  time.Now(),
		logger:   log.New(os.Stderr, fmt.Sprintf("softuvm server[%d]: ", os.Getpid()), 0),
		sessions: map[uint64]*session{},
		done:     make(chan struct{}),
		idle:     make(chan struct{}, 1),
		mode:     start.mode,
		staging:  start.staging,
	}
	s.largeFolios = largeFoliosFor(cfg)
	if s.staging == nil {
		if s.staging, err = block.NewStaging(); err != nil {
			return nil, err
		}
	}
	if v := os.Getenv(config.CrashAfterPunchEnv); v != "" {
		n, _ := strconv.Atoi(v)
		s.crashAfterPunch.Store(int64(n))
		os.Unsetenv(config.CrashAfterPunchEnv) // not for the guard and the servers it starts
	}
	if v := os.Getenv(config.CrashInMoveEnv); v != "" {
		step, count, _ := strings.Cut(v, ":")
		n, _ := strconv.Atoi(count)
		s.crashMoveStep = step
		s.crashInMove.Store(int64(n))
		os.Unsetenv(config.CrashInMoveEnv)
	}
	for _, spec := range cfg.Devices {
		a, err := devmem.NewArena(spec)
		if err != nil {
			s.closeArenas()
			return nil, fmt.Errorf("%w: device %d: %v", core.ErrInitialization, spec.Device, err)
		}
		s.arenas = append(s.arenas, a)
	}
	engine.Calibration() // reads the kept one, or starts measuring in the background
	arenas := make([]block.Arena, len(s.arenas))
	for i, a := range s.arenas {
		arenas[i] = a
	}
	s.eng = block.New(block.Config{Policies: policies, Arenas: arenas, HostBudget: cfg.HostBudget,
		Now: func() int64 { return time.Since(s.started).Microseconds() + 1 }, Logf: s.logger.Printf,
		Observers: []block.Observer{block.Counters{}, serverObserver{s}}})
	s.retired = core.NewCounters(s.eng.Locations())
	if o, ok := policies.Eviction.(policy.Observing); ok {
		o.Observe(useObserver{s})
	}
	if s.cpus, err = s.handlerCPUs(); err != nil {
		return nil, err
	}
	if err := s.startAccessCounting(); err != nil {
		return nil, err
	}
	s.vmstatStart = config.ReadVMStat()
	// Handler threads wait in read(2); when one returns it needs a P at
	// once, so keep a few more Ps than CPUs.
	if n := runtime.NumCPU() + 2; runtime.GOMAXPROCS(0) < n {
		runtime.GOMAXPROCS(n)
	}

	if err := s.openTrace(start.guard != nil); err != nil {
		s.closeArenas()
		return nil, err
	}
	switch {
	case start.guard != nil:
		s.guard = start.guard
		go s.guard.Watch(s.done, s.snapshot, s.logger.Printf) // a new guard, sent everything, if it dies
	case cfg.Guard:
		g, err := guard.Start()
		if err != nil {
			// Without a guard the server still works; only its death
			// would be handled less well. Say so and go on.
			s.logger.Printf("no guard process (%v): if this server dies, its clients' data not on the host is lost", err)
			break
		}
		s.guard = g
		g.Send(guard.ConfigMsg(s.mode, cfg.RestartAttempts(), cfg.Marshal()))
		g.Send([]byte{guard.OpStaging}, s.staging.FD())
		go s.guard.Watch(s.done, s.snapshot, s.logger.Printf) // a new guard, sent everything, if it dies
	}
	return s, nil
}

// inMove is where a test makes the server die in a whole move that
// wrote the block at off of its destination dst and has not punched its
// source: at step "written" (the intent says copying) or "copied". At
// "written", the test's step "torn" first spoils the block's second half
// in dst, as a write the kernel did not finish would have.
func (s *Server) inMove(step string, dst *devmem.File, off int64) {
	if s.crashInMove.Load() <= 0 { // always, outside tests: one load per move
		return
	}
	want := s.crashMoveStep
	if want == "torn" {
		want = "written"
	}
	if want != step || s.crashInMove.Add(-1) != 0 {
		return
	}
	if s.crashMoveStep == "torn" {
		dst.WriteAt(bytes.Repeat([]byte{0xee}, core.BlockSize/2), off+core.BlockSize/2)
	}
	syscall.Kill(os.Getpid(), syscall.SIGKILL)
}

// afterPunch is where a test makes the server die with pages in flight.
func (s *Server) afterPunch() {
	if s.crashAfterPunch.Load() > 0 && s.crashAfterPunch.Add(-1) == 0 {
		syscall.Kill(os.Getpid(), syscall.SIGKILL)
	}
}

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
func (s *Server) Devices() []core.DeviceInfo {
	out := make([]core.DeviceInfo, len(s.arenas))
	for i, a := range s.arenas {
		spec := a.Spec()
		out[i] = core.DeviceInfo{Device: core.Device(i), Capacity: a.Capacity(), Backend: spec.Backend.String(), Node: spec.Node, Workers: s.cfg.Workers()}
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
	peer, err := wire.PeerPID(c)
	if err != nil {
		s.logger.Printf("refusing connection: %v", err)
		return
	}
	sess, err := s.handshake(c, peer)
	if err != nil {
		if !errors.Is(err, wire.ErrPeerGone) {
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
		if s.Access != nil {
			s.stopAccessCounting() // no delayed migration while sessions end
		}
		s.listenersMu.Lock()
		for _, l := range s.listeners {
			l.Close()
		}
		s.listenersMu.Unlock()
		for _, sess := range s.sessionList() {
			wire.HangUpConn(sess.conn) // its control loop ends and cleans up
		}
		s.waitSessions(5 * time.Second)
		s.enginesOnce.Do(func() {}) // none made from now on
		if s.engines != nil {
			s.engines.Stop() // every move has ended with its session
		}
		s.guard.Quit()
		s.staging.Close()
		s.closeArenas()
		s.closeTrace()
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

// Info returns the server's configuration and state. It first waits
// for the faults being served now, so that the host's pages count
// every fault a client has seen resolved.
func (s *Server) Info() config.Info {
	s.quiesce()
	in := config.Info{
		PID: os.Getpid(), Uptime: time.Since(s.started).Round(time.Second).String(),
		Features: s.features.String(), Prefetch: s.eng.Policies().Prefetch.Name(), Eviction: s.eng.Policies().Eviction.Name(), EvictionUse: s.evictionUse(), Handlers: s.cfg.Handlers,
		Coherence: s.defaultCoherence().String(), DirtyTracking: s.dirtyTrackingName(), LargeFolios: s.largeFoliosName(),
		FoliosRebuilt: s.foliosRebuilt.Load(), StrayPresentPages: s.strayPresent.Load(), LostPages: s.lostPages.Load(),
		HostResidentBytes: s.eng.HostPages() * core.PageSize, HostPeakBytes: s.eng.HostPeak() * core.PageSize,
		Guard: s.guard != nil, StrayFaults: s.strayFaults.Load(), PoisonedPage: s.poisoned.Load(),
		GoMaxProcs: runtime.GOMAXPROCS(0), CopyEngine: s.copyCalibration(), AccessCounting: s.Access.Mode,
		VMStat: config.VMStatSince(s.vmstatStart),
		Restart: config.RestartInfo{
			Restarts: s.restart.count.Load(), PauseMS: float64(s.restart.lastPause.Load()) / 1e6,
			AdoptedPages: s.restart.adoptedPages.Load(), RebuildMS: float64(s.restart.rebuild.Load()) / 1e6,
			RecoveredPages: s.restart.recoveredPages.Load(), Policy: config.FormatRestarts(s.cfg.Restarts), GuardPID: s.guard.PID(),
		},
	}
	in.HandlerCPUs = append(in.HandlerCPUs, s.cpus...)
	if an := s.Access.anatomy; an != nil {
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
		in.Devices = append(in.Devices, config.ArenaInfo{DeviceInfo: d, UsedBytes: s.arenas[i].UsedBytes(), FileBytes: fileBytes[i]})
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
			r.Quiesce()
		}
	}
}

func (s *Server) infoJSON() string {
	b, _ := json.Marshal(s.Info())
	return string(b)
}

// copyCalibration is this machine's copy calibration with the
// configuration's overrides applied, at once: defaults until the
// measurement NewServer started is done (a move that reads it once keeps
// what it read).
func (s *Server) copyCalibration() config.CopyCalibration {
	c := engine.Calibration()
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
func (s *Server) copyEngine(l core.Device) *engine.CopyEngine {
	s.enginesOnce.Do(func() {
		c := s.copyCalibration()
		s.engines = engine.NewCopyEngines(c.MigrationProducers, c.DirectBelow)
		s.byLocation = make([]*engine.CopyEngine, s.eng.Locations())
		for l := range s.byLocation {
			s.byLocation[l] = s.engines.ForNode(s.nodeOf(core.DeviceAtSlot(l)))
		}
	})
	if s.byLocation == nil {
		return nil
	}
	return s.byLocation[l.Slot()]
}

// nodeOf is the NUMA node that holds location l's memory, where the
// machine has several nodes and l is a NUMA arena; -1 otherwise.
func (s *Server) nodeOf(l core.Device) int {
	if l == core.CPU {
		return -1
	}
	spec := s.arenas[l].Spec()
	return devmem.ArenaNode(spec.Backend.String(), spec.Node)
}

// largeFoliosFor decides whether location files take large folios.
func largeFoliosFor(cfg config.ServerConfig) error {
	if cfg.LargeFolios == config.LargeFoliosOff {
		return errors.New("off, as asked (--large-folios off)")
	}
	return devmem.LargeFoliosAvailable()
}

func (s *Server) largeFoliosName() string {
	if s.largeFolios != nil {
		return "off: " + s.largeFolios.Error()
	}
	return "on: 2 MiB folios in a private huge=always tmpfs"
}
