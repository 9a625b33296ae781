/* threads: several threads allocate, write and read large buffers of
 * their own at once, and write disjoint stripes of one shared buffer that
 * the main thread then reads. */
#include "run.h"

#include <pthread.h>

#define NTHREADS 4
#define OWN (6u << 20)
#define SHARED (16u << 20)
#define ROUNDS 3

static unsigned char *shared;

struct result {
	int managed;  /* the thread's own buffer was managed memory */
	size_t bad;   /* bytes that read back wrong */
	int alloc_failed;
};

static void *worker(void *arg)
{
	long id = (long)arg;
	struct result *r = calloc(1, sizeof *r);
	if (!r)
		return NULL;
	for (int round = 0; round < ROUNDS; round++) {
		unsigned char *own = malloc(OWN);
		if (!own) {
			r->alloc_failed = 1;
			return r;
		}
		r->managed = in_window(own);
		fill(own, OWN, (unsigned)(id * 16 + round));
		r->bad += verify(own, OWN, (unsigned)(id * 16 + round));
		free(own);
	}
	/* Stripes of 64 KiB, interleaved between the threads: neighbouring
	 * pages of one 2 MiB block are written by different threads. */
	for (size_t off = (size_t)id * 65536; off < SHARED; off += NTHREADS * 65536)
		for (size_t i = 0; i < 65536; i++)
			shared[off + i] = (unsigned char)(off / 65536 + i);
	return r;
}

int main(void)
{
	shared = malloc(SHARED);
	CHECK(shared != NULL);
	if (!shared)
		return run_done("threads");
	MANAGED(shared);
	pthread_t t[NTHREADS];
	for (long i = 0; i < NTHREADS; i++)
		CHECK(pthread_create(&t[i], NULL, worker, (void *)i) == 0);
	for (int i = 0; i < NTHREADS; i++) {
		struct result *r = NULL;
		CHECK(pthread_join(t[i], (void **)&r) == 0);
		CHECK(r != NULL);
		if (!r)
			continue;
		CHECK(!r->alloc_failed);
		CHECK(r->bad == 0);
		CHECK(r->managed == expect_managed());
		free(r);
	}
	size_t bad = 0;
	for (size_t off = 0; off < SHARED; off += 65536)
		for (size_t i = 0; i < 65536; i++)
			bad += shared[off + i] != (unsigned char)(off / 65536 + i);
	CHECK(bad == 0);
	if (bad)
		fprintf(stderr, "threads: %zu bytes of the shared buffer read back wrong\n", bad);
	free(shared);
	return run_done("threads");
}
