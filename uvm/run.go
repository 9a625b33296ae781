package uvm

import "os"

// What `uvm run` needs of a server it runs in its own process: a socket
// of its own for the program it starts, and the server's counters
// without a connection.

// Listen serves clients and monitors on a Unix socket at path (created
// 0600 in a 0700 directory, as `uvm serve`'s) on a goroutine of its own,
// until the server is closed; the socket file is then removed.
func (s *Server) Listen(path string) error {
	l, err := listenUnix(path)
	if err != nil {
		return err
	}
	go func() {
		s.Serve(l)
		os.Remove(path)
	}()
	return nil
}

// Stats returns the server's counters (the server scope, as a monitor's
// ServerStats): every session's, the ended ones included. It first
// waits for the faults being served now.
func (s *Server) Stats() Stats {
	s.quiesce()
	return s.stats.snapshot()
}
