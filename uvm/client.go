package uvm

import (
	"errors"
	"fmt"
	"net"
	"os"
	"sort"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/softuvm/softuvm/devmem"
	"github.com/softuvm/softuvm/internal/config"
	"github.com/softuvm/softuvm/internal/core"
	"github.com/softuvm/softuvm/internal/engine"
	"github.com/softuvm/softuvm/internal/wire"
	"github.com/softuvm/softuvm/policy"
	"github.com/softuvm/softuvm/uffd"
)

// Config says how a process reaches a fault server. It is plain data.
type Config struct {
	// Server is "auto" (a daemon if one listens at Socket, else a
	// private server), "private" (always start one), or "daemon" (fail
	// without one).
	Server string `json:"server"`
	// Socket is the daemon's socket; "" means DefaultSocketPath().
	Socket string `json:"socket"`
	// Private configures a private server.
	Private ServerConfig `json:"private"`
	// Coherence is this process's coherence model: "fault" (every
	// processor may touch managed memory at any time, pages move on
	// faults), "launch" (a launch hands the memory its kernel may use to
	// the device, and the CPU may not touch it until a synchronize), or
	// "" for the server's (a private server's is Private.Coherence).
	Coherence string `json:"coherence,omitempty"`
	// Log, if set, receives what a private server, its guard and the
	// session's device processes write (their errors, a poisoned page's
	// explanation); otherwise they write to this program's standard
	// error. A file, not any writer: the guard outlives the server and
	// would keep a pipe open.
	Log *os.File `json:"-"`
}

// ConfigFromEnv reads UVM_SERVER, UVM_SOCKET, UVM_COHERENCE and the
// server settings (UVM_DEVICES, UVM_ARENA_SIZE, UVM_ARENA_BACKEND,
// UVM_PREFETCH, UVM_HANDLERS, UVM_TRACK_PREFETCH, ...).
func ConfigFromEnv() (Config, error) {
	sc, err := ServerConfigFromEnv()
	if err != nil {
		return Config{}, err
	}
	c := Config{Server: os.Getenv(EnvServer), Socket: os.Getenv(EnvSocket), Private: sc, Coherence: os.Getenv(EnvCoherence)}
	if _, err := core.ParseCoherence(c.Coherence); err != nil {
		return Config{}, fmt.Errorf("%s: %w", EnvCoherence, err)
	}
	if c.Server == "" {
		c.Server = "auto"
	}
	switch c.Server {
	case "auto", "private", "daemon":
	default:
		return Config{}, fmt.Errorf("%w: %s=%q: want auto, private or daemon", ErrInvalidValue, EnvServer, c.Server)
	}
	return c, nil
}

// Session is this process's connection to a fault server, with the
// userfaultfd and host file its managed memory uses. Its methods are safe
// for concurrent use.
type Session struct {
	rpc      wire.Client // the control connection to the server
	host     *devmem.File
	id       uint64
	devices  []DeviceInfo
	features uffd.Feature
	// coherence is the session's model, as the server settled it.
	coherence core.Coherence
	private   *privateServer // nil with a daemon
	log       *os.File       // where device processes write; nil: standard error

	allocMu    sync.RWMutex
	allocs     []*Allocation  // sorted by address, guarded by allocMu
	registered []registration // HostRegister'ed memory, sorted by host address, guarded by allocMu
	window     vaWindow       // addresses of managed ranges

	// copyMu guards the copy engine's parameters, engine and the device
	// files, all fetched from the server on first use (copyside.go).
	copyMu      sync.Mutex
	copyParams  *copyParams
	engines     *engine.CopyEngines
	deviceFiles []*devmem.File

	devMu sync.Mutex
	devs  []*deviceProc // created on first use, guarded by devMu

	// nodes are the host NUMA nodes of ranges (location.go).
	nodes hostNodes
}

// Allocation is one managed allocation.
type Allocation struct {
	s         *Session
	addr      uintptr
	size      int64
	length    uintptr // size rounded up to pages: what is mapped and managed
	reserved  uintptr // length rounded up to 2 MiB: the address space held
	bufferID  uint64
	device    Device
	kind      core.RangeKind
	flags     uint32  // HostAlloc's flags for pinned host memory
	hostAlias uintptr // registered host memory: where the program has it
	freed     atomic.Bool

	// shadow maps device memory's pages from the device's file, for
	// Memcpy and Memset, on first use; noted has a bit for each of its
	// pages the server was told were written. Guarded by shadowMu.
	shadowMu sync.Mutex
	shadow   *devmem.Mapping
	noted    []uint64
}

// AllocOption tunes one allocation: WithPrefetch, TrackPrefetchUse,
// WithFlags.
type AllocOption struct{ apply func(*allocSettings) error }

// allocSettings are what the options set, copied into the request.
type allocSettings struct {
	prefetch       string
	prefetchPolicy string // prefetch's name
	trackPrefetch  bool
	flags          uint32
}

// WithPrefetch chooses the allocation's fault prefetch policy.
func WithPrefetch(spec PrefetchSpec) AllocOption {
	return AllocOption{func(a *allocSettings) error {
		if _, err := policy.NewPrefetchPolicy(spec); err != nil {
			return err
		}
		a.prefetch, a.prefetchPolicy = spec.String(), spec.Policy
		return nil
	}}
}

// TrackPrefetchUse makes the allocation record which prefetched pages get
// used (Stats.PrefetchedUsed). It costs a kernel minor fault (about 1 us)
// on the first touch of each prefetched page, because such pages are left
// unmapped so that their use can be seen.
func TrackPrefetchUse() AllocOption {
	return AllocOption{func(a *allocSettings) error { a.trackPrefetch = true; return nil }}
}

// Attachment flags, as cudaMemAttachGlobal, cudaMemAttachHost and
// cudaMemAttachSingle: of MallocManaged (WithFlags: Global or Host) and
// of StreamAttachMemAsync. Under the launch coherence model they say
// which launches take an allocation from the CPU: every launch (Global),
// none (Host: the CPU may always touch it, and kernels may not), or the
// launches of one stream (Single). Under the fault model they change
// nothing, as on GPUs with concurrent managed access.
const (
	AttachGlobal = uint32(core.AttachGlobal)
	AttachHost   = uint32(core.AttachHost)
	AttachSingle = uint32(core.AttachSingle)
)

// WithFlags sets the allocation's attach flags.
func WithFlags(flags uint32) AllocOption {
	return AllocOption{func(a *allocSettings) error {
		if flags != AttachGlobal && flags != AttachHost {
			return fmt.Errorf("%w: managed allocation flags %#x: want AttachGlobal (%#x) or AttachHost (%#x)", ErrInvalidValue, flags, AttachGlobal, AttachHost)
		}
		a.flags = flags
		return nil
	}}
}

// Connect reaches a fault server as cfg says and hands it this process's
// userfaultfd.
func Connect(cfg Config) (*Session, error) {
	coherence, err := core.ParseCoherence(cfg.Coherence)
	if err != nil {
		return nil, err
	}
	host, err := devmem.CreateFile("softuvm-host", devmem.FileSize)
	if err != nil {
		return nil, fmt.Errorf("%w: host file: %v", ErrInitialization, err)
	}
	// Blocking: the server's handler threads wait in read(2).
	u, err := uffd.Open(uffd.CloseOnExec)
	if err != nil {
		host.Close()
		return nil, fmt.Errorf("%w: %v", ErrInitialization, err)
	}
	// The server owns the userfaultfd from here on; this process keeps
	// no copy, so it never resolves its own faults by accident.
	defer u.Close()
	s := &Session{host: host, log: cfg.Log, rpc: wire.Client{Buf: make([]byte, wire.MaxMessageSize)}}
	if err := s.dial(cfg); err != nil {
		host.Close()
		return nil, err
	}
	hello := wire.HelloRequest{Role: wire.RoleClient, Pid: uint32(os.Getpid()), Coherence: coherence}
	r, rfds, err := s.rpc.ExchangeFDs(wire.EncodeHello(s.rpc.NextSeq(), hello), wire.MsgHello, []int{u.Fd(), host.Fd()})
	if err != nil {
		s.closeConn()
		host.Close()
		return nil, err
	}
	hr, err := wire.DecodeHelloReply(r)
	if err == nil && len(rfds) > 1 {
		err = fmt.Errorf("%w: hello reply carries %d descriptors, want at most 1 (a host file)", ErrInternal, len(rfds))
	}
	if err != nil {
		wire.CloseFDs(rfds)
		s.closeConn()
		host.Close()
		return nil, err
	}
	if len(rfds) == 1 {
		// The server made a host file of large folios in place of the
		// memfd (a client cannot mount the tmpfs they need): use it.
		large, err := devmem.FileFromFD(rfds[0], "softuvm-host")
		if err != nil {
			s.closeConn()
			host.Close()
			return nil, fmt.Errorf("%w: host file from the server: %v", ErrInitialization, err)
		}
		host.Close()
		host = large
		s.host = large
	}
	s.rpc.PeerPID.Store(int64(hr.ServerPID))
	s.id, s.features, s.devices, s.coherence = hr.SessionID, uffd.Feature(hr.Features), hr.Devices, hr.Coherence
	return s, nil
}

var (
	defaultOnce    sync.Once
	defaultSession *Session
	defaultErr     error
)

// Default returns the process's session, connecting on first use with
// ConfigFromEnv. The package-level functions use it.
func Default() (*Session, error) {
	defaultOnce.Do(func() {
		cfg, err := ConfigFromEnv()
		if err != nil {
			defaultErr = err
			return
		}
		defaultSession, defaultErr = Connect(cfg)
	})
	return defaultSession, defaultErr
}

// MallocManaged allocates managed memory in the default session.
func MallocManaged(size int64, opts ...AllocOption) (*Allocation, error) {
	s, err := Default()
	if err != nil {
		return nil, err
	}
	return s.MallocManaged(size, opts...)
}

// Free releases an allocation of the default session.
func Free(addr uintptr) error {
	s, err := Default()
	if err != nil {
		return err
	}
	return s.Free(addr)
}

// Prefetch migrates a range of the default session.
func Prefetch(addr uintptr, n int64, dst Device) error {
	s, err := Default()
	if err != nil {
		return err
	}
	return s.Prefetch(addr, n, dst)
}

// Discard discards a range of the default session's managed memory.
func Discard(addr uintptr, n int64) error {
	s, err := Default()
	if err != nil {
		return err
	}
	return s.Discard(addr, n)
}

// GetDeviceCount returns the number of devices of the default session.
func GetDeviceCount() (int, error) {
	s, err := Default()
	if err != nil {
		return 0, err
	}
	return s.DeviceCount(), nil
}

func (s *Session) dial(cfg Config) error {
	mode := cfg.Server
	if mode == "" {
		mode = "auto"
	}
	path := cfg.Socket
	explicit := path != ""
	if !explicit {
		path = config.DefaultSocketPath()
		explicit = os.Getenv(EnvSocket) != ""
	}
	if mode != "private" {
		c, err := net.DialUnix("unixpacket", nil, &net.UnixAddr{Name: path, Net: "unixpacket"})
		if err == nil {
			s.rpc.Conn = c
			return nil
		}
		if mode == "daemon" || explicit {
			return fmt.Errorf("%w: no fault server at %s (%v); start one with `uvm serve`, or set %s=private", ErrInitialization, path, err, EnvServer)
		}
	}
	conn, ps, err := startPrivateServer(cfg.Private, cfg.Log)
	if err != nil {
		return err
	}
	s.rpc.Conn, s.private = conn, ps
	return nil
}

func (s *Session) closeConn() {
	if s.rpc.Conn != nil {
		s.rpc.Conn.Close()
	}
	if s.private != nil {
		s.private.wait(2 * time.Second)
	}
}

// Close frees every allocation and disconnects. A private server exits.
func (s *Session) Close() error {
	if s.rpc.Closed.Swap(true) {
		return nil
	}
	var errs []error
	s.devMu.Lock()
	for _, dp := range s.devs {
		if dp != nil {
			dp.mu.Lock()
			errs = append(errs, dp.stop())
			dp.mu.Unlock()
		}
	}
	s.devMu.Unlock()
	// Registered memory goes back to the program before the server, and
	// the host file its pages live in, go away.
	s.allocMu.RLock()
	registered := append([]registration(nil), s.registered...)
	s.allocMu.RUnlock()
	for _, r := range registered {
		s.HostUnregister(r.host) // the server's side goes with the session anyway
	}
	s.allocMu.Lock()
	allocs := s.allocs
	s.allocs = nil
	s.allocMu.Unlock()
	for _, a := range allocs {
		a.freed.Store(true)
		a.unmapShadow()
		s.window.release(a.addr, a.reserved)
	}
	s.closeCopies()
	s.closeConn()
	errs = append(errs, s.host.Close())
	return errors.Join(errs...)
}

// IsPrivate reports whether the session started its own server.
func (s *Session) IsPrivate() bool { return s.private != nil }

// Devices describes the server's devices.
func (s *Session) Devices() []DeviceInfo { return append([]DeviceInfo(nil), s.devices...) }

// DeviceCount is the number of devices, as cudaGetDeviceCount.
func (s *Session) DeviceCount() int { return len(s.devices) }

// MallocManaged allocates size bytes of managed memory, as
// cudaMallocManaged. Nothing is populated until touched.
func (s *Session) MallocManaged(size int64, opts ...AllocOption) (*Allocation, error) {
	if size <= 0 {
		return nil, fmt.Errorf("%w: managed allocation of %d bytes: want at least 1 byte", ErrInvalidValue, size)
	}
	if size > core.MaxAllocation {
		return nil, fmt.Errorf("%w: managed allocation of %d bytes (%s): the limit is %s", ErrInvalidValue, size, FormatSize(size), FormatSize(core.MaxAllocation))
	}
	set := allocSettings{flags: AttachGlobal}
	for i, o := range opts {
		if o.apply == nil {
			return nil, fmt.Errorf("%w: managed allocation option %d is a zero AllocOption: want one made by WithPrefetch, TrackPrefetchUse or WithFlags", ErrInvalidValue, i)
		}
		if err := o.apply(&set); err != nil {
			return nil, err
		}
	}
	if s.private != nil && set.prefetchPolicy != "" {
		if err := lateForPrivateServer(ErrInvalidValue, []policy.Ref{{Kind: policy.KindPrefetch, Name: set.prefetchPolicy}}); err != nil {
			return nil, fmt.Errorf("managed allocation of %d bytes: %w", size, err)
		}
	}
	req := wire.AllocRequest{Size: uint64(size), Flags: set.flags, Prefetch: set.prefetch, TrackPrefetch: set.trackPrefetch}
	return s.allocate(size, req, nil)
}

// allocate reserves address space in the managed window, maps the host
// file over it (prepare may fill it, as pinned memory is filled before it
// is registered) and registers the range with the server.
func (s *Session) allocate(size int64, req wire.AllocRequest, prepare func(addr uintptr, length int64) error) (*Allocation, error) {
	length := core.RoundUp(uintptr(size), PageSize)
	reserved := core.RoundUp(length, BlockSize)
	addr, err := s.window.reserve(reserved)
	if err != nil {
		return nil, err
	}
	// The host file's offset equals the address: every location file of
	// the range is laid out the same way.
	if err := s.host.MapFixed(addr, int64(addr), int64(length)); err == nil {
		err = devmem.DontFork(addr, int64(reserved))
	}
	if err != nil {
		s.window.release(addr, reserved)
		return nil, fmt.Errorf("%w: map host file at %#x: %v", ErrMemoryAllocation, addr, err)
	}
	if prepare != nil {
		if err := prepare(addr, int64(length)); err != nil {
			s.host.Punch(int64(addr), int64(length))
			s.window.release(addr, reserved)
			return nil, err
		}
	}
	req.Addr, req.Length = uint64(addr), uint64(length)
	r, err := s.rpc.Request(wire.EncodeAlloc(s.rpc.NextSeq(), req), wire.MsgAlloc)
	var id uint64
	if err == nil {
		id = r.U64("buffer id")
		err = r.Done("alloc reply")
	}
	if err != nil {
		if req.Kind == core.KindPinnedHost {
			s.host.Punch(int64(addr), int64(length))
		}
		s.window.release(addr, reserved)
		return nil, err
	}
	a := &Allocation{s: s, addr: addr, size: size, length: length, reserved: reserved, bufferID: id, device: 0, kind: req.Kind}
	switch {
	case req.Kind == core.KindDevice:
		a.device = Device(req.Device)
	case len(s.devices) == 0 || req.Kind == core.KindPinnedHost:
		a.device = CPU
	}
	s.allocMu.Lock()
	i := sort.Search(len(s.allocs), func(i int) bool { return s.allocs[i].addr > addr })
	s.allocs = append(s.allocs, nil)
	copy(s.allocs[i+1:], s.allocs[i:])
	s.allocs[i] = a
	s.allocMu.Unlock()
	return a, nil
}

// lookup returns the allocation holding addr.
func (s *Session) lookup(addr uintptr) *Allocation {
	s.allocMu.RLock()
	defer s.allocMu.RUnlock()
	i := sort.Search(len(s.allocs), func(i int) bool { return s.allocs[i].addr+s.allocs[i].length > addr })
	if i < len(s.allocs) && s.allocs[i].addr <= addr {
		return s.allocs[i]
	}
	return nil
}

func (s *Session) notManaged(what string, addr uintptr) error {
	return fmt.Errorf("%w: %s: %#x is not managed memory of this process", ErrInvalidValue, what, addr)
}

// Free releases managed or device memory, as cudaFree; addr must be the
// allocation's start. It first waits for the work submitted on every
// stream of every device, kernels included, as cudaFree synchronizes:
// no kernel is left running on freed memory (their errors stay for the
// streams' synchronizes). A thread that touches the memory afterwards
// (or is blocked in a fault on it) gets SIGSEGV or SIGBUS, never stale
// data. Pinned host memory is freed by FreeHost.
func (s *Session) Free(addr uintptr) error {
	a, err := s.allocationAt(addr, "free")
	if err != nil {
		return err
	}
	if a.kind == core.KindPinnedHost {
		return fmt.Errorf("%w: free %#x: it is pinned host memory; free it with FreeHost (or HostUnregister if it was registered)", ErrInvalidValue, addr)
	}
	s.quiesceAll()
	return s.release(a)
}

// allocationAt returns the allocation that starts at addr.
func (s *Session) allocationAt(addr uintptr, what string) (*Allocation, error) {
	a := s.lookup(addr)
	if a == nil {
		return nil, s.notManaged(what, addr)
	}
	if a.addr != addr {
		return nil, fmt.Errorf("%w: %s %#x: not the start of an allocation (it lies %d bytes into the one at %#x)", ErrInvalidValue, what, addr, addr-a.addr, a.addr)
	}
	return a, nil
}

// release frees an allocation of any kind.
func (s *Session) release(a *Allocation) error {
	if a.freed.Swap(true) {
		return fmt.Errorf("%w: free %#x: already freed", ErrInvalidValue, a.addr)
	}
	s.allocMu.Lock()
	for i, x := range s.allocs {
		if x == a {
			s.allocs = append(s.allocs[:i], s.allocs[i+1:]...)
			break
		}
	}
	s.allocMu.Unlock()
	a.unmapShadow()
	// The server frees first, while the range is still registered: it
	// sees which prefetched pages were used, and a thread blocked in a
	// fault on the range is woken into SIGBUS rather than left waiting.
	_, err := s.rpc.Request(wire.EncodeFree(s.rpc.NextSeq(), uint64(a.addr)), wire.MsgFree)
	s.nodes.forget(a.addr, a.length)
	if rerr := s.window.release(a.addr, a.reserved); rerr != nil && err == nil {
		err = fmt.Errorf("%w: unmap %#x: %v", ErrInternal, a.addr, rerr)
	}
	return err
}

// pageRange rounds [addr, addr+n) out to pages, as CUDA does for prefetch
// and advice, and checks it lies in one allocation.
func (s *Session) pageRange(what string, addr uintptr, n int64) (*Allocation, uintptr, uintptr, error) {
	if n <= 0 {
		return nil, 0, 0, fmt.Errorf("%w: %s %#x: length %d, want at least 1 byte", ErrInvalidValue, what, addr, n)
	}
	a := s.lookup(addr)
	if a == nil {
		return nil, 0, 0, s.notManaged(what, addr)
	}
	if uint64(n) > uint64(a.addr+a.length-addr) {
		return nil, 0, 0, fmt.Errorf("%w: %s %#x+%d runs past the end of the allocation %#x+%d", ErrInvalidValue, what, addr, n, a.addr, a.size)
	}
	start := addr &^ core.PageOffsetMask
	end := core.RoundUp(addr+uintptr(n), PageSize)
	return a, start, end - start, nil
}

// Prefetch migrates [addr, addr+n) to dst (CPU or a device), as
// cudaMemPrefetchAsync, and returns when the data is there. The range is
// rounded out to whole pages. Data moves by real copies, and the source
// pages are freed; pages never touched are created, zero-filled, at dst.
// Under the launch coherence model it is refused (ErrInvalidDevice), as
// CUDA refuses a prefetch without concurrent managed access.
func (s *Session) Prefetch(addr uintptr, n int64, dst Device) error {
	return s.prefetchTo(addr, n, dst, -1)
}

// prefetchProcessor asks the server to prefetch to processor dst.
func (s *Session) prefetchProcessor(addr uintptr, n int64, dst Device) error {
	if dst != CPU && (dst < 0 || int(dst) >= len(s.devices)) {
		return fmt.Errorf("%w: prefetch to %v: %s", ErrInvalidDevice, dst, s.deviceChoices())
	}
	if err := s.refuseUnderLaunchModel("prefetch to", dst); err != nil {
		return err
	}
	_, start, length, err := s.pageRange("prefetch", addr, n)
	if err != nil {
		return err
	}
	r, err := s.rpc.Request(wire.EncodePrefetch(s.rpc.NextSeq(), wire.PrefetchRequest{Addr: uint64(start), Length: uint64(length), Dst: int32(dst)}), wire.MsgPrefetch)
	if err != nil {
		return err
	}
	return r.Done("prefetch reply")
}

// Discard tells the server that the contents of [addr, addr+n) are no
// longer wanted, as cudaMemDiscardBatchAsync: every copy of its pages, on
// the host and on devices, is dropped without being copied anywhere, and
// the next touch of each page, by any processor, reads zeros. Only the
// whole pages inside the range are discarded (a page the range shares
// with bytes outside it keeps its contents), so a range of less than a
// page may discard nothing. The range must lie in one managed
// allocation; advice on it stays.
//
// It is how an allocator gives freed memory back without unmapping it:
// discarded pages take no room under a host budget or in an arena, and
// eviction has nothing of theirs to copy.
func (s *Session) Discard(addr uintptr, n int64) error {
	a, _, _, err := s.pageRange("discard", addr, n)
	if err != nil {
		return err
	}
	if a.kind != core.KindManaged {
		return fmt.Errorf("%w: discard %#x: discard applies to managed memory, and this is %s", ErrInvalidValue, addr, a.kind)
	}
	start := core.RoundUp(addr, PageSize)
	end := (addr + uintptr(n)) &^ core.PageOffsetMask
	if end <= start {
		return nil // no whole page inside
	}
	r, err := s.rpc.Request(wire.EncodeDiscard(s.rpc.NextSeq(), wire.RangeRequest{Addr: uint64(start), Length: uint64(end - start)}), wire.MsgDiscard)
	if err != nil {
		return err
	}
	return r.Done("discard reply")
}

func (s *Session) deviceChoices() string {
	switch len(s.devices) {
	case 0:
		return fmt.Sprintf("there are no devices; use %d for the CPU", CPU)
	case 1:
		return fmt.Sprintf("want 0 (the only device) or %d (the CPU)", CPU)
	}
	return fmt.Sprintf("want a device from 0 to %d, or %d for the CPU", len(s.devices)-1, CPU)
}

// RangeAttributes queries every attribute of [addr, addr+n), as
// cuMemRangeGetAttributes; the range must lie in one allocation.
func (s *Session) RangeAttributes(addr uintptr, n int64) (RangeAttributes, error) {
	_, start, length, err := s.pageRange("range attributes", addr, n)
	if err != nil {
		return RangeAttributes{}, err
	}
	r, err := s.rpc.Request(wire.EncodeRangeAttrs(s.rpc.NextSeq(), wire.RangeRequest{Addr: uint64(start), Length: uint64(length)}), wire.MsgRangeAttrs)
	if err != nil {
		return RangeAttributes{}, err
	}
	a, err := wire.DecodeRangeAttrsReply(r)
	if err == nil {
		s.locate(&a, start, length)
	}
	return a, err
}

// RangeAttribute queries one attribute, as cuMemRangeGetAttribute. The
// result is a bool for AttrReadMostly, a Device for AttrPreferredLocation
// and AttrLastPrefetchLocation, a []Device for AttrAccessedBy, a
// MemLocationType for AttrPreferredLocationType and
// AttrLastPrefetchLocationType, and an int for AttrPreferredLocationID and
// AttrLastPrefetchLocationID (RangeAttributes says what each means).
func (s *Session) RangeAttribute(addr uintptr, n int64, attr RangeAttr) (any, error) {
	if err := checkRangeAttr(attr); err != nil {
		return nil, fmt.Errorf("%w: range attribute %d: %v", ErrInvalidValue, int(attr), err)
	}
	a, err := s.RangeAttributes(addr, n)
	if err != nil {
		return nil, err
	}
	return rangeAttrValue(a, attr), nil
}

// checkRangeAttr accepts the range attributes there are.
func checkRangeAttr(attr RangeAttr) error {
	if attr < AttrReadMostly || attr > AttrLastPrefetchLocationID {
		return fmt.Errorf("want one from %v (%d) to %v (%d)", AttrReadMostly, int(AttrReadMostly), AttrLastPrefetchLocationID, int(AttrLastPrefetchLocationID))
	}
	return nil
}

// rangeAttrValue is attribute attr of a, of the type RangeAttribute says.
func rangeAttrValue(a RangeAttributes, attr RangeAttr) any {
	switch attr {
	case AttrReadMostly:
		return a.ReadMostly
	case AttrPreferredLocation:
		return a.PreferredLocation
	case AttrAccessedBy:
		return append([]Device{}, a.AccessedBy...)
	case AttrPreferredLocationType:
		return a.PreferredLocationType
	case AttrPreferredLocationID:
		return a.PreferredLocationID
	case AttrLastPrefetchLocationType:
		return a.LastPrefetchLocationType
	case AttrLastPrefetchLocationID:
		return a.LastPrefetchLocationID
	}
	return a.LastPrefetchLocation
}

// PointerAttributes describes the allocation ptr falls in, as
// cuPointerGetAttribute; a pointer the runtime does not own is an error
// (ErrInvalidValue), as there.
func (s *Session) PointerAttributes(ptr uintptr) (PointerAttributes, error) {
	if reg := s.registeredAt(ptr); reg != nil {
		a := reg.alloc
		return PointerAttributes{Type: MemoryHost, Device: CPU, DevicePointer: a.addr + (ptr - reg.host), HostPointer: ptr,
			RangeStart: reg.host, RangeSize: a.size, BufferID: a.bufferID}, nil
	}
	a := s.lookup(ptr)
	if a == nil || ptr >= a.addr+uintptr(a.size) {
		return PointerAttributes{Type: MemoryUnregistered, Device: InvalidDevice}, s.notManaged("pointer attributes", ptr)
	}
	attrs := PointerAttributes{Type: MemoryManaged, Device: a.device, DevicePointer: ptr, HostPointer: ptr,
		RangeStart: a.addr, RangeSize: a.size, BufferID: a.bufferID, IsManaged: true}
	switch a.kind {
	case core.KindPinnedHost:
		attrs.Type, attrs.IsManaged = MemoryHost, false
		if a.hostAlias != 0 {
			attrs.HostPointer = a.hostAlias + (ptr - a.addr)
			attrs.RangeStart = a.hostAlias
		}
	case core.KindDevice:
		attrs.Type, attrs.IsManaged, attrs.HostPointer = MemoryDevice, false, 0
	}
	return attrs, nil
}

// Stats returns the counters of this process's allocations, freed ones
// included.
func (s *Session) Stats() (Stats, error) { return s.rpc.Stats(wire.ScopeSession, 0) }

// Addr is the allocation's start.
func (a *Allocation) Addr() uintptr { return a.addr }

// Size is the size asked for.
func (a *Allocation) Size() int64 { return a.size }

// Bytes is the allocation as a slice. It is valid until Free; touching it
// afterwards faults.
func (a *Allocation) Bytes() []byte { return devmem.BytesAt(a.addr, a.size) }

// Pointer is the allocation's start as a pointer, for code that wants
// one (cgo calls, unsafe.Slice of another element type).
func (a *Allocation) Pointer() unsafe.Pointer { return unsafe.Pointer(unsafe.SliceData(a.Bytes())) }

// Free releases the allocation.
func (a *Allocation) Free() error { return a.s.Free(a.addr) }

// Prefetch migrates the whole allocation to dst.
func (a *Allocation) Prefetch(dst Device) error { return a.s.Prefetch(a.addr, a.size, dst) }

// Discard drops the whole allocation's contents (Session.Discard): it
// reads as zeros from then on, and holds no memory until touched again.
func (a *Allocation) Discard() error { return a.s.Discard(a.addr, int64(a.length)) }

// Stats returns the allocation's counters.
func (a *Allocation) Stats() (Stats, error) { return a.s.rpc.Stats(wire.ScopeRange, a.addr) }

// Info returns the server's configuration and state.
func (s *Session) Info() (Info, error) { return s.rpc.Info() }

// ServerStats returns the server's counters over every process it served.
func (s *Session) ServerStats() (Stats, error) { return s.rpc.ServerStats() }

// ServerPID is the fault server's process id.
func (s *Session) ServerPID() int { return s.rpc.ServerPID() }

// ServerRestarts is how many times a new server has taken over from a
// dead one, as this session learnt at its requests.
func (s *Session) ServerRestarts() int { return s.rpc.ServerRestarts() }
