package soak

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"github.com/softuvm/softuvm/devmem"
	"github.com/softuvm/softuvm/uvm"
)

// The Go client of `uvm bench soak`: `uvm __soak-client FLAGS`, a
// re-execution of the uvm binary (its device processes are too, so the
// kernels below are registered in every one of them). It allocates,
// frees, writes, reads, advises, prefetches and runs kernels on every
// device at random against the daemon at --socket, and checks every byte
// it reads against a shadow copy it keeps in ordinary memory. The C
// client (csrc/soak_client.c) does the same through uvm.h and speaks the
// same lines on its standard output:
//
//	progress OPS CHECKED   at most every 250 ms, after an operation ended
//	lost DEVICE MESSAGE    a launch whose device process died (a kill)
//	wrong JSON             a wrong byte (soakWrong), then exit 1
//	error MESSAGE          a call failed unexpectedly, then exit 1
//	done JSON              after its standard input closed and every
//	                       allocation was checked whole (soakClientDone)
const ClientArg = "__soak-client"

// The soak's kernels. Parameters are little-endian uint64s.
const (
	// soakWriteKernel: address, length, seed; byte i = soakByte(seed, i).
	soakWriteKernel = "uvm-soak-write"
	// soakAddKernel: address, length; adds one to every byte.
	soakAddKernel = "uvm-soak-add"
	// soakHashKernel: address, length, out; thread 0 stores the FNV-1a
	// hash of the range at out.
	soakHashKernel = "uvm-soak-hash"
)

func init() {
	uvm.MustRegisterKernel(soakWriteKernel, func(tid, n int, p []byte) {
		addr, length, seed := soakParams(p)
		b := devmem.BytesAt(uintptr(addr), int64(length))
		for i := int(length) * tid / n; i < int(length)*(tid+1)/n; i++ {
			b[i] = soakByte(seed, i)
		}
	})
	uvm.MustRegisterKernel(soakAddKernel, func(tid, n int, p []byte) {
		addr, length, _ := soakParams(p)
		b := devmem.BytesAt(uintptr(addr), int64(length))
		for i := int(length) * tid / n; i < int(length)*(tid+1)/n; i++ {
			b[i]++
		}
	})
	uvm.MustRegisterKernel(soakHashKernel, func(tid, n int, p []byte) {
		if tid != 0 {
			return
		}
		addr, length, out := soakParams(p)
		binary.NativeEndian.PutUint64(devmem.BytesAt(uintptr(out), 8), fnv1a(devmem.BytesAt(uintptr(addr), int64(length))))
	})
}

func soakParams(p []byte) (a, b, c uint64) {
	return binary.LittleEndian.Uint64(p), binary.LittleEndian.Uint64(p[8:]), binary.LittleEndian.Uint64(p[16:])
}

func soakParamBytes(a, b, c uint64) []byte {
	p := make([]byte, 24)
	binary.LittleEndian.PutUint64(p, a)
	binary.LittleEndian.PutUint64(p[8:], b)
	binary.LittleEndian.PutUint64(p[16:], c)
	return p
}

// soakByte is what the write kernel puts at byte i: computed by the
// client on its own, never read back from softuvm. soak_client.c has the
// same function.
func soakByte(seed uint64, i int) byte {
	return byte((seed*0x9E3779B97F4A7C15 + uint64(i)*0xBF58476D1CE4E5B9) >> 56)
}

func fnv1a(b []byte) uint64 {
	h := uint64(14695981039346656037)
	for _, c := range b {
		h = (h ^ uint64(c)) * 1099511628211
	}
	return h
}

// soakCorruptEnv makes a client damage its own memory on purpose, to
// show that the soak catches and explains a wrong byte: "NAME@OP" makes
// client NAME, at operation OP, change one byte of its first allocation
// behind its shadow's back and then read it back (a test of the soak
// itself, integration/soak_test.go).
const soakCorruptEnv = "SOFTUVM_TEST_SOAK_CORRUPT"

// soakCorruptOp is the operation at which client name corrupts a byte, -1
// if never.
func soakCorruptOp(name string) int {
	who, at, ok := strings.Cut(os.Getenv(soakCorruptEnv), "@")
	if !ok || who != name {
		return -1
	}
	op, err := strconv.Atoi(at)
	if err != nil {
		return -1
	}
	return op
}

// soakWrong is a wrong byte, or a hash a kernel computed that the shadow
// does not give, as a client reports it: where, what was read and what
// was wanted, and the operations on the allocation that touched the
// byte's 2 MiB block (those that touched the byte itself marked " *").
type soakWrong struct {
	Client     string `json:"client,omitempty"` // filled in by the soak
	Op         int64  `json:"op"`
	During     string `json:"during"` // the operation that found it
	Allocation string `json:"allocation"`
	Size       int64  `json:"size"`
	Offset     int64  `json:"offset"`
	Page       int64  `json:"page"`
	// Length is 1 for a byte; for a hash, the range hashed.
	Length int64  `json:"length"`
	Got    uint64 `json:"got"`
	Want   uint64 `json:"want"`
	// AtSeconds is when it was found, and SinceSeconds when the first
	// operation History lists began, in seconds since the soak started.
	AtSeconds    float64 `json:"at_seconds"`
	SinceSeconds float64 `json:"since_seconds"`
	// History lists the operations that touched the byte's block, oldest
	// first; HistoryOmitted counts older ones left out (the report keeps
	// the last 300) and those the client no longer kept (it keeps the
	// last 65,536 operations of each allocation).
	History        []string `json:"history"`
	HistoryOmitted int64    `json:"history_omitted"`
}

func (w *soakWrong) Error() string {
	what := "byte"
	if w.Length > 1 {
		what = fmt.Sprintf("hash of %d bytes at", w.Length)
	}
	return fmt.Sprintf("op %d (%s): %s %#x (page %d) of allocation %s (%d bytes) is %#x, want %#x",
		w.Op, w.During, what, w.Offset, w.Page, w.Allocation, w.Size, w.Got, w.Want)
}

// soakClientDone is a client's last line: what it did.
type soakClientDone struct {
	Ops          map[string]uint64 `json:"ops"`
	BytesChecked uint64            `json:"bytes_checked"`
	// LaunchesLost counts launches whose device process died under
	// them; ServerRestarts the takeovers the client saw (Go only: -1
	// from C).
	LaunchesLost   uint64 `json:"launches_lost"`
	ServerRestarts int    `json:"server_restarts"`
}

// soakEvent is one operation on an allocation, begun at since the
// soak's start.
type soakEvent struct {
	op       int64
	at       time.Duration
	what     string
	off, len int
}

// soakHistoryKeep is how many operations each allocation keeps.
const soakHistoryKeep = 1 << 16

type soakSlot struct {
	a       *uvm.Allocation
	shadow  []byte
	history []soakEvent
	dropped int64
}

func (sl *soakSlot) record(op int64, at time.Duration, what string, off, length int) {
	if len(sl.history) == soakHistoryKeep {
		half := soakHistoryKeep / 2
		sl.history = append(sl.history[:0], sl.history[half:]...)
		sl.dropped += int64(half)
	}
	sl.history = append(sl.history, soakEvent{op, at, what, off, length})
}

// explain fills w's history: the operations that touched the block of
// byte at.
func (sl *soakSlot) explain(w *soakWrong, at int) {
	var lines []string
	var times []time.Duration
	blk := at / uvm.BlockSize
	for _, e := range sl.history {
		if e.off/uvm.BlockSize <= blk && blk <= (e.off+e.len-1)/uvm.BlockSize {
			mark := ""
			if e.off <= at && at < e.off+e.len {
				mark = " *"
			}
			lines = append(lines, fmt.Sprintf("op %d at %.3fs: %s +%#x+%d%s", e.op, e.at.Seconds(), e.what, e.off, e.len, mark))
			times = append(times, e.at)
		}
	}
	const keep = 300
	w.HistoryOmitted = sl.dropped
	if len(lines) > keep {
		w.HistoryOmitted += int64(len(lines) - keep)
		lines, times = lines[len(lines)-keep:], times[len(times)-keep:]
	}
	w.History = lines
	if len(times) > 0 {
		w.SinceSeconds = times[0].Seconds()
	}
}

type soakGoClient struct {
	name      string
	s         *uvm.Session
	rng       *rand.Rand
	slots     []*soakSlot
	maxAlloc  int64
	devices   int
	hashes    []uint64 // in host memory mapped for the devices: kernels write here
	pipe      [2]int
	op        int64
	counts    map[string]uint64
	checked   uint64
	lost      uint64
	corruptAt int64
	lastLine  time.Time
	epoch     time.Time       // the soak's start: the history's times count from it
	opAt      time.Duration   // when the operation in progress began
	ops       map[string]bool // the operations it chooses from
}

// ClientMain is `uvm __soak-client`.
func ClientMain(args []string) int {
	fs := flag.NewFlagSet(ClientArg, flag.ContinueOnError)
	name := fs.String("name", "go", "the client's name in the soak's report")
	socket := fs.String("socket", "", "the daemon's socket")
	seed := fs.Uint64("seed", 1, "the seed of the client's operations")
	maxAlloc := fs.Int64("max-alloc", 4<<20, "the largest allocation, in bytes")
	slots := fs.Int("slots", 5, "allocations kept at once")
	ops := fs.String("ops", strings.Join(OpNames(), ","), "the operations it chooses from")
	epoch := fs.Int64("epoch", time.Now().UnixNano(), "the soak's start, in nanoseconds since 1970: the history's times count from it")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	c := &soakGoClient{name: *name, rng: rand.New(rand.NewPCG(*seed, 0x50a1c)), maxAlloc: *maxAlloc,
		counts: map[string]uint64{}, corruptAt: int64(soakCorruptOp(*name)), epoch: time.Unix(0, *epoch)}
	c.ops = map[string]bool{}
	for _, o := range strings.Split(*ops, ",") {
		if !slices.Contains(OpNames(), o) {
			fmt.Fprintf(os.Stderr, "%s: unknown operation %q\n", ClientArg, o)
			return 2
		}
		c.ops[o] = true
	}
	if err := c.run(*socket, *slots); err != nil {
		var w *soakWrong
		if errors.As(err, &w) {
			b, _ := json.Marshal(w)
			fmt.Printf("wrong %s\n", b)
		} else {
			fmt.Printf("error %s\n", oneLine(err.Error()))
		}
		return 1
	}
	return 0
}

// oneLine joins the lines of a message.
func oneLine(s string) string { return strings.Join(strings.Fields(s), " ") }

func (c *soakGoClient) run(socket string, nslots int) error {
	var err error
	if c.s, err = uvm.Connect(uvm.Config{Server: "daemon", Socket: socket}); err != nil {
		return err
	}
	c.devices = c.s.DeviceCount()
	out, err := c.s.HostAlloc(int64(8*max(1, c.devices)), uvm.HostAllocMapped)
	if err != nil {
		return err
	}
	c.hashes = unsafe.Slice((*uint64)(out.Pointer()), max(1, c.devices))
	if err := syscall.Pipe(c.pipe[:]); err != nil {
		return err
	}
	for range nslots {
		sl, err := c.alloc()
		if err != nil {
			return err
		}
		c.slots = append(c.slots, sl)
	}
	var stop atomic.Bool
	go func() { io.Copy(io.Discard, os.Stdin); stop.Store(true) }()
	for ; !stop.Load(); c.op++ {
		if err := c.step(); err != nil {
			return err
		}
		if time.Since(c.lastLine) >= 250*time.Millisecond {
			fmt.Printf("progress %d %d\n", c.op+1, c.checked)
			c.lastLine = time.Now()
		}
	}
	for _, sl := range c.slots {
		if err := c.verify(sl, 0, len(sl.shadow), "final check"); err != nil {
			return err
		}
		if err := sl.a.Free(); err != nil {
			return err
		}
	}
	if err := c.s.FreeHost(out.Addr()); err != nil {
		return err
	}
	done := soakClientDone{Ops: c.counts, BytesChecked: c.checked, LaunchesLost: c.lost, ServerRestarts: c.s.ServerRestarts()}
	if err := c.s.Close(); err != nil {
		return fmt.Errorf("close: %w", err)
	}
	b, _ := json.Marshal(done)
	fmt.Printf("done %s\n", b)
	return nil
}

// soakOps are the operations a client chooses from at random, with
// their weights (percent of the operations when all are on);
// soak_client.c has the same table.
var soakOps = []struct {
	name   string
	weight int
}{
	{"host-write", 25}, {"host-read", 17}, {"syscall-write", 3}, {"write-kernel", 10}, {"hash-kernel", 6}, {"add-kernel", 4},
	{"prefetch", 14}, {"advise", 10}, {"verify-all", 8}, {"free", 3},
}

// OpNames lists the operations.
func OpNames() []string {
	names := make([]string, len(soakOps))
	for i, o := range soakOps {
		names[i] = o.name
	}
	return names
}

// pick chooses the next operation among those on.
func (c *soakGoClient) pick() string {
	total := 0
	for _, o := range soakOps {
		if c.ops[o.name] {
			total += o.weight
		}
	}
	k := c.rng.IntN(total)
	for _, o := range soakOps {
		if c.ops[o.name] {
			if k < o.weight {
				return o.name
			}
			k -= o.weight
		}
	}
	panic("unreachable")
}

// now is the time since the soak started.
func (c *soakGoClient) now() time.Duration { return time.Since(c.epoch) }

// alloc makes an allocation of up to maxAlloc bytes (a quarter of the
// time at most three pages), whose shadow is zeros.
func (c *soakGoClient) alloc() (*soakSlot, error) {
	size := 1 + c.rng.Int64N(c.maxAlloc)
	if c.rng.IntN(4) == 0 {
		size = 1 + c.rng.Int64N(min(c.maxAlloc, 3*uvm.PageSize))
	}
	a, err := c.s.MallocManaged(size)
	if err != nil {
		return nil, fmt.Errorf("op %d: allocate %d bytes: %w", c.op, size, err)
	}
	c.counts["alloc"]++
	sl := &soakSlot{a: a, shadow: make([]byte, size)}
	sl.record(c.op, c.opAt, "allocated", 0, int(size))
	return sl, nil
}

// span picks a range of an n-byte allocation: 64 bytes, a page, three
// pages, 256 KiB or 4 MiB at most.
func (c *soakGoClient) span(n int) (int, int) {
	length := 1 + c.rng.IntN(min(n, []int{64, uvm.PageSize, 3 * uvm.PageSize, 256 << 10, 4 << 20}[c.rng.IntN(5)]))
	return c.rng.IntN(n - length + 1), length
}

// processor picks the host or a device.
func (c *soakGoClient) processor() uvm.Device { return uvm.Device(c.rng.IntN(c.devices+1) - 1) }

func (c *soakGoClient) verify(sl *soakSlot, off, length int, during string) error {
	got := sl.a.Bytes()[off : off+length]
	c.checked += uint64(length)
	if bytes.Equal(got, sl.shadow[off:off+length]) {
		return nil
	}
	for i := range got {
		if got[i] != sl.shadow[off+i] {
			return c.wrong(sl, off+i, uint64(got[i]), uint64(sl.shadow[off+i]), 1, during)
		}
	}
	return nil
}

func (c *soakGoClient) wrong(sl *soakSlot, at int, got, want uint64, length int, during string) error {
	w := &soakWrong{Op: c.op, During: during, Allocation: fmt.Sprintf("%#x", sl.a.Addr()), Size: int64(len(sl.shadow)),
		Offset: int64(at), Page: int64(at / uvm.PageSize), Length: int64(length), Got: got, Want: want, AtSeconds: c.now().Seconds()}
	sl.explain(w, at)
	return w
}

// step runs one random operation.
func (c *soakGoClient) step() error {
	c.opAt = c.now()
	i := c.rng.IntN(len(c.slots))
	sl := c.slots[i]
	n := len(sl.shadow)
	if c.op == c.corruptAt {
		// The soak's own test: a byte changed behind the shadow's back,
		// recorded nowhere, then read back as any read would.
		at := c.rng.IntN(len(c.slots[0].shadow))
		c.slots[0].a.Bytes()[at] = c.slots[0].shadow[at] ^ 0x5a
		return c.verify(c.slots[0], max(0, at-64), min(len(c.slots[0].shadow), at+64)-max(0, at-64), "host-read")
	}
	switch c.pick() {
	case "host-write":
		off, length := c.span(n)
		src := make([]byte, length)
		for j := range src {
			src[j] = byte(c.rng.Uint32())
		}
		copy(sl.a.Bytes()[off:], src)
		copy(sl.shadow[off:], src)
		sl.record(c.op, c.opAt, "host-write", off, length)
		c.counts["host-write"]++
	case "host-read":
		off, length := c.span(n)
		sl.record(c.op, c.opAt, "host-read", off, length)
		c.counts["host-read"]++
		return c.verify(sl, off, length, "host-read")
	case "syscall-write":
		// The kernel writes into managed memory inside read(2).
		off, length := c.span(n)
		length = min(length, 32<<10)
		src := make([]byte, length)
		for j := range src {
			src[j] = byte(c.rng.Uint32())
		}
		if _, err := syscall.Write(c.pipe[1], src); err != nil {
			return fmt.Errorf("op %d: write to a pipe: %w", c.op, err)
		}
		got, err := syscall.Read(c.pipe[0], sl.a.Bytes()[off:off+length])
		if err != nil || got != length {
			return fmt.Errorf("op %d: read(2) of %d bytes into managed memory: %d, %v", c.op, length, got, err)
		}
		copy(sl.shadow[off:], src)
		sl.record(c.op, c.opAt, "read(2) into it", off, length)
		c.counts["syscall-write"]++
	case "write-kernel":
		return c.kernels(soakWriteKernel, i)
	case "hash-kernel":
		return c.kernels(soakHashKernel, i)
	case "add-kernel":
		return c.kernels(soakAddKernel, i)
	case "prefetch":
		off, length := c.span(n)
		if c.rng.IntN(8) == 0 {
			off, length = 0, n
		}
		p := c.processor()
		if err := c.s.Prefetch(sl.a.Addr()+uintptr(off), int64(length), p); err != nil {
			return fmt.Errorf("op %d: prefetch %#x+%d to %v: %w", c.op, sl.a.Addr()+uintptr(off), length, p, err)
		}
		sl.record(c.op, c.opAt, "prefetch to "+p.String(), off, length)
		c.counts["prefetch"]++
	case "advise":
		off, length := c.span(n)
		advice := uvm.Advice(1 + c.rng.IntN(6))
		p := c.processor()
		if err := c.s.MemAdvise(sl.a.Addr()+uintptr(off), int64(length), advice, p); err != nil {
			return fmt.Errorf("op %d: advise %v %v on %#x+%d: %w", c.op, advice, p, sl.a.Addr()+uintptr(off), length, err)
		}
		sl.record(c.op, c.opAt, advice.String()+" "+p.String(), off, length)
		c.counts["advise"]++
	case "verify-all":
		c.counts["verify-all"]++
		return c.verify(sl, 0, n, "verify-all")
	case "free":
		if err := c.verify(sl, 0, n, "check before free"); err != nil { // every byte of it, before it goes
			return err
		}
		if err := sl.a.Free(); err != nil {
			return fmt.Errorf("op %d: free %#x: %w", c.op, sl.a.Addr(), err)
		}
		c.counts["free"]++
		ns, err := c.alloc()
		if err != nil {
			return err
		}
		c.slots[i] = ns
		return c.verify(ns, 0, len(ns.shadow), "check of a new allocation")
	}
	return nil
}

// soakLaunch is one kernel of an operation, on one device.
type soakLaunch struct {
	d        uvm.Device
	sl       *soakSlot
	off, len int
	seed     uint64
	lost     bool
}

// kernels launches kernel on every device at once (up to two), the
// first on slot i, the others on other slots, then synchronizes each
// device and brings the shadows up to date. A launch whose device
// process dies under it (the soak kills device processes) may have
// written any part of its range: each byte must then hold its old value
// or the kernel's, and the shadow takes what is there.
func (c *soakGoClient) kernels(kernel string, i int) error {
	var ls []*soakLaunch
	for d := 0; d < min(c.devices, 2); d++ {
		sl := c.slots[i]
		if d > 0 {
			sl = c.slots[(i+d+c.rng.IntN(len(c.slots)-1))%len(c.slots)]
			if kernel == soakHashKernel && c.rng.IntN(3) == 0 {
				sl = c.slots[i] // two devices reading one allocation
			}
		}
		off, length := c.span(len(sl.shadow))
		l := &soakLaunch{d: uvm.Device(d), sl: sl, off: off, len: length, seed: c.rng.Uint64()}
		addr := uint64(sl.a.Addr()) + uint64(off)
		var params []byte
		threads := 1
		switch kernel {
		case soakWriteKernel:
			params, threads = soakParamBytes(addr, uint64(length), l.seed), 1+c.rng.IntN(3)
		case soakAddKernel:
			params, threads = soakParamBytes(addr, uint64(length), 0), 1+c.rng.IntN(2)
		case soakHashKernel:
			params = soakParamBytes(addr, uint64(length), uint64(uintptr(unsafe.Pointer(&c.hashes[d]))))
		}
		if err := c.s.Launch(l.d, nil, kernel, threads, params); err != nil {
			if !c.lostToDeath(l.d, err) {
				return fmt.Errorf("op %d: launch %s on %v: %w", c.op, kernel, l.d, err)
			}
			l.lost = true
		}
		ls = append(ls, l)
	}
	for _, l := range ls {
		if err := c.s.DeviceSynchronize(l.d); err != nil {
			if !c.lostToDeath(l.d, err) {
				return fmt.Errorf("op %d: synchronize %v after %s: %w", c.op, l.d, kernel, err)
			}
			l.lost = true
		}
	}
	c.counts[strings.TrimPrefix(kernel, "uvm-soak-")+"-kernel"]++
	for _, l := range ls {
		what := fmt.Sprintf("%v %s", l.d, strings.TrimPrefix(kernel, "uvm-soak-"))
		if l.lost {
			what += " (its process died)"
		}
		mem := l.sl.a.Bytes()[l.off : l.off+l.len]
		shadow := l.sl.shadow[l.off : l.off+l.len]
		switch kernel {
		case soakHashKernel:
			l.sl.record(c.op, c.opAt, what, l.off, l.len)
			if l.lost {
				continue
			}
			c.checked += uint64(l.len)
			if got, want := c.hashes[l.d], fnv1a(shadow); got != want {
				// The host may see the wrong byte too, and name it.
				if err := c.verify(l.sl, l.off, l.len, fmt.Sprintf("host check of a range %v hashed wrong", l.d)); err != nil {
					return err
				}
				return c.wrong(l.sl, l.off, got, want, l.len, what)
			}
		default:
			l.sl.record(c.op, c.opAt, what, l.off, l.len)
			c.checked += uint64(l.len)
			for j := range mem {
				want := soakByte(l.seed, j)
				if kernel == soakAddKernel {
					want = shadow[j] + 1
				}
				switch got := mem[j]; {
				case got == want:
					shadow[j] = want
				case l.lost && got == shadow[j]: // not reached before the death
				default:
					return c.wrong(l.sl, l.off+j, uint64(got), uint64(want), 1, what)
				}
			}
		}
	}
	return nil
}

// lostToDeath says whether err is device d's process dying (the soak
// kills device processes): work launched there is lost, and the failure
// is sticky (docs/usage.md), so it resets the device, whose next launch
// starts a new process. It tells the soak which.
func (c *soakGoClient) lostToDeath(d uvm.Device, err error) bool {
	msg := err.Error()
	if !errors.Is(err, uvm.ErrLaunchFailure) || !(strings.Contains(msg, "was killed by signal 9") || strings.Contains(msg, "open stream")) {
		return false
	}
	c.lost++
	fmt.Printf("lost %d %s\n", int(d), oneLine(msg))
	if rerr := c.s.DeviceReset(d); rerr != nil {
		fmt.Fprintf(os.Stderr, "reset %v after its process died: %v\n", d, rerr)
		return false
	}
	return true
}
