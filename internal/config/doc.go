// Package config is what configures a fault server and what a server
// says about itself.
//
// ServerConfig is plain data: devices and their arenas, the prefetch,
// eviction, thrashing and access policies (as package policy's specs and
// names), handler placement, the host budget, device workers, copy
// threads, access counting and restarts. DefaultServerConfig is the
// configuration without flags or environment; ServerConfigFromEnv applies
// the UVM_* environment variables (EnvDevices, EnvArenaSize,
// EnvPrefetch, EnvEviction, EnvThrashing, EnvAccessPolicy, EnvRestarts,
// ...), which a private server inherits from its client and the `uvm`
// command's flags override. Validate names the first bad value. A
// private server receives its configuration as JSON (ServerConfigEnv).
// Resolved writes out what empty fields mean to the server.
//
// Settings is the one table of every UVM_* variable, with its default as
// printed: `uvm help` prints it, the flags take their defaults from it,
// and tests hold docs/usage.md and the code's behaviour to it.
//
// Info, with SessionInfo, ArenaInfo, RestartInfo and ProcessFaults, is
// what `uvm info` and `uvm stat` show of a running server, and
// CopyCalibration the copy engine's record of this machine.
//
// It also fixes where things are: DefaultSocketPath (UVM_SOCKET, else
// the runtime directory's uvm.sock), RuntimeDir, the monitor sockets of
// private servers (PrivateServerSocketPath), and the managed address
// window that clients and device processes reserve
// (ManagedWindowStart). docs/usage.md lists every variable and flag.
package config
