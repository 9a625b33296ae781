package uvm

import (
	"encoding/binary"
	"fmt"
	"slices"
)

// A session's journal is what a new server needs, beyond the files, to
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
type journal struct {
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

func newJournal() *journal { return &journal{allocs: map[uint64][]byte{}} }

// allocRecord and friends encode records.
func allocRecord(msg []byte) []byte  { return append([]byte{recordAlloc}, msg...) }
func adviseRecord(msg []byte) []byte { return append([]byte{recordAdvise}, msg...) }
func freeRecord(addr uintptr) []byte {
	return binary.LittleEndian.AppendUint64([]byte{recordFree}, uint64(addr))
}

// apply adds one record. A record that does not parse is an error and
// changes nothing.
func (j *journal) apply(rec []byte) error {
	if len(rec) < 1 {
		return fmt.Errorf("%w: empty journal record", ErrInvalidValue)
	}
	body := rec[1:]
	switch rec[0] {
	case recordAlloc:
		_, req, err := parseRequest(body)
		ar, ok := req.(allocRequest)
		if err != nil || !ok {
			return fmt.Errorf("%w: journal alloc record: %v", ErrInvalidValue, err)
		}
		// A range the new one overlaps was unmapped without a free
		// (alloc drops it as stale): so does the journal.
		for addr, msg := range j.allocs {
			_, old, _ := parseRequest(msg)
			if o := old.(allocRequest); o.addr < ar.addr+ar.length && ar.addr < o.addr+o.length {
				j.drop(addr, o.length)
			}
		}
		j.allocs[ar.addr] = append([]byte(nil), body...)
	case recordAdvise:
		_, req, err := parseRequest(body)
		ar, ok := req.(adviseRequest)
		if err != nil || !ok {
			return fmt.Errorf("%w: journal advise record: %v", ErrInvalidValue, err)
		}
		key := adviceKey(Advice(ar.advice), Device(ar.device))
		kept := j.advice[:0]
		for _, a := range j.advice {
			if !(a.key == key && ar.addr <= a.addr && a.addr+a.length <= ar.addr+ar.length) {
				kept = append(kept, a)
			}
		}
		j.advice = append(kept, adviceRecord{addr: ar.addr, length: ar.length, key: key, msg: append([]byte(nil), body...)})
	case recordFree:
		if len(body) != 8 {
			return fmt.Errorf("%w: journal free record of %d bytes, want 8", ErrInvalidValue, len(body))
		}
		addr := binary.LittleEndian.Uint64(body)
		msg, ok := j.allocs[addr]
		if !ok {
			return nil
		}
		_, req, _ := parseRequest(msg)
		j.drop(addr, req.(allocRequest).length)
	default:
		return fmt.Errorf("%w: journal record kind %q", ErrInvalidValue, rec[0])
	}
	return nil
}

// drop forgets the range at addr and the advice given on it.
func (j *journal) drop(addr, length uint64) {
	delete(j.allocs, addr)
	kept := j.advice[:0]
	for _, a := range j.advice {
		if a.addr+a.length <= addr || a.addr >= addr+length {
			kept = append(kept, a)
		}
	}
	j.advice = kept
}

// adviceKey says which state advice sets: read-mostly, the preferred
// location, or one processor's accessed-by bit.
func adviceKey(a Advice, d Device) uint64 {
	switch a {
	case AdviseSetReadMostly, AdviseUnsetReadMostly:
		return 1
	case AdviseSetPreferredLocation, AdviseUnsetPreferredLocation:
		return 2
	}
	return 3<<32 | uint64(uint32(d))
}

// records returns the journal as records, allocs first (in address
// order), then advice in the order given.
func (j *journal) records() [][]byte {
	var out [][]byte
	addrs := make([]uint64, 0, len(j.allocs))
	for a := range j.allocs {
		addrs = append(addrs, a)
	}
	slices.Sort(addrs)
	for _, a := range addrs {
		out = append(out, allocRecord(j.allocs[a]))
	}
	for _, a := range j.advice {
		out = append(out, adviseRecord(a.msg))
	}
	return out
}
