/*
 * access_test.c: a C device process under the access counters. A kernel
 * reads a range it maps in host memory (accessed-by advice) again and
 * again while hint faults drop its mappings every few milliseconds and
 * delayed migration moves the range to the device under it; every read
 * must see the host's data, and the host must read it back intact.
 * integration/libuvm_test.go runs it with UVM_ACCESS_POLICY=period=5ms,
 * with eBPF counting and with user-space counting (MINOR faults, which
 * the device process must register on its remote mappings).
 */
#define _GNU_SOURCE
#include <stdint.h>

#include "check.h"

struct sum_params {
	const uint8_t *data;
	size_t n;
	uint64_t *out;
};

/* sum: thread 0 adds up every byte. */
static void sum(unsigned tid, unsigned nthreads, const void *params)
{
	(void)nthreads;
	const struct sum_params *p = params;
	if (tid != 0)
		return;
	uint64_t s = 0;
	for (size_t i = 0; i < p->n; i++)
		s += p->data[i];
	*p->out = s;
}

int main(void)
{
	const size_t n = 1 << 20;
	uint8_t *data;
	uint64_t *out;
	CHECK_OK(uvmMallocManaged((void **)&data, n, uvmMemAttachGlobal));
	CHECK_OK(uvmMallocManaged((void **)&out, sizeof *out, uvmMemAttachGlobal));
	uint64_t want = 0;
	for (size_t i = 0; i < n; i++) {
		data[i] = (uint8_t)(i * 7 + 3);
		want += data[i];
	}
	CHECK_OK(uvmMemPrefetchAsync(out, sizeof *out, 0, NULL));
	struct sum_params p = {.data = data, .n = 0, .out = out};
	CHECK_OK(uvmLaunchKernel(0, NULL, 1, sum, &p, sizeof p)); /* starts the device process, reading nothing */
	CHECK_OK(uvmDeviceSynchronize());
	p.n = n;
	CHECK_OK(uvmMemAdvise(data, n, uvmMemAdviseSetAccessedBy, 0));
	int wrong = 0;
	for (int i = 0; i < 300; i++) {
		*out = 0;
		CHECK_OK(uvmLaunchKernel(0, NULL, 1, sum, &p, sizeof p));
		CHECK_OK(uvmDeviceSynchronize());
		wrong += *out != want;
	}
	CHECK(wrong == 0);
	uint64_t back = 0;
	for (size_t i = 0; i < n; i++)
		back += data[i];
	CHECK(back == want);
	CHECK_OK(uvmFree(data));
	CHECK_OK(uvmFree(out));
	return check_done("access_test");
}
