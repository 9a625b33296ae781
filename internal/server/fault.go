package server

import (
	"errors"
	"fmt"
	"math/bits"
	"slices"
	"time"

	"github.com/softuvm/softuvm/devmem"
	"github.com/softuvm/softuvm/internal/block"
	"github.com/softuvm/softuvm/internal/core"
	"github.com/softuvm/softuvm/internal/wire"
	"github.com/softuvm/softuvm/policy"
	"github.com/softuvm/softuvm/uffd"
)

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

// servePending serves a fault of view v on page p of the mover's block,
// whose mapping in the view is changing or not known: the view maps the
// old file or the new one (or, adopted by a takeover, any location's),
// and the server cannot tell which. It installs the page through the
// view, which puts it in whichever file is mapped, and then looks at the
// files to learn which one got it.
func (sess *session) servePending(o *block.Mover, v *view, p int) error {
	b := o.B
	l := v.loc
	candidates := o.PendingFiles(l, p)
	var one core.PageMask
	one.Set(p)
	o.CollapseAll(one)
	src, populated := b.LocationOf(p)
	// Reserve room wherever the page may land.
	var reserved []core.Device
	for _, c := range candidates {
		if c == core.CPU || (populated && c == src) || slices.Contains(reserved, c) {
			continue
		}
		if err := o.Reserve(c, 1, one); err != nil {
			for _, x := range reserved {
				sess.srv.arenas[x].Release(1)
				o.Settled(x)
			}
			return err
		}
		reserved = append(reserved, c)
	}
	defer func() {
		for _, x := range reserved {
			o.Settled(x)
		}
	}()
	if sess.srv.eng.Timed() {
		o.RunStarted = time.Now()
	}
	landed, moved, err := sess.installPending(o, v, p, src, populated, candidates)
	for _, x := range reserved {
		if !moved || x != landed {
			sess.srv.arenas[x].Release(1)
		}
	}
	if err != nil || !moved {
		return err
	}
	// The destination's arena was charged by the reservation, the
	// source's released by installPending.
	o.Cause = policy.CauseFault
	o.Account(block.Run{First: p, Outer: p + 1, Src: src, Populated: populated}, one, landed, core.PageMask{})
	return nil
}

// installPending installs page p through view v, which maps one of the
// candidates' files there, and returns the location whose file received
// it, and whether it moved there. As in transfer, the source copy is
// punched before the install wakes the faulting thread, and put back if
// the page did not move.
func (sess *session) installPending(o *block.Mover, v *view, p int, src core.Device, populated bool, candidates []core.Device) (core.Device, bool, error) {
	var holders []block.View
	addr := o.PageAddr(p)
	off := o.FileOff(p)
	var done, found core.PageMask
	var err error
	var landed core.Device
	var ok bool
	var srcFile *devmem.File
	slot, doneWithSlot := sess.stagingBuf(o)
	defer doneWithSlot()
	buf := slot[:core.PageSize]
	letGo := func(unprotect bool) {
		for _, h := range holders {
			if unprotect {
				sess.Unprotect(o, h, p, p+1)
			} else {
				sess.Wake(o, h, p, p+1)
			}
		}
	}
	if populated {
		if srcFile, err = sess.file(src); err != nil {
			return 0, false, err
		}
		holders = o.Holders(src, p, p+1)
		defer o.DoneWithAll(holders)
		for _, h := range holders {
			if err := sess.writeProtect(h.(*view), addr, core.PageSize); err != nil {
				return 0, false, err
			}
		}
		if _, err := srcFile.ReadAt(buf, off); err != nil {
			letGo(true)
			return 0, false, err
		}
		if src == core.CPU {
			var one core.PageMask
			one.Set(p)
			o.AuditLeaving(one)
		}
		// Until it is installed or put back, the page is only in buf
		// (staging.go).
		area := sess.srv.staging
		area.Mark(buf, sess.id, off, core.PageSize)
		defer area.Clear(buf)
		if err := o.PunchPages(src, p, p+1); err != nil {
			letGo(true)
			return 0, false, err
		}
		sess.srv.afterPunch()
		before := sess.filesHolding(candidates, off)
		done, found, err = sess.install(o, v, installCopy, p, p+1, buf, false)
		landed, ok = sess.landedIn(candidates, off, before)
	} else {
		before := sess.filesHolding(candidates, off)
		done, found, err = sess.install(o, v, installZero, p, p+1, nil, false)
		landed, ok = sess.landedIn(candidates, off, before)
	}
	installed := err == nil && ok && !done.Empty() && found.Empty()
	moved := installed && !(populated && landed == src)
	if populated && !moved {
		if !installed {
			// Put the source copy back where it was.
			if _, werr := srcFile.WriteAt(buf, off); werr != nil {
				sess.srv.logger.Printf("put back %#x after a failed migration: %v (the data is lost)", addr, werr)
			}
		}
		letGo(true)
		return 0, false, err
	}
	if !moved {
		return 0, false, err
	}
	if populated {
		var one core.PageMask
		one.Set(p)
		o.Released(src, one)
		letGo(false)
	}
	return landed, true, nil
}

// filesHolding returns which of the candidates' files hold the page at
// offset off (bit i for candidates[i]).
func (sess *session) filesHolding(candidates []core.Device, off int64) uint64 {
	var held uint64
	for i, c := range candidates {
		if f, err := sess.file(c); err == nil && f != nil {
			if ext, _ := f.DataExtents(off, core.PageSize); len(ext) > 0 {
				held |= 1 << i
			}
		}
	}
	return held
}

// landedIn returns the candidate whose file holds the page at offset off
// and did not before an install (before: filesHolding's answer then),
// and false if none or several do: then nothing is known of where it
// went.
func (sess *session) landedIn(candidates []core.Device, off int64, before uint64) (core.Device, bool) {
	gained := sess.filesHolding(candidates, off) &^ before
	if gained == 0 || gained&(gained-1) != 0 {
		return 0, false
	}
	return candidates[bits.TrailingZeros64(gained)], true
}

// failFault makes sure a thread of view v whose fault could not be
// served does not wait forever: its page is poisoned, so the access
// raises SIGBUS.
func (sess *session) failFault(v *view, addr uintptr, err error) {
	if errors.Is(err, uffd.ErrProcessGone) || errors.Is(err, uffd.ErrNoEntry) {
		return // the process is exiting or unmapped the range: nobody waits
	}
	srv := sess.srv
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
		_ = v.uffd.Wake(addr, core.PageSize)
		return
	}
	_ = v.uffd.Wake(addr, core.PageSize)
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
	off := addr - r.Start
	bi := int(off >> core.BlockShift)
	// Before the block's lock, which a read-ahead of this block may hold
	// while it moves it: the next one starts meanwhile.
	r.ReadAheadReached(v.loc, bi)
	b := r.Block(bi)
	b.Lock()
	if r.Freed.Load() {
		b.Unlock()
		_ = v.uffd.Wake(addr, core.PageSize)
		return
	}
	if h == nil {
		// A deferred fault holds no reference on its view: take one,
		// under the block lock, as every user other than the view's
		// own handlers does.
		if ref := sess.viewRef(v.loc); ref != v {
			ref.release()
			b.Unlock()
			return // the view is gone, and the faulting thread with it
		} else {
			defer ref.release()
		}
	}
	o := r.NewMover(bi, b)
	o.FV = v
	if h != nil {
		o.Thread = h
		o.Use(&h.scratch)
	}
	p := int(off>>core.PageShift) & (core.PagesPerBlock - 1)
	f := block.Fault{Kind: fr.kind, Write: fr.write, Waits: fr.waits, NoNap: fr.noNap}
	plan, err := o.ServeFault(p, &f)
	switch plan {
	case block.PlanRefuse:
		err = fmt.Errorf("%w: the host touched device memory (allocated with Malloc on device %d), which only kernels can reach; use Memcpy", core.ErrInvalidValue, r.Owner)
	case block.PlanLaunchRefuse:
		if sess.launchStale(v, r, fr) {
			_ = v.uffd.Wake(addr, core.PageSize)
		} else {
			err = sess.launchRefusal(v, r, o.PageAddr(p))
		}
	case block.PlanHint:
		err = sess.serveHintFault(&o, v, p)
	case block.PlanPending:
		err = sess.servePending(&o, v, p)
	}
	switch {
	case errors.Is(err, block.ErrDeferred):
		b.Unlock()
		later := *fr // fr may be the handler's, reused for its next fault
		later.waits++
		later.noNap = later.waits > srv.eng.Mechanism().PinWaits
		time.AfterFunc(srv.eng.Nap(), func() { sess.serveFaultMsg(v, nil, &later) })
		return
	case err != nil:
		sess.failFault(v, addr, err)
	}
	// Counted before the block is unlocked: a statistics query takes the
	// block locks, so it never sees a served fault uncounted. A deferred
	// fault counts once, when served, with the time it waited.
	o.Served(p, &f, plan, block.Event{Failed: err != nil, Thread: int32(fr.msg.TID), Started: fr.started, Duration: time.Since(fr.started)})
	b.Unlock()
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
