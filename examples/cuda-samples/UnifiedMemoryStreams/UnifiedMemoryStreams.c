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
 * Ported to softuvm from Samples/0_Introduction/UnifiedMemoryStreams/UnifiedMemoryStreams.cu
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

/*
 * This sample implements a simple task consumer using threads and streams
 * with all data in Unified Memory, and tasks consumed by both host and device
 */

// system includes
#include <stdio.h>
#include <time.h>
/* softuvm: the sample's USE_PTHREADS build (its default, OpenMP, is C++'s
 * omp parallel for over a std::vector: the same tasks on the same four
 * threads). */
#include <pthread.h>
#include <stdlib.h>

/* softuvm: cuBLAS is a library, not a runtime call: its cublasDgemv is
 * the kernel gemvKernel below, on the same stream, with cuBLAS's
 * meaning (y = alpha A x + beta y, A in column-major order with leading
 * dimension lda; handles and cublasSetStream have nothing to carry). */

// utilities
#include <helper_cuda.h>

const char *sSDKname = "UnifiedMemoryStreams";

// simple task
/* softuvm: C has no templates nor constructors: a Task of doubles, and
 * its constructor and destructor as functions. */
typedef struct Task
{
    unsigned int size, id;
    double      *data;
    double      *result;
    double      *vector;
} Task;

void TaskFree(Task *t)
{
    // ensure all memory is deallocated
    checkCudaErrors(uvmDeviceSynchronize());
    checkCudaErrors(uvmFree(t->data));
    checkCudaErrors(uvmFree(t->result));
    checkCudaErrors(uvmFree(t->vector));
}

void TaskAllocate(Task *t, const unsigned int s, const unsigned int unique_id)
{
    // allocate unified memory outside of constructor
    t->id   = unique_id;
    t->size = s;
    checkCudaErrors(uvmMallocManaged(&t->data, sizeof(double) * t->size * t->size));
    checkCudaErrors(uvmMallocManaged(&t->result, sizeof(double) * t->size));
    checkCudaErrors(uvmMallocManaged(&t->vector, sizeof(double) * t->size));
    checkCudaErrors(uvmDeviceSynchronize());

    // populate data with random elements
    for (unsigned int i = 0; i < t->size * t->size; i++) {
        t->data[i] = drand48();
    }

    for (unsigned int i = 0; i < t->size; i++) {
        t->result[i] = 0.;
        t->vector[i] = drand48();
    }
}

struct threadData_t
{
    int           tid;
    Task         *TaskListPtr;
    uvmStream_t  *streams;
    int           taskSize;
};

typedef struct threadData_t threadData;

// simple host dgemv: assume data is in row-major format and square
void gemv(int m, int n, double alpha, double *A, double *x, double beta, double *result)
{
    (void)m, (void)alpha; /* softuvm: unused in the original too */
    // rows
    for (int i = 0; i < n; i++) {
        result[i] *= beta;

        for (int j = 0; j < n; j++) {
            result[i] += A[i * n + j] * x[j];
        }
    }
}

/* softuvm: cublasDgemv(handle, CUBLAS_OP_N, m, n, &alpha, A, lda, x, 1,
 * &beta, y, 1), one thread per element of y. */
__global__ void gemvKernel(int m, int n, double alpha, const double *A, int lda, const double *x, double beta, double *y)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;

    if (i < m) {
        double sum = 0.0;

        for (int j = 0; j < n; j++) {
            sum += A[(size_t)j * lda + i] * x[j];
        }

        y[i] = alpha * sum + beta * y[i];
    }
}

// execute a single task on either host or device depending on size
void *execute(void *inpArgs)
{
    threadData   *dataPtr = (threadData *)inpArgs;
    uvmStream_t  *stream  = dataPtr->streams;
    int           tid     = dataPtr->tid;

    for (int i = 0; i < dataPtr->taskSize; i++) {
        Task *t = &dataPtr->TaskListPtr[i];

        if (t->size < 100) {
            // perform on host
            printf("Task [%d], thread [%d] executing on host (%d)\n", t->id, tid, t->size);

            // attach managed memory to a (dummy) stream to allow host access while
            // the device is running
            checkCudaErrors(uvmStreamAttachMemAsync(stream[0], t->data, 0, uvmMemAttachHost));
            checkCudaErrors(uvmStreamAttachMemAsync(stream[0], t->vector, 0, uvmMemAttachHost));
            checkCudaErrors(uvmStreamAttachMemAsync(stream[0], t->result, 0, uvmMemAttachHost));
            // necessary to ensure Async uvmStreamAttachMemAsync calls have finished
            checkCudaErrors(uvmStreamSynchronize(stream[0]));
            // call the host operation
            gemv(t->size, t->size, 1.0, t->data, t->vector, 0.0, t->result);
        }
        else {
            // perform on device
            printf("Task [%d], thread [%d] executing on device (%d)\n", t->id, tid, t->size);
            double one  = 1.0;
            double zero = 0.0;

            // attach managed memory to my stream
            checkCudaErrors(uvmStreamAttachMemAsync(stream[tid + 1], t->data, 0, uvmMemAttachSingle));
            checkCudaErrors(uvmStreamAttachMemAsync(stream[tid + 1], t->vector, 0, uvmMemAttachSingle));
            checkCudaErrors(uvmStreamAttachMemAsync(stream[tid + 1], t->result, 0, uvmMemAttachSingle));
            // call the device operation
            checkCudaErrors(uvmLaunchKernelGGL(gemvKernel, (t->size + 255) / 256, 256, 0, stream[tid + 1],
                                               t->size, t->size, one, t->data, t->size, t->vector, zero, t->result));
        }
    }

    pthread_exit(NULL);
}

// populate a list of tasks with random sizes
void initialise_tasks(Task *TaskList, unsigned int n)
{
    for (unsigned int i = 0; i < n; i++) {
        // generate random size
        int size;
        size = max((int)(drand48() * 1000.0), 64);
        TaskAllocate(&TaskList[i], size, i);
    }
}

int main(int argc, char **argv)
{
    // set device
    uvmDeviceProp device_prop;
    int           dev_id = findCudaDevice(argc, (const char **)argv);
    checkCudaErrors(uvmGetDeviceProperties(&device_prop, dev_id));

    if (!device_prop.managedMemory) {
        // This samples requires being run on a device that supports Unified Memory
        fprintf(stderr, "Unified Memory not supported on this device\n");

        exit(EXIT_WAIVED);
    }

    int computeMode;
    checkCudaErrors(uvmDeviceGetAttribute(&computeMode, uvmDevAttrComputeMode, dev_id));
    if (computeMode == uvmComputeModeProhibited) {
        // This sample requires being run with a default or process exclusive mode
        fprintf(stderr,
                "This sample requires a device in either default or process "
                "exclusive mode\n");

        exit(EXIT_WAIVED);
    }

    // randomise task sizes
    int seed = (int)time(NULL);
    srand48(seed);

    // set number of threads
    enum { nthreads = 4 }; /* softuvm: a constant C can size an array with */

    // number of streams = number of threads
    uvmStream_t *streams = (uvmStream_t *)malloc((nthreads + 1) * sizeof(uvmStream_t));

    for (int i = 0; i < nthreads + 1; i++) {
        checkCudaErrors(uvmStreamCreate(&streams[i]));
    }

    // create list of N tasks
    unsigned int N = 40;
    Task        *TaskList = (Task *)calloc(N, sizeof(Task));
    initialise_tasks(TaskList, N);

    printf("Executing tasks on host / device\n");

    // run through all tasks using threads and streams
    pthread_t   threads[nthreads];
    threadData *InputToThreads = (threadData *)malloc(nthreads * sizeof(threadData));

    for (int i = 0; i < nthreads; i++) {
        checkCudaErrors(uvmSetDevice(dev_id));
        InputToThreads[i].tid     = i;
        InputToThreads[i].streams = streams;

        if ((N / nthreads) == 0) {
            InputToThreads[i].taskSize    = (N / nthreads);
            InputToThreads[i].TaskListPtr = &TaskList[i * (N / nthreads)];
        }
        else {
            if (i == nthreads - 1) {
                InputToThreads[i].taskSize    = (N / nthreads) + (N % nthreads);
                InputToThreads[i].TaskListPtr = &TaskList[i * (N / nthreads) + (N % nthreads)];
            }
            else {
                InputToThreads[i].taskSize    = (N / nthreads);
                InputToThreads[i].TaskListPtr = &TaskList[i * (N / nthreads)];
            }
        }

        pthread_create(&threads[i], NULL, &execute, &InputToThreads[i]);
    }
    for (int i = 0; i < nthreads; i++) {
        pthread_join(threads[i], NULL);
    }

    uvmDeviceSynchronize();

    // Destroy CUDA Streams
    for (int i = 0; i < nthreads + 1; i++) {
        uvmStreamDestroy(streams[i]);
    }

    // Free TaskList
    for (unsigned int i = 0; i < N; i++) {
        TaskFree(&TaskList[i]);
    }
    free(TaskList);

    printf("All Done!\n");
    exit(EXIT_SUCCESS);
}
