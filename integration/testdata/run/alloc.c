/* alloc: the C allocator's whole family at the default threshold (1 MiB):
 * realloc across the threshold both ways keeps the contents, calloc
 * gives zeros (also where a dirty managed buffer was just freed), the
 * aligned allocators align, malloc_usable_size covers the request. */
#include "run.h"

#include <errno.h>
#include <malloc.h>
#include <unistd.h>

#define MiB (1u << 20)

/* Through volatiles: the compiler would reject (rightly, were they not
 * deliberate) the overflowing sizes and the use of a pointer after a
 * reallocarray that must fail. */
static void *(*volatile reallocarray_v)(void *, size_t, size_t) = reallocarray;
static volatile size_t huge = (size_t)1 << 40;

static int aligned_to(const void *p, size_t a) { return ((uintptr_t)p & (a - 1)) == 0; }

int main(void)
{
	/* realloc: small -> managed -> bigger managed -> shrink in place -> small. */
	unsigned char *p = malloc(1000);
	CHECK(p != NULL);
	HEAP(p);
	fill(p, 1000, 1);
	p = realloc(p, 4 * MiB);
	CHECK(p != NULL);
	MANAGED(p);
	CHECK(verify(p, 1000, 1) == 0);
	fill(p, 4 * MiB, 2);
	p = realloc(p, 16 * MiB);
	CHECK(p != NULL);
	MANAGED(p);
	CHECK(verify(p, 4 * MiB, 2) == 0);
	fill(p, 16 * MiB, 3);
	unsigned char *same = realloc(p, 2 * MiB + 5);
	CHECK(same != NULL);
	if (expect_managed())
		CHECK(same == p); /* shrinking managed memory stays in place */
	p = same;
	CHECK(verify(p, 2 * MiB + 5, 3) == 0);
	CHECK(malloc_usable_size(p) >= 2 * MiB + 5);
	p = realloc(p, 3000);
	CHECK(p != NULL);
	HEAP(p);
	CHECK(verify(p, 3000, 3) == 0);
	free(p);

	unsigned char *ra = reallocarray(NULL, 1024, 4096);
	CHECK(ra != NULL);
	MANAGED(ra);
	fill(ra, 4 * MiB, 4);
	CHECK(verify(ra, 4 * MiB, 4) == 0);
	errno = 0;
	CHECK(reallocarray_v(ra, huge, huge) == NULL && errno == ENOMEM); /* overflow: ra untouched */
	CHECK(verify(ra, 4 * MiB, 4) == 0);
	free(ra);

	/* calloc: zeros, also where dirty managed memory was just freed. */
	for (int round = 0; round < 3; round++) {
		unsigned char *c = calloc(1, 8 * MiB);
		CHECK(c != NULL);
		if (!c)
			break;
		MANAGED(c);
		size_t nonzero = 0;
		for (size_t i = 0; i < 8 * MiB; i++)
			nonzero += c[i] != 0;
		CHECK(nonzero == 0);
		memset(c, 0xff, 8 * MiB);
		free(c);
	}
	unsigned char *exact = calloc(1024, 1024); /* exactly the threshold */
	CHECK(exact != NULL);
	MANAGED(exact);
	free(exact);
	unsigned char *below = malloc(MiB - 1);
	CHECK(below != NULL);
	HEAP(below);
	free(below);
	errno = 0;
	CHECK(calloc(huge, huge) == NULL && errno == ENOMEM);

	/* The aligned allocators. Managed memory is 2 MiB aligned, so any
	 * alignment up to 2 MiB is managed; a larger one is the system's. */
	void *a = NULL;
	CHECK(posix_memalign(&a, 4096, 4 * MiB) == 0 && aligned_to(a, 4096));
	MANAGED(a);
	free(a);
	CHECK(posix_memalign(&a, 2 * MiB, 4 * MiB) == 0 && aligned_to(a, 2 * MiB));
	MANAGED(a);
	free(a);
	CHECK(posix_memalign(&a, 8 * MiB, 4 * MiB) == 0 && aligned_to(a, 8 * MiB));
	HEAP(a); /* the heap aligns it where a managed allocation cannot */
	free(a);
	void *untouched = (void *)0x1234;
	a = untouched;
	CHECK(posix_memalign(&a, 3, 4 * MiB) == EINVAL && a == untouched);
	/* An alignment that is not a power of two: whatever this glibc does
	 * (2.36 rounds it up, as memalign does; 2.38 and later fail with
	 * EINVAL), the same under uvm run, small or large. */
	for (int big = 0; big < 2; big++) {
		size_t sz = big ? 4 * MiB : 100;
		errno = 0;
		a = aligned_alloc(24, sz);
#if __GLIBC_PREREQ(2, 38)
		CHECK(a == NULL && errno == EINVAL);
#else
		CHECK(a != NULL && aligned_to(a, 32));
#endif
		free(a);
	}
	a = aligned_alloc(64, 4 * MiB);
	CHECK(a != NULL && aligned_to(a, 64));
	MANAGED(a);
	free(a);
	a = memalign(MiB, 4 * MiB);
	CHECK(a != NULL && aligned_to(a, MiB));
	MANAGED(a);
	free(a);
	a = valloc(4 * MiB);
	CHECK(a != NULL && aligned_to(a, (size_t)sysconf(_SC_PAGESIZE)));
	MANAGED(a);
	CHECK(malloc_usable_size(a) >= 4 * MiB);
	free(a);
	a = pvalloc(4 * MiB + 1);
	CHECK(a != NULL && aligned_to(a, (size_t)sysconf(_SC_PAGESIZE)));
	MANAGED(a);
	CHECK(malloc_usable_size(a) >= 4 * MiB + 4096);
	free(a);

	/* Small allocations: glibc's, or the managed heap's. */
	void *z = malloc(0);
	CHECK(z != NULL);
	HEAP(z);
	free(z);
	free(NULL);
	char *s = strdup("unmodified");
	CHECK(s && strcmp(s, "unmodified") == 0);
	free(s);

	/* The heap's sizes, calloc's zeros, realloc within the heap, and
	 * malloc_usable_size, over many small objects. */
	enum { NSMALL = 20000 };
	unsigned char **obj = malloc(NSMALL * sizeof *obj);
	CHECK(obj != NULL);
	HEAP(obj);
	for (int i = 0; i < NSMALL; i++) {
		size_t n = 1 + (size_t)(i * 37) % 3000;
		obj[i] = i % 3 == 0 ? calloc(1, n) : malloc(n);
		CHECK(obj[i] != NULL);
		HEAP(obj[i]);
		CHECK(malloc_usable_size(obj[i]) >= n);
		if (i % 3 == 0) {
			size_t nonzero = 0;
			for (size_t k = 0; k < n; k++)
				nonzero += obj[i][k] != 0;
			CHECK(nonzero == 0);
		}
		fill(obj[i], n, (unsigned)i);
	}
	for (int i = 0; i < NSMALL; i += 2) {
		size_t n = 1 + (size_t)(i * 37) % 3000, m = n * 3 + 100;
		unsigned char *q = realloc(obj[i], m);
		CHECK(q != NULL);
		HEAP(q);
		CHECK(verify(q, n, (unsigned)i) == 0);
		obj[i] = q;
		fill(q, m, (unsigned)i + 1);
	}
	for (int i = 0; i < NSMALL; i++) {
		size_t n = 1 + (size_t)(i * 37) % 3000;
		CHECK(verify(obj[i], i % 2 == 0 ? n * 3 + 100 : n, (unsigned)i + (i % 2 == 0)) == 0);
		free(obj[i]);
	}
	free(obj);

	/* Many at once, freed out of order. */
	unsigned char *many[40];
	for (int i = 0; i < 40; i++) {
		many[i] = malloc(MiB + (size_t)i * 4096);
		CHECK(many[i] != NULL);
		if (many[i])
			fill(many[i], MiB, (unsigned)i);
	}
	for (int i = 39; i >= 0; i -= 2)
		free(many[i]);
	for (int i = 0; i < 40; i += 2) {
		CHECK(verify(many[i], MiB, (unsigned)i) == 0);
		free(many[i]);
	}
	return run_done("alloc");
}
