/*
 * cuda_test.c: uvm_cuda.h, CUDA's kernel language in C: kernels written
 * as CUDA's (threadIdx, __shared__ tiles, __syncthreads, atomics,
 * __managed__ and __constant__ variables), launched with
 * uvmLaunchKernelGGL, each result checked against the host's own
 * computation. Run by integration/libuvm_test.go with a private server,
 * 2 devices of 2 workers and 64 MiB arenas.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "uvm_cuda.h"

#include "check.h"

/* ---- vectorAdd, as the CUDA sample writes it ---- */

__global__ void vectorAdd(const float *A, const float *B, float *C, int numElements)
{
	int i = blockDim.x * blockIdx.x + threadIdx.x;
	if (i < numElements)
		C[i] = A[i] + B[i] + 0.0f;
}

static void test_vector_add(void)
{
	int numElements = 50000;
	size_t size = numElements * sizeof(float);
	float *A, *B, *C;
	CHECK_OK(uvmMallocManaged((void **)&A, size, uvmMemAttachGlobal));
	CHECK_OK(uvmMallocManaged((void **)&B, size, uvmMemAttachGlobal));
	CHECK_OK(uvmMallocManaged((void **)&C, size, uvmMemAttachGlobal));
	for (int i = 0; i < numElements; i++) {
		A[i] = (float)(i % 1000) / 7;
		B[i] = (float)(i % 333) * 3;
	}
	int threadsPerBlock = 256;
	int blocksPerGrid = (numElements + threadsPerBlock - 1) / threadsPerBlock;
	CHECK_OK(uvmLaunchKernelGGL(vectorAdd, blocksPerGrid, threadsPerBlock, 0, 0, A, B, C, numElements));
	CHECK_OK(uvmGetLastError());
	CHECK_OK(uvmDeviceSynchronize());
	int bad = 0;
	for (int i = 0; i < numElements; i++)
		bad += C[i] != (float)(i % 1000) / 7 + (float)(i % 333) * 3;
	CHECK(bad == 0);
	/* The same kernel launched again, from the same function. */
	CHECK_OK(uvmLaunchKernelGGL(vectorAdd, blocksPerGrid, threadsPerBlock, 0, 0, C, C, C, numElements / 2));
	CHECK_OK(uvmDeviceSynchronize());
	for (int i = 0; i < numElements; i++)
		bad += C[i] != ((float)(i % 1000) / 7 + (float)(i % 333) * 3) * (i < numElements / 2 ? 2 : 1);
	CHECK(bad == 0);
	uvmFree(A);
	uvmFree(B);
	uvmFree(C);
}

/* ---- matrixMul with __shared__ tiles, as the CUDA sample's ---- */

#define BLOCK_SIZE 16

__global__ void matrixMulCUDA(float *C, float *A, float *B, int wA, int wB)
{
	int bx = blockIdx.x, by = blockIdx.y, tx = threadIdx.x, ty = threadIdx.y;
	int aBegin = wA * BLOCK_SIZE * by, aEnd = aBegin + wA - 1, aStep = BLOCK_SIZE;
	int bBegin = BLOCK_SIZE * bx, bStep = BLOCK_SIZE * wB;
	float Csub = 0;
	for (int a = aBegin, b = bBegin; a <= aEnd; a += aStep, b += bStep) {
		__shared__ float As[BLOCK_SIZE][BLOCK_SIZE];
		__shared__ float Bs[BLOCK_SIZE][BLOCK_SIZE];
		As[ty][tx] = A[a + wA * ty + tx];
		Bs[ty][tx] = B[b + wB * ty + tx];
		__syncthreads();
		for (int k = 0; k < BLOCK_SIZE; ++k)
			Csub += As[ty][k] * Bs[k][tx];
		__syncthreads();
	}
	int c = wB * BLOCK_SIZE * by + BLOCK_SIZE * bx;
	C[c + wB * ty + tx] = Csub;
}

static void test_matrix_mul(void)
{
	const int hA = 64, wA = 48, wB = 80;
	float *A, *B, *C;
	CHECK_OK(uvmMallocManaged((void **)&A, hA * wA * sizeof *A, uvmMemAttachGlobal));
	CHECK_OK(uvmMallocManaged((void **)&B, wA * wB * sizeof *B, uvmMemAttachGlobal));
	CHECK_OK(uvmMallocManaged((void **)&C, hA * wB * sizeof *C, uvmMemAttachGlobal));
	for (int i = 0; i < hA * wA; i++)
		A[i] = (float)(i % 7);
	for (int i = 0; i < wA * wB; i++)
		B[i] = (float)(i % 5) - 2;
	dim3 threads = dim3(BLOCK_SIZE, BLOCK_SIZE);
	dim3 grid = dim3(wB / threads.x, hA / threads.y);
	CHECK_OK(uvmLaunchKernelGGL(matrixMulCUDA, grid, threads, 0, 0, C, A, B, wA, wB));
	CHECK_OK(uvmDeviceSynchronize());
	int bad = 0;
	for (int r = 0; r < hA; r++)
		for (int c = 0; c < wB; c++) {
			float want = 0;
			for (int k = 0; k < wA; k++)
				want += A[r * wA + k] * B[k * wB + c];
			if (C[r * wB + c] != want && bad++ < 3)
				fprintf(stderr, "matrixMul: C[%d][%d] = %g, want %g\n", r, c, C[r * wB + c], want);
		}
	CHECK(bad == 0);
	uvmFree(A);
	uvmFree(B);
	uvmFree(C);
}

/* ---- a reduction in dynamic shared memory, as the CUDA sample's
 * reduce2 ---- */

__global__ void reduce2(const int *g_idata, int *g_odata, unsigned int n)
{
	UVM_DYNAMIC_SHARED(int, sdata);
	unsigned int tid = threadIdx.x;
	unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
	sdata[tid] = (i < n) ? g_idata[i] : 0;
	__syncthreads();
	for (unsigned int s = blockDim.x / 2; s > 0; s >>= 1) {
		if (tid < s)
			sdata[tid] += sdata[tid + s];
		__syncthreads();
	}
	if (tid == 0)
		g_odata[blockIdx.x] = sdata[0];
}

static void test_reduction(void)
{
	const unsigned n = 100000, threads = 256, blocks = (n + threads - 1) / threads;
	int *in, *out;
	CHECK_OK(uvmMallocManaged((void **)&in, n * sizeof *in, uvmMemAttachGlobal));
	CHECK_OK(uvmMallocManaged((void **)&out, blocks * sizeof *out, uvmMemAttachGlobal));
	long long want = 0;
	for (unsigned i = 0; i < n; i++)
		want += in[i] = (int)(i * 7919 % 1000) - 500;
	CHECK_OK(uvmLaunchKernelGGL(reduce2, blocks, threads, threads * sizeof(int), 0, in, out, n));
	CHECK_OK(uvmDeviceSynchronize());
	long long got = 0;
	for (unsigned b = 0; b < blocks; b++) {
		long long part = 0;
		for (unsigned i = b * threads; i < n && i < (b + 1) * threads; i++)
			part += in[i];
		CHECK(out[b] == part);
		got += out[b];
	}
	CHECK(got == want);
	uvmFree(in);
	uvmFree(out);
}

/* ---- managed and constant variables ---- */

__device__ __managed__ int result;
__managed__ float table[1000] = {1.5f, 2.5f, 3.5f};
__constant__ int coefficients[4];

__global__ void use_variables(int n)
{
	int i = blockIdx.x * blockDim.x + threadIdx.x;
	if (i < n)
		table[i] = table[i] * coefficients[i % 4] + (float)i;
	if (i == 0)
		atomicAdd(&result, n);
}

static void test_variables(void)
{
	uvmPointerAttributes pa;
	CHECK_OK(uvmPointerGetAttributes(&pa, table));
	CHECK(pa.type == uvmMemoryTypeManaged);
	CHECK_OK(uvmPointerGetAttributes(&pa, &result));
	CHECK(pa.type == uvmMemoryTypeManaged);
	CHECK(table[0] == 1.5f && table[2] == 3.5f && table[3] == 0); /* the initializer, kept */
	int host_coefficients[4] = {2, 3, 4, 5};
	CHECK_OK(uvmMemcpyToSymbol(coefficients, host_coefficients, sizeof host_coefficients));
	for (int i = 3; i < 1000; i++)
		table[i] = (float)(i % 10);
	result = 100;
	CHECK_OK(uvmLaunchKernelGGL(use_variables, 4, 256, 0, 0, 1000));
	CHECK_OK(uvmDeviceSynchronize());
	int bad = 0;
	for (int i = 0; i < 1000; i++) {
		float before = i == 0 ? 1.5f : i == 1 ? 2.5f : i == 2 ? 3.5f : (float)(i % 10);
		bad += table[i] != before * host_coefficients[i % 4] + (float)i;
	}
	CHECK(bad == 0);
	CHECK(result == 1100);
	/* The host changes them after the device's process started: the next
	 * launch sees it, as the device reads managed memory. */
	host_coefficients[1] = 0;
	CHECK_OK(uvmMemcpyToSymbol(coefficients, &host_coefficients[1], sizeof(int), sizeof(int)));
	int back[4];
	CHECK_OK(uvmMemcpyFromSymbol(back, coefficients, sizeof back));
	CHECK(back[0] == 2 && back[1] == 0 && back[2] == 4 && back[3] == 5);
	for (int i = 0; i < 1000; i++)
		table[i] = 1;
	CHECK_OK(uvmLaunchKernelGGL(use_variables, 4, 256, 0, 0, 1000));
	CHECK_OK(uvmDeviceSynchronize());
	for (int i = 0; i < 1000; i++)
		bad += table[i] != (float)host_coefficients[i % 4] + (float)i;
	CHECK(bad == 0);
	CHECK(result == 2100);
	void *addr = NULL;
	size_t size = 0;
	CHECK_OK(uvmGetSymbolAddress(&addr, table));
	CHECK_OK(uvmGetSymbolSize(&size, table));
	CHECK(addr == (void *)table && size == sizeof table);
	/* Device 1 sees the same copy. */
	CHECK_OK(uvmSetDevice(1));
	CHECK_OK(uvmLaunchKernelGGL(use_variables, 1, 1, 0, 0, 0));
	CHECK_OK(uvmDeviceSynchronize());
	CHECK(result == 2100);
	CHECK_OK(uvmSetDevice(0));
}

/* ---- atomics ---- */

struct counters {
	int i;
	unsigned int u;
	unsigned long long ull;
	float f;
	double d;
	int max, min;
	unsigned int inc, cas_wins;
	int exch_seen;
};

__global__ void atomics(struct counters *c)
{
	int t = blockIdx.x * blockDim.x + threadIdx.x;
	atomicAdd(&c->i, 1);
	atomicAdd(&c->u, 2u);
	atomicAdd(&c->ull, 1ull << 33);
	atomicAdd(&c->f, 0.5f);
	atomicAdd(&c->d, 0.25);
	atomicMax(&c->max, t);
	atomicMin(&c->min, -t);
	atomicInc(&c->inc, 9);
	if (atomicCAS(&c->exch_seen, 0, t + 1) == 0)
		atomicAdd(&c->cas_wins, 1u);
}

static void test_atomics(void)
{
	struct counters *c;
	const int n = 3 * 200;
	CHECK_OK(uvmMallocManaged((void **)&c, sizeof *c, uvmMemAttachGlobal));
	memset(c, 0, sizeof *c);
	CHECK_OK(uvmLaunchKernelGGL(atomics, 3, 200, 0, 0, c));
	CHECK_OK(uvmDeviceSynchronize());
	CHECK(c->i == n);
	CHECK(c->u == 2u * n);
	CHECK(c->ull == (unsigned long long)n << 33);
	CHECK(c->f == 0.5f * n);
	CHECK(c->d == 0.25 * n);
	CHECK(c->max == n - 1);
	CHECK(c->min == -(n - 1));
	CHECK(c->inc == n % 10); /* wraps to 0 after 9 */
	CHECK(c->cas_wins == 1 && c->exch_seen >= 1 && c->exch_seen <= n);
	uvmFree(c);
}

/* ---- a cooperative launch: a grid barrier between two phases ---- */

__global__ void two_phases(int *a, int *out, int n)
{
	int i = blockIdx.x * blockDim.x + threadIdx.x;
	a[i] = i * 3;
	uvmGridSync(); /* cooperative_groups::this_grid().sync() */
	out[i] = a[(i + blockDim.x) % n];
}

static void test_cooperative(void)
{
	int blocksPerSm = 0, sms = 0, threads = 128;
	CHECK_OK(uvmOccupancyMaxActiveBlocksPerMultiprocessor(&blocksPerSm, (const void *)two_phases, threads, 0));
	CHECK_OK(uvmDeviceGetAttribute(&sms, uvmDevAttrMultiProcessorCount, 0));
	int blocks = blocksPerSm * sms, n = blocks * threads;
	int *a, *out;
	CHECK_OK(uvmMallocManaged((void **)&a, n * sizeof *a, uvmMemAttachGlobal));
	CHECK_OK(uvmMallocManaged((void **)&out, n * sizeof *out, uvmMemAttachGlobal));
	for (int i = 0; i < n; i++)
		a[i] = -1;
	CHECK_OK(uvmLaunchCooperativeKernelGGL(two_phases, blocks, threads, 0, 0, a, out, n));
	CHECK_OK(uvmDeviceSynchronize());
	int bad = 0;
	for (int i = 0; i < n; i++)
		bad += out[i] != (i + threads) % n * 3;
	CHECK(bad == 0);
	uvmFree(a);
	uvmFree(out);
}

/* ---- no arguments; a crash names its kernel ---- */

__device__ __managed__ int ran;

__global__ void no_arguments(void) { atomicAdd(&ran, 1); }

__global__ void crasher(int *p) { p[threadIdx.x] = 1; }

static void test_misc(void)
{
	ran = 0;
	CHECK_OK(uvmLaunchKernelGGL(no_arguments, dim3(2, 3), dim3(4, 5, 6), 0, 0));
	CHECK_OK(uvmDeviceSynchronize());
	CHECK(ran == 2 * 3 * 4 * 5 * 6);
	CHECK_OK(uvmLaunchKernelGGL(crasher, 1, 1, 0, 0, (int *)NULL));
	CHECK_ERR(uvmDeviceSynchronize(), uvmErrorLaunchFailure);
	CHECK(strstr(uvmGetLastErrorMessage(), "kernel crasher (") != NULL);
	CHECK(strstr(uvmGetLastErrorMessage(), "its thread (0,0,0) of block (0,0,0) (a grid (1,1,1) of blocks (1,1,1))") != NULL);
	uvmGetLastError();
	CHECK_OK(uvmDeviceReset()); /* a crash fails the device until then, as it fails a CUDA context */
	/* A shape past the limits fails the launch, as <<<>>> does. */
	CHECK_ERR(uvmLaunchKernelGGL(no_arguments, 1, 2048, 0, 0), uvmErrorInvalidConfiguration);
	CHECK(uvmGetLastError() == uvmErrorInvalidConfiguration);
}

/* ---- what a port keeps of CUDA's C++ and its device code ---- */

__global__ void mul24_kernel(int *out, const int *a, const int *b, unsigned int *uout)
{
	int i = threadIdx.x;
	out[i] = __mul24(a[i], b[i]);
	uout[i] = __umul24((unsigned)a[i], (unsigned)b[i]);
}

static void test_port_forms(void)
{
	/* The allocation calls take any T ** and cudaMallocManaged's flags
	 * default to global, as CUDA's C++ header lets them. */
	int *managed, *dev, *host, *mapped;
	double *pitched;
	size_t pitch = 0;
	CHECK_OK(uvmMallocManaged(&managed, 8 * sizeof *managed));
	uvmPointerAttributes attr;
	CHECK_OK(uvmPointerGetAttributes(&attr, managed));
	CHECK(attr.type == uvmMemoryTypeManaged);
	CHECK_OK(uvmMalloc(&dev, 8 * sizeof *dev));
	CHECK_OK(uvmPointerGetAttributes(&attr, dev));
	CHECK(attr.type == uvmMemoryTypeDevice && attr.device == 0);
	CHECK_OK(uvmMallocHost(&host, 8 * sizeof *host));
	CHECK_OK(uvmHostAlloc(&mapped, 8 * sizeof *mapped, uvmHostAllocMapped));
	int *mapped_dev = NULL;
	CHECK_OK(uvmHostGetDevicePointer(&mapped_dev, mapped, 0));
	CHECK(mapped_dev == mapped);
	CHECK_OK(uvmMallocPitch(&pitched, &pitch, 100, 3));
	CHECK(pitch >= 100);

	/* warpSize is 1 in a kernel, and prop.warpSize is still the field. */
	uvmDeviceProp prop;
	CHECK_OK(uvmGetDeviceProperties(&prop, 0));
	CHECK(prop.warpSize == warpSize && warpSize == 1);
	int lanes[warpSize];
	CHECK(sizeof lanes == sizeof(int));

	/* __mul24 and __umul24 multiply the low 24 bits, as CUDA's. */
	int a[4] = {3, 0x1000005, -7, 0x7fffff}, b[4] = {5, 2, 3, 0x7fffff};
	int want[4] = {15, 10, -21, (int)(0x7fffffLL * 0x7fffff)};
	unsigned int uwant[4] = {15, 10, (0xfffff9u * 3u), 0x7fffffu * 0x7fffffu};
	int *ma, *mb, *out;
	unsigned int *uout;
	CHECK_OK(uvmMallocManaged(&ma, sizeof a));
	CHECK_OK(uvmMallocManaged(&mb, sizeof b));
	CHECK_OK(uvmMallocManaged(&out, sizeof a));
	CHECK_OK(uvmMallocManaged(&uout, sizeof uwant));
	memcpy(ma, a, sizeof a);
	memcpy(mb, b, sizeof b);
	CHECK_OK(uvmLaunchKernelGGL(mul24_kernel, 1, 4, 0, 0, out, ma, mb, uout));
	CHECK_OK(uvmDeviceSynchronize());
	for (int i = 0; i < 4; i++) {
		if (out[i] != want[i] || uout[i] != uwant[i])
			fprintf(stderr, "__mul24(%#x, %#x) = %#x, __umul24 %#x; want %#x, %#x\n", a[i], b[i], out[i], uout[i], want[i], uwant[i]);
		CHECK(out[i] == want[i] && uout[i] == uwant[i]);
	}
	CHECK(uvmComputeModeDefault == 0 && uvmComputeModeProhibited == 2);
	int mode = -1;
	CHECK_OK(uvmDeviceGetAttribute(&mode, uvmDevAttrComputeMode, 0));
	CHECK(mode == uvmComputeModeDefault);
	uvmFree(managed);
	uvmFree(dev);
	uvmFreeHost(host);
	uvmFreeHost(mapped);
	uvmFree(pitched);
	uvmFree(ma);
	uvmFree(mb);
	uvmFree(out);
	uvmFree(uout);
}

int main(void)
{
	test_vector_add();
	test_matrix_mul();
	test_reduction();
	test_variables();
	test_atomics();
	test_cooperative();
	test_misc();
	test_port_forms();
	return check_done("cuda_test");
}
