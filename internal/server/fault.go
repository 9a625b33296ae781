package server

import (
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/softuvm/softuvm/devmem"
	"github.com/softuvm/softuvm/internal/core"
	"github.com/softuvm/softuvm/internal/wire"
	"github.com/softuvm/softuvm/policy"
	"github.com/softuvm/softuvm/trace"
	"github.com/softuvm/softuvm/uffd"
)

// errDeferred reports that a fault was left waiting on purpose (a
// throttled processor), to be served later.
var errDeferred = errors.New("fault deferred")

// maxPinWaits bounds how many naps a device's fault on a pinned page
// waits for the device to map the host copy before it is served by
// migration after all: the device's mapping changes only when its
// process runs, and the fault path never waits for it without a bound.
const maxPinWaits = 20

// faultRequest is one fault being served: the message, and how many
// times it was deferred already.
type faultRequest struct {
	msg   uffd.Msg
	kind  core.FaultKind
	write bool
	waits int  // naps already taken
	noNap bool // served once throttled: do not throttle again
	// started is when the read that returned the message returned: the
	// fault's service time counts from it. Messages are read in batches,
	// so it may be well before this one is served: a message read before
	// the range now at its address was made is stale.
	started time.Time
	// readFrom is when that read began. A message is copied out of the
	// kernel between readFrom and started, and the thread that raised it
	// cannot go on before it is copied (an unread message of a thread
	// that goes on is withdrawn). So a message whose read began before a
	// range was freed or launched may be stale: its thread may have gone
	// on and freed or launched. started cannot say so: the reader may be
	// preempted between the copy and the clock (seen on 2 CPUs: 450 us).
	// Treating such a message as stale only wakes its thread; if it still
	// waits it faults again, and the next read begins after the event.
	readFrom time.Time
}

func one(p int) core.PageMask {
	var m core.PageMask
	m.Set(p)
	return m
}

// faultRequestOf classifies a fault message.
// The read that returned it began at readFrom and returned at started.
func faultRequestOf(m *uffd.Msg, readFrom, started time.Time) faultRequest {
	fr := faultRequest{msg: *m, kind: core.FaultMissing, write: m.Flags&uffd.PagefaultWrite != 0, readFrom: readFrom, started: started}
	switch {
	case m.Flags&uffd.PagefaultWP != 0:
		fr.kind = core.FaultWP
	case m.Flags&uffd.PagefaultMinor != 0:
		fr.kind = core.FaultMinor
	}
	return fr
}

// faultPlan is what the decision step says to do with a fault.
type faultPlan int

const (
	planRefuse        faultPlan = iota + 1 // the host touched device memory: an error
	planLaunchRefuse                       // the launch coherence model forbids this touch: an error
	planHint                               // a MINOR fault on a remote mapping: the user-space counters' hint fault
	planContinue                           // a MINOR fault on the view's own file, which holds the page: map it
	planWaitMapping                        // defer: the view is being pointed at a file that holds the page
	planPending                            // the view's mapping is changing: install through it and look
	planWP                                 // a write to a write-protected page
	planWake                               // the page is where the view maps it already: install a zero page, which wakes
	planDuplicate                          // a read of a read-mostly page: copy it here, keep the others
	planThrottle                           // the thrashing policy throttles the processor: defer
	planPinToHost                          // pinned in host memory: bring it there, defer until the device maps it
	planMigrateAnyway                      // pinned, but the device never mapped the host copy: migrate, and say so
	planMigrate                            // migrate the page and what the prefetch policy adds
)

var planNames = [...]string{planRefuse: "refuse", planLaunchRefuse: "launch-refuse", planHint: "hint", planContinue: "continue", planWaitMapping: "wait-mapping", planPending: "pending",
	planWP: "write-protect", planWake: "wake", planDuplicate: "duplicate", planThrottle: "throttle",
	planPinToHost: "pin-to-host", planMigrateAnyway: "migrate-anyway", planMigrate: "migrate"}

func (p faultPlan) String() string {
	if p > 0 && int(p) < len(planNames) {
		return planNames[p]
	}
	return fmt.Sprintf("plan(%d)", int(p))
}

// faultFacts is what the decision step asks about a fault of a view on a
// page of a block. Each fact is computed when asked: some cost a look at
// every location's residency, and thrashing tells the thrashing policy
// about the fault, so the step asks them in the order and under the
// conditions that make them relevant.
type faultFacts interface {
	hostOnDeviceMemory() bool // the range is device memory and the view is the host's
	kind() core.FaultKind
	write() bool
	waitsLeft() bool // the fault may be deferred once more
	noNap() bool     // the fault was throttled once already
	// mapping is the location whose file the view maps over the page,
	// and whether that is known (not changing).
	mapping() (m core.Device, known bool)
	ownFileHolds() bool // the view is being pointed at its own file, which holds the page
	residentAt(loc core.Device) bool
	viewLocation() core.Device
	desiredFile() core.Device // where policy wants the view to map the page
	source() (src core.Device, populated bool)
	readMostly() bool
	// cleanCopy: clean eviction applies to the page: the host reads it
	// back from a device, and its device copy may stay (cleanCopy).
	cleanCopy() bool
	thrashing() thrashAction
	// Under the launch coherence model: the touch is forbidden (the CPU
	// during a kernel that may use the page, a kernel on memory no launch
	// of its device took), or the host view's fault is served by a copy
	// the device keeps.
	launchRefused() bool
	launchCopy() bool
}

// decideFault is the fault path's decision: from the fault, the block's
// state and the policies' hints, what to do. It changes nothing but what
// the thrashing policy records when asked.
func decideFault(f faultFacts) faultPlan {
	if f.hostOnDeviceMemory() {
		return planRefuse
	}
	if f.launchRefused() {
		return planLaunchRefuse
	}
	if f.kind() == core.FaultMinor {
		// Device views' remote mappings register MINOR faults for the
		// user-space fallback's hint faults; every view whose file
		// takes large folios registers them over its own file too, so
		// that a block written there whole is mapped with one
		// UFFDIO_CONTINUE (continue.go).
		m, known := f.mapping()
		switch {
		case !known && f.waitsLeft():
			// The view is being pointed at another file, and the fault
			// may have come through either. Through its own file, the
			// page may be a stray one (a large folio made it present,
			// the table has it elsewhere), which must not be mapped:
			// wait until the mapping is known.
			return planWaitMapping
		case !known || m != f.viewLocation():
			return planHint
		case f.residentAt(m):
			return planContinue
		}
		// The view's own file has the page but the table has it
		// elsewhere, or nowhere: a stray page. Serve it as a missing
		// one; the install writes over it (install).
	}
	m, known := f.mapping()
	if !known {
		if f.ownFileHolds() && f.waitsLeft() {
			// The fault came through the old mapping: wait for the new
			// one rather than take the page back.
			return planWaitMapping
		}
		return planPending
	}
	if f.kind() == core.FaultWP {
		return planWP
	}
	if f.residentAt(m) {
		// Believed present in the file the view maps, but the view
		// faulted: a race with another handler (the page exists now),
		// or the process punched it (it reads as zeros again).
		return planWake
	}
	l := f.viewLocation()
	if m != l && f.residentAt(l) && f.waitsLeft() && f.desiredFile() == l {
		// The page came to this processor (a delayed migration, a
		// prefetch) while the view still maps where it was: taking it
		// back would undo the move; wait for the remapper.
		return planWaitMapping
	}
	src, populated := f.source()
	if populated && (f.launchCopy() || !f.write() && (f.readMostly() || f.cleanCopy())) {
		return planDuplicate
	}
	if populated && src != m && !f.noNap() {
		switch f.thrashing() {
		case thrashThrottle:
			return planThrottle
		case thrashPinned:
			// Pinned in host memory: bring it there and wait for the
			// device to map the host copy, unless policy keeps the
			// device on its own file.
			if m != core.CPU && f.desiredFile() == core.CPU {
				if f.waitsLeft() {
					return planPinToHost
				}
				return planMigrateAnyway
			}
		}
	}
	return planMigrate
}

// moverFacts answers faultFacts from a mover's block, for the fault fr
// of view o.fv on page p. The block's lock is held.
type moverFacts struct {
	o   *mover
	p   int
	fr  *faultRequest
	now int64 // the server's clock, read at the first fact that needs it
}

func (f *moverFacts) clock() int64 {
	if f.now == 0 {
		f.now = f.o.sess.srv.nowMicros()
	}
	return f.now
}

func (f *moverFacts) hostOnDeviceMemory() bool {
	return f.o.r.kind == core.KindDevice && f.o.fv.loc == core.CPU
}
func (f *moverFacts) kind() core.FaultKind            { return f.fr.kind }
func (f *moverFacts) write() bool                     { return f.fr.write }
func (f *moverFacts) waitsLeft() bool                 { return f.fr.waits < maxPinWaits }
func (f *moverFacts) noNap() bool                     { return f.fr.noNap }
func (f *moverFacts) mapping() (core.Device, bool)    { return f.o.mapsAt(f.o.fv.loc, f.p) }
func (f *moverFacts) residentAt(loc core.Device) bool { return f.o.b.resident[loc.Slot()].Test(f.p) }
func (f *moverFacts) viewLocation() core.Device       { return f.o.fv.loc }
func (f *moverFacts) desiredFile() core.Device        { return f.o.desiredFile(f.o.fv.loc, f.p, f.clock()) }
func (f *moverFacts) source() (core.Device, bool)     { return f.o.b.locationOfPage(f.p) }
func (f *moverFacts) thrashing() thrashAction         { return f.o.checkThrashing(f.o.fv.loc, f.p, f.clock()) }
func (f *moverFacts) ownFileHolds() bool {
	l := f.o.fv.loc
	return fileOf(f.o.b.maps[l.Slot()].file[f.p], l) == l && f.o.b.resident[l.Slot()].Test(f.p)
}
func (f *moverFacts) launchRefused() bool { return f.o.launchRefused() }
func (f *moverFacts) launchCopy() bool    { return f.o.launchCopy(f.p) }
func (f *moverFacts) readMostly() bool {
	adv := f.o.b.advice
	return adv != nil && adv.readMostly.Test(f.p)
}
func (f *moverFacts) cleanCopy() bool { return f.o.cleanCopy(f.p) }

// serveFault resolves a fault of view o.fv on page p, bringing
// prefetched pages along: it decides (decideFault), then carries the
// plan out; account records what moved. The view maps some file over p
// (its own, or another location's: a remote mapping), and the page is
// brought into that file.
func (o *mover) serveFault(p int, fr *faultRequest) error {
	facts := moverFacts{o: o, p: p, fr: fr}
	plan := decideFault(&facts)
	switch plan {
	case planRefuse:
		return fmt.Errorf("%w: the host touched device memory (allocated with Malloc on device %d), which only kernels can reach; use Memcpy", core.ErrInvalidValue, o.r.owner)
	case planLaunchRefuse:
		if o.launchStale(fr) {
			o.wake(o.pageAddr(p))
			return nil
		}
		return o.launchRefusal(p)
	case planHint:
		return o.serveHintFault(p)
	case planContinue:
		return o.serveContinue(p)
	case planWaitMapping, planThrottle:
		return errDeferred
	case planPending:
		return o.servePending(p)
	case planWP:
		m, _ := o.mapsAt(o.fv.loc, p)
		return o.serveWP(p, m)
	case planWake:
		done, found, err := o.install(o.fv, installZero, p, p+1, nil, false)
		if err == nil && done.Test(p) && !found.Test(p) {
			o.lostPage(p)
		}
		return err
	}
	l := o.fv.loc
	m, _ := o.mapsAt(l, p)
	var faulted core.PageMask
	faulted.Set(p)
	o.demand = faulted
	t := target{dst: m, via: o.fv, mapped: o.pagesMapping(l, m)}
	if l == core.CPU && fr.write {
		o.b.hostWrote.Set(p)
	}
	switch plan {
	case planDuplicate:
		extra := o.expand(l, m, faulted, &t)
		if o.launchCopy(p) {
			extra = o.launchCopyExtra(extra)
			faulted.Or(&extra)
			return o.duplicate(t, faulted)
		}
		if !facts.readMostly() {
			return o.serveCleanCopies(t, faulted, extra, p, true)
		}
		extra.And(&o.b.advice.readMostly)
		var populatedPages core.PageMask
		for x := range o.b.resident {
			populatedPages.Or(&o.b.resident[x])
		}
		extra.And(&populatedPages)
		faulted.Or(&extra)
		return o.duplicate(t, faulted)
	case planPinToHost:
		host := o.ownTarget(core.CPU)
		err := o.moveTo(host, faulted, core.PageMask{}, -1)
		o.doneWith(host.via)
		if err != nil {
			return err
		}
		return errDeferred
	case planMigrateAnyway:
		o.sess.srv.logger.Printf("pid %d device %d: page %#x is pinned in host memory but the device has not mapped it after %d naps; migrating it", o.sess.pid, l, o.pageAddr(p), maxPinWaits)
	}
	extra := o.expand(l, m, faulted, &t)
	// Where the page comes from, asked only where read-ahead may follow:
	// after the move it is here.
	var from core.Device
	populated := false
	if o.readAhead != 0 && l == core.CPU && m == l {
		from, populated = o.b.locationOfPage(p)
	}
	var err error
	if m == core.CPU && o.cleanCopies() {
		err = o.serveCleanCopies(t, faulted, extra, p, false)
	} else {
		o.cause = policy.CauseFault
		err = o.moveTo(t, faulted, extra, p)
	}
	if err == nil && populated && from != core.CPU {
		o.r.readAheadFrom(from, o.blockIndex(), o.readAhead)
	}
	return err
}

// sweepState is what a range keeps per location to tell sweeps: the
// pages (of the range, plus one; zero: none) the location's last fault
// brought, first and last, and the run of faults that landed just past
// them: counted up while they ascend, down while they descend. Without a
// lock: two faults at once may miss each other's note, which only delays
// a sweep by a fault.
type sweepState struct {
	lo, hi atomic.Int64
	run    atomic.Int32
}

// sweep reports whether location m's fault at page p of the mover's block
// continues a sweep (policy.SweepStep, PrefetchContext.Sweep); full says
// that m has no room to spare.
func (o *mover) sweep(m core.Device, p int, full bool) (sweeping, descending bool) {
	l := m.Slot()
	if l >= len(o.r.sweeps) {
		return false, false
	}
	st := &o.r.sweeps[l]
	page := int64(o.pageAddr(p)-o.r.start) >> core.PageShift
	n, sweeping := policy.SweepStep(st.lo.Load()-1, st.hi.Load()-1, st.run.Load(), page, full)
	st.run.Store(n)
	return sweeping, n < 0
}

// noteFetch records the pages of the block that location m's fault
// brings, faulted and prefetched, for the next fault's sweep.
func (o *mover) noteFetch(m core.Device, pages core.PageMask) {
	first, last := pages.NextSet(0), pages.LastSet()
	if l := m.Slot(); l < len(o.r.sweeps) && first >= 0 {
		o.r.sweeps[l].lo.Store(int64(o.pageAddr(first)-o.r.start)>>core.PageShift + 1)
		o.r.sweeps[l].hi.Store(int64(o.pageAddr(last)-o.r.start)>>core.PageShift + 1)
	}
}

// expand asks the range's prefetch policy which other pages to bring to
// file m with the faulted ones, keeping those the view maps from m.
func (o *mover) expand(l, m core.Device, faulted core.PageMask, t *target) core.PageMask {
	b := o.b
	ctx := &policy.PrefetchContext{}
	if o.h != nil {
		ctx = &o.h.prefetchCtx
	}
	full := !o.sess.srv.roomFor(m, policy.FullRoomBlocks*core.BlockSize)
	elsewhere, here := b.resident.Elsewhere(m), b.resident[m.Slot()]
	*ctx = policy.PrefetchContext{Pages: b.pages, Faulted: faulted, ResidentOnDest: here, Populated: !elsewhere.Empty() || !here.Empty(),
		Elsewhere: elsewhere, Full: full, SourceLarge: o.largeElsewhere(m)}
	ctx.Sweep, ctx.Descending = o.sweep(m, faulted.NextSet(0), full)
	if adv := b.advice; adv != nil {
		p := faulted.NextSet(0)
		ctx.DestIsPreferred = adv.preferred[p].Is(m)
	}
	if th := o.sess.srv.thrashing; th != nil && b.thrash != nil {
		th.Avoid(b.thrash, b.pages, clock(o.sess.srv.nowMicros()), &ctx.Thrashing)
	}
	extra, brought := policy.Expanded(o.r.prefetch, ctx)
	o.noteFetch(m, brought)
	if policy.ReadsAhead(o.r.prefetch, ctx, brought) {
		o.readAhead = 1
		if ctx.Descending {
			o.readAhead = -1
		}
	}
	extra.And(&t.mapped)
	return extra
}

// serveWP resolves a write to a write-protected page that view o.fv maps
// from file m.
func (o *mover) serveWP(p int, m core.Device) error {
	b := o.b
	v := o.fv
	addr := o.pageAddr(p)
	if !b.resident[m.Slot()].Test(p) {
		// The page left while the writer waited; its retry faults as
		// missing and brings it back.
		o.wake(addr)
		return nil
	}
	if b.copies(p) > 1 {
		// A write to a read-duplicated page: this copy becomes the only
		// one, and writable (collapseTo lifts the protection of every
		// mapping of it, which wakes the writer). A host copy written
		// is not made a clean copy again (cleanCopy).
		if v.loc == core.CPU {
			b.hostWrote.Set(p)
		}
		var one core.PageMask
		one.Set(p)
		o.collapseTo(m, one)
		return nil
	}
	// A migration protected the page and did not take it, or a stale
	// protection survived a move: give write access back (this also
	// wakes the writer).
	o.ioctlBegins()
	err := v.uffd.WriteProtect(addr, core.PageSize, false, false)
	o.ioctlEnds()
	if err != nil {
		o.wake(addr)
	}
	return nil
}

// servePending serves a fault on a page whose mapping in the view is
// changing: the view maps the old file or the new one, and the server
// cannot tell which. It installs the page through the view, which puts it
// in whichever file is mapped, and then looks at the files to learn
// which one got it.
func (o *mover) servePending(p int) error {
	b := o.b
	v := o.fv
	l := v.loc
	vm := b.maps[l.Slot()]
	oldFile, newFile := fileOf(vm.was[p], l), fileOf(vm.file[p], l)
	var one core.PageMask
	one.Set(p)
	o.collapseAll(one)
	src, populated := b.locationOfPage(p)
	// Reserve room wherever the page may land.
	var reserved []core.Device
	for _, c := range []core.Device{oldFile, newFile} {
		if c == core.CPU || (populated && c == src) || (len(reserved) == 1 && reserved[0] == c) {
			continue
		}
		if err := o.reserve(c, 1, one); err != nil {
			for _, x := range reserved {
				o.sess.srv.arenas[x].Release(1)
				o.settled(x)
			}
			return err
		}
		reserved = append(reserved, c)
	}
	defer func() {
		for _, x := range reserved {
			o.settled(x)
		}
	}()
	if o.sess.tracing() {
		o.runStarted = time.Now()
	}
	landed, moved, err := o.installPending(p, src, populated, oldFile, newFile)
	for _, x := range reserved {
		if !moved || x != landed {
			o.sess.srv.arenas[x].Release(1)
		}
	}
	if err != nil || !moved {
		return err
	}
	// The destination's arena was charged by the reservation, the
	// source's released by installPending.
	rn := run{first: p, outer: p + 1, src: src, populated: populated}
	o.cause = policy.CauseFault
	o.account(rn, one, landed, core.PageMask{})
	return nil
}

// installPending installs page p through the view and returns the
// location whose file received it, and whether it moved there. As in
// transfer, the source copy is punched before the install wakes the
// faulting thread, and put back if the page did not move.
func (o *mover) installPending(p int, src core.Device, populated bool, oldFile, newFile core.Device) (core.Device, bool, error) {
	v := o.fv
	var holders []*view
	addr := o.pageAddr(p)
	off := o.fileOff(p)
	var done, found core.PageMask
	var err error
	var srcFile *devmem.File
	slot, doneWithSlot := o.staging()
	defer doneWithSlot()
	buf := slot[:core.PageSize]
	if populated {
		if srcFile, err = o.sess.file(src); err != nil {
			return 0, false, err
		}
		holders = o.holders(src, p, p+1)
		defer o.doneWithAll(holders)
		for _, h := range holders {
			if err := o.writeProtect(h, addr, core.PageSize); err != nil {
				return 0, false, err
			}
		}
		if _, err := srcFile.ReadAt(buf, off); err != nil {
			o.release(holders, addr, core.PageSize, true)
			return 0, false, err
		}
		if src == core.CPU {
			var one core.PageMask
			one.Set(p)
			o.auditLeaving(run{first: p, outer: p + 1, src: src, populated: true}, one)
		}
		// Until it is installed or put back, the page is only in buf
		// (staging.go).
		area := o.sess.srv.staging
		area.mark(buf, o.sess.id, off, core.PageSize)
		defer area.clear(buf)
		if err := o.punchPages(src, srcFile, p, p+1); err != nil {
			o.release(holders, addr, core.PageSize, true)
			return 0, false, err
		}
		o.sess.srv.afterPunch()
		done, found, err = o.install(v, installCopy, p, p+1, buf, false)
	} else {
		done, found, err = o.install(v, installZero, p, p+1, nil, false)
	}
	// Which candidate file received the page?
	landed := oldFile
	if f, ferr := o.sess.file(newFile); ferr == nil {
		if ext, _ := f.DataExtents(off, core.PageSize); len(ext) > 0 {
			landed = newFile
		}
	}
	moved := err == nil && !done.Empty() && found.Empty() && !(populated && landed == src)
	if populated && !moved {
		if landed != src || err != nil || !found.Empty() {
			// Put the source copy back where it was.
			if _, werr := srcFile.WriteAt(buf, off); werr != nil {
				o.sess.srv.logger.Printf("put back %#x after a failed migration: %v (the data is lost)", addr, werr)
			}
		}
		o.release(holders, addr, core.PageSize, true)
		return 0, false, err
	}
	if !moved {
		return 0, false, err
	}
	if populated {
		o.released(src, one(p))
		o.release(holders, addr, core.PageSize, false)
	}
	return landed, true, nil
}

// lostPage records that page p, resident in the file the faulting view
// maps by the table, was missing from it, so a zero page took its place.
// A process that punched its own page (fallocate, MADV_REMOVE) meant
// that; anything else is a server bug, which this makes loud.
func (o *mover) lostPage(p int) {
	o.sess.srv.lostPages.Add(1)
	m, _ := o.mapsAt(o.fv.loc, p)
	o.sess.srv.logger.Printf("pid %d location %d: lost page %#x: resident in location %d's file by the table but missing from it, it reads as zeros (unless the program punched it)", o.sess.pid, o.fv.loc, o.pageAddr(p), m)
}

func (o *mover) wake(addr uintptr) {
	_ = o.fv.uffd.Wake(addr, core.PageSize) // nothing waiting, or the process is gone: fine
}

// failFault makes sure a thread whose fault could not be served does not
// wait forever: its page is poisoned, so the access raises SIGBUS.
func (o *mover) failFault(addr uintptr, err error) {
	if errors.Is(err, uffd.ErrProcessGone) || errors.Is(err, uffd.ErrNoEntry) {
		return // the process is exiting or unmapped the range: nobody waits
	}
	v := o.fv
	srv := o.sess.srv
	// The thread is woken only after the log line is written: it dies
	// of the SIGBUS at once, and whoever reads the log after its exit
	// must find why.
	_, perr := v.uffd.Poison(addr, core.PageSize, true)
	if errors.Is(perr, uffd.ErrExist) {
		// A write-protect marker left where a protected page was
		// punched (a page that moved away): clear it, and poison.
		_ = v.uffd.WriteProtect(addr, core.PageSize, false, true)
		_, perr = v.uffd.Poison(addr, core.PageSize, true)
	}
	if perr == nil {
		srv.poisoned.Add(1)
		srv.logger.Printf("pid %d %v: fault at %#x could not be served (%v); page poisoned (SIGBUS)", v.pid, v.loc, addr, err)
		o.wake(addr)
		return
	}
	o.wake(addr)
	srv.logger.Printf("pid %d %v: fault at %#x could not be served: %v (and poisoning the page failed: %v)", v.pid, v.loc, addr, err, perr)
}

// serveFaultMsg serves one page fault of view v, on handler h or (h nil)
// on a goroutine of its own. It returns with the fault resolved, failed
// (the page poisoned) or deferred.
func (sess *session) serveFaultMsg(v *view, h *handler, fr *faultRequest) {
	srv := sess.srv
	addr := uintptr(fr.msg.Address) &^ core.PageOffsetMask
	if h == nil && !sess.live(v) {
		return // a deferred fault of a view that went away, and its thread with it
	}
	r := sess.ranges.Load().lookup(addr)
	if r == nil {
		sess.stray(v, addr, fr.readFrom)
		return
	}
	if fr.started.Before(r.born) {
		// Raised on a range freed since, whose thread the free (or the
		// fault that resolved its page) woke; if it still waits, it
		// faults again on the new range.
		_ = v.uffd.Wake(addr, core.PageSize)
		return
	}
	if d := srv.cfg.FaultDelay; d > 0 && fr.waits == 0 {
		time.Sleep(time.Duration(d))
	}
	off := addr - r.start
	// Before the block's lock, which a read-ahead of this block may hold
	// while it moves it: the next one starts meanwhile.
	if v.loc == core.CPU {
		r.readAheadReached(int(off >> core.BlockShift))
	}
	b := r.block(int(off >> core.BlockShift))
	b.mu.Lock()
	if r.freed.Load() {
		b.mu.Unlock()
		_ = v.uffd.Wake(addr, core.PageSize)
		return
	}
	if h == nil {
		// A deferred fault holds no reference on its view: take one,
		// under the block lock, as every user other than the view's
		// own handlers does.
		if ref := sess.viewRef(v.loc); ref != v {
			ref.release()
			b.mu.Unlock()
			return // the view is gone, and the faulting thread with it
		} else {
			defer ref.release()
		}
	}
	op := mover{sess: sess, r: r, b: b, blockAddr: r.start + off&^(core.BlockSize-1), fv: v, h: h}
	if h != nil {
		op.runBuf = h.runBuf[:0]
	}
	err := op.serveFault(int(off>>core.PageShift)&(core.PagesPerBlock-1), fr)
	switch {
	case errors.Is(err, errDeferred):
		b.mu.Unlock()
		later := *fr // fr may be the handler's, reused for its next fault
		later.waits++
		later.noNap = later.waits > maxPinWaits
		time.AfterFunc(srv.thrashing.Nap(), func() { sess.serveFaultMsg(v, nil, &later) })
		return
	case err != nil:
		op.failFault(addr, err)
	}
	// Counted before the block is unlocked: a statistics query takes the
	// block locks, so it never sees a served fault uncounted. A deferred
	// fault counts once, when served, with the time it waited.
	elapsed := time.Since(fr.started)
	r.stats.Faults[v.loc.Slot()][fr.kind].Add(1)
	r.stats.Service.Record(elapsed)
	b.mu.Unlock()
	if sess.tracing() {
		e := trace.Event{Kind: trace.KindFault, PID: int32(v.pid), Thread: int32(fr.msg.TID), Processor: int32(v.loc), Range: r.id,
			Addr: uint64(addr), FaultKind: trace.FaultKind(fr.kind), Write: fr.write, Duration: elapsed, Prefetched: uint32(op.prefetched)}
		sess.emitAt(&e, fr.started)
	}
}

// stray handles a fault on an address no range owns. A stale message (the
// range was freed and unmapped, or freed after the message was read: its
// thread was woken by the fault that resolved the page, or by the free)
// only needs a wake; a registered mapping the server does not know (freed
// but not yet unmapped, or moved by mremap) gets the page poisoned, so
// that the thread sees SIGBUS instead of faulting forever.
func (sess *session) stray(v *view, addr uintptr, read time.Time) {
	srv := sess.srv
	srv.strayFaults.Add(1)
	if sess.freedSince(addr, read) {
		_ = v.uffd.Wake(addr, core.PageSize)
		return
	}
	_, err := v.uffd.Poison(addr, core.PageSize, false)
	switch {
	case err == nil:
		srv.poisoned.Add(1)
		srv.logger.Printf("pid %d faulted at %#x, which no allocation owns; the page is poisoned (SIGBUS)", v.pid, addr)
	case errors.Is(err, uffd.ErrNoEntry), errors.Is(err, uffd.ErrProcessGone), errors.Is(err, uffd.ErrExist):
		_ = v.uffd.Wake(addr, core.PageSize)
	default:
		_ = v.uffd.Wake(addr, core.PageSize)
		srv.logger.Printf("pid %d stray fault at %#x: %v", v.pid, addr, err)
	}
}

// drainEvents reads what is pending on view v's userfaultfd without
// waiting: events are handled at once, faults are served on goroutines
// of their own.
func (sess *session) drainEvents(v *view) {
	var msgs [8]uffd.Msg
	for {
		from := time.Now()
		n, _ := v.uffd.ReadMessagesNoWait(msgs[:])
		if n == 0 {
			return
		}
		now := time.Now()
		for i := 0; i < n; i++ {
			m := &msgs[i]
			if m.Event == uffd.EventPagefault {
				fr := faultRequestOf(m, from, now)
				go sess.serveFaultMsg(v, nil, &fr)
				continue
			}
			sess.event(v, m)
		}
	}
}

// event handles a non-fault message of view v.
func (sess *session) event(v *view, m *uffd.Msg) {
	switch m.Event {
	case uffd.EventRemap:
		if v.loc == core.CPU {
			sess.remapped(uintptr(m.From), uintptr(m.To), uintptr(m.Len))
		}
		// A device's remaps are the server's own requests: the reply
		// settles them.
	case uffd.EventFork:
		// Managed ranges are MADV_DONTFORK and the server does not ask
		// for fork events; a child's userfaultfd would have nobody to
		// serve it.
		wire.CloseFDs([]int{m.ChildFD})
	default:
		// Unmap and remove events are not requested.
	}
}

// live reports whether v is still its location's view.
func (sess *session) live(v *view) bool {
	ref := sess.viewRef(v.loc)
	ref.release()
	return ref == v
}
