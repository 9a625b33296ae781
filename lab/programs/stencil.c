/*
 * stencil: a 2D 5-point Jacobi stencil over two float grids, for the policy
 * lab's traces. Plain C: under `uvm run` its two malloc'd grids are managed
 * memory like any other heap.
 *
 *   stencil [N [ITERATIONS]]     (default 2048 x 2048, 16 iterations)
 *
 * Every iteration reads grid a (each point and its four neighbours) and
 * writes grid b, row by row, then the grids swap: two sequential sweeps of
 * 2 * N * N * 4 bytes. The boundary is fixed (hot top edge, cold others);
 * the interior starts from a fixed pseudo-random field. Prints the sum of
 * the final grid.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv)
{
	size_t n = argc > 1 ? strtoul(argv[1], 0, 10) : 2048;
	int iters = argc > 2 ? atoi(argv[2]) : 16;
	if (n < 3 || iters < 1) {
		fprintf(stderr, "usage: stencil [N >= 3 [ITERATIONS >= 1]]\n");
		return 2;
	}
	float *a = malloc(n * n * sizeof *a);
	float *b = malloc(n * n * sizeof *b);
	if (!a || !b) {
		perror("malloc");
		return 1;
	}

	uint32_t x = 12345;
	for (size_t i = 0; i < n; i++)
		for (size_t j = 0; j < n; j++) {
			float v;
			if (i == 0)
				v = 100.0f;
			else if (i == n - 1 || j == 0 || j == n - 1)
				v = 0.0f;
			else {
				x = x * 1664525u + 1013904223u;
				v = (float)(x >> 8) / (float)(1u << 24);
			}
			a[i * n + j] = v;
			b[i * n + j] = v; /* the boundary stays in both */
		}

	for (int it = 0; it < iters; it++) {
		for (size_t i = 1; i < n - 1; i++) {
			const float *up = a + (i - 1) * n, *mid = a + i * n, *down = a + (i + 1) * n;
			float *out = b + i * n;
			for (size_t j = 1; j < n - 1; j++)
				out[j] = 0.2f * (mid[j] + mid[j - 1] + mid[j + 1] + up[j] + down[j]);
		}
		float *t = a;
		a = b;
		b = t;
	}

	double sum = 0;
	for (size_t i = 0; i < n * n; i++)
		sum += a[i];
	printf("stencil %zux%zu, %d iterations: checksum %.6f\n", n, n, iters, sum);
	free(a);
	free(b);
	return 0;
}
