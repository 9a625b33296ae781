/*
 * grid_bench.c: the program `uvm bench grid` runs: grid launches (CUDA's
 * blocks, barriers and shared memory) against the (tid, nthreads) launch
 * in the same run, on device 0 of a private server. The benchmark embeds
 * this file and builds it at run time against libuvm (libuvm.a and
 * uvm_cuda.h), with the C compiler.
 *
 * Usage: grid_bench ROUNDS REDUCE_MIB TOUCH_KIB...
 *
 * Each measurement is taken ROUNDS times, the variants compared taken in
 * turn within each round (which goes first alternating) so that a burst
 * of other work slows a round rather than one side, and reported as the
 * median. It prints one JSON
 * object on standard output:
 *
 *  - null_grid_us, null_threads_us: an empty kernel launched as a grid of
 *    one block of one thread, and as one thread, plus a synchronize;
 *  - barrier_ns_per_thread (by block size): one block whose threads wait
 *    at 256 barriers in a loop, less the same block without barriers,
 *    per barrier and per thread;
 *  - reduce_grid_ms, reduce_threads_ms: the sum of REDUCE_MIB of floats
 *    resident on the device, by blocks of 256 threads that each sum a
 *    contiguous share and then reduce in shared memory with a barrier a
 *    step (as CUDA's reduction sample), against one thread per worker
 *    summing a contiguous share (no blocks); both write one partial sum a
 *    block or thread, which the host adds; the results are checked;
 *  - touch (by size): the seed's launch and touch, a kernel touching one
 *    byte of every page of a managed buffer, then the host touching it
 *    back, per iteration, through the grid launch and the thread launch.
 */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "uvm_cuda.h"

static double now_us(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}

static double median(double *v, int n)
{
	qsort(v, (size_t)n, sizeof *v, cmp_double);
	return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

static void must(uvmError_t err, const char *what)
{
	if (err != uvmSuccess) {
		fprintf(stderr, "grid_bench: %s: %s\n", what, uvmGetLastErrorMessage());
		exit(1);
	}
}

/* ---- kernels ---- */

__global__ void empty_grid(void) {}

static void empty_threads(unsigned tid, unsigned n, const void *p) { (void)tid, (void)n, (void)p; }

__global__ void barriers(int count)
{
	for (int i = 0; i < count; i++)
		__syncthreads();
}

/* Each thread sums a contiguous share, then the block reduces in shared
 * memory. */
__global__ void reduce_blocks(const float *in, size_t n, double *partial)
{
	__shared__ double s[256];
	size_t threads = (size_t)gridDim.x * blockDim.x, me = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
	size_t lo = n * me / threads, hi = n * (me + 1) / threads;
	double sum = 0;
	for (size_t i = lo; i < hi; i++)
		sum += in[i];
	s[threadIdx.x] = sum;
	__syncthreads();
	for (unsigned k = blockDim.x / 2; k > 0; k >>= 1) {
		if (threadIdx.x < k)
			s[threadIdx.x] += s[threadIdx.x + k];
		__syncthreads();
	}
	if (threadIdx.x == 0)
		partial[blockIdx.x] = s[0];
}

struct reduce_params {
	const float *in;
	size_t n;
	double *partial;
};

static void reduce_threads(unsigned tid, unsigned nthreads, const void *params)
{
	const struct reduce_params *p = params;
	size_t lo = p->n * tid / nthreads, hi = p->n * (tid + 1) / nthreads;
	double sum = 0;
	for (size_t i = lo; i < hi; i++)
		sum += p->in[i];
	p->partial[tid] = sum;
}

__global__ void touch_grid(uint8_t *buf, size_t pages)
{
	size_t threads = (size_t)gridDim.x * blockDim.x, me = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
	for (size_t pg = pages * me / threads; pg < pages * (me + 1) / threads; pg++)
		buf[pg * 4096]++;
}

struct touch_params {
	uint8_t *buf;
	size_t pages;
};

static void touch_threads(unsigned tid, unsigned n, const void *params)
{
	const struct touch_params *p = params;
	for (size_t pg = p->pages * tid / n; pg < p->pages * (tid + 1) / n; pg++)
		p->buf[pg * 4096]++;
}

/* ---- measurements ---- */

static int workers;

static double time_null_grid(void)
{
	double t0 = now_us();
	must(uvmLaunchKernelGGL(empty_grid, 1, 1, 0, 0), "null grid launch");
	must(uvmDeviceSynchronize(), "null grid synchronize");
	return now_us() - t0;
}

static double time_null_threads(void)
{
	double t0 = now_us();
	must(uvmLaunchKernel(0, NULL, 1, empty_threads, NULL, 0), "null launch");
	must(uvmDeviceSynchronize(), "null synchronize");
	return now_us() - t0;
}

static double time_barriers(unsigned threads, int count)
{
	double t0 = now_us();
	must(uvmLaunchKernelGGL(barriers, 1, threads, 0, 0, count), "barrier launch");
	must(uvmDeviceSynchronize(), "barrier synchronize");
	return now_us() - t0;
}

int main(int argc, char **argv)
{
	if (argc < 3) {
		fprintf(stderr, "usage: grid_bench ROUNDS REDUCE_MIB TOUCH_KIB...\n");
		return 2;
	}
	int rounds = atoi(argv[1]);
	size_t reduce_mib = (size_t)atol(argv[2]);
	if (rounds < 1 || reduce_mib < 1) {
		fprintf(stderr, "grid_bench: want ROUNDS >= 1 and REDUCE_MIB >= 1\n");
		return 2;
	}
	must(uvmDeviceGetAttribute(&workers, uvmDevAttrMultiProcessorCount, 0), "worker count");
	double *a = calloc((size_t)rounds * 4, sizeof *a), *b = a + rounds, *c = b + rounds, *d = c + rounds;

	/* Warm up: start the device's process, and its fibers' stacks. */
	time_null_grid();
	time_null_threads();
	time_barriers(1024, 1);
	/* Each pair in turn, the first of it alternating, so that neither
	 * always follows the other. */
	for (int i = 0; i < rounds; i++) {
		if (i % 2) {
			b[i] = time_null_threads();
			a[i] = time_null_grid();
		} else {
			a[i] = time_null_grid();
			b[i] = time_null_threads();
		}
	}
	printf("{\"workers\":%d,\"null_grid_us\":%.3f,\"null_threads_us\":%.3f", workers, median(a, rounds), median(b, rounds));

	printf(",\"barrier_ns_per_thread\":{");
	const unsigned sizes[] = {32, 256, 1024};
	const int count = 256;
	for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
		for (int i = 0; i < rounds; i++) {
			if (i % 2) {
				b[i] = time_barriers(sizes[k], 0);
				a[i] = time_barriers(sizes[k], count);
			} else {
				a[i] = time_barriers(sizes[k], count);
				b[i] = time_barriers(sizes[k], 0);
			}
		}
		double per = (median(a, rounds) - median(b, rounds)) * 1e3 / count / sizes[k];
		printf("%s\"%u\":%.2f", k ? "," : "", sizes[k], per);
	}
	printf("}");

	/* The reduction: data written on the host, then moved to the device,
	 * where both versions read it. */
	size_t n = reduce_mib << 20 >> 2;
	float *in;
	double *partial;
	unsigned blocks = (unsigned)(8 * workers);
	must(uvmMallocManaged((void **)&in, n * sizeof *in, uvmMemAttachGlobal), "reduction input");
	must(uvmMallocManaged((void **)&partial, (blocks > (unsigned)workers ? blocks : (unsigned)workers) * sizeof *partial, uvmMemAttachGlobal),
	     "partial sums");
	double want = 0;
	for (size_t i = 0; i < n; i++)
		want += in[i] = (float)(i % 1000) * 0.5f;
	must(uvmMemPrefetchAsync(in, n * sizeof *in, 0, NULL), "prefetch the input");
	must(uvmMemPrefetchAsync(partial, blocks * sizeof *partial, 0, NULL), "prefetch the sums");
	must(uvmDeviceSynchronize(), "prefetch");
	struct reduce_params rp = {in, n, partial};
	for (int i = -1; i < rounds; i++) { /* round -1 warms up */
		for (int v = 0; v < 2; v++) {
			bool grid = (v == 0) == (i % 2 == 0);
			double t0 = now_us();
			if (grid)
				must(uvmLaunchKernelGGL(reduce_blocks, blocks, 256, 0, 0, (const float *)in, n, partial), "block reduction");
			else
				must(uvmLaunchKernel(0, NULL, (unsigned)workers, reduce_threads, &rp, sizeof rp), "thread reduction");
			must(uvmDeviceSynchronize(), "reduction synchronize");
			double t = (now_us() - t0) / 1e3, got = 0;
			for (unsigned j = 0; j < (grid ? blocks : (unsigned)workers); j++)
				got += partial[j];
			if (got != want) {
				fprintf(stderr, "grid_bench: the %s reduction summed %.17g, want %.17g\n", grid ? "block" : "thread", got, want);
				return 1;
			}
			/* The sums back on the device, as the input is. */
			must(uvmMemPrefetchAsync(partial, blocks * sizeof *partial, 0, NULL), "prefetch the sums");
			must(uvmDeviceSynchronize(), "prefetch");
			if (i >= 0)
				(grid ? c : d)[i] = t;
		}
	}
	printf(",\"reduce_mib\":%zu,\"reduce_blocks\":%u,\"reduce_grid_ms\":%.3f,\"reduce_threads_ms\":%.3f", reduce_mib, blocks, median(c, rounds),
	       median(d, rounds));
	uvmFree(in);
	uvmFree(partial);

	printf(",\"touch\":[");
	for (int k = 3; k < argc; k++) {
		size_t kib = (size_t)atol(argv[k]), pages = kib / 4;
		uint8_t *buf;
		must(uvmMallocManaged((void **)&buf, kib << 10, uvmMemAttachGlobal), "touch buffer");
		memset(buf, 0, kib << 10);
		struct touch_params tp = {buf, pages};
		unsigned tb = (unsigned)workers;
		for (int i = -1; i < rounds; i++) {
			for (int v = 0; v < 2; v++) {
				bool grid = (v == 0) == (i % 2 == 0);
				double t0 = now_us();
				if (grid)
					must(uvmLaunchKernelGGL(touch_grid, tb, 1, 0, 0, buf, pages), "grid touch");
				else
					must(uvmLaunchKernel(0, NULL, (unsigned)workers, touch_threads, &tp, sizeof tp), "thread touch");
				must(uvmDeviceSynchronize(), "touch synchronize");
				for (size_t pg = 0; pg < pages; pg++)
					buf[pg * 4096]++;
				if (i >= 0)
					(grid ? a : b)[i] = now_us() - t0;
			}
		}
		/* Four touches an iteration: every page counted them all. */
		for (size_t pg = 0; pg < pages; pg++)
			if (buf[pg * 4096] != (uint8_t)(4 * (rounds + 1))) {
				fprintf(stderr, "grid_bench: page %zu of the %zu KiB buffer was touched %u times, want %d\n", pg, kib, buf[pg * 4096],
					4 * (rounds + 1));
				return 1;
			}
		printf("%s{\"kib\":%zu,\"grid_us\":%.3f,\"threads_us\":%.3f}", k > 3 ? "," : "", kib, median(a, rounds), median(b, rounds));
		uvmFree(buf);
	}
	printf("]}\n");
	free(a);
	return 0;
}
