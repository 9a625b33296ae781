//go:build linux && race

package uffd

// raceEnabled: the race detector instruments memory accesses and moves
// stack buffers to the heap, so allocation counts mean nothing under it.
const raceEnabled = true
