/*
 * advise_write.c: the smallest C program found to hang under softuvm
 * (`uvm bench soak` found it; integration/soak_test.go,
 * TestCAdviceAndKernelsOnTwoDevices runs it): two managed allocations
 * of 4 MiB; each round gives accessed-by advice (set or unset, for a
 * random processor) on a random part of each, then runs a kernel on
 * device 0 writing a random part of the first and one on device 1
 * writing a random part of the second at once (1 to 3 threads each),
 * synchronizes both and checks every byte written. The parts are up to
 * 64 bytes, a page, three pages, 256 KiB or the whole, as the soak's
 * * clients choose them. It prints "pass N" after each good round, up to
 * ROUNDS (argv[1]), and exits 1 at a failed call or a wrong byte. Its
 * random numbers start from the same seed every run.
 */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include <uvm.h>

#define SIZE (4u << 20)

static uint64_t rng = 1;
static uint64_t next64(void)
{
	uint64_t z = (rng += 0x9E3779B97F4A7C15ull);
	z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
	z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
	return z ^ (z >> 31);
}

static uint8_t value(uint64_t seed, size_t i) { return (uint8_t)((seed * 0x9E3779B97F4A7C15ull + i * 0xBF58476D1CE4E5B9ull) >> 56); }

struct params {
	uint8_t *p;
	size_t n;
	uint64_t seed;
};

static void fill(unsigned tid, unsigned nthreads, const void *vp)
{
	const struct params *k = vp;
	for (size_t i = k->n * tid / nthreads; i < k->n * (tid + 1) / nthreads; i++)
		k->p[i] = value(k->seed, i);
}

/* span picks a part of an allocation: up to 64 bytes, a page, three
 * pages, 256 KiB or 4 MiB. */
static void span(size_t *off, size_t *len)
{
	static const size_t most[] = {64, 4096, 3 * 4096, 256u << 10, 4u << 20};
	size_t m = most[next64() % 5];
	*len = 1 + next64() % (SIZE < m ? SIZE : m);
	*off = next64() % (SIZE - *len + 1);
}

#define CHECK(call)                                                                                   \
	do {                                                                                          \
		if ((call) != uvmSuccess) {                                                           \
			fprintf(stderr, "advise_write: round %d: %s: %s\n", round, #call, uvmGetLastErrorMessage()); \
			return 1;                                                                     \
		}                                                                                     \
	} while (0)

int main(int argc, char **argv)
{
	int rounds = argc > 1 ? atoi(argv[1]) : 100, round = 0;
	uint8_t *a[2];
	for (int d = 0; d < 2; d++)
		CHECK(uvmMallocManaged((void **)&a[d], SIZE, uvmMemAttachGlobal));
	for (round = 1; round <= rounds; round++) {
		struct params k[2];
		for (int d = 0; d < 2; d++) {
			size_t off, len;
			span(&off, &len);
			int processor = (int)(next64() % 3) - 1;
			CHECK(uvmMemAdvise(a[d] + off, len, next64() % 2 ? uvmMemAdviseSetAccessedBy : uvmMemAdviseUnsetAccessedBy, processor));
			span(&off, &len);
			k[d] = (struct params){.p = a[d] + off, .n = len, .seed = next64()};
			CHECK(uvmLaunchKernel(d, NULL, 1 + (unsigned)(next64() % 3), fill, &k[d], sizeof k[d]));
		}
		for (int d = 0; d < 2; d++) {
			CHECK(uvmSetDevice(d));
			CHECK(uvmDeviceSynchronize());
		}
		for (int d = 0; d < 2; d++)
			for (size_t i = 0; i < k[d].n; i++)
				if (k[d].p[i] != value(k[d].seed, i)) {
					fprintf(stderr, "advise_write: round %d: byte %#zx of the allocation device %d wrote is %#x, want %#x\n", round, (size_t)(k[d].p - a[d]) + i, d, k[d].p[i], value(k[d].seed, i));
					return 1;
				}
		printf("pass %d\n", round);
		fflush(stdout);
	}
	return 0;
}
