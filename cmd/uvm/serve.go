package main

import (
	"fmt"
	"os"

	"github.com/softuvm/softuvm/uvm"
)

func runServe(args []string) error {
	fs := newFlagSet("serve", "[flags]", "Run a fault server daemon. Programs using softuvm find it at the socket and use it instead of starting a private server; it serves only its own user (and root)")
	var sf serverFlags
	sf.register(fs)
	socket := fs.String("socket", uvm.DefaultSocketPath(), "Unix socket to listen on (created 0600 in a 0700 directory)")
	noGuard := fs.Bool("no-guard", false, "do not start the guard process that turns clients' faults into SIGBUS if this server dies")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	cfg, err := sf.config()
	if err != nil {
		return err
	}
	cfg.Guard = !*noGuard
	return uvm.ListenAndServe(cfg, *socket, func(s *uvm.Server) {
		fmt.Fprintf(os.Stderr, "uvm serve: pid %d listening on %s\n", os.Getpid(), *socket)
		for _, d := range s.Devices() {
			fmt.Fprintf(os.Stderr, "  %v: %s arena, backend %s, NUMA node %d, %d workers\n", d.Device, uvm.FormatSize(d.Capacity), d.Backend, d.Node, d.Workers)
		}
		fmt.Fprintf(os.Stderr, "  prefetch %s, handlers %s, guard %v, thrashing %s\n", cfg.Prefetch, cfg.Handlers, cfg.Guard, cfg.Thrashing)
	})
}
