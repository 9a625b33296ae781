//go:build linux

package uffd

import (
	"errors"
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

func TestFeatureString(t *testing.T) {
	for f, want := range map[Feature]string{
		0:                                        "0",
		FeatureMissingShmem | FeatureThreadID:    "MISSING_SHMEM|THREAD_ID",
		FeaturePagefaultFlagWP:                   "PAGEFAULT_FLAG_WP",
		FeatureMove:                              "MOVE",
		0x1ffff:                                  "PAGEFAULT_FLAG_WP|EVENT_FORK|EVENT_REMAP|EVENT_REMOVE|MISSING_HUGETLBFS|MISSING_SHMEM|EVENT_UNMAP|SIGBUS|THREAD_ID|MINOR_HUGETLBFS|MINOR_SHMEM|EXACT_ADDRESS|WP_HUGETLBFS_SHMEM|WP_UNPOPULATED|POISON|WP_ASYNC|MOVE",
		FeatureMove | 1<<17 | 1<<40:              "MOVE|0x10000020000",
		1 << 63:                                  "0x8000000000000000",
		FeatureWPAsync | FeatureWPHugetlbfsShmem: "WP_HUGETLBFS_SHMEM|WP_ASYNC",
	} {
		assert.Equal(t, want, f.String())
	}
	assert.Equal(t, knownFeatures, Feature(0x1ffff))
	assert.Len(t, featureNames, 17)
}

func TestFeatureHas(t *testing.T) {
	f := FeatureMove | FeatureThreadID
	assert.True(t, f.Has(FeatureMove))
	assert.True(t, f.Has(FeatureMove|FeatureThreadID))
	assert.False(t, f.Has(FeatureMove|FeaturePoison))
	assert.True(t, f.Has(0))
}

func TestIoctlString(t *testing.T) {
	for i, want := range map[Ioctl]string{
		0:                                     "0",
		IoctlWake | IoctlCopy | IoctlZeropage: "WAKE|COPY|ZEROPAGE",
		0x13c:                                 "WAKE|COPY|ZEROPAGE|MOVE|POISON",
		0x1fc:                                 "WAKE|COPY|ZEROPAGE|MOVE|WRITEPROTECT|CONTINUE|POISON",
		0x8000000000000003:                    "REGISTER|UNREGISTER|API",
		IoctlContinue | 1<<20:                 "CONTINUE|0x100000",
	} {
		assert.Equal(t, want, i.String())
	}
	assert.True(t, Ioctl(0x17c).Has(IoctlWriteProtect|IoctlCopy))
	assert.False(t, Ioctl(0x13c).Has(IoctlWriteProtect))
}

func TestOtherStrings(t *testing.T) {
	assert.Equal(t, "MISSING|WP|MINOR", (RegisterMissing | RegisterWP | RegisterMinor).String())
	assert.Equal(t, "MINOR|0x8", (RegisterMinor | 8).String())
	assert.Equal(t, "0", PagefaultFlag(0).String())
	assert.Equal(t, "WRITE|MINOR", (PagefaultWrite | PagefaultMinor).String())
	assert.Equal(t, "WRITE|WP", (PagefaultWrite | PagefaultWP).String())
	for e, want := range map[Event]string{EventPagefault: "PAGEFAULT", EventFork: "FORK", EventRemap: "REMAP", EventRemove: "REMOVE", EventUnmap: "UNMAP", 0: "Event(0x0)", 0xff: "Event(0xff)"} {
		assert.Equal(t, want, e.String())
	}
	assert.Equal(t, "/dev/userfaultfd", MethodDevice.String())
	assert.Equal(t, "userfaultfd(2)", MethodSyscall.String())
	assert.Equal(t, "received", OpenMethod(0).String())
	assert.Equal(t, "OpenMethod(7)", OpenMethod(7).String())
}

func TestOpError(t *testing.T) {
	err := error(&OpError{Op: "copy", Start: 0x7f0000000000, Length: 4096, Err: unix.EEXIST})
	assert.Equal(t, "uffd copy 0x7f0000000000+4096: file exists", err.Error())
	assert.ErrorIs(t, err, ErrExist)
	assert.ErrorIs(t, err, unix.EEXIST)
	assert.NotErrorIs(t, err, ErrAgain)
	assert.Equal(t, unix.EEXIST, errors.Unwrap(err))
	var errno unix.Errno
	require.ErrorAs(t, err, &errno)
	assert.Equal(t, unix.EEXIST, errno)

	wrapped := fmt.Errorf("serving fault: %w", err)
	var oe *OpError
	require.ErrorAs(t, wrapped, &oe)
	assert.Equal(t, uint64(4096), oe.Length)
	assert.ErrorIs(t, wrapped, ErrExist)

	for _, c := range []struct {
		err  error
		want error
	}{
		{ErrExist, unix.EEXIST}, {ErrNoEntry, unix.ENOENT}, {ErrAgain, unix.EAGAIN},
		{ErrProcessGone, unix.ESRCH}, {ErrInvalid, unix.EINVAL}, {ErrFault, unix.EFAULT},
	} {
		assert.Equal(t, c.want, c.err)
	}

	assert.Equal(t, "uffd read: bad file descriptor", (&OpError{Op: "read", noRange: true, Err: unix.EBADF}).Error())
	assert.Equal(t, "uffd move 0x2000+4096 from 0x1000: no such file or directory (why)",
		(&OpError{Op: "move", Start: 0x2000, Length: 4096, detail: "from 0x1000", hint: "why", Err: unix.ENOENT}).Error())
	assert.Equal(t, "uffd wake 0x0+0: <nil>", (&OpError{Op: "wake"}).Error())
}

func TestFeatureError(t *testing.T) {
	err := error(&FeatureError{Feature: FeatureMove | FeaturePoison})
	assert.Equal(t, "uffd: kernel does not support POISON|MOVE", err.Error())
	assert.ErrorIs(t, err, ErrNotSupported)
	assert.ErrorIs(t, err, errors.ErrUnsupported)
	assert.NotErrorIs(t, err, ErrInvalid)
	var fe *FeatureError
	require.ErrorAs(t, fmt.Errorf("x: %w", err), &fe)
	assert.Equal(t, FeatureMove|FeaturePoison, fe.Feature)
}
