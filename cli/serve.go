package cli

import (
	"fmt"
	"os"

	"github.com/softuvm/softuvm/internal/config"
	"github.com/softuvm/softuvm/internal/server"
	"github.com/softuvm/softuvm/uvm"
)

func runServe(args []string) error {
	fs := newFlagSet("serve", "[flags]", "Run a fault server daemon. Programs using softuvm find it at the socket and use it instead of starting a private server; it serves only its own user (and root). "+
		"A guard process holds every client's state: if the daemon dies, a new one takes over and programs see a pause. "+
		"--replace makes this process (a new binary, say) take over from the daemon running at the socket, keeping its configuration; SIGUSR2 to a daemon starts such a replacement from its own binary")
	var sf serverFlags
	sf.register(fs)
	socket := fs.String("socket", config.DefaultSocketPath(), "Unix socket to listen on (created 0600 in a 0700 directory)")
	noGuard := fs.Bool("no-guard", false, "do not start the guard process that keeps clients' state if this server dies (a dead server then loses what was not on the host, and blocked clients hang)")
	replace := fs.Bool("replace", false, "take over from the daemon running at --socket, with its sessions and configuration, without ending any of them")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if *replace {
		return server.ReplaceDaemon(*socket, func(s *server.Server) {
			fmt.Fprintf(os.Stderr, "uvm serve: pid %d took over %s (%d sessions)\n", os.Getpid(), *socket, s.SessionCount())
		})
	}
	cfg, err := sf.config()
	if err != nil {
		return err
	}
	cfg.Guard = !*noGuard
	return server.ListenAndServe(cfg, *socket, func(s *server.Server) {
		fmt.Fprintf(os.Stderr, "uvm serve: pid %d listening on %s\n", os.Getpid(), *socket)
		for _, d := range s.Devices() {
			fmt.Fprintf(os.Stderr, "  %v: %s arena, backend %s, NUMA node %d, %d workers\n", d.Device, uvm.FormatSize(d.Capacity), d.Backend, d.Node, d.Workers)
		}
		fmt.Fprintf(os.Stderr, "  prefetch %s, handlers %s, guard %v, restarts %s, thrashing %s\n", cfg.Prefetch, cfg.Handlers, cfg.Guard, config.FormatRestarts(cfg.Restarts), cfg.Thrashing)
	})
}
