//go:build ignore

// SPDX-License-Identifier: (MIT OR GPL-2.0)
//
// Access counters for softuvm: counts the user page faults of the
// processes the fault server knows (clients and device processes), per
// processor and 64 KiB region, the way the access counters of NVIDIA's
// driver and Grace Hopper count remote accesses, and reports a region to
// the server through a ring buffer when its count reaches the threshold.
//
// Built by bpf2go (gen.go), on the exceptions:page_fault_user tracepoint:
// kprobes and fentry do not work on the kernels this runs on.

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

// A counted region: processor (0 the CPU, 1+d device d) and address >> 16.
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

// Set at load: the count at which a region is reported.
volatile const __u64 threshold = 256;

// Process (thread group) id -> processor code, kept by the server.
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

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 1 << 16);
} crossings SEC(".maps");

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
	if (count == threshold) {
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

char LICENSE[] SEC("license") = "Dual MIT/GPL";
