/*
 * blocks.c: a C program whose fault server's policies show in the
 * server's counters, for integration/policy_test.go. It does its work,
 * prints "ready" and waits for its standard input to close, while the
 * test reads the server's report (uvm stat); then it checks its data on
 * the host and prints "blocks: OK".
 *
 * Usage: blocks evict | blocks touch
 *
 * evict: four managed blocks A, B, C, D (2 MiB each), written on the host
 * and prefetched to device 0 in that order, then A once more, under a
 * device arena of three blocks. D's arrival evicts one block: LRU evicts
 * A, the oldest, and A's return then evicts B (two blocks evicted, five
 * moved to the device); MRU evicts C, the newest, and A is still there
 * (one block evicted, four moved).
 *
 * touch: one fresh block, whose page 5 is written once: the server's
 * prefetch policy decides what comes with it (evens: the 256 even pages).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <uvm.h>

#define PAGE_SIZE 4096u
#define BLOCK_SIZE (2u << 20)

#define CHECK(call)                                                                                \
	do {                                                                                       \
		uvmError_t err_ = (call);                                                          \
		if (err_ != uvmSuccess) {                                                          \
			fprintf(stderr, "blocks: %s failed: %s (%s)\n", #call,                     \
				uvmGetLastErrorMessage(), uvmGetErrorName(err_));                  \
			exit(1);                                                                   \
		}                                                                                  \
	} while (0)

/* wait_for_stdin reports the work done and waits for the test to have
 * read the server's counters. */
static void wait_for_stdin(void)
{
	printf("ready\n");
	fflush(stdout);
	char buf[64];
	while (read(0, buf, sizeof buf) > 0) {
	}
}

static int evict(void)
{
	unsigned char *blocks[4];
	for (int i = 0; i < 4; i++) {
		CHECK(uvmMallocManaged((void **)&blocks[i], BLOCK_SIZE, uvmMemAttachGlobal));
		for (size_t p = 0; p < BLOCK_SIZE; p += PAGE_SIZE)
			blocks[i][p] = (unsigned char)(i + 1);
	}
	/* One at a time, so that the order they arrive in is the order
	 * given. */
	int order[] = {0, 1, 2, 3, 0};
	for (size_t k = 0; k < sizeof order / sizeof order[0]; k++) {
		CHECK(uvmMemPrefetchAsync(blocks[order[k]], BLOCK_SIZE, 0, NULL));
		CHECK(uvmDeviceSynchronize());
	}
	wait_for_stdin();
	for (int i = 0; i < 4; i++) {
		for (size_t p = 0; p < BLOCK_SIZE; p += PAGE_SIZE) {
			if (blocks[i][p] != (unsigned char)(i + 1)) {
				fprintf(stderr, "blocks: block %d page %zu reads %d, want %d\n", i, p / PAGE_SIZE, blocks[i][p], i + 1);
				return 1;
			}
		}
		CHECK(uvmFree(blocks[i]));
	}
	return 0;
}

static int touch(void)
{
	unsigned char *b;
	CHECK(uvmMallocManaged((void **)&b, BLOCK_SIZE, uvmMemAttachGlobal));
	b[5 * PAGE_SIZE] = 7;
	wait_for_stdin();
	if (b[5 * PAGE_SIZE] != 7 || b[4 * PAGE_SIZE] != 0) {
		fprintf(stderr, "blocks: page 5 reads %d and page 4 %d, want 7 and 0\n", b[5 * PAGE_SIZE], b[4 * PAGE_SIZE]);
		return 1;
	}
	CHECK(uvmFree(b));
	return 0;
}

int main(int argc, char **argv)
{
	if (argc != 2 || (strcmp(argv[1], "evict") != 0 && strcmp(argv[1], "touch") != 0)) {
		fprintf(stderr, "usage: blocks evict | blocks touch\n");
		return 2;
	}
	int rc = strcmp(argv[1], "evict") == 0 ? evict() : touch();
	if (rc == 0)
		printf("blocks: OK\n");
	return rc;
}
