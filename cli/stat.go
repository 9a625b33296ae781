package cli

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/softuvm/softuvm/internal/config"
	"github.com/softuvm/softuvm/internal/wire"
	"github.com/softuvm/softuvm/uvm"
)

func runStat(args []string) error {
	fs := newFlagSet("stat", "[--pid PID | --socket PATH] [--interval D] [--count N] [--json] [--anatomy]",
		"Show a running server's counters: faults by processor and kind (counted by the server, by eBPF and by the kernel), migrations each way, access counters, prefetch, fault service time. On a terminal the screen refreshes in place")
	pid := fs.Int("pid", 0, "the private server with this process id (see `uvm info`)")
	socket := fs.String("socket", "", "the server listening on this socket (default: the daemon, or the only private server)")
	interval := fs.Duration("interval", time.Second, "time between refreshes")
	count := fs.Int("count", 0, "stop after this many refreshes (0: until interrupted)")
	asJSON := fs.Bool("json", false, "print one JSON object per refresh")
	anatomy := fs.Bool("anatomy", false, "show the fault anatomy instead: histograms of each stage of the sampled faults (needs eBPF)")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if *interval <= 0 {
		return fmt.Errorf("--interval %v: want a positive duration", *interval)
	}
	path, err := findServer(*pid, *socket)
	if err != nil {
		return err
	}
	m, err := wire.ConnectMonitor(path)
	if err != nil {
		return err
	}
	defer m.Close()
	tty := isTerminal(os.Stdout)
	var prev *uvm.Stats
	prevAt := time.Now()
	for i := 0; *count == 0 || i < *count; i++ {
		if i > 0 {
			time.Sleep(*interval)
		}
		st, err := m.ServerStats()
		if err != nil {
			return err
		}
		in, err := m.Info()
		if err != nil {
			return err
		}
		now := time.Now()
		if *asJSON {
			json.NewEncoder(os.Stdout).Encode(struct {
				Time  time.Time `json:"time"`
				Info  uvm.Info  `json:"info"`
				Stats uvm.Stats `json:"stats"`
			}{now, in, st})
			continue
		}
		var b strings.Builder
		if *anatomy {
			renderAnatomy(&b, path, in)
		} else {
			renderStat(&b, path, in, st, prev, now.Sub(prevAt))
		}
		if tty {
			fmt.Print("\033[H\033[2J")
		} else if i > 0 {
			fmt.Println()
		}
		fmt.Print(b.String())
		prev, prevAt = &st, now
	}
	return nil
}

func findServer(pid int, socket string) (string, error) {
	switch {
	case socket != "":
		return socket, nil
	case pid != 0:
		return config.PrivateServerSocketPath(pid), nil
	}
	if m, err := wire.ConnectMonitor(config.DefaultSocketPath()); err == nil {
		m.Close()
		return config.DefaultSocketPath(), nil
	}
	pids := privateServers()
	switch len(pids) {
	case 0:
		return "", fmt.Errorf("no fault server is running: no daemon at %s and no private server (start one with `uvm serve`, or run a program that uses softuvm)", config.DefaultSocketPath())
	case 1:
		return config.PrivateServerSocketPath(pids[0]), nil
	}
	return "", fmt.Errorf("several private servers run (pids %v): choose one with --pid", pids)
}

func isTerminal(f *os.File) bool {
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}

func rate(now, before uint64, dt time.Duration) string {
	if dt <= 0 || now < before {
		return ""
	}
	return fmt.Sprintf("%.0f/s", float64(now-before)/dt.Seconds())
}

func renderStat(w io.Writer, path string, in uvm.Info, st uvm.Stats, prev *uvm.Stats, dt time.Duration) {
	clients := 0
	for _, s := range in.Sessions {
		if s.Role == "client" {
			clients++
		}
	}
	fmt.Fprintf(w, "softuvm server pid %d on %s, up %s, %d clients, handlers %s %v, prefetch %s\n", in.PID, path, in.Uptime, clients, in.Handlers, in.HandlerCPUs, in.Prefetch)
	fmt.Fprintln(w, restartLine(in.Restart))
	fmt.Fprintln(w)
	fmt.Fprintf(w, "%-12s %14s %14s\n", "arena", "used", "capacity")
	for _, d := range in.Devices {
		fmt.Fprintf(w, "%-12v %14s %14s\n", d.Device, uvm.FormatSize(d.UsedBytes), uvm.FormatSize(d.Capacity))
	}
	fmt.Fprintf(w, "\n%-12s %12s %12s %12s %12s\n", "faults", "missing", "minor", "wp", "rate")
	for _, f := range st.Faults {
		r := ""
		if prev != nil {
			r = rate(f.Total(), prev.FaultsBy(f.Processor).Total(), dt)
		}
		fmt.Fprintf(w, "%-12v %12d %12d %12d %12s\n", f.Processor, f.Missing, f.Minor, f.WriteProtect, r)
	}
	fmt.Fprintf(w, "\naccess counting: %s\n", in.AccessCounting)
	fmt.Fprintf(w, "%-18s %14s %14s %14s\n", "client faults", "served", "eBPF", "minflt")
	for _, s := range in.Sessions {
		if s.Role == "client" {
			fmt.Fprintf(w, "%-18s %14d %14s %14s\n", fmt.Sprintf("pid %d", s.PID), s.ServedFaults, optCount(s.EBPFFaults), optCount(s.MinorFaults))
			for _, d := range s.Devices {
				fmt.Fprintf(w, "%-18s %14d %14s %14s\n", fmt.Sprintf("  %v pid %d", d.Processor, d.PID), d.Served, optCount(d.EBPFFaults), optCount(d.MinorFaults))
			}
		}
	}
	if v := in.VMStat; v != nil {
		fmt.Fprintf(w, "system since the server started (/proc/vmstat): %d faults, %d major; %d pages allocated, %d freed\n",
			v["pgfault"], v["pgmajfault"], v["pgalloc_normal"], v["pgfree"])
	}
	fmt.Fprintf(w, "\n%-24s %12s %12s %12s\n", "migrations", "pages", "bytes", "rate")
	for _, m := range st.Migrations {
		r := ""
		if prev != nil && dt > 0 {
			r = fmt.Sprintf("%.1f MB/s", float64(m.Bytes-prev.MigratedPages(m.From, m.To)*uvm.PageSize)/dt.Seconds()/1e6)
		}
		fmt.Fprintf(w, "%-24s %12d %12s %12s\n", fmt.Sprintf("%v -> %v", m.From, m.To), m.Pages, uvm.FormatSize(int64(m.Bytes)), r)
	}
	for _, p := range st.Populated {
		fmt.Fprintf(w, "%-24s %12d %12s\n", fmt.Sprintf("zero-filled on %v", p.Processor), p.Pages, uvm.FormatSize(int64(p.Pages)*uvm.PageSize))
	}
	for _, p := range st.Evicted {
		fmt.Fprintf(w, "%-24s %12d %12s\n", fmt.Sprintf("evicted from %v", p.Processor), p.Pages, uvm.FormatSize(int64(p.Pages)*uvm.PageSize))
	}
	for _, p := range st.RemoteMapped {
		fmt.Fprintf(w, "%-24s %12d %12s\n", fmt.Sprintf("mapped remotely by %v", p.Processor), p.Pages, uvm.FormatSize(int64(p.Pages)*uvm.PageSize))
	}
	for _, p := range st.ReadDuplicated {
		fmt.Fprintf(w, "%-24s %12d %12s\n", fmt.Sprintf("read copies on %v", p.Processor), p.Pages, uvm.FormatSize(int64(p.Pages)*uvm.PageSize))
	}
	for _, c := range st.Throttles {
		fmt.Fprintf(w, "%-24s %12d\n", fmt.Sprintf("throttled faults of %v", c.Processor), c.Count)
	}
	for _, c := range st.Pins {
		fmt.Fprintf(w, "%-24s %12d\n", fmt.Sprintf("pins after %v thrashed", c.Processor), c.Count)
	}
	for _, r := range st.Refaults {
		fmt.Fprintf(w, "%-24s %12d %12s  %s\n", fmt.Sprintf("refaults on %v", r.Processor), r.Pages, uvm.FormatSize(int64(r.Pages)*uvm.PageSize), refaultDetail(r))
	}
	for _, p := range st.HintsArmed {
		fmt.Fprintf(w, "%-24s %12d %12s\n", fmt.Sprintf("hint faults armed on %v", p.Processor), p.Pages, uvm.FormatSize(int64(p.Pages)*uvm.PageSize))
	}
	for _, c := range st.AccessCrossings {
		fmt.Fprintf(w, "%-24s %12d\n", fmt.Sprintf("regions at threshold, %v", c.Processor), c.Count)
	}
	for _, p := range st.CounterMigrated {
		fmt.Fprintf(w, "%-24s %12d %12s\n", fmt.Sprintf("counter-migrated to %v", p.Processor), p.Pages, uvm.FormatSize(int64(p.Pages)*uvm.PageSize))
	}
	fmt.Fprintf(w, "\nmanaged allocations %d made, %s asked for (freed ones included)\n", st.Allocations, humanSize(st.AllocatedBytes))
	fmt.Fprintf(w, "prefetched pages %d (used %d, unused %d, the rest not tracked or not yet known)\n", st.PrefetchedPages, st.PrefetchedUsed, st.PrefetchedUnused)
	if st.ReadAheadPages > 0 {
		fmt.Fprintf(w, "read ahead %d pages (%s of those prefetched: blocks moved ahead of a sweep)\n", st.ReadAheadPages, uvm.FormatSize(int64(st.ReadAheadPages)*uvm.PageSize))
	}
	if st.LaunchCopiedPages > 0 || st.LaunchCleanPages > 0 {
		fmt.Fprintf(w, "launch coherence: pages copied to devices at launches %d, host copies dropped clean %d\n", st.LaunchCopiedPages, st.LaunchCleanPages)
	}
	if st.EvictedCleanPages > 0 {
		fmt.Fprintf(w, "evicted clean %d pages (%s left the host without a copy: the device's was current)\n", st.EvictedCleanPages, uvm.FormatSize(int64(st.EvictedCleanPages)*uvm.PageSize))
	}
	if st.DiscardedPages > 0 {
		fmt.Fprintf(w, "discarded pages %d (%s dropped without a copy: freed heap memory, MemDiscard)\n", st.DiscardedPages, uvm.FormatSize(int64(st.DiscardedPages)*uvm.PageSize))
	}
	h := st.FaultService
	fmt.Fprintf(w, "fault service    %d faults: p50 %v  p99 %v  max %v  mean %v\n", h.Count, h.Quantile(0.5), h.Quantile(0.99), time.Duration(h.MaxNS), h.Mean())
	if in.StrayFaults > 0 || in.PoisonedPage > 0 {
		fmt.Fprintf(w, "stray faults %d, pages poisoned %d\n", in.StrayFaults, in.PoisonedPage)
	}
}

// refaultDetail says what a processor's refaults were and what its
// thrashing policy did of them.
func refaultDetail(r uvm.ProcessorRefaults) string {
	return fmt.Sprintf("%d back soon after their eviction; resident core: %d pages protected, %d let go with their generation, %d evicted for room",
		r.Recent, r.Protected, r.Unprotected, r.Demoted)
}

// renderAnatomy shows the fault anatomy: each stage's quantiles and a
// histogram by powers of two.
func renderAnatomy(w io.Writer, path string, in uvm.Info) {
	fmt.Fprintf(w, "softuvm server pid %d on %s, up %s: fault anatomy\n", in.PID, path, in.Uptime)
	an := in.Anatomy
	if an == nil {
		fmt.Fprintf(w, "not available: access counting is %s (the anatomy needs the eBPF counters and AccessPolicy anatomy > 0)\n", in.AccessCounting)
		return
	}
	fmt.Fprintf(w, "%d faults sampled, one in %d; microseconds\n\n", an.Samples, an.SampleEvery)
	stages := []struct {
		name, what string
		h          uvm.Histogram
	}{
		{"to server", "fault entry -> handler read the message", an.ToServer},
		{"sampling", "the anatomy's own lookups", an.Sampling},
		{"decision", "server's work before the ioctl", an.Decision},
		{"ioctl", "the resolving ioctl", an.Ioctl},
		{"wake", "ioctl returned -> thread runs", an.Wake},
		{"total", "fault entry -> thread runs", an.Total},
	}
	us := func(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e3 }
	fmt.Fprintf(w, "%-10s %9s %9s %9s %9s  %s\n", "stage", "p50", "p90", "p99", "max", "")
	for _, st := range stages {
		fmt.Fprintf(w, "%-10s %9.1f %9.1f %9.1f %9.1f  %s\n", st.name, us(st.h.Quantile(0.5)), us(st.h.Quantile(0.9)), us(st.h.Quantile(0.99)), float64(st.h.MaxNS)/1e3, st.what)
	}
	for _, st := range stages {
		fmt.Fprintf(w, "\n%s\n", st.name)
		writeHistogram(w, st.h)
	}
}

// writeHistogram draws h's counts in bins by powers of two of
// microseconds, 40 characters for the fullest.
func writeHistogram(w io.Writer, h uvm.Histogram) {
	type bin struct {
		upper time.Duration
		count uint64
	}
	var bins []bin
	for _, b := range h.Buckets {
		upper := time.Microsecond
		for upper < time.Duration(b.UpperNS) {
			upper *= 2
		}
		if n := len(bins); n > 0 && bins[n-1].upper == upper {
			bins[n-1].count += b.Count
		} else {
			bins = append(bins, bin{upper, b.Count})
		}
	}
	var most uint64
	for _, b := range bins {
		most = max(most, b.count)
	}
	for _, b := range bins {
		bar := int(b.count * 40 / max(most, 1))
		fmt.Fprintf(w, "  <= %8v %8d %s\n", b.upper, b.count, strings.Repeat("#", max(bar, 1)))
	}
}

// restartLine says who keeps the server's state, and whether it took
// over from a server that died.
func restartLine(r uvm.RestartInfo) string {
	guard := "no guard: if it dies, its clients' data not on the host is lost"
	if r.GuardPID != 0 {
		guard = fmt.Sprintf("guard pid %d, restarts %s", r.GuardPID, r.Policy)
	}
	if r.Restarts == 0 {
		return guard + "; started fresh"
	}
	return fmt.Sprintf("%s; took over after %d server deaths: paused %.1f ms, %d pages adopted in %.1f ms, %d put back from the staging file (counters since the takeover)",
		guard, r.Restarts, r.PauseMS, r.AdoptedPages, r.RebuildMS, r.RecoveredPages)
}
