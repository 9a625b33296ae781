/*
 * oversub_sweep.c: the program `uvm bench oversub` sweeps, unmanaged,
 * under `uvm run` and in a memory cgroup. The benchmark embeds this file
 * and builds it with the C compiler ($CC, else cc) at run time.
 *
 * Usage: oversub_sweep BYTES SWEEPS
 *
 * It mallocs BYTES (so that, under `uvm run`, libuvm-preload.so makes the
 * array managed memory), writes every 8-byte word once, then sweeps the
 * array SWEEPS times reading and writing every word (a[i] += 1), and
 * checks that every word is its initial value plus SWEEPS, computed anew.
 * It prints one line,
 *   oversub_sweep: bytes=N sweeps=K init_seconds=X sweep_seconds=Y ok
 * and exits 0, or names the first wrong word on standard error and exits 1.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static double now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

static uint64_t initial(uint64_t i) { return i * 0x9e3779b97f4a7c15ull; }

int main(int argc, char **argv)
{
	if (argc != 3) {
		fprintf(stderr, "usage: oversub_sweep BYTES SWEEPS\n");
		return 2;
	}
	char *end;
	unsigned long long bytes = strtoull(argv[1], &end, 10);
	if (*end || bytes < 8) {
		fprintf(stderr, "oversub_sweep: BYTES %s: want a number of at least 8\n", argv[1]);
		return 2;
	}
	long sweeps = strtol(argv[2], &end, 10);
	if (*end || sweeps < 1) {
		fprintf(stderr, "oversub_sweep: SWEEPS %s: want a number of at least 1\n", argv[2]);
		return 2;
	}
	size_t n = bytes / sizeof(uint64_t);
	uint64_t *a = malloc(n * sizeof(uint64_t));
	if (!a) {
		fprintf(stderr, "oversub_sweep: malloc(%zu) failed\n", n * sizeof(uint64_t));
		return 1;
	}
	double t0 = now();
	for (size_t i = 0; i < n; i++)
		a[i] = initial(i);
	double t1 = now();
	for (long k = 0; k < sweeps; k++) {
		for (size_t i = 0; i < n; i++)
			a[i] += 1;
		/* Each sweep is done in memory before the next: the compiler
		 * may not fold the sweeps into one. */
		__asm__ volatile("" : : "r"(a) : "memory");
	}
	double t2 = now();
	for (size_t i = 0; i < n; i++) {
		uint64_t want = initial(i) + (uint64_t)sweeps;
		if (a[i] != want) {
			fprintf(stderr, "oversub_sweep: word %zu is %#llx, want %#llx\n", i,
				(unsigned long long)a[i], (unsigned long long)want);
			return 1;
		}
	}
	printf("oversub_sweep: bytes=%zu sweeps=%ld init_seconds=%.6f sweep_seconds=%.6f ok\n",
	       n * sizeof(uint64_t), sweeps, t1 - t0, t2 - t1);
	free(a);
	return 0;
}
