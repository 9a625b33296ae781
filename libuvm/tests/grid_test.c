/*
 * grid_test.c: grid launches (uvmLaunchGrid, uvmLaunchCooperativeKernel)
 * through uvm.h alone: indices and dimensions of 3-D grids, block
 * barriers with blocks far larger than the device's workers, shared
 * memory that is the block's and no other's, a cooperative grid's
 * barrier, occupancy, shapes refused, the stack limit. Run by
 * integration/libuvm_test.go with a private server, 2 devices of 2
 * workers and 64 MiB arenas.
 *
 * Every value a kernel writes is checked against what the host computes
 * on its own from the launch's shape, never from what the kernel read.
 */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "check.h"

#define WORKERS 2 /* UVM_DEVICE_WORKERS in integration/libuvm_test.go */

static uint64_t linear(uvmDim3 i, uvmDim3 d) { return i.x + (uint64_t)d.x * (i.y + (uint64_t)d.y * i.z); }

/* ---- every (block, thread) exactly once, with its coordinates ---- */

struct visit {
	uint32_t count;
	uvmDim3 thread, block, block_dim, grid_dim;
};

struct visit_params {
	struct visit *v;
};

static void visit_kernel(const void *params)
{
	const struct visit_params *p = params;
	uint64_t b = linear(uvmBlockIdx, uvmGridDim), t = linear(uvmThreadIdx, uvmBlockDim);
	struct visit *v = &p->v[b * (uvmBlockDim.x * uvmBlockDim.y * uvmBlockDim.z) + t];
	__atomic_fetch_add(&v->count, 1, __ATOMIC_RELAXED);
	v->thread = uvmThreadIdx;
	v->block = uvmBlockIdx;
	v->block_dim = uvmBlockDim;
	v->grid_dim = uvmGridDim;
}

static void test_indices(uvmDim3 grid, uvmDim3 block, const char *what)
{
	uint64_t nb = (uint64_t)grid.x * grid.y * grid.z, nt = (uint64_t)block.x * block.y * block.z, n = nb * nt;
	struct visit_params p;
	CHECK_OK(uvmMallocManaged((void **)&p.v, n * sizeof *p.v, uvmMemAttachGlobal));
	memset(p.v, 0, n * sizeof *p.v);
	CHECK_OK(uvmLaunchGrid(0, NULL, grid, block, 0, visit_kernel, &p, sizeof p));
	CHECK_OK(uvmDeviceSynchronize());
	uint64_t bad = 0;
	for (uint64_t b = 0; b < nb; b++)
		for (uint64_t t = 0; t < nt; t++) {
			const struct visit *v = &p.v[b * nt + t];
			/* The coordinates of slot (b, t), from the shape alone. */
			uvmDim3 eb = {(unsigned)(b % grid.x), (unsigned)(b / grid.x % grid.y), (unsigned)(b / ((uint64_t)grid.x * grid.y))};
			uvmDim3 et = {(unsigned)(t % block.x), (unsigned)(t / block.x % block.y), (unsigned)(t / ((uint64_t)block.x * block.y))};
			if (v->count != 1 || memcmp(&v->block, &eb, sizeof eb) || memcmp(&v->thread, &et, sizeof et) ||
			    memcmp(&v->block_dim, &block, sizeof block) || memcmp(&v->grid_dim, &grid, sizeof grid)) {
				if (bad++ < 3)
					fprintf(stderr, "%s: block %llu thread %llu: visited %u times as block (%u,%u,%u) thread (%u,%u,%u) of (%u,%u,%u) in (%u,%u,%u)\n",
						what, (unsigned long long)b, (unsigned long long)t, v->count, v->block.x, v->block.y, v->block.z, v->thread.x,
						v->thread.y, v->thread.z, v->block_dim.x, v->block_dim.y, v->block_dim.z, v->grid_dim.x, v->grid_dim.y,
						v->grid_dim.z);
			}
		}
	CHECK(bad == 0);
	CHECK_OK(uvmFree(p.v));
}

/* ---- a block barrier: write shared memory, wait, read a neighbour's ---- */

struct neighbour_params {
	uint64_t *out;
	unsigned rounds;
};

static uint64_t stamp(uint64_t block, unsigned thread, unsigned round) { return block << 32 | (uint64_t)round << 16 | thread; }

/* Each round, every thread writes its stamp into its slot of the block's
 * shared memory, waits, reads the slot of the thread after it, waits
 * again (so that nobody overwrites a slot another still has to read), and
 * adds what it read into its output. */
static void neighbour_kernel(const void *params)
{
	const struct neighbour_params *p = params;
	uint64_t *shared = uvmDynamicShared();
	unsigned n = uvmBlockDim.x, t = uvmThreadIdx.x;
	uint64_t b = uvmBlockIdx.x, sum = 0;
	for (unsigned r = 0; r < p->rounds; r++) {
		shared[t] = stamp(b, t, r);
		uvmSyncThreads();
		sum += shared[(t + 1) % n];
		uvmSyncThreads();
	}
	p->out[b * n + t] = sum;
}

static void test_barrier(unsigned blocks, unsigned threads, unsigned rounds)
{
	struct neighbour_params p = {.rounds = rounds};
	size_t n = (size_t)blocks * threads;
	CHECK_OK(uvmMallocManaged((void **)&p.out, n * sizeof *p.out, uvmMemAttachGlobal));
	memset(p.out, 0xff, n * sizeof *p.out);
	CHECK_OK(uvmLaunchGrid(0, NULL, (uvmDim3){blocks, 1, 1}, (uvmDim3){threads, 1, 1}, threads * sizeof(uint64_t), neighbour_kernel, &p, sizeof p));
	CHECK_OK(uvmDeviceSynchronize());
	size_t bad = 0;
	for (unsigned b = 0; b < blocks; b++)
		for (unsigned t = 0; t < threads; t++) {
			uint64_t want = 0;
			for (unsigned r = 0; r < rounds; r++)
				want += stamp(b, (t + 1) % threads, r);
			if (p.out[(size_t)b * threads + t] != want && bad++ < 3)
				fprintf(stderr, "barrier, %u blocks of %u threads, %u rounds: block %u thread %u read %#llx, want %#llx\n", blocks, threads,
					rounds, b, t, (unsigned long long)p.out[(size_t)b * threads + t], (unsigned long long)want);
		}
	CHECK(bad == 0);
	CHECK_OK(uvmFree(p.out));
}

/* ---- shared memory is the block's: blocks running at once on both
 * workers fill it with their own number, wait, and find only that ---- */

struct isolation_params {
	uint32_t *wrong; /* per block: slots that held another block's number */
	unsigned words;
	unsigned rounds;
};

static void isolation_kernel(const void *params)
{
	const struct isolation_params *p = params;
	volatile uint32_t *shared = uvmDynamicShared();
	unsigned n = uvmBlockDim.x, t = uvmThreadIdx.x;
	uint32_t me = uvmBlockIdx.x + 1, wrong = 0;
	for (unsigned r = 0; r < p->rounds; r++) {
		for (unsigned i = t; i < p->words; i += n)
			shared[i] = me;
		uvmSyncThreads();
		for (unsigned i = 0; i < p->words; i++)
			wrong += shared[i] != me;
		uvmSyncThreads();
	}
	__atomic_fetch_add(&p->wrong[uvmBlockIdx.x], wrong, __ATOMIC_RELAXED);
}

static void test_isolation(void)
{
	const unsigned blocks = 64, threads = 64;
	struct isolation_params p = {.words = 2048, .rounds = 8};
	CHECK_OK(uvmMallocManaged((void **)&p.wrong, blocks * sizeof *p.wrong, uvmMemAttachGlobal));
	memset(p.wrong, 0, blocks * sizeof *p.wrong);
	CHECK_OK(uvmLaunchGrid(0, NULL, (uvmDim3){blocks, 1, 1}, (uvmDim3){threads, 1, 1}, p.words * sizeof(uint32_t), isolation_kernel, &p, sizeof p));
	CHECK_OK(uvmDeviceSynchronize());
	uint64_t wrong = 0;
	for (unsigned b = 0; b < blocks; b++)
		wrong += p.wrong[b];
	if (wrong)
		fprintf(stderr, "isolation: %llu reads of shared memory found another block's number\n", (unsigned long long)wrong);
	CHECK(wrong == 0);
	CHECK_OK(uvmFree(p.wrong));
}

/* ---- the counting barriers ---- */

struct count_params {
	int *out; /* per block: count, and, or, of three predicates */
};

static void count_kernel(const void *params)
{
	const struct count_params *p = params;
	unsigned t = uvmThreadIdx.x, b = uvmBlockIdx.x;
	int c = uvmSyncThreadsCount(t % 3 == 0);    /* ceil(n/3) */
	int all = uvmSyncThreadsAnd(t < uvmBlockDim.x - b); /* block 0 only */
	int any = uvmSyncThreadsOr(t == b * 100);    /* blocks with b * 100 < n */
	if (t == 0) {
		p->out[b * 3] = c;
		p->out[b * 3 + 1] = all;
		p->out[b * 3 + 2] = any;
	}
}

static void test_counts(void)
{
	const unsigned blocks = 4, threads = 300;
	struct count_params p;
	CHECK_OK(uvmMallocManaged((void **)&p.out, blocks * 3 * sizeof *p.out, uvmMemAttachGlobal));
	CHECK_OK(uvmLaunchGrid(0, NULL, (uvmDim3){blocks, 1, 1}, (uvmDim3){threads, 1, 1}, 0, count_kernel, &p, sizeof p));
	CHECK_OK(uvmDeviceSynchronize());
	for (unsigned b = 0; b < blocks; b++) {
		CHECK(p.out[b * 3] == (int)((threads + 2) / 3));
		CHECK(p.out[b * 3 + 1] == (b == 0));
		CHECK(p.out[b * 3 + 2] == (b * 100 < threads));
	}
	CHECK_OK(uvmFree(p.out));
}

/* ---- a cooperative grid's barrier: each block writes its part, waits
 * for the whole grid, reads another block's ---- */

struct coop_params {
	int64_t *a, *out;
	unsigned rounds;
};

static void coop_kernel(const void *params)
{
	const struct coop_params *p = params;
	uint64_t threads = (uint64_t)uvmBlockDim.x * uvmGridDim.x, me = uvmBlockIdx.x * (uint64_t)uvmBlockDim.x + uvmThreadIdx.x;
	int64_t sum = 0;
	for (unsigned r = 0; r < p->rounds; r++) {
		p->a[me] = (int64_t)(me * 1000 + r);
		uvmGridSync();
		sum += p->a[(me + threads / 2 + uvmBlockDim.x / 2) % threads];
		uvmGridSync();
	}
	p->out[me] = sum;
}

static void test_cooperative(void)
{
	int per = 0, mp = 0;
	CHECK_OK(uvmOccupancyMaxActiveBlocksPerMultiprocessor(&per, (const void *)coop_kernel, 64, 0));
	CHECK_OK(uvmDeviceGetAttribute(&mp, uvmDevAttrMultiProcessorCount, 0));
	CHECK(per == 32 && mp == WORKERS);
	/* Every block of the largest grid the device keeps resident. */
	unsigned blocks = (unsigned)(per * mp), threads = 64;
	uint64_t n = (uint64_t)blocks * threads;
	struct coop_params p = {.rounds = 3};
	CHECK_OK(uvmMallocManaged((void **)&p.a, n * sizeof *p.a, uvmMemAttachGlobal));
	CHECK_OK(uvmMallocManaged((void **)&p.out, n * sizeof *p.out, uvmMemAttachGlobal));
	for (uint64_t i = 0; i < n; i++)
		p.a[i] = -1;
	CHECK_OK(uvmLaunchCooperativeKernel(0, NULL, (uvmDim3){blocks, 1, 1}, (uvmDim3){threads, 1, 1}, 0, coop_kernel, &p, sizeof p));
	CHECK_OK(uvmDeviceSynchronize());
	uint64_t bad = 0;
	for (uint64_t i = 0; i < n; i++) {
		uint64_t j = (i + n / 2 + threads / 2) % n;
		int64_t want = 0;
		for (unsigned r = 0; r < p.rounds; r++)
			want += (int64_t)(j * 1000 + r);
		if (p.out[i] != want && bad++ < 3)
			fprintf(stderr, "cooperative: thread %llu read %lld, want %lld\n", (unsigned long long)i, (long long)p.out[i], (long long)want);
	}
	CHECK(bad == 0);

	/* One block more than fit: refused, naming both numbers. */
	CHECK_ERR(uvmLaunchCooperativeKernel(0, NULL, (uvmDim3){blocks + 1, 1, 1}, (uvmDim3){threads, 1, 1}, 0, coop_kernel, &p, sizeof p),
		  uvmErrorCooperativeLaunchTooLarge);
	char want[64];
	snprintf(want, sizeof want, "%u blocks", blocks + 1);
	CHECK(strstr(uvmGetLastErrorMessage(), want) != NULL);
	snprintf(want, sizeof want, "at most %u", blocks);
	CHECK(strstr(uvmGetLastErrorMessage(), want) != NULL);
	uvmGetLastError();
	CHECK_OK(uvmFree(p.a));
	CHECK_OK(uvmFree(p.out));
}

/* ---- a grid barrier outside a cooperative launch is a kernel crash ---- */

static void grid_sync_kernel(const void *params)
{
	(void)params;
	uvmGridSync();
}

static void test_grid_sync_refused(void)
{
	CHECK_OK(uvmLaunchGrid(1, NULL, (uvmDim3){2, 1, 1}, (uvmDim3){4, 1, 1}, 0, grid_sync_kernel, NULL, 0));
	CHECK_OK(uvmSetDevice(1));
	CHECK_ERR(uvmDeviceSynchronize(), uvmErrorLaunchFailure);
	/* A grid launch is refused by a failed device, as a thread launch
	 * is, and every synchronize reports the failure again. */
	CHECK_ERR(uvmLaunchGrid(1, NULL, (uvmDim3){1, 1, 1}, (uvmDim3){1, 1, 1}, 0, grid_sync_kernel, NULL, 0), uvmErrorLaunchFailure);
	CHECK_ERR(uvmDeviceSynchronize(), uvmErrorLaunchFailure);
	uvmGetLastError();
	CHECK_OK(uvmDeviceReset()); /* a crash fails the device until then */
	CHECK_OK(uvmSetDevice(0));
}

/* ---- occupancy and shapes refused ---- */

static void test_limits(void)
{
	int n = -1;
	struct {
		int block;
		size_t shared;
		int want;
	} occ[] = {{1, 0, 32}, {32, 0, 32}, {64, 0, 32}, {65, 0, 31}, {256, 0, 8}, {1000, 0, 2}, {1024, 0, 2},
		   {1025, 0, 0}, {32, 48 << 10, 32}, {32, (48 << 10) + 1, 0}};
	for (size_t i = 0; i < sizeof occ / sizeof occ[0]; i++) {
		CHECK_OK(uvmOccupancyMaxActiveBlocksPerMultiprocessor(&n, (const void *)visit_kernel, occ[i].block, occ[i].shared));
		if (n != occ[i].want)
			fprintf(stderr, "occupancy of blocks of %d threads with %zu bytes: %d, want %d\n", occ[i].block, occ[i].shared, n, occ[i].want);
		CHECK(n == occ[i].want);
	}
	CHECK_ERR(uvmOccupancyMaxActiveBlocksPerMultiprocessor(&n, (const void *)visit_kernel, 0, 0), uvmErrorInvalidValue);
	CHECK_ERR(uvmOccupancyMaxActiveBlocksPerMultiprocessor(&n, NULL, 32, 0), uvmErrorInvalidValue);

	/* The block size that keeps the most threads resident, the largest
	 * first, and the grid that fills the device's workers with it. */
	int workers = 0, grid = -1, size = -1;
	CHECK_OK(uvmDeviceGetAttribute(&workers, uvmDevAttrMultiProcessorCount, 0));
	struct {
		int limit;
		size_t shared;
		int size, blocks;
	} best[] = {{0, 0, 1024, 2}, {1000000, 0, 1024, 2}, {1023, 0, 512, 4}, {100, 0, 64, 32}, {40, 0, 40, 32}, {0, 48 << 10, 1024, 2}};
	for (size_t i = 0; i < sizeof best / sizeof best[0]; i++) {
		CHECK_OK(uvmOccupancyMaxPotentialBlockSize(&grid, &size, (const void *)visit_kernel, best[i].shared, best[i].limit));
		if (size != best[i].size || grid != best[i].blocks * workers)
			fprintf(stderr, "potential block size with limit %d and %zu bytes: %d in a grid of %d, want %d in %d\n", best[i].limit,
				best[i].shared, size, grid, best[i].size, best[i].blocks * workers);
		CHECK(size == best[i].size && grid == best[i].blocks * workers);
	}
	CHECK_ERR(uvmOccupancyMaxPotentialBlockSize(&grid, &size, (const void *)visit_kernel, (48 << 10) + 1, 0), uvmErrorInvalidValue);
	CHECK_ERR(uvmOccupancyMaxPotentialBlockSize(&grid, &size, (const void *)visit_kernel, 0, -1), uvmErrorInvalidValue);
	CHECK_ERR(uvmOccupancyMaxPotentialBlockSize(NULL, &size, (const void *)visit_kernel, 0, 0), uvmErrorInvalidValue);
	CHECK_ERR(uvmOccupancyMaxPotentialBlockSize(&grid, &size, NULL, 0, 0), uvmErrorInvalidValue);

	struct visit_params p = {NULL};
	struct {
		uvmDim3 grid, block;
		size_t shared;
	} bad[] = {
		{{0, 1, 1}, {1, 1, 1}, 0},      {{1, 1, 1}, {1, 0, 1}, 0},         {{1, 65536, 1}, {1, 1, 1}, 0},
		{{1, 1, 1}, {1025, 1, 1}, 0},   {{1, 1, 1}, {32, 32, 2}, 0},       {{1, 1, 1}, {1, 1, 65}, 0},
		{{1, 1, 1}, {1, 1, 1}, 48 << 10 | 1}, {{1u << 31, 1, 1}, {1, 1, 1}, 0},
	};
	for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
		CHECK_ERR(uvmLaunchGrid(0, NULL, bad[i].grid, bad[i].block, bad[i].shared, visit_kernel, &p, sizeof p), uvmErrorInvalidConfiguration);
	uvmGetLastError();
	CHECK_ERR(uvmLaunchGrid(0, NULL, (uvmDim3){1, 1, 1}, (uvmDim3){1, 1, 1}, 0, NULL, NULL, 0), uvmErrorInvalidValue);
	CHECK_ERR(uvmLaunchGrid(7, NULL, (uvmDim3){1, 1, 1}, (uvmDim3){1, 1, 1}, 0, visit_kernel, NULL, 0), uvmErrorInvalidDevice);
	uvmGetLastError();
}

/* ---- threads on fibers: their stacks, their floating point ---- */

struct stack_params {
	char (*text)[32];
	unsigned local; /* bytes of a local array each thread fills */
};

/* Each thread formats a double (vfprintf needs an aligned stack, and
 * its SSE state) after a barrier, so on a fiber for all but the first,
 * with a local array of p->local bytes on its stack. */
static void stack_kernel(const void *params)
{
	const struct stack_params *p = params;
	volatile char local[p->local];
	for (unsigned i = 0; i < p->local; i += 512)
		local[i] = (char)i;
	uvmSyncThreads();
	unsigned t = uvmThreadIdx.x;
	snprintf(p->text[t], sizeof p->text[t], "%.3f %d", t + 0.25, local[p->local - 512]);
}

static void test_stacks(void)
{
	const unsigned threads = 40;
	struct stack_params p = {.local = 200 << 10};
	size_t got = 0;
	CHECK_OK(uvmDeviceGetLimit(&got, uvmLimitStackSize));
	CHECK(got == 64 << 10);
	CHECK_ERR(uvmDeviceSetLimit(uvmLimitStackSize, 4096), uvmErrorInvalidValue);
	CHECK_ERR(uvmDeviceSetLimit((uvmLimit)1, 1 << 20), uvmErrorUnsupportedLimit);
	uvmGetLastError();
	CHECK_OK(uvmMallocManaged((void **)&p.text, threads * sizeof *p.text, uvmMemAttachGlobal));
	/* 200 KiB of locals overflow the default 64 KiB stacks: a crash,
	 * reported. */
	CHECK_OK(uvmLaunchGrid(0, NULL, (uvmDim3){1, 1, 1}, (uvmDim3){threads, 1, 1}, 0, stack_kernel, &p, sizeof p));
	CHECK_ERR(uvmDeviceSynchronize(), uvmErrorLaunchFailure);
	uvmGetLastError();
	CHECK_OK(uvmDeviceReset()); /* a crash fails the device until then */
	/* With 1 MiB they fit. */
	CHECK_OK(uvmDeviceSetLimit(uvmLimitStackSize, 1 << 20));
	CHECK_OK(uvmDeviceGetLimit(&got, uvmLimitStackSize));
	CHECK(got == 1 << 20);
	CHECK_OK(uvmLaunchGrid(0, NULL, (uvmDim3){1, 1, 1}, (uvmDim3){threads, 1, 1}, 0, stack_kernel, &p, sizeof p));
	CHECK_OK(uvmDeviceSynchronize());
	for (unsigned t = 0; t < threads; t++) {
		char want[32];
		snprintf(want, sizeof want, "%.3f %d", t + 0.25, (char)(p.local - 512));
		if (strcmp(p.text[t], want) != 0)
			fprintf(stderr, "stacks: thread %u wrote \"%s\", want \"%s\"\n", t, p.text[t], want);
		CHECK(strcmp(p.text[t], want) == 0);
	}
	CHECK_OK(uvmDeviceSetLimit(uvmLimitStackSize, 64 << 10));
	CHECK_OK(uvmFree(p.text));
}

/* ---- the old launch, beside grids on one stream ---- */

static void old_kernel(unsigned tid, unsigned nthreads, const void *params)
{
	uint32_t *out = *(uint32_t *const *)params;
	for (unsigned i = tid; i < 1000; i += nthreads)
		out[i] += i;
}

static void add_kernel(const void *params)
{
	uint32_t *out = *(uint32_t *const *)params;
	unsigned i = uvmBlockIdx.x * uvmBlockDim.x + uvmThreadIdx.x;
	if (i < 1000)
		out[i] += 2 * i;
}

static void test_mixed(void)
{
	uint32_t *out;
	uvmStream_t s;
	CHECK_OK(uvmMallocManaged((void **)&out, 1000 * sizeof *out, uvmMemAttachGlobal));
	memset(out, 0, 1000 * sizeof *out);
	CHECK_OK(uvmStreamCreate(&s));
	CHECK_OK(uvmLaunchKernel(0, s, 7, old_kernel, &out, sizeof out));
	CHECK_OK(uvmLaunchGrid(0, s, (uvmDim3){8, 1, 1}, (uvmDim3){128, 1, 1}, 0, add_kernel, &out, sizeof out));
	CHECK_OK(uvmLaunchKernel(0, s, 3, old_kernel, &out, sizeof out));
	CHECK_OK(uvmStreamSynchronize(s));
	for (unsigned i = 0; i < 1000; i++)
		CHECK(out[i] == 4 * i);
	CHECK_OK(uvmStreamDestroy(s));
	CHECK_OK(uvmFree(out));
}

int main(void)
{
	test_indices((uvmDim3){3, 4, 5}, (uvmDim3){4, 3, 2}, "3-D grid");
	test_indices((uvmDim3){2, 1, 3}, (uvmDim3){16, 8, 8}, "blocks of 1024 threads");
	test_indices((uvmDim3){1000, 1, 1}, (uvmDim3){1, 1, 1}, "1000 blocks of one thread");
	test_barrier(6, 256, 4);  /* blocks of 256 threads on 2 workers */
	test_barrier(2, 1024, 2); /* the largest block */
	test_barrier(3, 1, 2);    /* a block of one thread waits for nobody */
	test_isolation();
	test_counts();
	test_cooperative();
	test_grid_sync_refused();
	test_limits();
	test_stacks();
	test_mixed();
	return check_done("grid_test");
}
