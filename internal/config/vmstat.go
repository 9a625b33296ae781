package config

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
)

// vmstatCounters are the /proc/vmstat counters Info reports, as deltas
// since the server started: faults, and the page allocations and frees
// that every migration pays for here.
var vmstatCounters = []string{"pgfault", "pgmajfault", "pgalloc_normal", "pgfree"}

// parseVMStat reads "name value" lines.
func parseVMStat(r io.Reader) (map[string]uint64, error) {
	out := map[string]uint64{}
	sc := bufio.NewScanner(r)
	for n := 1; sc.Scan(); n++ {
		fields := strings.Fields(sc.Text())
		if len(fields) == 0 {
			continue
		}
		if len(fields) != 2 {
			return nil, fmt.Errorf("vmstat line %d %q: want a name and a value", n, sc.Text())
		}
		v, err := strconv.ParseUint(fields[1], 10, 64)
		if err != nil {
			return nil, fmt.Errorf("vmstat line %d: %s=%q is not a count", n, fields[0], fields[1])
		}
		out[fields[0]] = v
	}
	return out, sc.Err()
}

// ReadVMStat reads /proc/vmstat; nil if it cannot.
func ReadVMStat() map[string]uint64 {
	f, err := os.Open("/proc/vmstat")
	if err != nil {
		return nil
	}
	defer f.Close()
	m, err := parseVMStat(f)
	if err != nil {
		return nil
	}
	return m
}

// VMStatSince returns the reported counters' growth since start.
func VMStatSince(start map[string]uint64) map[string]uint64 {
	now := ReadVMStat()
	if now == nil || start == nil {
		return nil
	}
	out := map[string]uint64{}
	for _, k := range vmstatCounters {
		if a, ok := start[k]; ok && now[k] >= a {
			out[k] = now[k] - a
		}
	}
	return out
}
