/*
 * stale_fault_test.c: a kernel whose threads fault on neighbouring pages
 * leaves fault messages that the server reads in one batch and serves one
 * by one. The first resolves every page (prefetch) and wakes all the
 * threads, so the program may synchronize, free the range and allocate a
 * new one at the same address before the rest are served. Those messages
 * are stale: the server must not poison the page for them (in the new
 * range's live mapping, the next kernel would die of SIGBUS).
 * integration/libuvm_test.go fails any C test whose output (the private
 * server's log included) mentions a poisoned page.
 */
#define _GNU_SOURCE
#include <stdlib.h>

#include "check.h"

struct touch {
	unsigned char *b;
	size_t pages;
};

static void add_one(unsigned tid, unsigned n, const void *params)
{
	const struct touch *t = params;
	for (size_t i = t->pages * tid / n; i < t->pages * (tid + 1) / n; i++)
		t->b[i * 4096]++;
}

int main(void)
{
	/* Many more workers than CPUs: the batch is served while they run. */
	setenv("UVM_DEVICE_WORKERS", "16", 1);
	int wrong = 0;
	for (int round = 0; round < 300; round++) {
		struct touch t = {.pages = 8};
		CHECK_OK(uvmMallocManaged((void **)&t.b, t.pages * 4096, uvmMemAttachGlobal));
		if (!t.b)
			break;
		CHECK_OK(uvmLaunchKernel(0, NULL, (unsigned)t.pages, add_one, &t, sizeof t));
		CHECK_OK(uvmDeviceSynchronize());
		for (size_t i = 0; i < t.pages; i++)
			wrong += t.b[i * 4096] != 1;
		CHECK_OK(uvmFree(t.b));
	}
	CHECK(wrong == 0);
	return check_done("stale_fault_test");
}
