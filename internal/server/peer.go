package server

import (
	"errors"
	"fmt"
	"sync/atomic"

	"github.com/softuvm/softuvm/internal/core"
	"github.com/softuvm/softuvm/internal/guard"
	"github.com/softuvm/softuvm/internal/wire"
)

// Peer access, after cudaDeviceEnablePeerAccess: device memory (Malloc)
// lives in its owner's file, and another device's process maps it there
// only while the client has enabled that device's access to the owner.
// Without it the range stays reserved (PROT_NONE) in the device's
// process, so a kernel touching it faults in its own process (SIGSEGV,
// which a Go device turns into a kernel error, and a C device reports as
// a crash), reported by the next synchronize; nothing reaches the fault
// server, and no page moves. The host never maps device memory (its
// faults are refused, fault.go), and managed and pinned host memory do
// not depend on peer access.
//
// The table is per session, as CUDA's is per context, and outlives a
// device's process: the next process maps what it says. Each change is
// in the session's journal: a server that takes the session over starts
// with the table as it was (its device processes kept what they mapped,
// and a new one maps what the table says).

// peerTable says, for each device, the devices whose device memory its
// processes map: bit p of access[d] is device d's access to device p.
// Read without a lock (block.Range.StaticFile, on the fault path); changed under
// session.mu, in an order that keeps every reader right (peerAccess).
type peerTable struct {
	access [core.MaxDevices]atomic.Uint32
}

// enabled reports whether device d has access to peer's device memory.
func (t *peerTable) enabled(d, peer core.Device) bool {
	if d < 0 || d >= core.MaxDevices || peer < 0 || peer >= core.MaxDevices {
		return false
	}
	return t.access[d].Load()&(1<<uint(peer)) != 0
}

func (t *peerTable) set(d, peer core.Device, on bool) {
	bit := uint32(1) << uint(peer)
	if on {
		t.access[d].Or(bit)
	} else {
		t.access[d].And(^bit)
	}
}

// mapsDeviceMemory reports whether device view l maps device memory r at
// all: its owner does, and another device while it has peer access to
// the owner. For other kinds of memory, and for the host (which maps its
// own file there, its touches refused), it is true.
func (r *managedRange) mapsDeviceMemory(l core.Device) bool {
	return r.Kind != core.KindDevice || l == core.CPU || l == r.Owner || r.sess.peers.enabled(l, r.Owner)
}

// peerAccess answers MsgPeerAccess: device d's access to the device
// memory of peer, on or off, and whether it was on before. A request
// that changes nothing changes nothing; the client reports it as
// cudaErrorPeerAccessAlreadyEnabled or cudaErrorPeerAccessNotEnabled.
func (sess *session) peerAccess(req wire.PeerAccessRequest) (bool, error) {
	d, peer := core.Device(req.Device), core.Device(req.Peer)
	if d == core.CPU || peer == core.CPU {
		return false, fmt.Errorf("%w: peer access between device %d and device %d: the CPU is no peer", core.ErrInvalidDevice, d, peer)
	}
	if err := sess.srv.checkDevice(d, "peer access of"); err != nil {
		return false, err
	}
	if err := sess.srv.checkDevice(peer, "peer access to"); err != nil {
		return false, err
	}
	if d == peer {
		return false, fmt.Errorf("%w: peer access of device %d to itself: a device always reaches its own memory", core.ErrInvalidDevice, d)
	}
	if req.Flags != 0 {
		return false, fmt.Errorf("%w: peer access flags %#x: want 0", core.ErrInvalidValue, req.Flags)
	}
	// sess.mu freezes the range table and the attachment of device
	// processes: a process that attaches maps what the table says
	// (layoutFor), and a range allocated meanwhile is mapped as it says
	// (mapInDevices).
	sess.mu.Lock()
	defer sess.mu.Unlock()
	was := sess.peers.enabled(d, peer)
	if was == req.Enable {
		return was, nil
	}
	defer func() {
		if sess.peers.enabled(d, peer) != was {
			sess.record(guard.PeerRecord(wire.EncodePeerAccess(0, req)))
		}
	}()
	if req.Enable {
		// The table first: until the mappings are made the process has
		// the ranges reserved, and takes no fault there to be decided
		// against the new table.
		sess.peers.set(d, peer, true)
		if err := sess.mapPeerMemory(d, peer, true); err != nil {
			sess.peers.set(d, peer, false)
			if uerr := sess.mapPeerMemory(d, peer, false); uerr != nil {
				sess.srv.logger.Printf("pid %d: unmap device %d's memory from device %d after a failed map: %v", sess.pid, peer, d, uerr)
			}
			return was, err
		}
		return was, nil
	}
	// The mappings first, then the table: a fault the process took
	// through a mapping is decided as one through the owner's file.
	if err := sess.mapPeerMemory(d, peer, false); err != nil {
		return was, err
	}
	sess.peers.set(d, peer, false)
	return was, nil
}

// mapPeerMemory makes device d's process map (on) or unmap every range of
// device memory of peer. Without a process there is nothing to do: the
// next one maps what the table says. sess.mu is held.
func (sess *session) mapPeerMemory(d, peer core.Device, on bool) error {
	v := sess.viewRef(d)
	if v == nil {
		return nil
	}
	defer v.release()
	for _, r := range sess.ranges.Load().ranges {
		if r.Kind != core.KindDevice || r.Owner != peer {
			continue
		}
		var err error
		if on {
			err = v.request(wire.EncodeDeviceMap(v.seq.Add(1), wire.DeviceMapRequest{Addr: uint64(r.Start), Length: uint64(r.Length), File: peer}), wire.MsgDeviceMap)
			if err == nil {
				sess.srv.countRemote(r.Range, d, r.Start, int(r.Length/core.PageSize))
			}
		} else {
			err = v.request(wire.EncodeDeviceUnmap(v.seq.Add(1), uint64(r.Start), uint64(r.Length)), wire.MsgDeviceUnmap)
			// A thread of the device blocked in a fault there retries
			// and meets the reservation.
			_ = v.uffd.Wake(r.Start, r.Length) // nobody waiting, or the process is gone: fine
		}
		if err != nil {
			if errors.Is(err, errDeviceGone) {
				return nil // its successor maps what the table says
			}
			what := "map"
			if !on {
				what = "unmap"
			}
			return fmt.Errorf("%s device %d's memory %#x+%d in device %d: %w", what, peer, r.Start, r.Length, d, err)
		}
	}
	return nil
}
