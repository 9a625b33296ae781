/*
 * launch_touch.c: the launch-and-touch experiment of "Managed Memory:
 * Belated Comments on Implementation" (the cudahandbook's usPerLaunch),
 * ported to softuvm's C API.
 *
 * For each buffer size (0, 4, 8, ... KB) it allocates managed memory and,
 * per iteration,
 *   1. launches a kernel on a device that adds one to the first byte of
 *      every 4 KiB page: each page the kernel touches faults and migrates
 *      to the device, as a GPU kernel's first access does;
 *   2. synchronizes with the device (uvmDeviceSynchronize, the article's
 *      cudaThreadSynchronize);
 *   3. touches the first byte of every page on the host, which faults
 *      each page back home.
 * It prints the mean time of an iteration and the bandwidth at which the
 * buffer came back to the host (bytes per microsecond = MB/s), the
 * article's table. At 0 KB it is a null launch plus a synchronize.
 *
 * This is what `uvm bench launch` measures with Go kernels; the kernel
 * here is an ordinary C function of this program, run by the device's
 * worker threads in the device process (a fork of this one).
 *
 * Usage: launch_touch [-n ITERATIONS] [-max KB] [-device N]
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

/* CHECK runs a uvm call and exits with the library's own words if it
 * fails: every call that can fail is checked, as a CUDA program should. */
#define CHECK(call)                                                                                \
	do {                                                                                       \
		uvmError_t err_ = (call);                                                          \
		if (err_ != uvmSuccess) {                                                          \
			fprintf(stderr, "launch_touch: %s failed: %s (%s)\n", #call,               \
				uvmGetLastErrorMessage(), uvmGetErrorName(err_));                  \
			exit(1);                                                                   \
		}                                                                                  \
	} while (0)

/* The kernel's parameters: copied at each launch, as CUDA copies kernel
 * arguments, so the kernel sees them even though the device process's
 * view of ordinary memory is a snapshot from when it started. */
struct touch_params {
	unsigned char *buf; /* managed memory: the same pointer on the host and the device */
	size_t pages;
};

/* touch_kernel: thread tid of nthreads adds one to the first byte of
 * every page of its contiguous share of the buffer. Contiguous shares keep
 * each thread's faults sequential, so the fault server's density prefetch
 * brings whole neighbourhoods with one fault, as on a GPU. */
static void touch_kernel(unsigned tid, unsigned nthreads, const void *params)
{
	const struct touch_params *p = params;
	size_t lo = p->pages * tid / nthreads, hi = p->pages * (tid + 1) / nthreads;
	for (size_t pg = lo; pg < hi; pg++)
		((volatile unsigned char *)p->buf)[pg * PAGE_SIZE]++;
}

/* null_kernel: the 0 KB row, a launch with nothing to do. */
static void null_kernel(unsigned tid, unsigned nthreads, const void *params)
{
	(void)tid;
	(void)nthreads;
	(void)params;
}

static double now_us(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return (x > y) - (x < y);
}

/* One row of the table. */
struct row {
	size_t kb;
	double mean_us, median_us;
};

/* us_per_launch is the article's usPerLaunch: iterations of launch,
 * synchronize and host touch over kb KB of managed memory. The first
 * iteration is a warm-up and is not timed: it starts the device process
 * and creates the pages (first touch), which the later ones only move. */
static struct row us_per_launch(int device, int workers, int iterations, size_t kb, double *lat)
{
	size_t pages = kb * 1024 / PAGE_SIZE;
	unsigned char *buf = NULL;
	if (pages)
		CHECK(uvmMallocManaged((void **)&buf, pages * PAGE_SIZE, uvmMemAttachGlobal));
	struct touch_params params = {.buf = buf, .pages = pages};
	/* One thread per worker, but never more threads than pages. */
	unsigned nthreads = pages == 0 ? 1 : (unsigned)(pages < (size_t)workers ? pages : (size_t)workers);
	uvmKernel_t kernel = pages ? touch_kernel : null_kernel;

	for (int i = 0; i <= iterations; i++) {
		double t0 = now_us();
		CHECK(uvmLaunchKernel(device, NULL, nthreads, kernel, &params, sizeof params));
		CHECK(uvmDeviceSynchronize());
		for (size_t pg = 0; pg < pages; pg++)
			((volatile unsigned char *)buf)[pg * PAGE_SIZE]++;
		if (i > 0)
			lat[i - 1] = now_us() - t0;
	}

	/* Every iteration, warm-up included, added two to each page's first
	 * byte: one on the device, one on the host. Anything else means a
	 * migration lost a write. */
	unsigned char want = (unsigned char)(2 * (iterations + 1));
	for (size_t pg = 0; pg < pages; pg++) {
		if (buf[pg * PAGE_SIZE] != want) {
			fprintf(stderr, "launch_touch: %zu KB: page %zu holds %u, want %u: a write was lost\n", kb, pg,
				buf[pg * PAGE_SIZE], want);
			exit(1);
		}
	}
	if (buf)
		CHECK(uvmFree(buf));

	struct row r = {.kb = kb};
	for (int i = 0; i < iterations; i++)
		r.mean_us += lat[i];
	r.mean_us /= iterations;
	qsort(lat, iterations, sizeof *lat, cmp_double);
	r.median_us = iterations % 2 ? lat[iterations / 2] : (lat[iterations / 2 - 1] + lat[iterations / 2]) / 2;
	return r;
}

static void usage(FILE *f)
{
	fprintf(f, "Usage: launch_touch [-n ITERATIONS] [-max KB] [-device N]\n"
		   "  -n ITERATIONS  timed iterations per size (default 20; one more warms up)\n"
		   "  -max KB        largest buffer, a power of two from 4 (default 16384)\n"
		   "  -device N      the device that runs the kernel (default 0)\n");
}

/* parse_int reads a whole decimal argument into *out, within [lo, hi]. */
static int parse_int(const char *flag, const char *s, long lo, long hi, long *out)
{
	char *end;
	long v = strtol(s, &end, 10);
	if (*s == '\0' || *end != '\0' || v < lo || v > hi) {
		fprintf(stderr, "launch_touch: %s %s: want a whole number from %ld to %ld\n", flag, s, lo, hi);
		return -1;
	}
	*out = v;
	return 0;
}

int main(int argc, char **argv)
{
	long iterations = 20, max_kb = 16384, device = 0;
	static const struct option opts[] = {
		{"n", required_argument, NULL, 'n'},
		{"max", required_argument, NULL, 'm'},
		{"device", required_argument, NULL, 'd'},
		{"help", no_argument, NULL, 'h'},
		{0},
	};
	int c;
	/* getopt_long_only: -max and --max both work, as Go's flag package. */
	while ((c = getopt_long_only(argc, argv, "", opts, NULL)) != -1) {
		switch (c) {
		case 'n':
			if (parse_int("-n", optarg, 1, 1000000, &iterations))
				return 2;
			break;
		case 'm':
			if (parse_int("-max", optarg, 4, 1L << 30, &max_kb))
				return 2;
			if (max_kb & (max_kb - 1)) {
				fprintf(stderr, "launch_touch: -max %ld: want a power of two (the sizes double from 4 KB)\n", max_kb);
				return 2;
			}
			break;
		case 'd':
			if (parse_int("-device", optarg, 0, 1000, &device))
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
		fprintf(stderr, "launch_touch: unexpected argument %s\n", argv[optind]);
		usage(stderr);
		return 2;
	}

	/* The experiment moves every page back and forth on every iteration,
	 * exactly the ping-pong the fault server's thrashing detection exists
	 * to stop (it would pin the pages on the host and let the device map
	 * them remotely, and nothing would migrate). Turn it off, as `uvm
	 * bench launch` does, unless the caller chose. This reaches a private
	 * server, which reads its settings from this process's environment
	 * when the first call below starts it; a daemon keeps its own. */
	setenv("UVM_THRASHING", "off", 0);

	int ndevices;
	CHECK(uvmGetDeviceCount(&ndevices));
	if (device >= ndevices) {
		fprintf(stderr, "launch_touch: -device %ld: the server has %d (UVM_DEVICES sets how many)\n", device,
			ndevices);
		return 1;
	}
	/* uvmDeviceSynchronize waits for the current device: make it ours. */
	CHECK(uvmSetDevice((int)device));
	int workers, arena_mib;
	CHECK(uvmDeviceGetAttribute(&workers, uvmDevAttrMultiProcessorCount, (int)device));
	CHECK(uvmDeviceGetAttribute(&arena_mib, uvmDevAttrArenaCapacityMiB, (int)device));
	if ((size_t)max_kb > (size_t)arena_mib * 1024) {
		/* Larger buffers still work (the arena evicts), but then the
		 * table measures eviction, not the round trip. */
		fprintf(stderr, "launch_touch: note: -max %ld KB is larger than device %ld's %d MiB arena\n", max_kb,
			device, arena_mib);
	}

	printf("launch_touch: per iteration, a kernel on device %ld adds one to the first byte of every 4 KiB page\n"
	       "of a managed buffer (the pages migrate to the device), uvmDeviceSynchronize, then the host adds one\n"
	       "to the same bytes (the pages fault back). Launch time is the mean of %ld iteration%s after one\n"
	       "warm-up (median beside it); bandwidth is the buffer's bytes brought back to the host per second.\n"
	       "device %ld: %d worker threads, %d MiB arena; kernel threads: one per worker, at most one per page;\n"
	       "thrashing detection: UVM_THRASHING=%s (a private server's; a daemon keeps its own setting)\n\n",
	       device, iterations, iterations == 1 ? "" : "s", device, workers, arena_mib, getenv("UVM_THRASHING"));
	printf("%16s %12s %17s %12s\n", "Launch time (us)", "Memory (KB)", "Bandwidth (MB/s)", "Median (us)");
	fflush(stdout);

	double *lat = malloc(iterations * sizeof *lat);
	if (!lat) {
		fprintf(stderr, "launch_touch: out of memory\n");
		return 1;
	}
	for (size_t kb = 0; kb <= (size_t)max_kb; kb = kb ? kb * 2 : 4) {
		struct row r = us_per_launch((int)device, workers, (int)iterations, kb, lat);
		if (kb == 0)
			printf("%16.2f %12zu %17s %12.2f\n", r.mean_us, r.kb, "-", r.median_us);
		else /* bytes per microsecond are MB/s (10^6 bytes), the article's unit */
			printf("%16.2f %12zu %17.1f %12.2f\n", r.mean_us, r.kb, kb * 1024 / r.mean_us, r.median_us);
		fflush(stdout); /* a row at a time: the large sizes take a while */
	}
	free(lat);
	return 0;
}
