package devmem

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/prometheus/procfs"

	"github.com/softuvm/softuvm/devmem/internal/memsys"
)

// Node is a NUMA node: its CPUs and memory. A node without memory
// (MemTotal 0) can hold no arena.
type Node struct {
	ID                int
	CPUs              []int
	MemTotal, MemFree int64 // bytes
}

// Nodes lists the machine's online NUMA nodes from
// /sys/devices/system/node. A kernel built without NUMA has no such
// directory; the machine is then one node 0 holding every online CPU and
// the memory /proc/meminfo reports.
func Nodes() ([]Node, error) { return readNodes("/") }

// OnlineCPUs lists the online CPUs from /sys/devices/system/cpu/online.
func OnlineCPUs() ([]int, error) { return readOnlineCPUs("/") }

// AllowedCPUs lists the CPUs the calling thread may run on
// (sched_getaffinity): the online CPUs less those a cpuset or taskset
// excludes, which are the ones PinCurrentThread can use.
func AllowedCPUs() ([]int, error) {
	cpus, err := memsys.SchedGetaffinity()
	if err != nil {
		return nil, fmt.Errorf("get thread affinity: %w", err)
	}
	return cpus, nil
}

// PinCurrentThread binds the calling OS thread to one CPU. The caller
// must hold runtime.LockOSThread, or the goroutine may move to another
// thread and the pin would apply to whatever runs there next.
func PinCurrentThread(cpu int) error {
	if cpu < 0 || cpu >= memsys.MaxCPUs {
		return fmt.Errorf("pin thread to cpu %d: want 0..%d", cpu, memsys.MaxCPUs-1)
	}
	if err := memsys.SchedSetaffinity(cpu); err != nil {
		return fmt.Errorf("pin thread to cpu %d: %w", cpu, err)
	}
	return nil
}

// PinCurrentThreadToNode binds the calling OS thread to the CPUs of NUMA
// node node, so that what it copies lands on and is read from memory
// near it. The caller must hold runtime.LockOSThread.
func PinCurrentThreadToNode(node int) error {
	cpus, err := NodeCPUs(node)
	if err != nil {
		return fmt.Errorf("pin thread to node %d: %w", node, err)
	}
	return PinCurrentThreadToCPUs(cpus)
}

// NodeCPUs returns the CPUs of NUMA node node.
func NodeCPUs(node int) ([]int, error) {
	nodes, err := Nodes()
	if err != nil {
		return nil, err
	}
	for _, n := range nodes {
		if n.ID == node {
			if len(n.CPUs) == 0 {
				return nil, fmt.Errorf("node %d has no CPUs", node)
			}
			return n.CPUs, nil
		}
	}
	return nil, fmt.Errorf("no such node %d", node)
}

// PinCurrentThreadToCPUs binds the calling OS thread to the CPUs in cpus
// (lock the goroutine to its thread first).
func PinCurrentThreadToCPUs(cpus []int) error {
	if len(cpus) == 0 {
		return fmt.Errorf("pin thread to no CPU: want at least one")
	}
	if err := memsys.SchedSetaffinitySet(cpus); err != nil {
		return fmt.Errorf("pin thread to CPUs %v: %w", cpus, err)
	}
	return nil
}

// CurrentCPU reports the CPU the calling thread is running on (getcpu).
// Unless the thread is pinned, the answer may be stale on return.
func CurrentCPU() (int, error) {
	cpu, _, err := memsys.Getcpu()
	if err != nil {
		return -1, fmt.Errorf("getcpu: %w", err)
	}
	return cpu, nil
}

// readNodes is Nodes on the file tree under root ("/" for the machine,
// a fixture directory in tests).
func readNodes(root string) ([]Node, error) {
	dir := filepath.Join(root, "sys/devices/system/node")
	if _, err := os.Stat(dir); errors.Is(err, fs.ErrNotExist) {
		return readNodesWithoutNUMA(root)
	}
	ids, err := readFile(filepath.Join(dir, "online"), parseCPUList)
	if err != nil {
		return nil, err
	}
	nodes := make([]Node, 0, len(ids))
	for _, id := range ids {
		ndir := filepath.Join(dir, fmt.Sprintf("node%d", id))
		cpus, err := readFile(filepath.Join(ndir, "cpulist"), parseCPUList)
		if err != nil {
			return nil, err
		}
		path := filepath.Join(ndir, "meminfo")
		mi, err := readFile(path, parseNodeMeminfo)
		if err != nil {
			return nil, err
		}
		if mi.node != id {
			return nil, fmt.Errorf("read %s: it describes node %d: want node %d", path, mi.node, id)
		}
		nodes = append(nodes, Node{ID: id, CPUs: cpus, MemTotal: mi.total, MemFree: mi.free})
	}
	return nodes, nil
}

func readNodesWithoutNUMA(root string) ([]Node, error) {
	cpus, err := readOnlineCPUs(root)
	if err != nil {
		return nil, err
	}
	dir := filepath.Join(root, "proc")
	pfs, err := procfs.NewFS(dir)
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", dir, err)
	}
	mi, err := pfs.Meminfo()
	if err != nil {
		return nil, fmt.Errorf("read %s/meminfo: %w", dir, err)
	}
	if mi.MemTotalBytes == nil || mi.MemFreeBytes == nil {
		return nil, fmt.Errorf("read %s/meminfo: want MemTotal and MemFree lines", dir)
	}
	return []Node{{ID: 0, CPUs: cpus, MemTotal: int64(*mi.MemTotalBytes), MemFree: int64(*mi.MemFreeBytes)}}, nil
}

func readOnlineCPUs(root string) ([]int, error) {
	return readFile(filepath.Join(root, "sys/devices/system/cpu/online"), parseCPUList)
}

// readFile opens path and hands it to parse, naming the file in errors.
func readFile[T any](path string, parse func(io.Reader) (T, error)) (T, error) {
	var zero T
	f, err := os.Open(path)
	if err != nil {
		return zero, err // *PathError names the file and the attempt
	}
	defer f.Close()
	v, err := parse(f)
	if err != nil {
		return zero, fmt.Errorf("read %s: %w", path, err)
	}
	return v, nil
}

// maxListID bounds the numbers a CPU or node list may hold, so that a
// corrupt "0-4000000000" is an error rather than a huge allocation.
const maxListID = 1 << 20

// parseCPUList parses the kernel's list format ("0-3,8,10-11"), used by
// cpulist, cpu/online and node/online. An empty list (a CPU-less node)
// is valid.
func parseCPUList(r io.Reader) ([]int, error) {
	b, err := io.ReadAll(io.LimitReader(r, 1<<20))
	if err != nil {
		return nil, err
	}
	text := strings.TrimSpace(string(b))
	ids := []int{}
	if text == "" {
		return ids, nil
	}
	for _, entry := range strings.Split(text, ",") {
		lo, hi, isRange := strings.Cut(entry, "-")
		first, err1 := strconv.Atoi(lo)
		last, err2 := first, error(nil)
		if isRange {
			last, err2 = strconv.Atoi(hi)
		}
		switch {
		case err1 != nil || err2 != nil || first < 0:
			return nil, fmt.Errorf("list %q: entry %q: want N or N-M", text, entry)
		case last < first:
			return nil, fmt.Errorf("list %q: entry %q: want N-M with N <= M", text, entry)
		case last >= maxListID:
			return nil, fmt.Errorf("list %q: entry %q: want numbers below %d", text, entry, maxListID)
		case len(ids) > 0 && first <= ids[len(ids)-1]:
			return nil, fmt.Errorf("list %q: entry %q: want entries in increasing order", text, entry)
		}
		for id := first; id <= last; id++ {
			ids = append(ids, id)
		}
	}
	return ids, nil
}

type nodeMeminfo struct {
	node        int
	total, free int64 // bytes
}

// parseNodeMeminfo parses /sys/devices/system/node/nodeN/meminfo, whose
// lines are "Node N Key: value [kB]". Every line must have that shape:
// a file that does not is not the file we think it is.
func parseNodeMeminfo(r io.Reader) (nodeMeminfo, error) {
	mi := nodeMeminfo{node: -1, total: -1, free: -1}
	s := bufio.NewScanner(r)
	for line := 1; s.Scan(); line++ {
		text := s.Text()
		if strings.TrimSpace(text) == "" {
			continue
		}
		bad := func(why string) error {
			return fmt.Errorf("line %d %q: %s", line, text, why)
		}
		f := strings.Fields(text)
		if len(f) < 4 || len(f) > 5 || f[0] != "Node" || !strings.HasSuffix(f[2], ":") {
			return mi, bad(`want "Node N Key: value [kB]"`)
		}
		node, err := strconv.Atoi(f[1])
		if err != nil || node < 0 {
			return mi, bad("node number " + strconv.Quote(f[1]) + ": want an integer >= 0")
		}
		if mi.node >= 0 && node != mi.node {
			return mi, bad(fmt.Sprintf("node %d: want node %d like the lines before", node, mi.node))
		}
		mi.node = node
		v, err := strconv.ParseInt(f[3], 10, 64)
		if err != nil || v < 0 {
			return mi, bad("value " + strconv.Quote(f[3]) + ": want an integer >= 0")
		}
		if len(f) == 5 {
			if f[4] != "kB" {
				return mi, bad("unit " + strconv.Quote(f[4]) + `: want "kB" or none`)
			}
			if v > (1<<63-1)/1024 {
				return mi, bad("value " + f[3] + " kB: too large")
			}
			v *= 1024
		}
		switch f[2] {
		case "MemTotal:":
			mi.total = v
		case "MemFree:":
			mi.free = v
		}
	}
	if err := s.Err(); err != nil {
		return mi, err
	}
	if mi.total < 0 || mi.free < 0 {
		return mi, errors.New("want MemTotal and MemFree lines")
	}
	return mi, nil
}
