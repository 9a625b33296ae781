// Package procinfo reads what the kernel tells of other processes and of
// the machine, for the fault server: a process's minor faults and the
// environment it started with, how many more mappings it may make
// (vm.max_map_count less those it has), the CPU each of its threads last
// ran on (ThreadCPUs, which keeps the threads' stat files open), and the
// kernel's release. Each reads /proc or asks uname at the call; nothing
// is cached but ThreadCPUs' open files. It imports nothing of the module.
package procinfo
