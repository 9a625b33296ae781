package device

import (
	"fmt"
	"runtime/debug"
	"sync"
	"sync/atomic"

	"github.com/softuvm/softuvm/internal/core"
	"github.com/softuvm/softuvm/internal/wire"
)

// Grid launches of Go kernels (core.GridKernel), as block.c runs C's.
//
// A worker runs one block at a time. The block's first thread runs on the
// worker's goroutine; if it returns without waiting at a barrier, the
// next one runs, and so on: a block whose kernel has no barrier is a loop
// over its threads (HIP-CPU's trick). The first thread that waits while
// others are still to run starts the rest as goroutines, and from then on
// a barrier is a generation: the last thread to arrive ends it and wakes
// the others. A goroutine is Go's own fiber, so a block of any size runs,
// its threads waiting for each other, whatever the number of workers;
// unlike C's fibers they may run at the same time on several CPUs, which
// changes nothing a barrier-synchronized kernel can see. A thread that
// returned (or panicked) no longer counts at a barrier.
//
// Shared memory is a slice per block, of the launch's size, reused by the
// blocks a worker runs in turn. A cooperative launch runs every block at
// once, each on a goroutine of its own, and SyncGrid is a block barrier
// whose last arrival waits for every block still running before it ends.

// gridKernels is the registry of grid kernels, beside kernels (kernel.go):
// a name belongs to one kernel of either kind.
var gridKernels struct {
	sync.RWMutex
	byName map[string]core.GridKernel
}

// RegisterGridKernel makes a grid kernel launchable by name (LaunchGrid).
func RegisterGridKernel(name string, k core.GridKernel) error {
	if err := checkKernelName(name); err != nil {
		return err
	}
	if k == nil {
		return fmt.Errorf("%w: grid kernel %q: nil function", core.ErrInvalidValue, name)
	}
	if _, dup := LookupKernel(name); dup {
		return fmt.Errorf("%w: grid kernel %q: a kernel of threads (RegisterKernel) has that name", core.ErrInvalidValue, name)
	}
	gridKernels.Lock()
	defer gridKernels.Unlock()
	if gridKernels.byName == nil {
		gridKernels.byName = map[string]core.GridKernel{}
	}
	if _, dup := gridKernels.byName[name]; dup {
		return fmt.Errorf("%w: grid kernel %q registered twice", core.ErrInvalidValue, name)
	}
	gridKernels.byName[name] = k
	return nil
}

// LookupGridKernel finds a registered grid kernel.
func LookupGridKernel(name string) (core.GridKernel, bool) {
	gridKernels.RLock()
	defer gridKernels.RUnlock()
	k, ok := gridKernels.byName[name]
	return k, ok
}

// gridRun is one grid launch as the process runs it.
type gridRun struct {
	k           core.GridKernel
	name        string
	device      int
	grid, block core.Dim3
	blocks      uint64
	threads     int
	shared      int
	params      []byte
	cooperative bool
	next        atomic.Uint64 // the next block a worker takes

	// A cooperative grid's barrier.
	mu      sync.Mutex
	alive   uint64 // blocks not finished
	arrived uint64 // blocks at the barrier
	round   chan struct{}

	errMu sync.Mutex
	errs  []error
}

func (g *gridRun) fail(err error) {
	g.errMu.Lock()
	g.errs = append(g.errs, err)
	g.errMu.Unlock()
}

// launchGrid runs one grid launch to completion: a block at a time on
// each worker, as many workers as blocks, or on the stream's goroutine
// for one block or one worker; a cooperative grid's blocks all at once.
func (rt *deviceRuntime) launchGrid(lg *wire.LaunchGridRequest) error {
	k, ok := LookupGridKernel(lg.Name)
	if !ok {
		if _, plain := LookupKernel(lg.Name); plain {
			return fmt.Errorf("%w: kernel %q is a kernel of threads (RegisterKernel), not a grid kernel (RegisterGridKernel)", core.ErrLaunchFailure, lg.Name)
		}
		return fmt.Errorf("%w: grid kernel %q is not registered in device %d's process (register it in an init function)", core.ErrLaunchFailure, lg.Name, rt.index)
	}
	g := &gridRun{k: k, name: lg.Name, device: rt.index, grid: lg.Grid, block: lg.Block, blocks: lg.Grid.Count(),
		threads: int(lg.Block.Count()), shared: int(lg.SharedBytes), params: lg.Params, cooperative: lg.Flags&core.GridCooperative != 0}
	if g.cooperative {
		if err := core.CheckCooperative(lg.Grid, lg.Block, uint64(lg.SharedBytes), len(rt.workers)); err != nil {
			return err
		}
		g.alive = g.blocks
		g.round = make(chan struct{})
		var wg sync.WaitGroup
		for i := range g.blocks {
			wg.Add(1)
			go func() {
				defer wg.Done()
				debug.SetPanicOnFault(true)
				g.runBlock(i, make([]byte, g.shared))
				g.blockDone()
			}()
		}
		wg.Wait()
		return core.JoinErrors(g.errs)
	}
	parts := int(min(g.blocks, uint64(len(rt.workers))))
	if parts <= 1 {
		g.work()
		return core.JoinErrors(g.errs)
	}
	var wg sync.WaitGroup
	chunks := make([]kernelChunk, parts)
	for i := range chunks {
		chunks[i] = kernelChunk{grid: g, wg: &wg}
		wg.Add(1)
		rt.workers[i] <- &chunks[i]
	}
	wg.Wait()
	return core.JoinErrors(g.errs)
}

// work runs blocks until none is left to take.
func (g *gridRun) work() {
	shared := make([]byte, g.shared)
	for {
		i := g.next.Add(1) - 1
		if i >= g.blocks {
			return
		}
		g.runBlock(i, shared)
	}
}

func indexIn(linear uint64, d core.Dim3) core.Dim3 {
	return core.Dim3{X: uint32(linear % uint64(d.X)), Y: uint32(linear / uint64(d.X) % uint64(d.Y)), Z: uint32(linear / (uint64(d.X) * uint64(d.Y)))}
}

// gridBlock is one block as it runs.
type gridBlock struct {
	g      *gridRun
	index  core.Dim3
	shared []byte

	mu       sync.Mutex
	alive    int  // threads that have not returned
	arrived  int  // threads at the barrier
	count    int  // of them, with a true predicate
	gridWait bool // the barrier is a grid barrier's (SyncGrid)
	round    *barrierRound
	started  bool // the threads after the first waiter run as goroutines
	wg       sync.WaitGroup
}

// barrierRound is one barrier's wait: closed when it ends, with its
// counts, so that a thread that wakes late still reads its own round's.
type barrierRound struct {
	done     chan struct{}
	count, n int
}

// gridThread is a thread of a block: the kernel's core.Thread.
type gridThread struct {
	b   *gridBlock
	idx core.Dim3
	tid int
}

func (t *gridThread) ThreadIdx() core.Dim3 { return t.idx }
func (t *gridThread) BlockIdx() core.Dim3  { return t.b.index }
func (t *gridThread) BlockDim() core.Dim3  { return t.b.g.block }
func (t *gridThread) GridDim() core.Dim3   { return t.b.g.grid }
func (t *gridThread) Shared() []byte       { return t.b.shared }

func (t *gridThread) SyncThreads() { t.b.barrier(t, false, false) }

func (t *gridThread) SyncThreadsCount(predicate bool) int {
	c, _ := t.b.barrier(t, predicate, false)
	return c
}

func (t *gridThread) SyncThreadsAnd(predicate bool) bool {
	c, n := t.b.barrier(t, predicate, false)
	return c == n
}

func (t *gridThread) SyncThreadsOr(predicate bool) bool {
	c, _ := t.b.barrier(t, predicate, false)
	return c > 0
}

func (t *gridThread) SyncGrid() {
	if !t.b.g.cooperative {
		panic("SyncGrid in a grid that is not cooperative: launch it with LaunchConfig.Cooperative, which keeps every block resident so that a grid barrier can wait for all of them")
	}
	t.b.barrier(t, false, true)
}

// runBlock runs block i of g on the calling goroutine, and the block's
// threads after the first waiter on goroutines of their own.
func (g *gridRun) runBlock(i uint64, shared []byte) {
	b := &gridBlock{g: g, index: indexIn(i, g.grid), shared: shared, alive: g.threads, round: &barrierRound{done: make(chan struct{})}}
	t := &gridThread{b: b}
	for tid := 0; tid < g.threads; tid++ {
		t.tid, t.idx = tid, indexIn(uint64(tid), g.block)
		b.run(t)
		b.mu.Lock()
		started := b.started
		b.mu.Unlock()
		if started {
			break
		}
	}
	b.wg.Wait()
}

// run runs thread t's kernel, and counts it out when it returns or
// panics.
func (b *gridBlock) run(t *gridThread) {
	defer func() {
		if r := recover(); r != nil {
			b.g.fail(fmt.Errorf("%w: grid kernel %q panicked on device %d in thread %v of block %v (a grid %v of blocks %v): %v",
				core.ErrLaunchFailure, b.g.name, b.g.device, t.idx, b.index, b.g.grid, b.g.block, r))
		}
		b.ended()
	}()
	b.g.k(t, b.g.params)
}

// ended counts a returned thread out; a barrier that only it kept from
// ending ends.
func (b *gridBlock) ended() {
	b.mu.Lock()
	b.alive--
	if b.alive > 0 && b.arrived == b.alive {
		b.releaseLocked()
	}
	b.mu.Unlock()
}

// barrier waits until every living thread of the block has arrived, and
// for a grid barrier until every block has; it returns how many passed a
// true predicate, of how many.
func (b *gridBlock) barrier(t *gridThread, predicate, grid bool) (int, int) {
	b.mu.Lock()
	if predicate {
		b.count++
	}
	if grid {
		b.gridWait = true
	}
	b.arrived++
	round := b.round
	if b.arrived == b.alive {
		b.releaseLocked()
		b.mu.Unlock()
		return round.count, round.n
	}
	if !b.started {
		// The threads after this one, none of which has started, run
		// as goroutines from now on.
		b.started = true
		for tid := t.tid + 1; tid < b.g.threads; tid++ {
			b.wg.Add(1)
			go func() {
				defer b.wg.Done()
				debug.SetPanicOnFault(true)
				b.run(&gridThread{b: b, tid: tid, idx: indexIn(uint64(tid), b.g.block)})
			}()
		}
	}
	b.mu.Unlock()
	<-round.done
	return round.count, round.n
}

// releaseLocked ends the barrier: its counts, the next round, and, for a
// grid barrier, a wait for every block first. b.mu is held; the grid's
// wait lets it go meanwhile (every other thread of the block is waiting).
func (b *gridBlock) releaseLocked() {
	round := b.round
	round.count, round.n = b.count, b.arrived
	b.count, b.arrived = 0, 0
	b.round = &barrierRound{done: make(chan struct{})}
	grid := b.gridWait
	b.gridWait = false
	if grid {
		b.mu.Unlock()
		b.g.gridBarrier()
		b.mu.Lock()
	}
	close(round.done)
}

// gridBarrier waits until every block of a cooperative grid still running
// has arrived.
func (g *gridRun) gridBarrier() {
	g.mu.Lock()
	round := g.round
	g.arrived++
	if g.arrived >= g.alive {
		g.releaseGridLocked()
		g.mu.Unlock()
		return
	}
	g.mu.Unlock()
	<-round
}

func (g *gridRun) releaseGridLocked() {
	g.arrived = 0
	close(g.round)
	g.round = make(chan struct{})
}

// blockDone counts a finished block of a cooperative grid out of its
// barrier.
func (g *gridRun) blockDone() {
	g.mu.Lock()
	g.alive--
	if g.arrived > 0 && g.arrived >= g.alive {
		g.releaseGridLocked()
	}
	g.mu.Unlock()
}
