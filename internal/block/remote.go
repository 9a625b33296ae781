package block

import (
	"github.com/softuvm/softuvm/internal/core"
)

// Remote mappings: which file each device view maps over each page of a
// block. A device view maps its own file except where policy wants it to
// reach data where it lies (the preferred location's file, the owner's
// under accessed-by advice, the host's for a page pinned by thrashing).
// The engine keeps the record and decides (DesiredFile, Mismatch); only
// the device's process can change what it maps, so the server's
// remapper carries the changes out, off the fault path, and records them
// here (SetMapping, Settle).

// viewMap records which file one device view maps over each page of one
// block.
type viewMap struct {
	// file[p] is the processor whose file the view maps over page p, or
	// is mapping if p is pending; none means the view's own.
	file [core.PagesPerBlock]core.PageProcessor
	// pending pages are being remapped: the view maps was[p] or file[p].
	pending core.PageMask
	was     [core.PagesPerBlock]core.PageProcessor
	// unknown pages are pending with no known old mapping: a device
	// process a takeover adopted maps what the dead server had it map,
	// any location's file, until this server has it map them again
	// (MappingsUnknown). A subset of pending.
	unknown core.PageMask
}

// fileOf is the processor whose file a view of processor own maps where
// its map records p.
func fileOf(p core.PageProcessor, own core.Device) core.Device {
	if d, ok := p.Device(); ok {
		return d
	}
	return own
}

// StaticFile returns the file view l maps over a range of a kind whose
// mapping changes only on the control path (pinned host memory, device
// memory), and ok false for managed memory.
func (r *Range) StaticFile(l core.Device) (core.Device, bool) {
	switch r.Kind {
	case core.KindPinnedHost:
		return core.CPU, true
	case core.KindDevice:
		if l == core.CPU {
			return core.CPU, true // the host maps its own file there, and its faults are refused
		}
		if !r.Space.MapsDeviceMemory(r, l) {
			// No peer access to the owner: the view maps nothing there,
			// so nothing remote either.
			return l, true
		}
		return r.Owner, true
	}
	return l, false
}

// fixedFile returns the file view l maps over every page of the block,
// if it is the same everywhere and no remap is in flight.
func (o *Mover) fixedFile(l core.Device) (core.Device, bool) {
	if f, ok := o.R.StaticFile(l); ok {
		return f, true
	}
	if l == core.CPU || o.B.maps == nil || o.B.maps[l.Slot()] == nil {
		return l, true
	}
	return 0, false
}

// MapsAt returns the file view l maps over page p; known is false while
// a remap of p is in flight.
func (o *Mover) MapsAt(l core.Device, p int) (core.Device, bool) {
	if f, ok := o.fixedFile(l); ok {
		return f, true
	}
	m := o.B.maps[l.Slot()]
	return fileOf(m.file[p], l), !m.pending.Test(p)
}

// PendingFiles returns the files view l may map over page p while a
// remap of it is in flight: the old one and the new one, or every
// location's where the old one is not known.
func (o *Mover) PendingFiles(l core.Device, p int) []core.Device {
	m := o.B.maps[l.Slot()]
	if m.unknown.Test(p) {
		all := make([]core.Device, len(o.B.Resident))
		for i := range all {
			all[i] = core.DeviceAtSlot(i)
		}
		return all
	}
	old, new := fileOf(m.was[p], l), fileOf(m.file[p], l)
	if old == new {
		return []core.Device{old}
	}
	return []core.Device{old, new}
}

// PagesMapping returns the pages over which view l is known to map
// location f's file.
func (o *Mover) PagesMapping(l, f core.Device) core.PageMask {
	var out core.PageMask
	if fixed, ok := o.fixedFile(l); ok {
		if fixed == f {
			out.FillRange(0, o.B.Pages)
		}
		return out
	}
	m := o.B.maps[l.Slot()]
	for p := 0; p < o.B.Pages; p++ {
		if !m.pending.Test(p) && fileOf(m.file[p], l) == f {
			out.Set(p)
		}
	}
	return out
}

// mayMap reports whether view l maps, or may map while a remap is in
// flight, location f's file over some page of [first, outer).
func (o *Mover) mayMap(l, f core.Device, first, outer int) bool {
	if fixed, ok := o.fixedFile(l); ok {
		return fixed == f
	}
	m := o.B.maps[l.Slot()]
	for p := first; p < outer; p++ {
		if fileOf(m.file[p], l) == f || (m.pending.Test(p) && fileOf(m.was[p], l) == f) || m.unknown.Test(p) {
			return true
		}
	}
	return false
}

// Holders returns the views that may map location src's file over some
// page of [first, outer): the ones whose writers must be held still while
// those pages are copied away, and whose page tables lose them when the
// file is punched. Release them with DoneWithAll. The slice is the
// mover's scratch buffer, valid until the next call: a caller that may
// call again while it holds one set (a rebuild under a move) uses
// HoldersInto.
func (o *Mover) Holders(src core.Device, first, outer int) []View {
	o.holdBuf = o.HoldersInto(o.holdBuf[:0], src, first, outer)
	return o.holdBuf
}

// HoldersInto appends Holders' views to out.
func (o *Mover) HoldersInto(out []View, src core.Device, first, outer int) []View {
	for l := range o.B.Resident {
		loc := core.DeviceAtSlot(l)
		if !o.mayMap(loc, src, first, outer) {
			continue
		}
		if v := o.ViewOf(loc); v != nil {
			out = append(out, v)
		}
	}
	return out
}

// DesiredFile is the file policy wants device view l to map over page p
// of a managed range's block. The block's lock is held.
func (o *Mover) DesiredFile(l core.Device, p int) core.Device {
	b := o.B
	if b.Resident[l.Slot()].Test(p) {
		return l // a copy here: always map it
	}
	adv := b.Advice
	if adv != nil && adv.ReadMostly.Test(p) {
		return l // read faults make a copy here
	}
	if o.PinnedAt(p) {
		return core.CPU
	}
	if adv == nil {
		return l
	}
	if pref, ok := adv.Preferred[p].Device(); ok {
		return pref
	}
	if adv.AccessedBy[l.Slot()].Test(p) {
		if owner, ok := b.SoleLocation(p); ok {
			return owner
		}
	}
	return l
}

// Mismatch finds the first run of pages from page from over which
// device view l maps another file than policy wants, all wanting the
// same file. The block's lock is held and no remap of l is in flight.
func (o *Mover) Mismatch(l core.Device, from int) (first, outer int, to core.Device, found bool) {
	b := o.B
	for p := from; p < b.Pages; p++ {
		cur, _ := o.MapsAt(l, p)
		want := o.DesiredFile(l, p)
		if cur == want {
			continue
		}
		q := p + 1
		for ; q < b.Pages; q++ {
			c, _ := o.MapsAt(l, q)
			if w := o.DesiredFile(l, q); w != want || c == w {
				break
			}
		}
		return p, q, want, true
	}
	return 0, 0, 0, false
}

// ViewRuns calls add with each run [p, q) of pages of [first, outer)
// that view l maps from another location's file (remote) or from its
// own (!remote), leaving out pages whose mapping is changing, until full
// says to stop. The block is locked.
func (b *Block) ViewRuns(l core.Device, first, outer int, remote bool, full func() bool, add func(p, q int)) {
	var m *viewMap
	if b.maps != nil {
		m = b.maps[l.Slot()]
	}
	in := func(p int) bool {
		if m == nil {
			return !remote // it maps its own file everywhere
		}
		return !m.pending.Test(p) && (fileOf(m.file[p], l) != l) == remote
	}
	for p := first; p < outer && !full(); {
		if !in(p) {
			p++
			continue
		}
		q := p + 1
		for q < outer && in(q) {
			q++
		}
		add(p, q)
		p = q
	}
}

// SetMapping records that view l maps (or, pending, is mapping) file to
// over [first, outer).
func (b *Block) SetMapping(l core.Device, first, outer int, to core.Device, pending bool) {
	if b.maps == nil {
		b.maps = make([]*viewMap, len(b.Resident))
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
			m.was[p] = m.file[p] // meaningless where the old mapping is unknown
			m.pending.Set(p)
		} else {
			m.pending.Clear(p)
			m.unknown.Clear(p)
		}
		m.file[p] = code
	}
	b.compactMaps(l)
}

// MappingsUnknown records that view l, a device process a takeover
// adopted, may map any location's file over every page of the block:
// what the dead server had it map is not known. Its faults there are
// served as during a remap (installed through the view, the files then
// looked at), and a move holds its writers still whatever file it moves
// from, until a remap of the pages settles (SetMapping, Settle).
func (b *Block) MappingsUnknown(l core.Device) {
	b.SetMapping(l, 0, b.Pages, l, true)
	b.maps[l.Slot()].unknown.FillRange(0, b.Pages)
}

// ResetMaps forgets what view l mapped: a new process of the device maps
// its own file everywhere until told otherwise.
func (b *Block) ResetMaps(l core.Device) {
	if b.maps != nil {
		b.maps[l.Slot()] = nil
		b.compactMaps(l)
	}
}

// Settle ends a remap of [first, outer): the view maps the new file (ok)
// or still the old one (where that is not known, the pages stay
// pending).
func (b *Block) Settle(l core.Device, first, outer int, ok bool) {
	m := b.maps[l.Slot()]
	for p := first; p < outer; p++ {
		switch {
		case ok:
			m.unknown.Clear(p)
		case m.unknown.Test(p):
			continue // what it maps is still not known
		default:
			m.file[p] = m.was[p]
		}
		m.pending.Clear(p)
	}
	b.compactMaps(l)
}

// compactMaps drops view l's record once it maps its own file everywhere,
// so that blocks without remote mappings take the fast path.
func (b *Block) compactMaps(l core.Device) {
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

// MapOwnResident maps into device view l, which maps its own file over
// pages [first, outer) again, the pages of the run its file holds, where
// the view registers MINOR faults there (elsewhere the kernel maps them
// itself): with one Continue, as a move into the file would, so that a
// device reads memory that came to it (a delayed migration, a prefetch
// while it mapped elsewhere) without faults. Pages with other copies are
// mapped write-protected. The block's lock is held.
func (o *Mover) MapOwnResident(l core.Device, first, outer int) {
	v := o.ViewOf(l)
	if v == nil {
		return
	}
	defer o.DoneWith(v)
	if !o.space().Continues(o.R, v) {
		return
	}
	var pages core.PageMask
	pages.FillRange(first, outer)
	held := o.heldInOwnFile(l)
	pages.And(&held)
	o.continuePages(v, pages, first)
}
