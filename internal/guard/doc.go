// Package guard is the guard: a small process the server starts beside
// itself, and the reason no managed memory depends on one server process
// staying alive.
// From the moment each exists it holds a duplicate of:
//
//   - every listening socket (a daemon's, a private server's monitor
//     socket), so that clients connecting while no server runs wait in
//     the backlog instead of failing;
//   - every client's control socket (the server's end) and every device
//     process's server connection, so that no peer ever sees the server
//     go away;
//   - every userfaultfd (the client's, each device process's), so that
//     the kernel never unregisters a range and lets holes fill with zeros;
//   - every location file (host and device files) and the staging file,
//     where migrations in flight keep the pages they carry
//     (internal/block/staging.go);
//   - each session's Journal: its ranges and advice (journal.go).
//
// When the server dies (killed, crashed, or retiring for a replacement),
// the guard starts a new one and hands it all of this
// (internal/server/adopt.go): the new server rebuilds residency from the
// files, wakes every thread left in a fault, and tells each client that its
// pending request may have been lost, so that it sends it again. Programs
// see a pause.
//
// When no server can take over (restarts are off, or new servers keep
// failing), the guard serves the faults itself, with poison: a thread
// touching a page that is not on the host gets SIGBUS, and a message on
// its standard error says why; pages on the host stay readable. Every
// peer's connection is hung up, so calls fail with ErrServerGone.
//
// If the guard dies, the server starts a new one and sends it everything
// again. Only the death of both at once loses what was not on the host.
//
// What is here: the guard process itself (Run), the State it keeps of
// every session, the messages the server sends it (the Op constants and
// their builders, one format in both directions, so that a guard hands a
// new server what the old one sent it), and the Journal of each
// session's ranges and advice. docs/architecture.md ("When a process
// dies: the guard and the takeover") describes the takeover as a whole.
//
// Import direction: guard sits above internal/device and below
// internal/server in the layers internal/lint checks (core < policy <
// workingset < block < lab < config < wire < engine < device < guard <
// server). It imports internal/core, internal/config, internal/wire,
// internal/device and uffd, and nothing of the server: the server
// imports it to start and feed its guard and to take a handover from
// one, and a guard starts a server only as a program (re-executing the
// binary, wire.Reexec), never as a package.
package guard
