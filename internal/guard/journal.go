package guard

import (
	"cmp"
	"encoding/binary"
	"fmt"
	"maps"
	"slices"

	"github.com/softuvm/softuvm/internal/core"
	"github.com/softuvm/softuvm/internal/wire"
)

// A session's Journal is what a new server needs, beyond the files, to
// take the session over: its ranges (the alloc requests that made them)
// and the advice given on them, in order; under the launch coherence
// model the model itself, each range's stream attachment and the kernels
// running (launched and not yet synchronized) with the ranges each holds;
// the peer access the client enabled; and whether the client's profiler
// records (a trace-control start with its file, or a stop). The server
// keeps it and sends every change to the guard, which keeps a copy; a
// server that adopts the session replays it (adopt.go). It holds only
// what is live: a free drops the range's alloc, its advice and
// attachment, and its address from running kernels; advice that later
// advice of the same kind covers is dropped too, a synchronize drops its
// streams' kernels, and a peer access disabled is forgotten, so its size
// follows the program's state, not its history.
//
// A record is one byte of kind, then the request datagram as the client
// sent it (alloc, advise, stream attach, streams idle, peer access,
// trace control), the address freed (free), the dirty tracking's name
// (model), or a Launch (launch: device(4) stream(4) ranges(4), each
// range's address(8), the kernel's name).
type Journal struct {
	allocs map[uint64][]byte // by address: the alloc request
	advice []adviceRecord    // in the order given
	// model is the dirty tracking of a launch-model session, "" under
	// the fault model.
	model    string
	attach   map[uint64][]byte     // by range address: the stream-attach request
	launches []Launch              // running, in launch order
	peers    map[[2]int32]struct{} // device, peer: access enabled
	profile  []byte                // the last trace-control request, nil if none
}

// Launch is a kernel a launch-model session launched on Stream of Device
// and has not synchronized, holding the ranges at Ranges (their
// addresses): while it runs the CPU may not touch them.
type Launch struct {
	Device int32
	Stream uint32
	Kernel string
	Ranges []uint64
}

// Model is a launch-model session's record: how it finds the pages the
// CPU wrote (core.DirtyTracking's names).
type Model struct{ DirtyTracking string }

type adviceRecord struct {
	addr, length uint64
	key          uint64 // what the advice sets: later advice with the same key supersedes it
	msg          []byte
}

const (
	recordAlloc   = 'a'
	recordFree    = 'f'
	recordAdvise  = 'd'
	recordModel   = 'm'
	recordAttach  = 't'
	recordLaunch  = 'l'
	recordIdle    = 'i'
	recordPeer    = 'p'
	recordProfile = 'T'
)

func NewJournal() *Journal {
	return &Journal{allocs: map[uint64][]byte{}, attach: map[uint64][]byte{}, peers: map[[2]int32]struct{}{}}
}

// AllocRecord and friends encode records.
func AllocRecord(msg []byte) []byte { return append([]byte{recordAlloc}, msg...) }

func AdviseRecord(msg []byte) []byte { return append([]byte{recordAdvise}, msg...) }

// ModelRecord says the session runs the launch coherence model, finding
// written pages by dirty (core.DirtyTracking).
func ModelRecord(dirty string) []byte { return append([]byte{recordModel}, dirty...) }

// AttachRecord is a stream-attach request the server took.
func AttachRecord(msg []byte) []byte { return append([]byte{recordAttach}, msg...) }

// IdleRecord is a streams-idle request: its streams' kernels finished.
func IdleRecord(msg []byte) []byte { return append([]byte{recordIdle}, msg...) }

// PeerRecord is a peer-access request that changed the table.
func PeerRecord(msg []byte) []byte { return append([]byte{recordPeer}, msg...) }

// ProfileRecord is a trace-control request the server carried out, a
// start naming the file it records to.
func ProfileRecord(msg []byte) []byte { return append([]byte{recordProfile}, msg...) }

// LaunchRecord is a kernel launched under the launch model.
func LaunchRecord(l Launch) []byte {
	le := binary.LittleEndian
	b := le.AppendUint32([]byte{recordLaunch}, uint32(l.Device))
	b = le.AppendUint32(b, l.Stream)
	b = le.AppendUint32(b, uint32(len(l.Ranges)))
	for _, a := range l.Ranges {
		b = le.AppendUint64(b, a)
	}
	return append(b, l.Kernel...)
}

func decodeLaunch(body []byte) (Launch, error) {
	le := binary.LittleEndian
	if len(body) < 12 {
		return Launch{}, fmt.Errorf("%w: Journal launch record of %d bytes, want 12 or more", core.ErrInvalidValue, len(body))
	}
	l := Launch{Device: int32(le.Uint32(body)), Stream: le.Uint32(body[4:])}
	n := int(le.Uint32(body[8:]))
	body = body[12:]
	if n > len(body)/8 {
		return Launch{}, fmt.Errorf("%w: Journal launch record of %d ranges in %d bytes", core.ErrInvalidValue, n, len(body))
	}
	for i := 0; i < n; i++ {
		l.Ranges = append(l.Ranges, le.Uint64(body[8*i:]))
	}
	l.Kernel = string(body[8*n:])
	return l, nil
}

// requestOf parses a record's request datagram, of the type T wanted.
func requestOf[T any](what string, body []byte) (T, error) {
	_, req, err := wire.ParseRequest(body)
	r, ok := req.(T)
	if err == nil && !ok {
		err = fmt.Errorf("a %T", req)
	}
	if err != nil {
		return r, fmt.Errorf("%w: Journal %s record: %v", core.ErrInvalidValue, what, err)
	}
	return r, nil
}

// DecodeRecord returns what a record of Records says, for a new server to
// replay: a wire.AllocRequest, wire.AdviseRequest, Model,
// wire.StreamAttachRequest, wire.PeerAccessRequest, Launch or
// wire.TraceControlRequest.
func DecodeRecord(rec []byte) (any, error) {
	if len(rec) < 1 {
		return nil, fmt.Errorf("%w: empty Journal record", core.ErrInvalidValue)
	}
	body := rec[1:]
	switch rec[0] {
	case recordAlloc:
		return requestOf[wire.AllocRequest]("alloc", body)
	case recordAdvise:
		return requestOf[wire.AdviseRequest]("advise", body)
	case recordModel:
		return Model{DirtyTracking: string(body)}, nil
	case recordAttach:
		return requestOf[wire.StreamAttachRequest]("stream attach", body)
	case recordPeer:
		return requestOf[wire.PeerAccessRequest]("peer access", body)
	case recordLaunch:
		return decodeLaunch(body)
	case recordProfile:
		return requestOf[wire.TraceControlRequest]("trace control", body)
	}
	return nil, fmt.Errorf("%w: Journal record kind %q is not replayed", core.ErrInvalidValue, rec[0])
}

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
	case recordModel:
		j.model = string(body)
	case recordAttach:
		sa, err := requestOf[wire.StreamAttachRequest]("stream attach", body)
		if err != nil {
			return err
		}
		j.attach[sa.Addr] = append([]byte(nil), body...)
	case recordLaunch:
		l, err := decodeLaunch(body)
		if err != nil {
			return err
		}
		j.launches = append(j.launches, l)
	case recordIdle:
		si, err := requestOf[wire.StreamsIdleRequest]("streams idle", body)
		if err != nil {
			return err
		}
		j.launches = slices.DeleteFunc(j.launches, func(l Launch) bool {
			return l.Device == si.Device && (si.Stream == wire.AllStreams || l.Stream == si.Stream)
		})
	case recordPeer:
		pa, err := requestOf[wire.PeerAccessRequest]("peer access", body)
		if err != nil {
			return err
		}
		if pa.Enable {
			j.peers[[2]int32{pa.Device, pa.Peer}] = struct{}{}
		} else {
			delete(j.peers, [2]int32{pa.Device, pa.Peer})
		}
	case recordProfile:
		if _, err := requestOf[wire.TraceControlRequest]("trace control", body); err != nil {
			return err
		}
		j.profile = append([]byte(nil), body...)
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

// drop forgets the range at addr: its alloc, the advice given on it, its
// attachment, and its place in running kernels.
func (j *Journal) drop(addr, length uint64) {
	delete(j.allocs, addr)
	delete(j.attach, addr)
	kept := j.advice[:0]
	for _, a := range j.advice {
		if a.addr+a.length <= addr || a.addr >= addr+length {
			kept = append(kept, a)
		}
	}
	j.advice = kept
	for i := range j.launches {
		j.launches[i].Ranges = slices.DeleteFunc(j.launches[i].Ranges, func(a uint64) bool { return a == addr })
	}
}

// Records returns the Journal as records: the model first, then allocs
// (in address order), advice in the order given, attachments (in address
// order), peer access, running kernels in launch order, and the
// profiler's last request.
func (j *Journal) Records() [][]byte {
	var out [][]byte
	if j.model != "" {
		out = append(out, ModelRecord(j.model))
	}
	for _, a := range slices.Sorted(maps.Keys(j.allocs)) {
		out = append(out, AllocRecord(j.allocs[a]))
	}
	for _, a := range j.advice {
		out = append(out, AdviseRecord(a.msg))
	}
	for _, a := range slices.Sorted(maps.Keys(j.attach)) {
		out = append(out, AttachRecord(j.attach[a]))
	}
	peers := slices.SortedFunc(maps.Keys(j.peers), func(a, b [2]int32) int {
		return cmp.Or(cmp.Compare(a[0], b[0]), cmp.Compare(a[1], b[1]))
	})
	for _, p := range peers {
		out = append(out, PeerRecord(wire.EncodePeerAccess(0, wire.PeerAccessRequest{Device: p[0], Peer: p[1], Enable: true})))
	}
	for _, l := range j.launches {
		out = append(out, LaunchRecord(l))
	}
	if j.profile != nil {
		out = append(out, ProfileRecord(j.profile))
	}
	return out
}

// LaunchModel reports whether the session runs the launch coherence
// model, and how it finds written pages.
func (j *Journal) LaunchModel() (dirty string, ok bool) { return j.model, j.model != "" }
