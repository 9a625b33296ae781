package engine

import "unsafe"

// nonTemporalStores says whether copies into write-combined memory
// bypass the cache here.
const nonTemporalStores = true

// ntCopy64 copies blocks*64 bytes from src to dst, which must be 16-byte
// aligned, with MOVNTDQ stores, and fences them (ntcopy_amd64.s).
//
//go:noescape
func ntCopy64(dst, src unsafe.Pointer, blocks uintptr)
