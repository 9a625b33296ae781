/*
 * cliff_walk.c: the random walk of `uvm bench cliff`, run plain and under
 * `uvm run` at host budgets below its array. The benchmark embeds this
 * file and builds it with the C compiler ($CC, else cc) at run time.
 *
 * Usage: cliff_walk BYTES STEPS SEED
 *
 * It allocates BYTES aligned to a 4 KiB page (so that under `uvm run` the
 * array is a managed allocation of its own, starting on a page, and the
 * benchmark knows which page each word is in), writes every 8-byte word
 * once in order, then makes STEPS read-modify-writes at words chosen by
 * xorshift64 (shifts 13, 7, 17) from SEED:
 *
 *   x ^= x << 13; x ^= x >> 7; x ^= x << 17; i = x % words; a[i] += x;
 *
 * and last reads every word in order, checking two sums (of the words,
 * and of each word times its index plus one) against those the walk
 * implies. The benchmark computes the same walk in Go
 * (internal/bench/cliff_synthetic.go: walkIndices) for the page reference
 * string from which it counts LRU's and MIN's faults. It prints one line,
 *   cliff_walk: bytes=N steps=K seed=S indices=H ok
 * where H is the FNV-1a hash (64-bit, a word at a time) of the indices
 * visited, so that the Go walk can be checked against this one, and exits
 * 0; or says which sum is wrong on standard error and exits 1.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

static uint64_t initial(uint64_t i) { return i * 0x9e3779b97f4a7c15ull; }

/* number reads the argument named name, text, in base (0: as C writes
 * numbers), and wants it at least least; else it says what was wanted
 * and exits with status 2. */
static unsigned long long number(const char *name, const char *text, int base, unsigned long long least, const char *want)
{
	char *end;
	unsigned long long v = strtoull(text, &end, base);
	if (*text == '\0' || *end || v < least) {
		fprintf(stderr, "cliff_walk: %s %s: want %s\n", name, text, want);
		exit(2);
	}
	return v;
}

int main(int argc, char **argv)
{
	if (argc != 4) {
		fprintf(stderr, "usage: cliff_walk BYTES STEPS SEED\n");
		return 2;
	}
	unsigned long long bytes = number("BYTES", argv[1], 10, 8, "a number of at least 8");
	unsigned long long steps = number("STEPS", argv[2], 10, 0, "a number");
	unsigned long long seed = number("SEED", argv[3], 0, 1, "a number other than 0 (xorshift stays at 0)");
	size_t n = bytes / sizeof(uint64_t);
	uint64_t *a;
	if (posix_memalign((void **)&a, 4096, n * sizeof(uint64_t)) != 0) {
		fprintf(stderr, "cliff_walk: posix_memalign(4096, %zu) failed\n", n * sizeof(uint64_t));
		return 1;
	}
	uint64_t want_sum = 0, want_weighted = 0;
	for (size_t i = 0; i < n; i++) {
		a[i] = initial(i);
		want_sum += a[i];
		want_weighted += a[i] * (i + 1);
	}
	uint64_t x = seed, hash = 0xcbf29ce484222325ull;
	for (unsigned long long s = 0; s < steps; s++) {
		x ^= x << 13;
		x ^= x >> 7;
		x ^= x << 17;
		uint64_t i = x % n;
		a[i] += x;
		want_sum += x;
		want_weighted += x * (i + 1);
		hash = (hash ^ i) * 0x100000001b3ull;
	}
	uint64_t sum = 0, weighted = 0;
	for (size_t i = 0; i < n; i++) {
		sum += a[i];
		weighted += a[i] * (i + 1);
	}
	if (sum != want_sum || weighted != want_weighted) {
		fprintf(stderr, "cliff_walk: the array's sum is %#llx, want %#llx; weighted %#llx, want %#llx\n",
			(unsigned long long)sum, (unsigned long long)want_sum, (unsigned long long)weighted,
			(unsigned long long)want_weighted);
		return 1;
	}
	printf("cliff_walk: bytes=%zu steps=%llu seed=%#llx indices=%016llx ok\n", n * sizeof(uint64_t), steps, seed,
	       (unsigned long long)hash);
	free(a);
	return 0;
}
