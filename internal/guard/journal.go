package guard

import (
	"encoding/binary"
	"fmt"
	"slices"

	"github.com/softuvm/softuvm/internal/core"
	"github.com/softuvm/softuvm/internal/wire"
)

// A session's Journal is what a new server needs, beyond the files, to
// take the session over: its ranges (the alloc requests that made them)
// and the advice given on them, in order. The server keeps it and sends
// every change to the guard, which keeps a copy; a server that adopts the
// session replays it (adopt.go). It holds only what is live: a free drops
// the range's alloc and its advice, and advice that later advice of the
// same kind covers is dropped too, so its size follows the program's
// allocations, not its history.
//
// A record is one byte of kind, then the request datagram as the client
// sent it (alloc, advise) or the address freed (free).
type Journal struct {
	allocs map[uint64][]byte // by address: the alloc request
	advice []adviceRecord    // in the order given
}

type adviceRecord struct {
	addr, length uint64
	key          uint64 // what the advice sets: later advice with the same key supersedes it
	msg          []byte
}

const (
	recordAlloc  = 'a'
	recordFree   = 'f'
	recordAdvise = 'd'
)

func NewJournal() *Journal { return &Journal{allocs: map[uint64][]byte{}} }

// allocRecord and friends encode records.
func AllocRecord(msg []byte) []byte { return append([]byte{recordAlloc}, msg...) }

func AdviseRecord(msg []byte) []byte { return append([]byte{recordAdvise}, msg...) }

func FreeRecord(addr uintptr) []byte {
	return binary.LittleEndian.AppendUint64([]byte{recordFree}, uint64(addr))
}

// adviceKey says which state advice sets: read-mostly, the preferred
// location, or one processor's accessed-by bit.
func adviceKey(a core.Advice, d core.Device) uint64 {
	switch a {
	case core.AdviseSetReadMostly, core.AdviseUnsetReadMostly:
		return 1
	case core.AdviseSetPreferredLocation, core.AdviseUnsetPreferredLocation:
		return 2
	}
	return 3<<32 | uint64(uint32(d))
}

// apply adds one record. A record that does not parse is an error and
// changes nothing.
func (j *Journal) Apply(rec []byte) error {
	if len(rec) < 1 {
		return fmt.Errorf("%w: empty Journal record", core.ErrInvalidValue)
	}
	body := rec[1:]
	switch rec[0] {
	case recordAlloc:
		_, req, err := wire.ParseRequest(body)
		ar, ok := req.(wire.AllocRequest)
		if err != nil || !ok {
			return fmt.Errorf("%w: Journal alloc record: %v", core.ErrInvalidValue, err)
		}
		// A range the new one overlaps was unmapped without a free
		// (alloc drops it as stale): so does the Journal.
		for addr, msg := range j.allocs {
			_, old, _ := wire.ParseRequest(msg)
			if o := old.(wire.AllocRequest); o.Addr < ar.Addr+ar.Length && ar.Addr < o.Addr+o.Length {
				j.drop(addr, o.Length)
			}
		}
		j.allocs[ar.Addr] = append([]byte(nil), body...)
	case recordAdvise:
		_, req, err := wire.ParseRequest(body)
		ar, ok := req.(wire.AdviseRequest)
		if err != nil || !ok {
			return fmt.Errorf("%w: Journal advise record: %v", core.ErrInvalidValue, err)
		}
		key := adviceKey(core.Advice(ar.Advice), core.Device(ar.Device))
		kept := j.advice[:0]
		for _, a := range j.advice {
			if !(a.key == key && ar.Addr <= a.addr && a.addr+a.length <= ar.Addr+ar.Length) {
				kept = append(kept, a)
			}
		}
		j.advice = append(kept, adviceRecord{addr: ar.Addr, length: ar.Length, key: key, msg: append([]byte(nil), body...)})
	case recordFree:
		if len(body) != 8 {
			return fmt.Errorf("%w: Journal free record of %d bytes, want 8", core.ErrInvalidValue, len(body))
		}
		addr := binary.LittleEndian.Uint64(body)
		msg, ok := j.allocs[addr]
		if !ok {
			return nil
		}
		_, req, _ := wire.ParseRequest(msg)
		j.drop(addr, req.(wire.AllocRequest).Length)
	default:
		return fmt.Errorf("%w: Journal record kind %q", core.ErrInvalidValue, rec[0])
	}
	return nil
}

// drop forgets the range at addr and the advice given on it.
func (j *Journal) drop(addr, length uint64) {
	delete(j.allocs, addr)
	kept := j.advice[:0]
	for _, a := range j.advice {
		if a.addr+a.length <= addr || a.addr >= addr+length {
			kept = append(kept, a)
		}
	}
	j.advice = kept
}

// records returns the Journal as records, allocs first (in address
// order), then advice in the order given.
func (j *Journal) Records() [][]byte {
	var out [][]byte
	addrs := make([]uint64, 0, len(j.allocs))
	for a := range j.allocs {
		addrs = append(addrs, a)
	}
	slices.Sort(addrs)
	for _, a := range addrs {
		out = append(out, AllocRecord(j.allocs[a]))
	}
	for _, a := range j.advice {
		out = append(out, AdviseRecord(a.msg))
	}
	return out
}
