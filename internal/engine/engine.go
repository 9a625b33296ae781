package engine

import (
	"runtime"
	"sync"

	"github.com/softuvm/softuvm/devmem"
)

// The copy engine carries bulk moves, after "Multithreaded Double Queuing
// for Balanced CPU-GPU Memory Copying" (SAC'19): one thread that
// copies and then installs leaves the install step idle while it copies
// and the copy idle while it installs; N_P producers filling buffers that
// one consumer drains keep both busy.
//
// A move is a copyJob cut into chunks, each going through up to three
// stages:
//
//	produce  copy the chunk's source into a staging buffer, or straight
//	         into the destination; on the engine's N_P producer
//	         goroutines, in any order, several chunks at once
//	release  free the chunk's source (punch its pages from the source
//	         file); on the engine's releaser goroutine
//	install  put the chunk at its destination (UFFDIO_COPY into a view,
//	         or a write into the destination file); on the job's own
//	         goroutine, the consumer, in chunk order
//
// A chunk is released before it is installed: once its pages are at the
// destination a thread there may write them, and a reader of the old
// copy must not see the old bytes after that write (migrate.go). Each
// job holds at most depth chunks in flight, one staging buffer each,
// which is the paper's circular queue with back-pressure: the consumer
// submits chunk i+depth only when chunk i is installed.
//
// Jobs below the engine's direct-path size run every stage on the
// caller's goroutine, so that the hand-offs never make a small move
// slower.
type CopyEngine struct {
	producers int
	// cpus are the CPUs the producers run on: a NUMA node's, near the
	// destinations they write; nil leaves them to the scheduler.
	cpus []int
	// directBelow is the size under which a job runs on its caller's
	// goroutine.
	directBelow int64

	// mu is held (read) by running jobs and (write) by stop, so that the
	// engine's goroutines go only after the last job is done.
	mu        sync.RWMutex
	stopped   bool
	start     sync.Once
	tasks     chan chunkTask
	releases  chan chunkTask
	producing sync.WaitGroup
	releasing sync.WaitGroup
	bufs      sync.Pool // staging buffers of chunkBytes
}

// chunkBytes is a chunk's size: large enough that a chunk's syscalls and
// hand-offs (a few microseconds) are small beside its copy, small enough
// that a 2 MiB block is several chunks and its stages overlap.
const ChunkBytes = 128 << 10

// copyBytesJob copies src into dst in chunks, with non-temporal stores if
// nt.
func CopyBytesJob(dst, src []byte, nt bool) *CopyJob {
	n := min(len(dst), len(src))
	return &CopyJob{
		Chunks: (n + copyChunkBytes - 1) / copyChunkBytes, Bytes: int64(n),
		Produce: func(i int, _ []byte) error {
			lo := i * copyChunkBytes
			hi := min(n, lo+copyChunkBytes)
			if nt {
				CopyNonTemporal(dst[lo:hi], src[lo:hi])
			} else {
				copy(dst[lo:hi], src[lo:hi])
			}
			return nil
		},
	}
}

// copyChunkBytes is a plain copy's chunk: a copy has no install step to
// overlap, so chunks only need to be large beside a hand-off (a few
// microseconds) and small enough to share out evenly.
const copyChunkBytes = 1 << 20

// copyJob is one bulk move of chunks chunks. Stages left nil are skipped.
type CopyJob struct {
	Chunks int
	// bytes is the move's total size, for the direct-path decision.
	Bytes int64
	// staging asks for a chunkBytes buffer per chunk in flight, passed to
	// produce and install; without, they get nil.
	Staging bool
	Produce func(i int, buf []byte) error
	Release func(i int, buf []byte) error
	Install func(i int, buf []byte) error
	// restore puts back the source of chunk i, released but not
	// installed because an earlier chunk failed.
	Restore func(i int, buf []byte)
	// direct is the buffer the direct path uses, if the caller has one.
	Direct []byte
	// buffers, if set, provides the staging buffers instead of the
	// engine's own (the server's staging area, which a new server can
	// read if this one dies).
	Buffers BufferSource
}

// BufferSource lends staging buffers of chunkBytes.
type BufferSource interface {
	Get() []byte
	Put([]byte)
}

// chunkTask is chunk i of a job on its way through the producers and the
// releaser; done receives its outcome once it is released (or failed).
type chunkTask struct {
	job  *CopyJob
	i    int
	buf  []byte
	done chan error
}

func newCopyEngine(producers int, directBelow int64) *CopyEngine {
	e := &CopyEngine{producers: max(producers, 1), directBelow: directBelow}
	e.bufs.New = func() any { b := make([]byte, ChunkBytes); return &b }
	return e
}

// runDirect runs every stage of every chunk on the caller's goroutine.
func runDirect(job *CopyJob) (int, error) {
	buf := job.Direct
	if job.Staging && len(buf) < ChunkBytes {
		buf = make([]byte, ChunkBytes)
	}
	for i := 0; i < job.Chunks; i++ {
		if job.Produce != nil {
			if err := job.Produce(i, buf); err != nil {
				return i, err
			}
		}
		if job.Release != nil {
			if err := job.Release(i, buf); err != nil {
				return i, err
			}
		}
		if job.Install != nil {
			if err := job.Install(i, buf); err != nil {
				return i, err
			}
		}
	}
	return job.Chunks, nil
}

// pinToNode keeps the calling goroutine on its thread, bound to NUMA node
// node's CPUs, for the rest of its life (the runtime retires the thread
// with the goroutine); node -1 does nothing.
func PinToNode(node int) { pinToCPUs(nodeCPUs(node)) }

// nodeCPUs is node's CPUs, nil for node -1 or one that cannot be read.
func nodeCPUs(node int) []int {
	if node < 0 {
		return nil
	}
	cpus, _ := devmem.NodeCPUs(node) // unpinned, it copies all the same
	return cpus
}

// pinToCPUs is pinToNode for a CPU set; nil does nothing.
func pinToCPUs(cpus []int) {
	if len(cpus) == 0 {
		return
	}
	runtime.LockOSThread()
	_ = devmem.PinCurrentThreadToCPUs(cpus) // unpinned, it copies all the same
}

// copyEngines holds one engine per destination NUMA node, made on first
// use, so that producers run near the memory they write.
type CopyEngines struct {
	mu          sync.Mutex
	producers   int
	directBelow int64
	byNode      map[int]*CopyEngine
	stopped     bool
}

func NewCopyEngines(producers int, directBelow int64) *CopyEngines {
	return &CopyEngines{producers: producers, directBelow: directBelow, byNode: map[int]*CopyEngine{}}
}

// launch starts the goroutines, on first use.
func (e *CopyEngine) launch() {
	e.tasks = make(chan chunkTask, e.producers*2)
	e.releases = make(chan chunkTask, e.producers*2)
	e.producing.Add(e.producers)
	for range e.producers {
		go e.producer()
	}
	e.releasing.Add(1)
	go e.releaser()
}

func (e *CopyEngine) producer() {
	defer e.producing.Done()
	pinToCPUs(e.cpus)
	for t := range e.tasks {
		err := t.job.Produce(t.i, t.buf)
		if err != nil || t.job.Release == nil {
			t.done <- err
			continue
		}
		e.releases <- t
	}
}

func (e *CopyEngine) releaser() {
	defer e.releasing.Done()
	for t := range e.releases {
		t.done <- t.job.Release(t.i, t.buf)
	}
}

// stop waits for running jobs, then for the engine's goroutines to end.
// Jobs after stop run on their callers' goroutines.
func (e *CopyEngine) stop() {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.stopped {
		return
	}
	e.stopped = true
	if e.tasks != nil {
		close(e.tasks)
		e.producing.Wait() // nothing sends releases now
		close(e.releases)
		e.releasing.Wait()
	}
}

// depth is how many chunks of one job are in flight: enough for every
// producer to hold one while the releaser and the consumer each hold
// another.
func (e *CopyEngine) depth() int { return 2*e.producers + 2 }

// run carries job out and returns how many chunks were installed, in
// order, before the first failure.
func (e *CopyEngine) Run(job *CopyJob) (int, error) {
	if job.Chunks <= 0 {
		return 0, nil
	}
	if e == nil || job.Bytes < e.directBelow || job.Chunks == 1 {
		return runDirect(job)
	}
	e.mu.RLock()
	defer e.mu.RUnlock()
	if e.stopped {
		return runDirect(job)
	}
	e.start.Do(e.launch) // stop, which reads tasks, waits for this read lock
	return e.pipeline(job)
}

func (e *CopyEngine) pipeline(job *CopyJob) (int, error) {
	depth := min(e.depth(), job.Chunks)
	slots := make([]chunkTask, depth)
	for s := range slots {
		slots[s] = chunkTask{job: job, done: make(chan error, 1)}
		if job.Staging {
			if job.Buffers != nil {
				slots[s].buf = job.Buffers.Get()
			} else {
				slots[s].buf = *(e.bufs.Get().(*[]byte))
			}
		}
	}
	defer func() {
		for s := range slots {
			if b := slots[s].buf; b != nil && job.Buffers != nil {
				job.Buffers.Put(b)
			} else if b != nil {
				e.bufs.Put(&b)
			}
		}
	}()
	submitted := 0
	submit := func() {
		t := &slots[submitted%depth]
		t.i = submitted
		submitted++
		e.tasks <- *t
	}
	for submitted < depth {
		submit()
	}
	for i := 0; i < job.Chunks; i++ {
		t := &slots[i%depth]
		err := <-t.done
		if err == nil && job.Install != nil {
			err = job.Install(i, t.buf)
		}
		if err != nil {
			e.abandon(job, slots, i+1, submitted)
			return i, err
		}
		if submitted < job.Chunks {
			submit()
		}
	}
	return job.Chunks, nil
}

// abandon waits for chunks [from, to) still in flight after chunk from-1
// failed, and puts back the sources of those that were released.
func (e *CopyEngine) abandon(job *CopyJob, slots []chunkTask, from, to int) {
	for i := from; i < to; i++ {
		t := &slots[i%len(slots)]
		if err := <-t.done; err == nil && job.Release != nil && job.Restore != nil {
			job.Restore(i, t.buf)
		}
	}
}

// forNode returns the engine whose producers run on node's CPUs (-1: any).
func (c *CopyEngines) ForNode(node int) *CopyEngine {
	c.mu.Lock()
	defer c.mu.Unlock()
	e := c.byNode[node]
	if e == nil {
		e = newCopyEngine(c.producers, c.directBelow)
		e.cpus = nodeCPUs(node)
		if c.stopped {
			e.stop()
		}
		c.byNode[node] = e
	}
	return e
}

// stop stops every engine; engines asked for later come stopped.
func (c *CopyEngines) Stop() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.stopped = true
	for _, e := range c.byNode {
		e.stop()
	}
}
