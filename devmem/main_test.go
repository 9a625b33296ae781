package devmem

import (
	"bytes"
	"errors"
	"os"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/softuvm/softuvm/internal/fdleak"
)

// TestMain fails the run if any test leaves a descriptor open: every
// File, probe and dup must be closed, or a leak check elsewhere would
// blame the pages it pins on the wrong code.
func TestMain(m *testing.M) {
	// The private tmpfs of large folios lives as long as the process,
	// like the runtime's poller: open it before the leak check looks.
	_ = LargeFoliosAvailable()
	os.Exit(fdleak.Run(m.Run))
}

// newFile creates a location file closed when the test ends.
func newFile(t *testing.T, size int64) *File {
	t.Helper()
	f, err := CreateFile("test-"+t.Name(), size)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, f.Close()) })
	return f
}

// mapFile maps a range unmapped when the test ends.
func mapFile(t *testing.T, f *File, off, length int64) *Mapping {
	t.Helper()
	m, err := f.Map(off, length)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, m.Unmap()) })
	return m
}

// pattern returns n bytes that differ from page to page and byte to byte,
// seeded so that two patterns with different seeds differ everywhere.
func pattern(n int, seed byte) []byte {
	p := make([]byte, n)
	for i := range p {
		p[i] = byte(i*7+i/PageSize) ^ seed
	}
	return p
}

func readAll(t *testing.T, f *File, off int64, n int) []byte {
	t.Helper()
	p := make([]byte, n)
	_, err := f.ReadAt(p, off)
	require.NoError(t, err)
	return p
}

func isZero(p []byte) bool { return bytes.Count(p, []byte{0}) == len(p) }

// skipUnlessMbind skips tests of the NUMA path where the kernel or a
// sandbox refuses mbind outright; any other failure is a real failure.
func skipUnlessMbind(t *testing.T) {
	t.Helper()
	err := probeBind(0)
	if errors.Is(err, syscall.ENOSYS) || errors.Is(err, syscall.EPERM) {
		t.Skipf("mbind is not available here: %v", err)
	}
	require.NoError(t, err, "probing mbind on node 0")
}
