package workloads

import (
	"bytes"
	"crypto/sha256"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestWordsDistinct(t *testing.T) {
	seen := map[string]int{}
	for i := 0; i < 200_000; i++ {
		w := string(appendWord(nil, i))
		if j, ok := seen[w]; ok {
			t.Fatalf("words %d and %d are both %q", j, i, w)
		}
		seen[w] = i
	}
	assert.Equal(t, "baba", string(appendWord(nil, 0)))
}

// Every generator writes the same bytes for the same size and seed, and
// about size bytes.
func TestGeneratorsDeterministic(t *testing.T) {
	dir := t.TempDir()
	const size = 1 << 20
	for name, gen := range map[string]func(path string) error{
		"text": func(p string) error { return writeText(p, size, 1, 40) },
		"dag":  func(p string) error { return writeDAG(p, size, 2) },
		"csv":  func(p string) error { return writeRowsCSV(p, size, 3) },
		"json": func(p string) error { return writeJSONRecords(p, size, 4) },
		"log":  func(p string) error { return WriteLog(p, size, 5) },
	} {
		var sums [2][32]byte
		for i := range sums {
			p := filepath.Join(dir, name)
			require.NoError(t, gen(p))
			b, err := os.ReadFile(p)
			require.NoError(t, err)
			assert.InDelta(t, size, len(b), 1000, name)
			sums[i] = sha256.Sum256(b)
		}
		assert.Equal(t, sums[0], sums[1], "%s: two generations differ", name)
	}
}

func TestSelect(t *testing.T) {
	all, err := Select("")
	require.NoError(t, err)
	assert.Equal(t, len(Set()), len(all))
	ps, err := Select("sort,gawk")
	require.NoError(t, err)
	require.Len(t, ps, 2)
	assert.Equal(t, "gawk", ps[0].Name, "the set's order")
	_, err = Select("gawk,nosuch")
	assert.ErrorContains(t, err, "unknown program(s) nosuch")
	real := 0
	for _, p := range Set() {
		if !p.Checker {
			real++
		}
		assert.NotEmpty(t, p.Package, p.Name)
		assert.Positive(t, p.DefaultSize, p.Name)
	}
	assert.GreaterOrEqual(t, real, 7)
}

// All is the set and the compressors, which need flags of their own
// under uvm run; Lookup finds any of them, and only them.
func TestAllAndLookup(t *testing.T) {
	assert.Equal(t, append(Names(), "gzip", "xz"), AllNames())
	for _, name := range AllNames() {
		p, ok := Lookup(name)
		require.True(t, ok, name)
		assert.Equal(t, name, p.Name)
	}
	gz, _ := Lookup("gzip")
	assert.Equal(t, []string{"--min-size", "512KiB"}, gz.UVMFlags)
	_, ok := Lookup("nosuch")
	assert.False(t, ok)
	_, err := Select("gzip")
	assert.ErrorContains(t, err, "unknown program(s) gzip", "uvm bench run's set is unchanged")
}

func TestBudget(t *testing.T) {
	assert.Equal(t, int64(4<<20), Budget(1<<20, 0.25, 4<<20), "at least the least")
	assert.Equal(t, int64(26<<20), Budget(100<<20+1, 0.25, 4<<20), "rounded up to a MiB")
	assert.Equal(t, int64(25<<20), Budget(100<<20, 0.25, 4<<20))
}

// Compare finds a single byte changed, a file cut short and a missing
// output file, and says where.
func TestCompare(t *testing.T) {
	dir := t.TempDir()
	w := &Workload{Program: Program{Name: "p"}, Outputs: []string{"out.bin"}}
	data := bytes.Repeat([]byte("0123456789abcdef"), 300_000) // more than one read
	mk := func(name string, stdout, out []byte) *Run {
		d := filepath.Join(dir, name)
		require.NoError(t, os.MkdirAll(d, 0o755))
		require.NoError(t, os.WriteFile(filepath.Join(d, StdoutName), stdout, 0o644))
		if out != nil {
			require.NoError(t, os.WriteFile(filepath.Join(d, "out.bin"), out, 0o644))
		}
		return &Run{Dir: d}
	}
	want := mk("want", data, []byte("output"))
	assert.NoError(t, w.Compare(want, mk("same", data, []byte("output"))))

	flipped := bytes.Clone(data)
	flipped[3_000_001] ^= 1
	err := w.Compare(want, mk("flipped", flipped, []byte("output")))
	assert.ErrorContains(t, err, "p's stdout: differs at byte 3000001")

	err = w.Compare(want, mk("short", data[:len(data)-5], []byte("output")))
	assert.ErrorContains(t, err, "p's stdout: 4799995 bytes, want 4800000")

	err = w.Compare(want, mk("nofile", data, nil))
	require.Error(t, err)
	assert.True(t, strings.Contains(err.Error(), "p's out.bin"), "%v", err)

	w.Program.Checker = true
	assert.NoError(t, w.Compare(want, mk("checker", flipped, nil)), "checkers' outputs are not compared")
}

func TestCheckers(t *testing.T) {
	assert.NoError(t, checkMemtester("Loop 1/1:\n  Stuck Address       : ok\n  Random Value        : ok\n\nDone.\n"))
	assert.ErrorContains(t, checkMemtester("  Random Value        : FAILURE: 0x1 != 0x3 at offset 0x10.\nDone.\n"), "FAILURE")
	assert.ErrorContains(t, checkMemtester("Loop 1/1:\n"), "did not finish")
	assert.NoError(t, checkStressNG("stress-ng: info:  [1] dispatching hogs: 1 vm\nstress-ng: info:  [1] successful run completed in 1.45s\n"))
	assert.ErrorContains(t, checkStressNG("stress-ng: fail:  [2] stress-ng-vm: detected 1 bit errors while stressing memory\nstress-ng: info:  [1] successful run completed in 1.45s\n"), "detected 1 bit errors")
	assert.ErrorContains(t, checkStressNG("stress-ng: info:  [1] unsuccessful run completed in 1.45s\n"), "did not report a successful run")
}
