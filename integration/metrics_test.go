package integration

import (
	"bufio"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/softuvm/softuvm/internal/metrics/metricstest"
	"github.com/softuvm/softuvm/uvm"
)

// metricsRoleEnv runs this binary as metricsClient. It is not one of
// TestMain's roles (roleEnv) because this file's client launches
// kernels, and its device processes are re-executions of this binary
// too: init unsets the variable before any is started, so that they run
// their own role through TestMain's uvm.Main.
const metricsRoleEnv = "UVM_INTEGRATION_METRICS_ROLE"

const metricsKernel = "metrics-touch"

func init() {
	// Adds one to the first byte of page tid.
	uvm.MustRegisterKernel(metricsKernel, func(tid, n int, p []byte) {
		addr := uintptr(binary.LittleEndian.Uint64(p))
		uvm.SliceAt[byte](addr+uintptr(tid*uvm.PageSize), 1)[0]++
	})
	if os.Getenv(metricsRoleEnv) != "client" {
		return
	}
	os.Unsetenv(metricsRoleEnv)
	uvm.Main()
	os.Exit(metricsClient())
}

// metricsClient works managed memory through the daemon: the host
// writes every page, a kernel on device 0 touches each (its faults move
// them there), and the host reads them back. It says "ready" once all
// of it is done, then waits for stdin to close.
func metricsClient() int {
	const pages = 256
	fail := func(err error) int {
		fmt.Fprintln(os.Stderr, "metrics client:", err)
		return 1
	}
	s, err := uvm.Default()
	if err != nil {
		return fail(err)
	}
	a, err := s.MallocManaged(pages * uvm.PageSize)
	if err != nil {
		return fail(err)
	}
	b := a.Bytes()
	for i := range pages {
		b[i*uvm.PageSize] = byte(i)
	}
	params := binary.LittleEndian.AppendUint64(nil, uint64(a.Addr()))
	if err := s.Launch(0, nil, metricsKernel, pages, params); err != nil {
		return fail(err)
	}
	if err := s.DeviceSynchronize(0); err != nil {
		return fail(err)
	}
	for i := range pages {
		if b[i*uvm.PageSize] != byte(i+1) {
			return fail(fmt.Errorf("page %d reads %d, not %d", i, b[i*uvm.PageSize], byte(i+1)))
		}
	}
	fmt.Println("ready")
	bufio.NewReader(os.Stdin).ReadString('\n')
	return 0
}

// daemonLog collects a daemon's standard error and hands over the
// metrics address once it is printed.
type daemonLog struct {
	mu      sync.Mutex
	text    strings.Builder
	metrics chan string
}

func (l *daemonLog) read(r *os.File) {
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		line := sc.Text()
		l.mu.Lock()
		l.text.WriteString(line + "\n")
		l.mu.Unlock()
		if _, url, ok := strings.Cut(line, "metrics on "); ok {
			l.metrics <- url
		}
	}
	close(l.metrics)
}

func (l *daemonLog) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.text.String()
}

// TestMetrics runs `uvm serve --metrics` with a client whose host and
// device fault, and checks that a scrape reads what `uvm stat --json`
// does, with nothing running in between.
func TestMetrics(t *testing.T) {
	requireRoot(t)
	dir := t.TempDir()
	sock := filepath.Join(dir, "run", "uvm.sock")
	daemon := exec.Command(filepath.Join(binDir, "uvm"), "serve", "--socket", sock, "--arena-size", "64MiB", "--metrics", "127.0.0.1:0")
	r, w, err := os.Pipe()
	require.NoError(t, err)
	defer r.Close()
	daemon.Stderr = w
	require.NoError(t, daemon.Start())
	w.Close()
	defer daemon.Process.Kill()
	dlog := &daemonLog{metrics: make(chan string, 1)}
	go dlog.read(r)
	var url string
	select {
	case u, ok := <-dlog.metrics:
		require.True(t, ok, "the daemon ended without serving metrics: %s", dlog.String())
		url = u
	case <-time.After(20 * time.Second):
		t.Fatalf("the daemon did not serve metrics: %s", dlog.String())
	}
	require.True(t, strings.HasPrefix(url, "http://127.0.0.1:") && strings.HasSuffix(url, "/metrics"), url)

	exe, err := os.Executable()
	require.NoError(t, err)
	client := exec.Command(exe)
	client.Env = append(os.Environ(), metricsRoleEnv+"=client", uvm.EnvSocket+"="+sock)
	stdin, release, err := os.Pipe()
	require.NoError(t, err)
	client.Stdin = stdin
	out, err := client.StdoutPipe()
	require.NoError(t, err)
	var cerr strings.Builder
	client.Stderr = &cerr
	require.NoError(t, client.Start())
	stdin.Close()
	line, _ := bufio.NewReader(out).ReadString('\n')
	require.Equal(t, "ready\n", line, "client stderr: %s\ndaemon: %s", cerr.String(), dlog.String())

	// The client waits on its stdin: nothing moves until it is closed,
	// which the two snapshots around the scrape confirm.
	before := statJSON(t, sock)
	fams := metricstest.Scrape(t, url)
	after := statJSON(t, sock)
	require.Equal(t, before.Stats, after.Stats, "activity during the scrape")
	st := before.Stats

	require.Positive(t, st.FaultsBy(uvm.CPU).Total())
	require.Positive(t, st.FaultsBy(0).Total(), "the kernel faulted on device 0")
	require.NotEmpty(t, st.MigrationsByCause)

	label := func(d uvm.Device) string {
		if d == uvm.CPU {
			return "cpu"
		}
		return fmt.Sprint(int(d))
	}
	got := metricstest.Samples(fams, "softuvm_")
	for _, d := range []uvm.Device{uvm.CPU, 0} {
		p := label(d)
		f := st.FaultsBy(d)
		assert.Equal(t, float64(f.Missing), got[fmt.Sprintf(`softuvm_faults_total{kind="missing",processor=%q}`, p)], p)
		assert.Equal(t, float64(f.Minor), got[fmt.Sprintf(`softuvm_faults_total{kind="minor",processor=%q}`, p)], p)
		assert.Equal(t, float64(f.WriteProtect), got[fmt.Sprintf(`softuvm_faults_total{kind="write_protect",processor=%q}`, p)], p)
		for name, v := range map[string]uint64{
			"populated_pages_total":                st.PopulatedPages(d),
			"evicted_pages_total":                  st.EvictedPages(d),
			"remote_mapped_pages_total":            st.RemoteMappedPages(d),
			"read_duplicated_pages_total":          st.ReadDuplicatedPages(d),
			"throttles_total":                      st.ThrottlesOf(d),
			"pins_total":                           st.PinsOf(d),
			"hints_armed_pages_total":              st.HintsArmedPages(d),
			"access_crossings_total":               st.CrossingsOf(d),
			"access_counters_migrated_pages_total": st.CounterMigratedPages(d),
		} {
			key := fmt.Sprintf(`softuvm_%s{processor=%q}`, name, p)
			require.Contains(t, got, key)
			assert.Equal(t, float64(v), got[key], key)
		}
	}
	for _, m := range st.MigrationsByCause {
		labels := fmt.Sprintf(`{cause=%q,from=%q,to=%q}`, m.Cause, label(m.From), label(m.To))
		assert.Equal(t, float64(m.Pages), got["softuvm_migrated_pages_total"+labels], labels)
		assert.Equal(t, float64(m.Bytes), got["softuvm_migrated_bytes_total"+labels], labels)
	}
	// A direction's causes, "unknown" included, add up to its total,
	// and no other direction has a series.
	perDirection := map[string]float64{}
	for k, v := range got {
		if rest, ok := strings.CutPrefix(k, "softuvm_migrated_pages_total{"); ok {
			_, dir, _ := strings.Cut(rest, ",") // after cause=...
			perDirection[dir] += v
		}
	}
	want := map[string]float64{}
	for _, m := range st.Migrations {
		want[fmt.Sprintf(`from=%q,to=%q}`, label(m.From), label(m.To))] = float64(m.Pages)
	}
	assert.Equal(t, want, perDirection)
	for name, v := range map[string]uint64{
		"allocations_total": st.Allocations, "allocated_bytes_total": st.AllocatedBytes,
		"prefetched_pages_total": st.PrefetchedPages, "prefetched_used_pages_total": st.PrefetchedUsed,
		"prefetched_unused_pages_total": st.PrefetchedUnused,
		"launch_copied_pages_total":     st.LaunchCopiedPages, "launch_clean_pages_total": st.LaunchCleanPages,
	} {
		assert.Equal(t, float64(v), got["softuvm_"+name+"{}"], name)
	}
	assert.Equal(t, float64(1), got["softuvm_allocations_total{}"])

	h := fams["softuvm_fault_service_seconds"].GetMetric()[0].GetHistogram()
	assert.Equal(t, st.FaultService.Count, h.GetSampleCount())
	assert.Equal(t, float64(st.FaultService.SumNS)/1e9, h.GetSampleSum())
	for _, b := range h.GetBucket() {
		le := uint64(math.Round(b.GetUpperBound() * 1e9))
		var n uint64
		for _, sb := range st.FaultService.Buckets {
			if sb.UpperNS <= le+1 { // the snapshot's bound is exclusive
				n += sb.Count
			}
		}
		assert.Equal(t, n, b.GetCumulativeCount(), "le=%v", b.GetUpperBound())
	}

	clients := 0
	for _, s := range before.Info.Sessions {
		if s.Role == "client" {
			clients++
		}
	}
	assert.Equal(t, 1, clients)
	assert.Equal(t, float64(clients), got[`softuvm_sessions{role="client"}`])
	dev := before.Info.Devices[0]
	assert.Equal(t, float64(dev.Capacity), got[`softuvm_device_capacity_bytes{device="0"}`])
	assert.Equal(t, float64(dev.UsedBytes), got[`softuvm_device_used_bytes{device="0"}`])
	assert.Contains(t, fams, "go_goroutines")
	assert.Contains(t, fams, "process_resident_memory_bytes")

	release.Close()
	require.NoError(t, client.Wait(), "client stderr: %s", cerr.String())
	require.NoError(t, daemon.Process.Signal(syscall.SIGTERM))
	done := make(chan error, 1)
	go func() { done <- daemon.Wait() }()
	select {
	case err := <-done:
		assert.NoError(t, err, "daemon: %s", dlog.String())
	case <-time.After(10 * time.Second):
		t.Fatal("the daemon did not exit on SIGTERM")
	}
}

// TestMetricsLoopbackOnly checks that uvm serve refuses to publish its
// metrics beyond this machine unless told to, before it serves.
func TestMetricsLoopbackOnly(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "run", "uvm.sock")
	_, errOut, err := uvmCmd(t, nil, "serve", "--socket", sock, "--metrics", "0.0.0.0:9464")
	assert.Equal(t, 1, exitCode(err), errOut)
	assert.Contains(t, errOut, "0.0.0.0:9464")
	assert.Contains(t, errOut, "--metrics-any-address")
	_, err = os.Stat(sock)
	assert.True(t, os.IsNotExist(err), "the daemon did not start")
}

type statFrame struct {
	Info  uvm.Info  `json:"info"`
	Stats uvm.Stats `json:"stats"`
}

func statJSON(t *testing.T, sock string) statFrame {
	t.Helper()
	out, errOut, err := uvmCmd(t, nil, "stat", "--socket", sock, "--count", "1", "--json")
	require.NoError(t, err, errOut)
	var f statFrame
	require.NoError(t, json.Unmarshal([]byte(out), &f), out)
	return f
}

// TestMetricsAfterTakeoverAndReplacement: a daemon serving metrics keeps
// serving them at the same address after its server is killed (the
// server that takes over serves them) and after `uvm serve --replace`
// without --metrics (the replacement keeps the daemon's configuration);
// each scrape is the new server's, its restarts counted.
func TestMetricsAfterTakeoverAndReplacement(t *testing.T) {
	requireRoot(t)
	sock := filepath.Join(t.TempDir(), "run", "uvm.sock")
	daemon := exec.Command(filepath.Join(binDir, "uvm"), "serve", "--socket", sock, "--arena-size", "64MiB", "--metrics", "127.0.0.1:0")
	r, w, err := os.Pipe()
	require.NoError(t, err)
	defer r.Close()
	daemon.Stderr = w
	require.NoError(t, daemon.Start())
	defer daemon.Process.Kill()
	dlog := &daemonLog{metrics: make(chan string, 1)}
	go dlog.read(r)
	served := func(what string) string {
		t.Helper()
		select {
		case u, ok := <-dlog.metrics:
			require.True(t, ok, "%s: the log ended without metrics: %s", what, dlog.String())
			return u
		case <-time.After(60 * time.Second):
			t.Fatalf("%s: no metrics served: %s", what, dlog.String())
			return ""
		}
	}
	url := served("the daemon")
	restarts := func() float64 {
		t.Helper()
		return metricstest.Samples(metricstest.Scrape(t, url), "softuvm_")["softuvm_server_restarts_total{}"]
	}
	require.Zero(t, restarts())

	require.NoError(t, daemon.Process.Signal(syscall.SIGKILL))
	daemon.Wait()
	assert.Equal(t, url, served("the server that took over"), "the same address")
	assert.Equal(t, float64(1), restarts(), "the new server's metrics")

	repl := exec.Command(filepath.Join(binDir, "uvm"), "serve", "--replace", "--socket", sock)
	repl.Stderr = w // the log's reader sees its lines too
	require.NoError(t, repl.Start())
	w.Close()
	defer repl.Process.Kill()
	assert.Equal(t, url, served("the replacement"), "the same address")
	assert.Equal(t, float64(2), restarts(), "the replacement's metrics")
	require.NoError(t, repl.Process.Signal(syscall.SIGTERM))
	repl.Wait()
}
