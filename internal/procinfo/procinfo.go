package procinfo

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"

	"github.com/prometheus/procfs"
)

// MinorFaults is the kernel's count of pid's minor faults (minflt); ok
// is false when it cannot be read (the process is gone).
func MinorFaults(pid int) (n uint64, ok bool) {
	p, err := procfs.NewProc(pid)
	if err != nil {
		return 0, false
	}
	st, err := p.Stat()
	if err != nil {
		return 0, false
	}
	return uint64(st.MinFlt), true
}

// Env reads variable name from the environment pid started with; "" if
// unset, or if the process is gone.
func Env(pid int, name string) (string, error) {
	env, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", pid))
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return "", nil
		}
		return "", err
	}
	var value string
	for _, kv := range strings.Split(string(env), "\x00") {
		if v, ok := strings.CutPrefix(kv, name+"="); ok {
			value = v
		}
	}
	return value, nil
}

// MappingsLeft is how many more mappings process pid may make before
// Linux refuses it one (vm.max_map_count, 65530 where it cannot be read,
// less the mappings /proc/PID/maps lists), keeping reserve of them for
// what the process maps of its own later; never below 0.
func MappingsLeft(pid, reserve int) int {
	limit, err := readInt("/proc/sys/vm/max_map_count")
	if err != nil || limit <= 0 {
		limit = 65530 // Linux's default
	}
	used := 0
	if maps, err := os.ReadFile(fmt.Sprintf("/proc/%d/maps", pid)); err == nil {
		used = bytes.Count(maps, []byte{'\n'})
	}
	return max(0, limit-used-reserve)
}

// readInt reads a file that holds one decimal integer (a sysctl).
func readInt(path string) (int, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	return strconv.Atoi(strings.TrimSpace(string(b)))
}

// KernelRelease is the running kernel's release (uname -r); "" if uname
// fails.
func KernelRelease() string {
	var u syscall.Utsname
	if syscall.Uname(&u) != nil {
		return ""
	}
	var sb strings.Builder
	for _, c := range u.Release {
		if c == 0 {
			break
		}
		sb.WriteByte(byte(c))
	}
	return sb.String()
}
