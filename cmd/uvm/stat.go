package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/softuvm/softuvm/uvm"
)

func runStat(args []string) error {
	fs := newFlagSet("stat", "[--pid PID | --socket PATH] [--interval D] [--count N] [--json]",
		"Show a running server's counters: faults by processor and kind, migrations each way, prefetch, fault service time. On a terminal the screen refreshes in place")
	pid := fs.Int("pid", 0, "the private server with this process id (see `uvm info`)")
	socket := fs.String("socket", "", "the server listening on this socket (default: the daemon, or the only private server)")
	interval := fs.Duration("interval", time.Second, "time between refreshes")
	count := fs.Int("count", 0, "stop after this many refreshes (0: until interrupted)")
	asJSON := fs.Bool("json", false, "print one JSON object per refresh")
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
	m, err := uvm.ConnectMonitor(path)
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
		renderStat(&b, path, in, st, prev, now.Sub(prevAt))
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
		return uvm.PrivateServerSocketPath(pid), nil
	}
	if m, err := uvm.ConnectMonitor(uvm.DefaultSocketPath()); err == nil {
		m.Close()
		return uvm.DefaultSocketPath(), nil
	}
	pids := privateServers()
	switch len(pids) {
	case 0:
		return "", fmt.Errorf("no fault server is running: no daemon at %s and no private server (start one with `uvm serve`, or run a program that uses softuvm)", uvm.DefaultSocketPath())
	case 1:
		return uvm.PrivateServerSocketPath(pids[0]), nil
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
	fmt.Fprintf(w, "softuvm server pid %d on %s, up %s, %d clients, handlers %s %v, prefetch %s\n\n", in.PID, path, in.Uptime, clients, in.Handlers, in.HandlerCPUs, in.Prefetch)
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
	fmt.Fprintf(w, "\nmanaged allocations %d made, %s asked for (freed ones included)\n", st.Allocations, humanSize(st.AllocatedBytes))
	fmt.Fprintf(w, "prefetched pages %d (used %d, unused %d, the rest not tracked or not yet known)\n", st.PrefetchedPages, st.PrefetchedUsed, st.PrefetchedUnused)
	h := st.FaultService
	fmt.Fprintf(w, "fault service    %d faults: p50 %v  p99 %v  max %v  mean %v\n", h.Count, h.Quantile(0.5), h.Quantile(0.99), time.Duration(h.MaxNS), h.Mean())
	if in.StrayFaults > 0 || in.PoisonedPage > 0 {
		fmt.Fprintf(w, "stray faults %d, pages poisoned %d\n", in.StrayFaults, in.PoisonedPage)
	}
}
