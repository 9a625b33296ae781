/* coherence_test: the launch coherence model from C (integration runs it
 * with UVM_COHERENCE=launch as well as without): the CPU's writes reach
 * the next kernel and the kernel's the CPU after a synchronize; memory
 * attached to the host, or to another stream, stays the CPU's while a
 * kernel runs; attachments take effect in stream order;
 * uvmStreamAttachMemAsync, prefetches and advice refuse what CUDA
 * refuses. */
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <unistd.h>

#include "check.h"

#define PAGE 4096

struct add_params {
	unsigned char *p;
	size_t n;
};

/* add_one adds one to every byte of the thread's share. */
static void add_one(unsigned tid, unsigned nthreads, const void *params)
{
	const struct add_params *a = params;
	size_t lo = a->n * tid / nthreads, hi = a->n * (tid + 1) / nthreads;
	for (size_t i = lo; i < hi; i++)
		a->p[i]++;
}

/* wait_flag sets *flag to 1, then waits until the host sets 2. */
static void wait_flag(unsigned tid, unsigned n, const void *params)
{
	(void)tid;
	(void)n;
	_Atomic int *flag = *(_Atomic int *const *)params;
	atomic_store(flag, 1);
	while (atomic_load(flag) != 2)
		usleep(50);
}

static int launch_model(void)
{
	const char *v = getenv("UVM_COHERENCE");
	return v && !strcmp(v, "launch");
}

static void test_writes_cross_launches(void)
{
	const size_t n = 64 * PAGE;
	unsigned char *p, *want = malloc(n);
	CHECK_OK(uvmMallocManaged((void **)&p, n, uvmMemAttachGlobal));
	if (!p || !want)
		return;
	for (size_t i = 0; i < n; i++)
		p[i] = want[i] = (unsigned char)(i * 7);
	struct add_params a = {p, n};
	for (int round = 0; round < 3; round++) {
		CHECK_OK(uvmLaunchKernel(0, NULL, 2, add_one, &a, sizeof a));
		CHECK_OK(uvmDeviceSynchronize());
		for (size_t i = 0; i < n; i++)
			want[i]++;
		CHECK(memcmp(p, want, n) == 0); /* the host reads every page back */
		for (size_t i = 5 * PAGE; i < 6 * PAGE; i += 3) /* and writes one */
			p[i] = want[i] = (unsigned char)(round + i);
	}
	CHECK_OK(uvmFree(p));
	free(want);
}

static void test_attachment(void)
{
	_Atomic int *flag;
	unsigned char *host_only, *single;
	uvmStream_t a, b;
	CHECK_OK(uvmHostAlloc((void **)&flag, sizeof *flag, uvmHostAllocMapped));
	CHECK_OK(uvmMallocManaged((void **)&host_only, 4 * PAGE, uvmMemAttachHost));
	CHECK_OK(uvmMallocManaged((void **)&single, 4 * PAGE, uvmMemAttachGlobal));
	CHECK_OK(uvmStreamCreate(&a));
	CHECK_OK(uvmStreamCreate(&b));
	if (!flag || !host_only || !single)
		return;
	CHECK_OK(uvmStreamAttachMemAsync(a, single, 0, uvmMemAttachSingle));
	memset(host_only, 9, 4 * PAGE);
	memset(single, 5, 4 * PAGE);
	atomic_store(flag, 0);
	CHECK_OK(uvmLaunchKernel(0, b, 1, wait_flag, &flag, sizeof flag));
	while (atomic_load(flag) != 1)
		usleep(50);
	/* A kernel runs on b: both stay the CPU's. */
	int bad = 0;
	for (int i = 0; i < 4 * PAGE; i++)
		bad += host_only[i] != 9 || single[i] != 5;
	CHECK(bad == 0);
	memset(host_only, 10, 4 * PAGE);
	memset(single, 6, 4 * PAGE);
	atomic_store(flag, 2);
	CHECK_OK(uvmStreamSynchronize(b));
	struct add_params p = {single, 4 * PAGE};
	CHECK_OK(uvmLaunchKernel(0, a, 1, add_one, &p, sizeof p));
	CHECK_OK(uvmStreamSynchronize(a));
	bad = 0;
	for (int i = 0; i < 4 * PAGE; i++)
		bad += host_only[i] != 10 || single[i] != 7;
	CHECK(bad == 0);

	/* Misuse. */
	CHECK_ERR(uvmStreamAttachMemAsync(a, single + PAGE, 0, uvmMemAttachSingle), uvmErrorInvalidValue);
	CHECK_ERR(uvmStreamAttachMemAsync(a, single, 5, uvmMemAttachSingle), uvmErrorInvalidValue);
	CHECK_ERR(uvmStreamAttachMemAsync(NULL, single, 0, uvmMemAttachSingle), uvmErrorInvalidValue);
	CHECK_ERR(uvmStreamAttachMemAsync(a, single, 0, 0x10), uvmErrorInvalidValue);
	CHECK_ERR(uvmStreamAttachMemAsync(a, (void *)flag, 0, uvmMemAttachGlobal), uvmErrorInvalidValue);
	CHECK_OK(uvmStreamAttachMemAsync(a, single, 0, uvmMemAttachGlobal));
	CHECK_OK(uvmStreamDestroy(a));
	CHECK_OK(uvmStreamDestroy(b));
	CHECK_OK(uvmFree(host_only));
	CHECK_OK(uvmFree(single));
	CHECK_OK(uvmFreeHost((void *)flag));
}

/* An attachment takes effect in stream order: once the legacy stream
 * has reached an attachment to the host (its synchronize returned),
 * the CPU may touch the memory while a kernel that took it at its
 * launch still runs on a non-blocking stream, or when one that finished
 * on a blocking stream was never synchronized itself. */
static void test_attachment_in_stream_order(void)
{
	_Atomic int *flag;
	unsigned char *x;
	uvmStream_t nb, s1;
	CHECK_OK(uvmHostAlloc((void **)&flag, sizeof *flag, uvmHostAllocMapped));
	CHECK_OK(uvmMallocManaged((void **)&x, 4 * PAGE, uvmMemAttachGlobal));
	CHECK_OK(uvmStreamCreateWithFlags(&nb, uvmStreamNonBlocking));
	CHECK_OK(uvmStreamCreate(&s1));
	if (!flag || !x)
		return;
	memset(x, 1, 4 * PAGE);
	atomic_store(flag, 0);
	CHECK_OK(uvmLaunchKernel(0, nb, 1, wait_flag, &flag, sizeof flag)); /* takes x: global */
	while (atomic_load(flag) != 1)
		usleep(50);
	CHECK_OK(uvmStreamAttachMemAsync(NULL, x, 0, uvmMemAttachHost));
	CHECK_OK(uvmStreamSynchronize(NULL));
	int bad = 0;
	for (int i = 0; i < 4 * PAGE; i++)
		bad += x[i] != 1;
	CHECK(bad == 0);
	memset(x, 2, 4 * PAGE);
	atomic_store(flag, 2);
	CHECK_OK(uvmStreamSynchronize(nb));

	/* A kernel on a blocking stream takes it (attached globally again),
	 * and is never synchronized by itself. */
	CHECK_OK(uvmStreamAttachMemAsync(s1, x, 0, uvmMemAttachGlobal));
	struct add_params p = {x, 4 * PAGE};
	CHECK_OK(uvmLaunchKernel(0, s1, 2, add_one, &p, sizeof p));
	CHECK_OK(uvmStreamAttachMemAsync(NULL, x, 0, uvmMemAttachHost));
	CHECK_OK(uvmStreamSynchronize(NULL));
	bad = 0;
	for (int i = 0; i < 4 * PAGE; i++)
		bad += x[i] != 3;
	CHECK(bad == 0);
	memset(x, 4, 4 * PAGE);
	CHECK_OK(uvmDeviceSynchronize());
	CHECK_OK(uvmStreamDestroy(nb));
	CHECK_OK(uvmStreamDestroy(s1));
	CHECK_OK(uvmFree(x));
	CHECK_OK(uvmFreeHost((void *)flag));
}

/* What CUDA refuses on a device without concurrent managed access:
 * prefetches, and advice that names the device as the preferred
 * location or an accessor. */
static void test_refusals(void)
{
	unsigned char *x;
	CHECK_OK(uvmMallocManaged((void **)&x, 4 * PAGE, uvmMemAttachGlobal));
	if (!x)
		return;
	uvmError_t want = launch_model() ? uvmErrorInvalidDevice : uvmSuccess;
	CHECK_ERR(uvmMemPrefetchAsync(x, 4 * PAGE, 0, NULL), want);
	CHECK_ERR(uvmMemPrefetchAsync(x, 4 * PAGE, uvmCpuDeviceId, NULL), want);
	CHECK_ERR(uvmMemAdvise(x, 4 * PAGE, uvmMemAdviseSetPreferredLocation, 0), want);
	CHECK_ERR(uvmMemAdvise(x, 4 * PAGE, uvmMemAdviseSetAccessedBy, 1), want);
	if (launch_model())
		CHECK(strstr(uvmGetLastErrorMessage(), "concurrentManagedAccess 0") != NULL);
	CHECK_OK(uvmMemAdvise(x, 4 * PAGE, uvmMemAdviseSetPreferredLocation, uvmCpuDeviceId));
	CHECK_OK(uvmMemAdvise(x, 4 * PAGE, uvmMemAdviseSetReadMostly, 0));
	CHECK_OK(uvmDeviceSynchronize());
	CHECK_OK(uvmFree(x));
}

int main(void)
{
	int concurrent = -1;
	CHECK_OK(uvmDeviceGetAttribute(&concurrent, uvmDevAttrConcurrentManagedAccess, 0));
	CHECK(concurrent == (launch_model() ? 0 : 1));
	test_writes_cross_launches();
	test_attachment();
	test_attachment_in_stream_order();
	test_refusals();
	return check_done("coherence_test");
}
