/*
 * layout_test.c: a device process's start: the layout it maps, however
 * many runs advice cut it into, and a start while advice and prefetches
 * remap the other devices' views. Run by integration/libuvm_test.go with
 * a private server, 2 devices of 2 workers and 64 MiB arenas.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "check.h"

#define PAGE 4096u

/* read_pages: out[i] = the first word of page pages[i] of base. */
struct read_params {
	const uint64_t *base;
	const uint32_t *pages;
	uint64_t *out;
	uint32_t n;
};

static void read_pages(unsigned tid, unsigned nthreads, const void *params)
{
	const struct read_params *p = params;
	for (uint32_t i = tid; i < p->n; i += nthreads)
		p->out[i] = p->base[(size_t)p->pages[i] * (PAGE / sizeof(uint64_t))];
}

/* A device whose process starts after advice cut the managed memory into
 * 100,000 runs of another file: its layout is more than one message
 * holds, and it maps it. The host writes every other page (run with
 * UVM_PREFETCH=none, so that its faults bring no neighbours), and advice
 * that device 0 accesses the whole range has the device map the host's
 * copy of each of those pages: 100,000 runs of the CPU's file between
 * runs of its own. Where the process has no mappings left for remote
 * runs (vm.max_map_count), it maps its own file, and the pages migrate
 * when the kernel touches them: it reads the same either way. */
static void test_layout_of_100000_runs(void)
{
	const uint32_t runs = 100000, pages = 2 * runs;
	const size_t words = PAGE / sizeof(uint64_t);
	uint64_t *a;
	CHECK_OK(uvmMallocManaged((void **)&a, (size_t)pages * PAGE, uvmMemAttachGlobal));
	if (!a)
		return;
	CHECK_OK(uvmDeviceReset()); /* no process: the next launch starts one */
	for (uint32_t r = 0; r < runs; r++)
		a[(size_t)2 * r * words] = 0x1000 + r;
	CHECK_OK(uvmMemAdvise(a, (size_t)pages * PAGE, uvmMemAdviseSetAccessedBy, 0));

	/* Pages of each kind, spread over the range. */
	enum { SAMPLES = 256 };
	uint32_t *sample;
	uint64_t *got;
	CHECK_OK(uvmMallocManaged((void **)&sample, SAMPLES * sizeof *sample, uvmMemAttachGlobal));
	CHECK_OK(uvmMallocManaged((void **)&got, SAMPLES * sizeof *got, uvmMemAttachGlobal));
	for (uint32_t i = 0; i < SAMPLES; i++) {
		sample[i] = (uint32_t)((uint64_t)i * (pages - 1) / (SAMPLES - 1));
		got[i] = 1;
	}
	struct read_params p = {.base = a, .pages = sample, .out = got, .n = SAMPLES};
	CHECK_OK(uvmLaunchKernel(0, NULL, 2, read_pages, &p, sizeof p));
	CHECK_OK(uvmDeviceSynchronize());
	int wrong = 0;
	for (uint32_t i = 0; i < SAMPLES; i++)
		wrong += got[i] != (sample[i] % 2 ? 0 : 0x1000 + sample[i] / 2);
	CHECK(wrong == 0);
	CHECK_OK(uvmFree(sample));
	CHECK_OK(uvmFree(got));
	CHECK_OK(uvmFree(a));
}

/* churn: advice and prefetches that remap device 0's view, until stop. */
struct churn {
	char *p;
	size_t size;
	bool stop;
	int failures;
	unsigned rounds;
};

static void *churn(void *arg)
{
	struct churn *c = arg;
	uvmStream_t st;
	if (uvmSetDevice(1) != uvmSuccess || uvmStreamCreate(&st) != uvmSuccess) {
		c->failures++;
		return NULL;
	}
	while (!__atomic_load_n(&c->stop, __ATOMIC_ACQUIRE)) {
		for (size_t off = 0; off < c->size; off += PAGE)
			c->p[off]++; /* on the host: remote mappings of device 0 follow it */
		c->failures += uvmMemAdvise(c->p, c->size, uvmMemAdviseSetAccessedBy, 0) != uvmSuccess;
		c->failures += uvmMemAdvise(c->p, c->size / 2, uvmMemAdviseSetPreferredLocation, uvmCpuDeviceId) != uvmSuccess;
		c->failures += uvmMemPrefetchAsync(c->p, c->size, 1, st) != uvmSuccess;
		c->failures += uvmMemPrefetchAsync(c->p, c->size, uvmCpuDeviceId, st) != uvmSuccess;
		c->failures += uvmStreamSynchronize(st) != uvmSuccess;
		c->failures += uvmMemAdvise(c->p, c->size / 2, uvmMemAdviseUnsetPreferredLocation, 0) != uvmSuccess;
		c->failures += uvmMemAdvise(c->p, c->size, uvmMemAdviseUnsetAccessedBy, 0) != uvmSuccess;
		c->rounds++;
	}
	uvmStreamDestroy(st);
	return NULL;
}

static void set_word(unsigned tid, unsigned nthreads, const void *params)
{
	(void)tid, (void)nthreads;
	const struct read_params *p = params;
	p->out[0] = p->n;
}

/* A device process starts 1,000 times while another thread's advice and
 * prefetches remap device 0's view: each start answers its ready before
 * any map reaches it, so every launch runs (a map read as the answer
 * failed the start, and left the server waiting 10 s for the device). */
static void test_start_beside_remaps(void)
{
	struct churn c = {.size = 2u << 20};
	CHECK_OK(uvmMallocManaged((void **)&c.p, c.size, uvmMemAttachGlobal));
	uint64_t *word;
	CHECK_OK(uvmMallocManaged((void **)&word, sizeof *word, uvmMemAttachGlobal));
	if (!c.p || !word)
		return;
	pthread_t t;
	CHECK(pthread_create(&t, NULL, churn, &c) == 0);
	int failed = 0, wrong = 0;
	for (uint32_t i = 1; i <= 1000; i++) {
		struct read_params p = {.out = word, .n = i};
		failed += uvmDeviceReset() != uvmSuccess;
		failed += uvmLaunchKernel(0, NULL, 1, set_word, &p, sizeof p) != uvmSuccess;
		failed += uvmDeviceSynchronize() != uvmSuccess;
		wrong += *word != i;
		if (failed) {
			fprintf(stderr, "start %u: %s\n", i, uvmGetLastErrorMessage());
			break;
		}
	}
	__atomic_store_n(&c.stop, true, __ATOMIC_RELEASE);
	pthread_join(t, NULL);
	CHECK(failed == 0);
	CHECK(wrong == 0);
	CHECK(c.failures == 0);
	CHECK(c.rounds > 0);
	CHECK_OK(uvmFree(word));
	CHECK_OK(uvmFree(c.p));
}

int main(void)
{
	test_layout_of_100000_runs();
	test_start_beside_remaps();
	return check_done("layout_test");
}
