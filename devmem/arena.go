package devmem

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"sync/atomic"
)

// Backend says what backs a device's memory.
type Backend int

const (
	// BackendAuto picks BackendNUMA when the machine has more than one
	// node with memory, BackendMemfd otherwise.
	BackendAuto Backend = iota
	// BackendMemfd backs device memory with plain memfds: pages land
	// wherever the kernel puts them.
	BackendMemfd
	// BackendNUMA binds each device file to one NUMA node, so device
	// memory is as far from the other devices' CPUs as a real device's.
	BackendNUMA
)

var backendNames = []string{"auto", "memfd", "numa"}

// String returns "auto", "memfd" or "numa".
func (b Backend) String() string {
	if b >= 0 && int(b) < len(backendNames) {
		return backendNames[b]
	}
	return "Backend(" + strconv.Itoa(int(b)) + ")"
}

// ParseBackend parses "auto", "memfd" or "numa".
func ParseBackend(s string) (Backend, error) {
	if i := slices.Index(backendNames, s); i >= 0 {
		return Backend(i), nil
	}
	return 0, fmt.Errorf("arena backend %q: want auto, memfd or numa", s)
}

// MarshalText makes Backend usable in text configs and with flag.TextVar.
func (b Backend) MarshalText() ([]byte, error) {
	if b < 0 || int(b) >= len(backendNames) {
		return nil, fmt.Errorf("arena backend %d: want auto, memfd or numa", int(b))
	}
	return []byte(b.String()), nil
}

// UnmarshalText parses what MarshalText writes.
func (b *Backend) UnmarshalText(text []byte) error {
	v, err := ParseBackend(string(text))
	if err != nil {
		return err
	}
	*b = v
	return nil
}

// ArenaSpec describes a device's memory arena. It is plain data: the
// machine is consulted only by NewArena, which resolves BackendAuto and
// Node -1 and returns the resolved spec from Arena.Spec.
type ArenaSpec struct {
	Device   int     // device index, >= 0
	Capacity int64   // bytes, a positive multiple of PageSize
	Backend  Backend // BackendAuto: NUMA on a machine with several memory nodes, memfd otherwise
	// Node is the NUMA node of a NUMA arena (an Auto arena that resolves
	// to NUMA too). -1 picks the (Device mod N)th of the N nodes with
	// memory, spreading devices over nodes. A memfd arena ignores it and
	// resolves it to -1.
	Node int
}

// Validate checks what can be checked without looking at the machine.
func (s ArenaSpec) Validate() error {
	if s.Device < 0 {
		return fmt.Errorf("arena device %d: want >= 0", s.Device)
	}
	if s.Capacity <= 0 || s.Capacity%PageSize != 0 {
		return fmt.Errorf("arena capacity %d: want a positive multiple of %d bytes", s.Capacity, PageSize)
	}
	if s.Backend < 0 || int(s.Backend) >= len(backendNames) {
		return fmt.Errorf("arena backend %d: want auto, memfd or numa", int(s.Backend))
	}
	if s.Node < -1 {
		return fmt.Errorf("arena node %d: want -1 (pick by device) or a node number >= 0", s.Node)
	}
	return nil
}

// String formats the spec as "device=0 capacity=1073741824 backend=numa node=1".
func (s ArenaSpec) String() string {
	return fmt.Sprintf("device=%d capacity=%d backend=%s node=%d", s.Device, s.Capacity, s.Backend, s.Node)
}

// ErrArenaFull is wrapped by the error Reserve returns when the pages do
// not fit.
var ErrArenaFull = errors.New("arena full")

// ArenaFullError says how full the arena was when a Reserve failed.
type ArenaFullError struct {
	Device                    int
	Capacity, Used, Requested int64 // bytes
}

func (e *ArenaFullError) Error() string {
	return fmt.Sprintf("device %d arena full: %d of %d bytes used, %d more requested",
		e.Device, e.Used, e.Capacity, e.Requested)
}

// Unwrap makes errors.Is(err, ErrArenaFull) hold.
func (e *ArenaFullError) Unwrap() error { return ErrArenaFull }

// Arena is a device's memory: a capacity shared by all the device's
// location files (one per client), and the accounting of what is
// resident in it. The arena does not own the files; the fault server
// reserves before it places pages in them and releases after it punches
// them out.
type Arena struct {
	spec      ArenaSpec
	fallback  error
	used      atomic.Int64
	acctErrs  atomic.Int64
	lastError atomic.Pointer[string]
}

// NewArena validates the spec, resolves it against the machine and
// returns the arena. A NUMA arena needs its node to exist and have
// memory, and mbind to work there: that is probed once per node and
// remembered. An Auto spec falls back to memfd when NUMA cannot be used
// (FallbackReason says why); a spec that asks for NUMA gets an error
// instead.
func NewArena(spec ArenaSpec) (*Arena, error) {
	if err := spec.Validate(); err != nil {
		return nil, err
	}
	var nodes []Node
	var nodesErr error
	if spec.Backend != BackendMemfd {
		nodes, nodesErr = Nodes()
	}
	r, err := resolveSpec(spec, nodes, nodesErr, probeBind)
	if err != nil {
		return nil, err
	}
	return &Arena{spec: r.spec, fallback: r.fallback}, nil
}

// resolution is what resolveSpec decided.
type resolution struct {
	spec     ArenaSpec // Backend memfd or numa; Node set for numa, -1 for memfd
	fallback error     // why an Auto spec fell back to memfd; nil if it did not
}

// resolveSpec is NewArena's decision, with the machine passed in: the
// nodes (or the error reading them) and a probe of mbind on a node.
func resolveSpec(spec ArenaSpec, nodes []Node, nodesErr error, probe func(node int) error) (resolution, error) {
	if err := spec.Validate(); err != nil {
		return resolution{}, err
	}
	memfd := spec
	memfd.Backend, memfd.Node = BackendMemfd, -1
	if spec.Backend == BackendMemfd {
		return resolution{spec: memfd}, nil
	}
	auto := spec.Backend == BackendAuto
	fail := func(err error) (resolution, error) {
		err = fmt.Errorf("device %d arena: %w", spec.Device, err)
		if auto {
			return resolution{spec: memfd, fallback: err}, nil
		}
		return resolution{}, err
	}
	if nodesErr != nil {
		return fail(fmt.Errorf("list NUMA nodes: %w", nodesErr))
	}
	var withMemory []int
	for _, n := range nodes {
		if n.MemTotal > 0 {
			withMemory = append(withMemory, n.ID)
		}
	}
	if auto && len(withMemory) <= 1 {
		return resolution{spec: memfd}, nil // one memory node: binding would change nothing
	}
	if len(withMemory) == 0 {
		return fail(errors.New("no NUMA node has memory"))
	}
	node := spec.Node
	if node < 0 {
		node = withMemory[spec.Device%len(withMemory)]
	}
	i := slices.IndexFunc(nodes, func(n Node) bool { return n.ID == node })
	switch {
	case i < 0:
		return fail(fmt.Errorf("NUMA node %d does not exist: want one of the online nodes %v", node, nodeIDs(nodes)))
	case nodes[i].MemTotal == 0:
		return fail(fmt.Errorf("NUMA node %d has no memory: want one of %v", node, withMemory))
	case spec.Capacity > nodes[i].MemTotal:
		return fail(fmt.Errorf("capacity %d bytes exceeds NUMA node %d's %d bytes of memory", spec.Capacity, node, nodes[i].MemTotal))
	}
	if err := probe(node); err != nil {
		return fail(fmt.Errorf("binding memory to NUMA node %d does not work: %w", node, err))
	}
	resolved := spec
	resolved.Backend, resolved.Node = BackendNUMA, node
	return resolution{spec: resolved}, nil
}

func nodeIDs(nodes []Node) []int {
	ids := make([]int, len(nodes))
	for i, n := range nodes {
		ids[i] = n.ID
	}
	return ids
}

// Spec returns the resolved spec: Backend is memfd or numa, and Node is
// the bound node (-1 for memfd).
func (a *Arena) Spec() ArenaSpec { return a.spec }

// FallbackReason says why an Auto spec resolved to memfd although the
// machine has several memory nodes; nil when it did not fall back.
func (a *Arena) FallbackReason() error { return a.fallback }

// Device returns the device index.
func (a *Arena) Device() int { return a.spec.Device }

// Capacity returns the arena's size in bytes.
func (a *Arena) Capacity() int64 { return a.spec.Capacity }

// UsedBytes returns the bytes reserved for pages resident in the arena.
func (a *Arena) UsedBytes() int64 { return a.used.Load() }

// FreeBytes returns Capacity - UsedBytes.
func (a *Arena) FreeBytes() int64 { return a.spec.Capacity - a.used.Load() }

// NewFile creates a location file (FileSize bytes, sparse) for one client
// on this device. On a NUMA arena the whole file is bound to the arena's
// node before NewFile returns, so every page that is ever allocated in
// it, by any path (a fault through any process's mapping, pwrite,
// copy_file_range, fallocate), lands on the node; callers need not call
// BindRange and cannot forget to.
func (a *Arena) NewFile(name string) (*File, error) {
	return a.bind(CreateFile(name, FileSize))
}

// NewLargeFolioFile is NewFile for a file of large folios
// (CreateLargeFolioFile).
func (a *Arena) NewLargeFolioFile(name string) (*File, error) {
	return a.bind(CreateLargeFolioFile(name, FileSize))
}

func (a *Arena) bind(f *File, err error) (*File, error) {
	if err != nil {
		return nil, fmt.Errorf("device %d: %w", a.spec.Device, err)
	}
	if a.spec.Backend == BackendNUMA {
		if err := f.BindRange(a.spec.Node, 0, FileSize); err != nil {
			f.Close()
			return nil, fmt.Errorf("device %d: %w", a.spec.Device, err)
		}
	}
	return f, nil
}

// Reserve accounts pages about to become resident in the arena. When
// they do not fit it changes nothing and returns an *ArenaFullError
// (errors.Is(err, ErrArenaFull) holds), so the caller can evict and try
// again. It is safe for concurrent use and never lets the total exceed
// the capacity.
func (a *Arena) Reserve(pages int64) error {
	if pages < 0 {
		return fmt.Errorf("device %d arena: reserve %d pages: want >= 0", a.spec.Device, pages)
	}
	if pages == 0 {
		return nil
	}
	for {
		used := a.used.Load()
		if pages > (a.spec.Capacity-used)/PageSize {
			return &ArenaFullError{Device: a.spec.Device, Capacity: a.spec.Capacity, Used: used, Requested: pagesToBytes(pages)}
		}
		if a.used.CompareAndSwap(used, used+pages*PageSize) {
			return nil
		}
	}
}

// pagesToBytes converts, saturating instead of overflowing on absurd
// counts so that error messages stay truthful.
func pagesToBytes(pages int64) int64 {
	if pages > math.MaxInt64/PageSize {
		return math.MaxInt64
	}
	return pages * PageSize
}

// Release gives back pages that left the arena. Releasing more than is
// reserved (or a negative count) is a bookkeeping bug elsewhere; it must
// not bring the server down, so the arena clamps at zero, counts the
// error in AccountingErrors and remembers it for LastAccountingError.
func (a *Arena) Release(pages int64) {
	if pages == 0 {
		return
	}
	if pages < 0 {
		a.accountingError(fmt.Sprintf("device %d arena: release %d pages: want >= 0", a.spec.Device, pages))
		return
	}
	bytes := pagesToBytes(pages)
	for {
		used := a.used.Load()
		if bytes > used {
			if a.used.CompareAndSwap(used, 0) {
				a.accountingError(fmt.Sprintf("device %d arena: release %d pages (%d bytes) with only %d bytes reserved",
					a.spec.Device, pages, bytes, used))
				return
			}
			continue
		}
		if a.used.CompareAndSwap(used, used-bytes) {
			return
		}
	}
}

func (a *Arena) accountingError(msg string) {
	a.acctErrs.Add(1)
	a.lastError.Store(&msg)
}

// AccountingErrors counts the Release calls that did not match what was
// reserved; tests and leak checks expect 0.
func (a *Arena) AccountingErrors() int64 { return a.acctErrs.Load() }

// LastAccountingError describes the latest accounting error; "" if none.
func (a *Arena) LastAccountingError() string {
	if p := a.lastError.Load(); p != nil {
		return *p
	}
	return ""
}
