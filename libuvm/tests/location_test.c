/*
 * location_test.c: the location forms of prefetch and advice
 * (uvmMemPrefetchAsync_v2, uvmMemAdvise_v2) to a device, the host, a host
 * NUMA node and the node nearest the caller, the range attributes that
 * report a location's type and id (5 to 8), and the host pages' memory
 * policy that a node sets. Run by integration/libuvm_test.go with a
 * private server, 2 devices of 2 workers and 64 MiB arenas. The machine
 * has NUMA node 0 (and perhaps others): each check of a node reads the
 * kernel's own answer (get_mempolicy, getcpu).
 */
#define _GNU_SOURCE
#include <sched.h>
#include <stdint.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "check.h"

#define MiB (1ul << 20)
#define SIZE (4 * MiB)
#define MPOL_PREFERRED 1
#define MPOL_F_NODE 1
#define MPOL_F_ADDR 2

static int attr(const void *p, size_t n, uvmMemRangeAttribute a)
{
	int v = -12345;
	CHECK_OK(uvmMemRangeGetAttribute(&v, sizeof v, a, p, n));
	return v;
}

/* policy_node says whether the policy at p prefers one node, which. */
static int preferred_node_of(const void *p)
{
	int mode = -1;
	unsigned long mask[16] = {0};
	if (syscall(SYS_get_mempolicy, &mode, mask, sizeof mask * 8, p, MPOL_F_ADDR) != 0)
		return -100;
	if ((mode & 0xff) != MPOL_PREFERRED)
		return -1;
	for (int n = 0; n < (int)(sizeof mask * 8); n++)
		if (mask[n / 64] >> (n % 64) & 1)
			return n;
	return -1;
}

/* node_of is the node the page at p is on (touching it). */
static int node_of(const void *p)
{
	int node = -1;
	if (syscall(SYS_get_mempolicy, &node, NULL, 0, p, MPOL_F_NODE | MPOL_F_ADDR) != 0)
		return -100;
	return node;
}

static void check_location(const char *what, const void *p, size_t n, uvmMemRangeAttribute type_attr, int want_type, int want_id)
{
	int type = attr(p, n, type_attr), id = attr(p, n, (uvmMemRangeAttribute)(type_attr + 1));
	if (type != want_type || id != want_id)
		fprintf(stderr, "%s: location type %d id %d, want type %d id %d\n", what, type, id, want_type, want_id);
	CHECK(type == want_type && id == want_id);
}

static void fill(uint32_t *a, size_t n, uint32_t seed)
{
	for (size_t i = 0; i < n; i++)
		a[i] = seed + (uint32_t)i * 2654435761u;
}

static size_t wrong(const uint32_t *a, size_t n, uint32_t seed)
{
	size_t bad = 0;
	for (size_t i = 0; i < n; i++)
		bad += a[i] != seed + (uint32_t)i * 2654435761u;
	return bad;
}

static void test_prefetch(void)
{
	uint32_t *a;
	const size_t n = SIZE / sizeof *a;
	CHECK_OK(uvmMallocManaged((void **)&a, SIZE, uvmMemAttachGlobal));
	fill(a, n, 7);
	uvmMemLocation dev1 = {uvmMemLocationTypeDevice, 1}, host = {uvmMemLocationTypeHost, 12345},
		       node0 = {uvmMemLocationTypeHostNuma, 0}, current = {uvmMemLocationTypeHostNumaCurrent, 99};

	/* Nothing prefetched yet: no location. */
	check_location("never prefetched", a, SIZE, uvmMemRangeAttributeLastPrefetchLocationType, uvmMemLocationTypeInvalid, uvmInvalidDeviceId);

	CHECK_OK(uvmMemPrefetchAsync_v2(a, SIZE, dev1, 0, NULL));
	CHECK_OK(uvmDeviceSynchronize());
	check_location("to device 1", a, SIZE, uvmMemRangeAttributeLastPrefetchLocationType, uvmMemLocationTypeDevice, 1);
	CHECK(attr(a, SIZE, uvmMemRangeAttributeLastPrefetchLocation) == 1);

	/* To node 0: the pages come back, on node 0, whose preference the
	 * host pages now have. */
	CHECK_OK(uvmMemPrefetchAsync_v2(a, SIZE, node0, 0, NULL));
	CHECK_OK(uvmDeviceSynchronize());
	check_location("to node 0", a, SIZE, uvmMemRangeAttributeLastPrefetchLocationType, uvmMemLocationTypeHostNuma, 0);
	CHECK(attr(a, SIZE, uvmMemRangeAttributeLastPrefetchLocation) == uvmCpuDeviceId);
	CHECK(preferred_node_of(a) == 0 && preferred_node_of((char *)a + SIZE - 1) == 0);
	CHECK(node_of(a) == 0 && node_of((char *)a + SIZE / 2) == 0);
	CHECK(wrong(a, n, 7) == 0);

	/* The host: no node. */
	CHECK_OK(uvmMemPrefetchAsync_v2(a, SIZE, host, 0, NULL));
	CHECK_OK(uvmDeviceSynchronize());
	check_location("to the host", a, SIZE, uvmMemRangeAttributeLastPrefetchLocationType, uvmMemLocationTypeHost, uvmCpuDeviceId);

	/* The node nearest the caller, as the kernel says it. */
	unsigned cpu = 0, mynode = 0;
	CHECK(syscall(SYS_getcpu, &cpu, &mynode, NULL) == 0);
	CHECK_OK(uvmMemPrefetchAsync_v2(a, SIZE, current, 0, NULL));
	CHECK_OK(uvmDeviceSynchronize());
	check_location("to the caller's node", a, SIZE, uvmMemRangeAttributeLastPrefetchLocationType, uvmMemLocationTypeHostNuma, (int)mynode);

	/* Half to node 0, half to the host: the whole range has no one
	 * location; each half has its own. */
	CHECK_OK(uvmMemPrefetchAsync_v2((char *)a + SIZE / 2, SIZE / 2, host, 0, NULL));
	CHECK_OK(uvmMemPrefetchAsync_v2(a, SIZE / 2, node0, 0, NULL));
	CHECK_OK(uvmDeviceSynchronize());
	check_location("halves", a, SIZE, uvmMemRangeAttributeLastPrefetchLocationType, uvmMemLocationTypeInvalid, uvmInvalidDeviceId);
	check_location("first half", a, SIZE / 2, uvmMemRangeAttributeLastPrefetchLocationType, uvmMemLocationTypeHostNuma, 0);
	check_location("second half", (char *)a + SIZE / 2, SIZE / 2, uvmMemRangeAttributeLastPrefetchLocationType, uvmMemLocationTypeHost,
		       uvmCpuDeviceId);
	/* Half to a device: device and host disagree. */
	CHECK_OK(uvmMemPrefetchAsync_v2(a, SIZE / 2, dev1, 0, NULL));
	CHECK_OK(uvmDeviceSynchronize());
	check_location("device and host", a, SIZE, uvmMemRangeAttributeLastPrefetchLocationType, uvmMemLocationTypeInvalid, uvmInvalidDeviceId);

	/* The old form: the host, no node. */
	CHECK_OK(uvmMemPrefetchAsync(a, SIZE, uvmCpuDeviceId, NULL));
	CHECK_OK(uvmDeviceSynchronize());
	check_location("the old form to the CPU", a, SIZE, uvmMemRangeAttributeLastPrefetchLocationType, uvmMemLocationTypeHost, uvmCpuDeviceId);
	CHECK(wrong(a, n, 7) == 0);

	/* In stream order, on a stream. */
	uvmStream_t s;
	CHECK_OK(uvmStreamCreate(&s));
	CHECK_OK(uvmMemPrefetchAsync_v2(a, SIZE, dev1, 0, s));
	CHECK_OK(uvmMemPrefetchAsync_v2(a, SIZE, node0, 0, s));
	CHECK_OK(uvmStreamSynchronize(s));
	check_location("two on a stream", a, SIZE, uvmMemRangeAttributeLastPrefetchLocationType, uvmMemLocationTypeHostNuma, 0);
	CHECK_OK(uvmStreamDestroy(s));

	/* Refused. */
	CHECK_ERR(uvmMemPrefetchAsync_v2(a, SIZE, (uvmMemLocation){uvmMemLocationTypeHostNuma, 4000}, 0, NULL), uvmErrorInvalidValue);
	CHECK(strstr(uvmGetLastErrorMessage(), "node 4000") != NULL);
	CHECK_ERR(uvmMemPrefetchAsync_v2(a, SIZE, (uvmMemLocation){uvmMemLocationTypeDevice, 2}, 0, NULL), uvmErrorInvalidDevice);
	CHECK_ERR(uvmMemPrefetchAsync_v2(a, SIZE, (uvmMemLocation){uvmMemLocationTypeInvalid, 0}, 0, NULL), uvmErrorInvalidValue);
	CHECK_ERR(uvmMemPrefetchAsync_v2(a, SIZE, (uvmMemLocation){(uvmMemLocationType)9, 0}, 0, NULL), uvmErrorInvalidValue);
	CHECK_ERR(uvmMemPrefetchAsync_v2(a, SIZE, host, 1, NULL), uvmErrorInvalidValue);
	int on_stack;
	CHECK_ERR(uvmMemPrefetchAsync_v2(&on_stack, sizeof on_stack, host, 0, NULL), uvmErrorInvalidValue);
	uvmGetLastError();

	/* Memory allocated again at the same address and prefetched to the
	 * host has no node (every record of the host the server keeps comes
	 * with the library's; uvmFree drops a range's, so that they do not
	 * pile up). */
	void *old = a;
	CHECK_OK(uvmFree(a));
	CHECK_OK(uvmMallocManaged((void **)&a, SIZE, uvmMemAttachGlobal));
	CHECK_OK(uvmMemPrefetchAsync(a, SIZE, uvmCpuDeviceId, NULL));
	CHECK_OK(uvmDeviceSynchronize());
	if (old == (void *)a)
		check_location("allocated again", a, SIZE, uvmMemRangeAttributeLastPrefetchLocationType, uvmMemLocationTypeHost, uvmCpuDeviceId);
	CHECK_OK(uvmFree(a));
}

static void test_advise(void)
{
	char *a;
	CHECK_OK(uvmMallocManaged((void **)&a, SIZE, uvmMemAttachGlobal));
	memset(a, 1, SIZE);
	uvmMemLocation dev1 = {uvmMemLocationTypeDevice, 1}, host = {uvmMemLocationTypeHost, 0}, node0 = {uvmMemLocationTypeHostNuma, 0};

	check_location("no preference", a, SIZE, uvmMemRangeAttributePreferredLocationType, uvmMemLocationTypeInvalid, uvmInvalidDeviceId);

	CHECK_OK(uvmMemAdvise_v2(a, SIZE, uvmMemAdviseSetPreferredLocation, node0));
	check_location("prefers node 0", a, SIZE, uvmMemRangeAttributePreferredLocationType, uvmMemLocationTypeHostNuma, 0);
	CHECK(attr(a, SIZE, uvmMemRangeAttributePreferredLocation) == uvmCpuDeviceId);
	CHECK(preferred_node_of(a) == 0);

	CHECK_OK(uvmMemAdvise_v2(a, SIZE / 4, uvmMemAdviseSetPreferredLocation, dev1));
	check_location("a quarter prefers device 1", a, SIZE, uvmMemRangeAttributePreferredLocationType, uvmMemLocationTypeInvalid,
		       uvmInvalidDeviceId);
	check_location("the quarter", a, SIZE / 4, uvmMemRangeAttributePreferredLocationType, uvmMemLocationTypeDevice, 1);
	CHECK(preferred_node_of(a) == -1);             /* the default policy, back */
	CHECK(preferred_node_of(a + SIZE / 2) == 0);   /* the rest keeps it */

	CHECK_OK(uvmMemAdvise_v2(a, SIZE, uvmMemAdviseSetPreferredLocation, host));
	check_location("prefers the host", a, SIZE, uvmMemRangeAttributePreferredLocationType, uvmMemLocationTypeHost, uvmCpuDeviceId);
	CHECK(preferred_node_of(a + SIZE / 2) == -1);

	CHECK_OK(uvmMemAdvise_v2(a, SIZE, uvmMemAdviseSetPreferredLocation, node0));
	CHECK_OK(uvmMemAdvise(a, SIZE, uvmMemAdviseUnsetPreferredLocation, 0));
	check_location("unset", a, SIZE, uvmMemRangeAttributePreferredLocationType, uvmMemLocationTypeInvalid, uvmInvalidDeviceId);
	CHECK(preferred_node_of(a) == -1);

	/* Accessed by device 1, and read-mostly (the location is ignored). */
	CHECK_OK(uvmMemAdvise_v2(a, SIZE, uvmMemAdviseSetAccessedBy, dev1));
	int by[4];
	CHECK_OK(uvmMemRangeGetAttribute(by, sizeof by, uvmMemRangeAttributeAccessedBy, a, SIZE));
	CHECK(by[0] == 1 && by[1] == uvmInvalidDeviceId);
	CHECK_OK(uvmMemAdvise_v2(a, SIZE, uvmMemAdviseSetReadMostly, (uvmMemLocation){(uvmMemLocationType)77, -3}));
	CHECK(attr(a, SIZE, uvmMemRangeAttributeReadMostly) == 1);

	CHECK_ERR(uvmMemAdvise_v2(a, SIZE, uvmMemAdviseSetPreferredLocation, (uvmMemLocation){uvmMemLocationTypeHostNuma, -1}), uvmErrorInvalidValue);
	CHECK_ERR(uvmMemAdvise_v2(a, SIZE, uvmMemAdviseSetAccessedBy, (uvmMemLocation){uvmMemLocationTypeDevice, 7}), uvmErrorInvalidDevice);
	CHECK_ERR(uvmMemAdvise_v2(a, SIZE, (uvmMemoryAdvise)0, host), uvmErrorInvalidValue);
	int v;
	CHECK_ERR(uvmMemRangeGetAttribute(&v, sizeof v, (uvmMemRangeAttribute)9, a, SIZE), uvmErrorInvalidValue);
	CHECK_ERR(uvmMemRangeGetAttribute(&v, 8, uvmMemRangeAttributePreferredLocationType, a, SIZE), uvmErrorInvalidValue);
	uvmGetLastError();

	/* Several at once. */
	int t1 = -1, i1 = -1, t2 = -1, i2 = -1;
	void *data[] = {&t1, &i1, &t2, &i2};
	size_t sizes[] = {4, 4, 4, 4};
	uvmMemRangeAttribute attrs[] = {uvmMemRangeAttributePreferredLocationType, uvmMemRangeAttributePreferredLocationId,
					uvmMemRangeAttributeLastPrefetchLocationType, uvmMemRangeAttributeLastPrefetchLocationId};
	CHECK_OK(uvmMemAdvise_v2(a, SIZE, uvmMemAdviseSetPreferredLocation, dev1));
	CHECK_OK(uvmMemPrefetchAsync_v2(a, SIZE, node0, 0, NULL));
	CHECK_OK(uvmDeviceSynchronize());
	CHECK_OK(uvmMemRangeGetAttributes(data, sizes, attrs, 4, a, SIZE));
	CHECK(t1 == uvmMemLocationTypeDevice && i1 == 1 && t2 == uvmMemLocationTypeHostNuma && i2 == 0);
	CHECK_OK(uvmFree(a));
}

int main(void)
{
	test_prefetch();
	test_advise();
	return check_done("location_test");
}
