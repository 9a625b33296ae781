//go:build linux

package uffd

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// roleEnv makes the test binary act as a child process of a test instead of
// running the tests (see runRole).
const roleEnv = "UFFD_TEST_ROLE"

// TestMain fails the run if a test leaks a file descriptor: a lost
// userfaultfd keeps its ranges registered and a lost memfd its memory.
func TestMain(m *testing.M) {
	if role := os.Getenv(roleEnv); role != "" {
		os.Exit(runRole(role))
	}
	// Let the runtime open what it keeps for good (the netpoller's epoll
	// and eventfd) before the first snapshot.
	if r, w, err := os.Pipe(); err == nil {
		r.Close()
		w.Close()
	}
	before, err := openFDs()
	if err != nil {
		fmt.Fprintln(os.Stderr, "fd leak check:", err)
		os.Exit(1)
	}
	code := m.Run()
	cleanupHelper()
	after, err := openFDs()
	if err != nil {
		fmt.Fprintln(os.Stderr, "fd leak check:", err)
		os.Exit(1)
	}
	var leaked []string
	for fd, target := range after {
		if _, ok := before[fd]; !ok {
			leaked = append(leaked, strconv.Itoa(fd)+" -> "+target)
		}
	}
	if len(leaked) > 0 {
		slices.Sort(leaked)
		fmt.Fprintf(os.Stderr, "FAIL: %d file descriptors leaked by the tests:\n\t%s\n", len(leaked), strings.Join(leaked, "\n\t"))
		os.Exit(1)
	}
	os.Exit(code)
}

// openFDs lists this process's file descriptors and what they refer to,
// leaving out the one used to read the directory itself.
func openFDs() (map[int]string, error) {
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return nil, err
	}
	self := "/proc/" + strconv.Itoa(os.Getpid()) + "/fd"
	fds := make(map[int]string)
	for _, e := range ents {
		fd, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		target, err := os.Readlink(filepath.Join("/proc/self/fd", e.Name()))
		if err != nil { // the directory's own fd, closed by now
			continue
		}
		if target == self {
			continue
		}
		fds[fd] = target
	}
	return fds, nil
}
