/*
 * profiler_test.c: uvmProfilerStart and uvmProfilerStop record this
 * process's events between them to PROGRAM.uvmtrace in the working
 * directory (no UVM_TRACE here). The program prints the address of the
 * allocation it made between them and the pages it moved there;
 * integration/libuvm_test.go reads the trace and checks that it holds
 * that allocation and those moves, and nothing of the work before start
 * or after stop. Run with a private server, 2 devices of 2 workers and 64
 * MiB arenas.
 */
#include <stdint.h>
#include <unistd.h>

#include "check.h"

#define SIZE (2ul << 20)

static void touch(uint8_t *p) { memset(p, 3, SIZE); }

int main(void)
{
	CHECK(getenv("UVM_TRACE") == NULL);
	uint8_t *before, *during, *after;
	CHECK_OK(uvmMallocManaged((void **)&before, SIZE, uvmMemAttachGlobal));
	touch(before);
	CHECK_OK(uvmMemPrefetchAsync(before, SIZE, 0, NULL));
	CHECK_OK(uvmDeviceSynchronize());
	CHECK_OK(uvmProfilerStop()); /* nothing records: no error */
	CHECK(access("profiler_test.uvmtrace", F_OK) != 0);

	CHECK_OK(uvmProfilerStart());
	CHECK_OK(uvmProfilerStart()); /* twice: no error */
	CHECK_OK(uvmMallocManaged((void **)&during, SIZE, uvmMemAttachGlobal));
	touch(during);
	CHECK_OK(uvmMemPrefetchAsync(during, SIZE, 0, NULL));
	CHECK_OK(uvmMemPrefetchAsync(during, SIZE, uvmCpuDeviceId, NULL));
	CHECK_OK(uvmDeviceSynchronize());
	CHECK_OK(uvmProfilerStop());
	CHECK(access("profiler_test.uvmtrace", R_OK) == 0);

	CHECK_OK(uvmMallocManaged((void **)&after, SIZE, uvmMemAttachGlobal));
	touch(after);
	CHECK_OK(uvmMemPrefetchAsync(after, SIZE, 0, NULL));
	CHECK_OK(uvmDeviceSynchronize());
	printf("profiled: allocation %#lx, %lu pages to device 0 and back\n", (unsigned long)(uintptr_t)during, SIZE / 4096);
	return check_done("profiler_test");
}
