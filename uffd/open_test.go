//go:build linux

package uffd

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// isUserfaultfd reports whether fd refers to a userfaultfd.
func isUserfaultfd(t testing.TB, fd int) bool {
	t.Helper()
	target, err := os.Readlink(fmt.Sprintf("/proc/self/fd/%d", fd))
	require.NoError(t, err)
	return target == "anon_inode:[userfaultfd]"
}

func TestOpenDevice(t *testing.T) {
	if dev, _ := OpenMethods(); dev != nil && os.Geteuid() != 0 {
		t.Skipf("needs root (or access to %s): %v", devicePath, dev)
	}
	f := openT(t, NonBlock|CloseOnExec)
	assert.Equal(t, MethodDevice, f.Method())
	assert.Equal(t, "/dev/userfaultfd", f.Method().String())
	assert.True(t, isUserfaultfd(t, f.Fd()))
}

// TestOpenFallback points the device path at nothing: Open must fall back
// to the system call.
func TestOpenFallback(t *testing.T) {
	if _, sys := OpenMethods(); sys != nil && os.Geteuid() != 0 {
		t.Skipf("needs root (or vm.unprivileged_userfaultfd=1): %v", sys)
	}
	setDevicePath(t, filepath.Join(t.TempDir(), "no-such-device"))
	f := openT(t, NonBlock|CloseOnExec)
	assert.Equal(t, MethodSyscall, f.Method())
	assert.Equal(t, "userfaultfd(2)", f.Method().String())
	assert.True(t, isUserfaultfd(t, f.Fd()))
	// The fallback fd works like the other.
	_, err := f.Handshake(0)
	require.NoError(t, err)
}

// methodT prepares a subtest to open through method: it points the device
// path at nothing for MethodSyscall, and skips when this process may not use
// the method and is not root.
func methodT(t *testing.T, method OpenMethod) {
	dev, sys := OpenMethods()
	if method == MethodSyscall {
		setDevicePath(t, "/nonexistent/userfaultfd")
	}
	if err := map[OpenMethod]error{MethodDevice: dev, MethodSyscall: sys}[method]; err != nil && os.Geteuid() != 0 {
		t.Skipf("needs root (or access through %v): %v", method, err)
	}
}

func setDevicePath(t *testing.T, p string) {
	old := devicePath
	devicePath = p
	t.Cleanup(func() { devicePath = old })
}

// TestOpenFlags checks each flag on the fd, through both ways of opening.
func TestOpenFlags(t *testing.T) {
	for _, method := range []OpenMethod{MethodDevice, MethodSyscall} {
		t.Run(method.String(), func(t *testing.T) {
			methodT(t, method)
			for _, flags := range []OpenFlag{0, NonBlock, CloseOnExec, NonBlock | CloseOnExec} {
				f := openT(t, flags)
				require.Equal(t, method, f.Method())
				fl, err := unix.FcntlInt(uintptr(f.Fd()), unix.F_GETFL, 0)
				require.NoError(t, err)
				assert.Equal(t, flags&NonBlock != 0, fl&unix.O_NONBLOCK != 0, "O_NONBLOCK with flags %d", flags)
				fdfl, err := unix.FcntlInt(uintptr(f.Fd()), unix.F_GETFD, 0)
				require.NoError(t, err)
				assert.Equal(t, flags&CloseOnExec != 0, fdfl&unix.FD_CLOEXEC != 0, "FD_CLOEXEC with flags %d", flags)
				require.NoError(t, f.Close())
			}
		})
	}
}

// TestOpenUserModeOnly checks that a UserModeOnly fd does not receive
// kernel-mode faults: the kernel's access fails with EFAULT at once.
func TestOpenUserModeOnly(t *testing.T) {
	for _, method := range []OpenMethod{MethodDevice, MethodSyscall} {
		t.Run(method.String(), func(t *testing.T) {
			methodT(t, method)
			f := openT(t, NonBlock|CloseOnExec|UserModeOnly)
			require.Equal(t, method, f.Method())
			_, err := f.Handshake(0)
			require.NoError(t, err)
			mem := mmapAnon(t, 1)
			_, err = f.Register(addr(mem), uintptr(pageSize), RegisterMissing)
			require.NoError(t, err)
			fl, _ := kernelRead(t, f, mem)
			_, err = fl.wait(t)
			require.ErrorIs(t, err, unix.EFAULT)
			requireNoMsg(t, f, 0)
		})
	}
}

func TestOpenUnknownFlag(t *testing.T) {
	_, err := Open(1 << 10)
	require.ErrorIs(t, err, ErrInvalid)
	assert.Contains(t, err.Error(), "unknown OpenFlag bits 0x400")
}

func TestNewFDAndClose(t *testing.T) {
	g := openT(t, CloseOnExec)
	fd, err := unix.Dup(g.Fd())
	require.NoError(t, err)
	f := NewFD(fd)
	assert.Equal(t, OpenMethod(0), f.Method())
	assert.Equal(t, fd, f.Fd())
	assert.Zero(t, f.Features())
	f.SetHandshaken(FeatureThreadID, IoctlAPI)
	assert.Equal(t, FeatureThreadID, f.Features())
	assert.Equal(t, IoctlAPI, f.Ioctls())
	require.NoError(t, f.Close())
	require.NoError(t, f.Close(), "a second Close")
	assert.Equal(t, -1, f.Fd())
	var st unix.Stat_t
	require.ErrorIs(t, unix.Fstat(fd, &st), unix.EBADF, "the fd is closed")
	// Operations on a closed FD fail cleanly.
	_, err = f.Handshake(0)
	require.ErrorIs(t, err, unix.EBADF)
}

// openResult is what the "open" role reports for one attempt.
type openResult struct {
	Flags  OpenFlag
	Method OpenMethod
	Err    string
	Perm   bool // errors.Is(err, ErrPermission)
	OSPerm bool // errors.Is(err, os.ErrPermission)
}

// runRole runs a role of the test binary in a child process.
func runRole(role string) int {
	switch role {
	case "open":
		if p := os.Getenv("UFFD_TEST_DEVICE"); p != "" {
			devicePath = p
		}
		var res []openResult
		for _, flags := range []OpenFlag{CloseOnExec, CloseOnExec | UserModeOnly} {
			r := openResult{Flags: flags}
			f, err := Open(flags)
			if err != nil {
				r.Err = err.Error()
				r.Perm = errors.Is(err, ErrPermission)
				r.OSPerm = errors.Is(err, os.ErrPermission)
			} else {
				r.Method = f.Method()
				f.Close()
			}
			res = append(res, r)
		}
		json.NewEncoder(os.Stdout).Encode(res)
		return 0
	}
	fmt.Fprintln(os.Stderr, "unknown role", role)
	return 2
}

// TestOpenPermission runs Open as user nobody, against a root-only device
// file, so that the device is refused; whether the system call is refused
// depends on vm.unprivileged_userfaultfd, which the test reads. It needs
// root to switch users.
func TestOpenPermission(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: runs a child process as user nobody")
	}
	sysctl, err := os.ReadFile("/proc/sys/vm/unprivileged_userfaultfd")
	require.NoError(t, err)
	unpriv := strings.TrimSpace(string(sysctl)) == "1"

	// A world-readable copy of the test binary, and a device file that
	// only root may open (root bypasses the mode, nobody does not).
	dir, err := os.MkdirTemp("", "uffd-nobody-")
	require.NoError(t, err)
	t.Cleanup(func() { os.RemoveAll(dir) })
	require.NoError(t, os.Chmod(dir, 0o755))
	exe, err := os.Executable()
	require.NoError(t, err)
	bin := filepath.Join(dir, "uffd.test")
	copyFile(t, exe, bin, 0o755)
	dev := filepath.Join(dir, "userfaultfd")
	require.NoError(t, os.WriteFile(dev, nil, 0o600))

	cmd := exec.Command(bin)
	cmd.Env = append(os.Environ(), roleEnv+"=open", "UFFD_TEST_DEVICE="+dev)
	cmd.Dir = dir
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	out, err := cmd.Output()
	require.NoError(t, err, "child: %s", out)
	var res []openResult
	require.NoError(t, json.Unmarshal(out, &res), "child output %s", out)
	require.Len(t, res, 2)

	full, userOnly := res[0], res[1]
	if unpriv {
		assert.Equal(t, MethodSyscall, full.Method, "vm.unprivileged_userfaultfd=1: %+v", full)
	} else {
		assert.True(t, full.Perm, "errors.Is(err, ErrPermission): %+v", full)
		assert.True(t, full.OSPerm, "errors.Is(err, os.ErrPermission): %+v", full)
		for _, want := range []string{
			"open " + dev + ": permission denied",
			"userfaultfd(2) system call: operation not permitted",
			"vm.unprivileged_userfaultfd=0",
			"did not ask for UserModeOnly",
			"chmod 0660 " + dev,
			"sysctl -w vm.unprivileged_userfaultfd=1",
			"run as root",
		} {
			assert.Contains(t, full.Err, want)
		}
		t.Logf("the error an unprivileged user sees:\n%s", full.Err)
	}
	// A user-mode-only fd is allowed to everyone.
	assert.Equal(t, MethodSyscall, userOnly.Method, "UserModeOnly as nobody: %+v", userOnly)
}

func copyFile(t *testing.T, from, to string, mode os.FileMode) {
	in, err := os.Open(from)
	require.NoError(t, err)
	defer in.Close()
	out, err := os.OpenFile(to, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, mode)
	require.NoError(t, err)
	_, err = io.Copy(out, in)
	require.NoError(t, err)
	require.NoError(t, out.Close())
}

// TestOpenErrorMessage checks the wording for the cases a user may meet,
// with the errnos given rather than provoked.
func TestOpenErrorMessage(t *testing.T) {
	cases := []struct {
		name       string
		e          *OpenError
		perm       bool
		contains   []string
		notContain []string
	}{
		{
			name: "both refused",
			e:    &OpenError{DevicePath: "/dev/userfaultfd", Device: unix.EACCES, Syscall: unix.EPERM, Sysctl: "0"},
			perm: true,
			contains: []string{
				"uffd: open /dev/userfaultfd: permission denied; the userfaultfd(2) system call: operation not permitted",
				"(vm.unprivileged_userfaultfd=0: only processes with CAP_SYS_PTRACE may handle faults the kernel takes on user memory, and this open did not ask for UserModeOnly)",
				"Grant access with one of: chmod 0660 /dev/userfaultfd and chgrp it to a group this user is in; sysctl -w vm.unprivileged_userfaultfd=1; or run as root",
			},
		},
		{
			name:       "no device, syscall refused, user mode only asked",
			e:          &OpenError{DevicePath: "/dev/userfaultfd", Device: unix.ENOENT, Syscall: unix.EPERM, Flags: UserModeOnly, Sysctl: "0"},
			perm:       true,
			contains:   []string{"no such file or directory", "operation not permitted", "Grant access"},
			notContain: []string{"did not ask for UserModeOnly"},
		},
		{
			name:       "not a permission problem",
			e:          &OpenError{DevicePath: "/dev/userfaultfd", Device: unix.ENOENT, Syscall: unix.ENOSYS},
			perm:       false,
			contains:   []string{"uffd: open /dev/userfaultfd: no such file or directory; the userfaultfd(2) system call: function not implemented"},
			notContain: []string{"Grant"},
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			msg := c.e.Error()
			for _, s := range c.contains {
				assert.Contains(t, msg, s)
			}
			for _, s := range c.notContain {
				assert.NotContains(t, msg, s)
			}
			assert.Equal(t, c.perm, errors.Is(c.e, ErrPermission))
			assert.Equal(t, c.perm, errors.Is(c.e, os.ErrPermission))
			assert.ErrorIs(t, c.e, c.e.Syscall.(unix.Errno))
		})
	}
	assert.ErrorIs(t, ErrPermission, os.ErrPermission)
}
