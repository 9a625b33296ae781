//go:build linux

package uffd

import "unsafe"

// addr returns the address of b's first byte, for the ioctls that take
// addresses of memory the tests mapped.
func addr(b []byte) uintptr { return uintptr(unsafe.Pointer(unsafe.SliceData(b))) }
