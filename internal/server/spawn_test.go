package server

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// goneProcess returns the process id of a child that has exited and been
// reaped.
func goneProcess(t *testing.T) int {
	t.Helper()
	cmd := exec.Command("true")
	require.NoError(t, cmd.Run())
	return cmd.Process.Pid
}

// socketNobodyListensOn leaves a unix socket file at path with no
// listener, as a server killed with SIGKILL does.
func socketNobodyListensOn(t *testing.T, path string) {
	t.Helper()
	l, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: path, Net: "unixpacket"})
	require.NoError(t, err)
	l.SetUnlinkOnClose(false)
	require.NoError(t, l.Close())
}

// ListenUnix removes the monitor sockets of private servers whose process
// is gone and on which nobody listens, and leaves every other file.
func TestListenUnixRemovesStaleMonitors(t *testing.T) {
	dir := t.TempDir()
	at := func(format string, pid int) string { return filepath.Join(dir, fmt.Sprintf(format, pid)) }
	gone, goneToo := goneProcess(t), goneProcess(t)

	stale := at("uvm-%d.sock", gone)
	socketNobodyListensOn(t, stale)
	mine := at("uvm-%d.sock", os.Getpid()) // alive, not listening yet
	socketNobodyListensOn(t, mine)
	orphan := at("uvm-%d.sock", goneToo) // its process gone, its server still there
	l, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: orphan, Net: "unixpacket"})
	require.NoError(t, err)
	defer l.Close()
	notMonitors := []string{at("uvm-%d.sock.old", gone), at("uvm-0%d.sock", gone), at("other-%d.sock", gone)}
	for _, p := range notMonitors {
		require.NoError(t, os.WriteFile(p, nil, 0o600))
	}

	daemon, err := ListenUnix(filepath.Join(dir, "uvm.sock"))
	require.NoError(t, err)
	defer daemon.Close()

	assert.NoFileExists(t, stale, "the monitor of a process that is gone, nobody listening")
	assert.FileExists(t, mine, "the monitor of a live process")
	assert.FileExists(t, orphan, "a monitor a server still listens on")
	for _, p := range notMonitors {
		assert.FileExists(t, p, "not a monitor socket's name")
	}
}
