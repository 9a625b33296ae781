package uvm

import (
	"fmt"
	"sync"
	"time"
)

// Remote mappings.
//
// A device view maps its own location's file over every managed range,
// except where policy says it should reach data where it lies: the
// preferred location's file (SetPreferredLocation), the owner's file
// (SetAccessedBy), the host file (a thrashing page pinned there), the
// owning device's file (device memory seen by its peers) or the host
// file (pinned host memory). The host view always maps the host file: a
// CPU cannot map device memory, as on a PCIe machine, so its faults
// migrate.
//
// Only the device process can change what it maps, and the fault path
// never waits for another process (a device whose kernel is stuck in a
// fault inside memmove cannot let its Go runtime stop the world, so a
// mapping request could wait forever for a fault that waits for it).
// So remote mappings change on the control path: advice, prefetch, a
// device attaching, and a background remapper per session that follows
// policy changes the fault path causes (residency of accessed-by pages,
// thrashing pins). The fault path serves whatever the view maps now: a
// fault in view V on page p brings p into the file V maps over p, which
// is V's own file for ordinary migration, and another location's file
// when V maps it remotely (data goes back to the preferred location, or
// to the owner an accessed-by mapping still points at until the
// remapper catches up). One exception: a page that came to V's own
// location (a delayed migration, a prefetch) while V still maps where it
// was is not taken back; the fault waits, in naps, for the remapper to
// point V at its own file.
//
// While a remap is in flight the server cannot know whether the view
// maps the old or the new file over a page: the page is pending, and a
// fault on it is served one page at a time by installing through the
// view and looking at which file received the page (servePending).

// viewMap records which file one device view maps over each page of one
// block.
type viewMap struct {
	// file[p] is 1 + the location whose file the view maps over page p,
	// or is mapping if p is pending; 0 means the view's own.
	file [PagesPerBlock]uint8
	// pending pages are being remapped: the view maps was[p] or file[p].
	pending PageMask
	was     [PagesPerBlock]uint8
}

func fileCode(l location) uint8 { return uint8(l) + 1 }

func fileOf(code uint8, own location) location {
	if code == 0 {
		return own
	}
	return location(code - 1)
}

// staticFile returns the file every device view maps over a range of a
// kind whose mapping never changes (pinned host memory, device memory),
// and ok false for managed memory.
func (r *managedRange) staticFile(l location) (location, bool) {
	switch r.kind {
	case kindPinnedHost:
		return hostLoc, true
	case kindDevice:
		if l == hostLoc {
			return hostLoc, true // the host maps its own file there, and its faults are refused
		}
		return r.owner, true
	}
	return l, false
}

// fixedFile returns the file view l maps over every page of the block,
// if it is the same everywhere and no remap is in flight.
func (o *mover) fixedFile(l location) (location, bool) {
	if f, ok := o.r.staticFile(l); ok {
		return f, true
	}
	if l == hostLoc || o.b.maps == nil || o.b.maps[l] == nil {
		return l, true
	}
	return 0, false
}

// mapsAt returns the file view l maps over page p; known is false while
// a remap of p is in flight.
func (o *mover) mapsAt(l location, p int) (location, bool) {
	if f, ok := o.fixedFile(l); ok {
		return f, true
	}
	m := o.b.maps[l]
	return fileOf(m.file[p], l), !m.pending.Test(p)
}

// pagesMapping returns the pages over which view l is known to map
// location f's file.
func (o *mover) pagesMapping(l, f location) PageMask {
	var out PageMask
	if fixed, ok := o.fixedFile(l); ok {
		if fixed == f {
			out.FillRange(0, o.b.pages)
		}
		return out
	}
	m := o.b.maps[l]
	for p := 0; p < o.b.pages; p++ {
		if !m.pending.Test(p) && fileOf(m.file[p], l) == f {
			out.Set(p)
		}
	}
	return out
}

// mayMap reports whether view l maps, or may map while a remap is in
// flight, location f's file over some page of [first, outer).
func (o *mover) mayMap(l, f location, first, outer int) bool {
	if fixed, ok := o.fixedFile(l); ok {
		return fixed == f
	}
	m := o.b.maps[l]
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
// file is punched. Release each with doneWith.
func (o *mover) holders(src location, first, outer int) []*view {
	out := o.holdBuf[:0]
	for l := range o.b.resident {
		loc := location(l)
		if !o.mayMap(loc, src, first, outer) {
			continue
		}
		if v := o.viewOf(loc); v != nil {
			out = append(out, v)
		}
	}
	o.holdBuf = out
	return out
}

func (o *mover) doneWithAll(vs []*view) {
	for _, v := range vs {
		o.doneWith(v)
	}
}

// desiredFile is the file policy wants device view l to map over page p
// of a managed range's block. The block's lock is held.
func (o *mover) desiredFile(l location, p int, now int64) location {
	b := o.b
	if b.resident[l].Test(p) {
		return l // a copy here: always map it
	}
	adv := b.advice
	if adv != nil && adv.readMostly.Test(p) {
		return l // read faults make a copy here
	}
	if o.pinnedAt(p, now) {
		return hostLoc
	}
	if adv == nil {
		return l
	}
	if pref := adv.preferred[p]; pref != 0 {
		return location(pref - 1)
	}
	if adv.accessedBy[l].Test(p) {
		if owner, ok := b.soleLocation(p); ok {
			return owner
		}
	}
	return l
}

// soleLocation returns where page p lives if it has exactly one copy.
func (b *block) soleLocation(p int) (location, bool) {
	at, n := location(0), 0
	for l := range b.resident {
		if b.resident[l].Test(p) {
			at = location(l)
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
func (b *block) duplicated() PageMask {
	var seen, dup PageMask
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
func (o *mover) mismatch(l location, from int, now int64) (first, outer int, to location, found bool) {
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
func (b *block) viewMapOf(l location) *viewMap {
	if b.maps == nil {
		return nil
	}
	return b.maps[l]
}

// setMapping records that view l maps (or, pending, is mapping) file to
// over [first, outer).
func (b *block) setMapping(l location, first, outer int, to location, pending bool, locations int) {
	if b.maps == nil {
		b.maps = make([]*viewMap, locations)
	}
	m := b.maps[l]
	if m == nil {
		m = &viewMap{}
		b.maps[l] = m
	}
	code := fileCode(to)
	if to == l {
		code = 0
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
func (b *block) resetMaps(l location) {
	if b.maps != nil {
		b.maps[l] = nil
		b.compactMaps(l)
	}
}

// settle ends a remap of [first, outer): the view maps file to (ok) or
// still the old one.
func (b *block) settle(l location, first, outer int, ok bool) {
	m := b.maps[l]
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
func (b *block) compactMaps(l location) {
	m := b.maps[l]
	if m == nil || !m.pending.Empty() {
		return
	}
	for p := range m.file {
		if m.file[p] != 0 && m.file[p] != fileCode(l) {
			return
		}
	}
	b.maps[l] = nil
	for _, x := range b.maps {
		if x != nil {
			return
		}
	}
	b.maps = nil
}

// remapBlock brings device view l's mapping of block bi in line with
// policy, run by run, asking the device process to map each. It waits
// for the device; it holds no block lock meanwhile, and v.reqMu keeps one
// remap of the view in flight at a time.
func (sess *session) remapBlock(r *managedRange, bi int, l location) error {
	v := sess.views[l].Load()
	if v == nil || v.conn == nil || r.kind != kindManaged {
		return nil
	}
	v.reqMu.Lock()
	defer v.reqMu.Unlock()
	blockAddr := r.start + uintptr(bi)*BlockSize
	for range PagesPerBlock {
		b := r.blocks[bi].Load()
		if b == nil {
			return nil
		}
		b.mu.Lock()
		if r.freed.Load() || sess.views[l].Load() != v || !b.remoteMappable(sess.srv.nowMicros()) {
			// Without remote advice, remote mappings or pins, every
			// device maps its own file: nothing to do.
			b.mu.Unlock()
			return nil
		}
		o := mover{sess: sess, r: r, b: b, blockAddr: blockAddr}
		first, outer, to, found := o.mismatch(l, 0, sess.srv.nowMicros())
		if !found {
			b.mu.Unlock()
			return nil
		}
		// The new mapping starts write-protected everywhere: a page with
		// several copies must never be writable, and one may get a second
		// copy while the remap is in flight, protected by then only in the
		// old mapping. A page with one copy costs a write-protect fault on
		// its first write, which lifts the protection.
		var wp PageMask
		wp.FillRange(0, outer-first)
		b.setMapping(l, first, outer, to, true, sess.srv.locations())
		b.mu.Unlock()

		err := v.requestLocked(encodeDeviceMap(v.seq.Add(1), deviceMapRequest{
			addr: uint64(o.pageAddr(first)), length: uint64(outer-first) * PageSize, loc: uint8(to), wp: wp}), msgDeviceMap)

		b.mu.Lock()
		b.settle(l, first, outer, err == nil)
		if err == nil && to != l {
			r.countRemote(l, outer-first)
		}
		b.mu.Unlock()
		if err != nil {
			return fmt.Errorf("map %v's file over %#x+%d in device %d: %w", to.device(), o.pageAddr(first), (outer-first)*PageSize, l.device(), err)
		}
	}
	return nil
}

// remapRange brings every device view's mapping of [addr, addr+length)
// in line with policy and waits until it is.
func (sess *session) remapRange(r *managedRange, addr, length uintptr) error {
	var errs []error
	for l := 1; l < len(sess.views); l++ {
		for bi := int((addr - r.start) >> blockShift); bi <= int((addr+length-1-r.start)>>blockShift); bi++ {
			if err := sess.remapBlock(r, bi, location(l)); err != nil {
				errs = append(errs, err)
				break
			}
		}
	}
	return joinErrors(errs)
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
	l  location
}

func newRemapper() *remapper {
	return &remapper{pending: map[remapKey]struct{}{}, wake: make(chan struct{}, 1), quit: make(chan struct{})}
}

// enqueue asks for device view l's mapping of block bi to be reconciled.
func (q *remapper) enqueue(r *managedRange, bi int, l location) {
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
			sess.remaps.enqueue(r, bi, location(l))
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

// countRemote counts pages device view l came to map remotely.
func (r *managedRange) countRemote(l location, pages int) {
	r.stats.remoteMapped[l].Add(uint64(pages))
	r.sess.srv.stats.remoteMapped[l].Add(uint64(pages))
}
