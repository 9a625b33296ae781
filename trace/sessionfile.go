package trace

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

// SessionFile is where a client's session records: path, unless an
// earlier session of the same process wrote it (a program that opens
// several sessions, each perhaps with a private server of its own); then
// path.2, path.3, ..., the first not written since the process started
// (to within a second: the boot time is kept in whole seconds).
// A file older than the process is an earlier run's, and is replaced.
func SessionFile(path string, pid int) string {
	started, ok := processStart(pid)
	if !ok {
		return path
	}
	for n := 1; ; n++ {
		p := path
		if n > 1 {
			p = fmt.Sprintf("%s.%d", path, n)
		}
		fi, err := os.Stat(p)
		if err != nil || fi.ModTime().Before(started) {
			return p
		}
	}
}

// processStart is when process pid started, from its start time in
// clock ticks since boot and the boot time.
func processStart(pid int) (time.Time, bool) {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return time.Time{}, false
	}
	// The command (field 2) may hold spaces and parentheses: fields
	// are counted from the last ')'.
	i := strings.LastIndexByte(string(stat), ')')
	if i < 0 {
		return time.Time{}, false
	}
	f := strings.Fields(string(stat[i+1:]))
	const startField = 22 - 3 // field 22, counted from field 3
	if len(f) <= startField {
		return time.Time{}, false
	}
	ticks, err := strconv.ParseInt(f[startField], 10, 64)
	if err != nil {
		return time.Time{}, false
	}
	boot, ok := bootTime()
	if !ok {
		return time.Time{}, false
	}
	const hz = 100 // USER_HZ, fixed at 100 for /proc on Linux
	return boot.Add(time.Duration(ticks) * time.Second / hz), true
}

func bootTime() (time.Time, bool) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return time.Time{}, false
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "btime "); ok {
			sec, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			if err != nil {
				return time.Time{}, false
			}
			return time.Unix(sec, 0), true
		}
	}
	return time.Time{}, false
}
