// Package fdleak lets a package's TestMain fail the run when tests leave
// file descriptors open. devmem hands out raw descriptors (memfds passed
// between processes, dups, probe files), and a leaked one pins memory
// that leak checks elsewhere would then blame on the wrong code.
package fdleak

import (
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"
)

// Snapshot lists the open descriptors of this process and what each
// refers to.
func Snapshot() (map[int]string, error) {
	d, err := os.Open("/proc/self/fd")
	if err != nil {
		return nil, err
	}
	defer d.Close()
	// The directory being read holds a descriptor of its own, which
	// must not count as open before or after.
	self := int(d.Fd())
	names, err := d.Readdirnames(-1)
	if err != nil {
		return nil, err
	}
	fds := make(map[int]string, len(names))
	for _, name := range names {
		fd, err := strconv.Atoi(name)
		if err != nil || fd == self {
			continue
		}
		target, err := os.Readlink("/proc/self/fd/" + name)
		if err != nil {
			continue // closed meanwhile
		}
		fds[fd] = target
	}
	return fds, nil
}

// Leaked describes the descriptors open in after that were not open (to
// the same target) in before, one "fd N -> target" per line; empty when
// none leaked.
func Leaked(before, after map[int]string) string {
	var leaked []int
	for fd, target := range after {
		if before[fd] != target {
			leaked = append(leaked, fd)
		}
	}
	sort.Ints(leaked)
	var b strings.Builder
	for _, fd := range leaked {
		fmt.Fprintf(&b, "fd %d -> %s\n", fd, after[fd])
	}
	return b.String()
}

// Run runs the tests (run is m.Run) and returns their exit code, or 1
// with the leaked descriptors listed on stderr when any were left open.
func Run(run func() int) int {
	// Start the runtime's network poller now: it opens an epoll
	// descriptor and a wakeup descriptor the first time a test uses a
	// pipe, and those live for the rest of the process.
	if r, w, err := os.Pipe(); err == nil {
		r.Close()
		w.Close()
	}
	before, err := Snapshot()
	if err != nil {
		fmt.Fprintf(os.Stderr, "fd leak check: %v\n", err)
		return 1
	}
	code := run()
	after, err := Snapshot()
	if err != nil {
		fmt.Fprintf(os.Stderr, "fd leak check: %v\n", err)
		return 1
	}
	if leaked := Leaked(before, after); leaked != "" {
		fmt.Fprintf(os.Stderr, "FAIL: tests leaked file descriptors:\n%s", leaked)
		return 1
	}
	return code
}
