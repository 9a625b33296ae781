//go:build ignore

// SPDX-License-Identifier: (MIT OR GPL-2.0)
//
// Access counters for softuvm: counts the user page faults of the
// processes the fault server knows (clients and device processes), per
// processor and 64 KiB region, the way the access counters of NVIDIA's
// driver and Grace Hopper count remote accesses, and reports a region to
// the server through a ring buffer when its count reaches the threshold.
//
// It also serves the fault anatomy: for a fault the server samples (its
// userfaultfd handler puts the thread in `sampled`), a second program on
// sched:sched_switch reports through a ring buffer when the faulting
// thread ran again after the server woke it.
//
// Built by bpf2go (gen.go), on the exceptions:page_fault_user and
// sched:sched_switch tracepoints: kprobes and fentry do not work on the
// kernels this runs on.

#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

// The tracepoint's record, as /sys/kernel/tracing/events/exceptions/
// page_fault_user/format gives it.
struct page_fault_user {
	unsigned short common_type;
	unsigned char common_flags;
	unsigned char common_preempt_count;
	int common_pid;
	unsigned long address;
	unsigned long ip;
	unsigned long error_code;
};

// The tracepoint's record, as /sys/kernel/tracing/events/sched/
// sched_switch/format gives it; next_pid is the thread switched in.
struct sched_switch {
	unsigned short common_type;
	unsigned char common_flags;
	unsigned char common_preempt_count;
	int common_pid;
	char prev_comm[16];
	int prev_pid;
	int prev_prio;
	long prev_state;
	char next_comm[16];
	int next_pid;
	int next_prio;
};

// A counted region: the processor's code (see processes) and address >> 16.
struct region_key {
	__u32 processor;
	__u32 pad;
	__u64 region;
};

// What the ring buffer carries when a region's count reaches threshold.
struct crossing {
	__u32 processor;
	__u32 pid;
	__u64 region;
	__u64 count;
	__u64 at_ns;
};

// Emits struct crossing's type, which bpf2go reads to make its Go twin.
const struct crossing *unused_crossing __attribute__((unused));

// Where a thread's last fault entered the kernel, for the fault anatomy.
struct fault_entry {
	__u64 at_ns;
	__u64 address;
};

// What the resumes ring buffer carries: a sampled thread ran again.
struct resume {
	__u32 tid;
	__u32 pad;
	__u64 entry_ns;   // its fault entered the kernel (the sampled value)
	__u64 resumed_ns; // it was switched in
};

// Emits struct resume's type, which bpf2go reads to make its Go twin.
const struct resume *unused_resume __attribute__((unused));

// Set at load: the count at which a region is reported.
volatile const __u64 threshold = 256;

// Process (thread group) id -> a code the server chooses for the
// processor the process acts as; the server gives each view (client or
// device process) its own code, so counts of different clients never mix.
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, __u32);
	__type(value, __u32);
} processes SEC(".maps");

// Process id -> user faults counted since the server began tracking it.
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, __u32);
	__type(value, __u64);
} process_faults SEC(".maps");

// (processor, region) -> faults, the least recently used dropped first.
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 1 << 16);
	__type(key, struct region_key);
	__type(value, __u64);
} regions SEC(".maps");

// Thread id -> its last fault's entry.
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 1 << 14);
	__type(key, __u32);
	__type(value, struct fault_entry);
} fault_entries SEC(".maps");

// Room for 26,000 reports: a kernel streaming over 256 MiB brings 4,096
// regions to the threshold in the same round.
struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 1 << 20);
} crossings SEC(".maps");

// Thread id -> its sampled fault's entry (ns), put by the server while it
// serves the fault and taken out when the thread is next switched in. LRU:
// a thread killed inside its fault never runs again, and its entry must
// not hold a slot for good.
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 4096);
	__type(key, __u32);
	__type(value, __u64);
} sampled SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 1 << 16);
} resumes SEC(".maps");

SEC("tracepoint/exceptions/page_fault_user")
int count_fault(struct page_fault_user *ctx)
{
	__u64 id = bpf_get_current_pid_tgid();
	__u32 tgid = id >> 32, tid = (__u32)id;
	__u32 *processor = bpf_map_lookup_elem(&processes, &tgid);
	if (!processor)
		return 0;
	__u64 now = bpf_ktime_get_ns();
	__u64 *faults = bpf_map_lookup_elem(&process_faults, &tgid);
	if (faults)
		__sync_fetch_and_add(faults, 1);
	struct fault_entry entry = {.at_ns = now, .address = ctx->address};
	bpf_map_update_elem(&fault_entries, &tid, &entry, BPF_ANY);

	struct region_key key = {.processor = *processor, .region = ctx->address >> 16};
	__u64 count = 1;
	__u64 *c = bpf_map_lookup_elem(&regions, &key);
	if (c)
		count = __sync_fetch_and_add(c, 1) + 1;
	else if (bpf_map_update_elem(&regions, &key, &count, BPF_NOEXIST) != 0 && (c = bpf_map_lookup_elem(&regions, &key)))
		count = __sync_fetch_and_add(c, 1) + 1; // another CPU made it first
	// Reported at every multiple of the threshold: a report the ring
	// buffer had no room for, or one the server could not act on, comes
	// again after another threshold's worth of accesses.
	if (count % threshold == 0) {
		struct crossing *x = bpf_ringbuf_reserve(&crossings, sizeof *x, 0);
		if (x) {
			x->processor = key.processor;
			x->pid = tgid;
			x->region = key.region;
			x->count = count;
			x->at_ns = now;
			bpf_ringbuf_submit(x, 0);
		}
	}
	return 0;
}

// Runs on every context switch of the machine, so it does the least it
// can: one lookup in a map that is nearly always empty. The idle task (0)
// is never sampled.
SEC("tracepoint/sched/sched_switch")
int note_resume(struct sched_switch *ctx)
{
	__u32 tid = ctx->next_pid;
	if (!tid)
		return 0;
	__u64 *entry = bpf_map_lookup_elem(&sampled, &tid);
	if (!entry)
		return 0;
	struct resume *r = bpf_ringbuf_reserve(&resumes, sizeof *r, 0);
	if (r) {
		r->tid = tid;
		r->pad = 0;
		r->entry_ns = *entry;
		r->resumed_ns = bpf_ktime_get_ns();
		bpf_ringbuf_submit(r, 0);
	}
	bpf_map_delete_elem(&sampled, &tid);
	return 0;
}

char LICENSE[] SEC("license") = "Dual MIT/GPL";
