package devmem

import (
	"os"
	"runtime"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestParseCPUList(t *testing.T) {
	for _, tc := range []struct {
		fixture string
		want    []int
		err     string
	}{
		{"single", []int{0}, ""},
		{"ranges", []int{0, 1, 2, 3, 8, 10, 11}, ""},
		{"empty", []int{}, ""},
		{"bad-entry", nil, `list "0-3,x": entry "x": want N or N-M`},
		{"reversed", nil, `list "3-1": entry "3-1": want N-M with N <= M`},
		{"unordered", nil, `list "0-3,2": entry "2": want entries in increasing order`},
		{"huge", nil, `list "0-4000000000": entry "0-4000000000": want numbers below 1048576`},
	} {
		t.Run(tc.fixture, func(t *testing.T) {
			got, err := readFile("testdata/cpulist/"+tc.fixture, parseCPUList)
			if tc.err != "" {
				assert.EqualError(t, err, "read testdata/cpulist/"+tc.fixture+": "+tc.err)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.want, got)
		})
	}
	for _, bad := range []string{"-1", "1-", "a", "1,,2", "0-1-2"} {
		_, err := parseCPUList(strings.NewReader(bad))
		assert.ErrorContains(t, err, "list "+`"`+bad+`"`, "list %q", bad)
	}
}

func TestParseNodeMeminfo(t *testing.T) {
	mi, err := readFile("testdata/2node/sys/devices/system/node/node1/meminfo", parseNodeMeminfo)
	require.NoError(t, err)
	assert.Equal(t, nodeMeminfo{node: 1, total: 16777216 * 1024, free: 16000000 * 1024}, mi)

	for _, tc := range []struct{ fixture, err string }{
		{"missing-colon", `line 2 "Node 0 MemFree 512 kB": want "Node N Key: value [kB]"`},
		{"bad-value", `line 2 "Node 0 MemFree:        lots kB": value "lots": want an integer >= 0`},
		{"mixed-nodes", `line 2 "Node 1 MemFree:        512 kB": node 1: want node 0 like the lines before`},
		{"bad-unit", `line 1 "Node 0 MemTotal:       1024 MB": unit "MB": want "kB" or none`},
		{"no-total", `want MemTotal and MemFree lines`},
	} {
		t.Run(tc.fixture, func(t *testing.T) {
			_, err := readFile("testdata/nodememinfo/"+tc.fixture, parseNodeMeminfo)
			assert.EqualError(t, err, "read testdata/nodememinfo/"+tc.fixture+": "+tc.err)
		})
	}
}

func TestReadNodesFixtures(t *testing.T) {
	for _, tc := range []struct {
		machine string
		want    []Node
	}{
		{"1node", []Node{{ID: 0, CPUs: []int{0, 1}, MemTotal: 4417748 << 10, MemFree: 4282128 << 10}}},
		{"2node", []Node{
			{ID: 0, CPUs: []int{0, 1, 4, 5}, MemTotal: 16384000 << 10, MemFree: 12000000 << 10},
			{ID: 1, CPUs: []int{2, 3, 6, 7}, MemTotal: 16777216 << 10, MemFree: 16000000 << 10},
		}},
		{"2node-cpuonly", []Node{
			{ID: 0, CPUs: []int{0, 1}, MemTotal: 8388608 << 10, MemFree: 8000000 << 10},
			{ID: 1, CPUs: []int{2, 3}, MemTotal: 0, MemFree: 0},
		}},
		// No node directory: one node with every CPU and /proc/meminfo's memory.
		{"nonode", []Node{{ID: 0, CPUs: []int{0, 1, 2, 3}, MemTotal: 8167400 << 10, MemFree: 7001234 << 10}}},
	} {
		t.Run(tc.machine, func(t *testing.T) {
			got, err := readNodes("testdata/" + tc.machine)
			require.NoError(t, err)
			assert.Equal(t, tc.want, got)
		})
	}

	_, err := readNodes("testdata/bad-nodememinfo")
	assert.EqualError(t, err, "read testdata/bad-nodememinfo/sys/devices/system/node/node1/meminfo: it describes node 0: want node 1")
	_, err = readNodes("testdata/cpulist")
	assert.ErrorIs(t, err, os.ErrNotExist, "no node dir and no cpu/online either")

	cpus, err := readOnlineCPUs("testdata/2node")
	require.NoError(t, err)
	assert.Equal(t, []int{0, 1, 2, 3, 4, 5, 6, 7}, cpus)
}

// The real machine agrees with itself: every node's CPUs are online,
// every online CPU belongs to a node, and some node has memory.
func TestNodesOnThisMachine(t *testing.T) {
	nodes, err := Nodes()
	require.NoError(t, err)
	require.NotEmpty(t, nodes)
	online, err := OnlineCPUs()
	require.NoError(t, err)
	require.NotEmpty(t, online)
	var all []int
	withMemory := false
	for _, n := range nodes {
		all = append(all, n.CPUs...)
		withMemory = withMemory || n.MemTotal > 0
		assert.LessOrEqual(t, n.MemFree, n.MemTotal, "node %d", n.ID)
	}
	slices.Sort(all)
	assert.Equal(t, online, all)
	assert.True(t, withMemory)
}

// Pinning to each CPU the thread may use, in turn, moves it there.
func TestPinCurrentThread(t *testing.T) {
	allowed, err := AllowedCPUs()
	require.NoError(t, err)
	online, err := OnlineCPUs()
	require.NoError(t, err)
	var cpus []int
	for _, c := range online {
		if slices.Contains(allowed, c) {
			cpus = append(cpus, c)
		} else {
			t.Logf("cpu %d is online but outside this process's affinity; skipping it", c)
		}
	}
	require.NotEmpty(t, cpus)

	done := make(chan struct{})
	go func() {
		defer close(done)
		// Never unlocked: the runtime then retires the thread when the
		// goroutine ends, so the pin cannot leak to other goroutines.
		runtime.LockOSThread()
		for _, cpu := range cpus {
			if !assert.NoError(t, PinCurrentThread(cpu)) {
				continue
			}
			got, err := CurrentCPU()
			assert.NoError(t, err)
			assert.Equal(t, cpu, got, "after pinning to cpu %d", cpu)
		}
	}()
	<-done

	assert.EqualError(t, PinCurrentThread(-1), "pin thread to cpu -1: want 0..1023")
	assert.EqualError(t, PinCurrentThread(5000), "pin thread to cpu 5000: want 0..1023")
}

func TestPinCurrentThreadToNode(t *testing.T) {
	nodes, err := Nodes()
	require.NoError(t, err)
	allowed, err := AllowedCPUs()
	require.NoError(t, err)
	done := make(chan struct{})
	go func() {
		defer close(done)
		runtime.LockOSThread() // never unlocked: the thread retires with the goroutine
		for _, n := range nodes {
			if !slices.ContainsFunc(n.CPUs, func(c int) bool { return slices.Contains(allowed, c) }) {
				continue
			}
			if !assert.NoError(t, PinCurrentThreadToNode(n.ID)) {
				continue
			}
			got, err := AllowedCPUs()
			assert.NoError(t, err)
			for _, c := range got {
				assert.Contains(t, n.CPUs, c, "after pinning to node %d the thread runs only on its CPUs", n.ID)
			}
		}
		err := PinCurrentThreadToNode(1 << 20)
		assert.ErrorContains(t, err, "no such node")
	}()
	<-done
}
