// Package wire is the control protocol between softuvm's processes and
// its codecs: clients and monitors to the fault server, device processes
// to the server, the server to device processes, clients to device
// processes (launches, synchronizations, streams), and a new daemon to
// the one it replaces.
//
// Each message is one SOCK_SEQPACKET datagram: a 16-byte header (magic
// "SUVM", version, type, sequence, status), then a payload of
// little-endian fixed-size fields and length-prefixed strings. It is
// binary and fixed-layout so that the C library (libuvm/src/wire.c)
// speaks it without a parser. Faults never travel here: they reach the
// server through the userfaultfds. Every decoder refuses what does not
// fit, naming the problem, and a message that decodes encodes back to
// the same bytes (FuzzParseRequest, FuzzParseReply).
//
// Client and Monitor are connections that carry one request at a time;
// a request sent again after a server restart is marked RequestRetried.
// DirectConn is a socket used with blocking system calls outside the Go
// runtime's network poller, for the launch path, where each hand-off
// between threads costs a cross-CPU wake-up. SocketPair and Reexec start
// the program's binary in a role (private server, guard, device).
package wire
