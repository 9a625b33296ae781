package block

import (
	"github.com/softuvm/softuvm/internal/core"
)

// Read duplication: a read of a read-mostly page (advice), a clean copy
// (clean.go) or a launch-model copy back to the host makes a copy at the
// reader and keeps the others, every mapping of each write-protected; a
// write collapses the page to the writer's copy.

// duplicate copies pages (populated somewhere, not at t.Dst) to t.Dst,
// leaving the other copies in place, every mapping of each copy
// write-protected.
func (o *Mover) duplicate(t Target, pages core.PageMask) error {
	b := o.B
	e := o.eng()
	dst := t.Dst
	pages.AndNot(&b.Resident[dst.Slot()])
	need := int64(pages.Count())
	if need == 0 {
		return nil
	}
	if dst != core.CPU {
		if err := o.Reserve(dst, need, pages); err != nil {
			return err
		}
		defer o.Settled(dst)
	}
	var copied int64
	err := o.duplicateRuns(t, pages, &copied)
	if dst != core.CPU && copied < need {
		e.cfg.Arenas[dst].Release(need - copied)
	}
	if dst == core.CPU {
		e.hostGained(copied)
	}
	if copied > 0 {
		got := pages
		got.And(&b.Resident[dst.Slot()])
		o.arrived(dst, got, o.arrivalCause())
		o.emit(Event{Kind: EvDuplicated, First: got.NextSet(0), Pages: got, To: dst})
		o.residencyChanged()
	}
	return err
}

func (o *Mover) duplicateRuns(t Target, pages core.PageMask, copied *int64) error {
	b := o.B
	dst := t.Dst
	mem := o.space()
	if _, err := mem.LargeFile(dst); err != nil {
		return err
	}
	var none core.PageMask
	for _, rn := range o.runs(pages, none, t, false, -1) {
		if !rn.Populated {
			continue // nothing to copy: the caller migrates (populates) these
		}
		if _, err := mem.LargeFile(rn.Src); err != nil {
			return err
		}
		if err := mem.SettleHostWrites(o, rn.First, rn.Outer); err != nil {
			return err
		}
		// Every mapping of the source copy and of the new one is made
		// read-only first, and stays so.
		for _, l := range []core.Device{rn.Src, dst} {
			holders, err := o.hold(l, rn.First, rn.Outer)
			if err != nil {
				return err
			}
			o.DoneWithAll(holders)
		}
		done, err := mem.Duplicate(o, t, rn.Mapped, rn.First, rn.Outer, rn.Src)
		b.Resident[dst.Slot()].Or(&done)
		*copied += int64(done.Count())
		if err != nil {
			return err
		}
	}
	return nil
}

// CollapseTo makes keep's copies of pages the only ones, and writable.
func (o *Mover) CollapseTo(keep core.Device, pages core.PageMask) {
	b := o.B
	pages.And(&b.Resident[keep.Slot()])
	dropped := false
	for l := range b.Resident {
		if core.DeviceAtSlot(l) == keep {
			continue
		}
		x := b.Resident[l]
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
		holders := o.Holders(keep, p, q)
		for _, v := range holders {
			o.space().Unprotect(o, v, p, q)
		}
		o.DoneWithAll(holders)
	}
	o.residencyChanged()
}

// CollapseAll makes every page of pages with several copies a single
// copy: the one at its preferred location if there is one there, else
// the first holder's (cuMemAdvise leaves the choice arbitrary).
func (o *Mover) CollapseAll(pages core.PageMask) {
	b := o.B
	dup := b.Duplicated()
	dup.And(&pages)
	if dup.Empty() {
		return
	}
	byKeep := make([]core.PageMask, len(b.Resident))
	launch := o.space().LaunchModel()
	for p := dup.NextSet(0); p >= 0; p = dup.NextSet(p + 1) {
		keep, _ := b.LocationOf(p)
		if pref, ok := b.PreferredAt(p); ok && b.Resident[pref.Slot()].Test(p) {
			keep = pref
		}
		if launch && b.Resident[core.CPU.Slot()].Test(p) {
			keep = core.CPU // the launch model's host copy may hold writes the others lack
		}
		byKeep[keep.Slot()].Set(p)
	}
	for l := range byKeep {
		if !byKeep[l].Empty() {
			o.CollapseTo(core.DeviceAtSlot(l), byKeep[l])
		}
	}
}
