//go:build linux

package uffd_test

import (
	"errors"
	"io"
	"os"
	"testing"

	"github.com/softuvm/softuvm/uffd"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestExamplePoller runs ExamplePoller, which Go cannot run as an example
// everywhere: it needs a userfaultfd that serves kernel-mode faults.
func TestExamplePoller(t *testing.T) {
	f, err := uffd.Open(uffd.CloseOnExec)
	if errors.Is(err, uffd.ErrPermission) && os.Geteuid() != 0 {
		t.Skipf("needs root (or access to /dev/userfaultfd) to serve kernel-mode faults: %v", err)
	}
	require.NoError(t, err)
	f.Close()

	r, w, err := os.Pipe()
	require.NoError(t, err)
	defer r.Close()
	stdout := os.Stdout
	os.Stdout = w
	func() {
		defer func() { os.Stdout = stdout }()
		ExamplePoller()
	}()
	w.Close()
	out, err := io.ReadAll(r)
	require.NoError(t, err)
	assert.Equal(t, "PAGEFAULT write: false thread known: true\nthe writer read \"hello\"\n", string(out))
}
