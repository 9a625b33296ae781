package cli

import (
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/softuvm/softuvm/internal/bench/soak"
	"github.com/softuvm/softuvm/uvm"
)

func benchSoak(args []string) error {
	fs := newFlagSet("bench soak", "[--duration D] [--clients N|go=N,c=N,run=N] [--seed S] [--kill-every MIN-MAX|off] [--kills server,device,guard] [--json] [server flags]",
		"Run a daemon shared by Go and C clients doing random allocations, frees, host writes and reads, advice, prefetches and kernels on every device, each checking every byte against a shadow copy, "+
			"and unmodified programs under uvm run (memtester; sha256sum, sort and a gzip round trip compared with plain runs), for --duration, while the daemon's server, a device process and the guard "+
			"(and the servers and guards of the uvm runs) are killed with SIGKILL at random moments, one at a time, each after the last one's recovery was seen. "+
			"Reports operations by kind, kills by kind and their recoveries, bytes checked, and every wrong byte with the operations that touched it, hang (no progress for --hang-after), crash or kill not recovered from; "+
			"exits 1 if there was any. The other flags configure the daemon, as for uvm serve")
	var sf serverFlags
	sf.register(fs)
	// The daemon's defaults: two devices whose arenas, and a host budget,
	// are smaller than what the clients allocate, so that pages are
	// evicted from every processor while the kills come.
	for name, value := range map[string]string{"devices": "2", "arena-size": "16MiB", "host-budget": "24MiB", "device-workers": "2"} {
		f := fs.Lookup(name)
		f.Value.Set(value)
		f.DefValue = value
	}
	serverNames := flagNames(fs)
	asJSON := fs.Bool("json", false, "print one JSON object")
	duration := fs.Duration("duration", 5*time.Minute, "how long the clients run and the kills come")
	clients := fs.String("clients", "2", "clients of each kind at once (Go, C, programs under uvm run), or go=N,c=N,run=N")
	seed := fs.Uint64("seed", 0, "the seed of every client's operations and of the kills (0: from the clock; the report gives it)")
	killEvery := fs.String("kill-every", "2s-6s", "time between a recovery and the next kill: MIN-MAX (random, uniform), one duration, or off")
	kills := fs.String("kills", "server,device,guard", "the kinds of process killed, in rounds that kill each kind once in random order: server (the daemon's, and a uvm run's), device (a client's device process), guard (the daemon's, and a uvm run's)")
	hangAfter := fs.Duration("hang-after", 2*time.Minute, "a client that makes no progress for this long, a program under uvm run that runs this long, or a kill not recovered from in this time, is a hang")
	maxAlloc := fs.String("max-alloc", "4MiB", "the largest allocation a client makes")
	slots := fs.Int("slots", 5, "allocations each Go and C client keeps at once")
	ops := fs.String("ops", strings.Join(soak.OpNames(), ","), "the operations the Go and C clients choose from at random (to narrow down a failure): "+strings.Join(soak.OpNames(), ", "))
	programs := fs.String("programs", strings.Join(soak.ProgramNames, ","), "the programs the clients under uvm run take turns to run: "+strings.Join(soak.ProgramNames, ", ")+" (gzip: compress, then decompress)")
	logDir := fs.String("log-dir", "", "keep the daemon's, the clients' and the runs' logs in this directory (default: a temporary one, kept only if the soak fails)")
	uvmBin := fs.String("uvm", "", "the uvm binary that runs the daemon, the Go clients and uvm run (default: this one)")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if _, err := sf.config(); err != nil {
		return err
	}
	if sf.devices < 1 {
		return fmt.Errorf("--devices %d: the clients run kernels, want at least 1", sf.devices)
	}
	o := soak.Options{Duration: *duration, Seed: *seed, HangAfter: *hangAfter, Slots: *slots, LogDir: *logDir, UVM: *uvmBin}
	var err error
	if o.MaxAlloc, err = uvm.ParseSize(*maxAlloc); err != nil || o.MaxAlloc < 1 {
		return fmt.Errorf("--max-alloc %q: want a size of at least 1 byte", *maxAlloc)
	}
	if o.Clients, err = soak.ParseClients(*clients); err != nil {
		return err
	}
	if o.KillMin, o.KillMax, err = soak.ParseKillEvery(*killEvery); err != nil {
		return err
	}
	if o.KillKinds, err = soak.ParseKills(*kills, o.KillMax > 0); err != nil {
		return err
	}
	if o.Ops, err = soak.ParseOps(*ops); err != nil {
		return err
	}
	if o.Programs, err = soak.ParsePrograms(*programs); err != nil {
		return err
	}
	if o.UVM == "" {
		if o.UVM, err = os.Executable(); err != nil {
			return fmt.Errorf("the path of this uvm binary, for the daemon and the clients: %w", err)
		}
	}
	o.DaemonArgs, o.RunArgs = soakServerArgs(fs, serverNames)
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
	defer signal.Stop(sigs)
	o.Interruptions = sigs
	o.Progress = func(format string, a ...any) { fmt.Fprintf(os.Stderr, "uvm bench soak: "+format+"\n", a...) }
	rep, err := soak.Run(o)
	if err != nil {
		return err
	}
	if err := printReport(*asJSON, &rep); err != nil {
		return err
	}
	switch {
	case rep.Interrupted != "":
		return fmt.Errorf("interrupted (%s) after %.0fs", rep.Interrupted, rep.ElapsedSeconds)
	case !rep.OK:
		return fmt.Errorf("the soak failed: %d failures; the logs are in %s", len(rep.Failures), rep.LogDir)
	}
	return nil
}

// soakServerArgs are the server flags of the soak's daemon (all of them,
// defaults included) and of its uvm runs (only those given: their
// programs have sizes and budgets of their own).
func soakServerArgs(fs *flag.FlagSet, serverNames []string) (daemon, run []string) {
	given := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	for _, name := range serverNames {
		arg := "--" + name + "=" + fs.Lookup(name).Value.String()
		daemon = append(daemon, arg)
		if given[name] && name != "devices" && name != "arena-size" && name != "host-budget" && name != "device-workers" {
			run = append(run, arg)
		}
	}
	return daemon, run
}

// flagNames lists the flags registered so far.
func flagNames(fs *flag.FlagSet) []string {
	var names []string
	fs.VisitAll(func(f *flag.Flag) { names = append(names, f.Name) })
	return names
}
