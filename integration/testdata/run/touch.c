/* touch MIB: one malloc of MIB mebibytes, every page written then read
 * back twice, freed: exactly one managed allocation of known size, whose
 * pages move both ways when the host budget is below it. */
#include "run.h"

#define PAGE 4096u

int main(int argc, char **argv)
{
	size_t mib = argc > 1 ? strtoul(argv[1], NULL, 10) : 0;
	if (mib == 0) {
		fprintf(stderr, "usage: touch MIB (a positive number of mebibytes)\n");
		return 2;
	}
	size_t n = mib << 20;
	unsigned char *p = malloc(n);
	CHECK(p != NULL);
	if (!p)
		return run_done("touch");
	MANAGED(p);
	for (size_t i = 0; i < n; i += PAGE)
		p[i] = (unsigned char)(i / PAGE);
	for (int pass = 0; pass < 2; pass++) {
		size_t bad = 0;
		for (size_t i = 0; i < n; i += PAGE)
			bad += p[i] != (unsigned char)(i / PAGE);
		CHECK(bad == 0);
	}
	free(p);
	return run_done("touch");
}
