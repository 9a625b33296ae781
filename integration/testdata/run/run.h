/*
 * run.h: what the `uvm run` test programs share. They are ordinary C
 * programs, built without libuvm: `uvm run` preloads libuvm-preload.so
 * under them. Each prints "<name>: N checks passed" and exits 0, or names
 * every failed check and exits 1.
 *
 * With RUN_EXPECT_MANAGED=1 (set by the test under `uvm run`), MANAGED(p)
 * checks that p lies in softuvm's managed window: the allocation really
 * became managed memory. Without it (the same program run directly) it
 * checks that p does not. RUN_EXPECT_HEAP=managed adds the small
 * allocations to what must be managed (HEAP(p)).
 */
#ifndef RUN_H
#define RUN_H

#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The managed window (libuvm/src/internal.h, uvm/devproc.go). */
#define WINDOW_START 0x600000000000ull
#define WINDOW_END (WINDOW_START + 0x100000000000ull)

static int run_checks, run_failures;

#define CHECK(cond)                                                                                  \
	do {                                                                                         \
		run_checks++;                                                                        \
		if (!(cond)) {                                                                       \
			run_failures++;                                                              \
			fprintf(stderr, "%s:%d: CHECK(%s) failed\n", __FILE__, __LINE__, #cond);     \
		}                                                                                    \
	} while (0)

static inline int in_window(const void *p)
{
	return (uintptr_t)p >= WINDOW_START && (uintptr_t)p < WINDOW_END;
}

static inline int expect_managed(void)
{
	const char *e = getenv("RUN_EXPECT_MANAGED");
	return e && strcmp(e, "1") == 0;
}

/* expect_heap: RUN_EXPECT_HEAP=managed (set by the test under `uvm run`
 * with its default --heap managed) says allocations below the threshold
 * come from the managed heap too. */
static inline int expect_heap(void)
{
	const char *e = getenv("RUN_EXPECT_HEAP");
	return expect_managed() && e && strcmp(e, "managed") == 0;
}

/* MANAGED(p): p is managed memory under `uvm run`, ordinary memory
 * otherwise. NOT_MANAGED(p): p is ordinary memory either way. HEAP(p): p
 * came from the heap below the threshold: managed memory under `uvm run`
 * with the managed heap, ordinary memory otherwise. */
#define MANAGED(p) CHECK(in_window(p) == expect_managed())
#define NOT_MANAGED(p) CHECK(!in_window(p))
#define HEAP(p) CHECK(in_window(p) == expect_heap())

/* fill and verify write and check a pattern that depends on the offset
 * and a seed, so that a page in the wrong place or a stale copy shows. */
static inline void fill(unsigned char *p, size_t n, unsigned seed)
{
	for (size_t i = 0; i < n; i++)
		p[i] = (unsigned char)((i >> 12) ^ (i * 7) ^ seed);
}

static inline size_t verify(const unsigned char *p, size_t n, unsigned seed)
{
	size_t bad = 0;
	for (size_t i = 0; i < n; i++)
		if (p[i] != (unsigned char)((i >> 12) ^ (i * 7) ^ seed))
			bad++;
	return bad;
}

static inline int run_done(const char *name)
{
	if (run_failures) {
		fprintf(stderr, "%s: %d of %d checks failed\n", name, run_failures, run_checks);
		return 1;
	}
	printf("%s: %d checks passed\n", name, run_checks);
	return 0;
}

#endif
