package block

import (
	"github.com/softuvm/softuvm/internal/core"
)

// Advise applies advice (cuMemAdvise) to the pages of [addr, addr+length)
// of the range: read-mostly (read faults make copies, unsetting it
// collapses them), a preferred location and accessed-by (device views
// may then map other locations' files: the caller has them follow).
func (r *Range) Advise(addr, length uintptr, advice core.Advice, d core.Device) error {
	return r.EachBlock(addr, length, true, func(o *Mover, pages core.PageMask) error {
		adv := o.B.AdviceOf()
		switch advice {
		case core.AdviseSetReadMostly:
			adv.ReadMostly.Or(&pages)
		case core.AdviseUnsetReadMostly:
			adv.ReadMostly.AndNot(&pages)
			o.CollapseAll(pages)
		case core.AdviseSetPreferredLocation, core.AdviseUnsetPreferredLocation:
			adv.Remote = true
			code := core.PageProcessorOf(d)
			if advice == core.AdviseUnsetPreferredLocation {
				code = core.NoProcessor
			}
			for p := pages.NextSet(0); p >= 0; p = pages.NextSet(p + 1) {
				adv.Preferred[p] = code
			}
		case core.AdviseSetAccessedBy:
			adv.Remote = true
			adv.AccessedBy[d.Slot()].Or(&pages)
		case core.AdviseUnsetAccessedBy:
			adv.AccessedBy[d.Slot()].AndNot(&pages)
		}
		return nil
	})
}

// Attributes answers cuMemRangeGetAttribute's questions for [addr,
// addr+length) of the range: read-mostly (all pages), the preferred and
// last prefetch locations (shared by all pages, else invalid) and the
// processors every page is accessed by.
func (r *Range) Attributes(addr, length uintptr) (core.RangeAttributes, error) {
	readMostly := true
	// The preferred and last prefetch locations shared by every page so
	// far: unset until the first page, and disagree once two differ.
	var preferred, last pageAgreement
	accessed := make([]bool, r.eng.locs)
	for l := range accessed {
		accessed[l] = true
	}
	err := r.EachBlock(addr, length, false, func(o *Mover, pages core.PageMask) error {
		var adv *Advice
		if o != nil {
			adv = o.B.Advice
		}
		for p := pages.NextSet(0); p >= 0; p = pages.NextSet(p + 1) {
			if o == nil {
				last.see(core.NoProcessor)
			} else {
				last.see(o.B.LastPrefetch[p])
			}
			if adv == nil {
				readMostly = false
				preferred.see(core.NoProcessor)
				clear(accessed)
				continue
			}
			readMostly = readMostly && adv.ReadMostly.Test(p)
			preferred.see(adv.Preferred[p])
			for l := range accessed {
				accessed[l] = accessed[l] && adv.AccessedBy[l].Test(p)
			}
		}
		return nil
	})
	if err != nil {
		return core.RangeAttributes{}, err
	}
	a := core.RangeAttributes{ReadMostly: readMostly, PreferredLocation: core.InvalidDevice, LastPrefetchLocation: core.InvalidDevice, AccessedBy: []core.Device{}}
	a.PreferredLocation = preferred.shared()
	a.LastPrefetchLocation = last.shared()
	for l, ok := range accessed {
		if ok {
			a.AccessedBy = append(a.AccessedBy, core.DeviceAtSlot(l))
		}
	}
	return a, nil
}

// pageAgreement finds the processor every page of a range agrees on.
type pageAgreement struct {
	seen     bool
	disagree bool
	p        core.PageProcessor
}

func (a *pageAgreement) see(p core.PageProcessor) {
	switch {
	case !a.seen:
		a.seen, a.p = true, p
	case a.p != p:
		a.disagree = true
	}
}

// shared is the processor every page named, or InvalidDevice when some
// page named none or two pages differ (cuMemRangeGetAttribute's rule).
func (a *pageAgreement) shared() core.Device {
	if d, ok := a.p.Device(); ok && a.seen && !a.disagree {
		return d
	}
	return core.InvalidDevice
}
