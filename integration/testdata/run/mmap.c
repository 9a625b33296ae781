/* mmap: anonymous private mappings of at least the threshold are managed
 * memory; munmap of all of one, or of its tail, works; of its middle is
 * refused under `uvm run` (not supported for managed memory); mremap
 * grows (moving) and shrinks them with their contents. Other mappings
 * stay ordinary. */
#include "run.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#define MiB (1u << 20)

static unsigned char *anon(size_t n, int prot, int flags)
{
	void *p = mmap(NULL, n, prot, flags, -1, 0);
	return p == MAP_FAILED ? NULL : p;
}

static volatile size_t huge_len = ~(size_t)0 - 100; /* volatile: the compiler must not see it */

int main(void)
{
	int managed = expect_managed();

	/* Whole, tail and middle unmaps. */
	unsigned char *p = anon(8 * MiB, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS);
	CHECK(p != NULL);
	if (!p)
		return run_done("mmap");
	MANAGED(p);
	CHECK(((uintptr_t)p & 4095) == 0);
	fill(p, 8 * MiB, 1);
	CHECK(verify(p, 8 * MiB, 1) == 0);
	CHECK(munmap(p + 6 * MiB, 2 * MiB) == 0); /* the tail */
	CHECK(verify(p, 6 * MiB, 1) == 0);
	errno = 0;
	int r = munmap(p + 2 * MiB, 1 * MiB); /* the middle */
	if (managed)
		CHECK(r == -1 && errno == EINVAL);
	else
		CHECK(r == 0);
	if (managed)
		CHECK(verify(p, 6 * MiB, 1) == 0); /* the refusal changed nothing */
	CHECK(munmap(p, 6 * MiB) == 0);

	/* mremap: grow (moving), contents kept; shrink in place. */
	unsigned char *q = anon(4 * MiB, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS);
	CHECK(q != NULL);
	if (!q)
		return run_done("mmap");
	MANAGED(q);
	fill(q, 4 * MiB, 2);
	if (managed) {
		errno = 0;
		CHECK(mremap(q, 4 * MiB, 64 * MiB, 0) == MAP_FAILED && errno == ENOMEM); /* cannot grow in place */
	}
	/* A new length that overflows when rounded up to pages: EINVAL, as
	 * the kernel says, and the mapping stays as it was. */
	errno = 0;
	CHECK(mremap(q, 4 * MiB, huge_len, MREMAP_MAYMOVE) == MAP_FAILED && errno == EINVAL);
	CHECK(verify(q, 4 * MiB, 2) == 0);
	unsigned char *g = mremap(q, 4 * MiB, 12 * MiB, MREMAP_MAYMOVE);
	CHECK(g != MAP_FAILED);
	if (g == MAP_FAILED)
		return run_done("mmap");
	MANAGED(g);
	CHECK(verify(g, 4 * MiB, 2) == 0);
	memset(g + 4 * MiB, 0x5a, 8 * MiB);
	unsigned char *s = mremap(g, 12 * MiB, 6 * MiB, 0);
	CHECK(s == g);
	CHECK(verify(s, 4 * MiB, 2) == 0);
	CHECK(s[5 * MiB] == 0x5a);
	CHECK(munmap(s, 6 * MiB) == 0);

	/* Many, freed out of order. */
	unsigned char *many[16];
	for (int i = 0; i < 16; i++) {
		many[i] = anon(2 * MiB, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS);
		CHECK(many[i] != NULL);
		if (many[i])
			fill(many[i], 2 * MiB, (unsigned)i);
	}
	for (int i = 0; i < 16; i += 2)
		if (many[i])
			CHECK(munmap(many[i], 2 * MiB) == 0);
	for (int i = 1; i < 16; i += 2)
		if (many[i]) {
			CHECK(verify(many[i], 2 * MiB, (unsigned)i) == 0);
			CHECK(munmap(many[i], 2 * MiB) == 0);
		}

	/* What stays ordinary memory. */
	unsigned char *shared = anon(4 * MiB, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS);
	CHECK(shared != NULL);
	NOT_MANAGED(shared);
	munmap(shared, 4 * MiB);
	unsigned char *ro = anon(4 * MiB, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS);
	CHECK(ro != NULL);
	NOT_MANAGED(ro);
	munmap(ro, 4 * MiB);
	unsigned char *stack = anon(4 * MiB, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_STACK);
	CHECK(stack != NULL);
	NOT_MANAGED(stack);
	munmap(stack, 4 * MiB);
	unsigned char *small = anon(64 * 1024, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS);
	CHECK(small != NULL);
	NOT_MANAGED(small);
	munmap(small, 64 * 1024);
	int fd = open("/proc/self/exe", O_RDONLY);
	CHECK(fd >= 0);
	void *file = mmap(NULL, 4096, PROT_READ, MAP_PRIVATE, fd, 0);
	CHECK(file != MAP_FAILED && memcmp(file, "\177ELF", 4) == 0);
	NOT_MANAGED(file);
	munmap(file, 4096);
	close(fd);
	return run_done("mmap");
}
