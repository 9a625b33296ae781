package block

import "unsafe"

// slotOf returns the slot whose buffer buf is (or begins in).
func (a *Staging) slotOf(buf []byte) int {
	p := uintptr(unsafe.Pointer(unsafe.SliceData(buf)))
	base := uintptr(unsafe.Pointer(unsafe.SliceData(a.mem)))
	return int((p - base - stagingHeader) / StagingSlotBytes)
}

// intent returns slot s's intent record, in the shared mapping.
func (a *Staging) intent(s int) *[4]uint64 {
	return (*[4]uint64)(unsafe.Pointer(&a.mem[s*intentBytes]))
}
