package server

import "unsafe"

// slotOf returns the slot whose buffer buf is (or begins in).
func (a *stagingArea) slotOf(buf []byte) int {
	p := uintptr(unsafe.Pointer(unsafe.SliceData(buf)))
	base := uintptr(unsafe.Pointer(unsafe.SliceData(a.mem)))
	return int((p - base - stagingHeader) / stagingSlotBytes)
}

// intent returns slot s's intent record, in the shared mapping.
func (a *stagingArea) intent(s int) *[4]uint64 {
	return (*[4]uint64)(unsafe.Pointer(&a.mem[s*intentBytes]))
}
