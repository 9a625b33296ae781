package core

import (
	"fmt"
)

// rangeKind is what sort of memory a range is.
type RangeKind uint8

const (
	KindManaged    RangeKind = iota // MallocManaged: migrates on demand
	KindPinnedHost                  // HostAlloc, HostRegister: host memory devices map
	KindDevice                      // Malloc: device memory, only in its arena
)

func (k RangeKind) String() string {
	switch k {
	case KindManaged:
		return "managed memory"
	case KindPinnedHost:
		return "pinned host memory"
	case KindDevice:
		return "device memory"
	}
	return fmt.Sprintf("memory kind %d", uint8(k))
}

// Residency is where a block's pages have copies: a page mask per
// location, by Device.Slot. The fault server keeps one per block, and
// the lab's replay one per simulated block.
type Residency []PageMask

// Populated reports whether any page has a copy anywhere.
func (r Residency) Populated() bool {
	for l := range r {
		if !r[l].Empty() {
			return true
		}
	}
	return false
}

// LocationOf returns where page p has a copy (the first location, in slot
// order), or ok false if it has none: never populated.
func (r Residency) LocationOf(p int) (loc Device, ok bool) {
	for l := range r {
		if r[l].Test(p) {
			return DeviceAtSlot(l), true
		}
	}
	return 0, false
}

// Elsewhere returns the pages with a copy at some location other than
// m, and none at m: bringing them to m is a copy.
func (r Residency) Elsewhere(m Device) PageMask {
	var out PageMask
	for l := range r {
		if l != m.Slot() {
			out.Or(&r[l])
		}
	}
	if m.Slot() < len(r) {
		out.AndNot(&r[m.Slot()])
	}
	return out
}

// SoleHolder returns the location that holds all pages of a block of
// pages pages while no other location holds any: the whole block in one
// place. ok is false where the block is in pieces, has copies in two
// places, or is nowhere.
func (r Residency) SoleHolder(pages int) (loc Device, ok bool) {
	holder := -1
	for l := range r {
		switch n := r[l].Count(); {
		case n == 0:
		case n != pages || holder >= 0:
			return 0, false
		default:
			holder = l
		}
	}
	return DeviceAtSlot(holder), holder >= 0
}
