package bench

import (
	_ "embed"
	"fmt"
	"iter"
	"regexp"
	"strconv"
	"strings"

	"github.com/softuvm/softuvm/internal/bench/workloads"
	"github.com/softuvm/softuvm/lab"
)

// The synthetic programs of the budget curve, a loop and a random walk
// over an array: C programs built at run time, whose page reference
// strings are computed here, exactly, for LRU's and MIN's faults.

// walkSeed is the random walk's xorshift64 seed.
const walkSeed = 0x9e3779b97f4a7c15

// loopSweeps is how many times the loop sweeps its array.
const loopSweeps = 20

// walkBytesPerStep: the walk makes one step per walkBytesPerStep bytes
// of its array (a million steps over 128 MiB).
const walkBytesPerStep = 128

//go:embed csrc/cliff_walk.c
var cliffWalkSource string

// cliffSynthetic is a synthetic program of the curve: a C program built
// at run time whose page reference string is computed here.
type cliffSynthetic struct {
	name, summary string
	source, file  string // the C source and its file name
	defaultSize   int64  // the array's bytes
	args          func(size int64) []string
	// refs is the page reference string of a run (pages numbered from
	// the array's first), each page with whether the reference stores.
	refs  func(size int64) iter.Seq2[uint64, bool]
	check func(size int64, out string) error
}

var cliffSynthetics = []cliffSynthetic{
	{
		name: "loop", file: "oversub_sweep.c", source: oversubSweepSource, defaultSize: 128 << 20,
		summary: fmt.Sprintf("writes an array once, then reads and writes every 8-byte word of it in order %d times (a loop over the whole array), and checks every word (internal/bench/csrc/oversub_sweep.c)", loopSweeps),
		args:    func(size int64) []string { return []string{strconv.FormatInt(size, 10), strconv.Itoa(loopSweeps)} },
		refs:    func(size int64) iter.Seq2[uint64, bool] { return loopRefs(uint64(size/lab.PageSize), loopSweeps) },
		check: func(_ int64, out string) error {
			if !sweepLine.MatchString(out) {
				return fmt.Errorf("the loop printed %q, want a line ending in ok (its check of every word)", strings.TrimSpace(out))
			}
			return nil
		},
	},
	{
		name: "walk", file: "cliff_walk.c", source: cliffWalkSource, defaultSize: 128 << 20,
		summary: fmt.Sprintf("writes an array once, then makes one read-modify-write of an 8-byte word chosen by xorshift64 (seed %#x) per %d bytes of the array, then reads every word and checks two sums (internal/bench/csrc/cliff_walk.c)", uint64(walkSeed), walkBytesPerStep),
		args: func(size int64) []string {
			return []string{strconv.FormatInt(size, 10), strconv.FormatInt(size/walkBytesPerStep, 10), fmt.Sprintf("%#x", uint64(walkSeed))}
		},
		refs: func(size int64) iter.Seq2[uint64, bool] {
			return walkRefs(uint64(size), uint64(size/walkBytesPerStep), walkSeed)
		},
		check: func(size int64, out string) error {
			m := walkLine.FindStringSubmatch(out)
			if m == nil {
				return fmt.Errorf("the walk printed %q, want a line ending in ok (its check of the array's sums)", strings.TrimSpace(out))
			}
			if want := fmt.Sprintf("%016x", walkHash(uint64(size/8), uint64(size/walkBytesPerStep), walkSeed)); m[1] != want {
				return fmt.Errorf("the walk visited words whose hash is %s, but the walk computed here gives %s: the reference string counted here would not be the program's", m[1], want)
			}
			return nil
		},
	},
}

var walkLine = regexp.MustCompile(`cliff_walk: bytes=\d+ steps=\d+ seed=0x[0-9a-f]+ indices=([0-9a-f]{16}) ok`)

func syntheticNamed(name string) (cliffSynthetic, bool) {
	for _, s := range cliffSynthetics {
		if s.name == name {
			return s, true
		}
	}
	return cliffSynthetic{}, false
}

// cliffProgramNames is every name --programs takes.
func CliffProgramNames() []string {
	var names []string
	for _, s := range cliffSynthetics {
		names = append(names, s.name)
	}
	return append(names, workloads.AllNames()...)
}

// loopRefs is oversub_sweep's page reference string over an array of
// pages pages: a pass writing every page (its first write), sweeps
// passes reading and writing every page, and a pass reading them.
func loopRefs(pages uint64, sweeps int) iter.Seq2[uint64, bool] {
	return func(yield func(uint64, bool) bool) {
		for pass := 0; pass < sweeps+2; pass++ {
			store := pass <= sweeps
			for p := range pages {
				if !yield(p, store) {
					return
				}
			}
		}
	}
}

// walkIndices yields the words cliff_walk.c visits, in order: xorshift64
// (13, 7, 17) from seed, each value modulo words.
func walkIndices(words, steps, seed uint64) iter.Seq[uint64] {
	return func(yield func(uint64) bool) {
		x := seed
		for range steps {
			x ^= x << 13
			x ^= x >> 7
			x ^= x << 17
			if !yield(x % words) {
				return
			}
		}
	}
}

// walkHash is the hash cliff_walk.c prints of the indices it visited:
// FNV-1a, 64-bit, a word at a time.
func walkHash(words, steps, seed uint64) uint64 {
	h := uint64(0xcbf29ce484222325)
	for i := range walkIndices(words, steps, seed) {
		h = (h ^ i) * 0x100000001b3
	}
	return h
}

// walkRefs is cliff_walk's page reference string over an array of bytes:
// a pass writing every page, a store to the page of each word the walk
// visits, and a pass reading every page.
func walkRefs(bytes, steps, seed uint64) iter.Seq2[uint64, bool] {
	pages := bytes / lab.PageSize
	return func(yield func(uint64, bool) bool) {
		for p := range pages {
			if !yield(p, true) {
				return
			}
		}
		for i := range walkIndices(bytes/8, steps, seed) {
			if !yield(i*8/lab.PageSize, true) {
				return
			}
		}
		for p := range pages {
			if !yield(p, false) {
				return
			}
		}
	}
}
