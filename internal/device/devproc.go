package device

import (
	"errors"
	"fmt"
	"net"
	"os"
	"runtime"
	"runtime/debug"
	"strconv"
	"sync"
	"syscall"

	"github.com/softuvm/softuvm/devmem"
	"github.com/softuvm/softuvm/internal/config"
	"github.com/softuvm/softuvm/internal/core"
	"github.com/softuvm/softuvm/internal/wire"
	"github.com/softuvm/softuvm/uffd"
)

func RunDevice() int {
	fail := func(format string, args ...any) int {
		fmt.Fprintf(os.Stderr, "softuvm device process %d: %s\n", os.Getpid(), fmt.Sprintf(format, args...))
		return 1
	}
	if err := devmem.ReserveAddressSpaceAt(config.ManagedWindowStart, config.ManagedWindowSize); err != nil {
		return fail("reserve the managed window: %v", err)
	}
	d, err := strconv.Atoi(os.Getenv(config.DeviceEnv))
	workers, werr := strconv.Atoi(os.Getenv(config.DeviceWorkersEnv))
	if err != nil || werr != nil || d < 0 || workers < 1 {
		return fail("%s=%q %s=%q: want a device index and a worker count", config.DeviceEnv, os.Getenv(config.DeviceEnv), config.DeviceWorkersEnv, os.Getenv(config.DeviceWorkersEnv))
	}
	server, err := FileConn(3)
	if err != nil {
		return fail("server connection: %v", err)
	}
	control, err := wire.NewDirectConn(os.NewFile(4, "softuvm-client"))
	if err != nil {
		return fail("client connection: %v", err)
	}
	defaultStream, err := wire.NewDirectConn(os.NewFile(5, "softuvm-default-stream"))
	if err != nil {
		return fail("default stream connection: %v", err)
	}
	dev, report, err := attachToServer(server, d)
	if err != nil {
		return fail("%v", err)
	}
	rt := newDeviceRuntime(d, workers)
	rt.report = report
	go func() {
		err := dev.ServeServer(server)
		if rt.report != nil {
			rt.report.flush() // what the session's end waits for
		}
		// The fault server is gone and no guard kept the connection:
		// the device's memory is gone, and so is the process.
		fmt.Fprintf(os.Stderr, "softuvm device %d process %d: the fault server went away (%v); exiting\n", d, os.Getpid(), err)
		os.Exit(1)
	}()
	if err := control.Write(wire.NewMessage(wire.Header{Typ: wire.MsgDeviceUp}).B); err != nil {
		return 0 // the client is gone
	}
	go rt.serveStream(0, defaultStream)
	rt.serveControl(control)
	if rt.report != nil {
		rt.report.flush() // the client is gone, and the process ends with it
	}
	return 0
}

func FileConn(fd uintptr) (*net.UnixConn, error) {
	f := os.NewFile(fd, "softuvm-socket")
	c, err := net.FileConn(f)
	f.Close()
	if err != nil {
		return nil, err
	}
	uc, ok := c.(*net.UnixConn)
	if !ok {
		c.Close()
		return nil, fmt.Errorf("fd %d is not a unix socket", fd)
	}
	return uc, nil
}

// deviceMapping is the device process's side of its view.
type DeviceMapping struct {
	Index int
	// files[d.Slot()] is processor d's file of the session: the device
	// maps its own over every range, and others' over parts (remote
	// mappings).
	files []*devmem.File
	// uffd is the device's userfaultfd, which the server serves; the
	// process keeps a copy only to register each new mapping itself
	// before it becomes visible (see mapFile).
	uffd *uffd.FD
	// minorRemote registers mappings of other locations' files for MINOR
	// faults: the access counters count in user space, and a hint fault
	// (see dropMappings) must reach the server.
	minorRemote bool
	// minorOwn registers mappings of the device's own file for MINOR
	// faults too: its arena takes large folios, and the server maps a
	// block written there whole with one UFFDIO_CONTINUE, where the
	// kernel would take a minor fault a page.
	minorOwn bool
}

// attachToServer hands the server this process's userfaultfd, maps every
// managed range of the client from the device's file, and says so. When
// the client's session is traced, the server's first message is a
// device-trace notice, with the socket to report launches on: the
// reporter is returned, nil otherwise.
func attachToServer(c *net.UnixConn, d int) (*DeviceMapping, *reporter, error) {
	u, err := uffd.Open(uffd.CloseOnExec)
	if err != nil {
		return nil, nil, err
	}
	h := wire.Header{Typ: wire.MsgDeviceHello, Seq: 1}
	if err := wire.WriteMessage(c, wire.EncodeDeviceHello(h.Seq, wire.DeviceHelloRequest{Device: uint32(d), Pid: uint32(os.Getpid())}), []int{u.Fd()}); err != nil {
		return nil, nil, err
	}
	buf := make([]byte, wire.MaxMessageSize)
	b, fds, err := wire.ReadMessage(c, buf)
	if err != nil {
		return nil, nil, err
	}
	var report *reporter
	if th, _, _ := wire.ParseHeader(b); th.Typ == wire.MsgDeviceTrace {
		_, req, err := wire.ParseRequest(b)
		n, ok := req.(wire.DeviceTraceNotice)
		if err != nil || !ok || len(fds) != 1 {
			wire.CloseFDs(fds)
			return nil, nil, fmt.Errorf("device-trace notice: %v (with %d descriptors, want the report socket)", err, len(fds))
		}
		if n.Flags&wire.TraceLaunches != 0 {
			report = newReporter(fds[0])
		} else {
			wire.CloseFDs(fds)
		}
		if b, fds, err = wire.ReadMessage(c, buf); err != nil {
			return nil, nil, err
		}
	}
	dev, err := mapLayout(c, d, u, buf, b, fds)
	if err != nil && report != nil {
		syscall.Close(report.fd)
		report = nil
	}
	return dev, report, err
}

// mapLayout reads the device hello's reply b (with its descriptors), maps
// and registers the layout it gives, and says the device is ready.
func mapLayout(c *net.UnixConn, d int, u *uffd.FD, buf, b []byte, fds []int) (*DeviceMapping, error) {
	h := wire.Header{Typ: wire.MsgDeviceHello, Seq: 1}
	r, err := wire.ParseReply(b, h)
	if err != nil || len(fds) < d+2 {
		wire.CloseFDs(fds)
		return nil, fmt.Errorf("device hello: %v (with %d descriptors, want one per location)", err, len(fds))
	}
	lay, err := wire.DecodeLayoutReply(r)
	for err == nil && lay.More > 0 {
		// The rest of a long layout follows in pieces.
		var more []int
		if b, more, err = wire.ReadMessage(c, buf); err != nil {
			break
		}
		wire.CloseFDs(more)
		var req any
		if _, req, err = wire.ParseRequest(b); err != nil {
			break
		}
		lr, ok := req.(wire.DeviceLayoutRequest)
		if !ok || len(lr.Runs) == 0 || uint32(len(lr.Runs)) > lay.More {
			err = fmt.Errorf("device hello: the server sent %T where %d runs of the layout were still due", req, lay.More)
			break
		}
		lay.Runs = append(lay.Runs, lr.Runs...)
		lay.More -= uint32(len(lr.Runs))
	}
	if err != nil {
		wire.CloseFDs(fds)
		return nil, err
	}
	// The server did the handshake on the shared file; this copy needs
	// only to know, to register.
	u.SetHandshaken(core.RequiredFeatures, 0)
	dev := &DeviceMapping{Index: d, uffd: u, minorRemote: lay.MinorRemote, minorOwn: lay.MinorOwn}
	for l, fd := range fds {
		f, err := devmem.FileFromFD(fd, fmt.Sprintf("location %d file", l))
		if err != nil {
			wire.CloseFDs(fds[l+1:])
			return nil, err
		}
		dev.files = append(dev.files, f)
	}
	// No kernel runs yet, so nothing touches a run between its mapping
	// and its registration.
	for _, m := range lay.Runs {
		if err := dev.mapFixed(uintptr(m.Addr), int64(m.Length), m.File); err != nil {
			return nil, err
		}
	}
	h = wire.Header{Typ: wire.MsgDeviceReady, Seq: 2}
	if err := wire.WriteMessage(c, wire.NewMessage(h).B, nil); err != nil {
		return nil, err
	}
	if b, _, err = wire.ReadMessage(c, buf); err != nil {
		return nil, err
	}
	if _, err := wire.ParseReply(b, h); err != nil {
		return nil, fmt.Errorf("device ready: %w", err)
	}
	return dev, nil
}

func checkInWindow(addr uintptr, length int64) error {
	if addr < config.ManagedWindowStart || uint64(addr)+uint64(length) > config.ManagedWindowStart+config.ManagedWindowSize {
		return fmt.Errorf("%w: range %#x+%d lies outside the managed window %#x+%#x", core.ErrInvalidValue, addr, length, config.ManagedWindowStart, config.ManagedWindowSize)
	}
	return nil
}

// deviceRuntime runs launched kernels. Each stream is a connection of its
// own, served by a goroutine that reads its launches in order and runs
// them, so that a launch and a synchronize cross no goroutine: the thread
// the kernel wakes when a message arrives runs the kernel and answers.
// A kernel's threads beyond the first are spread over the worker threads.
type deviceRuntime struct {
	index   int
	workers []chan *kernelChunk
	// report is where a traced session's launches and synchronizations
	// go (report.go); nil when the session is not traced. Set before any
	// stream is served.
	report *reporter
	// cpus are the CPUs the process may run on, where a stream's thread
	// goes when its client polls (follow).
	cpus []int
}

// kernelChunk is the threads [first, outer) of one launch, run by one
// worker.
type kernelChunk struct {
	grid         *gridRun // a grid's blocks to run (grid.go); then k to params are unused
	k            Kernel
	name         string
	first, outer int
	nthreads     int
	params       []byte
	err          error
	wg           *sync.WaitGroup
}

func newDeviceRuntime(index, workers int) *deviceRuntime {
	rt := &deviceRuntime{index: index, cpus: widenCPUs()}
	for w := 0; w < workers; w++ {
		ch := make(chan *kernelChunk, 1)
		rt.workers = append(rt.workers, ch)
		go rt.worker(rt.cpus[w%len(rt.cpus)], ch)
	}
	return rt
}

// widenCPUs undoes the CPU mask the process inherited from the client
// thread that started it, which may be pinned to one CPU (uvm bench
// pins its timing thread), and by which the runtime sized itself: the
// device runs on every CPU the process may use. It returns them. It
// runs before any thread of the device is pinned.
func widenCPUs() []int {
	allowed, err := devmem.AllowedCPUs()
	if err != nil || len(allowed) == 0 {
		allowed = []int{0}
	}
	online, err := devmem.OnlineCPUs()
	if err != nil || len(online) <= len(allowed) || devmem.PinCurrentThreadToCPUs(online) != nil {
		return allowed
	}
	// What the kernel granted: a cpuset may allow fewer.
	if granted, err := devmem.AllowedCPUs(); err == nil && len(granted) > 0 {
		allowed = granted
	}
	if len(allowed) > runtime.GOMAXPROCS(0) {
		runtime.GOMAXPROCS(len(allowed))
	}
	return allowed
}

// runChunk runs one chunk's threads, turning a panic into an error that
// names the kernel, the device and the thread.
func runChunk(c *kernelChunk, device int) (err error) {
	tid := c.first
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("%w: kernel %q panicked on device %d in thread %d of %d: %v", core.ErrLaunchFailure, c.name, device, tid, c.nthreads, r)
		}
	}()
	for ; tid < c.outer; tid++ {
		c.k(tid, c.nthreads, c.params)
	}
	return nil
}

// modeFor is how a mapping of processor file's file is registered.
func (dev *DeviceMapping) modeFor(file core.Device) uffd.RegisterMode {
	own := file == core.Device(dev.Index)
	if own && dev.minorOwn || !own && dev.minorRemote {
		return core.HostViewMode | uffd.RegisterMinor
	}
	return core.HostViewMode
}

// dropMappings drops the page-table entries of runs, which the server
// chose among the remote mappings (hint faults): the pages stay in their
// files, so the next access is a minor fault, resolved by the kernel and
// seen by the eBPF counters, or sent to the server in MINOR mode.
func (dev *DeviceMapping) dropMappings(runs []wire.Mapping) error {
	for _, m := range runs {
		if err := checkInWindow(uintptr(m.Addr), int64(m.Length)); err != nil {
			return err
		}
		if err := devmem.DropPages(uintptr(m.Addr), int64(m.Length)); err != nil {
			return err
		}
	}
	return nil
}

// mapFixed maps processor file's file over [addr, addr+length) and
// registers it, while no kernel runs.
func (dev *DeviceMapping) mapFixed(addr uintptr, length int64, file core.Device) error {
	if err := dev.checkMap(addr, length, file); err != nil {
		return err
	}
	if err := dev.files[file.Slot()].MapFixed(addr, int64(addr), length); err != nil {
		return err
	}
	if _, err := dev.uffd.Register(addr, uintptr(length), dev.modeFor(file)); err != nil {
		return err
	}
	return devmem.DontFork(addr, length)
}

func (dev *DeviceMapping) checkMap(addr uintptr, length int64, file core.Device) error {
	if err := checkInWindow(addr, length); err != nil {
		return err
	}
	if file < core.CPU || file.Slot() >= len(dev.files) {
		// files holds the CPU's and one per device, once attached.
		return fmt.Errorf("%w: map %v: this session has %d devices", core.ErrInvalidValue, file, max(len(dev.files)-1, 0))
	}
	return nil
}

// mapFile maps processor file's file over [addr, addr+length) while kernels
// may run: the new mapping is made elsewhere, registered with the
// userfaultfd and write-protected where wp says, and only then moved over
// the old one, so that no thread ever sees it unregistered (holes would
// fill with zeros) or writable where it must not be (a read-duplicated
// page). The move keeps write protection because the server asked for
// remap events.
func (dev *DeviceMapping) mapFile(addr uintptr, length int64, file core.Device, wp core.PageMask) error {
	if err := dev.checkMap(addr, length, file); err != nil {
		return err
	}
	err := dev.files[file.Slot()].MapOver(addr, int64(addr), length, func(scratch uintptr) error {
		if _, err := dev.uffd.Register(scratch, uintptr(length), dev.modeFor(file)); err != nil {
			return err
		}
		for p, q := wp.NextRun(0); p >= 0; p, q = wp.NextRun(q) {
			if err := dev.uffd.WriteProtect(scratch+uintptr(p)*core.PageSize, uintptr(q-p)*core.PageSize, true, true); err != nil {
				return err
			}
		}
		return nil
	})
	if errors.Is(err, syscall.ENOMEM) {
		// Out of mappings (vm.max_map_count) is no fault of the
		// process: the server maps its own file instead.
		return fmt.Errorf("%w: map %v's file over %#x+%d: %v", core.ErrMemoryAllocation, file, addr, length, err)
	}
	if err != nil {
		return err
	}
	return devmem.DontFork(addr, length)
}

// serveServer answers the server's requests to map and unmap ranges until
// the connection ends, and returns why it did.
func (dev *DeviceMapping) ServeServer(c *net.UnixConn) error {
	buf := make([]byte, wire.MaxMessageSize)
	for {
		b, fds, err := wire.ReadMessage(c, buf)
		wire.CloseFDs(fds)
		if err != nil {
			return err
		}
		h, req, err := wire.ParseRequest(b)
		if err == nil {
			switch r := req.(type) {
			case wire.DeviceMapRequest:
				err = dev.mapFile(uintptr(r.Addr), int64(r.Length), r.File, r.Wp)
			case wire.HintsRequest:
				err = dev.dropMappings(r.Runs)
			case wire.DeviceTraceNotice:
				// Read at attach only (attachToServer); a later one,
				// which no server sends, asks for no reply.
				continue
			case wire.RangeRequest:
				if h.Typ != wire.MsgDeviceUnmap {
					err = fmt.Errorf("%w: %s is not a request the server sends a device", core.ErrInvalidValue, h.Typ)
					break
				}
				err = devmem.ReturnToReservation(uintptr(r.Addr), int64(r.Length))
			default:
				err = fmt.Errorf("%w: %s is not a request the server sends a device", core.ErrInvalidValue, h.Typ)
			}
		}
		reply := wire.EncodeEmptyReply(h)
		if err != nil {
			reply = wire.EncodeError(h, err)
		}
		wire.WriteMessage(c, reply, nil)
	}
}

// worker runs kernel chunks on a thread pinned to one CPU: a device's
// threads stay put, as a GPU's do, and the fault server serves their
// faults on the CPU they take them.
func (rt *deviceRuntime) worker(cpu int, ch <-chan *kernelChunk) {
	runtime.LockOSThread()
	devmem.PinCurrentThread(cpu) // best effort: an unpinned worker still works
	// A kernel touching freed or lost memory gets a recoverable fault,
	// reported at synchronize, instead of killing the device.
	debug.SetPanicOnFault(true)
	for c := range ch {
		if c.grid != nil {
			c.grid.work()
		} else {
			c.err = runChunk(c, rt.index)
		}
		c.wg.Done()
	}
}

// serveControl accepts the client's new streams until the client goes
// away; then the process ends: it exists for its client.
func (rt *deviceRuntime) serveControl(control *wire.DirectConn) {
	buf := make([]byte, wire.MaxMessageSize)
	for {
		b, fds, err := control.ReadFDs(buf, 0)
		if err != nil {
			return
		}
		h, req, err := wire.ParseRequest(b)
		sr, ok := req.(wire.StreamRequest)
		if err != nil || !ok || h.Typ != wire.MsgStreamOpen || len(fds) != 1 {
			wire.CloseFDs(fds)
			if err == nil {
				err = fmt.Errorf("%w: %s with %d descriptors is not a request a client sends a device's control connection", core.ErrInvalidValue, h.Typ, len(fds))
			}
			fmt.Fprintf(os.Stderr, "softuvm device %d process %d: %v\n", rt.index, os.Getpid(), err)
			continue
		}
		go rt.serveStream(sr.Stream, &wire.DirectConn{Fd: fds[0]})
	}
}

// serveStream runs one stream: its launches in order, and answers its
// synchronizations with the errors of the kernels since the last one.
func (rt *deviceRuntime) serveStream(id uint32, conn *wire.DirectConn) {
	defer conn.Close()
	rp := rt.report
	if rp != nil {
		defer rp.flush() // the stream's kernels since its last synchronize
	}
	// The stream's thread follows the thread that launches on it: the
	// synchronize that follows waits there, and a wake-up on the same CPU
	// is several times cheaper than one across CPUs. A client that polls
	// for its answers (DeviceScheduleSpin) holds its CPU: the thread then
	// runs on the others and polls too (see LaunchCPUHint).
	runtime.LockOSThread()
	pinned, asked, polling := -1, false, false
	// A single-threaded kernel runs on this goroutine.
	debug.SetPanicOnFault(true)
	buf := make([]byte, wire.MaxMessageSize)
	var errs []error
	// launched runs a launch of either kind: on a thread that follows the
	// launching CPU, its error kept for the next synchronize, reported
	// when the session is traced.
	launched := func(cpuHint int32, name string, threads uint32, registered bool, run func() error) {
		if cpu, poll := cpuOfHint(cpuHint); cpu >= 0 && (cpu != pinned || poll != asked) {
			if p, err := rt.follow(cpu, poll); err == nil {
				pinned, asked, polling = cpu, poll, p
			}
		}
		var start int64
		if rp != nil {
			start = rp.now()
		}
		if err := run(); err != nil {
			errs = append(errs, err)
		}
		if rp != nil && registered {
			rp.launch(id, name, threads, start, rp.now())
		}
	}
	for {
		b, err := nextMessage(conn, buf, polling)
		if err != nil {
			return
		}
		var took int64 // when a traced stream took the message up
		if rp != nil {
			took = rp.now()
		}
		h, req, err := wire.ParseRequest(b)
		switch r := req.(type) {
		case wire.LaunchRequest:
			_, registered := LookupKernel(r.Name) // not the event kernel, nor a kernel the registry lacks
			launched(r.Cpu, r.Name, r.Nthreads, registered, func() error { return rt.launch(&r) })
			continue
		case wire.LaunchGridRequest:
			_, registered := LookupGridKernel(r.Name)
			launched(r.Cpu, r.Name, uint32(min(r.Grid.Count()*r.Block.Count(), wire.MaxLaunchThreads)), registered, func() error { return rt.launchGrid(&r) })
			continue
		case wire.StreamRequest:
			if h.Typ == wire.MsgStreamDestroy {
				return
			}
			if err == nil && h.Typ != wire.MsgSync {
				err = fmt.Errorf("%w: %s is not a request a client sends a stream", core.ErrInvalidValue, h.Typ)
			}
		default:
			if err == nil {
				err = fmt.Errorf("%w: %s is not a request a client sends a stream", core.ErrInvalidValue, h.Typ)
			}
		}
		if err == nil && len(errs) > 0 {
			err = core.JoinErrors(errs)
			errs = nil
		}
		reply := wire.EncodeEmptyReply(h)
		if err != nil {
			reply = wire.EncodeError(h, err)
		}
		if rp != nil && h.Typ == wire.MsgSync {
			rp.sync(id, took, rp.now())
		}
		if send(conn, reply) != nil {
			return
		}
	}
}

// launch runs one kernel to completion. One thread, or a device with one
// worker, runs on the stream's goroutine: there is no one to share with,
// and a hand-off would cost a wake-up.
func (rt *deviceRuntime) launch(lr *wire.LaunchRequest) error {
	if lr.Name == EventTimeKernel {
		return stampTime(lr.Params, rt.index)
	}
	k, ok := LookupKernel(lr.Name)
	if !ok {
		return fmt.Errorf("%w: kernel %q is not registered in device %d's process (register it in an init function)", core.ErrLaunchFailure, lr.Name, rt.index)
	}
	n := int(lr.Nthreads)
	parts := min(n, len(rt.workers))
	var wg sync.WaitGroup
	if parts <= 1 {
		c := &kernelChunk{k: k, name: lr.Name, first: 0, outer: n, nthreads: n, params: lr.Params, wg: &wg}
		return runChunk(c, rt.index)
	}
	chunks := make([]kernelChunk, parts)
	for i := range chunks {
		chunks[i] = kernelChunk{k: k, name: lr.Name, first: i * n / parts, outer: (i + 1) * n / parts, nthreads: n, params: lr.Params, wg: &wg}
		wg.Add(1)
		rt.workers[i] <- &chunks[i]
	}
	wg.Wait()
	var errs []error
	for i := range chunks {
		if chunks[i].err != nil {
			errs = append(errs, chunks[i].err)
		}
	}
	return core.JoinErrors(errs)
}
