//go:build linux

package uffd

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

func TestHandshakeGrantsWhatIsAsked(t *testing.T) {
	want := FeatureThreadID | FeatureMissingShmem | FeatureEventRemap
	requireFeature(t, want)
	f := openT(t, NonBlock|CloseOnExec)
	got, err := f.Handshake(want)
	require.NoError(t, err)
	assert.Equal(t, want, got)
	assert.Equal(t, want, f.Features())
	assert.Equal(t, IoctlRegister|IoctlUnregister|IoctlAPI, f.Ioctls())
}

func TestHandshakeNothing(t *testing.T) {
	f := openT(t, NonBlock|CloseOnExec)
	got, err := f.Handshake(0)
	require.NoError(t, err)
	assert.Zero(t, got)
	assert.Equal(t, IoctlRegister|IoctlUnregister|IoctlAPI, f.Ioctls())
}

func TestHandshakeTwice(t *testing.T) {
	f := openT(t, NonBlock|CloseOnExec)
	_, err := f.Handshake(0)
	require.NoError(t, err)
	_, err = f.Handshake(0)
	require.Error(t, err)
	require.ErrorIs(t, err, ErrInvalid)
	var oe *OpError
	require.ErrorAs(t, err, &oe)
	assert.Equal(t, "api", oe.Op)
	assert.Equal(t, unix.EINVAL, oe.Unwrap())
	assert.Equal(t, "uffd api features 0: invalid argument (the handshake was already done on this fd, and the kernel accepts UFFDIO_API only once)", err.Error())
}

// TestHandshakeReceivedTwice: on an fd whose handshake was done elsewhere
// (NewFD without SetHandshaken) the kernel's refusal points at
// SetHandshaken.
func TestHandshakeReceivedTwice(t *testing.T) {
	g := openT(t, NonBlock|CloseOnExec)
	_, err := g.Handshake(0)
	require.NoError(t, err)
	fd, err := unix.Dup(g.Fd())
	require.NoError(t, err)
	f := NewFD(fd)
	defer f.Close()
	_, err = f.Handshake(FeatureThreadID)
	require.ErrorIs(t, err, ErrInvalid)
	assert.Contains(t, err.Error(), "use SetHandshaken")
}

func TestHandshakeMasksUnsupported(t *testing.T) {
	requireFeature(t, FeatureThreadID)
	sup, err := Supported()
	require.NoError(t, err)
	unknown := Feature(1) << 40
	require.Zero(t, sup&unknown)
	f := openT(t, NonBlock|CloseOnExec)
	got, err := f.Handshake(FeatureThreadID | unknown)
	require.NoError(t, err)
	assert.Equal(t, FeatureThreadID, got)
}

// TestHandshakeEachFeature asks for each supported feature alone, on a
// fresh fd.
func TestHandshakeEachFeature(t *testing.T) {
	sup, err := Supported()
	skipIfNoAccess(t, err)
	require.NoError(t, err)
	for bit := Feature(1); bit != 0 && bit <= sup; bit <<= 1 {
		if sup&bit == 0 {
			continue
		}
		t.Run(bit.String(), func(t *testing.T) {
			f := openT(t, NonBlock|CloseOnExec)
			got, err := f.Handshake(bit)
			require.NoError(t, err)
			want := bit
			if bit == FeatureWPAsync {
				want |= FeatureWPUnpopulated // implied by the kernel
			}
			assert.Equal(t, want, got)
		})
	}
}

func TestHandshakeEverything(t *testing.T) {
	sup, err := Supported()
	skipIfNoAccess(t, err)
	require.NoError(t, err)
	f := openT(t, NonBlock|CloseOnExec)
	got, err := f.Handshake(^Feature(0))
	require.NoError(t, err)
	assert.Equal(t, sup, got)
}

// TestOperationsBeforeHandshake: the kernel refuses everything but
// UFFDIO_API until the handshake, and the error says so.
func TestOperationsBeforeHandshake(t *testing.T) {
	f := openT(t, NonBlock|CloseOnExec)
	mem := mmapAnon(t, 1)
	_, err := f.Register(addr(mem), uintptr(pageSize), RegisterMissing)
	require.ErrorIs(t, err, ErrInvalid)
	assert.Contains(t, err.Error(), "no handshake recorded on this fd")
	var oe *OpError
	require.True(t, errors.As(err, &oe))
	assert.Equal(t, "register", oe.Op)
}
