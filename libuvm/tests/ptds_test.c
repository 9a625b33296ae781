/*
 * ptds_test.c: a translation unit built for per-thread default streams
 * (UVM_API_PER_THREAD_DEFAULT_STREAM, as CUDA_API_PER_THREAD_DEFAULT_STREAM
 * or nvcc --default-stream per-thread): NULL is each thread's own
 * stream, and the synchronous copies and fills are issued on it. Run by
 * integration/libuvm_test.go with a private server, 2 devices of 2
 * workers and 64 MiB arenas.
 */
#define _GNU_SOURCE
#define UVM_API_PER_THREAD_DEFAULT_STREAM
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "check.h"
#include "gate.h"

static const uint32_t N = 16 * 1024;

/* Each thread's NULL is its own stream: this thread's work, its
 * synchronize, copy and fill do not wait for the other thread's gated
 * kernel. uvmStreamLegacy is still the legacy stream, which waits for
 * this thread's default stream. */
static void test_null_is_the_thread_stream(void)
{
	/* NULL: the other thread's own stream. */
	struct gated_thread g = {.f = flag_new(), .stream = NULL, .n = N, .value = 40};
	uint32_t *a, *b, *dev;
	CHECK_OK(uvmMallocManaged((void **)&g.out, N * sizeof *g.out, uvmMemAttachGlobal));
	CHECK_OK(uvmMallocManaged((void **)&a, N * sizeof *a, uvmMemAttachGlobal));
	CHECK_OK(uvmMallocManaged((void **)&b, N * sizeof *b, uvmMemAttachGlobal));
	CHECK_OK(uvmMalloc((void **)&dev, N * sizeof *dev));
	if (!g.f.p || !g.out || !a || !b || !dev)
		return;
	pthread_t t;
	if (!gated_thread_start(&g, &t)) {
		CHECK(!"pthread_create");
		return;
	}

	for (uint32_t i = 0; i < N; i++)
		a[i] = 7 + i;
	struct copy_params c = {.src = a, .dst = dev, .n = N};
	CHECK_OK(uvmLaunchKernel(0, NULL, 2, copy_kernel, &c, sizeof c));
	CHECK_OK(uvmMemcpy(b, dev, N * sizeof *b, uvmMemcpyDeviceToHost));
	CHECK(filled(b, N, 7));
	CHECK_OK(uvmMemset(dev, 0, N * sizeof *dev));
	CHECK_OK(uvmStreamSynchronize(NULL));
	CHECK(uvmStreamQuery(NULL) == uvmSuccess);
	unsigned flags = 9;
	CHECK_OK(uvmStreamGetFlags(NULL, &flags));
	CHECK(flags == uvmStreamDefault);
	/* Still gated: nothing here waited for it. */
	CHECK(g.f.p[1] == 0 && g.out[N - 1] == 0);

	/* The legacy stream, named, waits for this thread's stream. */
	struct copy_params back = {.src = dev, .dst = b, .n = N};
	for (uint32_t i = 0; i < N; i++)
		a[i] = 90 + i;
	CHECK_OK(uvmLaunchKernel(0, NULL, 2, copy_kernel, &c, sizeof c));
	CHECK_OK(uvmLaunchKernel(0, uvmStreamLegacy, 2, copy_kernel, &back, sizeof back));
	flag_set(g.f); /* the legacy stream waits for the other thread's stream too */
	CHECK_OK(uvmStreamSynchronize(uvmStreamLegacy));
	CHECK(filled(b, N, 90));
	pthread_join(t, NULL);
	CHECK(g.failures == 0);
	CHECK(g.f.p[1] == 0);
	CHECK(filled(g.out, N, 40));
	CHECK_OK(uvmFree(g.out));
	CHECK_OK(uvmFree(a));
	CHECK_OK(uvmFree(b));
	CHECK_OK(uvmFree(dev));
	CHECK_OK(uvmFreeHost(g.f.p));
}

int main(void)
{
	test_null_is_the_thread_stream();
	return check_done("ptds_test");
}
