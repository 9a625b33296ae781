//go:build linux

package uffd

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// registerFeatures is the feature set (0x17f31) that a reference
// measurement of this kernel's userfaultfd costs (2026-11-21) asked for:
// the masks below are what the kernel allowed it.
const registerFeatures = FeaturePagefaultFlagWP | FeatureMissingHugetlbfs | FeatureMissingShmem |
	FeatureThreadID | FeatureMinorHugetlbfs | FeatureMinorShmem | FeatureExactAddress |
	FeatureWPHugetlbfsShmem | FeatureWPUnpopulated | FeaturePoison | FeatureMove

// TestRegisterMasks registers each memory type in each mode and compares
// the ioctls the kernel allows with the anchor measurement of this kernel.
func TestRegisterMasks(t *testing.T) {
	require.Equal(t, Feature(0x17f31), registerFeatures)
	cases := []struct {
		shmem bool
		mode  RegisterMode
		want  Ioctl // from the anchor file
	}{
		{false, RegisterMissing, 0x13c},
		{false, RegisterWP, 0x17c},
		{false, RegisterMissing | RegisterWP, 0x17c},
		{true, RegisterMissing, 0x13c},
		{true, RegisterMinor, 0x1bc},
		{true, RegisterWP, 0x17c},
		{true, RegisterMinor | RegisterWP, 0x1fc},
		{true, RegisterMissing | RegisterMinor, 0x1bc},
	}
	f := handshakeT(t, registerFeatures)
	for _, c := range cases {
		kind := "anon"
		if c.shmem {
			kind = "shmem"
		}
		t.Run(fmt.Sprintf("%s/%v", kind, c.mode), func(t *testing.T) {
			var mem []byte
			if c.shmem {
				_, mem = memfdT(t, 2)
			} else {
				mem = mmapAnon(t, 2)
			}
			got, err := f.Register(addr(mem), uintptr(len(mem)), c.mode)
			require.NoError(t, err)
			assert.Equal(t, c.want, got, "got %v, want %v", got, c.want)
			require.NoError(t, f.Unregister(addr(mem), uintptr(len(mem))))
		})
	}
}

// TestRegisterMinorAnon: minor faults exist only for memory with a page
// cache, so the kernel refuses MINOR on anonymous memory.
func TestRegisterMinorAnon(t *testing.T) {
	f := handshakeT(t, registerFeatures)
	mem := mmapAnon(t, 1)
	ioctls, err := f.Register(addr(mem), uintptr(pageSize), RegisterMinor)
	require.Error(t, err)
	assert.Zero(t, ioctls)
	var oe *OpError
	require.ErrorAs(t, err, &oe)
	assert.Equal(t, "register", oe.Op)
	assert.Equal(t, uint64(addr(mem)), oe.Start)
	assert.Equal(t, uint64(pageSize), oe.Length)
	assert.Equal(t, unix.EINVAL, oe.Err)
	assert.ErrorIs(t, err, ErrInvalid)
	assert.Equal(t, fmt.Sprintf("uffd register 0x%x+%d mode MINOR: invalid argument", addr(mem), pageSize), err.Error())
}

func TestRegisterMisaligned(t *testing.T) {
	f := handshakeT(t, 0)
	mem := mmapAnon(t, 2)
	_, err := f.Register(addr(mem)+1, uintptr(pageSize), RegisterMissing)
	require.ErrorIs(t, err, ErrInvalid)
	_, err = f.Register(addr(mem), 100, RegisterMissing)
	require.ErrorIs(t, err, ErrInvalid)
}

// TestRegisterBusy: a range belongs to one userfaultfd at a time.
func TestRegisterBusy(t *testing.T) {
	f := handshakeT(t, 0)
	g := handshakeT(t, 0)
	mem := mmapAnon(t, 1)
	_, err := f.Register(addr(mem), uintptr(pageSize), RegisterMissing)
	require.NoError(t, err)
	_, err = g.Register(addr(mem), uintptr(pageSize), RegisterMissing)
	require.ErrorIs(t, err, unix.EBUSY)
	assert.Contains(t, err.Error(), "registered with another userfaultfd")
}

// TestCloseWakesFaults: closing the userfaultfd wakes the threads waiting
// in its faults, which then retry as if nothing were registered (anonymous
// memory: zero fill).
func TestCloseWakesFaults(t *testing.T) {
	f := handshakeT(t, 0)
	mem := mmapAnon(t, 1)
	_, err := f.Register(addr(mem), uintptr(pageSize), RegisterMissing)
	require.NoError(t, err)
	fl, r := kernelRead(t, f, mem)
	waitMsg(t, f)
	fl.requireBlocked(t, 20*time.Millisecond)
	require.NoError(t, f.Close())
	n, err := fl.wait(t)
	require.NoError(t, err)
	assert.Equal(t, pageSize, n)
	assert.Equal(t, make([]byte, pageSize), readPipe(t, r, pageSize))
}

// TestUnregister: after Unregister a kernel access completes by itself
// (zero fill) and produces no message; registering again works.
func TestUnregister(t *testing.T) {
	f := handshakeT(t, 0)
	mem := mmapAnon(t, 2)
	_, err := f.Register(addr(mem), uintptr(len(mem)), RegisterMissing)
	require.NoError(t, err)
	require.NoError(t, f.Unregister(addr(mem), uintptr(pageSize)))

	fl, r := kernelRead(t, f, mem[:pageSize])
	n, err := fl.wait(t)
	require.NoError(t, err)
	require.Equal(t, pageSize, n)
	assert.Equal(t, make([]byte, pageSize), readPipe(t, r, pageSize))
	requireNoMsg(t, f, 50*time.Millisecond)

	// The second page is still registered.
	fl, r = kernelRead(t, f, mem[pageSize:])
	m := waitMsg(t, f)
	assert.Equal(t, uint64(addr(mem)+uintptr(pageSize)), m.Address)
	_, err = f.ZeroPage(addr(mem)+uintptr(pageSize), uintptr(pageSize), false)
	require.NoError(t, err)
	_, err = fl.wait(t)
	require.NoError(t, err)
	readPipe(t, r, pageSize)

	require.NoError(t, f.Unregister(addr(mem), uintptr(len(mem))))
	_, err = f.Register(addr(mem), uintptr(len(mem)), RegisterMissing)
	require.NoError(t, err)
}
