/* touch: a C program that touches managed memory while a kernel that may
 * use it runs. Under the launch coherence model (UVM_COHERENCE=launch)
 * the touch must kill it with SIGBUS, and the server's log must name the
 * allocation and the kernel; under the fault model it runs to the end. */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
#include <uvm.h>

#define CHECK(call)                                                                              \
	do {                                                                                     \
		uvmError_t e_ = (call);                                                          \
		if (e_ != uvmSuccess) {                                                          \
			fprintf(stderr, "%s: %s: %s\n", #call, uvmGetErrorName(e_), uvmGetLastErrorMessage()); \
			exit(2);                                                                 \
		}                                                                                \
	} while (0)

/* wait_flag sets *flag to 1 (it runs), then waits until the host sets 2. */
static void wait_flag(unsigned tid, unsigned n, const void *params)
{
	(void)tid;
	(void)n;
	_Atomic int *flag = *(_Atomic int *const *)params;
	atomic_store(flag, 1);
	while (atomic_load(flag) != 2)
		usleep(50);
}

int main(void)
{
	_Atomic int *flag;
	unsigned char *p;
	CHECK(uvmHostAlloc((void **)&flag, sizeof *flag, uvmHostAllocMapped));
	CHECK(uvmMallocManaged((void **)&p, 4096, uvmMemAttachGlobal));
	int concurrent = -1;
	CHECK(uvmDeviceGetAttribute(&concurrent, uvmDevAttrConcurrentManagedAccess, 0));
	fprintf(stderr, "concurrent managed access %d\n", concurrent);
	p[0] = 1;
	CHECK(uvmLaunchKernel(0, NULL, 1, wait_flag, &flag, sizeof flag));
	while (atomic_load(flag) != 1)
		usleep(50);
	fprintf(stderr, "touching\n");
	p[0] = 2; /* SIGBUS under the launch model */
	atomic_store(flag, 2);
	CHECK(uvmDeviceSynchronize());
	fprintf(stderr, "touched, value %d\n", p[0]);
	return 0;
}
