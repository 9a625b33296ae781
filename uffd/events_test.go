//go:build linux

package uffd

import (
	"os"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestEvents reads the non-cooperative events of a client process: the C
// helper creates and registers the userfaultfd, sends it over a socket
// (NewFD, SetHandshaken), then forks, mremaps, madvises, faults and
// munmaps, each blocking until the test has read the event. The fork event
// brings a second userfaultfd, for the child, whose fault the test serves
// too. A moving mremap reports REMAP and then UNMAP of the old range.
func TestEvents(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: EVENT_FORK needs CAP_SYS_PTRACE, and the helper handles kernel-mode faults")
	}
	requireFeature(t, FeatureEventFork|FeatureEventRemap|FeatureEventRemove|FeatureEventUnmap|FeatureThreadID)
	h := startHelper(t, "events")
	f := h.f
	require.True(t, isUserfaultfd(t, f.Fd()))
	features := Feature(h.init["features"])
	assert.Equal(t, FeatureEventFork|FeatureEventRemap|FeatureEventRemove|FeatureEventUnmap|FeatureThreadID, features)
	assert.Equal(t, IoctlRegister|IoctlUnregister|IoctlAPI, Ioctl(h.init["ioctls"]))
	f.SetHandshaken(features, Ioctl(h.init["ioctls"]))
	a, length := h.init["addr"], h.init["len"]
	page := uint64(pageSize)
	h.proceed(t)

	// FORK
	h.expect(t, "fork")
	m := waitMsg(t, f)
	require.Equal(t, EventFork, m.Event, "%v", m)
	require.Positive(t, m.ChildFD)
	child := NewFD(m.ChildFD)
	defer child.Close()
	assert.True(t, isUserfaultfd(t, child.Fd()), "the fork event's fd is a userfaultfd")
	_, err := child.Handshake(0)
	require.ErrorIs(t, err, ErrInvalid, "the child's fd inherits the parent's handshake")
	child.SetHandshaken(features, Ioctl(h.init["ioctls"]))

	pid := h.expect(t, "forked")["pid"]
	cm := waitMsg(t, child)
	assert.Equal(t, EventPagefault, cm.Event)
	assert.Equal(t, a, cm.Address, "the child faults at the same address")
	assert.Equal(t, PagefaultWrite, cm.Flags)
	assert.Equal(t, uint32(pid), cm.TID, "the child's thread")
	_, err = child.Copy(uintptr(cm.Address), fill(pageSize, 'F'), 0)
	require.NoError(t, err, "copy into the child")
	assert.Equal(t, uint64(0), h.expect(t, "child")["status"], "the child saw the page")
	require.NoError(t, child.Close())

	// REMAP
	want := h.expect(t, "remap")
	m = waitMsg(t, f)
	require.Equal(t, EventRemap, m.Event, "%v", m)
	assert.Equal(t, want["from"], m.From)
	assert.Equal(t, a, m.From)
	assert.Equal(t, want["to"], m.To)
	assert.Equal(t, want["len"], m.Len)
	assert.Equal(t, length, m.Len)
	b := m.To
	// The same mremap then reports the old range as unmapped, and blocks
	// until that is read too.
	m = waitMsg(t, f)
	require.Equal(t, EventUnmap, m.Event, "%v", m)
	assert.Equal(t, a, m.Start)
	assert.Equal(t, a+length, m.End)

	// REMOVE
	want = h.expect(t, "remove")
	m = waitMsg(t, f)
	require.Equal(t, EventRemove, m.Event, "%v", m)
	assert.Equal(t, want["start"], m.Start)
	assert.Equal(t, want["end"], m.End)
	assert.Equal(t, b, m.Start)
	assert.Equal(t, b+2*page, m.End)

	// A page fault in the moved range, from the helper's own thread.
	want = h.expect(t, "fault")
	m = waitMsg(t, f)
	require.Equal(t, EventPagefault, m.Event, "%v", m)
	assert.Equal(t, want["addr"]&^(page-1), m.Address)
	assert.Equal(t, b+2*page, m.Address)
	assert.Equal(t, PagefaultWrite, m.Flags)
	assert.Equal(t, uint32(want["tid"]), m.TID)
	assert.Equal(t, uint32(h.init["pid"]), m.TID)
	_, err = f.Copy(uintptr(m.Address), fill(pageSize, 'P'), 0)
	require.NoError(t, err, "copy into another process")
	assert.Equal(t, uint64(1), h.expect(t, "faulted")["ok"], "the helper saw the page")

	// UNMAP
	want = h.expect(t, "unmap")
	m = waitMsg(t, f)
	require.Equal(t, EventUnmap, m.Event, "%v", m)
	assert.Equal(t, want["start"], m.Start)
	assert.Equal(t, want["end"], m.End)
	assert.Equal(t, b, m.Start)
	assert.Equal(t, b+length, m.End)

	h.expect(t, "done")
	h.exit(t)
	requireNoMsg(t, f, 0)
}
