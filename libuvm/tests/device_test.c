/*
 * device_test.c: devices, streams and kernel launches. Run by
 * integration/libuvm_test.go with a private server, 2 devices of 2
 * workers and 64 MiB arenas.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <time.h>
#include <unistd.h>

#include "check.h"

#define NDEVICES 2
#define WORKERS 2

/* ---- kernels ---- */

struct fill_params {
	uint32_t *out;
	uint32_t n;     /* elements */
	uint32_t value; /* out[i] = value + i */
};

/* fill: thread tid writes the elements i with i % nthreads == tid. */
static void fill(unsigned tid, unsigned nthreads, const void *params)
{
	const struct fill_params *p = params;
	for (uint32_t i = tid; i < p->n; i += nthreads)
		p->out[i] = p->value + i;
}

/* count_threads: counts[tid] += 1, and flags a params pointer that is
 * not 16-byte aligned or a wrong nthreads. */
struct count_params {
	uint32_t *counts;
	uint32_t *bad;
	unsigned want_threads;
};

static void count_threads(unsigned tid, unsigned nthreads, const void *params)
{
	const struct count_params *p = params;
	if ((uintptr_t)params % 16 != 0 || nthreads != p->want_threads || tid >= nthreads)
		__atomic_fetch_add(p->bad, 1, __ATOMIC_RELAXED);
	else
		__atomic_fetch_add(&p->counts[tid], 1, __ATOMIC_RELAXED);
}

/* nap: sleeps, so that what is queued behind it waits. */
static void nap(unsigned tid, unsigned nthreads, const void *params)
{
	(void)tid, (void)nthreads;
	const unsigned *ms = params;
	struct timespec ts = {.tv_sec = *ms / 1000, .tv_nsec = (long)(*ms % 1000) * 1000000};
	nanosleep(&ts, NULL);
}

/* add_one: out[i] += 1 for every element, one thread per element. Runs
 * after fill on the same stream, so it sees fill's writes. */
static void add_one(unsigned tid, unsigned nthreads, const void *params)
{
	(void)nthreads;
	const struct fill_params *p = params;
	if (tid < p->n)
		p->out[tid] += 1;
}

/* null_deref writes through the NULL pointer it is given. */
struct crash_params {
	volatile int *target;
};

static void null_deref(unsigned tid, unsigned nthreads, const void *params)
{
	(void)tid, (void)nthreads;
	const struct crash_params *p = params;
	*p->target = 1;
}

/* ---- helpers ---- */

static int check_fill(const uint32_t *a, uint32_t n, uint32_t value)
{
	for (uint32_t i = 0; i < n; i++)
		if (a[i] != value + i) {
			fprintf(stderr, "element %u is %u, want %u\n", i, a[i], value + i);
			return 0;
		}
	return 1;
}

/* ---- tests ---- */

static void test_count_and_attributes(void)
{
	int n = -1;
	CHECK_OK(uvmGetDeviceCount(&n));
	CHECK(n == NDEVICES);
	CHECK_ERR(uvmGetDeviceCount(NULL), uvmErrorInvalidValue);

	for (int d = 0; d < NDEVICES; d++) {
		int v = -1;
		CHECK_OK(uvmDeviceGetAttribute(&v, uvmDevAttrMultiProcessorCount, d));
		CHECK(v == WORKERS);
		CHECK_OK(uvmDeviceGetAttribute(&v, uvmDevAttrCanMapHostMemory, d));
		CHECK(v == 1);
		CHECK_OK(uvmDeviceGetAttribute(&v, uvmDevAttrPageableMemoryAccess, d));
		CHECK(v == 0);
		CHECK_OK(uvmDeviceGetAttribute(&v, uvmDevAttrConcurrentManagedAccess, d));
		CHECK(v == 1);
		CHECK_OK(uvmDeviceGetAttribute(&v, uvmDevAttrArenaCapacityMiB, d));
		CHECK(v == 64);
	}
	int v;
	CHECK_ERR(uvmDeviceGetAttribute(&v, (uvmDeviceAttr)12345, 0), uvmErrorInvalidValue);
	CHECK(strstr(uvmGetLastErrorMessage(), "12345") != NULL);
	CHECK_ERR(uvmDeviceGetAttribute(&v, uvmDevAttrCanMapHostMemory, NDEVICES), uvmErrorInvalidDevice);
	CHECK(strstr(uvmGetLastErrorMessage(), "device 2") != NULL);
	CHECK_ERR(uvmDeviceGetAttribute(&v, uvmDevAttrCanMapHostMemory, -1), uvmErrorInvalidDevice);
	CHECK_ERR(uvmDeviceGetAttribute(NULL, uvmDevAttrCanMapHostMemory, 0), uvmErrorInvalidValue);
}

static void *current_device_of_new_thread(void *arg)
{
	int *out = arg;
	*out = -1;
	uvmGetDevice(out);
	return NULL;
}

static void test_set_get_device(void)
{
	int d = -1;
	CHECK_OK(uvmGetDevice(&d));
	CHECK(d == 0);
	CHECK_OK(uvmSetDevice(1));
	CHECK_OK(uvmGetDevice(&d));
	CHECK(d == 1);

	/* The current device is per thread: a new thread starts at 0. */
	pthread_t t;
	int other = -1;
	CHECK(pthread_create(&t, NULL, current_device_of_new_thread, &other) == 0);
	pthread_join(t, NULL);
	CHECK(other == 0);

	CHECK_ERR(uvmSetDevice(NDEVICES), uvmErrorInvalidDevice);
	CHECK(strstr(uvmGetLastErrorMessage(), "want a device from 0 to 1") != NULL);
	CHECK_ERR(uvmSetDevice(-1), uvmErrorInvalidDevice);
	CHECK_OK(uvmGetDevice(&d));
	CHECK(d == 1); /* a failed uvmSetDevice changes nothing */
	CHECK_ERR(uvmGetDevice(NULL), uvmErrorInvalidValue);
	CHECK_OK(uvmSetDevice(0));
}

static void test_launch_writes_managed_memory(void)
{
	const uint32_t n = 100000;
	uint32_t *a;
	CHECK_OK(uvmMallocManaged((void **)&a, n * sizeof *a, uvmMemAttachGlobal));
	if (!a)
		return;
	static const unsigned widths[] = {1, 2, 1000};
	uint32_t value = 7;
	for (int d = 0; d < NDEVICES; d++) {
		CHECK_OK(uvmSetDevice(d));
		for (size_t w = 0; w < sizeof widths / sizeof widths[0]; w++, value += 1000000) {
			struct fill_params p = {.out = a, .n = n, .value = value};
			CHECK_OK(uvmLaunchKernel(d, NULL, widths[w], fill, &p, sizeof p));
			CHECK_OK(uvmDeviceSynchronize());
			CHECK(check_fill(a, n, value));
		}
	}
	CHECK_OK(uvmSetDevice(0));

	/* Every thread runs once, with aligned params and the right count. */
	uint32_t *counts;
	CHECK_OK(uvmMallocManaged((void **)&counts, 1000 * sizeof *counts + sizeof(uint32_t), uvmMemAttachGlobal));
	if (counts) {
		memset(counts, 0, 1000 * sizeof *counts + sizeof(uint32_t));
		struct count_params p = {.counts = counts, .bad = counts + 1000, .want_threads = 1000};
		CHECK_OK(uvmLaunchKernel(1, NULL, 1000, count_threads, &p, sizeof p));
		CHECK_OK(uvmSetDevice(1));
		CHECK_OK(uvmDeviceSynchronize());
		CHECK_OK(uvmSetDevice(0));
		int once = 1;
		for (int i = 0; i < 1000; i++)
			once &= counts[i] == 1;
		CHECK(once);
		CHECK(counts[1000] == 0);
		CHECK_OK(uvmFree(counts));
	}
	CHECK_OK(uvmFree(a));
}

static void test_params_are_copied(void)
{
	const uint32_t n = 4096;
	uint32_t *a;
	CHECK_OK(uvmMallocManaged((void **)&a, n * sizeof *a, uvmMemAttachGlobal));
	if (!a)
		return;
	/* The nap holds the stream, so fill runs well after the caller has
	 * changed its params: it must see them as they were at launch. */
	unsigned ms = 100;
	CHECK_OK(uvmLaunchKernel(0, NULL, 1, nap, &ms, sizeof ms));
	struct fill_params p = {.out = a, .n = n, .value = 42};
	CHECK_OK(uvmLaunchKernel(0, NULL, 2, fill, &p, sizeof p));
	p.value = 1000;
	p.n = 0;
	memset(&p, 0xff, sizeof p);
	CHECK_OK(uvmDeviceSynchronize());
	CHECK(check_fill(a, n, 42));
	CHECK_OK(uvmFree(a));
}

static void test_streams(void)
{
	const uint32_t n = 8192;
	uint32_t *a;
	CHECK_OK(uvmMallocManaged((void **)&a, n * sizeof *a, uvmMemAttachGlobal));
	if (!a)
		return;
	uvmStream_t st = NULL;
	CHECK_OK(uvmStreamCreate(&st));
	CHECK(st != NULL);

	/* In order on a stream: add_one sees fill's writes, even behind a
	 * nap. */
	unsigned ms = 30;
	struct fill_params p = {.out = a, .n = n, .value = 5};
	CHECK_OK(uvmLaunchKernel(0, st, 1, nap, &ms, sizeof ms));
	CHECK_OK(uvmLaunchKernel(0, st, 3, fill, &p, sizeof p));
	CHECK_OK(uvmLaunchKernel(0, st, n, add_one, &p, sizeof p));
	CHECK_OK(uvmStreamSynchronize(st));
	CHECK(check_fill(a, n, 6));
	CHECK_OK(uvmStreamSynchronize(NULL)); /* the current device's default stream */

	CHECK_OK(uvmStreamDestroy(st));
	CHECK_ERR(uvmLaunchKernel(0, st, 1, fill, &p, sizeof p), uvmErrorInvalidValue);
	CHECK(strstr(uvmGetLastErrorMessage(), "destroyed") != NULL);
	CHECK_ERR(uvmStreamSynchronize(st), uvmErrorInvalidValue);
	CHECK_ERR(uvmStreamDestroy(st), uvmErrorInvalidValue);
	CHECK_ERR(uvmStreamDestroy(NULL), uvmErrorInvalidValue);
	CHECK_ERR(uvmStreamCreate(NULL), uvmErrorInvalidValue);
	CHECK_ERR(uvmStreamSynchronize((uvmStream_t)(uintptr_t)0x12345), uvmErrorInvalidValue);
	CHECK(strstr(uvmGetLastErrorMessage(), "not a stream") != NULL);

	/* A new stream may reuse the slot; the old handle stays dead. */
	uvmStream_t again;
	CHECK_OK(uvmStreamCreate(&again));
	CHECK(again != st);
	CHECK_ERR(uvmStreamSynchronize(st), uvmErrorInvalidValue);
	CHECK_OK(uvmStreamSynchronize(again));
	CHECK_OK(uvmStreamDestroy(again));

	/* A stream belongs to the device current at its creation. */
	uvmStream_t st1;
	CHECK_OK(uvmSetDevice(1));
	CHECK_OK(uvmStreamCreate(&st1));
	CHECK_OK(uvmSetDevice(0));
	p.value = 77;
	CHECK_ERR(uvmLaunchKernel(0, st1, 1, fill, &p, sizeof p), uvmErrorInvalidValue);
	CHECK(strstr(uvmGetLastErrorMessage(), "of device 1") != NULL);
	CHECK_OK(uvmLaunchKernel(1, st1, 4, fill, &p, sizeof p));
	CHECK_OK(uvmStreamSynchronize(st1)); /* from device 0's thread: the stream knows its device */
	CHECK(check_fill(a, n, 77));
	CHECK_OK(uvmStreamDestroy(st1));
	CHECK_OK(uvmFree(a));
}

static void test_crash_is_reported_and_survived(void)
{
	const uint32_t n = 4096;
	uint32_t *a;
	CHECK_OK(uvmMallocManaged((void **)&a, n * sizeof *a, uvmMemAttachGlobal));
	if (!a)
		return;
	/* Data the device wrote before it died lives on in its file. */
	struct fill_params p = {.out = a, .n = n, .value = 300};
	CHECK_OK(uvmLaunchKernel(0, NULL, 2, fill, &p, sizeof p));
	CHECK_OK(uvmDeviceSynchronize());

	struct crash_params c = {.target = NULL};
	CHECK_OK(uvmLaunchKernel(0, NULL, 1, null_deref, &c, sizeof c));
	CHECK_ERR(uvmDeviceSynchronize(), uvmErrorLaunchFailure);
	const char *msg = uvmGetLastErrorMessage();
	CHECK(strstr(msg, "device 0") != NULL);
	CHECK(strstr(msg, "null_deref") != NULL);
	CHECK(strstr(msg, "signal 11 (segmentation fault)") != NULL);
	CHECK(strstr(msg, "touched address 0") != NULL);
	CHECK(strstr(msg, "after uvmDeviceReset the next launch starts a new process") != NULL);
	/* Sticky, as a CUDA context's kernel fault: reported again, and the
	 * device takes no launch, until a reset. */
	CHECK_ERR(uvmDeviceSynchronize(), uvmErrorLaunchFailure);
	CHECK(strstr(uvmGetLastErrorMessage(), "null_deref") != NULL);
	CHECK_ERR(uvmLaunchKernel(0, NULL, n, add_one, &p, sizeof p), uvmErrorLaunchFailure);
	CHECK(strstr(uvmGetLastErrorMessage(), "uvmDeviceReset clears that") != NULL);
	CHECK(check_fill(a, n, 300));
	CHECK_OK(uvmDeviceReset());
	CHECK_OK(uvmDeviceSynchronize());

	/* The next launch starts a new process, which sees the data. */
	CHECK_OK(uvmLaunchKernel(0, NULL, n, add_one, &p, sizeof p));
	CHECK_OK(uvmDeviceSynchronize());
	CHECK(check_fill(a, n, 301));

	/* A crash on a multi-threaded launch, on a stream, is found by the
	 * stream's synchronize; device 1 does not notice. */
	uvmStream_t st;
	CHECK_OK(uvmStreamCreate(&st));
	CHECK_OK(uvmLaunchKernel(0, st, 4, null_deref, &c, sizeof c));
	CHECK_ERR(uvmStreamSynchronize(st), uvmErrorLaunchFailure);
	CHECK(strstr(uvmGetLastErrorMessage(), "null_deref") != NULL);
	CHECK_OK(uvmLaunchKernel(1, NULL, 2, add_one, &p, sizeof p));
	CHECK_OK(uvmSetDevice(1));
	CHECK_OK(uvmDeviceSynchronize());
	CHECK_OK(uvmSetDevice(0));
	CHECK_ERR(uvmStreamSynchronize(NULL), uvmErrorLaunchFailure); /* the device's other streams too */
	CHECK_OK(uvmDeviceReset());
	CHECK_ERR(uvmStreamSynchronize(st), uvmErrorInvalidValue); /* the reset destroyed it */
	CHECK_OK(uvmStreamCreate(&st));
	CHECK_OK(uvmLaunchKernel(0, st, 1, nap, &(unsigned){1}, sizeof(unsigned)));
	CHECK_OK(uvmStreamSynchronize(st)); /* a new process */
	CHECK_OK(uvmStreamDestroy(st));
	CHECK_OK(uvmDeviceSynchronize());
	CHECK_OK(uvmFree(a));
}

/* Two threads launch and synchronize at once, on the same device (one on
 * the default stream, one on its own) and on the other device. */
struct racer {
	int device;
	bool own_stream;
	uint32_t *out;
	uint32_t n;
	int failures;
};

static void *race(void *arg)
{
	struct racer *r = arg;
	if (uvmSetDevice(r->device) != uvmSuccess) {
		r->failures++;
		return NULL;
	}
	uvmStream_t st = NULL;
	if (r->own_stream && uvmStreamCreate(&st) != uvmSuccess) {
		r->failures++;
		return NULL;
	}
	for (uint32_t round = 0; round < 50; round++) {
		struct fill_params p = {.out = r->out, .n = r->n, .value = round * 1000};
		if (uvmLaunchKernel(r->device, st, 1 + round % 3, fill, &p, sizeof p) != uvmSuccess ||
		    (st ? uvmStreamSynchronize(st) : uvmDeviceSynchronize()) != uvmSuccess || !check_fill(r->out, r->n, round * 1000)) {
			fprintf(stderr, "racer on device %d: round %u: %s\n", r->device, round, uvmGetLastErrorMessage());
			r->failures++;
		}
	}
	if (st && uvmStreamDestroy(st) != uvmSuccess)
		r->failures++;
	return NULL;
}

static void test_concurrent_launches(void)
{
	const uint32_t n = 2048;
	uint32_t *a;
	CHECK_OK(uvmMallocManaged((void **)&a, 3 * n * sizeof *a, uvmMemAttachGlobal));
	if (!a)
		return;
	struct racer rs[3] = {
		{.device = 0, .own_stream = false, .out = a, .n = n},
		{.device = 0, .own_stream = true, .out = a + n, .n = n},
		{.device = 1, .own_stream = false, .out = a + 2 * n, .n = n},
	};
	pthread_t t[3];
	for (int i = 0; i < 3; i++)
		CHECK(pthread_create(&t[i], NULL, race, &rs[i]) == 0);
	for (int i = 0; i < 3; i++) {
		pthread_join(t[i], NULL);
		CHECK(rs[i].failures == 0);
	}
	CHECK_OK(uvmFree(a));
}

static void test_bad_launches(void)
{
	struct fill_params p = {0};
	CHECK_ERR(uvmLaunchKernel(0, NULL, 0, fill, &p, sizeof p), uvmErrorInvalidValue);
	CHECK(strstr(uvmGetLastErrorMessage(), "0 threads") != NULL);
	CHECK_ERR(uvmLaunchKernel(0, NULL, 1, NULL, &p, sizeof p), uvmErrorInvalidValue);
	CHECK_ERR(uvmLaunchKernel(0, NULL, 1, fill, NULL, 8), uvmErrorInvalidValue);
	static char big[uvmMaxKernelParams + 1];
	CHECK_ERR(uvmLaunchKernel(0, NULL, 1, fill, big, sizeof big), uvmErrorInvalidValue);
	CHECK(strstr(uvmGetLastErrorMessage(), "4097 bytes") != NULL);
	CHECK_ERR(uvmLaunchKernel(NDEVICES, NULL, 1, fill, &p, sizeof p), uvmErrorInvalidDevice);
	CHECK_ERR(uvmLaunchKernel(-1, NULL, 1, fill, &p, sizeof p), uvmErrorInvalidDevice);
	/* None of that reached a device: they still work. */
	CHECK_OK(uvmLaunchKernel(0, NULL, 1, fill, &p, sizeof p)); /* n = 0: writes nothing */
	CHECK_OK(uvmDeviceSynchronize());
}

/* saw_params records, in a global of the device process, what params
 * pointer a kernel got; report copies it to managed memory. */
static const void *saw_params;
static void record_params(unsigned tid, unsigned nthreads, const void *params)
{
	(void)tid, (void)nthreads;
	saw_params = params;
}

static void report_params(unsigned tid, unsigned nthreads, const void *params)
{
	(void)tid, (void)nthreads;
	**(int *const *)params = saw_params == NULL;
}

/* A launch without params gives the kernel NULL, not the buffer of the
 * launch before it. */
static void test_no_params_is_null(void)
{
	int *out;
	CHECK_OK(uvmMallocManaged((void **)&out, sizeof *out, uvmMemAttachGlobal));
	if (!out)
		return;
	*out = -1;
	CHECK_OK(uvmLaunchKernel(0, NULL, 1, record_params, NULL, 0));
	CHECK_OK(uvmLaunchKernel(0, NULL, 1, report_params, &out, sizeof out));
	CHECK_OK(uvmDeviceSynchronize());
	CHECK(*out == 1);
	CHECK_OK(uvmFree(out));
}

int main(void)
{
	test_count_and_attributes();
	test_set_get_device();
	test_bad_launches();
	test_launch_writes_managed_memory();
	test_params_are_copied();
	test_no_params_is_null();
	test_streams();
	test_crash_is_reported_and_survived();
	test_concurrent_launches();
	return check_done("device_test");
}
