package server

import (
	"github.com/softuvm/softuvm/internal/block"
	"github.com/softuvm/softuvm/internal/core"
)

// A session is the block engine's Memory (block.Memory): its location
// files, the views that map them, and the kernel operations on them. The
// operations that carry data are in migrate.go (the 4 KiB path) and
// whole.go (whole blocks); continue.go maps pages with UFFDIO_CONTINUE.

var _ block.Memory = (*session)(nil)

// Processor is the view's processor (block.View).
func (v *view) Processor() core.Device { return v.loc }

// View returns location l's live view with its use lock held for
// reading, or nil.
func (sess *session) View(l core.Device) block.View {
	if v := sess.viewRef(l); v != nil {
		return v
	}
	return nil
}

// Release lets a view View returned go.
func (sess *session) Release(v block.View) { v.(*view).release() }

// LargeFile reports whether location l's file takes 2 MiB folios.
func (sess *session) LargeFile(l core.Device) (bool, error) {
	f, err := sess.file(l)
	if err != nil {
		return false, err
	}
	return f.Large(), nil
}

// Continues reports whether view v registers MINOR faults over its own
// file in range r: the host's where it does (not in a range that tracks
// prefetch use, hostViewMode), a device's as its process said
// (minorOwn).
func (sess *session) Continues(r *block.Range, bv block.View) bool {
	v := bv.(*view)
	if v.loc == core.CPU {
		return !r.TrackPrefetch && sess.hostMinor()
	}
	return v.minorOwn
}

// WillContinue reports whether device l, which has no process yet, will
// register MINOR faults over its own file when it starts: its
// userfaultfd has the client's features.
func (sess *session) WillContinue(l core.Device) bool {
	c := sess.client()
	return l != core.CPU && c != nil && sess.deviceMinor(l, c.uffd)
}

func (sess *session) Protect(o *block.Mover, v block.View, first, outer int) error {
	return sess.writeProtect(v.(*view), o.PageAddr(first), uintptr(outer-first)*core.PageSize)
}

// Unprotect lifts the write protection of the pages in v, which wakes
// the writers it held; where that fails, it wakes them: the page left
// meanwhile (the retry faults as missing), or the process moves a mapping
// into place (EAGAIN; the retry faults as a write again). Ignored, that
// left a C kernel asleep for ever (TestCAdviceAndKernelsOnTwoDevices).
func (sess *session) Unprotect(o *block.Mover, bv block.View, first, outer int) {
	v := bv.(*view)
	addr, span := o.PageAddr(first), uintptr(outer-first)*core.PageSize
	h := handlerOf(o)
	if bv == o.FV {
		h.ioctlBegins()
	}
	err := v.uffd.WriteProtect(addr, span, false, false)
	if bv == o.FV {
		h.ioctlEnds()
	}
	if err != nil {
		_ = v.uffd.Wake(addr, span) // nothing waiting, or the process is gone: fine
	}
}

func (sess *session) Wake(o *block.Mover, v block.View, first, outer int) {
	_ = v.(*view).uffd.Wake(o.PageAddr(first), uintptr(outer-first)*core.PageSize)
}

func (sess *session) InstallZero(o *block.Mover, v block.View, first, outer int) (done, found core.PageMask, err error) {
	return sess.install(o, v.(*view), installZero, first, outer, nil, false)
}

func (sess *session) Allocate(o *block.Mover, l core.Device, first, outer int) error {
	f, err := sess.file(l)
	if err != nil {
		return err
	}
	return f.Allocate(o.FileOff(first), int64(outer-first)*core.PageSize)
}

func (sess *session) Transfer(o *block.Mover, t block.Target, mapped bool, first, outer int, from core.Device) (core.PageMask, error) {
	src, err := sess.file(from)
	if err != nil {
		return core.PageMask{}, err
	}
	var sink pageSink
	if mapped {
		sink = viewTarget{sess: sess, o: o, v: t.Via.(*view)}
	} else {
		dst, err := sess.file(t.Dst)
		if err != nil {
			return core.PageMask{}, err
		}
		sink = fileTarget{o: o, f: dst}
	}
	return sess.transfer(o, sink, t.Dst, first, outer, from, src)
}

func (sess *session) Duplicate(o *block.Mover, t block.Target, mapped bool, first, outer int, from core.Device) (core.PageMask, error) {
	var done core.PageMask
	src, err := sess.file(from)
	if err != nil {
		return done, err
	}
	if mapped {
		done, _, err = sess.installFromFile(o, t.Via.(*view), first, outer, src, true)
		return done, err
	}
	dst, err := sess.file(t.Dst)
	if err != nil {
		return done, err
	}
	if _, err = dst.CopyFrom(src, o.FileOff(first), o.FileOff(first), int64(outer-first)*core.PageSize); err == nil {
		done.FillRange(first, outer)
	}
	return done, err
}

func (sess *session) Punch(o *block.Mover, l core.Device, first, outer int, whole bool) error {
	f, err := sess.file(l)
	if err != nil {
		return err
	}
	off, length := o.FileOff(first), int64(outer-first)*core.PageSize
	if whole {
		return f.Punch(off, length)
	}
	return f.PunchSmallFolios(off, length)
}

func (sess *session) LaunchModel() bool { return sess.launch != nil }

func (sess *session) LaunchLocked(r *block.Range) bool {
	locked, _ := sess.launch.launchLocked(rangeOf(r))
	return locked
}

func (sess *session) MapsDeviceMemory(r *block.Range, l core.Device) bool {
	return r.Kind != core.KindDevice || l == core.CPU || l == r.Owner || sess.peers.enabled(l, r.Owner)
}
