package server

import (
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/softuvm/softuvm/devmem"
	"github.com/softuvm/softuvm/internal/core"
	"github.com/softuvm/softuvm/internal/engine"
)

// A migration takes a page out of its source before it puts it at its
// destination (migrate.go says why), so for a moment the page is only in
// the buffer that carries it. A server that dies in that moment must not
// take the page with it: the buffers are slots of one file that the
// guard holds too, and before a chunk's source is punched its slot
// records the intent (session, file offset, length). A new server that
// adopts the session finds every page of a recorded intent that no
// location file holds and writes it back to the host file (adopt.go).
//
// The file is sparse: slots cost memory once used, and used slots are
// reused first.
type stagingArea struct {
	file    *devmem.File
	mapping *devmem.Mapping
	mem     []byte // the mapping

	mu   sync.Mutex
	cond *sync.Cond
	free []int // slots returned, reused last-in first-out
	next int   // slots never used start here
	// lent counts slots out; closed is set by close, which unmaps the
	// area once none is out (a handler may still hold one).
	lent   int
	closed bool
}

const (
	stagingSlots     = 4096 // 512 MiB of address space, used as needed
	stagingSlotBytes = engine.ChunkBytes
	stagingSlotPages = stagingSlotBytes / core.PageSize
	intentBytes      = 32
	stagingHeader    = stagingSlots * intentBytes
	stagingFileBytes = stagingHeader + stagingSlots*stagingSlotBytes
)

// An intent record: state (1 while the slot carries pages whose source
// is gone), session, file offset, length; 8 bytes each.
const intentValid = 1

// A whole block whose destination nobody can map without the server
// moves without carrying its pages through a slot (copyWhole): the
// destination is written from a mapping of the source, and the source is
// punched only once the destination holds it all. The slot's intent then
// carries no data, only the move, in two steps: while intentCopying the
// source is whole and the destination may be partly written, so a new
// server punches the destination; once intentCopied the destination is
// whole, so it punches the source. The length word carries the source's
// and the destination's location slots above its low 32 bits.
const (
	intentCopying = 2
	intentCopied  = 3
)

func newStagingArea() (*stagingArea, error) {
	f, err := devmem.CreateFile("softuvm-staging", stagingFileBytes)
	if err != nil {
		return nil, fmt.Errorf("%w: staging file: %v", core.ErrInitialization, err)
	}
	return mapStagingArea(f)
}

// mapStagingArea maps a staging file, made here or received from the
// guard.
func mapStagingArea(f *devmem.File) (*stagingArea, error) {
	if f.Size() < stagingFileBytes {
		f.Close()
		return nil, fmt.Errorf("%w: staging file of %d bytes, want %d", core.ErrInvalidValue, f.Size(), stagingFileBytes)
	}
	m, err := f.Map(0, stagingFileBytes)
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("%w: map the staging file: %v", core.ErrInitialization, err)
	}
	a := &stagingArea{file: f, mapping: m, mem: m.Bytes()}
	a.cond = sync.NewCond(&a.mu)
	return a, nil
}

// stagedIntent is a valid intent found in a staging file.
type stagedIntent struct {
	session uint64
	off     int64
	data    []byte // the slot's bytes: length of them
}

func (a *stagingArea) close() {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.closed = true
	if a.lent == 0 {
		a.unmapLocked()
	}
}

func (a *stagingArea) unmapLocked() {
	if a.mapping != nil {
		a.mapping.Unmap()
		a.file.Close()
		a.mapping = nil
	}
}

// get returns a free slot's buffer, waiting while every slot is in use.
func (a *stagingArea) Get() []byte {
	a.mu.Lock()
	defer a.mu.Unlock()
	for {
		if n := len(a.free); n > 0 {
			s := a.free[n-1]
			a.free = a.free[:n-1]
			a.lent++
			return a.slot(s)
		}
		if a.next < stagingSlots {
			a.next++
			a.lent++
			return a.slot(a.next - 1)
		}
		a.cond.Wait()
	}
}

// put returns a slot; any intent it still records is void.
func (a *stagingArea) Put(buf []byte) {
	s := a.slotOf(buf)
	a.mu.Lock()
	defer a.mu.Unlock()
	a.lent--
	if a.closed {
		if a.lent == 0 {
			a.unmapLocked()
		}
		return
	}
	a.clear(buf)
	a.free = append(a.free, s)
	a.cond.Signal()
}

func (a *stagingArea) slot(s int) []byte {
	off := stagingHeader + s*stagingSlotBytes
	return a.mem[off : off+stagingSlotBytes : off+stagingSlotBytes]
}

// mark records that buf carries [off, off+length) of session's files,
// whose source is about to be punched.
func (a *stagingArea) mark(buf []byte, session uint64, off int64, length int) {
	rec := a.intent(a.slotOf(buf))
	atomic.StoreUint64(&rec[1], session)
	atomic.StoreUint64(&rec[2], uint64(off))
	atomic.StoreUint64(&rec[3], uint64(length))
	atomic.StoreUint64(&rec[0], intentValid) // last: the record is whole
}

// markMove records in buf's slot that a whole move of [off, off+length)
// of session's files from location src to dst is writing dst.
func (a *stagingArea) markMove(buf []byte, session uint64, off int64, length int, src, dst core.Device) {
	rec := a.intent(a.slotOf(buf))
	atomic.StoreUint64(&rec[1], session)
	atomic.StoreUint64(&rec[2], uint64(off))
	atomic.StoreUint64(&rec[3], uint64(length)|uint64(src.Slot())<<32|uint64(dst.Slot())<<40)
	atomic.StoreUint64(&rec[0], intentCopying)
}

// markCopied records that the move in buf's slot wrote all of its
// destination, and is punching its source.
func (a *stagingArea) markCopied(buf []byte) {
	atomic.StoreUint64(&a.intent(a.slotOf(buf))[0], intentCopied)
}

// stagedMove is a whole move a dead server left unfinished (markMove).
type stagedMove struct {
	session  uint64
	off      int64
	length   int64
	src, dst core.Device
	copied   bool // the destination is whole
}

// moves returns the unfinished whole moves, as a dead server left them.
func (a *stagingArea) moves() []stagedMove {
	var out []stagedMove
	for s := 0; s < stagingSlots; s++ {
		rec := a.intent(s)
		state := atomic.LoadUint64(&rec[0])
		if state != intentCopying && state != intentCopied {
			continue
		}
		w := atomic.LoadUint64(&rec[3])
		out = append(out, stagedMove{session: rec[1], off: int64(rec[2]), length: int64(uint32(w)),
			src: core.DeviceAtSlot(int(w >> 32 & 0xff)), dst: core.DeviceAtSlot(int(w >> 40 & 0xff)), copied: state == intentCopied})
	}
	return out
}

// clear voids buf's intent: its pages are installed, or back at their
// source.
func (a *stagingArea) clear(buf []byte) {
	atomic.StoreUint64(&a.intent(a.slotOf(buf))[0], 0)
}

// intents returns the valid intents, as a dead server left them.
func (a *stagingArea) intents() []stagedIntent {
	var out []stagedIntent
	for s := 0; s < stagingSlots; s++ {
		rec := a.intent(s)
		if atomic.LoadUint64(&rec[0]) != intentValid {
			continue
		}
		n := atomic.LoadUint64(&rec[3])
		if n > stagingSlotBytes {
			continue
		}
		out = append(out, stagedIntent{session: rec[1], off: int64(rec[2]), data: a.slot(s)[:n]})
	}
	return out
}

// clearAll voids every intent.
func (a *stagingArea) clearAll() {
	for s := 0; s < stagingSlots; s++ {
		atomic.StoreUint64(&a.intent(s)[0], 0)
	}
}
