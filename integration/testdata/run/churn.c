/* churn ROUNDS MIB: each round fills MIB mebibytes with small objects
 * (1000 bytes, below any threshold: the heap's), checks every byte of
 * every one, and frees them all; then callocs MIB mebibytes in 192 KiB
 * pieces and checks that they read as zeros. A heap that purges what is
 * freed (the managed heap discards it on the server, and jemalloc then
 * trusts the pages to be zero and skips calloc's memset) must hand back
 * zeros, and a heap that did not would keep its garbage in the host
 * budget. */
#include "run.h"

#define OBJ 1000u
#define BIG (192u << 10)

static unsigned char byte_of(size_t round, size_t obj, size_t i) { return (unsigned char)(round * 131 + obj * 7 + i + 1); }

int main(int argc, char **argv)
{
	size_t rounds = argc > 2 ? strtoul(argv[1], NULL, 10) : 0, mib = argc > 2 ? strtoul(argv[2], NULL, 10) : 0;
	if (rounds == 0 || mib == 0) {
		fprintf(stderr, "usage: churn ROUNDS MIB (positive numbers)\n");
		return 2;
	}
	size_t nobj = (mib << 20) / OBJ, nbig = (mib << 20) / BIG;
	unsigned char **objs = calloc(nobj, sizeof *objs);
	unsigned char **bigs = calloc(nbig, sizeof *bigs);
	CHECK(objs && bigs);
	if (!objs || !bigs)
		return run_done("churn");
	for (size_t r = 0; r < rounds; r++) {
		size_t missing = 0, bad = 0, nonzero = 0;
		for (size_t k = 0; k < nobj; k++) {
			objs[k] = malloc(OBJ);
			if (!objs[k]) {
				missing++;
				continue;
			}
			for (size_t i = 0; i < OBJ; i++)
				objs[k][i] = byte_of(r, k, i);
		}
		if (r == 0 && objs[0])
			HEAP(objs[0]);
		for (size_t k = 0; k < nobj; k++) {
			if (!objs[k])
				continue;
			for (size_t i = 0; i < OBJ; i++)
				bad += objs[k][i] != byte_of(r, k, i);
			free(objs[k]);
		}
		for (size_t k = 0; k < nbig; k++) {
			bigs[k] = calloc(1, BIG);
			if (!bigs[k]) {
				missing++;
				continue;
			}
			for (size_t i = 0; i < BIG; i++)
				nonzero += bigs[k][i] != 0;
			memset(bigs[k], 0xa5, BIG); /* garbage for the next round to purge */
		}
		for (size_t k = 0; k < nbig; k++)
			free(bigs[k]);
		CHECK(missing == 0);
		CHECK(bad == 0);
		CHECK(nonzero == 0);
	}
	free(objs);
	free(bigs);
	return run_done("churn");
}
