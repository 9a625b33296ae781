package server

import (
	"github.com/softuvm/softuvm/internal/core"
	"github.com/softuvm/softuvm/trace"
)

// duplicate copies pages (populated somewhere, not at t.dst) to t.dst,
// leaving the other copies in place, every mapping of each copy
// write-protected.
func (o *mover) duplicate(t target, pages core.PageMask) error {
	b := o.b
	dst := t.dst
	pages.AndNot(&b.resident[dst.Slot()])
	need := int64(pages.Count())
	if need == 0 {
		return nil
	}
	srv := o.sess.srv
	if dst != core.CPU {
		if err := o.reserve(dst, need, pages); err != nil {
			return err
		}
		defer o.settled(dst)
	}
	var copied int64
	err := o.duplicateRuns(t, pages, &copied)
	if dst != core.CPU && copied < need {
		srv.arenas[dst].Release(need - copied)
	}
	if dst == core.CPU {
		srv.hostGained(copied)
	}
	if copied > 0 {
		got := pages
		got.And(&b.resident[dst.Slot()])
		o.arrived(dst, got, o.arrivalCause())
		o.r.stats.ReadDuplicated[dst.Slot()].Add(uint64(copied))
		if o.sess.tracing() {
			o.sess.tracePages(trace.KindDuplicate, o.r, o.pageAddr(got.NextSet(0)), int(copied), dst)
		}
		o.residencyChanged()
	}
	return err
}

func (o *mover) duplicateRuns(t target, pages core.PageMask, copied *int64) error {
	b := o.b
	dst := t.dst
	dstFile, err := o.sess.file(dst)
	if err != nil {
		return err
	}
	var none core.PageMask
	for _, rn := range o.runs(pages, none, t, false, -1) {
		if !rn.populated {
			continue // nothing to copy: the caller migrates (populates) these
		}
		srcFile, err := o.sess.file(rn.src)
		if err != nil {
			return err
		}
		addr, span := o.pageAddr(rn.first), uintptr(rn.outer-rn.first)*core.PageSize
		if err := o.settleHostWrites(rn.first, rn.outer); err != nil {
			return err
		}
		// Every mapping of the source copy and of the new one is made
		// read-only first, and stays so.
		for _, l := range []core.Device{rn.src, dst} {
			holders := o.holders(l, rn.first, rn.outer)
			for _, v := range holders {
				err = o.writeProtect(v, addr, span)
				if err != nil {
					break
				}
			}
			o.doneWithAll(holders)
			if err != nil {
				return err
			}
		}
		var done core.PageMask
		if rn.mapped {
			done, _, err = o.installFromFile(t.via, rn.first, rn.outer, srcFile, true)
		} else if _, err = dstFile.CopyFrom(srcFile, o.fileOff(rn.first), o.fileOff(rn.first), int64(span)); err == nil {
			done.FillRange(rn.first, rn.outer)
		}
		b.resident[dst.Slot()].Or(&done)
		*copied += int64(done.Count())
		if err != nil {
			return err
		}
	}
	return nil
}

// collapseTo makes keep's copies of pages the only ones, and writable.
func (o *mover) collapseTo(keep core.Device, pages core.PageMask) {
	b := o.b
	pages.And(&b.resident[keep.Slot()])
	dropped := false
	for l := range b.resident {
		if core.DeviceAtSlot(l) == keep {
			continue
		}
		x := b.resident[l]
		x.And(&pages)
		if x.Empty() {
			continue
		}
		o.dropCopies(core.DeviceAtSlot(l), x)
		dropped = true
	}
	if !dropped {
		return
	}
	for p, q := pages.NextRun(0); p >= 0; p, q = pages.NextRun(q) {
		holders := o.holders(keep, p, q)
		for _, v := range holders {
			_ = v.uffd.WriteProtect(o.pageAddr(p), uintptr(q-p)*core.PageSize, false, false)
		}
		o.doneWithAll(holders)
	}
	o.residencyChanged()
}

// collapseAll makes every page of pages with several copies a single
// copy: the one at its preferred location if there is one there, else
// the first holder's (cuMemAdvise leaves the choice arbitrary).
func (o *mover) collapseAll(pages core.PageMask) {
	b := o.b
	dup := b.duplicated()
	dup.And(&pages)
	if dup.Empty() {
		return
	}
	byKeep := make([]core.PageMask, len(b.resident))
	for p := dup.NextSet(0); p >= 0; p = dup.NextSet(p + 1) {
		keep, _ := b.locationOfPage(p)
		if pref, ok := b.preferredAt(p); ok && b.resident[pref.Slot()].Test(p) {
			keep = pref
		}
		if o.sess.launch != nil && b.resident[core.CPU.Slot()].Test(p) {
			keep = core.CPU // the launch model's host copy may hold writes the others lack
		}
		byKeep[keep.Slot()].Set(p)
	}
	for l := range byKeep {
		if !byKeep[l].Empty() {
			o.collapseTo(core.DeviceAtSlot(l), byKeep[l])
		}
	}
}
