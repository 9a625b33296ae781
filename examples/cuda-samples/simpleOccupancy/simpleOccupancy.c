/* Copyright (c) 2022, NVIDIA CORPORATION. All rights reserved.
 *
 * Redistribution and use in source and binary forms, with or without
 * modification, are permitted provided that the following conditions
 * are met:
 *  * Redistributions of source code must retain the above copyright
 *    notice, this list of conditions and the following disclaimer.
 *  * Redistributions in binary form must reproduce the above copyright
 *    notice, this list of conditions and the following disclaimer in the
 *    documentation and/or other materials provided with the distribution.
 *  * Neither the name of NVIDIA CORPORATION nor the names of its
 *    contributors may be used to endorse or promote products derived
 *    from this software without specific prior written permission.
 *
 * THIS SOFTWARE IS PROVIDED BY THE COPYRIGHT HOLDERS ``AS IS'' AND ANY
 * EXPRESS OR IMPLIED WARRANTIES, INCLUDING, BUT NOT LIMITED TO, THE
 * IMPLIED WARRANTIES OF MERCHANTABILITY AND FITNESS FOR A PARTICULAR
 * PURPOSE ARE DISCLAIMED.  IN NO EVENT SHALL THE COPYRIGHT OWNER OR
 * CONTRIBUTORS BE LIABLE FOR ANY DIRECT, INDIRECT, INCIDENTAL, SPECIAL,
 * EXEMPLARY, OR CONSEQUENTIAL DAMAGES (INCLUDING, BUT NOT LIMITED TO,
 * PROCUREMENT OF SUBSTITUTE GOODS OR SERVICES; LOSS OF USE, DATA, OR
 * PROFITS; OR BUSINESS INTERRUPTION) HOWEVER CAUSED AND ON ANY THEORY
 * OF LIABILITY, WHETHER IN CONTRACT, STRICT LIABILITY, OR TORT
 * (INCLUDING NEGLIGENCE OR OTHERWISE) ARISING IN ANY WAY OUT OF THE USE
 * OF THIS SOFTWARE, EVEN IF ADVISED OF THE POSSIBILITY OF SUCH DAMAGE.
 */

/*
 * Ported to softuvm from Samples/0_Introduction/simpleOccupancy/simpleOccupancy.cu
 * of https://github.com/NVIDIA/cuda-samples (commit c94ff366), under the
 * license above, mechanically: the CUDA runtime's calls, types and
 * constants renamed from cuda* to uvm* (uvm.h), each launch
 * kernel<<<grid, block, shared, stream>>>(args) written
 * uvmLaunchKernelGGL(kernel, grid, block, shared, stream, args)
 * (uvm_cuda.h), and C++ written as C. The kernels and the result checks
 * are the original's; changes beyond the renames are marked "softuvm:".
 */

/* softuvm: nvcc includes cuda_runtime.h first in every .cu file. */
#include <uvm_cuda.h>

#include <helper_cuda.h> // helper functions for CUDA error check
#include <stdio.h> /* softuvm: C has printf where C++ has iostream */

const int manualBlockSize = 32;

////////////////////////////////////////////////////////////////////////////////
// Test kernel
//
// This kernel squares each array element. Each thread addresses
// himself with threadIdx and blockIdx, so that it can handle any
// execution configuration, including anything the launch configurator
// API suggests.
////////////////////////////////////////////////////////////////////////////////
__global__ void square(int *array, int arrayCount)
{
    UVM_DYNAMIC_SHARED(int, dynamicSmem);
    int                   idx = threadIdx.x + blockIdx.x * blockDim.x;

    if (idx < arrayCount) {
        array[idx] *= array[idx];
    }
}

////////////////////////////////////////////////////////////////////////////////
// Potential occupancy calculator
//
// The potential occupancy is calculated according to the kernel and
// execution configuration the user desires. Occupancy is defined in
// terms of active blocks per multiprocessor, and the user can convert
// it to other metrics.
//
// This wrapper routine computes the occupancy of kernel, and reports
// it in terms of active warps / maximum warps per SM.
////////////////////////////////////////////////////////////////////////////////
static double reportPotentialOccupancy(void *kernel, int blockSize, size_t dynamicSMem)
{
    int            device;
    uvmDeviceProp prop;

    int numBlocks;
    int activeWarps;
    int maxWarps;

    double occupancy;

    checkCudaErrors(uvmGetDevice(&device));
    checkCudaErrors(uvmGetDeviceProperties(&prop, device));

    checkCudaErrors(uvmOccupancyMaxActiveBlocksPerMultiprocessor(&numBlocks, kernel, blockSize, dynamicSMem));

    activeWarps = numBlocks * blockSize / prop.warpSize;
    maxWarps    = prop.maxThreadsPerMultiProcessor / prop.warpSize;

    occupancy = (double)activeWarps / maxWarps;

    return occupancy;
}

////////////////////////////////////////////////////////////////////////////////
// Occupancy-based launch configurator
//
// The launch configurator, uvmOccupancyMaxPotentialBlockSize and
// uvmOccupancyMaxPotentialBlockSizeVariableSMem, suggests a block
// size that achieves the best theoretical occupancy. It also returns
// the minimum number of blocks needed to achieve the occupancy on the
// whole device.
//
// This launch configurator is purely occupancy-based. It doesn't
// translate directly to performance, but the suggestion should
// nevertheless be a good starting point for further optimizations.
//
// This function configures the launch based on the "automatic"
// argument, records the runtime, and reports occupancy and runtime.
////////////////////////////////////////////////////////////////////////////////
static int launchConfig(int *array, int arrayCount, bool automatic)
{
    int    blockSize;
    int    minGridSize;
    int    gridSize;
    size_t dynamicSMemUsage = 0;

    uvmEvent_t start;
    uvmEvent_t end;

    float elapsedTime;

    double potentialOccupancy;

    checkCudaErrors(uvmEventCreate(&start));
    checkCudaErrors(uvmEventCreate(&end));

    if (automatic) {
        checkCudaErrors(
            uvmOccupancyMaxPotentialBlockSize(&minGridSize, &blockSize, (void *)square, dynamicSMemUsage, arrayCount));

        printf("Suggested block size: %d\n"
               "Minimum grid size for maximum occupancy: %d\n", blockSize, minGridSize);
    }
    else {
        // This block size is too small. Given limited number of
        // active blocks per multiprocessor, the number of active
        // threads will be limited, and thus unable to achieve maximum
        // occupancy.
        //
        blockSize = manualBlockSize;
    }

    // Round up
    //
    gridSize = (arrayCount + blockSize - 1) / blockSize;

    // Launch and profile
    //
    checkCudaErrors(uvmEventRecord(start, 0)); // softuvm: C has no default arguments
    uvmLaunchKernelGGL(square, gridSize, blockSize, dynamicSMemUsage, 0, array, arrayCount);
    checkCudaErrors(uvmEventRecord(end, 0));

    checkCudaErrors(uvmDeviceSynchronize());

    // Calculate occupancy
    //
    potentialOccupancy = reportPotentialOccupancy((void *)square, blockSize, dynamicSMemUsage);

    printf("Potential occupancy: %g%%\n", potentialOccupancy * 100);

    // Report elapsed time
    //
    checkCudaErrors(uvmEventElapsedTime(&elapsedTime, start, end));
    printf("Elapsed time: %gms\n", elapsedTime);

    return 0;
}

////////////////////////////////////////////////////////////////////////////////
// The test
//
// The test generates an array and squares it with a CUDA kernel, then
// verifies the result.
////////////////////////////////////////////////////////////////////////////////
/* softuvm: C has no default arguments: main passes count, 1000000. */
static int test(bool automaticLaunchConfig, const int count)
{
    int *array;
    int *dArray;
    int  size = count * sizeof(int);

    array = (int *)malloc(count * sizeof(int));

    for (int i = 0; i < count; i += 1) {
        array[i] = i;
    }

    checkCudaErrors(uvmMalloc(&dArray, size));
    checkCudaErrors(uvmMemcpy(dArray, array, size, uvmMemcpyHostToDevice));

    for (int i = 0; i < count; i += 1) {
        array[i] = 0;
    }

    launchConfig(dArray, count, automaticLaunchConfig);

    checkCudaErrors(uvmMemcpy(array, dArray, size, uvmMemcpyDeviceToHost));
    checkCudaErrors(uvmFree(dArray));

    // Verify the return data
    //
    for (int i = 0; i < count; i += 1) {
        if (array[i] != i * i) {
            printf("element %d expected %d actual %d\n", i, i * i, array[i]);
            return 1;
        }
    }
    free(array);

    return 0;
}

////////////////////////////////////////////////////////////////////////////////
// Sample Main
//
// The sample runs the test with manually configured launch and
// automatically configured launch, and reports the occupancy and
// performance.
////////////////////////////////////////////////////////////////////////////////
int main()
{
    int status;

    printf("starting Simple Occupancy\n\n");

    printf("[ Manual configuration with %d threads per block ]\n", manualBlockSize);

    status = test(false, 1000000);
    if (status) {
        fprintf(stderr, "Test failed\n\n");
        return -1;
    }

    printf("\n");

    printf("[ Automatic, occupancy-based configuration ]\n");
    status = test(true, 1000000);
    if (status) {
        fprintf(stderr, "Test failed\n\n");
        return -1;
    }

    printf("\n");
    printf("Test PASSED\n\n");

    return 0;
}
