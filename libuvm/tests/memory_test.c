/*
 * memory_test.c: uvm.h's memory functions, with their error codes for
 * bad input. Run by integration/libuvm_test.go with a private server and
 * two devices.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"

#define MiB (1u << 20)

static int local_variable_target;

static void test_errors(void)
{
	CHECK(strcmp(uvmGetErrorName(uvmErrorInvalidValue), "uvmErrorInvalidValue") == 0);
	CHECK(strcmp(uvmGetErrorString(uvmSuccess), "no error") == 0);
	CHECK(strcmp(uvmGetErrorString((uvmError_t)12345), "unrecognized error code") == 0);
	void *p;
	CHECK_ERR(uvmMallocManaged(&p, 0, uvmMemAttachGlobal), uvmErrorInvalidValue);
	CHECK(uvmPeekAtLastError() == uvmErrorInvalidValue);
	CHECK(uvmGetLastError() == uvmErrorInvalidValue);
	CHECK(uvmGetLastError() == uvmSuccess); /* reset by the read */
	CHECK(strstr(uvmGetLastErrorMessage(), "0 bytes") != NULL);
}

static void test_managed(void)
{
	void *p = (void *)1;
	CHECK_ERR(uvmMallocManaged(NULL, 4096, uvmMemAttachGlobal), uvmErrorInvalidValue);
	CHECK_ERR(uvmMallocManaged(&p, 0, uvmMemAttachGlobal), uvmErrorInvalidValue);
	CHECK(p == NULL);
	CHECK_ERR(uvmMallocManaged(&p, 4096, 0), uvmErrorInvalidValue);
	CHECK_ERR(uvmMallocManaged(&p, 4096, 0x10), uvmErrorInvalidValue);
	CHECK_ERR(uvmMallocManaged(&p, (size_t)1 << 62, uvmMemAttachGlobal), uvmErrorInvalidValue);

	size_t n = 8 * MiB + 123;
	unsigned char *b;
	CHECK_OK(uvmMallocManaged((void **)&b, n, uvmMemAttachGlobal));
	if (!b)
		return;
	CHECK(((uintptr_t)b & (4096 - 1)) == 0);
	CHECK(b[0] == 0 && b[n - 1] == 0); /* fresh memory reads as zeros */
	for (size_t i = 0; i < n; i++)
		b[i] = (unsigned char)(i * 7);
	/* To each device and back: the data follows. A prefetch is queued on
	 * the stream: a synchronize waits for it. */
	CHECK_OK(uvmMemPrefetchAsync(b, n, 0, NULL));
	CHECK_OK(uvmDeviceSynchronize());
	int loc = -5;
	CHECK_OK(uvmMemRangeGetAttribute(&loc, 4, uvmMemRangeAttributeLastPrefetchLocation, b, n));
	CHECK(loc == 0);
	CHECK_OK(uvmMemPrefetchAsync(b, n, 1, NULL));
	CHECK_OK(uvmMemPrefetchAsync(b + 4096, 4096, uvmCpuDeviceId, NULL));
	CHECK_OK(uvmDeviceSynchronize());
	size_t bad = 0;
	for (size_t i = 0; i < n; i++)
		bad += b[i] != (unsigned char)(i * 7);
	CHECK(bad == 0);

	/* Prefetch misuse. */
	CHECK_ERR(uvmMemPrefetchAsync(b, n, 2, NULL), uvmErrorInvalidDevice);
	CHECK_ERR(uvmMemPrefetchAsync(b, n, -7, NULL), uvmErrorInvalidDevice);
	CHECK_ERR(uvmMemPrefetchAsync(b, 0, 0, NULL), uvmErrorInvalidValue);
	CHECK_ERR(uvmMemPrefetchAsync(NULL, 10, 0, NULL), uvmErrorInvalidValue);
	CHECK_ERR(uvmMemPrefetchAsync(&local_variable_target, 4, 0, NULL), uvmErrorInvalidValue);
	CHECK_ERR(uvmMemPrefetchAsync(b, n + 8192, 0, NULL), uvmErrorInvalidValue);

	/* Free: once, at the start. */
	CHECK_ERR(uvmFree(b + 4096), uvmErrorInvalidValue);
	CHECK(strstr(uvmGetLastErrorMessage(), "not the start") != NULL);
	CHECK_ERR(uvmFreeHost(b), uvmErrorInvalidValue);
	CHECK_OK(uvmFree(b));
	CHECK_ERR(uvmFree(b), uvmErrorInvalidValue);
	CHECK_ERR(uvmFree(&local_variable_target), uvmErrorInvalidValue);
	CHECK_OK(uvmFree(NULL));
}

/* uvmMemDiscard drops the whole pages inside its range wherever they
 * are, and they read as zeros; the bytes of the pages at its ends stay. */
static void test_discard(void)
{
	size_t n = 4 * MiB;
	unsigned char *b;
	CHECK_OK(uvmMallocManaged((void **)&b, n, uvmMemAttachGlobal));
	if (!b)
		return;
	for (size_t i = 0; i < n; i++)
		b[i] = (unsigned char)(i * 13 + 1);
	CHECK_OK(uvmMemPrefetchAsync(b + 2 * MiB, 2 * MiB, 1, NULL)); /* half on device 1 */
	CHECK_OK(uvmDeviceSynchronize());
	/* From byte 100 to byte 3 MiB + 50: pages 1 to 767. */
	CHECK_OK(uvmMemDiscard(b + 100, 3 * MiB + 50 - 100));
	size_t bad = 0;
	for (size_t i = 0; i < n; i++) {
		unsigned char want = i >= 4096 && i < 3 * MiB ? 0 : (unsigned char)(i * 13 + 1);
		bad += b[i] != want;
	}
	CHECK(bad == 0);
	/* In stream order: after the prefetch queued before it. */
	memset(b, 0x5a, n);
	CHECK_OK(uvmMemPrefetchAsync(b, n, 0, NULL));
	CHECK_OK(uvmMemDiscardAsync(b, n, NULL));
	CHECK_OK(uvmDeviceSynchronize());
	bad = 0;
	for (size_t i = 0; i < n; i++)
		bad += b[i] != 0;
	CHECK(bad == 0);
	CHECK_OK(uvmMemDiscard(b + 10, 100)); /* no whole page inside: nothing */

	CHECK_ERR(uvmMemDiscard(b, 0), uvmErrorInvalidValue);
	CHECK_ERR(uvmMemDiscard(NULL, 4096), uvmErrorInvalidValue);
	CHECK_ERR(uvmMemDiscard(&local_variable_target, 4), uvmErrorInvalidValue);
	CHECK_ERR(uvmMemDiscard(b, n + 8192), uvmErrorInvalidValue);
	CHECK_ERR(uvmMemDiscardAsync(b, n + 8192, NULL), uvmErrorInvalidValue);
	void *d;
	CHECK_OK(uvmSetDevice(0));
	CHECK_OK(uvmMalloc(&d, MiB));
	CHECK_ERR(uvmMemDiscard(d, MiB), uvmErrorInvalidValue);
	CHECK(strstr(uvmGetLastErrorMessage(), "applies to managed memory, and this is device memory") != NULL);
	CHECK_OK(uvmFree(d));
	CHECK_OK(uvmFree(b));
}

static void test_advice(void)
{
	size_t n = 4 * MiB;
	char *b;
	CHECK_OK(uvmMallocManaged((void **)&b, n, uvmMemAttachGlobal));
	if (!b)
		return;
	int v = -5;
	CHECK_OK(uvmMemAdvise(b, n, uvmMemAdviseSetReadMostly, 0));
	CHECK_OK(uvmMemRangeGetAttribute(&v, 4, uvmMemRangeAttributeReadMostly, b, n));
	CHECK(v == 1);
	CHECK_OK(uvmMemAdvise(b, n, uvmMemAdviseUnsetReadMostly, 0));
	CHECK_OK(uvmMemRangeGetAttribute(&v, 4, uvmMemRangeAttributeReadMostly, b, n));
	CHECK(v == 0);

	CHECK_OK(uvmMemAdvise(b, n, uvmMemAdviseSetPreferredLocation, 1));
	CHECK_OK(uvmMemRangeGetAttribute(&v, 4, uvmMemRangeAttributePreferredLocation, b, n));
	CHECK(v == 1);
	CHECK_OK(uvmMemAdvise(b, n / 2, uvmMemAdviseSetPreferredLocation, uvmCpuDeviceId));
	CHECK_OK(uvmMemRangeGetAttribute(&v, 4, uvmMemRangeAttributePreferredLocation, b, n));
	CHECK(v == uvmInvalidDeviceId); /* the halves disagree */
	CHECK_OK(uvmMemAdvise(b, n, uvmMemAdviseUnsetPreferredLocation, 0));
	CHECK_OK(uvmMemRangeGetAttribute(&v, 4, uvmMemRangeAttributePreferredLocation, b, n));
	CHECK(v == uvmInvalidDeviceId);

	int by[4] = {7, 7, 7, 7};
	CHECK_OK(uvmMemAdvise(b, n, uvmMemAdviseSetAccessedBy, 1));
	CHECK_OK(uvmMemAdvise(b, n, uvmMemAdviseSetAccessedBy, 0));
	CHECK_OK(uvmMemRangeGetAttribute(by, sizeof by, uvmMemRangeAttributeAccessedBy, b, n));
	CHECK((by[0] == 0 && by[1] == 1) || (by[0] == 1 && by[1] == 0));
	CHECK(by[2] == uvmInvalidDeviceId && by[3] == uvmInvalidDeviceId);
	CHECK_OK(uvmMemAdvise(b, n, uvmMemAdviseUnsetAccessedBy, 1));
	CHECK_OK(uvmMemRangeGetAttribute(by, sizeof by, uvmMemRangeAttributeAccessedBy, b, n));
	CHECK(by[0] == 0 && by[1] == uvmInvalidDeviceId);
	CHECK_OK(uvmMemAdvise(b, n, uvmMemAdviseUnsetAccessedBy, 0));

	/* Misuse. */
	CHECK_ERR(uvmMemAdvise(b, n, (uvmMemoryAdvise)0, 0), uvmErrorInvalidValue);
	CHECK_ERR(uvmMemAdvise(b, n, (uvmMemoryAdvise)7, 0), uvmErrorInvalidValue);
	CHECK_ERR(uvmMemAdvise(b, n, uvmMemAdviseSetPreferredLocation, 9), uvmErrorInvalidDevice);
	CHECK_ERR(uvmMemAdvise(b, n, uvmMemAdviseSetAccessedBy, -3), uvmErrorInvalidDevice);
	CHECK_ERR(uvmMemAdvise(b, 0, uvmMemAdviseSetReadMostly, 0), uvmErrorInvalidValue);
	CHECK_ERR(uvmMemAdvise(NULL, n, uvmMemAdviseSetReadMostly, 0), uvmErrorInvalidValue);
	CHECK_ERR(uvmMemAdvise(&local_variable_target, 4, uvmMemAdviseSetReadMostly, 0), uvmErrorInvalidValue);
	CHECK_ERR(uvmMemRangeGetAttribute(NULL, 4, uvmMemRangeAttributeReadMostly, b, n), uvmErrorInvalidValue);
	CHECK_ERR(uvmMemRangeGetAttribute(&v, 8, uvmMemRangeAttributeReadMostly, b, n), uvmErrorInvalidValue);
	CHECK_ERR(uvmMemRangeGetAttribute(by, 6, uvmMemRangeAttributeAccessedBy, b, n), uvmErrorInvalidValue);
	CHECK_ERR(uvmMemRangeGetAttribute(&v, 4, (uvmMemRangeAttribute)9, b, n), uvmErrorInvalidValue);
	CHECK_ERR(uvmMemRangeGetAttribute(&v, 4, (uvmMemRangeAttribute)0, b, n), uvmErrorInvalidValue);
	CHECK_ERR(uvmMemRangeGetAttribute(&v, 4, uvmMemRangeAttributeReadMostly, b, 0), uvmErrorInvalidValue);
	CHECK_ERR(uvmMemRangeGetAttribute(&v, 4, uvmMemRangeAttributeReadMostly, &local_variable_target, 4), uvmErrorInvalidValue);
	CHECK_OK(uvmFree(b));
}

static void test_device_memory(void)
{
	size_t n = 3 * MiB + 17;
	unsigned char *d0, *d1, *h = malloc(n), *back = malloc(n);
	CHECK_ERR(uvmMalloc(NULL, n), uvmErrorInvalidValue);
	CHECK_ERR(uvmMalloc((void **)&d0, 0), uvmErrorInvalidValue);
	CHECK_OK(uvmMalloc((void **)&d0, n));
	CHECK_OK(uvmSetDevice(1));
	CHECK_OK(uvmMalloc((void **)&d1, n));
	CHECK_OK(uvmSetDevice(0));
	if (!d0 || !d1 || !h || !back)
		return;
	for (size_t i = 0; i < n; i++)
		h[i] = (unsigned char)(i % 251);
	CHECK_OK(uvmMemcpy(d0, h, n, uvmMemcpyHostToDevice));
	CHECK_OK(uvmMemcpy(d1, d0, n, uvmMemcpyDeviceToDevice));
	memset(back, 0, n);
	CHECK_OK(uvmMemcpy(back, d1, n, uvmMemcpyDeviceToHost));
	CHECK(memcmp(back, h, n) == 0);
	CHECK_OK(uvmMemset(d0 + 10, 0xab, 100));
	CHECK_OK(uvmMemcpy(back, d0, 200, uvmMemcpyDefault));
	CHECK(back[9] == h[9] && back[10] == 0xab && back[109] == 0xab && back[110] == h[110]);

	uvmPointerAttributes at;
	CHECK_OK(uvmPointerGetAttributes(&at, d1 + 5));
	CHECK(at.type == uvmMemoryTypeDevice && at.device == 1 && at.devicePointer == d1 + 5 && at.hostPointer == NULL);

	/* Kinds that disagree with the pointers, overlaps, bad pointers. */
	CHECK_ERR(uvmMemcpy(back, d0, n, uvmMemcpyHostToHost), uvmErrorInvalidValue);
	CHECK_ERR(uvmMemcpy(d0, h, n, uvmMemcpyDeviceToHost), uvmErrorInvalidValue);
	CHECK_ERR(uvmMemcpy(h, back, n, uvmMemcpyHostToDevice), uvmErrorInvalidValue);
	CHECK_ERR(uvmMemcpy(h, back, n, (uvmMemcpyKind)9), uvmErrorInvalidValue);
	CHECK_ERR(uvmMemcpy(h, h + 10, 100, uvmMemcpyHostToHost), uvmErrorInvalidValue);
	CHECK_ERR(uvmMemcpy(NULL, h, 100, uvmMemcpyDefault), uvmErrorInvalidValue);
	CHECK_ERR(uvmMemcpy(h, (void *)8, 100, uvmMemcpyDefault), uvmErrorInvalidValue);
	CHECK_ERR(uvmMemcpy(d0, h, n + 4096, uvmMemcpyDefault), uvmErrorInvalidValue);
	CHECK_OK(uvmMemcpy(NULL, NULL, 0, uvmMemcpyDefault));
	CHECK_ERR(uvmMemset(NULL, 0, 10), uvmErrorInvalidValue);
	CHECK_OK(uvmMemsetAsync(d0, 0, n, NULL));
	CHECK_OK(uvmMemcpyAsync(back, d0, 4096, uvmMemcpyDeviceToHost, NULL));
	CHECK_OK(uvmDeviceSynchronize());
	CHECK(back[10] == 0);
	CHECK_ERR(uvmMemPrefetchAsync(d0, n, 1, NULL), uvmErrorInvalidValue);
	CHECK_ERR(uvmFreeHost(d0), uvmErrorInvalidValue);
	CHECK_OK(uvmFree(d0));
	CHECK_OK(uvmFree(d1));
	free(h);
	free(back);
}

static void test_pinned(void)
{
	size_t n = 2 * MiB + 5;
	unsigned char *p, *wc;
	void *dp;
	CHECK_ERR(uvmHostAlloc(NULL, n, 0), uvmErrorInvalidValue);
	CHECK_ERR(uvmHostAlloc((void **)&p, 0, 0), uvmErrorInvalidValue);
	CHECK_ERR(uvmHostAlloc((void **)&p, n, 0x80), uvmErrorInvalidValue);
	CHECK_OK(uvmHostAlloc((void **)&p, n, uvmHostAllocMapped | uvmHostAllocPortable));
	CHECK_OK(uvmHostAlloc((void **)&wc, n, uvmHostAllocWriteCombined));
	if (!p || !wc)
		return;
	CHECK(p[0] == 0 && p[n - 1] == 0);
	memset(p, 3, n);
	CHECK_OK(uvmMemcpy(wc, p, n, uvmMemcpyHostToHost));
	CHECK(wc[0] == 3 && wc[n - 1] == 3);
	CHECK_OK(uvmMemset(wc + 1, 9, n - 2));
	CHECK(wc[0] == 3 && wc[1] == 9 && wc[n - 2] == 9 && wc[n - 1] == 3);
	CHECK_OK(uvmHostGetDevicePointer(&dp, p + 100, 0));
	CHECK(dp == p + 100);
	CHECK_ERR(uvmHostGetDevicePointer(&dp, p, 1), uvmErrorInvalidValue);
	CHECK_ERR(uvmHostGetDevicePointer(NULL, p, 0), uvmErrorInvalidValue);
	CHECK_ERR(uvmHostGetDevicePointer(&dp, &local_variable_target, 0), uvmErrorInvalidValue);
	uvmPointerAttributes at;
	CHECK_OK(uvmPointerGetAttributes(&at, p));
	CHECK(at.type == uvmMemoryTypeHost && at.device == uvmCpuDeviceId && at.hostPointer == p && at.devicePointer == p);
	CHECK_ERR(uvmFree(p), uvmErrorInvalidValue);
	CHECK(strstr(uvmGetLastErrorMessage(), "uvmFreeHost") != NULL);
	CHECK_OK(uvmFreeHost(p));
	CHECK_ERR(uvmFreeHost(p), uvmErrorInvalidValue);
	CHECK_OK(uvmMallocHost((void **)&p, 4096));
	CHECK_OK(uvmFreeHost(p));
	CHECK_OK(uvmFreeHost(wc));
	CHECK_OK(uvmFreeHost(NULL));
}

static void test_register(void)
{
	size_t n = 1 * MiB;
	unsigned char *m = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	CHECK(m != MAP_FAILED);
	if (m == MAP_FAILED)
		return;
	for (size_t i = 0; i < n; i++)
		m[i] = (unsigned char)(i >> 12);
	CHECK_ERR(uvmHostRegister(NULL, n, 0), uvmErrorInvalidValue);
	CHECK_ERR(uvmHostRegister(m, 0, 0), uvmErrorInvalidValue);
	CHECK_ERR(uvmHostRegister(m + 1, 4096, 0), uvmErrorInvalidValue);
	CHECK_ERR(uvmHostRegister(m, 100, 0), uvmErrorInvalidValue);
	CHECK_ERR(uvmHostRegister(m, n, 0x40), uvmErrorInvalidValue);
	CHECK_OK(uvmHostRegister(m, n, uvmHostRegisterMapped));
	CHECK_ERR(uvmHostRegister(m + 4096, 4096, 0), uvmErrorInvalidValue); /* overlaps */
	size_t bad = 0;
	for (size_t i = 0; i < n; i++)
		bad += m[i] != (unsigned char)(i >> 12);
	CHECK(bad == 0);
	unsigned char *dp;
	CHECK_OK(uvmHostGetDevicePointer((void **)&dp, m + 8192, 0));
	CHECK(dp != NULL && dp != m + 8192);
	if (dp) {
		m[8192] = 42; /* the alias and the device pointer are one page */
		CHECK(dp[0] == 42);
	}
	uvmPointerAttributes at;
	CHECK_OK(uvmPointerGetAttributes(&at, m + 8192));
	CHECK(at.type == uvmMemoryTypeHost && at.hostPointer == m + 8192 && at.devicePointer == dp);
	CHECK_ERR(uvmFreeHost(m), uvmErrorInvalidValue);
	CHECK_ERR(uvmHostUnregister(m + 4096), uvmErrorInvalidValue);
	CHECK_OK(uvmHostUnregister(m));
	CHECK(m[8192] == 42 && m[4096] == 1 && m[n - 1] == (unsigned char)((n - 1) >> 12));
	CHECK_ERR(uvmHostUnregister(m), uvmErrorInvalidValue);
	CHECK_OK(uvmPointerGetAttributes(&at, m));
	CHECK(at.type == uvmMemoryTypeUnregistered);
	munmap(m, n);
	unsigned char *unmapped = mmap(NULL, 8192, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	munmap(unmapped, 8192);
	CHECK_ERR(uvmHostRegister(unmapped, 8192, 0), uvmErrorInvalidValue);
}

static void test_pointer_attributes(void)
{
	uvmPointerAttributes at = {.device = 0}; /* read by nothing; gcc cannot tell */
	CHECK_ERR(uvmPointerGetAttributes(NULL, &at), uvmErrorInvalidValue);
	CHECK_OK(uvmPointerGetAttributes(&at, &local_variable_target));
	CHECK(at.type == uvmMemoryTypeUnregistered && at.device == uvmInvalidDeviceId && at.devicePointer == NULL);
	char *b;
	CHECK_OK(uvmSetDevice(1));
	CHECK_OK(uvmMallocManaged((void **)&b, 10000, uvmMemAttachHost));
	CHECK_OK(uvmSetDevice(0));
	CHECK_OK(uvmPointerGetAttributes(&at, b + 9999));
	CHECK(at.type == uvmMemoryTypeManaged && at.device == 1 && at.devicePointer == b + 9999 && at.hostPointer == b + 9999);
	CHECK_OK(uvmFree(b));
}

struct worker {
	int id;
	int failures;
};

static void *alloc_worker(void *arg)
{
	struct worker *w = arg;
	for (int round = 0; round < 20; round++) {
		unsigned *p;
		size_t n = (size_t)(1 + (w->id + round) % 3) * MiB;
		if (uvmMallocManaged((void **)&p, n, uvmMemAttachGlobal) != uvmSuccess) {
			w->failures++;
			continue;
		}
		for (size_t i = 0; i < n / 4; i += 1024)
			p[i] = (unsigned)(w->id * 1000 + round);
		if (round % 4 == 0 && uvmMemPrefetchAsync(p, n, w->id % 2, NULL) != uvmSuccess)
			w->failures++;
		for (size_t i = 0; i < n / 4; i += 1024)
			w->failures += p[i] != (unsigned)(w->id * 1000 + round);
		if (uvmFree(p) != uvmSuccess)
			w->failures++;
	}
	return NULL;
}

static void test_threads(void)
{
	pthread_t t[4];
	struct worker w[4];
	for (int i = 0; i < 4; i++) {
		w[i] = (struct worker){.id = i};
		pthread_create(&t[i], NULL, alloc_worker, &w[i]);
	}
	for (int i = 0; i < 4; i++) {
		pthread_join(t[i], NULL);
		CHECK(w[i].failures == 0);
	}
}

/* A forked child keeps a private copy of managed memory: its writes do
 * not reach the parent, the parent's later writes do not reach it, and
 * it may free its copy. */
static void test_fork(void)
{
	size_t n = 4 * MiB;
	unsigned char *b;
	CHECK_OK(uvmMallocManaged((void **)&b, n, uvmMemAttachGlobal));
	if (!b)
		return;
	memset(b, 'p', n);
	CHECK_OK(uvmMemPrefetchAsync(b, n / 2, 0, NULL)); /* half of it on a device */
	int pipefd[2];
	CHECK(pipe(pipefd) == 0);
	pid_t pid = fork();
	if (pid == 0) {
		char go;
		if (read(pipefd[0], &go, 1) != 1)
			_exit(10);
		int rc = 0;
		for (size_t i = 0; i < n; i += 4096)
			if (b[i] != 'p')
				rc = 11;
		memset(b, 'c', n);
		uvmPointerAttributes at;
		if (uvmPointerGetAttributes(&at, b) != uvmSuccess || at.type != uvmMemoryTypeUnregistered)
			rc = 12;
		/* A new session in the child works. */
		unsigned char *c;
		if (uvmMallocManaged((void **)&c, MiB, uvmMemAttachGlobal) != uvmSuccess || uvmMemPrefetchAsync(c, MiB, 1, NULL) != uvmSuccess)
			_exit(14);
		c[5] = 'g';
		/* A grandchild inherits the child's copy as ordinary memory, and
		 * gets its own copy of the child's new managed memory. */
		pid_t grandchild = fork();
		if (grandchild == 0)
			_exit(b[0] != 'c' || b[n - 1] != 'c' || c[5] != 'g' || c[6] != 0 ? 20 : 0);
		int gstatus = 0;
		if (waitpid(grandchild, &gstatus, 0) != grandchild || !WIFEXITED(gstatus) || WEXITSTATUS(gstatus) != 0)
			rc = 16;
		if (uvmFree(b) != uvmSuccess)
			rc = 13;
		if (c[5] != 'g' || uvmFree(c) != uvmSuccess)
			rc = 15;
		_exit(rc);
	}
	memset(b, 'q', 4096); /* after the fork: the child must not see it */
	CHECK(write(pipefd[1], "g", 1) == 1);
	int status = 0;
	CHECK(waitpid(pid, &status, 0) == pid);
	CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
	if (!WIFEXITED(status) || WEXITSTATUS(status))
		fprintf(stderr, "fork child: status %#x\n", status);
	CHECK(b[0] == 'q' && b[4096] == 'p' && b[n - 1] == 'p');
	close(pipefd[0]);
	close(pipefd[1]);
	CHECK_OK(uvmFree(b));
}

/* sum_kernel adds up n ints at src into *dst: run with one thread. */
struct sum_params {
	const int *src;
	size_t n;
	long *dst;
};

static void sum_kernel(unsigned tid, unsigned nthreads, const void *params)
{
	const struct sum_params *p = params;
	(void)tid, (void)nthreads;
	long sum = 0;
	for (size_t i = 0; i < p->n; i++)
		sum += p->src[i];
	*p->dst = sum;
}

/* byte_sum_kernel adds up n bytes at src into *dst: run with one thread. */
struct byte_sum_params {
	const unsigned char *src;
	size_t n;
	long *dst;
};

static void byte_sum_kernel(unsigned tid, unsigned nthreads, const void *params)
{
	const struct byte_sum_params *p = params;
	(void)tid, (void)nthreads;
	long sum = 0;
	for (size_t i = 0; i < p->n; i++)
		sum += p->src[i];
	*p->dst = sum;
}

static unsigned char pattern_byte(size_t i) { return (unsigned char)(i * 131 + (i >> 20) + 7); }

/* first_difference returns the first i < n where a and b differ, or n. */
static size_t first_difference(const unsigned char *a, const unsigned char *b, size_t n)
{
	for (size_t i = 0; i < n; i++)
		if (a[i] != b[i])
			return i;
	return n;
}

/* Copies of device memory large enough to be shared among threads (and
 * to use non-temporal stores where the server says they pay), at
 * unaligned offsets, each way and between devices, byte for byte; a
 * large unaligned memset; and the bytes around them untouched. */
static void test_device_copies_large(void)
{
	const size_t n = 64 * MiB + 3, room = n + 64;
	unsigned char *d0 = NULL, *d1 = NULL, *h = malloc(room), *back = malloc(room), *want = malloc(room);
	CHECK_OK(uvmMalloc((void **)&d0, room));
	CHECK_OK(uvmSetDevice(1));
	CHECK_OK(uvmMalloc((void **)&d1, room));
	CHECK_OK(uvmSetDevice(0));
	if (!d0 || !d1 || !h || !back || !want)
		return;
	for (size_t i = 0; i < room; i++)
		h[i] = pattern_byte(i);
	CHECK_OK(uvmMemset(d0, 0x5a, room));
	CHECK_OK(uvmMemset(d1, 0xa5, room));

	CHECK_OK(uvmMemcpy(d0 + 5, h + 1, n, uvmMemcpyHostToDevice));
	memset(back, 0, room);
	CHECK_OK(uvmMemcpy(back, d0, room, uvmMemcpyDeviceToHost));
	memset(want, 0x5a, room);
	memcpy(want + 5, h + 1, n);
	size_t at = first_difference(back, want, room);
	CHECK(at == room);
	if (at != room)
		fprintf(stderr, "host to device: byte %zu is %#x, want %#x\n", at, back[at], want[at]);

	CHECK_OK(uvmMemcpy(d1 + 13, d0 + 5, n, uvmMemcpyDeviceToDevice));
	memset(back, 0, room);
	CHECK_OK(uvmMemcpy(back + 3, d1 + 13, n, uvmMemcpyDeviceToHost));
	at = first_difference(back + 3, h + 1, n);
	CHECK(at == n);
	if (at != n)
		fprintf(stderr, "device to device to host: byte %zu is %#x, want %#x\n", at, back[3 + at], h[1 + at]);
	CHECK(back[0] == 0 && back[1] == 0 && back[2] == 0 && back[n + 3] == 0);
	CHECK_OK(uvmMemcpy(back, d1, 13, uvmMemcpyDeviceToHost));
	CHECK(back[0] == 0xa5 && back[12] == 0xa5);
	CHECK_OK(uvmMemcpy(back, d1 + 13 + n, room - 13 - n, uvmMemcpyDeviceToHost));
	CHECK(back[0] == 0xa5 && back[room - 14 - n] == 0xa5);

	/* A large memset at an odd offset, short of the end. */
	CHECK_OK(uvmMemset(d1 + 7, 0xc3, n - 20));
	CHECK_OK(uvmMemcpy(back, d1, room, uvmMemcpyDeviceToHost));
	memset(want, 0xa5, 13);
	memcpy(want + 13, h + 1, n);
	memset(want + 13 + n, 0xa5, room - 13 - n);
	memset(want + 7, 0xc3, n - 20);
	at = first_difference(back, want, room);
	CHECK(at == room);
	if (at != room)
		fprintf(stderr, "memset: byte %zu is %#x, want %#x\n", at, back[at], want[at]);

	/* The device sees what the copies wrote. */
	long *sum;
	CHECK_OK(uvmMallocManaged((void **)&sum, sizeof *sum, uvmMemAttachGlobal));
	if (sum) {
		long expect = 0;
		for (size_t i = 0; i < room; i++)
			expect += want[i];
		struct byte_sum_params sp = {.src = d1, .n = room, .dst = sum};
		CHECK_OK(uvmLaunchKernel(1, NULL, 1, byte_sum_kernel, &sp, sizeof sp));
		CHECK_OK(uvmSetDevice(1));
		CHECK_OK(uvmDeviceSynchronize());
		CHECK_OK(uvmSetDevice(0));
		CHECK(*sum == expect);
		CHECK_OK(uvmFree(sum));
	}
	CHECK_OK(uvmFree(d0));
	CHECK_OK(uvmFree(d1));
	free(h);
	free(back);
	free(want);
}

/* Device memory freed and allocated again, maybe at the same address, on
 * another device and larger: copies reach the new allocation, not a
 * mapping left from the old one. */
static void test_device_realloc(void)
{
	size_t small = 4 * MiB + 1, large = 6 * MiB;
	unsigned char *h = malloc(large), *back = malloc(large), *d, *e = NULL, *f = NULL;
	long *sum;
	CHECK_OK(uvmMallocManaged((void **)&sum, sizeof *sum, uvmMemAttachGlobal));
	if (!h || !back || !sum)
		return;
	for (size_t i = 0; i < large; i++)
		h[i] = pattern_byte(i + 11);
	for (int round = 0; round < 3; round++) {
		CHECK_OK(uvmMalloc((void **)&d, small));
		if (!d)
			return;
		CHECK_OK(uvmMemset(d, 0x11, small));
		CHECK_OK(uvmMemcpy(back, d + small - 100, 100, uvmMemcpyDeviceToHost));
		CHECK(back[0] == 0x11 && back[99] == 0x11);
		CHECK_OK(uvmFree(d));

		/* The next one on device 1, at d if the window has room there. */
		CHECK_OK(uvmSetDevice(1));
		CHECK_OK(uvmMalloc((void **)&e, large));
		CHECK_OK(uvmSetDevice(0));
		if (!e)
			return;
		if (round == 0 && e != d)
			fprintf(stderr, "note: device memory allocated again at %p, not at %p\n", (void *)e, (void *)d);
		CHECK_OK(uvmMemcpy(e, h, large, uvmMemcpyHostToDevice));
		memset(back, 0, large);
		CHECK_OK(uvmMemcpy(back, e, large, uvmMemcpyDeviceToHost));
		CHECK(memcmp(back, h, large) == 0);
		long expect = 0;
		for (size_t i = 0; i < large; i++)
			expect += h[i];
		*sum = -1;
		struct byte_sum_params sp = {.src = e, .n = large, .dst = sum};
		CHECK_OK(uvmLaunchKernel(1, NULL, 1, byte_sum_kernel, &sp, sizeof sp));
		CHECK_OK(uvmSetDevice(1));
		CHECK_OK(uvmDeviceSynchronize());
		CHECK_OK(uvmSetDevice(0));
		CHECK(*sum == expect);
		CHECK_OK(uvmFree(e));

		/* And back on device 0, larger than the first. */
		CHECK_OK(uvmMalloc((void **)&f, large));
		if (!f)
			return;
		CHECK_OK(uvmMemset(f, 0x22, large));
		CHECK_OK(uvmMemcpy(back, f + large - 4096, 4096, uvmMemcpyDeviceToHost));
		CHECK(back[0] == 0x22 && back[4095] == 0x22);
		CHECK_OK(uvmFree(f));
	}
	CHECK_OK(uvmFree(sum));
	free(h);
	free(back);
}

/* A fork after device copies: the child, which has no session and finds
 * the parent's device memory unreachable, makes its own session and
 * device copies, frees its copy of the table, and exits cleanly; the
 * parent's device memory and copies are as before. */
static void test_fork_after_device_copies(void)
{
	size_t n = 8 * MiB + 5;
	unsigned char *d, *h = malloc(n), *back = malloc(n);
	CHECK_OK(uvmMalloc((void **)&d, n));
	if (!d || !h || !back)
		return;
	for (size_t i = 0; i < n; i++)
		h[i] = pattern_byte(i + 3);
	CHECK_OK(uvmMemcpy(d, h, n, uvmMemcpyHostToDevice));
	CHECK_OK(uvmMemcpy(back, d, n, uvmMemcpyDeviceToHost));
	fflush(NULL);
	pid_t pid = fork();
	if (pid == 0) {
		int rc = 0;
		uvmPointerAttributes at;
		if (uvmPointerGetAttributes(&at, d) != uvmSuccess || at.type != uvmMemoryTypeUnregistered)
			rc = 21;
		unsigned char *c;
		if (uvmMalloc((void **)&c, n) != uvmSuccess)
			exit(22);
		if (uvmMemcpy(c, h, n, uvmMemcpyHostToDevice) != uvmSuccess || uvmMemset(c, 0x77, 10) != uvmSuccess)
			rc = 23;
		memset(back, 0, n);
		if (uvmMemcpy(back, c, n, uvmMemcpyDeviceToHost) != uvmSuccess || back[9] != 0x77 || memcmp(back + 10, h + 10, n - 10) != 0)
			rc = 24;
		if (uvmFree(c) != uvmSuccess || uvmFree(d) != uvmSuccess)
			rc = 25;
		exit(rc); /* exit, not _exit: the library's state must survive the handlers */
	}
	int status = 0;
	CHECK(waitpid(pid, &status, 0) == pid);
	CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
	if (!WIFEXITED(status) || WEXITSTATUS(status))
		fprintf(stderr, "fork child after device copies: status %#x\n", status);
	memset(back, 0, n);
	CHECK_OK(uvmMemcpy(back, d, n, uvmMemcpyDeviceToHost));
	CHECK(memcmp(back, h, n) == 0);
	CHECK_OK(uvmMemset(d, 0x33, n));
	CHECK_OK(uvmMemcpy(back, d + n - 3, 3, uvmMemcpyDeviceToHost));
	CHECK(back[0] == 0x33 && back[2] == 0x33);
	CHECK_OK(uvmFree(d));
	free(h);
	free(back);
}

/* Kernels reach pinned and registered host memory through the device
 * pointer, in place (zero-copy), and managed memory prefetched on a
 * stream. */
static void test_kernels_reach_host_memory(void)
{
	size_t n = 1 << 18;
	int *pinned, *dpinned, *managed;
	long *out;
	CHECK_OK(uvmHostAlloc((void **)&pinned, n * sizeof(int), uvmHostAllocMapped));
	CHECK_OK(uvmMallocManaged((void **)&out, sizeof(long), uvmMemAttachGlobal));
	CHECK_OK(uvmMallocManaged((void **)&managed, n * sizeof(int), uvmMemAttachGlobal));
	int *reg = mmap(NULL, n * sizeof(int), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (!pinned || !out || !managed || reg == MAP_FAILED)
		return;
	long want = 0;
	for (size_t i = 0; i < n; i++) {
		pinned[i] = reg[i] = managed[i] = (int)(i % 1000);
		want += (long)(i % 1000);
	}
	CHECK_OK(uvmHostGetDevicePointer((void **)&dpinned, pinned, 0));
	struct sum_params sp = {.src = dpinned, .n = n, .dst = out};
	CHECK_OK(uvmLaunchKernel(0, NULL, 1, sum_kernel, &sp, sizeof sp));
	CHECK_OK(uvmDeviceSynchronize());
	CHECK(*out == want);

	int *dreg;
	CHECK_OK(uvmHostRegister(reg, n * sizeof(int), uvmHostRegisterMapped));
	CHECK_OK(uvmHostGetDevicePointer((void **)&dreg, reg, 0));
	reg[7] += 1000; /* the host writes the registered memory in place */
	sp.src = dreg;
	CHECK_OK(uvmLaunchKernel(1, NULL, 1, sum_kernel, &sp, sizeof sp));
	CHECK_OK(uvmSetDevice(1));
	CHECK_OK(uvmDeviceSynchronize());
	CHECK_OK(uvmSetDevice(0));
	CHECK(*out == want + 1000);
	CHECK_OK(uvmHostUnregister(reg));

	uvmStream_t st;
	CHECK_OK(uvmStreamCreate(&st));
	CHECK_OK(uvmMemPrefetchAsync(managed, n * sizeof(int), 0, st));
	CHECK_OK(uvmStreamSynchronize(st));
	int loc = -5;
	CHECK_OK(uvmMemRangeGetAttribute(&loc, 4, uvmMemRangeAttributeLastPrefetchLocation, managed, n * sizeof(int)));
	CHECK(loc == 0);
	sp.src = managed;
	CHECK_OK(uvmLaunchKernel(0, st, 1, sum_kernel, &sp, sizeof sp));
	long host_copy = 0;
	CHECK_OK(uvmMemcpyAsync(&host_copy, out, sizeof host_copy, uvmMemcpyDeviceToHost, st));
	CHECK_OK(uvmStreamSynchronize(st));
	CHECK(host_copy == want); /* the copy ran after the kernel */
	CHECK_OK(uvmStreamDestroy(st));
	CHECK_ERR(uvmMemPrefetchAsync(managed, 4096, 0, st), uvmErrorInvalidValue); /* destroyed */
	munmap(reg, n * sizeof(int));
	CHECK_OK(uvmFreeHost(pinned));
	CHECK_OK(uvmFree(managed));
	CHECK_OK(uvmFree(out));
}

/* A page of pinned memory, freed, and managed memory placed where it
 * was: with location files of 2 MiB folios, the pinned page must not
 * leave the rest of its 2 MiB present in the host file, where the managed
 * memory's writes would land unseen by the server and a kernel would
 * read zeros. */
static void test_pinned_then_managed(void)
{
	const size_t n = 1 * MiB;
	unsigned char *p = NULL, *m = NULL;
	long *sum = NULL;
	CHECK_OK(uvmMallocHost((void **)&sum, sizeof *sum));
	CHECK_OK(uvmMallocHost((void **)&p, 4096));
	if (!p || !sum)
		return;
	p[0] = 1;
	CHECK_OK(uvmFreeHost(p));
	CHECK_OK(uvmMallocManaged((void **)&m, n, uvmMemAttachGlobal));
	if (!m)
		return;
	CHECK(m == p); /* the same address, or this tests nothing */
	long expect = 0;
	for (size_t i = 0; i < n; i++) {
		m[i] = pattern_byte(i);
		expect += m[i];
	}
	*sum = -1;
	struct byte_sum_params sp = {.src = m, .n = n, .dst = sum};
	CHECK_OK(uvmLaunchKernel(0, NULL, 1, byte_sum_kernel, &sp, sizeof sp));
	CHECK_OK(uvmDeviceSynchronize());
	CHECK(*sum == expect);
	if (*sum != expect)
		fprintf(stderr, "device 0 summed %ld, want %ld\n", *sum, expect);
	size_t bad = 0;
	for (size_t i = 0; i < n; i++)
		bad += m[i] != pattern_byte(i);
	CHECK(bad == 0);
	CHECK_OK(uvmFree(m));
	CHECK_OK(uvmFreeHost(sum));
}

int main(void)
{
	/* The 64 MiB copies need devices larger than the test's 64 MiB; set
	 * before the first call starts the private server. */
	setenv("UVM_ARENA_SIZE", "192MiB", 1);
	test_errors();
	test_managed();
	test_discard();
	test_advice();
	test_device_memory();
	test_device_copies_large();
	test_device_realloc();
	test_pinned();
	test_pinned_then_managed();
	test_register();
	test_pointer_attributes();
	test_threads();
	test_kernels_reach_host_memory();
	test_fork();
	test_fork_after_device_copies();
	return check_done("memory_test");
}
