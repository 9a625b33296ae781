package uvm

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
)

// What DeviceProp says of the machine a device's workers run on, read
// once from the kernel's files (libuvm's props.c reads the same ones).

// cpuClockKHz is the first CPU's clock in kHz: its cpufreq maximum, else
// the "cpu MHz" /proc/cpuinfo gives now (a virtual machine has no
// cpufreq), else 0.
var cpuClockKHz = sync.OnceValue(func() int {
	if b, err := os.ReadFile("/sys/devices/system/cpu/cpu0/cpufreq/cpuinfo_max_freq"); err == nil {
		if v, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil && v > 0 {
			return v
		}
	}
	b, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		k, v, ok := strings.Cut(line, ":")
		if ok && strings.TrimSpace(k) == "cpu MHz" {
			if mhz, err := strconv.ParseFloat(strings.TrimSpace(v), 64); err == nil && mhz > 0 {
				return int(mhz * 1000)
			}
		}
	}
	return 0
})

// l2CacheBytes is the first CPU's unified level-2 cache, 0 if sysfs does
// not say.
var l2CacheBytes = sync.OnceValue(func() int {
	dirs, _ := filepath.Glob("/sys/devices/system/cpu/cpu0/cache/index*")
	for _, d := range dirs {
		level, _ := os.ReadFile(filepath.Join(d, "level"))
		typ, _ := os.ReadFile(filepath.Join(d, "type"))
		size, _ := os.ReadFile(filepath.Join(d, "size"))
		if strings.TrimSpace(string(level)) != "2" || strings.TrimSpace(string(typ)) != "Unified" {
			continue
		}
		if n, err := parseCacheSize(strings.TrimSpace(string(size))); err == nil {
			return n
		}
	}
	return 0
})

// parseCacheSize reads sysfs's cache sizes: "2048K", "1M", "512".
func parseCacheSize(s string) (int, error) {
	mult := 1
	switch {
	case strings.HasSuffix(s, "K"):
		mult, s = 1<<10, strings.TrimSuffix(s, "K")
	case strings.HasSuffix(s, "M"):
		mult, s = 1<<20, strings.TrimSuffix(s, "M")
	}
	n, err := strconv.Atoi(s)
	return n * mult, err
}

// firstNUMANode is the machine's first online NUMA node, -1 where the
// kernel has no NUMA.
var firstNUMANode = sync.OnceValue(func() int {
	b, err := os.ReadFile("/sys/devices/system/node/online")
	if err != nil {
		return -1
	}
	first, _, _ := strings.Cut(strings.TrimSpace(string(b)), ",")
	first, _, _ = strings.Cut(first, "-")
	n, err := strconv.Atoi(first)
	if err != nil {
		return -1
	}
	return n
})
