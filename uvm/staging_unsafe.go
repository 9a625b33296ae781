package uvm

import "unsafe"

// slotOf returns the slot whose buffer buf is (or begins in).
func (a *stagingArea) slotOf(buf []byte) int {
	p := uintptr(unsafe.Pointer(unsafe.SliceData(buf)))
	return int((p - a.base - stagingHeader) / stagingSlotBytes)
}

// intent returns slot s's intent record, in the shared mapping.
func (a *stagingArea) intent(s int) *[4]uint64 {
	return (*[4]uint64)(unsafe.Pointer(&a.mem[s*intentBytes]))
}
