package engine

import (
	"encoding/json"
	"fmt"
	"math"
	"math/bits"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/softuvm/softuvm/devmem"
	"github.com/softuvm/softuvm/internal/config"
	"github.com/softuvm/softuvm/internal/core"
)

// Calibration is this machine's calibration, at once and never waiting
// for a measurement: the one kept in the runtime directory by the first
// server since boot, or, until that is measured, defaults derived from
// the CPU count (defaultCalibration), Source saying which. The first call
// with nothing kept starts measuring in the background, on threads at the
// lowest priority (SCHED_IDLE) and only while the machine is idle
// (measureInBackground); when it is done, the measured calibration
// replaces the defaults for later calls and is kept for every later
// server, so that every later server, and every run of a benchmark,
// copies with the same parameters. UVM_COPY_CALIBRATION=fresh measures
// again (and keeps the new one).
func Calibration() config.CopyCalibration { return machineCalibration().get() }

// CalibrationDone is closed once the calibration in use is measured or
// kept (or measuring failed): Calibration no longer changes.
func CalibrationDone() <-chan struct{} { return machineCalibration().done }

var machineCalibration = sync.OnceValue(func() *calibrator {
	return newCalibrator(calibrationPath(), func() config.CopyCalibration { return calibrate(waitForIdle) })
})

// calibrator holds a calibration that readers load while a measurement
// may replace it.
type calibrator struct {
	path    string
	measure func() config.CopyCalibration
	current atomic.Pointer[config.CopyCalibration]
	once    sync.Once
	done    chan struct{} // closed once current no longer changes
}

func newCalibrator(path string, measure func() config.CopyCalibration) *calibrator {
	return &calibrator{path: path, measure: measure, done: make(chan struct{})}
}

func (k *calibrator) get() config.CopyCalibration {
	k.once.Do(k.start)
	return *k.current.Load()
}

// start reads the kept calibration (a file, microseconds) or puts the
// defaults in place and measures in the background.
func (k *calibrator) start() {
	if os.Getenv(config.EnvCopyCalibration) != "fresh" {
		if c, ok := loadCalibration(k.path); ok {
			k.current.Store(&c)
			close(k.done)
			return
		}
	}
	d := defaultCalibration(runtime.NumCPU(), "defaults (measuring in the background)")
	k.current.Store(&d)
	go k.measureInBackground()
}

// measureInBackground measures on a thread of its own at SCHED_IDLE, so
// that it runs only on CPUs nothing else wants, swaps the result in and
// keeps it. The goroutine never unlocks its thread: the runtime retires
// the thread with it rather than hand an idle-priority thread to other
// goroutines.
func (k *calibrator) measureInBackground() {
	defer close(k.done)
	runtime.LockOSThread()
	_ = setIdlePriority() // at normal priority it measures all the same
	c := k.measure()
	if c.Err != "" {
		d := defaultCalibration(runtime.NumCPU(), "defaults (measuring failed: "+c.Err+")")
		d.Err, d.Took = c.Err, c.Took
		k.current.Store(&d)
		return
	}
	c.Source, c.Kept = "measured", ""
	storeCalibration(k.path, c)
	k.current.Store(&c)
}

// defaultCalibration is what the engine copies with until a calibration
// is measured or read: parameters that measured well on every machine
// measured so far (docs/benchmarks.md: 2 vCPUs and 16 cores) and that take
// no more than two CPUs from a program on a small machine.
//   - Copies: two producers (where there are two CPUs), from 2 MiB. One
//     thread's memcpy leaves memory half idle on both machines (the
//     calibration chose 2 of 2 and 16 of 16 producers); more than two
//     would compete with the program on a small machine. The engine paid
//     from 2 MiB on both.
//   - Migrations: one producer and no pipeline. Installing allocates new
//     pages, several times slower than one thread's copy, so the paper's
//     first condition gives one producer, and the pipeline never beat the
//     direct path by 10% on either machine.
//   - Block movers: two, or half the CPUs up to 8 where that is more
//     (defaultBlockMovers).
//   - No non-temporal stores: ordinary stores are never wrong; the others
//     pay only where measured.
func defaultCalibration(cpus int, source string) config.CopyCalibration {
	cpus = max(cpus, 1)
	c := config.CopyCalibration{
		CPUs: cpus, CopyProducers: min(2, cpus), MigrationProducers: 1, BlockMovers: defaultBlockMovers(cpus),
		DirectBelow: math.MaxInt64, CopyDirectBelow: 2 << 20, Source: source,
	}
	if c.CopyProducers < 2 {
		c.CopyDirectBelow = math.MaxInt64
	}
	return c
}

// defaultBlockMovers is the block movers of the defaults: two, and
// half the CPUs, at most 8, where that is more. Movers of one file took
// turns on its inode lock until WriteBlockUnseen, so two were all that
// paid; since then the calibration chose 12 and 13 of 16 CPUs, and with
// the defaults of 16 CPUs 8 movers ran `Prefetch` at 16.0-17.7 GB/s
// where 2 ran it at 6.5-7.6 (docs/benchmarks-log.md, "Several movers into
// one file"). Half the CPUs leaves the other half to the program.
func defaultBlockMovers(cpus int) int {
	return max(min(2, cpus), min(cpus/2, 8))
}

// setIdlePriority puts the calling thread (which the caller has locked)
// at SCHED_IDLE, or at nice 19 where that is refused.
func setIdlePriority() error { return devmem.SetThreadIdlePriority() }

// idleThreads are worker goroutines each locked to a thread at SCHED_IDLE,
// for the measurements that run several threads at once.
type idleThreads struct {
	work []chan func()
	wg   sync.WaitGroup
}

func newIdleThreads(n int) *idleThreads {
	p := &idleThreads{work: make([]chan func(), n)}
	started := make(chan struct{}, n)
	for i := range p.work {
		p.work[i] = make(chan func())
		go func() {
			runtime.LockOSThread() // never unlocked: the thread goes with the goroutine
			_ = setIdlePriority()
			started <- struct{}{}
			for f := range p.work[i] {
				f()
				p.wg.Done()
			}
		}()
	}
	for range n {
		<-started
	}
	return p
}

// run runs f(0), ..., f(n-1) at once, each on a thread of its own, and
// waits for them. It says whether any of them was preempted (an
// involuntary context switch of its thread): at SCHED_IDLE, any other
// work that wakes on its CPU takes the CPU, and the round measured that
// work as much as the copy.
func (p *idleThreads) run(n int, f func(i int)) (preempted bool) {
	var switched atomic.Bool
	p.wg.Add(n)
	for i := range n {
		p.work[i] <- func() {
			before := involuntarySwitches()
			f(i)
			if involuntarySwitches() != before {
				switched.Store(true)
			}
		}
	}
	p.wg.Wait()
	return switched.Load()
}

// involuntarySwitches counts the calling thread's involuntary context
// switches.
func involuntarySwitches() int64 { return devmem.ThreadInvoluntarySwitches() }

// undisturbedRounds is how many times a round of copies preempted by
// other work is measured again before it counts as it is.
const undisturbedRounds = 4

func (p *idleThreads) stop() {
	for _, w := range p.work {
		close(w)
	}
}

// newIdleEngine is a copy engine for calibration whose producers run at
// SCHED_IDLE: its producers lock their threads (to every CPU this process
// may use) and a first job sets each one's priority.
func newIdleEngine(producers int) *CopyEngine {
	e := newCopyEngine(producers, 0)
	if cpus, err := devmem.AllowedCPUs(); err == nil {
		e.cpus = cpus
	}
	if len(e.cpus) == 0 {
		return e // unlocked threads cannot take a priority of their own
	}
	// One chunk per producer, each held until every producer has one; at
	// least two, or the job would run on the caller's thread, which may
	// not be locked.
	var all sync.WaitGroup
	var arrived atomic.Int64
	all.Add(e.producers)
	_, _ = e.Run(&CopyJob{Chunks: max(e.producers, 2), Bytes: math.MaxInt64, Produce: func(int, []byte) error {
		_ = setIdlePriority()
		if arrived.Add(1) <= int64(e.producers) {
			all.Done()
			all.Wait()
		}
		return nil
	}})
	return e
}

// waitForIdle waits until the machine's CPUs have been idle for
// idleWindow but for at most a quarter of one CPU (a sixteenth of the
// machine on larger ones), so that a measurement neither slows the
// program that started the server nor is skewed by it: figures measured
// beside other work would be kept for the whole boot. On a machine that
// is never idle it waits as long as the server runs, and the defaults
// stay in use.
func waitForIdle() {
	cpus := uint64(max(runtime.NumCPU(), 1))
	for {
		busy0, total0, err := cpuTicks()
		if err != nil {
			return
		}
		time.Sleep(idleWindow)
		busy1, total1, err := cpuTicks()
		if err != nil {
			return
		}
		busy, total := busy1-busy0, total1-total0
		if total > 0 && (4*cpus*busy <= total || 16*busy <= total) {
			return
		}
	}
}

const idleWindow = 100 * time.Millisecond

// cpuTicks are the busy and total ticks of every CPU, from /proc/stat.
func cpuTicks() (busy, total uint64, err error) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, 0, err
	}
	line, _, _ := strings.Cut(string(b), "\n")
	fields := strings.Fields(line)
	if len(fields) < 5 || fields[0] != "cpu" {
		return 0, 0, fmt.Errorf("/proc/stat: no cpu line")
	}
	for i, f := range fields[1:] {
		n, err := strconv.ParseUint(f, 10, 64)
		if err != nil {
			return 0, 0, err
		}
		if i >= 7 { // steal, guest, guest_nice: not this machine's work, or counted already
			break
		}
		total += n
		if i != 3 && i != 4 { // idle, iowait
			busy += n
		}
	}
	return busy, total, nil
}

// calibrationVersion changes whenever what calibrate measures does, so
// that a kept calibration from an older softuvm is measured again.
const calibrationVersion = 2

// calibrationKey says which machine, boot and calibration a kept
// calibration is for.
func calibrationKey() string {
	boot, _ := os.ReadFile("/proc/sys/kernel/random/boot_id")
	return fmt.Sprintf("v%d boot=%s cpus=%d llc=%d", calibrationVersion, strings.TrimSpace(string(boot)), runtime.NumCPU(), lastLevelCache())
}

func calibrationPath() string { return filepath.Join(config.RuntimeDir(), "copy-calibration.json") }

type keptCalibration struct {
	Key         string                 `json:"key"`
	Calibration config.CopyCalibration `json:"calibration"`
}

func loadCalibration(path string) (config.CopyCalibration, bool) {
	b, err := os.ReadFile(path)
	if err != nil {
		return config.CopyCalibration{}, false
	}
	var k keptCalibration
	if json.Unmarshal(b, &k) != nil || k.Key != calibrationKey() || k.Calibration.CopyProducers < 1 {
		return config.CopyCalibration{}, false
	}
	k.Calibration.Kept, k.Calibration.Source = path, "kept "+path
	return k.Calibration, true
}

// storeCalibration keeps c for later servers, written whole or not at all.
func storeCalibration(path string, c config.CopyCalibration) {
	b, err := json.Marshal(keptCalibration{Key: calibrationKey(), Calibration: c})
	if err != nil || os.MkdirAll(filepath.Dir(path), 0o700) != nil {
		return
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), ".copy-calibration-*")
	if err != nil {
		return
	}
	_, werr := tmp.Write(b)
	if cerr := tmp.Close(); werr != nil || cerr != nil || os.Rename(tmp.Name(), path) != nil {
		os.Remove(tmp.Name())
	}
}

// calibrationBytes is each copy thread's buffer: large enough that the
// buffers of every thread together, sources and destinations, are twice
// the last-level cache (so that copies measure memory, not the cache),
// and at least 8 MiB.
func calibrationBytes(cpus int) int {
	return max(8<<20, lastLevelCache()/max(cpus, 1))
}

// lastLevelCache is the largest CPU cache in bytes, 32 MiB if unknown.
func lastLevelCache() int {
	size := 0
	dirs, _ := filepath.Glob("/sys/devices/system/cpu/cpu0/cache/index*")
	for _, d := range dirs {
		b, err := os.ReadFile(filepath.Join(d, "size"))
		if err != nil {
			continue
		}
		text := strings.TrimSpace(string(b))
		mult := 1
		switch {
		case strings.HasSuffix(text, "K"):
			mult, text = 1<<10, strings.TrimSuffix(text, "K")
		case strings.HasSuffix(text, "M"):
			mult, text = 1<<20, strings.TrimSuffix(text, "M")
		}
		if n, err := strconv.Atoi(text); err == nil {
			size = max(size, n*mult)
		}
	}
	if size == 0 {
		return 32 << 20
	}
	return size
}

// calibrate measures this machine, calling wait before each measurement
// (waitForIdle in the background, nothing in tests). Every thread it runs
// is at SCHED_IDLE (idleThreads, newIdleEngine) but the engines'
// releasers, which only punch what its producers copied.
func calibrate(wait func()) config.CopyCalibration {
	started := time.Now()
	c := config.CopyCalibration{CPUs: runtime.NumCPU()}
	each := calibrationBytes(c.CPUs)
	// Populated by mmap, a page at a time costs several times more, and
	// unmapped after: the server does not keep them in its heap.
	mem, err := devmem.MapScratch(2 * each * c.CPUs)
	if err != nil {
		c.Err = fmt.Sprintf("calibration buffers: %v", err)
		return c
	}
	defer devmem.UnmapScratch(mem)
	bufs := make([][2][]byte, c.CPUs)
	for i := range bufs {
		for j := range 2 {
			bufs[i][j] = mem[(2*i+j)*each : (2*i+j+1)*each : (2*i+j+1)*each]
			for k := 0; k < each; k += core.PageSize { // non-zero pages: a copy of the zero page measures nothing
				bufs[i][j][k] = 1
			}
		}
	}
	threads := newIdleThreads(c.CPUs)
	defer threads.stop()
	// 1, 2, 4, ... threads and every CPU in turn, by the median: a burst
	// of other work slows one round, not one count.
	counts := threadCounts(c.CPUs)
	rates := make([][]float64, len(counts))
	wait()
	for range 5 {
		for k, n := range counts {
			var rate float64
			for try := range undisturbedRounds {
				preempted := false
				rate = rateOf(int64(each*n), func() {
					preempted = threads.run(n, func(i int) { copy(bufs[i][1], bufs[i][0]) })
				})
				if !preempted {
					break
				}
				if try < undisturbedRounds-1 {
					wait()
				}
			}
			rates[k] = append(rates[k], rate)
		}
	}
	for k := range counts {
		c.CopyThreadsGBps = append(c.CopyThreadsGBps, median(rates[k]))
	}
	c.HostCopyGBps, c.AllCopyGBps = c.CopyThreadsGBps[0], c.CopyThreadsGBps[len(counts)-1]
	c.CopyProducers = copyProducersFor(counts, c.CopyThreadsGBps)
	c.MemoryGBps = 2 * c.AllCopyGBps
	if nonTemporalStores {
		// Copies past half the cache evict what they do not replace
		// anyway; from there, where stores that skip the cache are
		// faster, they pay.
		// Compared run by run, each against an ordinary copy right
		// before it, and by the median: a busy moment slows both.
		var nt, plain []float64
		wait()
		for range 5 {
			plain = append(plain, rateOf(int64(each), func() { copy(bufs[0][1], bufs[0][0]) }))
			nt = append(nt, rateOf(int64(each), func() { CopyNonTemporal(bufs[0][1], bufs[0][0]) }))
		}
		c.NonTemporalGBps = median(nt)
		if c.NonTemporalGBps > median(plain) {
			c.NonTemporalAbove = int64(lastLevelCache() / 2)
		}
	}
	wait()
	if c.InstallGBps, err = installRate(bufs[0][0][:core.BlockSize]); err != nil {
		c.Err = err.Error()
	}
	c.BlockMovers = blockMoversFor(c.InstallGBps, c.MemoryGBps, c.CPUs)
	wait()
	if c.BlockMoversGBps, err = calibrateBlockMovers(bufs[0][0][:core.BlockSize], c.CPUs, threads); err != nil {
		c.Err = err.Error()
	}
	wait()
	if c.DirectBelow, err = calibrateMigration(bufs[0][0][:core.BlockSize], c.BlockMovers, threads); err != nil {
		c.Err = err.Error()
		c.DirectBelow = math.MaxInt64
	}
	c.MigrationProducers = producersFor(c.InstallGBps, c.HostCopyGBps, c.MemoryGBps, c.CPUs)
	var handOff time.Duration
	wait()
	c.CopyDirectBelow, handOff = calibrateCopy(c.CopyProducers, c.HostCopyGBps)
	c.HandOffUS = float64(handOff.Nanoseconds()) / 1e3
	c.Took = core.Duration(time.Since(started))
	return c
}

// producersFor applies the paper's two conditions: producers keep up with
// the consumer, S_B2D <= N_P * S_H2B, and together with it stay within
// memory bandwidth, S_B2D + 2 * N_P * S_H2B <= B_MEM. The first gives the
// smallest N_P; the second lowers it where memory cannot feed that many.
func producersFor(consumerGBps, producerGBps, memoryGBps float64, cpus int) int {
	if producerGBps <= 0 || consumerGBps <= 0 {
		return 1
	}
	n := int(math.Ceil(consumerGBps/producerGBps - 1e-9))
	for n > 1 && consumerGBps+2*float64(n)*producerGBps > memoryGBps {
		n--
	}
	return max(1, min(n, cpus))
}

// copyProducersFor is N_P for copies straight into existing pages, which
// have no consumer: the producers are the whole transfer, and the paper's
// second condition becomes "enough producers to bring memory to its copy
// rate, B_MEM/2". A producer slows as others share memory, so the count
// is measured, not divided out: the smallest count whose rate is within
// 10% of the best.
func copyProducersFor(counts []int, gbps []float64) int {
	best := slices.Max(gbps)
	for k, r := range gbps {
		if r >= 0.9*best {
			return counts[k]
		}
	}
	return counts[len(counts)-1]
}

// threadCounts is 1, 2, 4, ... below cpus, and cpus.
func threadCounts(cpus int) []int {
	var out []int
	for n := 1; n < cpus; n *= 2 {
		out = append(out, n)
	}
	return append(out, max(cpus, 1))
}

// blockMoversFor is the paper's second condition for producers that
// install what they copy at installGBps each: together they read and
// write 2 * N * installGBps, which must stay within memory's bandwidth.
func blockMoversFor(installGBps, memoryGBps float64, cpus int) int {
	if installGBps <= 0 {
		return 1
	}
	return max(1, min(cpus, int(memoryGBps/(2*installGBps))))
}

// rateOf runs f once and returns its rate in GB/s.
func rateOf(bytes int64, f func()) float64 {
	t := time.Now()
	f()
	return float64(bytes) / time.Since(t).Seconds() / 1e9
}

func median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	return s[len(s)/2]
}

// bestRate runs f rounds times and returns the best rate in GB/s.
func bestRate(rounds int, bytes int64, f func()) float64 {
	best := time.Duration(math.MaxInt64)
	for range rounds {
		t := time.Now()
		f()
		best = min(best, time.Since(t))
	}
	return float64(bytes) / best.Seconds() / 1e9
}

// installRate is writing a block into new pages of a memfd, best of
// five: every migration's install step allocates its pages so.
func installRate(data []byte) (float64, error) {
	f, err := devmem.CreateFile("softuvm-calibrate-install", core.BlockSize)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	return bestRate(5, core.BlockSize, func() {
		if _, err := f.WriteAt(data, 0); err == nil {
			_ = f.Punch(0, core.BlockSize)
		}
	}), nil
}

// calibrateMigration returns the smallest move size from which the
// engine's pipeline beats running every stage on the mover's goroutine
// by 10%: it moves pages between two memfds the way a migration does
// (read the source, punch it, write the destination), at sizes from a
// block down to two chunks, each way round, the median of five in turn
// with five direct moves, with movers moves at once (as many as a bulk
// move runs), each of its own block.
func calibrateMigration(data []byte, movers int, threads *idleThreads) (directBelow int64, err error) {
	var files [2]*devmem.File
	for i := range files {
		if files[i], err = devmem.CreateFile(fmt.Sprintf("softuvm-calibrate-%d", i), int64(movers)*core.BlockSize); err != nil {
			return 0, err
		}
		defer files[i].Close()
	}
	engine := newIdleEngine(1) // the paper's N_P for a consumer slower than one producer, as here
	defer engine.stop()
	for m := range movers {
		if _, err := files[0].WriteAt(data, int64(m)*core.BlockSize); err != nil {
			return 0, err
		}
	}
	from := 0
	move := func(size int64, e *CopyEngine) time.Duration {
		src, dst := files[from], files[1-from]
		from = 1 - from
		t := time.Now()
		threads.run(movers, func(m int) {
			_, _ = e.Run(migrationJob(src, dst, int64(m)*core.BlockSize, size))
		})
		return time.Since(t)
	}
	// The engine must win by a margin at a size and at every larger one:
	// one lucky run on a noisy machine must not turn it on.
	directBelow = math.MaxInt64
	for size := int64(core.BlockSize); size >= 2*ChunkBytes; size /= 2 {
		var direct, piped []float64
		for range 5 {
			direct = append(direct, move(size, nil).Seconds())
			piped = append(piped, move(size, engine).Seconds())
		}
		if median(piped) > 0.9*median(direct) {
			break
		}
		directBelow = size
	}
	return directBelow, nil
}

// migrationJob moves [base, base+size) from src to dst as migrations do,
// for calibration.
func migrationJob(src, dst *devmem.File, base, size int64) *CopyJob {
	n := size
	span := func(i int) (int64, int64) {
		off := int64(i) * ChunkBytes
		return base + off, min(ChunkBytes, n-off)
	}
	return &CopyJob{
		Chunks: int((n + ChunkBytes - 1) / ChunkBytes), Bytes: n, Staging: true,
		Produce: func(i int, buf []byte) error {
			off, l := span(i)
			_, err := src.ReadAt(buf[:l], off)
			return err
		},
		Release: func(i int, _ []byte) error { off, l := span(i); return src.Punch(off, l) },
		Install: func(i int, buf []byte) error {
			off, l := span(i)
			_, err := dst.WriteAt(buf[:l], off)
			return err
		},
		Restore: func(i int, buf []byte) { off, l := span(i); _, _ = src.WriteAt(buf[:l], off) },
	}
}

// calibrateCopy returns the copy size from which the engine's producers
// pay: where a single-thread copy takes handOffMargin times the engine's
// fixed cost of a copy (waking the producers, handing them chunks and
// waiting for them: the median over handOffRounds tiny copies with idle time
// between, so that a busy moment does not decide). MaxInt64 with a single
// producer.
func calibrateCopy(producers int, hostCopyGBps float64) (int64, time.Duration) {
	if producers < 2 || hostCopyGBps <= 0 {
		return math.MaxInt64, 0
	}
	engine := newIdleEngine(producers)
	defer engine.stop()
	job := &CopyJob{Chunks: 2 * producers, Bytes: math.MaxInt64, Produce: func(int, []byte) error { return nil }}
	costs := make([]time.Duration, 0, handOffRounds)
	for range cap(costs) {
		// Idle between copies, as a program is between Memcpy calls:
		// the producers park, and waking them is most of the cost.
		time.Sleep(200 * time.Microsecond)
		t := time.Now()
		_, _ = engine.Run(job)
		costs = append(costs, time.Since(t))
	}
	slices.Sort(costs)
	cost := costs[len(costs)/2]
	size := int64(handOffMargin * cost.Seconds() * hostCopyGBps * 1e9)
	return max(2*copyChunkBytes, int64(1)<<bits.Len64(uint64(size-1))), cost
}

// handOffRounds is how many tiny copies calibrateCopy times: the median
// of 31 is as steady as that of 101 was here, and each costs a sleep.
const handOffRounds = 31

// handOffMargin is how many times its hand-offs a copy must take on one
// thread before the engine shares it out: 20, so that they cost at most
// 5% of it.
const handOffMargin = 20

// calibrationBlocks is how many blocks the block-mover calibration moves
// each time: enough to share among movers, few enough to take
// milliseconds.
const calibrationBlocks = 8

// calibrateBlockMovers moves calibrationBlocks blocks between two memfds
// the way a migration does, with 1, 2, ... movers (up to the CPUs, at most
// 16) each taking whole blocks, and returns the best of three rates for
// each count (for the record only: three are enough), stopping after the
// first count that is not 10% faster.
func calibrateBlockMovers(data []byte, cpus int, threads *idleThreads) ([]float64, error) {
	size := int64(calibrationBlocks * core.BlockSize)
	var files [2]*devmem.File
	var err error
	for i := range files {
		if files[i], err = devmem.CreateFile(fmt.Sprintf("softuvm-calibrate-blocks-%d", i), size); err != nil {
			return nil, err
		}
		defer files[i].Close()
	}
	for b := int64(0); b < size; b += core.BlockSize {
		if _, err := files[0].WriteAt(data, b); err != nil {
			return nil, err
		}
	}
	from := 0
	var rates []float64
	for movers := 1; movers <= min(cpus, 16); movers++ {
		rate := bestRate(3, size, func() {
			src, dst := files[from], files[1-from]
			from = 1 - from
			var next atomic.Int64
			threads.run(movers, func(int) {
				for b := next.Add(1) - 1; b < calibrationBlocks; b = next.Add(1) - 1 {
					_, _ = runDirect(migrationJob(src, dst, b*core.BlockSize, core.BlockSize))
				}
			})
		})
		rates = append(rates, rate)
		if movers > 1 && rate < 1.1*rates[movers-2] {
			break
		}
	}
	return rates, nil
}
