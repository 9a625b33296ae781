//go:build linux

package uffd

import (
	"os"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// TestSupported compares the cached probe with a handshake of its own and
// checks that the probe ran once.
func TestSupported(t *testing.T) {
	sup, err := Supported()
	skipIfNoAccess(t, err)
	require.NoError(t, err)
	t.Logf("this kernel supports %#x: %v", uint64(sup), sup)

	// The feature set does not depend on the mode, and a user-mode-only fd
	// is allowed to everyone.
	f := openT(t, NonBlock|CloseOnExec|UserModeOnly)
	a := uffdioAPI{api: uffdAPI}
	require.NoError(t, ioctlAPI(f.Fd(), &a))
	assert.Equal(t, Feature(a.features), sup)

	for range 3 {
		again, err := Supported()
		require.NoError(t, err)
		assert.Equal(t, sup, again)
	}
	assert.Equal(t, int32(1), probeRuns.supported.Load(), "the probe runs once")
}

func TestCheckFeature(t *testing.T) {
	sup, err := Supported()
	skipIfNoAccess(t, err)
	require.NoError(t, err)
	require.NoError(t, CheckFeature(0))
	require.NoError(t, CheckFeature(sup))
	for bit := Feature(1); bit != 0; bit <<= 1 {
		err := CheckFeature(bit)
		if sup.Has(bit) {
			assert.NoError(t, err, "%v", bit)
			continue
		}
		var fe *FeatureError
		require.ErrorAs(t, err, &fe, "%v", bit)
		assert.Equal(t, bit, fe.Feature)
		assert.ErrorIs(t, err, ErrNotSupported)
	}
	err = CheckFeature(FeatureThreadID | 1<<40)
	assert.EqualError(t, err, "uffd: kernel does not support 0x10000000000")
	assert.ErrorIs(t, err, ErrNotSupported)
}

// TestOpenMethods compares the cached probe with fresh attempts.
func TestOpenMethods(t *testing.T) {
	dev, sys := OpenMethods()
	fd, err := openDevice(devicePath, CloseOnExec)
	if err == nil {
		unix.Close(fd)
	}
	assert.Equal(t, err == nil, dev == nil, "device: probe %v, now %v", dev, err)
	if dev != nil {
		assert.ErrorIs(t, dev, err.(unix.Errno))
	}
	fd, err = openSyscall(CloseOnExec)
	if err == nil {
		unix.Close(fd)
	}
	assert.Equal(t, err == nil, sys == nil, "syscall: probe %v, now %v", sys, err)
	if os.Geteuid() == 0 {
		assert.NoError(t, dev, "root opens /dev/userfaultfd")
		assert.NoError(t, sys, "root may call userfaultfd(2)")
	}
	OpenMethods()
	assert.Equal(t, int32(1), probeRuns.openMethods.Load(), "the probe runs once")
	t.Logf("device: %v; syscall: %v", dev, sys)
}
