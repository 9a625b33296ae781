/*
 * location.c: memory locations (uvmMemLocation) — the _v2 forms of
 * prefetch and advice, which name a device, the host, a host NUMA node or
 * the node nearest the calling thread, and the range attributes that
 * report a location's type and id.
 *
 * The fault server knows processors, and the host is one of them. Where
 * a location is a host NUMA node, the library does what concerns the
 * node itself, through the host file's pages mapped in this process:
 *
 *  - it gives them the memory policy that prefers the node
 *    (mbind(MPOL_PREFERRED); the host file is shared memory, so the
 *    policy is the file's, and pages the server brings to the host later
 *    are allocated there too), and, for a prefetch, moves the pages
 *    already on the host there (MPOL_MF_MOVE) before the server brings
 *    the rest; a preferred location elsewhere, or none, puts the default
 *    policy back where a node was preferred (a prefetch elsewhere leaves
 *    the policy as it is);
 *  - it remembers which ranges were last prefetched to, or advised to
 *    prefer, which node (two maps of runs), so that the range attributes
 *    can say cudaMemLocationTypeHostNuma and the node where every page of
 *    a range agrees, as CUDA's do.
 *
 * It also holds what both forms share (the page range of a call, the
 * prefetch and advice requests), so that memory.c's first forms call
 * down into it and it never calls memory.c.
 *
 * Lock: maps_mu guards both maps (a leaf).
 */
#include "internal.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

/* The memory policy modes and flags of <linux/mempolicy.h>, which glibc
 * does not install (libnuma's numaif.h has them). */
#define MPOL_DEFAULT_ 0
#define MPOL_PREFERRED_ 1
#define MPOL_MF_MOVE_ (1 << 1)

/* A run of bytes [start, end) that a node was recorded for. */
struct node_run {
	uint64_t start, end;
	int node;
};

struct node_map {
	struct node_run *runs; /* sorted by start, disjoint */
	size_t n, cap;
};

static pthread_mutex_t maps_mu = PTHREAD_MUTEX_INITIALIZER;
static struct node_map preferred_nodes, prefetched_nodes;

/* map_set records node for [start, end), or forgets it there (node -1).
 * maps_mu is held. False without memory (the map is unchanged). */
static bool map_set(struct node_map *m, uint64_t start, uint64_t end, int node)
{
	size_t need = m->n + 2;
	struct node_run *out = uvm__sys_malloc((need > 4 ? need : 4) * sizeof *out);
	if (!out)
		return false;
	size_t k = 0;
	bool placed = node < 0;
	for (size_t i = 0; i < m->n; i++) {
		struct node_run r = m->runs[i];
		if (!placed && r.start >= start) {
			out[k++] = (struct node_run){start, end, node};
			placed = true;
		}
		if (r.end <= start || r.start >= end) {
			out[k++] = r;
			continue;
		}
		if (r.start < start)
			out[k++] = (struct node_run){r.start, start, r.node};
		if (r.end > end) {
			if (!placed) {
				out[k++] = (struct node_run){start, end, node};
				placed = true;
			}
			out[k++] = (struct node_run){end, r.end, r.node};
		}
	}
	if (!placed)
		out[k++] = (struct node_run){start, end, node};
	uvm__sys_free(m->runs);
	m->runs = out;
	m->n = k;
	m->cap = need;
	return true;
}

/* map_query is the node recorded for every byte of [start, end): a node,
 * -1 if none is, -2 if they differ or only some bytes have one. maps_mu
 * is held. */
static int map_query(const struct node_map *m, uint64_t start, uint64_t end)
{
	uint64_t covered = 0;
	int node = -1;
	for (size_t i = 0; i < m->n; i++) {
		const struct node_run *r = &m->runs[i];
		if (r->end <= start || r->start >= end)
			continue;
		if (node >= 0 && r->node != node)
			return -2;
		node = r->node;
		covered += (r->end < end ? r->end : end) - (r->start > start ? r->start : start);
	}
	if (covered == 0)
		return -1;
	return covered == end - start ? node : -2;
}

static void record(struct node_map *m, uint64_t start, uint64_t length, int node)
{
	pthread_mutex_lock(&maps_mu);
	/* Without memory the map keeps an older node for the range: the
	 * attributes would name a node the range has left, so say so. */
	if (!map_set(m, start, start + length, node))
		fprintf(stderr, "softuvm: no memory to record the NUMA node of %#lx+%lu; its range attributes may name an older one\n",
			(unsigned long)start, (unsigned long)length);
	pthread_mutex_unlock(&maps_mu);
}

void uvm__locations_prefetched(uint64_t start, uint64_t length, int node) { record(&prefetched_nodes, start, length, node); }

void uvm__locations_preferred(uint64_t start, uint64_t length, int node) { record(&preferred_nodes, start, length, node); }

void uvm__locations_forget(uint64_t start, uint64_t length)
{
	uvm__locations_prefetched(start, length, -1);
	uvm__locations_preferred(start, length, -1);
}

void uvm__location_of(bool prefetched, int processor, uint64_t start, uint64_t length, int *type, int *id)
{
	if (processor >= 0) {
		*type = uvmMemLocationTypeDevice;
		*id = processor;
		return;
	}
	if (processor != uvmCpuDeviceId) {
		*type = uvmMemLocationTypeInvalid;
		*id = uvmInvalidDeviceId;
		return;
	}
	pthread_mutex_lock(&maps_mu);
	int node = map_query(prefetched ? &prefetched_nodes : &preferred_nodes, start, start + length);
	pthread_mutex_unlock(&maps_mu);
	if (node >= 0) {
		*type = uvmMemLocationTypeHostNuma;
		*id = node;
	} else if (node == -1) {
		*type = uvmMemLocationTypeHost;
		*id = uvmCpuDeviceId;
	} else {
		*type = uvmMemLocationTypeInvalid; /* some pages on a node, others not, or on two */
		*id = uvmInvalidDeviceId;
	}
}

/* ---- locations ---- */

/* resolve turns a location into the processor the server knows and the
 * host node (-1: none) the library handles. */
static uvmError_t resolve(struct uvm_session *s, const char *what, uvmMemLocation loc, int *processor, int *node)
{
	switch (loc.type) {
	case uvmMemLocationTypeDevice:
		if (loc.id < 0 || loc.id >= s->ndevices)
			return uvm__fail(uvmErrorInvalidDevice, "%s device %d: %s", what, loc.id,
					 s->ndevices ? "want a device from 0 to the device count less 1" : "there are no devices");
		*processor = loc.id;
		*node = -1;
		return uvmSuccess;
	case uvmMemLocationTypeHost:
		*processor = uvmCpuDeviceId;
		*node = -1;
		return uvmSuccess;
	case uvmMemLocationTypeHostNuma: {
		char path[64];
		snprintf(path, sizeof path, "/sys/devices/system/node/node%d", loc.id);
		if (loc.id < 0 || access(path, F_OK) != 0)
			return uvm__fail(uvmErrorInvalidValue, "%s host NUMA node %d: no such node (/sys/devices/system/node lists them)", what, loc.id);
		*processor = uvmCpuDeviceId;
		*node = loc.id;
		return uvmSuccess;
	}
	case uvmMemLocationTypeHostNumaCurrent: {
		unsigned cpu = 0, n = 0;
		if (syscall(SYS_getcpu, &cpu, &n, NULL) != 0)
			return uvm__fail(uvmErrorUnknown, "%s the host NUMA node of the calling thread: getcpu: %s", what, strerror(errno));
		*processor = uvmCpuDeviceId;
		*node = (int)n;
		return uvmSuccess;
	}
	default:
		return uvm__fail(uvmErrorInvalidValue,
				 "%s location type %d: want uvmMemLocationTypeDevice (1), Host (2), HostNuma (3) or HostNumaCurrent (4)", what,
				 (int)loc.type);
	}
}

/* place sets the host policy of [start, start+length) for node (-1: the
 * default), moving the pages already there if move. */
static uvmError_t place(const char *what, uint64_t start, uint64_t length, int node, bool move)
{
	unsigned long mask[16] = {0};
	long r;
	if (node < 0)
		r = syscall(SYS_mbind, start, length, MPOL_DEFAULT_, NULL, 0, 0);
	else {
		if ((unsigned)node >= sizeof mask * 8)
			return uvm__fail(uvmErrorInvalidValue, "%s host NUMA node %d: past the %zu nodes the library handles", what, node, sizeof mask * 8);
		mask[node / (8 * sizeof mask[0])] |= 1ul << (node % (8 * sizeof mask[0]));
		r = syscall(SYS_mbind, start, length, MPOL_PREFERRED_, mask, sizeof mask * 8 + 1, move ? MPOL_MF_MOVE_ : 0);
	}
	/* EIO: some page could not move (another process maps it too); it
	 * stays where it is, which a preference allows. */
	if (r != 0 && errno != EIO)
		return uvm__fail(uvmErrorUnknown, "%s %#lx+%lu on host NUMA node %d: mbind: %s", what, (unsigned long)start, (unsigned long)length, node,
				 strerror(errno));
	return uvmSuccess;
}

/* The ranges and requests the first forms (memory.c) and the _v2 forms
 * share. */

uvmError_t uvm__page_range(const char *what, const void *ptr, size_t n, struct uvm_alloc *a, uint64_t *start, uint64_t *length)
{
	uintptr_t p = (uintptr_t)ptr;
	if (!ptr)
		return uvm__fail(uvmErrorInvalidValue, "%s: the pointer is NULL", what);
	if (n == 0)
		return uvm__fail(uvmErrorInvalidValue, "%s %p: count 0, want at least 1 byte", what, ptr);
	/* Managed variables (managed.c) lie below the window. */
	if (!uvm__alloc_lookup(p, a))
		return uvm__fail(uvmErrorInvalidValue, "%s %p: not managed memory of this process", what, ptr);
	if (a->forked)
		return uvm__fail(uvmErrorInvalidValue, "%s %p: a copy this process got from fork, now ordinary memory", what, ptr);
	if (n > a->addr + a->length - p)
		return uvm__fail(uvmErrorInvalidValue, "%s %p+%zu runs past the end of the allocation %p+%zu", what, ptr, n, (void *)a->addr, a->size);
	*start = p & ~(UVM_PAGE_SIZE - 1);
	*length = ((p + n + UVM_PAGE_SIZE - 1) & ~(UVM_PAGE_SIZE - 1)) - *start;
	return uvmSuccess;
}

uvmError_t uvm__managed_range(const char *what, const void *ptr, size_t n, uint64_t *start, uint64_t *length)
{
	struct uvm_alloc a;
	uvmError_t err = uvm__page_range(what, ptr, n, &a, start, length);
	if (err == uvmSuccess && a.kind != UVM_KIND_MANAGED)
		err = uvm__fail(uvmErrorInvalidValue, "%s %p: it applies to managed memory, and this is %s", what, ptr,
				a.kind == UVM_KIND_DEVICE ? "device memory" : "pinned host memory");
	return err;
}

uvmError_t uvm__refuse_prefetch(const char *what, int processor)
{
	if (!uvm__launch_model())
		return uvmSuccess;
	char where[32];
	if (processor >= 0)
		snprintf(where, sizeof where, "device %d", processor);
	else
		snprintf(where, sizeof where, "the host");
	return uvm__fail(uvmErrorInvalidDevice,
			 "%s to %s: under the launch coherence model (UVM_COHERENCE=launch) devices have concurrentManagedAccess 0, and CUDA "
			 "refuses a prefetch on such a device; a launch hands a kernel its memory",
			 what, where);
}

uvmError_t uvm__refuse_advice(const char *what, uvmMemoryAdvise advice, int device)
{
	if (device < 0 || (advice != uvmMemAdviseSetPreferredLocation && advice != uvmMemAdviseSetAccessedBy) || !uvm__launch_model())
		return uvmSuccess;
	return uvm__fail(uvmErrorInvalidDevice,
			 "%s %s device %d: under the launch coherence model (UVM_COHERENCE=launch) devices have concurrentManagedAccess 0, and "
			 "CUDA refuses this advice for such a device",
			 what, advice == uvmMemAdviseSetPreferredLocation ? "uvmMemAdviseSetPreferredLocation on" : "uvmMemAdviseSetAccessedBy by", device);
}

uvmError_t uvm__prefetch_now(uint64_t start, uint64_t length, int dst, const char *what)
{
	uvmError_t err;
	struct uvm_session *s = uvm__session(&err);
	if (!s)
		return err;
	uint8_t buf[64], reply[64];
	struct uvm_msg m = {.buf = buf, .cap = sizeof buf};
	uvm__encode_prefetch(&m, 0, start, length, dst);
	struct uvm_reader r;
	return uvm__request(s, &m, NULL, 0, reply, sizeof reply, &r, NULL, 0, NULL, what);
}

uvmError_t uvm__advise_now(uint64_t start, uint64_t length, uvmMemoryAdvise advice, int device, const char *what)
{
	uvmError_t err;
	struct uvm_session *s = uvm__session(&err);
	if (!s)
		return err;
	uint8_t buf[64], reply[64];
	struct uvm_msg m = {.buf = buf, .cap = sizeof buf};
	uvm__encode_advise(&m, 0, start, length, (uint8_t)advice, device);
	struct uvm_reader r;
	return uvm__request(s, &m, NULL, 0, reply, sizeof reply, &r, NULL, 0, NULL, what);
}

struct prefetch_v2 {
	uint64_t start, length;
	int processor, node;
};

static uvmError_t run_prefetch_v2(void *arg)
{
	const struct prefetch_v2 *a = arg;
	uvmError_t err;
	/* To a host node: the node first, so that the pages the server
	 * brings back are allocated there. */
	if (a->node >= 0 && (err = place("uvmMemPrefetchAsync_v2 of", a->start, a->length, a->node, true)))
		return err;
	if ((err = uvm__prefetch_now(a->start, a->length, a->processor, "uvmMemPrefetchAsync_v2")))
		return err;
	uvm__locations_prefetched(a->start, a->length, a->node);
	return uvmSuccess;
}

uvmError_t uvmMemPrefetchAsync_v2(const void *devPtr, size_t count, uvmMemLocation location, unsigned int flags, uvmStream_t stream)
{
	if (uvm__device_process >= 0)
		return uvm__refuse_in_device("uvmMemPrefetchAsync_v2");
	if (flags)
		return uvm__fail(uvmErrorInvalidValue, "uvmMemPrefetchAsync_v2: flags %#x: want 0", flags);
	uvmError_t err;
	struct uvm_session *s = uvm__session(&err);
	if (!s)
		return err;
	struct prefetch_v2 a;
	if ((err = resolve(s, "uvmMemPrefetchAsync_v2 to", location, &a.processor, &a.node)) ||
	    (err = uvm__managed_range("uvmMemPrefetchAsync_v2", devPtr, count, &a.start, &a.length)) ||
	    (err = uvm__refuse_prefetch("uvmMemPrefetchAsync_v2", a.processor)))
		return err;
	return uvm__stream_enqueue_host(stream, "uvmMemPrefetchAsync_v2", run_prefetch_v2, &a, sizeof a);
}

uvmError_t uvmMemAdvise_v2(const void *devPtr, size_t count, uvmMemoryAdvise advice, uvmMemLocation location)
{
	if (uvm__device_process >= 0)
		return uvm__refuse_in_device("uvmMemAdvise_v2");
	if (advice < uvmMemAdviseSetReadMostly || advice > uvmMemAdviseUnsetAccessedBy)
		return uvm__fail(uvmErrorInvalidValue, "uvmMemAdvise_v2: advice %d: want one of uvmMemAdviseSetReadMostly (1) to uvmMemAdviseUnsetAccessedBy (6)",
				 (int)advice);
	uvmError_t err;
	struct uvm_session *s = uvm__session(&err);
	if (!s)
		return err;
	int processor = uvmCpuDeviceId, node = -1;
	bool uses_location = advice != uvmMemAdviseSetReadMostly && advice != uvmMemAdviseUnsetReadMostly;
	if (uses_location && ((err = resolve(s, "uvmMemAdvise_v2 for", location, &processor, &node)) ||
			      (err = uvm__refuse_advice("uvmMemAdvise_v2", advice, processor))))
		return err;
	uint64_t start, length;
	if ((err = uvm__managed_range("uvmMemAdvise_v2", devPtr, count, &start, &length)))
		return err;
	if ((err = uvm__advise_now(start, length, advice, processor, "uvmMemAdvise_v2")))
		return err;
	return uvm__locations_advised(start, length, advice, node, "uvmMemAdvise_v2 of");
}

uvmError_t uvm__locations_advised(uint64_t start, uint64_t length, uvmMemoryAdvise advice, int node, const char *what)
{
	if (advice != uvmMemAdviseSetPreferredLocation && advice != uvmMemAdviseUnsetPreferredLocation)
		return uvmSuccess;
	pthread_mutex_lock(&maps_mu);
	int had = map_query(&preferred_nodes, start, start + length);
	pthread_mutex_unlock(&maps_mu);
	/* A preferred host node steers the pages that come to the host,
	 * without moving any now, as CUDA's preference does; a preference
	 * elsewhere, or none, puts back the default policy where a node was
	 * preferred. */
	uvmError_t err = uvmSuccess;
	if (node >= 0 || had != -1)
		err = place(what, start, length, node, false);
	if (!err)
		uvm__locations_preferred(start, length, node);
	return err;
}
