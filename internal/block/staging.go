package block

import (
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/softuvm/softuvm/devmem"
	"github.com/softuvm/softuvm/internal/core"
)

// Staging is the staging area: the slots pages travel in, and the books
// of what they carry. A migration takes a page out of its source before
// it puts it at its destination (Memory.Transfer says why), so for a
// moment the page is only in the buffer that carries it. A server that
// dies in that moment must not take the page with it: the buffers are
// slots of one file that the server's guard holds too, and before a
// chunk's source is punched its slot records the intent (session, file
// offset, length: Mark). A new server that adopts the session finds
// every page of a recorded intent that no location file holds and writes
// it back to the host file (internal/server: adopt.go). A whole move
// that carries no page through a slot records its steps (MarkMove,
// MarkCopied) so that the new server can finish or undo it.
//
// The file is sparse: slots cost memory once used, and used slots are
// reused first. The server makes the area (or maps the one its guard
// kept) and implements Memory's transfers with it; the lab moves no
// data and needs none.
type Staging struct {
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
	stagingSlots = 4096 // 512 MiB of address space, used as needed
	// StagingSlotBytes is a copy engine chunk (internal/engine.ChunkBytes,
	// whose buffers the slots are; a test of the server holds them equal).
	StagingSlotBytes = 128 << 10
	StagingSlotPages = StagingSlotBytes / core.PageSize
	intentBytes      = 32
	stagingHeader    = stagingSlots * intentBytes
	stagingFileBytes = stagingHeader + stagingSlots*StagingSlotBytes
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

func NewStaging() (*Staging, error) {
	f, err := devmem.CreateFile("softuvm-staging", stagingFileBytes)
	if err != nil {
		return nil, fmt.Errorf("%w: staging file: %v", core.ErrInitialization, err)
	}
	return MapStaging(f)
}

// MapStaging maps a staging file, made here or received from the
// guard.
func MapStaging(f *devmem.File) (*Staging, error) {
	if f.Size() < stagingFileBytes {
		f.Close()
		return nil, fmt.Errorf("%w: staging file of %d bytes, want %d", core.ErrInvalidValue, f.Size(), stagingFileBytes)
	}
	m, err := f.Map(0, stagingFileBytes)
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("%w: map the staging file: %v", core.ErrInitialization, err)
	}
	a := &Staging{file: f, mapping: m, mem: m.Bytes()}
	a.cond = sync.NewCond(&a.mu)
	return a, nil
}

// StagedIntent is a valid intent found in a staging file.
type StagedIntent struct {
	Session uint64
	Off     int64
	Data    []byte // the slot's bytes: length of them
}

// Close unmaps the area once no slot is out.
func (a *Staging) Close() {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.closed = true
	if a.lent == 0 {
		a.unmapLocked()
	}
}

func (a *Staging) unmapLocked() {
	if a.mapping != nil {
		a.mapping.Unmap()
		a.file.Close()
		a.mapping = nil
	}
}

// Get returns a free slot's buffer, waiting while every slot is in use.
func (a *Staging) Get() []byte {
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

// Put returns a slot; any intent it still records is void.
func (a *Staging) Put(buf []byte) {
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
	a.Clear(buf)
	a.free = append(a.free, s)
	a.cond.Signal()
}

func (a *Staging) slot(s int) []byte {
	off := stagingHeader + s*StagingSlotBytes
	return a.mem[off : off+StagingSlotBytes : off+StagingSlotBytes]
}

// Mark records that buf carries [off, off+length) of session's files,
// whose source is about to be punched.
func (a *Staging) Mark(buf []byte, session uint64, off int64, length int) {
	rec := a.intent(a.slotOf(buf))
	atomic.StoreUint64(&rec[1], session)
	atomic.StoreUint64(&rec[2], uint64(off))
	atomic.StoreUint64(&rec[3], uint64(length))
	atomic.StoreUint64(&rec[0], intentValid) // last: the record is whole
}

// MarkMove records in buf's slot that a whole move of [off, off+length)
// of session's files from location src to dst is writing dst.
func (a *Staging) MarkMove(buf []byte, session uint64, off int64, length int, src, dst core.Device) {
	rec := a.intent(a.slotOf(buf))
	atomic.StoreUint64(&rec[1], session)
	atomic.StoreUint64(&rec[2], uint64(off))
	atomic.StoreUint64(&rec[3], uint64(length)|uint64(src.Slot())<<32|uint64(dst.Slot())<<40)
	atomic.StoreUint64(&rec[0], intentCopying)
}

// MarkCopied records that the move in buf's slot wrote all of its
// destination, and is punching its source.
func (a *Staging) MarkCopied(buf []byte) {
	atomic.StoreUint64(&a.intent(a.slotOf(buf))[0], intentCopied)
}

// StagedMove is a whole move a dead server left unfinished (markMove).
type StagedMove struct {
	Session  uint64
	Off      int64
	Length   int64
	Src, Dst core.Device
	Copied   bool // the destination is whole
}

// Moves returns the unfinished whole moves, as a dead server left them.
func (a *Staging) Moves() []StagedMove {
	var out []StagedMove
	for s := 0; s < stagingSlots; s++ {
		rec := a.intent(s)
		state := atomic.LoadUint64(&rec[0])
		if state != intentCopying && state != intentCopied {
			continue
		}
		w := atomic.LoadUint64(&rec[3])
		out = append(out, StagedMove{Session: rec[1], Off: int64(rec[2]), Length: int64(uint32(w)),
			Src: core.DeviceAtSlot(int(w >> 32 & 0xff)), Dst: core.DeviceAtSlot(int(w >> 40 & 0xff)), Copied: state == intentCopied})
	}
	return out
}

// Clear voids buf's intent: its pages are installed, or back at their
// source.
func (a *Staging) Clear(buf []byte) {
	atomic.StoreUint64(&a.intent(a.slotOf(buf))[0], 0)
}

// Intents returns the valid intents, as a dead server left them.
func (a *Staging) Intents() []StagedIntent {
	var out []StagedIntent
	for s := 0; s < stagingSlots; s++ {
		rec := a.intent(s)
		if atomic.LoadUint64(&rec[0]) != intentValid {
			continue
		}
		n := atomic.LoadUint64(&rec[3])
		if n > StagingSlotBytes {
			continue
		}
		out = append(out, StagedIntent{Session: rec[1], Off: int64(rec[2]), Data: a.slot(s)[:n]})
	}
	return out
}

// ClearAll voids every intent.
func (a *Staging) ClearAll() {
	for s := 0; s < stagingSlots; s++ {
		atomic.StoreUint64(&a.intent(s)[0], 0)
	}
}

// FD is the staging file's descriptor, which the guard keeps a
// duplicate of.
func (a *Staging) FD() int { return a.file.Fd() }
