/*
 * pointer_chase: a walk of a random cyclic linked list, for the policy
 * lab's traces: every step lands on a random node, so neighbouring pages
 * predict nothing (prefetch fails) and what stays resident is what
 * eviction chose.
 *
 *   pointer_chase [LOG2_NODES [STEPS [SEED]]]   (default 20, 200000, 1)
 *
 * 2^LOG2_NODES nodes of 64 bytes in one malloc'd array; the successor of
 * each is given by a random cyclic permutation (Sattolo's algorithm, with
 * splitmix64 from SEED), so the walk visits every node once per lap. The
 * walk starts at node 0, goes STEPS steps, and prints the node it ends on
 * and a checksum of the nodes' payloads it read.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

struct node {
	uint64_t next;
	uint64_t payload[7];
};

static uint64_t state;

static uint64_t next64(void)
{
	uint64_t z = (state += 0x9e3779b97f4a7c15ULL);
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
	return z ^ (z >> 31);
}

int main(int argc, char **argv)
{
	int lg = argc > 1 ? atoi(argv[1]) : 20;
	unsigned long long steps = argc > 2 ? strtoull(argv[2], 0, 10) : 200000;
	state = argc > 3 ? strtoull(argv[3], 0, 10) : 1;
	if (lg < 2 || lg > 30) {
		fprintf(stderr, "usage: pointer_chase [LOG2_NODES (2-30) [STEPS [SEED]]]\n");
		return 2;
	}
	size_t n = (size_t)1 << lg;

	/* Sattolo's algorithm: a uniformly random permutation of one cycle. */
	uint32_t *perm = malloc(n * sizeof *perm);
	struct node *nodes = malloc(n * sizeof *nodes);
	if (!perm || !nodes) {
		perror("malloc");
		return 1;
	}
	for (size_t i = 0; i < n; i++)
		perm[i] = (uint32_t)i;
	for (size_t i = n - 1; i > 0; i--) {
		size_t j = (size_t)(next64() % i);
		uint32_t t = perm[i];
		perm[i] = perm[j];
		perm[j] = t;
	}
	for (size_t i = 0; i < n; i++) {
		nodes[i].next = perm[i];
		for (int k = 0; k < 7; k++)
			nodes[i].payload[k] = i * 7 + (uint64_t)k;
	}
	free(perm);

	uint64_t at = 0, sum = 0;
	for (unsigned long long s = 0; s < steps; s++) {
		sum += nodes[at].payload[at & 7 ? (at & 7) - 1 : 0];
		at = nodes[at].next;
	}
	printf("pointer_chase 2^%d nodes, %llu steps: node %llu, checksum %llu\n", lg, steps,
	       (unsigned long long)at, (unsigned long long)sum);
	free(nodes);
	return 0;
}
