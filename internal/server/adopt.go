package server

import (
	"fmt"
	"net"
	"os"
	"os/signal"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/softuvm/softuvm/devmem"
	"github.com/softuvm/softuvm/internal/config"
	"github.com/softuvm/softuvm/internal/core"
	"github.com/softuvm/softuvm/internal/device"
	"github.com/softuvm/softuvm/internal/guard"
	"github.com/softuvm/softuvm/internal/wire"
	"github.com/softuvm/softuvm/trace"
	"github.com/softuvm/softuvm/uffd"
)

// runAdoptedServer is the main function of a server the guard started.
func RunAdoptedServer() int {
	if os.Getenv(config.AdoptFailEnv) != "" {
		fmt.Fprintf(os.Stderr, "softuvm server[%d]: %s is set: failing before the takeover\n", os.Getpid(), config.AdoptFailEnv)
		return 1
	}
	link, err := device.FileConn(3)
	if err != nil {
		fmt.Fprintf(os.Stderr, "softuvm server[%d]: guard link: %v\n", os.Getpid(), err)
		return 2
	}
	srv, paths, err := takeOver(link, nil)
	if err != nil {
		fmt.Fprintf(os.Stderr, "softuvm server[%d]: %v\n", os.Getpid(), err)
		return 1
	}
	if srv.mode == guard.ModeDaemon {
		srv.serveAsDaemon(paths, nil)
	} else {
		signal.Ignore(syscall.SIGINT, syscall.SIGHUP)
		own := config.PrivateServerSocketPath(os.Getpid())
		if l, err := ListenUnix(own); err == nil {
			go srv.Serve(l)
			paths = append(paths, own)
		}
		srv.waitIdle()
	}
	srv.Close()
	for _, p := range paths {
		os.Remove(p)
	}
	return 0
}

// listenerFromFD makes a listener of a listening socket received from the
// guard.
func listenerFromFD(fd int) (*net.UnixListener, error) {
	f := os.NewFile(uintptr(fd), "softuvm-listener")
	defer f.Close()
	l, err := net.FileListener(f)
	if err != nil {
		return nil, err
	}
	ul, ok := l.(*net.UnixListener)
	if !ok {
		l.Close()
		return nil, fmt.Errorf("not a unix socket")
	}
	ul.SetUnlinkOnClose(false)
	return ul, nil
}

// restartStats are the server's takeovers.
type restartStats struct {
	count          atomic.Uint64 // restarts of this server's line, this one included
	lastPause      atomic.Int64  // from the death to service resumed, ns
	adoptedPages   atomic.Int64  // pages found in the files
	recoveredPages atomic.Int64  // pages put back from the staging file
	settledMoves   atomic.Int64  // whole-block moves the staging file's intents finished or undid
	rebuild        atomic.Int64  // time to rebuild residency, ns
}

// adopt takes over the sessions in st.
func (s *Server) adopt(st *guard.State, died time.Time, restarts int) error {
	start := time.Now()
	var sessions []*session
	for _, id := range st.SessionIDs() {
		ks := st.Sessions[id]
		delete(st.Sessions, id)
		sess, err := s.adoptFiles(ks)
		if err != nil {
			s.logger.Printf("session %d (pid %d) cannot be adopted: %v", id, ks.PID, err)
			continue
		}
		sessions = append(sessions, sess)
		if id >= s.nextSessionID.Load() {
			s.nextSessionID.Store(id)
		}
	}
	byID := map[uint64]*session{}
	for _, sess := range sessions {
		byID[sess.id] = sess
	}
	recovered := s.recoverStaged(byID)
	var adopted int64
	for _, sess := range sessions {
		n, err := sess.rebuild()
		adopted += n
		if err != nil {
			s.logger.Printf("session %d (pid %d): %v", sess.id, sess.pid, err)
		}
	}
	rebuilt := time.Since(start)
	for _, sess := range sessions {
		sess.resume(restarts)
	}
	pause := time.Since(died)
	s.restart.count.Store(uint64(restarts))
	s.restart.lastPause.Store(int64(pause))
	s.restart.adoptedPages.Store(adopted)
	s.restart.recoveredPages.Store(recovered)
	s.restart.rebuild.Store(int64(rebuilt))
	return nil
}

// adoptFiles makes a session of what the guard kept: its descriptors and
// journal. Nothing runs for it yet.
func (s *Server) adoptFiles(ks *guard.Session) (*session, error) {
	conn, err := device.FileConn(uintptr(ks.Conn))
	ks.Conn = -1
	if err != nil {
		wire.CloseFDs([]int{ks.Uffd, ks.Host})
		return nil, fmt.Errorf("control socket: %v", err)
	}
	sess := s.newSession(ks.ID, ks.PID, wire.RoleClient, conn)
	host, err := devmem.FileFromFD(ks.Host, fmt.Sprintf("host file of pid %d", ks.PID))
	if err != nil {
		uffd.NewFD(ks.Uffd).Close()
		conn.Close()
		return nil, err
	}
	sess.host = host
	u := uffd.NewFD(ks.Uffd)
	u.SetHandshaken(uffd.Feature(ks.Features), 0)
	sess.views[core.CPU.Slot()].Store(&view{sess: sess, loc: core.CPU, pid: ks.PID, uffd: u})
	if _, launch := ks.Journal.LaunchModel(); launch || uffd.Feature(ks.Features)&uffd.FeatureWPAsync != 0 {
		// The journal says which model the session runs (and only
		// launch-model sessions ask for WP_ASYNC); its dirty tracking is
		// what the userfaultfd was granted, as at the hello. The kernels
		// running come back with the rest of the journal (rebuild).
		ls, err := s.newLaunchState(core.CoherenceLaunch, ks.PID)
		if err != nil {
			u.Close()
			host.Close()
			conn.Close()
			return nil, err
		}
		sess.launch = ls.settle(uffd.Feature(ks.Features))
	}
	sess.devFiles = make([]*devmem.File, len(s.arenas))
	for l, fd := range ks.Files {
		d := int(l)
		if d < 0 || d >= len(s.arenas) {
			syscall.Close(fd)
			continue
		}
		f, err := devmem.FileFromFD(fd, fmt.Sprintf("softuvm-dev%d-pid%d", d, ks.PID))
		if err != nil {
			s.logger.Printf("session %d: device %d file: %v", ks.ID, d, err)
			continue
		}
		sess.devFiles[d] = f
	}
	sess.journal = ks.Journal
	sess.adoptedViews = ks.Views
	return sess, nil
}

// recoverStaged writes back, into the host file, every page a migration
// carried when the server died that no location file holds: its source
// was punched and it never arrived. It returns the pages written.
func (s *Server) recoverStaged(byID map[uint64]*session) int64 {
	var n int64
	for _, mv := range s.staging.Moves() {
		sess := byID[mv.Session]
		if sess == nil {
			continue
		}
		// Unfinished: the source is whole, the destination perhaps
		// partly written; finished copying: the destination is whole.
		drop, keep := mv.Dst, mv.Src
		if mv.Copied {
			drop, keep = mv.Src, mv.Dst
		}
		f, err := sess.file(drop)
		if err == nil && f != nil {
			err = f.Punch(mv.Off, mv.Length)
		}
		if err != nil {
			s.logger.Printf("session %d: settle the move of %#x+%d from %v to %v, keeping %v's copy: %v", sess.id, mv.Off, mv.Length, mv.Src, mv.Dst, keep, err)
			continue
		}
		s.restart.settledMoves.Add(1)
	}
	for _, in := range s.staging.Intents() {
		sess := byID[in.Session]
		if sess == nil {
			continue
		}
		for p := 0; p < len(in.Data)/core.PageSize; p++ {
			off := in.Off + int64(p)*core.PageSize
			if sess.anyFileHolds(off) {
				continue
			}
			if _, err := sess.host.WriteAt(in.Data[p*core.PageSize:(p+1)*core.PageSize], off); err != nil {
				s.logger.Printf("session %d: put back the page at %#x that a migration carried: %v", sess.id, off, err)
				continue
			}
			n++
		}
	}
	s.staging.ClearAll()
	return n
}

// anyFileHolds reports whether a location file of the session holds the
// page at file offset off.
func (sess *session) anyFileHolds(off int64) bool {
	for l := 0; l < sess.srv.eng.Locations(); l++ {
		f := sess.host
		if l > 0 {
			f = sess.devFiles[l-1]
		}
		if f == nil {
			continue
		}
		if ext, err := f.DataExtents(off, core.PageSize); err == nil && len(ext) > 0 {
			return true
		}
	}
	return false
}

// rebuild restores the session's ranges from its journal and where their
// pages live from the files, and replays its advice. It returns the pages
// found.
func (sess *session) rebuild() (int64, error) {
	srv := sess.srv
	var pages int64
	recs := sess.journal.Records()
	sess.journal = guard.NewJournal()
	for _, rec := range recs {
		req, err := guard.DecodeRecord(rec)
		if err != nil {
			return pages, err
		}
		switch r := req.(type) {
		case wire.AllocRequest:
			mr, err := sess.restoreRange(r)
			if err != nil {
				srv.logger.Printf("session %d: range %#x+%d: %v", sess.id, r.Addr, r.Length, err)
				continue
			}
			pages += sess.residencyFromFiles(mr)
		case wire.AdviseRequest:
			if err := sess.advise(uintptr(r.Addr), uintptr(r.Length), core.Advice(r.Advice), core.Device(r.Device)); err != nil {
				srv.logger.Printf("session %d: replay %v on %#x+%d: %v", sess.id, core.Advice(r.Advice), r.Addr, r.Length, err)
			}
		case wire.StreamAttachRequest:
			if err := sess.streamAttach(r); err != nil {
				srv.logger.Printf("session %d: replay the attachment of %#x: %v", sess.id, r.Addr, err)
			}
		case wire.PeerAccessRequest:
			// The device processes kept what they mapped; a new one maps
			// what the table says.
			sess.peers.set(core.Device(r.Device), core.Device(r.Peer), true)
		case guard.Launch:
			if sess.launch != nil {
				sess.restoreLaunch(r)
			}
		case wire.TraceControlRequest:
			sess.profiler = &r // acted on by openSessionTrace
		}
		sess.journal.Apply(rec)
	}
	return pages, nil
}

// restoreRange makes a range the dead server had registered, as alloc
// did, without registering it again: the kernel kept the registration.
func (sess *session) restoreRange(r wire.AllocRequest) (*managedRange, error) {
	mr, err := sess.newRange(r)
	if err != nil {
		return nil, err
	}
	sess.mu.Lock()
	sess.nextID++
	mr.ID = sess.nextID
	sess.ranges.Store(sess.ranges.Load().with(mr))
	sess.countRange(mr)
	sess.mu.Unlock()
	if r.Kind == core.KindManaged {
		sess.stats.Allocations.Add(1)
		sess.stats.AllocatedBytes.Add(r.Size)
	}
	sess.traceAlloc(mr)
	return mr, nil
}

// residencyFromFiles sets where each page of mr lives from the location
// files: a page is resident where a file holds its data. It charges the
// arenas and the host budget as the moves that put the pages there did.
func (sess *session) residencyFromFiles(mr *managedRange) int64 {
	srv := sess.srv
	var total int64
	for l := 0; l < srv.eng.Locations(); l++ {
		f, err := sess.file(core.DeviceAtSlot(l))
		if err != nil || f == nil {
			continue
		}
		ext, err := f.DataExtents(mr.FileOff, int64(mr.Length))
		if err != nil {
			srv.logger.Printf("session %d: residency of %#x+%d on location %d: %v", sess.id, mr.Start, mr.Length, l, err)
			continue
		}
		var n int64
		for _, e := range ext {
			for off := max(e.Off, mr.FileOff); off < min(e.End(), mr.FileOff+int64(mr.Length)); off += core.PageSize {
				page := int((off - mr.FileOff) / core.PageSize)
				bi := page / core.PagesPerBlock
				b := mr.Block(bi)
				b.Lock()
				var one core.PageMask
				one.Set(page % core.PagesPerBlock)
				o := mr.NewMover(bi, b)
				o.Adopt(core.DeviceAtSlot(l), one)
				b.Unlock()
				n++
			}
		}
		if l == core.CPU.Slot() {
			srv.eng.AddHostPages(n)
		} else if mr.Kind == core.KindManaged {
			// Whatever the files hold is there: charge it, even past a
			// capacity it can only exceed if accounting was wrong.
			if err := srv.arenas[l-1].Reserve(n); err != nil {
				srv.logger.Printf("device %d: adopted %d pages do not fit: %v", l-1, n, err)
			}
		}
		total += n
	}
	return total
}

// resume starts serving an adopted session: views attached, write
// protection made right, handlers started, waiters woken, device layouts
// made again, the client told.
func (sess *session) resume(restarts int) {
	srv := sess.srv
	views := []*view{sess.client()}
	// Every view is published before any handler runs: a move must find
	// each process that maps its source, to hold its writers still.
	for l, kv := range sess.adoptedViews {
		v, err := sess.adoptDevice(l, kv, restarts)
		if err != nil {
			srv.logger.Printf("session %d: device %d process (pid %d): %v", sess.id, l, kv.PID, err)
			continue
		}
		views = append(views, v)
	}
	sess.adoptedViews = nil
	for _, v := range views {
		// A move the dead server began left pages write-protected:
		// lift that, then protect again what read duplication needs.
		for _, r := range sess.ranges.Load().ranges {
			if err := v.uffd.WriteProtect(r.Start, r.Length, false, true); err != nil {
				srv.logger.Printf("session %d: unprotect %#x+%d in pid %d: %v", sess.id, r.Start, r.Length, v.pid, err)
			}
		}
		sess.protectCopies(v)
		srv.track(v)
	}
	// Once per session, not per view.
	sess.openSessionTrace(true)
	if rec := sess.tracer.Load(); rec != nil {
		for _, r := range sess.ranges.Load().ranges {
			if r.Kind == core.KindManaged {
				rec.Emit(&trace.Event{Kind: trace.KindAlloc, PID: int32(sess.pid), Range: r.ID, Addr: uint64(r.Start), Bytes: uint64(r.size)})
			}
		}
	}
	sess.startAccessSampler()
	srv.sessionsMu.Lock()
	srv.sessions[sess.id] = sess
	srv.sessionsMu.Unlock()
	go sess.remapLoop()
	for _, v := range views {
		if err := srv.watch(v); err != nil {
			srv.logger.Printf("session %d: pid %d: %v", sess.id, v.pid, err)
		}
	}
	sess.wakeAll()
	// With faults served (a Go device whose kernel waits in a fault
	// cannot answer until it is), each device maps its layout again: the
	// dead server's remote mappings are not known, so every range is
	// mapped as this server's state says.
	for _, v := range views[1:] {
		if err := sess.relayout(v); err == nil {
			sess.protectCopies(v)
		} else {
			srv.logger.Printf("session %d: device %d process (pid %d): %v", sess.id, v.loc, v.pid, err)
		}
	}
	if len(views) > 1 {
		// Once more after the devices mapped their ranges again: a
		// kernel thread whose fault raced its mapping's replacement was
		// left blocked with no message to serve (TestDaemonReplaced's C
		// client hung about one run in 18 under load, and the next
		// takeover's wake freed it). A thread the wake finds in a fault
		// being served only faults again.
		sess.wakeAll()
	}
	sess.conn.SetWriteDeadline(time.Now().Add(time.Second))
	wire.WriteMessage(sess.conn, wire.EncodeRestarted(uint32(os.Getpid()), uint32(restarts)), nil)
	sess.conn.SetWriteDeadline(time.Time{})
	go func() {
		defer srv.endSession(sess)
		sess.controlLoop()
	}()
}

// adoptDevice makes the view of a device process the dead server served,
// and publishes it; the process keeps running its kernels.
func (sess *session) adoptDevice(l core.Device, kv *guard.View, restarts int) (*view, error) {
	conn, err := device.FileConn(uintptr(kv.Conn))
	if err != nil {
		syscall.Close(kv.Uffd)
		if kv.Report >= 0 {
			syscall.Close(kv.Report)
		}
		return nil, err
	}
	u := uffd.NewFD(kv.Uffd)
	u.SetHandshaken(sess.srv.features&core.WantedFeatures, 0)
	v := &view{sess: sess, loc: l, pid: kv.PID, uffd: u, conn: conn, replies: make(chan []byte, 1), connDone: make(chan struct{}),
		minorOwn: sess.deviceMinor(l, u)}
	if kv.Report >= 0 {
		// The process reports to a trace: read on where the dead server
		// stopped.
		dt, err := sess.adoptDeviceTrace(l, kv.Report)
		if err != nil {
			sess.srv.logger.Printf("session %d: device %d's report socket: %v (its launches are not traced)", sess.id, l, err)
		}
		v.report = dt
	}
	kv.Report = -1
	// Requests of this server are numbered apart from the dead one's,
	// whose replies may still be on their way.
	v.seq.Store(uint32(restarts) << 24)
	// Until relayout maps its ranges again, the process maps what the
	// dead server had it map, which nothing recorded (MappingsUnknown;
	// TestTakeoverDuringKernelsUnderPreferredLocation).
	for _, r := range sess.ranges.Load().ranges {
		if r.Kind != core.KindManaged {
			continue
		}
		for bi := range r.Blocks() {
			if b := r.BlockAt(bi); b != nil {
				b.Lock()
				b.MappingsUnknown(l)
				b.Unlock()
			}
		}
	}
	sess.views[l.Slot()].Store(v)
	go sess.readDeviceReplies(v)
	return v, nil
}

// relayout maps a device's managed ranges again, block by block, as
// this server's state says: the dead server's remote mappings are not
// known. Each block's runs are marked in flight while the device maps
// them (a fault there installs through the view and reads which file got
// the page, as during any remap), and the new mappings start
// write-protected, so that a write racing a move faults instead of
// landing in a page being copied.
func (sess *session) relayout(v *view) error {
	for _, r := range sess.ranges.Load().ranges {
		if r.Kind != core.KindManaged {
			continue // pinned host and device memory: mapped as they always were
		}
		for bi := range r.Blocks() {
			if r.BlockAt(bi) == nil {
				continue // no advice, nothing resident: the device maps its own file
			}
			if err := sess.relayoutBlock(v, r, bi); err != nil {
				return err
			}
		}
	}
	return nil
}

func (sess *session) relayoutBlock(v *view, r *managedRange, bi int) error {
	v.reqMu.Lock()
	defer v.reqMu.Unlock()
	b := r.BlockAt(bi)
	o := r.NewMover(bi, b)
	type run struct {
		first, outer int
		to           core.Device
	}
	var runs []run
	b.Lock()
	if r.Freed.Load() {
		b.Unlock()
		return nil
	}
	for p := 0; p < b.Pages; {
		to := o.DesiredFile(v.loc, p)
		q := p + 1
		for q < b.Pages && o.DesiredFile(v.loc, q) == to {
			q++
		}
		runs = append(runs, run{p, q, to})
		b.SetMapping(v.loc, p, q, to, true)
		p = q
	}
	b.Unlock()
	var err error
	done := 0
	for _, rn := range runs {
		if err = v.mapRun(&o, rn.first, rn.outer, rn.to); err != nil {
			break
		}
		done++
	}
	b.Lock()
	for i, rn := range runs {
		b.Settle(v.loc, rn.first, rn.outer, i < done)
		if i < done && rn.to != v.loc {
			sess.srv.countRemote(r.Range, v.loc, o.PageAddr(rn.first), rn.outer-rn.first)
		}
	}
	b.Unlock()
	if err != nil {
		return fmt.Errorf("map %#x+%d again: %w", o.BlockAddr, b.Pages*core.PageSize, err)
	}
	return nil
}

// wakeAll wakes every thread of every view blocked in a fault on the
// session's ranges.
func (sess *session) wakeAll() {
	for l := range sess.views {
		v := sess.viewRef(core.DeviceAtSlot(l))
		if v == nil {
			continue
		}
		for _, r := range sess.ranges.Load().ranges {
			v.uffd.Wake(r.Start, r.Length)
		}
		v.release()
	}
}

// waitIdle returns when the server has no session left.
func (s *Server) waitIdle() {
	for {
		select {
		case <-s.idle:
		case <-s.done:
			return
		}
		if s.SessionCount() == 0 {
			return
		}
	}
}
