package server

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/softuvm/softuvm/internal/core"
	"github.com/softuvm/softuvm/internal/wire"
	"github.com/softuvm/softuvm/trace"
)

// viewMap records which file one device view maps over each page of one
// block.
type viewMap struct {
	// file[p] is the processor whose file the view maps over page p, or
	// is mapping if p is pending; none means the view's own.
	file [core.PagesPerBlock]core.PageProcessor
	// pending pages are being remapped: the view maps was[p] or file[p].
	pending core.PageMask
	was     [core.PagesPerBlock]core.PageProcessor
}

// fileOf is the processor whose file a view of processor own maps where
// its map records p.
func fileOf(p core.PageProcessor, own core.Device) core.Device {
	if d, ok := p.Device(); ok {
		return d
	}
	return own
}

// remapper follows, in the background, the mapping changes that faults
// and timers cause. Faults enqueue blocks and never wait.
type remapper struct {
	mu      sync.Mutex
	pending map[remapKey]struct{} // guarded by mu
	wake    chan struct{}         // capacity 1
	quit    chan struct{}
}

type remapKey struct {
	r  *managedRange
	bi int
	l  core.Device
}

func newRemapper() *remapper {
	return &remapper{pending: map[remapKey]struct{}{}, wake: make(chan struct{}, 1), quit: make(chan struct{})}
}

// staticFile returns the file view l maps over a range of a kind whose
// mapping changes only on the control path (pinned host memory, device
// memory), and ok false for managed memory.
func (r *managedRange) staticFile(l core.Device) (core.Device, bool) {
	switch r.kind {
	case core.KindPinnedHost:
		return core.CPU, true
	case core.KindDevice:
		if l == core.CPU {
			return core.CPU, true // the host maps its own file there, and its faults are refused
		}
		if !r.mapsDeviceMemory(l) {
			// No peer access to the owner (peer.go): the view maps
			// nothing there, so nothing remote either.
			return l, true
		}
		return r.owner, true
	}
	return l, false
}

// fixedFile returns the file view l maps over every page of the block,
// if it is the same everywhere and no remap is in flight.
func (o *mover) fixedFile(l core.Device) (core.Device, bool) {
	if f, ok := o.r.staticFile(l); ok {
		return f, true
	}
	if l == core.CPU || o.b.maps == nil || o.b.maps[l.Slot()] == nil {
		return l, true
	}
	return 0, false
}

// mapsAt returns the file view l maps over page p; known is false while
// a remap of p is in flight.
func (o *mover) mapsAt(l core.Device, p int) (core.Device, bool) {
	if f, ok := o.fixedFile(l); ok {
		return f, true
	}
	m := o.b.maps[l.Slot()]
	return fileOf(m.file[p], l), !m.pending.Test(p)
}

// pagesMapping returns the pages over which view l is known to map
// location f's file.
func (o *mover) pagesMapping(l, f core.Device) core.PageMask {
	var out core.PageMask
	if fixed, ok := o.fixedFile(l); ok {
		if fixed == f {
			out.FillRange(0, o.b.pages)
		}
		return out
	}
	m := o.b.maps[l.Slot()]
	for p := 0; p < o.b.pages; p++ {
		if !m.pending.Test(p) && fileOf(m.file[p], l) == f {
			out.Set(p)
		}
	}
	return out
}

// mayMap reports whether view l maps, or may map while a remap is in
// flight, location f's file over some page of [first, outer).
func (o *mover) mayMap(l, f core.Device, first, outer int) bool {
	if fixed, ok := o.fixedFile(l); ok {
		return fixed == f
	}
	m := o.b.maps[l.Slot()]
	for p := first; p < outer; p++ {
		if fileOf(m.file[p], l) == f || (m.pending.Test(p) && fileOf(m.was[p], l) == f) {
			return true
		}
	}
	return false
}

// holders returns the views that may map location src's file over some
// page of [first, outer): the ones whose writers must be held still while
// those pages are copied away, and whose page tables lose them when the
// file is punched. Release each with doneWith. The slice is the mover's
// scratch buffer, valid until the next call: a caller that may call
// again while it holds one set (breakLarge under a move) uses
// holdersInto.
func (o *mover) holders(src core.Device, first, outer int) []*view {
	o.holdBuf = o.holdersInto(o.holdBuf[:0], src, first, outer)
	return o.holdBuf
}

// holdersInto appends holders' views to out.
func (o *mover) holdersInto(out []*view, src core.Device, first, outer int) []*view {
	for l := range o.b.resident {
		loc := core.DeviceAtSlot(l)
		if !o.mayMap(loc, src, first, outer) {
			continue
		}
		if v := o.viewOf(loc); v != nil {
			out = append(out, v)
		}
	}
	return out
}

func (o *mover) doneWithAll(vs []*view) {
	for _, v := range vs {
		o.doneWith(v)
	}
}

// desiredFile is the file policy wants device view l to map over page p
// of a managed range's block. The block's lock is held.
func (o *mover) desiredFile(l core.Device, p int, now int64) core.Device {
	b := o.b
	if b.resident[l.Slot()].Test(p) {
		return l // a copy here: always map it
	}
	adv := b.advice
	if adv != nil && adv.readMostly.Test(p) {
		return l // read faults make a copy here
	}
	if o.pinnedAt(p, now) {
		return core.CPU
	}
	if adv == nil {
		return l
	}
	if pref, ok := adv.preferred[p].Device(); ok {
		return pref
	}
	if adv.accessedBy[l.Slot()].Test(p) {
		if owner, ok := b.soleLocation(p); ok {
			return owner
		}
	}
	return l
}

// soleLocation returns where page p lives if it has exactly one copy.
func (b *block) soleLocation(p int) (core.Device, bool) {
	at, n := core.Device(0), 0
	for l := range b.resident {
		if b.resident[l].Test(p) {
			at = core.DeviceAtSlot(l)
			n++
		}
	}
	return at, n == 1
}

// copies returns how many locations hold page p.
func (b *block) copies(p int) int {
	n := 0
	for l := range b.resident {
		if b.resident[l].Test(p) {
			n++
		}
	}
	return n
}

// duplicated returns the pages with more than one copy.
func (b *block) duplicated() core.PageMask {
	var seen, dup core.PageMask
	for l := range b.resident {
		x := b.resident[l]
		x.And(&seen)
		dup.Or(&x)
		seen.Or(&b.resident[l])
	}
	return dup
}

// mismatch finds the first run of pages over which device view l maps
// another file than policy wants, all wanting the same file. The block's
// lock is held and no remap of l is in flight.
func (o *mover) mismatch(l core.Device, from int, now int64) (first, outer int, to core.Device, found bool) {
	b := o.b
	for p := from; p < b.pages; p++ {
		cur, _ := o.mapsAt(l, p)
		want := o.desiredFile(l, p, now)
		if cur == want {
			continue
		}
		q := p + 1
		for ; q < b.pages; q++ {
			c, _ := o.mapsAt(l, q)
			if w := o.desiredFile(l, q, now); w != want || c == w {
				break
			}
		}
		return p, q, want, true
	}
	return 0, 0, 0, false
}

// viewMapOf returns what view l maps over the block, nil when it maps
// its own file everywhere.
func (b *block) viewMapOf(l core.Device) *viewMap {
	if b.maps == nil {
		return nil
	}
	return b.maps[l.Slot()]
}

// setMapping records that view l maps (or, pending, is mapping) file to
// over [first, outer).
func (b *block) setMapping(l core.Device, first, outer int, to core.Device, pending bool, locations int) {
	if b.maps == nil {
		b.maps = make([]*viewMap, locations)
	}
	m := b.maps[l.Slot()]
	if m == nil {
		m = &viewMap{}
		b.maps[l.Slot()] = m
	}
	code := core.PageProcessorOf(to)
	if to == l {
		code = core.NoProcessor
	}
	for p := first; p < outer; p++ {
		if pending {
			m.was[p] = m.file[p]
			m.pending.Set(p)
		} else {
			m.pending.Clear(p)
		}
		m.file[p] = code
	}
	b.compactMaps(l)
}

// resetMaps forgets what view l mapped: a new process of the device maps
// its own file everywhere until told otherwise.
func (b *block) resetMaps(l core.Device) {
	if b.maps != nil {
		b.maps[l.Slot()] = nil
		b.compactMaps(l)
	}
}

// settle ends a remap of [first, outer): the view maps file to (ok) or
// still the old one.
func (b *block) settle(l core.Device, first, outer int, ok bool) {
	m := b.maps[l.Slot()]
	for p := first; p < outer; p++ {
		if !ok {
			m.file[p] = m.was[p]
		}
		m.pending.Clear(p)
	}
	b.compactMaps(l)
}

// compactMaps drops view l's record once it maps its own file everywhere,
// so that blocks without remote mappings take the fast path.
func (b *block) compactMaps(l core.Device) {
	m := b.maps[l.Slot()]
	if m == nil || !m.pending.Empty() {
		return
	}
	for p := range m.file {
		if m.file[p] != core.NoProcessor && !m.file[p].Is(l) {
			return
		}
	}
	b.maps[l.Slot()] = nil
	for _, x := range b.maps {
		if x != nil {
			return
		}
	}
	b.maps = nil
}

// A device process maps each remote run as a mapping of its own, and
// one between two runs of its own file splits that file's mapping: a
// run costs up to two of the process's mappings, which Linux bounds
// (vm.max_map_count, 65530 by default). Advice that alternates page by
// page wants more than that (a hundred thousand runs and more), so a
// view maps remote runs while it has mappings to spare, and its own file
// beyond: policy's wish to map a page remotely is a hint, and a page the
// device touches there migrates to it instead. The first view to run
// out says so in the log.

// mappingReserve is what a device process keeps for mappings of its
// own that come after its layout: its threads' stacks, its allocator's
// arenas, remote runs and peers' memory mapped later.
const mappingReserve = 4096

// remoteRunBudget is how many remote runs the process pid may map on
// top of what it maps now.
func remoteRunBudget(pid int) int {
	limit, err := readIntFile("/proc/sys/vm/max_map_count")
	if err != nil || limit <= 0 {
		limit = 65530 // Linux's default
	}
	used := 0
	if maps, err := os.ReadFile(fmt.Sprintf("/proc/%d/maps", pid)); err == nil {
		used = bytes.Count(maps, []byte{'\n'})
	}
	return max(0, (limit-used-mappingReserve)/2)
}

// readIntFile reads a file that holds one decimal integer (a sysctl).
func readIntFile(path string) (int, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	return strconv.Atoi(strings.TrimSpace(string(b)))
}

// mapsFull marks view v as out of mappings for remote runs (what found
// out names the occasion), and says so once per server.
func (sess *session) mapsFull(v *view, what string) {
	if v.mapsFull.Swap(true) || sess.srv.mapsFullLogged.Swap(true) {
		return
	}
	sess.srv.logger.Printf("pid %d device %d (pid %d): %s wants more remote mappings than the process may have (vm.max_map_count); "+
		"where advice or policy would map another location's memory it maps its own, and pages migrate on touch (raise vm.max_map_count to map them all)",
		sess.pid, v.loc, v.pid, what)
}

// remapBlock brings device view l's mapping of block bi in line with
// policy, run by run, asking the device process to map each. It waits
// for the device; it holds no block lock meanwhile, and v.reqMu keeps one
// remap of the view in flight at a time.
func (sess *session) remapBlock(r *managedRange, bi int, l core.Device) error {
	v := sess.views[l.Slot()].Load()
	if v == nil || v.conn == nil || r.kind != core.KindManaged {
		return nil
	}
	v.reqMu.Lock()
	defer v.reqMu.Unlock()
	blockAddr := r.start + uintptr(bi)*core.BlockSize
	for range core.PagesPerBlock {
		b := r.blocks[bi].Load()
		if b == nil {
			return nil
		}
		b.mu.Lock()
		if r.freed.Load() || sess.views[l.Slot()].Load() != v || !b.remoteMappable(sess.srv.thrashing, sess.srv.nowMicros()) {
			// Without remote advice, remote mappings or pins, every
			// device maps its own file: nothing to do.
			b.mu.Unlock()
			return nil
		}
		o := mover{sess: sess, r: r, b: b, blockAddr: blockAddr}
		now := sess.srv.nowMicros()
		first, outer, to, found := o.mismatch(l, 0, now)
		for found && to != l && v.mapsFull.Load() {
			// Out of mappings: only runs back to its own file.
			first, outer, to, found = o.mismatch(l, outer, now)
		}
		if !found {
			b.mu.Unlock()
			return nil
		}
		// The new mapping starts write-protected everywhere: a page with
		// several copies must never be writable, and one may get a second
		// copy while the remap is in flight, protected by then only in the
		// old mapping. A page with one copy costs a write-protect fault on
		// its first write, which lifts the protection.
		var wp core.PageMask
		wp.FillRange(0, outer-first)
		b.setMapping(l, first, outer, to, true, sess.srv.locations())
		b.mu.Unlock()

		err := v.requestLocked(wire.EncodeDeviceMap(v.seq.Add(1), wire.DeviceMapRequest{
			Addr: uint64(o.pageAddr(first)), Length: uint64(outer-first) * core.PageSize, File: to, Wp: wp}), wire.MsgDeviceMap)

		b.mu.Lock()
		b.settle(l, first, outer, err == nil)
		if err == nil && to != l {
			r.countRemote(l, o.pageAddr(first), outer-first)
		}
		if err == nil && to == l && !r.freed.Load() {
			o.mapOwnResident(l, first, outer)
		}
		b.mu.Unlock()
		if errors.Is(err, errViewGone) {
			return nil // its successor maps what the table says
		}
		if errors.Is(err, core.ErrMemoryAllocation) && to != l {
			sess.mapsFull(v, fmt.Sprintf("mapping %v's memory over %#x+%d", to, o.pageAddr(first), (outer-first)*core.PageSize))
			continue
		}
		if err != nil {
			return fmt.Errorf("map %v's file over %#x+%d in device %d: %w", to, o.pageAddr(first), (outer-first)*core.PageSize, l, err)
		}
	}
	return nil
}

// mapOwnResident maps into device view l, which maps its own file over
// pages [first, outer) again, the pages of the run its file holds, where
// the view registers MINOR faults there (viewContinues; elsewhere the
// kernel maps them itself): with one UFFDIO_CONTINUE, as a move into
// the file would, so that a device reads memory that came to it (a
// delayed migration, a prefetch while it mapped elsewhere) without
// faults, as it did when the kernel mapped such pages itself. Pages with
// other copies are mapped write-protected (continuePages). The block's
// lock is held.
func (o *mover) mapOwnResident(l core.Device, first, outer int) {
	v := o.viewOf(l)
	if v == nil {
		return
	}
	defer o.doneWith(v)
	if !o.viewContinues(v) {
		return
	}
	var pages core.PageMask
	pages.FillRange(first, outer)
	held := o.heldInOwnFile(l)
	pages.And(&held)
	o.continuePages(v, pages, first)
}

// remapRange brings every device view's mapping of [addr, addr+length)
// in line with policy and waits until it is.
func (sess *session) remapRange(r *managedRange, addr, length uintptr) error {
	var errs []error
	for l := 1; l < len(sess.views); l++ {
		for bi := int((addr - r.start) >> core.BlockShift); bi <= int((addr+length-1-r.start)>>core.BlockShift); bi++ {
			if err := sess.remapBlock(r, bi, core.DeviceAtSlot(l)); err != nil {
				errs = append(errs, err)
				break
			}
		}
	}
	return core.JoinErrors(errs)
}

// enqueue asks for device view l's mapping of block bi to be reconciled.
func (q *remapper) enqueue(r *managedRange, bi int, l core.Device) {
	q.mu.Lock()
	q.pending[remapKey{r, bi, l}] = struct{}{}
	q.mu.Unlock()
	select {
	case q.wake <- struct{}{}:
	default:
	}
}

// enqueueDevices enqueues block bi for every device view.
func (sess *session) enqueueRemap(r *managedRange, bi int) {
	for l := 1; l < len(sess.views); l++ {
		if sess.views[l].Load() != nil {
			sess.remaps.enqueue(r, bi, core.DeviceAtSlot(l))
		}
	}
}

func (sess *session) remapLoop() {
	q := sess.remaps
	for {
		select {
		case <-q.quit:
			return
		case <-q.wake:
		}
		q.mu.Lock()
		work := make([]remapKey, 0, len(q.pending))
		for k := range q.pending {
			work = append(work, k)
		}
		clear(q.pending)
		q.mu.Unlock()
		for _, k := range work {
			if err := sess.remapBlock(k.r, k.bi, k.l); err != nil {
				sess.srv.logger.Printf("pid %d: %v", sess.pid, err)
			}
		}
	}
}

// scheduleRemap reconciles block bi for every device view after d: when
// a thrashing pin expires.
func (sess *session) scheduleRemap(r *managedRange, bi int, d time.Duration) {
	time.AfterFunc(d, func() {
		select {
		case <-sess.remaps.quit:
		default:
			sess.enqueueRemap(r, bi)
		}
	})
}

// countRemote counts pages device view l came to map remotely, from
// addr on.
func (r *managedRange) countRemote(l core.Device, addr uintptr, pages int) {
	r.stats.RemoteMapped[l.Slot()].Add(uint64(pages))
	if r.sess.tracing() {
		r.sess.tracePages(trace.KindRemoteMap, r, addr, pages, l)
	}
}
