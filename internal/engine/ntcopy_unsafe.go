package engine

import "unsafe"

// copyNonTemporal copies src into dst (the shorter length) the way CUDA
// fills write-combined memory: with non-temporal stores that go around
// the cache in 64-byte blocks, the unaligned head and tail with ordinary
// stores. It returns the bytes copied.
func CopyNonTemporal(dst, src []byte) int {
	n := min(len(dst), len(src))
	if n == 0 {
		return 0
	}
	head := int((16 - uintptr(unsafe.Pointer(unsafe.SliceData(dst)))%16) % 16)
	head = min(head, n)
	copy(dst[:head], src[:head])
	blocks := (n - head) / 64
	if blocks > 0 {
		ntCopy64(unsafe.Pointer(&dst[head]), unsafe.Pointer(&src[head]), uintptr(blocks))
	}
	rest := head + blocks*64
	copy(dst[rest:n], src[rest:n])
	return n
}
