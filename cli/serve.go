package cli

import (
	"errors"
	"fmt"
	"os"
	"syscall"
	"time"

	"github.com/softuvm/softuvm/internal/config"
	"github.com/softuvm/softuvm/internal/metrics"
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
	metricsAddr := fs.String("metrics", "", "serve the server's statistics in the Prometheus text format at http://`ADDR`/metrics (host:port; a loopback address unless --metrics-any-address)")
	metricsAny := fs.Bool("metrics-any-address", false, "let --metrics listen on an address other than loopback: anyone who can reach it reads the statistics")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if *metricsAny && *metricsAddr == "" {
		return fmt.Errorf("--metrics-any-address without --metrics")
	}
	if *replace {
		// The address can only be bound once the daemon taken over has
		// let go of it, after the takeover: a wrong one fails now.
		// Without --metrics the replacement serves the daemon's, as it
		// keeps the rest of its configuration.
		var adjust func(*config.ServerConfig)
		if *metricsAddr != "" {
			if err := metricsAddressError(*metricsAddr, metrics.CheckAddress(*metricsAddr, *metricsAny)); err != nil {
				return err
			}
			adjust = func(c *config.ServerConfig) { c.Metrics, c.MetricsAnyAddress = *metricsAddr, *metricsAny }
		}
		return server.ReplaceDaemon(*socket, adjust, func(s *server.Server) {
			fmt.Fprintf(os.Stderr, "uvm serve: pid %d took over %s (%d sessions)\n", os.Getpid(), *socket, s.SessionCount())
		})
	}
	cfg, err := sf.config()
	if err != nil {
		return err
	}
	cfg.Guard = !*noGuard
	var ep *metrics.Endpoint
	if *metricsAddr != "" {
		// Bound before the server starts, so that a bad or busy address
		// is an error rather than a daemon without its metrics.
		if ep, err = listenMetrics(*metricsAddr, *metricsAny); err != nil {
			return err
		}
		defer ep.Close()
		// The address as bound (a port 0 chosen): a server that takes
		// over serves the metrics there again.
		cfg.Metrics, cfg.MetricsAnyAddress = ep.Addr(), *metricsAny
	}
	return server.ListenAndServe(cfg, *socket, func(s *server.Server) {
		fmt.Fprintf(os.Stderr, "uvm serve: pid %d listening on %s\n", os.Getpid(), *socket)
		for _, d := range s.Devices() {
			fmt.Fprintf(os.Stderr, "  %v: %s arena, backend %s, NUMA node %d, %d workers\n", d.Device, uvm.FormatSize(d.Capacity), d.Backend, d.Node, d.Workers)
		}
		fmt.Fprintf(os.Stderr, "  prefetch %s, handlers %s, guard %v, restarts %s, thrashing %s\n", cfg.Prefetch, cfg.Handlers, cfg.Guard, config.FormatRestarts(cfg.Restarts), cfg.Thrashing)
		if ep != nil {
			serveMetrics(ep, s)
		}
	})
}

func listenMetrics(addr string, anyAddress bool) (*metrics.Endpoint, error) {
	ep, err := metrics.Listen(addr, anyAddress)
	if err != nil {
		return nil, metricsAddressError(addr, err)
	}
	return ep, nil
}

// metricsAddressError says what to do about an address metrics refused.
func metricsAddressError(addr string, err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, metrics.ErrNotLoopback):
		return fmt.Errorf("--metrics %s: not a loopback address, and the metrics say what programs on this machine do to anyone who connects; add --metrics-any-address if that is meant", addr)
	}
	return fmt.Errorf("--metrics: %w", err)
}

// listenMetricsRetrying is listenMetrics, tried again while the address
// is in use, until wait has passed.
func listenMetricsRetrying(addr string, anyAddress bool, wait time.Duration) (*metrics.Endpoint, error) {
	deadline := time.Now().Add(wait)
	for {
		ep, err := listenMetrics(addr, anyAddress)
		if err == nil || !errors.Is(err, syscall.EADDRINUSE) || time.Now().After(deadline) {
			return ep, err
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func init() {
	// A server that takes over from a daemon serving metrics, or
	// replaces it, serves them where it did. The daemon taken over may
	// still hold the address (a replaced one exits once it has handed
	// over, which is about now).
	server.ServeMetrics = func(s *server.Server, addr string, anyAddress bool) error {
		ep, err := listenMetricsRetrying(addr, anyAddress, 2*time.Second)
		if err != nil {
			return err
		}
		serveMetrics(ep, s)
		return nil
	}
}

func serveMetrics(ep *metrics.Endpoint, s *server.Server) {
	ep.Serve(metrics.Source{Stats: s.Stats, Info: s.Info})
	fmt.Fprintf(os.Stderr, "  metrics on %s\n", ep.URL())
}
