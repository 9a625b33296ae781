/* The launch coherence model's client side (see docs/architecture.md). */
#include "internal.h"

UVM_HIDDEN uvmError_t uvm__coherence_before_launch(int device, uint32_t stream, const char *kernel)
{
	(void)device; (void)stream; (void)kernel;
	return uvmSuccess;
}

UVM_HIDDEN uvmError_t uvm__coherence_after_sync(int device, uint32_t stream)
{
	(void)device; (void)stream;
	return uvmSuccess;
}
