//go:build linux && !race

package uffd

const raceEnabled = false
