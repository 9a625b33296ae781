// Package proctest finds the processes softuvm starts, for tests that
// must reach a fault server they did not start themselves: the private
// server of a C program, or one a guard started after a kill.
package proctest

import (
	"bytes"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// ServerChild returns the pid of a live process named softuvm-server (a
// fault server's argv[0]) whose parent is one of parents, or 0 if there
// is none.
func ServerChild(parents ...int) (int, error) {
	return Child("softuvm-server", parents...)
}

// Child returns the pid of a live process whose argv[0] is argv0 and
// whose parent is one of parents, or 0 if there is none.
func Child(argv0 string, parents ...int) (int, error) {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return 0, err
	}
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		cmdline, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil || !strings.HasPrefix(string(cmdline), argv0+"\x00") {
			continue
		}
		state, ppid, ok := stateAndParent(filepath.Join("/proc", e.Name(), "stat"))
		if !ok || state == "Z" {
			continue
		}
		for _, p := range parents {
			if p == ppid {
				return pid, nil
			}
		}
	}
	return 0, nil
}

// stateAndParent reads a process's state and parent from its stat file,
// after the command name, which may hold spaces and parentheses.
func stateAndParent(path string) (string, int, bool) {
	stat, err := os.ReadFile(path)
	if err != nil {
		return "", 0, false
	}
	f := strings.Fields(string(stat[bytes.LastIndexByte(stat, ')')+1:]))
	if len(f) < 2 {
		return "", 0, false
	}
	ppid, err := strconv.Atoi(f[1])
	return f[0], ppid, err == nil
}
