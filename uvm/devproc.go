package uvm

import (
	"fmt"
	"net"
	"os"
	"runtime"
	"runtime/debug"
	"strconv"
	"sync"

	"github.com/softuvm/softuvm/devmem"
	"github.com/softuvm/softuvm/uffd"
)

// A device process is a device's own address space: a re-execution of the
// client's binary that maps every managed range of the client at the same
// address, backed by the device's file, and runs kernels on its worker
// threads. A page resident elsewhere is a hole in the device's file, so a
// kernel touching it faults here, and the server migrates it into the
// device's file. The process holds no state of its own worth keeping: if
// it dies, the device's data is still in the server's file.

// The managed window is where clients place managed ranges: device
// processes reserve all of it at start, before anything else is mapped,
// so that every address a client uses is free in them too. A fresh process
// maps downwards from just under 128 TiB and never gets near it.
const (
	managedWindowStart = 0x6000_0000_0000
	managedWindowSize  = 0x1000_0000_0000 // 16 TiB
)

const (
	deviceEnv        = "SOFTUVM_DEVICE"
	deviceWorkersEnv = "SOFTUVM_DEVICE_WORKERS"
)

func runDevice() int {
	fail := func(format string, args ...any) int {
		fmt.Fprintf(os.Stderr, "softuvm device process %d: %s\n", os.Getpid(), fmt.Sprintf(format, args...))
		return 1
	}
	if err := devmem.ReserveAddressSpaceAt(managedWindowStart, managedWindowSize); err != nil {
		return fail("reserve the managed window: %v", err)
	}
	d, err := strconv.Atoi(os.Getenv(deviceEnv))
	workers, werr := strconv.Atoi(os.Getenv(deviceWorkersEnv))
	if err != nil || werr != nil || d < 0 || workers < 1 {
		return fail("%s=%q %s=%q: want a device index and a worker count", deviceEnv, os.Getenv(deviceEnv), deviceWorkersEnv, os.Getenv(deviceWorkersEnv))
	}
	server, err := fileConn(3)
	if err != nil {
		return fail("server connection: %v", err)
	}
	client, err := fileConn(4)
	if err != nil {
		return fail("client connection: %v", err)
	}
	dev, err := attachToServer(server, d)
	if err != nil {
		return fail("%v", err)
	}
	rt := newDeviceRuntime(d, workers, client)
	go dev.serveServer(server)
	if err := writeMessage(client, newMessage(header{typ: msgDeviceUp}).b, nil); err != nil {
		return 0 // the client is gone
	}
	rt.serveClient()
	return 0
}

func fileConn(fd uintptr) (*net.UnixConn, error) {
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
type deviceMapping struct {
	index int
	// files[l] is location l's file of the session: the device maps its
	// own over every range, and others' over parts (remote mappings).
	files []*devmem.File
	// uffd is the device's userfaultfd, which the server serves; the
	// process keeps a copy only to register each new mapping itself
	// before it becomes visible (see mapFile).
	uffd *uffd.FD
}

// attachToServer hands the server this process's userfaultfd, maps every
// managed range of the client from the device's file, and says so.
func attachToServer(c *net.UnixConn, d int) (*deviceMapping, error) {
	u, err := uffd.Open(uffd.CloseOnExec)
	if err != nil {
		return nil, err
	}
	h := header{typ: msgDeviceHello, seq: 1}
	if err := writeMessage(c, encodeDeviceHello(h.seq, deviceHelloRequest{device: uint32(d), pid: uint32(os.Getpid())}), []int{u.Fd()}); err != nil {
		return nil, err
	}
	buf := make([]byte, maxMessageSize)
	b, fds, err := readMessage(c, buf)
	if err != nil {
		return nil, err
	}
	r, err := parseReply(b, h)
	if err != nil || len(fds) < d+2 {
		closeFDs(fds)
		return nil, fmt.Errorf("device hello: %v (with %d descriptors, want one per location)", err, len(fds))
	}
	layout, err := decodeLayoutReply(r)
	if err != nil {
		closeFDs(fds)
		return nil, err
	}
	// The server did the handshake on the shared file; this copy needs
	// only to know, to register.
	u.SetHandshaken(RequiredFeatures, 0)
	dev := &deviceMapping{index: d, uffd: u}
	for l, fd := range fds {
		f, err := devmem.FileFromFD(fd, fmt.Sprintf("location %d file", l))
		if err != nil {
			closeFDs(fds[l+1:])
			return nil, err
		}
		dev.files = append(dev.files, f)
	}
	// No kernel runs yet, so nothing touches a run between its mapping
	// and its registration.
	for _, m := range layout {
		if err := dev.mapFixed(uintptr(m.addr), int64(m.length), int(m.loc)); err != nil {
			return nil, err
		}
	}
	h = header{typ: msgDeviceReady, seq: 2}
	if err := writeMessage(c, newMessage(h).b, nil); err != nil {
		return nil, err
	}
	if b, _, err = readMessage(c, buf); err != nil {
		return nil, err
	}
	if _, err := parseReply(b, h); err != nil {
		return nil, fmt.Errorf("device ready: %w", err)
	}
	return dev, nil
}

func checkInWindow(addr uintptr, length int64) error {
	if addr < managedWindowStart || uint64(addr)+uint64(length) > managedWindowStart+managedWindowSize {
		return fmt.Errorf("%w: range %#x+%d lies outside the managed window %#x+%#x", ErrInvalidValue, addr, length, managedWindowStart, managedWindowSize)
	}
	return nil
}

// mapFixed maps location loc's file over [addr, addr+length) and
// registers it, while no kernel runs.
func (dev *deviceMapping) mapFixed(addr uintptr, length int64, loc int) error {
	if err := dev.checkMap(addr, length, loc); err != nil {
		return err
	}
	if err := dev.files[loc].MapFixed(addr, int64(addr), length); err != nil {
		return err
	}
	if _, err := dev.uffd.Register(addr, uintptr(length), hostViewMode); err != nil {
		return err
	}
	return devmem.DontFork(addr, length)
}

func (dev *deviceMapping) checkMap(addr uintptr, length int64, loc int) error {
	if err := checkInWindow(addr, length); err != nil {
		return err
	}
	if loc >= len(dev.files) {
		return fmt.Errorf("%w: map location %d: this session has %d", ErrInvalidValue, loc, len(dev.files))
	}
	return nil
}

// mapFile maps location loc's file over [addr, addr+length) while kernels
// may run: the new mapping is made elsewhere, registered with the
// userfaultfd and write-protected where wp says, and only then moved over
// the old one, so that no thread ever sees it unregistered (holes would
// fill with zeros) or writable where it must not be (a read-duplicated
// page). The move keeps write protection because the server asked for
// remap events.
func (dev *deviceMapping) mapFile(addr uintptr, length int64, loc int, wp PageMask) error {
	if err := dev.checkMap(addr, length, loc); err != nil {
		return err
	}
	err := dev.files[loc].MapOver(addr, int64(addr), length, func(scratch uintptr) error {
		if _, err := dev.uffd.Register(scratch, uintptr(length), hostViewMode); err != nil {
			return err
		}
		for p, q := wp.NextRun(0); p >= 0; p, q = wp.NextRun(q) {
			if err := dev.uffd.WriteProtect(scratch+uintptr(p)*PageSize, uintptr(q-p)*PageSize, true, true); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	return devmem.DontFork(addr, length)
}

// serveServer answers the server's requests to map and unmap ranges. When
// the server goes away the device's memory is gone, and so is the process.
func (dev *deviceMapping) serveServer(c *net.UnixConn) {
	buf := make([]byte, maxMessageSize)
	for {
		b, fds, err := readMessage(c, buf)
		closeFDs(fds)
		if err != nil {
			fmt.Fprintf(os.Stderr, "softuvm device %d process %d: the fault server went away (%v); exiting\n", dev.index, os.Getpid(), err)
			os.Exit(1)
		}
		h, req, err := parseRequest(b)
		if err == nil {
			switch r := req.(type) {
			case deviceMapRequest:
				err = dev.mapFile(uintptr(r.addr), int64(r.length), int(r.loc), r.wp)
			case rangeRequest:
				if h.typ != msgDeviceUnmap {
					err = fmt.Errorf("%w: %s is not a request the server sends a device", ErrInvalidValue, h.typ)
					break
				}
				err = devmem.ReturnToReservation(uintptr(r.addr), int64(r.length))
			default:
				err = fmt.Errorf("%w: %s is not a request the server sends a device", ErrInvalidValue, h.typ)
			}
		}
		reply := encodeEmptyReply(h)
		if err != nil {
			reply = encodeError(h, err)
		}
		writeMessage(c, reply, nil)
	}
}

// deviceRuntime runs launched kernels: each stream is an ordered queue
// with a goroutine that drains it, and a kernel's threads are spread over
// the worker threads.
type deviceRuntime struct {
	index   int
	client  *net.UnixConn
	writeMu sync.Mutex // replies to the client come from several streams
	workers []chan *kernelChunk

	streamsMu sync.Mutex
	streams   map[uint32]*deviceStream
}

// kernelChunk is the threads [first, outer) of one launch, run by one
// worker.
type kernelChunk struct {
	k            Kernel
	name         string
	first, outer int
	nthreads     int
	params       []byte
	err          error
	wg           *sync.WaitGroup
}

// streamItem is a launch or a synchronization point in a stream.
type streamItem struct {
	launch *launchRequest
	synced chan<- error // a sync: receives the stream's errors since the last one
}

type deviceStream struct {
	rt    *deviceRuntime
	id    uint32
	items chan streamItem
	errs  []error // since the last sync, owned by the stream's goroutine
}

func newDeviceRuntime(index, workers int, client *net.UnixConn) *deviceRuntime {
	rt := &deviceRuntime{index: index, client: client, streams: map[uint32]*deviceStream{}}
	ncpu := runtime.NumCPU()
	for w := 0; w < workers; w++ {
		ch := make(chan *kernelChunk, 1)
		rt.workers = append(rt.workers, ch)
		go rt.worker(w%ncpu, ch)
	}
	return rt
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
		c.err = runChunk(c, rt.index)
		c.wg.Done()
	}
}

// runChunk runs one chunk's threads, turning a panic into an error that
// names the kernel, the device and the thread.
func runChunk(c *kernelChunk, device int) (err error) {
	tid := c.first
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("%w: kernel %q panicked on device %d in thread %d of %d: %v", ErrLaunchFailure, c.name, device, tid, c.nthreads, r)
		}
	}()
	for ; tid < c.outer; tid++ {
		c.k(tid, c.nthreads, c.params)
	}
	return nil
}

func (rt *deviceRuntime) stream(id uint32) *deviceStream {
	rt.streamsMu.Lock()
	defer rt.streamsMu.Unlock()
	s := rt.streams[id]
	if s == nil {
		s = &deviceStream{rt: rt, id: id, items: make(chan streamItem, 4096)}
		rt.streams[id] = s
		go s.run()
	}
	return s
}

func (s *deviceStream) run() {
	for it := range s.items {
		if it.launch != nil {
			if err := s.rt.launch(it.launch); err != nil {
				s.errs = append(s.errs, err)
			}
			continue
		}
		var err error
		if len(s.errs) > 0 {
			err = joinErrors(s.errs)
			s.errs = nil
		}
		it.synced <- err
	}
}

// launch runs one kernel to completion on the workers. One thread, or a
// device with one worker, runs on the stream's goroutine: there is no
// one to share with, and a hand-off would cost a wake-up.
func (rt *deviceRuntime) launch(lr *launchRequest) error {
	k, ok := lookupKernel(lr.name)
	if !ok {
		return fmt.Errorf("%w: kernel %q is not registered in device %d's process (register it in an init function)", ErrLaunchFailure, lr.name, rt.index)
	}
	n := int(lr.nthreads)
	parts := min(n, len(rt.workers))
	var wg sync.WaitGroup
	if parts <= 1 {
		c := &kernelChunk{k: k, name: lr.name, first: 0, outer: n, nthreads: n, params: lr.params, wg: &wg}
		debug.SetPanicOnFault(true)
		return runChunk(c, rt.index)
	}
	chunks := make([]kernelChunk, parts)
	for i := range chunks {
		chunks[i] = kernelChunk{k: k, name: lr.name, first: i * n / parts, outer: (i + 1) * n / parts, nthreads: n, params: lr.params, wg: &wg}
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
	return joinErrors(errs)
}

// serveClient reads launches and synchronizations until the client goes
// away, and then the process exits: it exists for its client.
func (rt *deviceRuntime) serveClient() {
	buf := make([]byte, maxMessageSize)
	for {
		b, fds, err := readMessage(rt.client, buf)
		closeFDs(fds)
		if err != nil {
			return
		}
		h, req, err := parseRequest(b)
		if err != nil {
			rt.reply(encodeError(h, err))
			continue
		}
		switch r := req.(type) {
		case launchRequest:
			rt.stream(r.stream).items <- streamItem{launch: &r}
		case streamRequest:
			if h.typ == msgStreamDestroy {
				rt.destroy(r.stream)
				continue
			}
			go rt.sync(h, r.stream)
		default:
			rt.reply(encodeError(h, fmt.Errorf("%w: %s is not a request a client sends a device", ErrInvalidValue, h.typ)))
		}
	}
}

// sync replies once every item queued on the stream (or on every stream)
// before the request has run, with their errors.
func (rt *deviceRuntime) sync(h header, stream uint32) {
	var targets []*deviceStream
	if stream == allStreams {
		rt.streamsMu.Lock()
		for _, s := range rt.streams {
			targets = append(targets, s)
		}
		rt.streamsMu.Unlock()
	} else {
		targets = []*deviceStream{rt.stream(stream)}
	}
	results := make(chan error, len(targets))
	for _, s := range targets {
		s.items <- streamItem{synced: results}
	}
	var errs []error
	for range targets {
		if err := <-results; err != nil {
			errs = append(errs, err)
		}
	}
	reply := encodeEmptyReply(h)
	if err := joinErrors(errs); err != nil {
		reply = encodeError(h, err)
	}
	rt.reply(reply)
}

func (rt *deviceRuntime) destroy(stream uint32) {
	rt.streamsMu.Lock()
	defer rt.streamsMu.Unlock()
	if s := rt.streams[stream]; s != nil {
		close(s.items) // its goroutine drains what is queued and ends
		delete(rt.streams, stream)
	}
}

func (rt *deviceRuntime) reply(b []byte) {
	rt.writeMu.Lock()
	defer rt.writeMu.Unlock()
	writeMessage(rt.client, b, nil)
}
