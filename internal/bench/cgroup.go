package bench

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
	"unsafe"

	"github.com/softuvm/softuvm/uvm"
)

// memoryCgroup is the kernel's answer to a host budget, which `uvm bench
// oversub` and `uvm bench run` run programs in beside uvm run: a memory
// cgroup (v1, or v2 where the memory controller is on the unified
// hierarchy, as on most machines now) limited to the budget, and a zram
// swap device for the rest. teardown undoes what was done, in reverse.
type memoryCgroup struct {
	mount     string // the hierarchy the cgroup is made in
	dir       string // the cgroup
	v2        bool   // on the unified hierarchy: memory.max, memory.swap.max, memory.peak
	limit     int64
	memsw     bool // swap is accounted: v1 memory.memsw.*, v2 memory.swap.*
	zram      int  // the zram device's number
	hotAdded  bool // zram device added by us: removed again
	swapDev   string
	algorithm string
	diskSize  int64
	undo      []func() error // in the order done
	// v2: memory.peak and memory.swap.peak kept open from resetPeaks to
	// peaks, since a write resets the peak only as that open file reads
	// it (Linux 6.12 and later; before, the write fails and the peak is
	// the cgroup's since it was made).
	peakFiles [2]*os.File
}

func (c *memoryCgroup) procs() string { return filepath.Join(c.dir, "cgroup.procs") }

func (c *memoryCgroup) describe() string {
	swap := "swap not accounted"
	switch {
	case c.memsw && c.v2:
		swap = fmt.Sprintf("swap limit %s", uvm.FormatSize(c.diskSize))
	case c.memsw:
		swap = fmt.Sprintf("memory+swap limit %s", uvm.FormatSize(c.limit+c.diskSize))
	}
	version := "v1"
	if c.v2 {
		version = "v2"
	}
	// Swap readahead (pages read per swap-in: 2^page-cluster) changes
	// what a swap-in costs; the benchmark leaves it as the machine has it.
	cluster, _ := os.ReadFile("/proc/sys/vm/page-cluster")
	return fmt.Sprintf("memory cgroup %s %s, limit %s, %s; swap on zram%d (%s, %s), vm.page-cluster %s", version, c.dir, uvm.FormatSize(c.limit), swap, c.zram, c.algorithm,
		uvm.FormatSize(c.diskSize), strings.TrimSpace(string(cluster)))
}

func (c *memoryCgroup) teardown() error {
	c.closePeakFiles()
	var errs []error
	for i := len(c.undo) - 1; i >= 0; i-- {
		if err := c.undo[i](); err != nil {
			errs = append(errs, err)
		}
	}
	c.undo = nil
	return errors.Join(errs...)
}

// tearDownAfter tears the cgroup down at the end of a benchmark whose
// error is *err: a failure is said, and is the benchmark's error where it
// had none.
func (c *memoryCgroup) tearDownAfter(err *error, progress Progress) {
	if terr := c.teardown(); terr != nil {
		progress("tearing down the cgroup variant: %v", terr)
		if *err == nil {
			*err = terr
		}
	}
}

func (c *memoryCgroup) closePeakFiles() {
	for i, f := range c.peakFiles {
		if f != nil {
			f.Close()
			c.peakFiles[i] = nil
		}
	}
}

// resetPeaks starts the peaks that peaks then reads afresh.
func (c *memoryCgroup) resetPeaks() {
	if !c.v2 {
		os.WriteFile(filepath.Join(c.dir, "memory.max_usage_in_bytes"), []byte("0"), 0)
		if c.memsw {
			os.WriteFile(filepath.Join(c.dir, "memory.memsw.max_usage_in_bytes"), []byte("0"), 0)
		}
		return
	}
	c.closePeakFiles()
	for i, name := range []string{"memory.peak", "memory.swap.peak"} {
		f, err := os.OpenFile(filepath.Join(c.dir, name), os.O_RDWR, 0)
		if err != nil {
			continue // a kernel before 5.19 (memory.peak) or 6.5 (memory.swap.peak)
		}
		f.WriteString("reset\n")
		c.peakFiles[i] = f
	}
}

// peaks reads the peaks since resetPeaks: of memory, and on v1 of memory
// plus swap (memsw), on v2 of swap alone.
func (c *memoryCgroup) peaks() (mem, memsw, swap int64) {
	parse := func(b []byte) int64 {
		n, _ := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
		return n
	}
	if c.v2 {
		read := func(f *os.File) int64 {
			if f == nil {
				return 0
			}
			b := make([]byte, 32)
			n, _ := f.ReadAt(b, 0)
			return parse(b[:n])
		}
		return read(c.peakFiles[0]), 0, read(c.peakFiles[1])
	}
	read := func(name string) int64 {
		b, _ := os.ReadFile(filepath.Join(c.dir, name))
		return parse(b)
	}
	mem = read("memory.max_usage_in_bytes")
	if c.memsw {
		memsw = read("memory.memsw.max_usage_in_bytes")
	}
	return mem, memsw, 0
}

// oomKills is how many processes the cgroup's OOM killer has killed.
func (c *memoryCgroup) oomKills() int64 {
	name := "memory.oom_control"
	if c.v2 {
		name = "memory.events"
	}
	b, _ := os.ReadFile(filepath.Join(c.dir, name))
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "oom_kill "); ok {
			n, _ := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			return n
		}
	}
	return 0
}

// cgroupPeaks says a cgroup variant's peaks, "" where none was read.
func cgroupPeaks(mem, memsw, swap int64) string {
	switch {
	case memsw > 0:
		return fmt.Sprintf("peak memory %s, memory+swap %s", humanSize(uint64(mem)), humanSize(uint64(memsw)))
	case swap > 0:
		return fmt.Sprintf("peak memory %s, swap %s", humanSize(uint64(mem)), humanSize(uint64(swap)))
	case mem > 0:
		return fmt.Sprintf("peak memory %s", humanSize(uint64(mem)))
	}
	return ""
}

func writeSys(path, value string) error {
	if err := os.WriteFile(path, []byte(value), 0); err != nil {
		return fmt.Errorf("writing %q to %s: %w", value, path, err)
	}
	return nil
}

// setUpMemoryCgroup sets the cgroup variant up: a memory cgroup limited
// to budget, and a zram swap device big enough for the rest of size.
// Where the machine does not allow it, it undoes what it did and says
// why.
func setUpMemoryCgroup(budget, size int64) (*memoryCgroup, string) {
	if os.Geteuid() != 0 {
		return nil, "not root: setting up a memory cgroup and a swap device needs root"
	}
	c := &memoryCgroup{limit: budget}
	for _, step := range []func() error{c.findController, c.addZram, func() error { return c.swapOnZram(size) }, c.makeCgroup} {
		if err := step(); err != nil {
			if terr := c.teardown(); terr != nil {
				return nil, fmt.Sprintf("%v (and undoing the setup: %v)", err, terr)
			}
			return nil, err.Error()
		}
	}
	return c, ""
}

// findController finds the memory controller: on a mounted v1
// hierarchy, on the unified (v2) one, or on a v1 hierarchy mounted here;
// on v2, handed down to the cgroups below the root.
func (c *memoryCgroup) findController() error {
	mount, v2, err := MemoryCgroupMount()
	if err != nil {
		return err
	}
	c.v2 = v2
	if mount == "" {
		dir, err := os.MkdirTemp("", "uvm-bench-memcg-")
		if err != nil {
			return err
		}
		if err := syscall.Mount("cgroup", dir, "cgroup", 0, "memory"); err != nil {
			os.Remove(dir)
			return fmt.Errorf("the memory controller is on no mounted hierarchy, and mounting a v1 one at %s failed: %v", dir, err)
		}
		mount = dir
		c.undo = append(c.undo, func() error {
			if err := syscall.Unmount(dir, 0); err != nil {
				return fmt.Errorf("unmount %s: %w", dir, err)
			}
			return os.Remove(dir)
		})
	}
	c.mount = mount
	if !v2 {
		return nil
	}
	// A v2 cgroup has the memory controller only where its parent hands
	// it down.
	control := filepath.Join(mount, "cgroup.subtree_control")
	b, err := os.ReadFile(control)
	if err != nil {
		return err
	}
	if !slices.Contains(strings.Fields(string(b)), "memory") {
		if err := writeSys(control, "+memory"); err != nil {
			return err
		}
		c.undo = append(c.undo, func() error { return writeSys(control, "-memory") })
	}
	return nil
}

// addZram takes a zram device of our own: hot-added, else zram0 if
// unused.
func (c *memoryCgroup) addZram() error {
	if _, err := ZramPresent(true); err != nil {
		return fmt.Errorf("no zram: %v", err)
	}
	if b, err := os.ReadFile("/sys/class/zram-control/hot_add"); err == nil {
		n, err := strconv.Atoi(strings.TrimSpace(string(b)))
		if err != nil {
			return fmt.Errorf("/sys/class/zram-control/hot_add said %q", b)
		}
		c.zram, c.hotAdded = n, true
		c.undo = append(c.undo, func() error {
			return writeSys("/sys/class/zram-control/hot_remove", strconv.Itoa(n))
		})
		return nil
	}
	b, err := os.ReadFile("/sys/block/zram0/disksize")
	if err != nil {
		return fmt.Errorf("no zram device: neither /sys/class/zram-control/hot_add nor /sys/block/zram0 (%v)", err)
	}
	if strings.TrimSpace(string(b)) != "0" {
		return fmt.Errorf("zram0 is in use (disksize %s) and no other zram device can be added", strings.TrimSpace(string(b)))
	}
	c.zram = 0
	return nil
}

// swapOnZram sizes the zram device for twice size (lz4 where it has
// it), makes it a swap area and swaps on it.
func (c *memoryCgroup) swapOnZram(size int64) error {
	zdir := fmt.Sprintf("/sys/block/zram%d", c.zram)
	c.undo = append(c.undo, func() error { return writeSys(zdir+"/reset", "1") })
	algs, _ := os.ReadFile(zdir + "/comp_algorithm")
	c.algorithm = thpSetting(zdir + "/comp_algorithm") // the one in brackets
	if strings.Contains(" "+strings.NewReplacer("[", " ", "]", " ").Replace(string(algs))+" ", " lz4 ") {
		if err := writeSys(zdir+"/comp_algorithm", "lz4"); err != nil {
			return err
		}
		c.algorithm = "lz4"
	}
	c.diskSize = (2*size + 1<<20 - 1) &^ (1<<20 - 1)
	if err := writeSys(zdir+"/disksize", strconv.FormatInt(c.diskSize, 10)); err != nil {
		return err
	}
	dev, err := zramNode(c.zram)
	if err != nil {
		return err
	}
	if dev.tmp != "" {
		c.undo = append(c.undo, func() error { return os.Remove(dev.tmp) })
	}
	c.swapDev = dev.path
	if mkswap, err := exec.LookPath("mkswap"); err == nil {
		if out, err := exec.Command(mkswap, dev.path).CombinedOutput(); err != nil {
			return fmt.Errorf("%s %s: %v: %s", mkswap, dev.path, err, strings.TrimSpace(string(out)))
		}
	} else if err := writeSwapHeader(dev.path, c.diskSize); err != nil {
		return err
	}
	if err := swapOn(dev.path); err != nil {
		return err
	}
	c.undo = append(c.undo, func() error { return swapOff(dev.path) })
	return nil
}

// makeCgroup makes the cgroup, limited to the budget, with room for the
// whole array in swap where the kernel accounts swap.
func (c *memoryCgroup) makeCgroup() error {
	c.dir = filepath.Join(c.mount, fmt.Sprintf("uvm-bench-oversub-%d", os.Getpid()))
	if err := os.Mkdir(c.dir, 0o755); err != nil {
		return err
	}
	cgDir := c.dir
	c.undo = append(c.undo, func() error { return removeCgroup(cgDir) })
	limit, swapLimit, swapFile := "memory.limit_in_bytes", c.limit+c.diskSize, "memory.memsw.limit_in_bytes" // memory plus swap
	if c.v2 {
		limit, swapLimit, swapFile = "memory.max", c.diskSize, "memory.swap.max" // swap alone
	}
	if err := writeSys(filepath.Join(c.dir, limit), strconv.FormatInt(c.limit, 10)); err != nil {
		return err
	}
	// The swap file exists where the kernel accounts swap.
	if _, err := os.Stat(filepath.Join(c.dir, swapFile)); err == nil {
		c.memsw = true
		if err := writeSys(filepath.Join(c.dir, swapFile), strconv.FormatInt(swapLimit, 10)); err != nil {
			return err
		}
	}
	return nil
}

// runIn is the command line that runs argv in the cgroup: a shell moves
// itself into the cgroup, then becomes the program.
func (c *memoryCgroup) runIn(argv ...string) []string {
	return append([]string{"/bin/sh", "-c", `echo $$ > "$1" && shift && exec "$@"`, "sh", c.procs()}, argv...)
}

// ZramPresent says how this machine offers zram devices: loaded, with
// devices added on demand (/sys/class/zram-control) or a zram0, or as a
// module, which load loads (modprobe) and which is otherwise only looked
// for (modprobe --dry-run), as `uvm doctor` asks, changing nothing. The
// error says why there is none; it wraps exec.ErrNotFound where modprobe
// itself is missing.
func ZramPresent(load bool) (string, error) {
	if _, err := os.Stat("/sys/class/zram-control"); err == nil {
		return "zram loaded; devices are added on demand (/sys/class/zram-control)", nil
	}
	if _, err := os.Stat("/sys/block/zram0"); err == nil {
		return "zram loaded (/sys/block/zram0)", nil
	}
	args := []string{"zram"}
	if !load {
		args = []string{"--dry-run", "zram"}
	}
	out, err := exec.Command("modprobe", args...).CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("/sys/block/zram0 does not exist and modprobe %s failed: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	if load {
		return "zram module loaded", nil
	}
	return "zram module available (the benchmarks load it)", nil
}

// MemoryCgroupMount finds where a cgroup with the memory controller can
// be made: the mount of a v1 hierarchy that has it; else the unified (v2)
// hierarchy's mount, where the controller is on it (v2 true); else "" if
// the controller is enabled but on no mounted hierarchy, free to mount.
func MemoryCgroupMount() (mount string, v2 bool, err error) {
	mounts, err := os.ReadFile("/proc/mounts")
	if err != nil {
		return "", false, err
	}
	unified := ""
	for _, line := range strings.Split(string(mounts), "\n") {
		f := strings.Fields(line)
		if len(f) < 4 {
			continue
		}
		switch f[2] {
		case "cgroup":
			if slices.Contains(strings.Split(f[3], ","), "memory") {
				return f[1], false, nil
			}
		case "cgroup2":
			if unified == "" {
				unified = f[1]
			}
		}
	}
	if unified != "" {
		b, err := os.ReadFile(filepath.Join(unified, "cgroup.controllers"))
		if err == nil && slices.Contains(strings.Fields(string(b)), "memory") {
			return unified, true, nil
		}
	}
	cgroups, err := os.ReadFile("/proc/cgroups")
	if err != nil {
		return "", false, fmt.Errorf("no cgroups here: %v", err)
	}
	for _, line := range strings.Split(string(cgroups), "\n") {
		f := strings.Fields(line)
		if len(f) == 4 && f[0] == "memory" {
			if f[3] != "1" {
				return "", false, fmt.Errorf("the memory cgroup controller is disabled (/proc/cgroups)")
			}
			return "", false, nil
		}
	}
	return "", false, fmt.Errorf("the kernel has no memory cgroup controller (/proc/cgroups)")
}

type zramDevice struct{ path, tmp string }

// zramNode is /dev/zramN, or a node made for it in a temporary place
// where /dev has none.
func zramNode(n int) (zramDevice, error) {
	p := fmt.Sprintf("/dev/zram%d", n)
	for i := 0; i < 50; i++ { // devtmpfs adds a hot-added device's node shortly
		if _, err := os.Stat(p); err == nil {
			return zramDevice{path: p}, nil
		}
		time.Sleep(10 * time.Millisecond)
	}
	b, err := os.ReadFile(fmt.Sprintf("/sys/block/zram%d/dev", n))
	if err != nil {
		return zramDevice{}, fmt.Errorf("no %s and no device number for it: %v", p, err)
	}
	var major, minor uint32
	if _, err := fmt.Sscanf(strings.TrimSpace(string(b)), "%d:%d", &major, &minor); err != nil {
		return zramDevice{}, fmt.Errorf("/sys/block/zram%d/dev: %q", n, b)
	}
	tmp := filepath.Join(os.TempDir(), fmt.Sprintf("uvm-bench-zram%d-%d", n, os.Getpid()))
	dev := int((major << 8) | (minor & 0xff) | ((minor &^ 0xff) << 12))
	if err := syscall.Mknod(tmp, syscall.S_IFBLK|0o600, dev); err != nil {
		return zramDevice{}, fmt.Errorf("no %s, and mknod %s: %v", p, tmp, err)
	}
	return zramDevice{path: tmp, tmp: tmp}, nil
}

// swapHeader is a version 1 swap area's first page, as mkswap writes it:
// the version, the last usable page and no bad pages after 1024 bytes
// of boot block, and the magic at the end of the page.
func swapHeader(size int64) []byte {
	const page = 4096
	h := make([]byte, page)
	binary.LittleEndian.PutUint32(h[1024:], 1)                           // version
	binary.LittleEndian.PutUint32(h[1028:], uint32(size/page-1))         // last_page
	binary.LittleEndian.PutUint32(h[1032:], 0)                           // nr_badpages
	copy(h[1036:1052], []byte(fmt.Sprintf("uvmbench%08x", os.Getpid()))) // uuid: any 16 bytes
	copy(h[page-10:], "SWAPSPACE2")
	return h
}

func writeSwapHeader(path string, size int64) error {
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	_, err = f.WriteAt(swapHeader(size), 0)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("writing a swap header to %s: %w", path, err)
	}
	return nil
}

func swapOn(path string) error {
	p, err := syscall.BytePtrFromString(path)
	if err != nil {
		return err
	}
	// Preferred over any other swap (priority 100), so that the cgroup
	// swaps to this device.
	const swapFlagPrefer = 0x8000
	if _, _, e := syscall.Syscall(syscall.SYS_SWAPON, uintptr(unsafe.Pointer(p)), swapFlagPrefer|100, 0); e != 0 {
		return fmt.Errorf("swapon %s: %w", path, e)
	}
	return nil
}

func swapOff(path string) error {
	p, err := syscall.BytePtrFromString(path)
	if err != nil {
		return err
	}
	if _, _, e := syscall.Syscall(syscall.SYS_SWAPOFF, uintptr(unsafe.Pointer(p)), 0, 0); e != 0 {
		return fmt.Errorf("swapoff %s: %w", path, e)
	}
	return nil
}

// removeCgroup removes an empty cgroup; its last task may take a moment
// to leave after exiting.
func removeCgroup(dir string) error {
	var err error
	for i := 0; i < 100; i++ {
		if err = syscall.Rmdir(dir); err == nil || errors.Is(err, syscall.ENOENT) {
			return nil
		}
		time.Sleep(20 * time.Millisecond)
	}
	return fmt.Errorf("rmdir %s: %w", dir, err)
}
