package core

// MaxAllocation bounds one managed allocation: 64 TiB of address space.
// Pages are created on first touch, so a large allocation costs nothing
// until it is used.
const MaxAllocation = 1 << 46

func RoundUp(n, to uintptr) uintptr { return (n + to - 1) &^ (to - 1) }
