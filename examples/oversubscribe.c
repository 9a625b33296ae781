/*
 * oversubscribe.c: a kernel working through more managed memory than its
 * device has.
 *
 * It asks device 0's arena capacity (uvmDevAttrArenaCapacityMiB, the
 * device's memory), allocates FACTOR times that (default 2) as one
 * managed range, and runs PASSES kernels over it. Each pass's threads
 * walk their share of the range a page at a time: every 8-byte word is
 * checked against what the previous pass wrote (zeros before the first)
 * and overwritten with this pass's pattern. The range cannot fit, so
 * while a kernel runs the arena fills and the fault server evicts its
 * least recently migrated 2 MiB blocks to the host; the next pass faults
 * them back in, evicting others. Nothing may be lost on the way: a word
 * the kernel finds wrong is counted, and at the end the host reads every
 * word of every page (faulting home what the device still holds).
 *
 * It prints the bytes and throughput of each pass and of the host's check,
 * and "oversubscribe: OK"; it exits 1 on any wrong word or failed call.
 *
 * Usage: oversubscribe [-factor F] [-passes P] [-threads T] [-device N]
 * The arena is UVM_ARENA_SIZE (default 1 GiB): set it smaller, e.g.
 * UVM_ARENA_SIZE=64MiB, for a quick run.
 */
#define _GNU_SOURCE
#include <getopt.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <uvm.h>

#define PAGE_SIZE 4096u
#define WORDS_PER_PAGE (PAGE_SIZE / sizeof(uint64_t))

#define CHECK(call)                                                                                \
	do {                                                                                       \
		uvmError_t err_ = (call);                                                          \
		if (err_ != uvmSuccess) {                                                          \
			fprintf(stderr, "oversubscribe: %s failed: %s (%s)\n", #call,              \
				uvmGetLastErrorMessage(), uvmGetErrorName(err_));                  \
			exit(1);                                                                   \
		}                                                                                  \
	} while (0)

/* A thread's mismatch counter, alone on its cache line so that threads
 * do not share lines. The counters are managed memory too: the kernel
 * writes them in the device process and the host reads them after the
 * synchronize. */
struct counter {
	uint64_t wrong;
	uint64_t first_wrong; /* page index + 1 of the first wrong word, 0 if none */
	char pad[48];
};

struct pass_params {
	uint64_t *buf; /* managed */
	size_t pages;
	unsigned pass; /* 1, 2, ... */
	struct counter *counters; /* managed, one per thread */
};

/* pattern is the word w of page pg after pass p: distinct for every
 * word, page and pass, so a page that came back stale, from another
 * address, or zeroed is caught. Pass 0 is the fresh range: zeros. */
static inline uint64_t pattern(size_t pg, size_t w, unsigned p)
{
	if (p == 0)
		return 0;
	return ((uint64_t)p << 56) ^ ((uint64_t)pg << 9) ^ w ^ 0x5a5a000000000000ull;
}

/* pass_kernel: thread tid checks and rewrites its contiguous share of the
 * pages, in order, so that each thread streams through the range and the
 * arena's least-recently-migrated order evicts what the thread is done
 * with. */
static void pass_kernel(unsigned tid, unsigned nthreads, const void *params)
{
	const struct pass_params *p = params;
	size_t lo = p->pages * tid / nthreads, hi = p->pages * (tid + 1) / nthreads;
	uint64_t wrong = 0, first = 0;
	for (size_t pg = lo; pg < hi; pg++) {
		uint64_t *page = p->buf + pg * WORDS_PER_PAGE;
		for (size_t w = 0; w < WORDS_PER_PAGE; w++) {
			if (page[w] != pattern(pg, w, p->pass - 1)) {
				if (!wrong)
					first = pg + 1;
				wrong++;
			}
			page[w] = pattern(pg, w, p->pass);
		}
	}
	p->counters[tid].wrong = wrong;
	p->counters[tid].first_wrong = first;
}

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

static int parse_long(const char *flag, const char *s, long lo, long hi, long *out)
{
	char *end;
	long v = strtol(s, &end, 10);
	if (*s == '\0' || *end != '\0' || v < lo || v > hi) {
		fprintf(stderr, "oversubscribe: %s %s: want a whole number from %ld to %ld\n", flag, s, lo, hi);
		return -1;
	}
	*out = v;
	return 0;
}

static void usage(FILE *f)
{
	fprintf(f, "Usage: oversubscribe [-factor F] [-passes P] [-threads T] [-device N]\n"
		   "  -factor F   managed memory as a multiple of the device's arena (default 2)\n"
		   "  -passes P   kernels over the whole range (default 3)\n"
		   "  -threads T  kernel threads (default: the device's workers)\n"
		   "  -device N   the device (default 0)\n"
		   "The arena is UVM_ARENA_SIZE (default 1GiB).\n");
}

int main(int argc, char **argv)
{
	long factor = 2, passes = 3, threads = 0, device = 0;
	static const struct option opts[] = {
		{"factor", required_argument, NULL, 'f'},
		{"passes", required_argument, NULL, 'p'},
		{"threads", required_argument, NULL, 't'},
		{"device", required_argument, NULL, 'd'},
		{"help", no_argument, NULL, 'h'},
		{0},
	};
	int c;
	while ((c = getopt_long_only(argc, argv, "", opts, NULL)) != -1) {
		switch (c) {
		case 'f':
			if (parse_long("-factor", optarg, 1, 64, &factor))
				return 2;
			break;
		case 'p':
			if (parse_long("-passes", optarg, 1, 1000, &passes))
				return 2;
			break;
		case 't':
			if (parse_long("-threads", optarg, 1, 4096, &threads))
				return 2;
			break;
		case 'd':
			if (parse_long("-device", optarg, 0, 1000, &device))
				return 2;
			break;
		case 'h':
			usage(stdout);
			return 0;
		default:
			usage(stderr);
			return 2;
		}
	}
	if (optind < argc) {
		fprintf(stderr, "oversubscribe: unexpected argument %s\n", argv[optind]);
		usage(stderr);
		return 2;
	}

	int ndevices;
	CHECK(uvmGetDeviceCount(&ndevices));
	if (device >= ndevices) {
		fprintf(stderr, "oversubscribe: -device %ld: the server has %d (UVM_DEVICES sets how many)\n", device,
			ndevices);
		return 1;
	}
	int arena_mib, workers;
	CHECK(uvmDeviceGetAttribute(&arena_mib, uvmDevAttrArenaCapacityMiB, (int)device));
	CHECK(uvmDeviceGetAttribute(&workers, uvmDevAttrMultiProcessorCount, (int)device));
	if (threads == 0)
		threads = workers;
	size_t bytes = (size_t)factor * (size_t)arena_mib << 20;
	size_t pages = bytes / PAGE_SIZE;
	if (factor == 1)
		printf("oversubscribe: note: -factor 1 fits the arena exactly; nothing needs to be evicted\n");
	printf("oversubscribe: device %ld has a %d MiB arena (%d workers); %zu MiB of managed memory (%ldx), "
	       "%ld passes of %ld kernel threads\n",
	       device, arena_mib, workers, bytes >> 20, factor, passes, threads);

	uint64_t *buf;
	struct counter *counters;
	CHECK(uvmMallocManaged((void **)&buf, bytes, uvmMemAttachGlobal));
	CHECK(uvmMallocManaged((void **)&counters, (size_t)threads * sizeof *counters, uvmMemAttachGlobal));
	/* uvmDeviceSynchronize waits for the current device. */
	CHECK(uvmSetDevice((int)device));

	for (unsigned pass = 1; pass <= (unsigned)passes; pass++) {
		memset(counters, 0xff, (size_t)threads * sizeof *counters); /* a thread that never ran shows up */
		struct pass_params params = {.buf = buf, .pages = pages, .pass = pass, .counters = counters};
		double t0 = now_s();
		CHECK(uvmLaunchKernel((int)device, NULL, (unsigned)threads, pass_kernel, &params, sizeof params));
		CHECK(uvmDeviceSynchronize());
		double secs = now_s() - t0;
		uint64_t wrong = 0;
		for (long t = 0; t < threads; t++) {
			if (counters[t].wrong) {
				fprintf(stderr,
					"oversubscribe: pass %u: kernel thread %ld found %llu wrong words, the first in page %llu "
					"(want pass %u's pattern)\n",
					pass, t, (unsigned long long)counters[t].wrong,
					(unsigned long long)counters[t].first_wrong - 1, pass - 1);
				wrong += counters[t].wrong;
			}
		}
		if (wrong) {
			fprintf(stderr, "oversubscribe: FAILED: data lost between passes\n");
			return 1;
		}
		printf("  pass %u: kernel checked and rewrote %zu MiB in %8.1f ms: %7.1f MiB/s%s\n", pass, bytes >> 20,
		       secs * 1e3, (bytes >> 20) / secs,
		       pass == 1 ? " (every page created on the device, the oldest evicted as the arena fills)"
				 : " (pages fault in from the host, evicting others)");
		fflush(stdout);
	}

	/* The host reads everything: pages still in the arena fault home,
	 * the evicted ones are already here. */
	double t0 = now_s();
	size_t wrong = 0;
	for (size_t pg = 0; pg < pages; pg++) {
		const uint64_t *page = buf + pg * WORDS_PER_PAGE;
		for (size_t w = 0; w < WORDS_PER_PAGE; w++) {
			if (page[w] != pattern(pg, w, (unsigned)passes)) {
				if (wrong < 10)
					fprintf(stderr, "oversubscribe: page %zu word %zu holds %#llx, want %#llx\n", pg, w,
						(unsigned long long)page[w],
						(unsigned long long)pattern(pg, w, (unsigned)passes));
				wrong++;
			}
		}
	}
	double secs = now_s() - t0;
	printf("  host verified %zu MiB in %8.1f ms: %7.1f MiB/s\n", bytes >> 20, secs * 1e3, (bytes >> 20) / secs);
	CHECK(uvmFree(counters));
	CHECK(uvmFree(buf));
	if (wrong) {
		fprintf(stderr, "oversubscribe: FAILED: %zu wrong words\n", wrong);
		return 1;
	}
	printf("oversubscribe: OK\n");
	return 0;
}
