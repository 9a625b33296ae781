package block

import (
	"github.com/softuvm/softuvm/internal/core"
)

// View is a process that maps a space's ranges, as the engine sees it:
// its processor, whose faults it takes. The server's views are
// processes with a userfaultfd; the lab's are simulated page tables.
type View interface {
	Processor() core.Device
}

// Memory is the kernel as the engine sees it: the location files of one
// space (a client session) and the views that map them, and the
// operations on them that carry out what the engine decided. The server
// implements it with userfaultfd and memfds (internal/server: kernel.go),
// the lab with page masks in memory (lab: memory.go).
//
// Every operation gets the mover of the block it acts on, whose lock is
// held; pages are a run [first, outer) of the block, or a mask. The
// engine does the bookkeeping (residency, large folios, room, events)
// around each operation: an operation reports the pages it did and
// changes nothing the engine keeps. An error leaves the pages it did not
// do where they were.
type Memory interface {
	// View returns location l's view with a reference that keeps it
	// alive, nil where l has no process; Release lets it go.
	View(l core.Device) View
	Release(v View)
	// LargeFile reports whether location l's file takes 2 MiB folios;
	// an error where the file cannot be had (a device file that cannot
	// be made).
	LargeFile(l core.Device) (bool, error)
	// Continues reports whether view v registers MINOR faults over its
	// own file in range r: what its file takes is mapped into it with
	// Continue. WillContinue reports it for a device with no process
	// yet, whose process will when it starts.
	Continues(r *Range, v View) bool
	WillContinue(l core.Device) bool

	// Protect write-protects view v's mapping of the pages, so that its
	// writers wait (held still while the pages are copied away, or a
	// copy made read-only); Unprotect lifts that, which wakes them, and
	// clears the markers left where protected pages left the file; Wake
	// wakes the threads waiting on them without lifting anything.
	Protect(o *Mover, v View, first, outer int) error
	Unprotect(o *Mover, v View, first, outer int)
	Wake(o *Mover, v View, first, outer int)

	// InstallZero maps fresh zero pages into view v (allocating them in
	// whatever file v maps there), returning those now present and, of
	// them, those found present and left. Allocate puts zero pages in
	// location l's file, unmapped.
	InstallZero(o *Mover, v View, first, outer int) (done, found core.PageMask, err error)
	Allocate(o *Mover, l core.Device, first, outer int) error
	// Transfer moves pages from location from's file to t: through the
	// staging of a copy (pages are only there between the punch of the
	// source and the install), the source punched before the install,
	// and the pages that fail to arrive written back to the source.
	// Through t's view where mapped, else into t.Dst's file.
	Transfer(o *Mover, t Target, mapped bool, first, outer int, from core.Device) (core.PageMask, error)
	// CopyWhole carries the whole block from location from's file to
	// to's as one 2 MiB folio and punches the source: destination first
	// and one copy where sealed (nobody can see the destination before
	// the move is done), else source first through staging. On error
	// the block is back at from, whole.
	CopyWhole(o *Mover, from, to core.Device, sealed bool) error
	// InstallWhole stages the whole block from location from's file,
	// punches it there whole (punched reports it) and installs it page
	// by page through view v; pages that fail go back to from.
	InstallWhole(o *Mover, from core.Device, v View) (done core.PageMask, punched bool, err error)
	// Duplicate copies pages of location from to t, write-protected,
	// leaving from's copy (read duplication): through t's view where
	// mapped, else file to file.
	Duplicate(o *Mover, t Target, mapped bool, first, outer int, from core.Device) (core.PageMask, error)
	// Punch frees location l's copies of the pages; whole says they are
	// the whole block, which may then be one 2 MiB folio leaving whole.
	Punch(o *Mover, l core.Device, first, outer int, whole bool) error
	// Rebuild makes location l's copy of the block 4 KiB folios, without
	// pages [first, outer) (none where first == outer), which leave l,
	// with the other pages held still in holders meanwhile.
	Rebuild(o *Mover, l core.Device, first, outer int, holders []View) error
	// Continue maps pages its file holds into view v (write-protected
	// with wp); a page mapped already, or that the file lacks, is left
	// and its waiting threads woken.
	Continue(o *Mover, v View, first, outer int, wp bool)
	// Unmapped returns the block's pages that view v does not map, ok
	// false where that cannot be read.
	Unmapped(o *Mover, v View) (core.PageMask, bool)
	// Mapped returns the pages of mask that the client's process maps
	// (the audit of prefetched pages' use).
	Mapped(o *Mover, mask core.PageMask) (core.PageMask, error)

	// MapsDeviceMemory reports whether device view l maps device memory
	// r at all: its owner does, another device only while it has peer
	// access to the owner.
	MapsDeviceMemory(r *Range, l core.Device) bool

	// The launch coherence model (the fault model: all false): whether
	// the space runs it; whether the host may not touch range r now;
	// whether it refuses the fault the mover serves; and, before the
	// host's copies of pages [first, outer) are write-protected, making
	// those the CPU wrote the only copies (o.CollapseTo).
	LaunchModel() bool
	LaunchLocked(r *Range) bool
	LaunchRefused(o *Mover) bool
	SettleHostWrites(o *Mover, first, outer int) error
}
