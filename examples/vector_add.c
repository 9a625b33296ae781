/*
 * vector_add.c: c = a + b over N floats in managed memory, the way a
 * tuned CUDA program does it: advise the driver how each array is used,
 * prefetch the inputs to the device on a stream before the kernel needs
 * them, run the kernel on that stream, prefetch the result back, verify.
 *
 *   a, b  read-mostly (SetReadMostly): the device gets copies and the host
 *         keeps its own, so the inputs never have to come back;
 *   c     preferred on the device (SetPreferredLocation): the kernel's
 *         writes create it there; accessed by the CPU (SetAccessedBy
 *         uvmCpuDeviceId), the CUDA idiom for "the host reads this
 *         later". softuvm records the CPU's accessed-by advice and it
 *         changes nothing (a CPU cannot map device memory on a PCIe
 *         machine either): the host reads c after prefetching it back.
 *
 * It prints each step's time, the range and pointer attributes the
 * library reports, and "vector_add: OK" when every element is right;
 * it exits 1 on any mismatch or failed call.
 *
 * Usage: vector_add [-n ELEMENTS] [-threads T] [-device N]
 */
#define _GNU_SOURCE
#include <getopt.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <uvm.h>

#define CHECK(call)                                                                                \
	do {                                                                                       \
		uvmError_t err_ = (call);                                                          \
		if (err_ != uvmSuccess) {                                                          \
			fprintf(stderr, "vector_add: %s failed: %s (%s)\n", #call,                 \
				uvmGetLastErrorMessage(), uvmGetErrorName(err_));                  \
			exit(1);                                                                   \
		}                                                                                  \
	} while (0)

struct add_params {
	const float *a, *b;
	float *c;
	size_t n;
};

/* add_kernel: thread tid of nthreads adds its contiguous slice. The
 * pointers are managed memory, valid at the same address in the device
 * process. */
static void add_kernel(unsigned tid, unsigned nthreads, const void *params)
{
	const struct add_params *p = params;
	size_t lo = p->n * tid / nthreads, hi = p->n * (tid + 1) / nthreads;
	for (size_t i = lo; i < hi; i++)
		p->c[i] = p->a[i] + p->b[i];
}

/* null_kernel does nothing: launched once to start the device. */
static void null_kernel(unsigned tid, unsigned nthreads, const void *params)
{
	(void)tid;
	(void)nthreads;
	(void)params;
}

/* The inputs are small whole numbers and halves, so a + b is exact in
 * float and the check can demand equality. */
static float a_of(size_t i) { return (float)(i % 4096); }
static float b_of(size_t i) { return (float)((i * 7) % 1024) * 0.5f; }

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

static const char *processor(int d, char *buf, size_t cap)
{
	if (d == uvmCpuDeviceId)
		return "cpu";
	if (d == uvmInvalidDeviceId)
		return "none";
	snprintf(buf, cap, "device %d", d);
	return buf;
}

static const char *memory_type(enum uvmMemoryType t)
{
	switch (t) {
	case uvmMemoryTypeUnregistered:
		return "unregistered";
	case uvmMemoryTypeHost:
		return "host";
	case uvmMemoryTypeDevice:
		return "device";
	case uvmMemoryTypeManaged:
		return "managed";
	}
	return "?";
}

/* print_range prints what uvmMemRangeGetAttribute says of [p, p+n). */
static void print_range(const char *name, const void *p, size_t n)
{
	int read_mostly, preferred, last_prefetch, accessed_by[8];
	char b1[32], b2[32], b3[32];
	CHECK(uvmMemRangeGetAttribute(&read_mostly, sizeof read_mostly, uvmMemRangeAttributeReadMostly, p, n));
	CHECK(uvmMemRangeGetAttribute(&preferred, sizeof preferred, uvmMemRangeAttributePreferredLocation, p, n));
	CHECK(uvmMemRangeGetAttribute(&last_prefetch, sizeof last_prefetch, uvmMemRangeAttributeLastPrefetchLocation, p, n));
	CHECK(uvmMemRangeGetAttribute(accessed_by, sizeof accessed_by, uvmMemRangeAttributeAccessedBy, p, n));
	printf("  range %s: read-mostly %d, preferred location %s, last prefetch location %s, accessed by [", name,
	       read_mostly, processor(preferred, b1, sizeof b1), processor(last_prefetch, b2, sizeof b2));
	/* The list is padded with uvmInvalidDeviceId, as CUDA pads it. */
	for (int i = 0; i < 8 && accessed_by[i] != uvmInvalidDeviceId; i++)
		printf("%s%s", i ? ", " : "", processor(accessed_by[i], b3, sizeof b3));
	printf("]\n");
}

static void print_pointer(const char *name, const void *p)
{
	uvmPointerAttributes at;
	char b[32];
	CHECK(uvmPointerGetAttributes(&at, p));
	/* A managed allocation's device is the current device when it was
	 * made; for CUDA too it says nothing about where the pages are. */
	printf("  pointer %s: type %s, device %d%s%s%s, device pointer %p, host pointer %p\n", name,
	       memory_type(at.type), at.device, at.device < 0 ? " (" : "",
	       at.device < 0 ? processor(at.device, b, sizeof b) : "", at.device < 0 ? ")" : "", at.devicePointer,
	       at.hostPointer);
}

static int parse_long(const char *flag, const char *s, long lo, long hi, long *out)
{
	char *end;
	long v = strtol(s, &end, 10);
	if (*s == '\0' || *end != '\0' || v < lo || v > hi) {
		fprintf(stderr, "vector_add: %s %s: want a whole number from %ld to %ld\n", flag, s, lo, hi);
		return -1;
	}
	*out = v;
	return 0;
}

static void usage(FILE *f)
{
	fprintf(f, "Usage: vector_add [-n ELEMENTS] [-threads T] [-device N]\n"
		   "  -n ELEMENTS  floats per vector (default 16777216: 64 MiB each)\n"
		   "  -threads T   kernel threads splitting the range (default 64)\n"
		   "  -device N    the device that runs the kernel (default 0)\n");
}

int main(int argc, char **argv)
{
	long n = 16L << 20, threads = 64, device = 0;
	static const struct option opts[] = {
		{"n", required_argument, NULL, 'n'},
		{"threads", required_argument, NULL, 't'},
		{"device", required_argument, NULL, 'd'},
		{"help", no_argument, NULL, 'h'},
		{0},
	};
	int c;
	while ((c = getopt_long_only(argc, argv, "", opts, NULL)) != -1) {
		switch (c) {
		case 'n':
			if (parse_long("-n", optarg, 1, 1L << 36, &n))
				return 2;
			break;
		case 't':
			if (parse_long("-threads", optarg, 1, 1 << 20, &threads))
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
		fprintf(stderr, "vector_add: unexpected argument %s\n", argv[optind]);
		usage(stderr);
		return 2;
	}

	int ndevices;
	CHECK(uvmGetDeviceCount(&ndevices));
	if (device >= ndevices) {
		fprintf(stderr, "vector_add: -device %ld: the server has %d (UVM_DEVICES sets how many)\n", device,
			ndevices);
		return 1;
	}
	/* Streams belong to the current device, as in CUDA. */
	CHECK(uvmSetDevice((int)device));
	int workers, arena_mib;
	CHECK(uvmDeviceGetAttribute(&workers, uvmDevAttrMultiProcessorCount, (int)device));
	CHECK(uvmDeviceGetAttribute(&arena_mib, uvmDevAttrArenaCapacityMiB, (int)device));
	size_t bytes = (size_t)n * sizeof(float);
	printf("vector_add: c = a + b over %ld floats (%.1f MiB per vector) on device %ld (%d workers, %d MiB arena), "
	       "%ld kernel threads\n",
	       n, bytes / 1048576.0, device, workers, arena_mib, threads);
	if (3 * bytes > (size_t)arena_mib << 20)
		printf("  note: the three vectors do not fit the arena together; the device evicts as it goes\n");

	float *a, *b, *cv;
	CHECK(uvmMallocManaged((void **)&a, bytes, uvmMemAttachGlobal));
	CHECK(uvmMallocManaged((void **)&b, bytes, uvmMemAttachGlobal));
	CHECK(uvmMallocManaged((void **)&cv, bytes, uvmMemAttachGlobal));

	/* The host writes the inputs: their pages are created in host memory
	 * (first touch). */
	double t0 = now_s();
	for (size_t i = 0; i < (size_t)n; i++) {
		a[i] = a_of(i);
		b[i] = b_of(i);
	}
	double t_init = now_s() - t0;

	/* Advice first: it decides what the prefetches below do (copies for
	 * read-mostly data, moves otherwise) and where the kernel's writes
	 * to c land. */
	t0 = now_s();
	CHECK(uvmMemAdvise(a, bytes, uvmMemAdviseSetReadMostly, 0 /* ignored for read-mostly */));
	CHECK(uvmMemAdvise(b, bytes, uvmMemAdviseSetReadMostly, 0));
	CHECK(uvmMemAdvise(cv, bytes, uvmMemAdviseSetPreferredLocation, (int)device));
	CHECK(uvmMemAdvise(cv, bytes, uvmMemAdviseSetAccessedBy, uvmCpuDeviceId));
	double t_advise = now_s() - t0;

	uvmStream_t stream;
	CHECK(uvmStreamCreate(&stream));

	/* The device process starts at the first launch (as a CUDA context
	 * at the first call): an empty kernel starts it now, so that the
	 * kernel's time below is the addition's. */
	t0 = now_s();
	CHECK(uvmLaunchKernel((int)device, stream, 1, null_kernel, NULL, 0));
	CHECK(uvmStreamSynchronize(stream));
	double t_start = now_s() - t0;

	/* Prefetch the inputs in bulk, so the kernel does not fault on them
	 * page by page; read-mostly, so the host keeps its copies. c was
	 * never touched: prefetching it to the device creates its pages there
	 * in bulk too, instead of one zero-fill fault at a time. */
	t0 = now_s();
	CHECK(uvmMemPrefetchAsync(a, bytes, (int)device, stream));
	CHECK(uvmMemPrefetchAsync(b, bytes, (int)device, stream));
	CHECK(uvmMemPrefetchAsync(cv, bytes, (int)device, stream));
	CHECK(uvmStreamSynchronize(stream));
	double t_prefetch = now_s() - t0;

	/* The kernel, on the same stream: it runs after the prefetches. */
	struct add_params params = {.a = a, .b = b, .c = cv, .n = (size_t)n};
	unsigned nthreads = (unsigned)((size_t)threads < (size_t)n ? (size_t)threads : (size_t)n);
	t0 = now_s();
	CHECK(uvmLaunchKernel((int)device, stream, nthreads, add_kernel, &params, sizeof params));
	CHECK(uvmStreamSynchronize(stream));
	double t_kernel = now_s() - t0;

	/* Bring c home in bulk rather than by one host fault per
	 * neighbourhood. */
	t0 = now_s();
	CHECK(uvmMemPrefetchAsync(cv, bytes, uvmCpuDeviceId, stream));
	CHECK(uvmStreamSynchronize(stream));
	double t_back = now_s() - t0;

	printf("attributes:\n");
	print_range("a", a, bytes);
	print_range("c", cv, bytes);
	print_pointer("a", a);
	print_pointer("c", cv);
	print_pointer("&n (ordinary memory)", &n);

	t0 = now_s();
	size_t bad = 0;
	for (size_t i = 0; i < (size_t)n; i++) {
		float want = a_of(i) + b_of(i);
		if (cv[i] != want) {
			if (bad < 10)
				fprintf(stderr, "vector_add: c[%zu] = %g, want %g\n", i, cv[i], want);
			bad++;
		}
	}
	double t_verify = now_s() - t0;

	double mib = bytes / 1048576.0;
	printf("timings:\n");
	printf("  %-30s %9.3f ms\n", "host writes a and b", t_init * 1e3);
	printf("  %-30s %9.3f ms\n", "advise a, b and c", t_advise * 1e3);
	printf("  %-30s %9.3f ms\n", "start the device (null kernel)", t_start * 1e3);
	printf("  %-30s %9.3f ms  (%.0f MiB/s)\n", "prefetch a, b, c to the device", t_prefetch * 1e3,
	       3 * mib / t_prefetch);
	printf("  %-30s %9.3f ms  (%.0f MiB/s of a, b and c)\n", "kernel + stream synchronize", t_kernel * 1e3,
	       3 * mib / t_kernel);
	printf("  %-30s %9.3f ms  (%.0f MiB/s)\n", "prefetch c to the cpu", t_back * 1e3, mib / t_back);
	printf("  %-30s %9.3f ms\n", "host verifies c", t_verify * 1e3);

	CHECK(uvmStreamDestroy(stream));
	CHECK(uvmFree(a));
	CHECK(uvmFree(b));
	CHECK(uvmFree(cv));
	if (bad) {
		fprintf(stderr, "vector_add: FAILED: %zu of %ld elements wrong\n", bad, n);
		return 1;
	}
	printf("vector_add: OK\n");
	return 0;
}
