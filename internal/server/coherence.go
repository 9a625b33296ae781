package server

import (
	"fmt"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/softuvm/softuvm/internal/block"
	"github.com/softuvm/softuvm/internal/config"
	"github.com/softuvm/softuvm/internal/core"
	"github.com/softuvm/softuvm/internal/guard"
	"github.com/softuvm/softuvm/internal/wire"
	"github.com/softuvm/softuvm/uffd"
)

// The launch coherence model (the managed memory of GPUs that cannot
// fault, before compute capability 6.0): at a launch the pages the CPU
// wrote go to the device and the CPU loses access to what the kernel may
// use; at the synchronize that follows it gets access back without a
// copy, and pages come back on CPU faults, each as a copy the device
// keeps (read duplication without advice), installed write-protected so
// that the next launch can tell which ones the CPU wrote.
//
// Which pages were written: with wp-async the host view's userfaultfd has
// WP_ASYNC, the kernel lifts a page's protection at its first write
// without a fault message, and the launch reads the written pages with
// PAGEMAP_SCAN on the client's /proc/PID/pagemap. With wp-fault (a
// kernel without WP_ASYNC) the first write is an ordinary write-protect
// fault, which collapses the page to its host copy: the launch then sees
// a page with no device copy, which it copies, as it copies a written
// one. Either way a page the CPU only read is not copied back.

// streamKey names a stream of a device.
type streamKey struct {
	dev    core.Device
	stream uint32
}

func (k streamKey) String() string { return fmt.Sprintf("device %d stream %d", k.dev, k.stream) }

// launchState is a launch-model session's record of what runs.
type launchState struct {
	// mu guards busy and every range's attach and locks. A leaf: faults
	// take it holding a block lock, control requests with sess.mu.
	mu sync.Mutex
	// busy holds, per stream, the kernels launched on it since it last
	// finished (in launch order).
	busy map[streamKey][]string
	// dirty is how written pages are found; pagemap is the client's
	// /proc/PID/pagemap (wp-async only).
	dirty   core.DirtyTracking
	pagemap *os.File
}

// rangeLaunch is a managed range's share of the launch model, guarded by
// launchState.mu.
type rangeLaunch struct {
	attach core.AttachMode
	single streamKey // the stream of AttachSingle
	// locks holds the streams whose launches took the range (handed it
	// to their device) and have not finished: while any does, the CPU
	// may not touch it.
	locks []streamKey
	// since is when locks last went from none to some: a host fault
	// message read before it was raised before the launch.
	since time.Time
}

// newLaunchState makes the state of a session of model want (nil under
// the fault model), with the client's pagemap open if the dirty tracking
// may be wp-async.
func (s *Server) newLaunchState(want core.Coherence, pid int) (*launchState, error) {
	if want == core.CoherenceDefault {
		want = s.defaultCoherence()
	}
	if want != core.CoherenceLaunch {
		return nil, nil
	}
	ls := &launchState{busy: map[streamKey][]string{}, dirty: core.DirtyFault}
	if s.launchFeatures(want)&uffd.FeatureWPAsync != 0 {
		f, err := os.Open(fmt.Sprintf("/proc/%d/pagemap", pid))
		if err != nil {
			return nil, fmt.Errorf("%w: the launch coherence model reads the pages the client wrote from its pagemap: %v", core.ErrInitialization, err)
		}
		ls.pagemap = f
	}
	return ls, nil
}

// settle fixes the dirty tracking from what the session's userfaultfd
// was granted: wp-async if it has WP_ASYNC, else wp-fault.
func (ls *launchState) settle(granted uffd.Feature) *launchState {
	if ls == nil {
		return nil
	}
	if granted&uffd.FeatureWPAsync != 0 && ls.pagemap != nil {
		ls.dirty = core.DirtyAsync
	} else if ls.pagemap != nil {
		ls.pagemap.Close()
		ls.pagemap = nil
	}
	return ls
}

func (ls *launchState) close() {
	if ls != nil && ls.pagemap != nil {
		ls.pagemap.Close()
	}
}

// launchFeatures is the userfaultfd features a session of model want
// asks for.
func (s *Server) launchFeatures(want core.Coherence) uffd.Feature {
	if want == core.CoherenceDefault {
		want = s.defaultCoherence()
	}
	if want != core.CoherenceLaunch || core.DirtyTracking(s.cfg.DirtyTracking) == core.DirtyFault {
		return s.features
	}
	return s.features | uffd.FeatureWPAsync
}

// defaultCoherence is the model of clients that do not choose (the
// configuration was validated).
func (s *Server) defaultCoherence() core.Coherence {
	c, _ := core.ParseCoherence(s.cfg.Coherence)
	return c
}

// coherence is the session's model.
func (sess *session) coherence() core.Coherence {
	if sess.launch != nil {
		return core.CoherenceLaunch
	}
	return core.CoherenceFault
}

// launchLocked reports whether the CPU may not touch range r now, and
// the kernels that hold it. ls.mu is taken.
func (ls *launchState) launchLocked(r *managedRange) (bool, []string) {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	if len(r.launch.locks) == 0 {
		return false, nil
	}
	var kernels []string
	for _, k := range r.launch.locks {
		for _, name := range ls.busy[k] {
			kernels = append(kernels, fmt.Sprintf("%q (%v)", name, k))
		}
	}
	return true, kernels
}

// deviceMayUse reports whether a kernel of device d may touch range r:
// a launch of d took it. ls.mu is taken.
func (ls *launchState) deviceMayUse(r *managedRange, d core.Device) bool {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	for _, k := range r.launch.locks {
		if k.dev == d {
			return true
		}
	}
	return false
}

// LaunchRefused reports whether the launch model refuses the fault the
// mover serves (of view o.FV on its range): the CPU touching what a
// running kernel may use, or a kernel touching what no launch of its
// device took.
func (sess *session) LaunchRefused(o *block.Mover) bool {
	ls := sess.launch
	if ls == nil || o.R.Kind != core.KindManaged {
		return false
	}
	r := rangeOf(o.R)
	if l := o.FV.Processor(); l != core.CPU {
		return !ls.deviceMayUse(r, l)
	}
	locked, _ := ls.launchLocked(r)
	return locked
}

// launchStale reports whether a refused fault of view v on range r is a
// stale message rather than a touch to refuse: a host fault whose read
// began before the launch that locked the range, or a device's fault
// while no kernel of the device runs (a second message for a page
// another thread's fault brought in, served after the kernel ended). Its
// thread, if it still waits, is woken and faults again; poisoning the
// page would fail a later, lawful touch.
func (sess *session) launchStale(v *view, r *managedRange, fr *faultRequest) bool {
	ls := sess.launch
	ls.mu.Lock()
	defer ls.mu.Unlock()
	if v.loc == core.CPU {
		return fr.readFrom.Before(r.launch.since)
	}
	for k := range ls.busy {
		if k.dev == v.loc {
			return false
		}
	}
	return true
}

// launchRefusal says why the fault of view v at addr in r was refused.
func (sess *session) launchRefusal(v *view, r *managedRange, addr uintptr) error {
	ls := sess.launch
	what := fmt.Sprintf("managed allocation %#x (%s, buffer %d)", r.Start, core.FormatSize(r.size), r.ID)
	if v.loc == core.CPU {
		_, kernels := ls.launchLocked(r)
		return fmt.Errorf("%w: the CPU touched %#x in %s while kernel %s may use it: under the launch coherence model the CPU may not touch managed memory between the launch of a kernel that may use it and the synchronize that follows (attach the allocation to the host or to another stream with StreamAttachMemAsync to keep it)",
			core.ErrInvalidValue, addr, what, strings.Join(kernels, ", "))
	}
	ls.mu.Lock()
	attach, single := r.launch.attach, r.launch.single
	ls.mu.Unlock()
	why := "no launch on this device took it"
	switch attach {
	case core.AttachHost:
		why = "it is attached to the host"
	case core.AttachSingle:
		why = fmt.Sprintf("it is attached to %v only, which has no kernel running", single)
	}
	return fmt.Errorf("%w: a kernel on device %d touched %#x in %s, and %s: under the launch coherence model kernels use only memory attached globally or to their own stream", core.ErrInvalidValue, v.loc, addr, what, why)
}

// streamAttach records an allocation's attachment (cudaStreamAttachMemAsync).
// The client sends it when the attaching stream reaches it, and it takes
// effect now: launches from here on take the range as it says, and the
// locks of running kernels it no longer lets hold the range go (all of
// them for the host, all but its stream's for a single stream), so that
// the CPU may touch it while those kernels run, as CUDA lets it (they
// promise not to touch it). Under the fault model it changes nothing.
func (sess *session) streamAttach(r wire.StreamAttachRequest) error {
	mr, err := sess.findRange(uintptr(r.Addr), 0, "attach")
	if err != nil {
		return err
	}
	if mr.Kind != core.KindManaged {
		return fmt.Errorf("%w: attach %#x to a stream: only managed memory is attached, and this is %s", core.ErrInvalidValue, r.Addr, mr.Kind)
	}
	if r.Mode == core.AttachSingle {
		if err := sess.srv.checkDevice(core.Device(r.Device), "attach to a stream of"); err != nil {
			return err
		}
	}
	ls := sess.launch
	if ls == nil {
		mr.launch.attach = r.Mode // read only by a launch-model session's requests
		return nil
	}
	ls.mu.Lock()
	defer ls.mu.Unlock()
	rl := &mr.launch
	rl.attach = r.Mode
	rl.single = streamKey{core.Device(r.Device), r.Stream}
	locks := rl.locks[:0]
	for _, k := range rl.locks {
		if rl.attach == core.AttachGlobal || (rl.attach == core.AttachSingle && k == rl.single) {
			locks = append(locks, k)
		}
	}
	clear(rl.locks[len(locks):])
	rl.locks = locks
	return nil
}

// launchBegin hands the managed memory a kernel about to start may use
// to its device: every range attached globally or to the kernel's
// stream that no running kernel holds yet gets its written host pages
// copied to the device and its host copies dropped, and the CPU may not
// touch it until the stream finishes.
func (sess *session) launchBegin(req wire.LaunchBeginRequest) error {
	ls := sess.launch
	if ls == nil {
		return nil // the fault model: nothing to hand over
	}
	d := core.Device(req.Device)
	if d == core.CPU {
		return fmt.Errorf("%w: launch on the CPU", core.ErrInvalidDevice)
	}
	if err := sess.srv.checkDevice(d, "launch on"); err != nil {
		return err
	}
	key := streamKey{d, req.Stream}
	sess.mu.Lock()
	defer sess.mu.Unlock()
	var handed []*managedRange
	held := guard.Launch{Device: req.Device, Stream: req.Stream, Kernel: req.Kernel}
	ls.mu.Lock()
	ls.busy[key] = append(ls.busy[key], req.Kernel)
	for _, r := range sess.ranges.Load().ranges {
		if r.Kind != core.KindManaged {
			continue
		}
		rl := &r.launch
		if rl.attach == core.AttachHost || (rl.attach == core.AttachSingle && rl.single != key) {
			continue
		}
		if !containsKey(rl.locks, key) {
			if len(rl.locks) == 0 {
				handed = append(handed, r)
				rl.since = time.Now()
			}
			rl.locks = append(rl.locks, key)
			held.Ranges = append(held.Ranges, uint64(r.Start))
		}
	}
	ls.mu.Unlock()
	var errs []error
	for _, r := range handed {
		if err := sess.handOff(r, d); err != nil {
			errs = append(errs, err)
		}
	}
	// After the hand-off, before the reply: a server that takes over
	// from one that died in the hand-off finds no record, and the
	// client's retry hands the ranges off again; once the client has the
	// reply, and may start the kernel, the record is the guard's.
	sess.record(guard.LaunchRecord(held))
	return core.JoinErrors(errs)
}

// restoreLaunch puts back a kernel the journal holds as running, on a
// session taken over: its stream is busy and the ranges it held are
// locked, as at its launch, without a hand-off (the dead server made it).
func (sess *session) restoreLaunch(l guard.Launch) {
	ls := sess.launch
	key := streamKey{core.Device(l.Device), l.Stream}
	ls.mu.Lock()
	defer ls.mu.Unlock()
	ls.busy[key] = append(ls.busy[key], l.Kernel)
	for _, addr := range l.Ranges {
		r := sess.ranges.Load().lookup(uintptr(addr))
		if r == nil || r.Start != uintptr(addr) || containsKey(r.launch.locks, key) {
			continue
		}
		if len(r.launch.locks) == 0 {
			r.launch.since = time.Now()
		}
		r.launch.locks = append(r.launch.locks, key)
	}
}

func containsKey(keys []streamKey, k streamKey) bool {
	for _, x := range keys {
		if x == k {
			return true
		}
	}
	return false
}

// streamsIdle records that the streams of req finished: the CPU may
// touch what only they held again, without a copy.
func (sess *session) streamsIdle(req wire.StreamsIdleRequest) error {
	ls := sess.launch
	if ls == nil {
		return nil
	}
	d := core.Device(req.Device)
	if err := sess.srv.checkDevice(d, "streams of"); err != nil {
		return err
	}
	done := func(k streamKey) bool { return k.dev == d && (req.Stream == wire.AllStreams || k.stream == req.Stream) }
	defer sess.record(guard.IdleRecord(wire.EncodeStreamsIdle(0, req))) // after ls.mu: a leaf
	ls.mu.Lock()
	defer ls.mu.Unlock()
	for k := range ls.busy {
		if done(k) {
			delete(ls.busy, k)
		}
	}
	for _, r := range sess.ranges.Load().ranges {
		locks := r.launch.locks[:0]
		for _, k := range r.launch.locks {
			if !done(k) {
				locks = append(locks, k)
			}
		}
		r.launch.locks = locks
	}
	return nil
}

// handOff moves range r's host pages to device d for a launch: pages the
// CPU wrote, or that have no device copy, are copied (moved); host copies
// of pages the CPU only read are dropped. sess.mu is held.
func (sess *session) handOff(r *managedRange, d core.Device) error {
	written, err := sess.writtenPages(r)
	if err != nil {
		return err
	}
	return r.eachBlockParallel(r.Start, r.Length, 1, sess.srv.nodeOf(d), func(o *block.Mover, pages core.PageMask) error {
		if err := o.HandOff(d, written[o.BlockIndex()]); err != nil {
			return fmt.Errorf("launch: hand %#x+%d to device %d: %w", o.BlockAddr, core.BlockSize, d, err)
		}
		return nil
	})
}

// writtenPages returns, per block of r, the pages the client wrote since
// they were installed (wp-async), or nothing (wp-fault: a written page
// has no other copy already).
func (sess *session) writtenPages(r *managedRange) ([]core.PageMask, error) {
	masks := make([]core.PageMask, r.Blocks())
	ls := sess.launch
	if ls.dirty != core.DirtyAsync {
		return masks, nil
	}
	runs, err := uffd.ScanWritten(ls.pagemap, r.Start, r.End(), nil)
	if err != nil {
		return nil, fmt.Errorf("%w: launch: find the pages the CPU wrote in %#x+%d: %v", core.ErrInternal, r.Start, r.Length, err)
	}
	markRuns(masks, r.Start, runs)
	return masks, nil
}

// markRuns sets in masks, one per block from the block at base, the pages
// of runs (which lie within those blocks).
func markRuns(masks []core.PageMask, base uintptr, runs []uffd.PageRun) {
	for _, run := range runs {
		for a := run.Start; a < run.End; {
			i := int((a - base) >> core.BlockShift)
			blockEnd := base + uintptr(i+1)*core.BlockSize
			end := min(run.End, blockEnd)
			first := int((a-base)>>core.PageShift) & (core.PagesPerBlock - 1)
			masks[i].FillRange(first, first+int((end-a)>>core.PageShift))
			a = end
		}
	}
}

// launchInfo adds the session's model to in, for `uvm info`.
func (sess *session) launchInfo(in *config.SessionInfo) {
	in.Coherence = sess.coherence().String()
	if ls := sess.launch; ls != nil {
		in.DirtyTracking = string(ls.dirty)
	}
}

// attachOf is the attachment MallocManaged's flags ask for.
func attachOf(flags uint32) core.AttachMode {
	if core.AttachMode(flags) == core.AttachHost {
		return core.AttachHost
	}
	return core.AttachGlobal
}

// dirtyTrackingName is how a launch-model session of this server finds
// written pages on this kernel: wp-async where the kernel has WP_ASYNC
// and the configuration does not ask for wp-fault.
func (s *Server) dirtyTrackingName() string {
	if s.launchFeatures(core.CoherenceLaunch)&uffd.FeatureWPAsync != 0 {
		if sup, err := uffd.Supported(); err == nil && sup&uffd.FeatureWPAsync != 0 {
			return string(core.DirtyAsync)
		}
	}
	return string(core.DirtyFault)
}

// SettleHostWrites makes the host copy the only copy of each page of
// [first, outer) that the CPU wrote since it was protected, under the
// launch model with wp-async: the server is about to write-protect the
// host's mappings, after which a written page would look clean, and a
// clean host copy is taken to equal every other copy. The block is
// locked.
func (sess *session) SettleHostWrites(o *block.Mover, first, outer int) error {
	ls := sess.launch
	if ls == nil || ls.dirty != core.DirtyAsync {
		return nil
	}
	var dup core.PageMask
	dup.FillRange(first, outer)
	hostDup := o.B.HostDuplicates()
	dup.And(&hostDup)
	if dup.Empty() {
		return nil
	}
	runs, err := uffd.ScanWritten(ls.pagemap, o.PageAddr(first), o.PageAddr(outer), nil)
	if err != nil {
		return fmt.Errorf("%w: find the pages the CPU wrote in %#x+%d: %v", core.ErrInternal, o.PageAddr(first), (outer-first)*core.PageSize, err)
	}
	written := make([]core.PageMask, 1)
	markRuns(written, o.BlockAddr, runs)
	written[0].And(&dup)
	if !written[0].Empty() {
		o.CollapseTo(core.CPU, written[0])
	}
	return nil
}
