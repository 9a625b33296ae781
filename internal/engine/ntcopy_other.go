//go:build !amd64

package engine

import "unsafe"

// nonTemporalStores says whether copies into write-combined memory
// bypass the cache here: not on this architecture, where they are
// ordinary copies.
const nonTemporalStores = false

func ntCopy64(dst, src unsafe.Pointer, blocks uintptr) {
	copy(unsafe.Slice((*byte)(dst), blocks*64), unsafe.Slice((*byte)(src), blocks*64))
}
