// Package bpf holds softuvm's eBPF programs and their loader.
//
// counters.c counts, on the exceptions:page_fault_user tracepoint, the
// user page faults of the processes the fault server tracks (clients and
// device processes), per processor and per 64 KiB region, and reports a
// region through a ring buffer when its count reaches a threshold; it
// also keeps where each thread's last fault entered the kernel. For the
// fault anatomy (Counters.EnableAnatomy, off by default), a second
// program on sched:sched_switch reports when a thread whose fault the
// server sampled (Counters.Sample) is next switched in. Counters loads
// them; the generated counters_x86_bpfel.{go,o} are committed, so
// that building needs no clang (`make generate` rebuilds them).
//
// Loading needs CAP_BPF and CAP_PERFMON (root here). Nothing is pinned:
// the maps and the link go away with the last descriptor, when Close is
// called or the process exits.
package bpf
