//go:build race

package uvm

// slowdown scales the time bounds of tests that check something ends
// (rather than how fast): the race detector makes everything several
// times slower.
const slowdown = 5
