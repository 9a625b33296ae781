package cli

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

// The benchmarks' flags: each bad value refused, naming the flag and
// what was wanted, before anything is measured.

func TestBenchGridFlags(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--rounds", "0"}, "want --rounds >= 1"},
		{[]string{"--reduce-mib", "0"}, "--reduce-mib >= 1"},
		{[]string{"--touch-kib", "6"}, `"6" is not a size in KiB, a multiple of 4`},
		{[]string{"--touch-kib", "64,x"}, `"x" is not a size`},
		{[]string{"--runtime", "rust"}, "--runtime \"rust\": want c, go or c,go"},
	} {
		assert.ErrorContains(t, benchGrid(c.args), c.want, "%v", c.args)
	}
}

func TestBenchOversubFlags(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--budget", "512KiB"}, "--budget 512KiB: want at least 1MiB"},
		{[]string{"--budget", "lots"}, "--budget"},
		{[]string{"--size", "16MiB"}, "--size 16MiB: want more than --budget 16MiB"},
		{[]string{"--budget", "4MiB", "--size", "3MiB"}, "--size 3MiB: want more than --budget 4MiB"},
		{[]string{"--sweeps", "0"}, "--sweeps 0: want at least 1"},
		{[]string{"--runs", "-1"}, "--runs -1: want at least 1"},
	} {
		err := benchOversub(c.args)
		assert.ErrorContains(t, err, c.want, "%v", c.args)
	}
}

func TestBenchRunFlags(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--programs", "gawk,nosuch"}, "--programs: unknown program(s) nosuch"},
		{[]string{"--budget-fraction", "0"}, "--budget-fraction 0: want more than 0 and at most 1"},
		{[]string{"--budget-fraction", "1.5"}, "--budget-fraction 1.5"},
		{[]string{"--runs", "0"}, "--runs 0: want at least 1"},
		{[]string{"--eviction", " , "}, "want at least one policy"},
		{[]string{"--eviction", "lru,nosuch"}, "--eviction nosuch"},
		{[]string{"--size", "gawk"}, `--size "gawk": want NAME=SIZE`},
		{[]string{"--size", "nosuch=1MiB"}, `--size "nosuch=1MiB": want NAME=SIZE`},
		{[]string{"--size", "gawk=lots"}, "--size gawk=lots: want a size above 0"},
		{[]string{"--timeout", "-1s"}, "--timeout -1s"},
		{[]string{"--trace", "/proc/uvm-no-such-dir"}, "--trace"},
	} {
		err := benchRun(c.args)
		assert.ErrorContains(t, err, c.want, "%v", c.args)
	}
}

func TestBenchCliffFlags(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--programs", "loop,nosuch"}, `--programs: unknown program "nosuch": want a comma list of loop, walk, gawk`},
		{[]string{"--programs", " , "}, `--programs " , ": want at least one of`},
		{[]string{"--budgets", "100,0"}, `--budgets: "0" is not a percentage of the peak: want a number above 0 and at most 100`},
		{[]string{"--budgets", "150"}, `--budgets: "150" is not a percentage`},
		{[]string{"--budgets", "half"}, `--budgets: "half" is not a percentage`},
		{[]string{"--budgets", ","}, `--budgets ",": want at least one percentage`},
		{[]string{"--runs", "0"}, "--runs 0: want at least 1"},
		{[]string{"--timeout", "-1s"}, "--timeout -1s: want a positive duration"},
		{[]string{"--size", "loop"}, `--size "loop": want NAME=SIZE`},
		{[]string{"--size", "nosuch=1MiB"}, `--size "nosuch=1MiB": want NAME=SIZE`},
		{[]string{"--size", "perl=lots"}, "--size perl=lots: want a size above 0"},
		{[]string{"--size", "walk=64KiB"}, "--size walk=64KiB: the array of walk must be a multiple of 4KiB and at least 1MiB"},
		{[]string{"--eviction", "nosuch"}, "--eviction nosuch"},
		{[]string{"--thrashing", "refault=maybe"}, "--thrashing refault=maybe"},
		{[]string{"--png", "/tmp/cliff.jpg"}, "--png /tmp/cliff.jpg: want a file name ending in .png, or a directory"},
		{[]string{"--png", "/proc/uvm-no-such-dir/cliff.png"}, "--png /proc/uvm-no-such-dir/cliff.png: cannot write there"},
	} {
		err := benchCliff(c.args)
		assert.ErrorContains(t, err, c.want, "%v", c.args)
	}
}
