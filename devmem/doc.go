// Package devmem is softuvm's memory layer: the files pages live in, the
// address-space tricks that make them appear at the right virtual
// addresses, and the per-device arenas that bound how much of them a
// device may hold.
//
// # Location files
//
// Every copy of a managed page lives in a location file (File): one
// memfd for the host copy in each client process, and one file per
// (client, device) for device memory. A page's file offset equals its
// virtual address, which is why every location file is FileSize bytes
// and sparse: the fault server never translates addresses, it moves the
// page at offset o of one file to offset o of another (CopyFrom, which
// stays inside the kernel with copy_file_range) and punches the old copy
// out (Punch), which also zaps every page-table entry that mapped it in
// any process. A client sees the host copy through MapFixed windows
// placed, at address == offset, inside a ReserveAddressSpace reservation.
//
// Where the process may make a tmpfs (root), CreateLargeFolioFile makes
// location files whose whole, aligned 2 MiB writes take one 2 MiB folio;
// its File methods keep every smaller write, allocation and punch in
// 4 KiB folios, so that a page present in a file is still one that was
// put there (large.go says how and why).
//
// # Arenas
//
// A device's memory is an Arena: a capacity shared by all of that
// device's files, with Reserve and Release accounting what is resident.
// Reserve fails with ErrArenaFull instead of overcommitting, which is
// what tells the fault server to evict. On the NUMA backend each device
// file is bound to one node at creation (Arena.NewFile), so device
// memory is physically apart the way a real device's would be; the
// binding lives in the file's inode and so follows the pages into every
// process and every allocation path.
//
// An ArenaSpec is plain data; only NewArena looks at the machine (node
// list, a probe of mbind), so specs can be built, printed and compared in
// configs and tests without side effects.
//
// # Topology
//
// Nodes, OnlineCPUs, PinCurrentThread and CurrentCPU describe and use
// the machine's NUMA layout; sysfs and procfs files are read by small
// parsers tested on fixtures, so the machine-dependent paths are
// exercised even where the test machine has one node.
//
// All system calls go through internal/memsys; errors keep the errno
// (test them with errors.Is) and say what was attempted on which file
// and range.
package devmem
