/*
 * grid.c: the program's side of grid launches (uvmLaunchGrid,
 * uvmLaunchCooperativeKernel), occupancy, and the stack limit of a grid
 * kernel's threads. A grid launch travels to the device's process as a
 * launch-grid message, in stream order with every other launch
 * (stream.c's uvm__launch); block.c runs it there.
 */
#include "internal.h"

#include <stdio.h>

/* Each device's uvmLimitStackSize (0: the default), read at each launch. */
static size_t stack_limit[UVM_MAX_DEVICES];

static uvmError_t launch_grid(const char *what, int device, uvmStream_t stream, uvmDim3 grid, uvmDim3 block, size_t shared,
			      uvmGridKernel_t kernel, const void *params, size_t paramsSize, uint32_t flags)
{
	if (uvm__device_process >= 0)
		return uvm__refuse_in_device(what);
	char msg[384];
	if (uvm__grid_check(grid, block, shared, 0, msg, sizeof msg))
		return uvm__fail(uvmErrorInvalidConfiguration, "%s on device %d: %s", what, device, msg);
	struct uvm_session *s = NULL;
	char on[64];
	snprintf(on, sizeof on, "%s on", what);
	uvmError_t err = uvm__check_device(device, on, &s);
	if (err)
		return err;
	if (flags & UVM_GRID_COOPERATIVE) {
		uint64_t blocks = (uint64_t)grid.x * grid.y * grid.z, threads = (uint64_t)block.x * block.y * block.z;
		int per = uvm__max_active_blocks(threads, shared);
		uint64_t most = (uint64_t)per * (uint64_t)s->devices[device].workers;
		if (blocks > most)
			return uvm__fail(uvmErrorCooperativeLaunchTooLarge,
					 "%s on device %d: a grid of %llu blocks (%u,%u,%u) of %llu threads with %zu bytes of shared memory: at most %llu "
					 "blocks are resident at once (%d per multiprocessor, uvmOccupancyMaxActiveBlocksPerMultiprocessor, times %d "
					 "multiprocessors, the device's workers)",
					 what, device, (unsigned long long)blocks, grid.x, grid.y, grid.z, (unsigned long long)threads, shared,
					 (unsigned long long)most, per, s->devices[device].workers);
	}
	struct uvm_launch_shape shape = {.grid = true, .grid_dim = grid, .block_dim = block, .shared = (uint32_t)shared,
					 .stack = (uint32_t)__atomic_load_n(&stack_limit[device], __ATOMIC_RELAXED), .flags = flags};
	return uvm__launch(device, stream, (uintptr_t)kernel, &shape, params, paramsSize, what);
}

uvmError_t uvmLaunchGrid(int device, uvmStream_t stream, uvmDim3 gridDim, uvmDim3 blockDim, size_t sharedMem, uvmGridKernel_t kernel,
			 const void *params, size_t paramsSize)
{
	return launch_grid("uvmLaunchGrid", device, stream, gridDim, blockDim, sharedMem, kernel, params, paramsSize, 0);
}

uvmError_t uvmLaunchCooperativeKernel(int device, uvmStream_t stream, uvmDim3 gridDim, uvmDim3 blockDim, size_t sharedMem,
				      uvmGridKernel_t kernel, const void *params, size_t paramsSize)
{
	return launch_grid("uvmLaunchCooperativeKernel", device, stream, gridDim, blockDim, sharedMem, kernel, params, paramsSize,
			   UVM_GRID_COOPERATIVE);
}

uvmError_t uvmOccupancyMaxActiveBlocksPerMultiprocessor(int *numBlocks, const void *kernel, int blockSize, size_t dynamicSMemSize)
{
	if (!numBlocks)
		return uvm__fail(uvmErrorInvalidValue, "uvmOccupancyMaxActiveBlocksPerMultiprocessor: numBlocks is NULL; want a pointer to an int");
	if (!kernel)
		return uvm__fail(uvmErrorInvalidValue, "uvmOccupancyMaxActiveBlocksPerMultiprocessor: the kernel is NULL; want a kernel of the program");
	if (blockSize <= 0)
		return uvm__fail(uvmErrorInvalidValue, "uvmOccupancyMaxActiveBlocksPerMultiprocessor: a block of %d threads; want 1 to %u", blockSize,
				 UVM_MAX_THREADS_PER_BLOCK);
	*numBlocks = uvm__max_active_blocks((uint64_t)blockSize, dynamicSMemSize);
	return uvm__ok();
}

uvmError_t uvmOccupancyMaxPotentialBlockSize(int *minGridSize, int *blockSize, const void *kernel, size_t dynamicSMemSize, int blockSizeLimit)
{
	const char *what = "uvmOccupancyMaxPotentialBlockSize";
	if (!minGridSize || !blockSize)
		return uvm__fail(uvmErrorInvalidValue, "%s: %s is NULL; want a pointer to an int", what, minGridSize ? "blockSize" : "minGridSize");
	if (!kernel)
		return uvm__fail(uvmErrorInvalidValue, "%s: the kernel is NULL; want a kernel of the program", what);
	if (blockSizeLimit < 0)
		return uvm__fail(uvmErrorInvalidValue, "%s: a block size limit of %d; want 0 (none) or more", what, blockSizeLimit);
	/* A limit past the device's own is no limit, as in CUDA (programs
	 * pass the number of elements). */
	if (blockSizeLimit == 0 || blockSizeLimit > (int)UVM_MAX_THREADS_PER_BLOCK)
		blockSizeLimit = (int)UVM_MAX_THREADS_PER_BLOCK;
	int device = uvm__current_device();
	struct uvm_session *s = NULL;
	uvmError_t err = uvm__check_device(device, "uvmOccupancyMaxPotentialBlockSize: the current device", &s);
	if (err)
		return err;
	/* CUDA's search: from the largest block down, the first size that
	 * keeps the most threads resident (a warp here is one thread). */
	int best = 0, best_blocks = 0;
	uint64_t most = 0;
	for (int size = blockSizeLimit; size > 0; size--) {
		int n = uvm__max_active_blocks((uint64_t)size, dynamicSMemSize);
		if ((uint64_t)n * (uint64_t)size > most) {
			most = (uint64_t)n * (uint64_t)size;
			best = size;
			best_blocks = n;
		}
	}
	if (!best)
		return uvm__fail(uvmErrorInvalidValue, "%s: no block fits %zu bytes of dynamic shared memory; want at most %u", what, dynamicSMemSize,
				 UVM_MAX_SHARED_MEMORY_PER_BLOCK);
	*blockSize = best;
	*minGridSize = best_blocks * s->devices[device].workers;
	return uvm__ok();
}

uvmError_t uvmDeviceSetLimit(uvmLimit limit, size_t value)
{
	if (uvm__device_process >= 0)
		return uvm__refuse_in_device("uvmDeviceSetLimit");
	if (limit != uvmLimitStackSize)
		return uvm__fail(uvmErrorUnsupportedLimit, "uvmDeviceSetLimit: limit %d: only uvmLimitStackSize (%d) has a meaning here", (int)limit,
				 (int)uvmLimitStackSize);
	if (value < UVM_MIN_STACK_SIZE || value > UVM_MAX_STACK_SIZE)
		return uvm__fail(uvmErrorInvalidValue, "uvmDeviceSetLimit: a stack of %zu bytes; want %u to %u", value, UVM_MIN_STACK_SIZE,
				 UVM_MAX_STACK_SIZE);
	int device = uvm__current_device();
	uvmError_t err = uvm__check_device(device, "uvmDeviceSetLimit: the current device", NULL);
	if (err)
		return err;
	__atomic_store_n(&stack_limit[device], value, __ATOMIC_RELAXED);
	return uvm__ok();
}

uvmError_t uvmDeviceGetLimit(size_t *value, uvmLimit limit)
{
	if (uvm__device_process >= 0)
		return uvm__refuse_in_device("uvmDeviceGetLimit");
	if (!value)
		return uvm__fail(uvmErrorInvalidValue, "uvmDeviceGetLimit: value is NULL; want a pointer to a size_t");
	if (limit != uvmLimitStackSize)
		return uvm__fail(uvmErrorUnsupportedLimit, "uvmDeviceGetLimit: limit %d: only uvmLimitStackSize (%d) has a meaning here", (int)limit,
				 (int)uvmLimitStackSize);
	int device = uvm__current_device();
	uvmError_t err = uvm__check_device(device, "uvmDeviceGetLimit: the current device", NULL);
	if (err)
		return err;
	size_t v = __atomic_load_n(&stack_limit[device], __ATOMIC_RELAXED);
	*value = v ? v : UVM_DEFAULT_STACK_SIZE;
	return uvm__ok();
}
