/*
 * sweep.c: a C program that sweeps and checks managed memory while its
 * fault server is killed or replaced (integration/restart_test.go).
 *
 * It allocates SIZE bytes (argv[1], MiB), and until its standard input
 * closes, each pass: writes a pattern over the first three quarters from
 * the host, lets a kernel on device 0 write the last quarter, prefetches
 * half of the host's part to the device, and checks every byte from the
 * host. It prints "pass N" after each good pass, and exits 1 at the first
 * wrong byte or failed call, naming it.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include <uvm.h>

static atomic_int stop;

static void *watch_stdin(void *arg)
{
	(void)arg;
	char buf[64];
	while (read(0, buf, sizeof buf) > 0)
		;
	atomic_store(&stop, 1);
	return NULL;
}

/* The patterns, computed here and never read back from softuvm. */
static uint8_t host_byte(unsigned gen, size_t i) { return (uint8_t)(i * 31 + gen * 7 + (i >> 12)); }
static uint8_t kernel_byte(unsigned gen, size_t i) { return (uint8_t)(gen * 13 + i + (i >> 12)); }

struct fill_params {
	uint8_t *p;
	size_t n;
	unsigned gen;
};

static void fill(unsigned tid, unsigned nthreads, const void *params)
{
	const struct fill_params *f = params;
	for (size_t i = f->n * tid / nthreads; i < f->n * (tid + 1) / nthreads; i++)
		f->p[i] = kernel_byte(f->gen, i);
}

#define CHECK(call)                                                                        \
	do {                                                                               \
		if ((call) != uvmSuccess) {                                                \
			fprintf(stderr, "sweep: pass %u: %s: %s\n", gen, #call, uvmGetLastErrorMessage()); \
			return 1;                                                          \
		}                                                                          \
	} while (0)

int main(int argc, char **argv)
{
	size_t size = (size_t)(argc > 1 ? atoi(argv[1]) : 48) << 20;
	unsigned gen = 0;
	uint8_t *a;
	CHECK(uvmMallocManaged((void **)&a, size, uvmMemAttachGlobal));
	pthread_t t;
	pthread_create(&t, NULL, watch_stdin, NULL);
	size_t host = size / 4 * 3;
	while (!atomic_load(&stop)) {
		gen++;
		for (size_t i = 0; i < host; i++)
			a[i] = host_byte(gen, i);
		struct fill_params f = {.p = a + host, .n = size - host, .gen = gen};
		CHECK(uvmLaunchKernel(0, NULL, 4, fill, &f, sizeof f));
		CHECK(uvmMemPrefetchAsync(a, host / 2, 0, NULL));
		CHECK(uvmDeviceSynchronize());
		for (size_t i = 0; i < host; i++)
			if (a[i] != host_byte(gen, i)) {
				fprintf(stderr, "sweep: pass %u: byte %#zx is %#x, want %#x\n", gen, i, a[i], host_byte(gen, i));
				return 1;
			}
		for (size_t i = 0; i < size - host; i++)
			if (a[host + i] != kernel_byte(gen, i)) {
				fprintf(stderr, "sweep: pass %u: byte %#zx (the kernel's) is %#x, want %#x\n", gen, host + i, a[host + i], kernel_byte(gen, i));
				return 1;
			}
		printf("pass %u\n", gen);
		fflush(stdout);
	}
	CHECK(uvmFree(a));
	return 0;
}
