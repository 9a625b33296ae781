/*
 * uvm_cuda.h: CUDA's kernel language for C programs run on softuvm's CPU
 * devices, so that a CUDA source keeps its kernel bodies. A port is a
 * rename, not a rewrite:
 *
 *  - the runtime calls: cudaX becomes uvmX (uvm.h: cudaMallocManaged is
 *    uvmMallocManaged, cudaError_t uvmError_t, cudaStream_t uvmStream_t,
 *    cudaSuccess uvmSuccess, cudaMemcpyToSymbol uvmMemcpyToSymbol, ...);
 *  - the launch: kernel<<<grid, block, shared, stream>>>(a, b, c) becomes
 *    uvmLaunchKernelGGL(kernel, grid, block, shared, stream, a, b, c)
 *    (the form hipify writes, hipLaunchKernelGGL; shared and stream are
 *    0 where the launch leaves them out); cudaLaunchCooperativeKernel
 *    with its array of argument pointers becomes
 *    uvmLaunchCooperativeKernelGGL(kernel, grid, block, shared, stream,
 *    a, b, c), the arguments themselves;
 *  - C has no constructors: dim3 threads(16, 16) becomes
 *    dim3 threads = dim3(16, 16);
 *  - extern __shared__ T name[] (the dynamic shared memory) becomes
 *    UVM_DYNAMIC_SHARED(T, name);
 *  - a grid's barrier, cooperative_groups::this_grid().sync(), becomes
 *    uvmGridSync() (there is no cooperative_groups in C).
 *
 * The kernel bodies keep threadIdx, blockIdx, blockDim, gridDim,
 * __syncthreads(), __shared__ arrays, atomicAdd and friends, and the
 * qualifiers __global__, __device__, __host__, __managed__, __constant__.
 * Kernels are C compiled by GCC (gnu11 or later): each launch defines a
 * nested function that unpacks the arguments, which clang and C++ do not
 * have.
 *
 * How it maps:
 *  - __global__, __device__, __host__ mean nothing on a CPU (a kernel is a
 *    function of the program, which a device's process, a fork of it,
 *    calls): they are empty. A __device__ variable is therefore an
 *    ordinary global, which a kernel sees as it was when its device's
 *    process started and writes in that process only: declare it
 *    __device__ __managed__ (as CUDA programs that share one with the
 *    host do) to make it one copy for the host and every device.
 *  - __managed__ and __constant__ variables are managed memory (uvm.h's
 *    UVM_MANAGED): uvmMemcpyToSymbol and uvmMemcpyFromSymbol copy into and
 *    out of them, and a kernel sees what the host wrote.
 *  - __shared__ is static thread-local storage: a block's threads all run
 *    on one OS thread, which runs one block at a time, so they share it
 *    and no other block does. Its contents at a block's start are what
 *    the worker's last block left (CUDA leaves them undefined).
 *  - warpSize is 1: no two threads run in lock step. Code that reads
 *    warpSize stays correct; code that assumes that 32 threads move
 *    together without a barrier does not.
 *
 * What a CPU device cannot do, and this header therefore does not
 * define, so that a kernel using it fails to compile rather than run
 * wrong: warp intrinsics (__shfl*_sync, __ballot_sync, __any_sync,
 * __all_sync, __activemask, __syncwarp, warp-level reductions and
 * matrix operations), textures and surfaces (tex1D, tex2D,
 * cudaTextureObject_t), cooperative groups' classes, dynamic parallelism
 * (a launch from a kernel), half precision types, clock64() and inline
 * PTX. A thread that spins waiting for another thread of its own block,
 * without a barrier, hangs: the threads of a block take turns and switch
 * only at barriers.
 */
#ifndef UVM_CUDA_H
#define UVM_CUDA_H

#if !defined(__GNUC__) || defined(__clang__) || defined(__cplusplus)
#error "uvm_cuda.h is for C compiled by GCC: its launch macros define a nested function for each launch, which clang and C++ have not"
#endif

#include <math.h>
#include <string.h>

#include "uvm.h"

/* ---- qualifiers ---- */

#define __global__
#define __device__
#define __host__
#define __forceinline__ __inline__ __attribute__((always_inline))
#define __noinline__ __attribute__((noinline))
#define __restrict__ __restrict
#define __launch_bounds__(...)
#define __shared__ static __thread
#define __managed__ UVM_MANAGED
#define __constant__ UVM_MANAGED
/* The dynamic shared memory a launch asked for, as the array name of
 * type T: what extern __shared__ T name[] declares in CUDA. */
#define UVM_DYNAMIC_SHARED(T, name) T *name __attribute__((unused)) = (T *)uvmDynamicShared()

/* ---- where a thread is ---- */

#define threadIdx uvmThreadIdx
#define blockIdx uvmBlockIdx
#define blockDim uvmBlockDim
#define gridDim uvmGridDim
/* A constant, not a macro, so that a program's prop.warpSize (a field of
 * uvmDeviceProp) still reads the property. */
enum { warpSize = 1 };

typedef uvmDim3 dim3;
typedef uvmDim3 uint3;
/* dim3(x), dim3(x, y), dim3(x, y, z): the dimensions left out are 1. */
#define dim3(...) UVM__DIM3(__VA_ARGS__, 1, 1)
#define UVM__DIM3(x, y, z, ...) ((uvmDim3){(unsigned)(x), (unsigned)(y), (unsigned)(z)})

/* ---- barriers and fences ---- */

#define __syncthreads() uvmSyncThreads()
#define __syncthreads_count(predicate) uvmSyncThreadsCount(predicate)
#define __syncthreads_and(predicate) uvmSyncThreadsAnd(predicate)
#define __syncthreads_or(predicate) uvmSyncThreadsOr(predicate)
/* A fence orders a thread's memory accesses for every other thread, of
 * the block, the device or the host: on a CPU one fence does all three. */
#define __threadfence() __atomic_thread_fence(__ATOMIC_SEQ_CST)
#define __threadfence_block() __atomic_thread_fence(__ATOMIC_SEQ_CST)
#define __threadfence_system() __atomic_thread_fence(__ATOMIC_SEQ_CST)

/* ---- atomics: each returns the old value, as CUDA's ---- */

#define UVM__ATOMIC_INT(T, name)                                                                                  \
	static inline T uvm__add_##name(T *p, T v) { return __atomic_fetch_add(p, v, __ATOMIC_RELAXED); }       \
	static inline T uvm__sub_##name(T *p, T v) { return __atomic_fetch_sub(p, v, __ATOMIC_RELAXED); }       \
	static inline T uvm__exch_##name(T *p, T v) { return __atomic_exchange_n(p, v, __ATOMIC_RELAXED); }     \
	static inline T uvm__and_##name(T *p, T v) { return __atomic_fetch_and(p, v, __ATOMIC_RELAXED); }       \
	static inline T uvm__or_##name(T *p, T v) { return __atomic_fetch_or(p, v, __ATOMIC_RELAXED); }         \
	static inline T uvm__xor_##name(T *p, T v) { return __atomic_fetch_xor(p, v, __ATOMIC_RELAXED); }       \
	static inline T uvm__cas_##name(T *p, T compare, T v)                                                     \
	{                                                                                                         \
		__atomic_compare_exchange_n(p, &compare, v, 0, __ATOMIC_RELAXED, __ATOMIC_RELAXED);           \
		return compare;                                                                                   \
	}                                                                                                         \
	static inline T uvm__min_##name(T *p, T v)                                                                \
	{                                                                                                         \
		T old = __atomic_load_n(p, __ATOMIC_RELAXED);                                                     \
		while (v < old && !__atomic_compare_exchange_n(p, &old, v, 1, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) \
			;                                                                                         \
		return old;                                                                                       \
	}                                                                                                         \
	static inline T uvm__max_##name(T *p, T v)                                                                \
	{                                                                                                         \
		T old = __atomic_load_n(p, __ATOMIC_RELAXED);                                                     \
		while (v > old && !__atomic_compare_exchange_n(p, &old, v, 1, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) \
			;                                                                                         \
		return old;                                                                                       \
	}
UVM__ATOMIC_INT(int, i)
UVM__ATOMIC_INT(unsigned int, u)
UVM__ATOMIC_INT(long long, ll)
UVM__ATOMIC_INT(unsigned long long, ull)
UVM__ATOMIC_INT(long, l)
UVM__ATOMIC_INT(unsigned long, ul)

/* Floating-point additions, as a compare-and-swap loop on the bits. */
#define UVM__ATOMIC_FLOAT(T, B, name)                                                                              \
	static inline T uvm__add_##name(T *p, T v)                                                                \
	{                                                                                                         \
		B old = __atomic_load_n((B *)p, __ATOMIC_RELAXED), sum;                                           \
		T o, s;                                                                                           \
		do {                                                                                              \
			memcpy(&o, &old, sizeof o);                                                               \
			s = o + v;                                                                                \
			memcpy(&sum, &s, sizeof sum);                                                             \
		} while (!__atomic_compare_exchange_n((B *)p, &old, sum, 1, __ATOMIC_RELAXED, __ATOMIC_RELAXED)); \
		return o;                                                                                         \
	}                                                                                                         \
	static inline T uvm__exch_##name(T *p, T v)                                                               \
	{                                                                                                         \
		B b, old;                                                                                         \
		T o;                                                                                              \
		memcpy(&b, &v, sizeof b);                                                                         \
		old = __atomic_exchange_n((B *)p, b, __ATOMIC_RELAXED);                                           \
		memcpy(&o, &old, sizeof o);                                                                       \
		return o;                                                                                         \
	}
UVM__ATOMIC_FLOAT(float, unsigned int, f)
UVM__ATOMIC_FLOAT(double, unsigned long long, d)

#define UVM__ATOMIC_PICK(op, p)                                                                                   \
	_Generic((p), int *: uvm__##op##_i, unsigned int *: uvm__##op##_u, long long *: uvm__##op##_ll,                \
		 unsigned long long *: uvm__##op##_ull, long *: uvm__##op##_l, unsigned long *: uvm__##op##_ul)
#define UVM__ATOMIC_PICK_FLOAT(op, p)                                                                             \
	_Generic((p), int *: uvm__##op##_i, unsigned int *: uvm__##op##_u, long long *: uvm__##op##_ll,                \
		 unsigned long long *: uvm__##op##_ull, long *: uvm__##op##_l, unsigned long *: uvm__##op##_ul,             \
		 float *: uvm__##op##_f, double *: uvm__##op##_d)
#define atomicAdd(p, v) UVM__ATOMIC_PICK_FLOAT(add, p)(p, v)
#define atomicExch(p, v) UVM__ATOMIC_PICK_FLOAT(exch, p)(p, v)
#define atomicSub(p, v) UVM__ATOMIC_PICK(sub, p)(p, v)
#define atomicAnd(p, v) UVM__ATOMIC_PICK(and, p)(p, v)
#define atomicOr(p, v) UVM__ATOMIC_PICK(or, p)(p, v)
#define atomicXor(p, v) UVM__ATOMIC_PICK(xor, p)(p, v)
#define atomicMin(p, v) UVM__ATOMIC_PICK(min, p)(p, v)
#define atomicMax(p, v) UVM__ATOMIC_PICK(max, p)(p, v)
#define atomicCAS(p, compare, v) UVM__ATOMIC_PICK(cas, p)(p, compare, v)

/* atomicInc: ((old >= limit) ? 0 : old + 1); atomicDec: ((old == 0 || old
 * > limit) ? limit : old - 1), as CUDA's. */
static inline unsigned int atomicInc(unsigned int *p, unsigned int limit)
{
	unsigned int old = __atomic_load_n(p, __ATOMIC_RELAXED);
	while (!__atomic_compare_exchange_n(p, &old, old >= limit ? 0 : old + 1, 1, __ATOMIC_RELAXED, __ATOMIC_RELAXED))
		;
	return old;
}
static inline unsigned int atomicDec(unsigned int *p, unsigned int limit)
{
	unsigned int old = __atomic_load_n(p, __ATOMIC_RELAXED);
	while (!__atomic_compare_exchange_n(p, &old, old == 0 || old > limit ? limit : old - 1, 1, __ATOMIC_RELAXED, __ATOMIC_RELAXED))
		;
	return old;
}

/* ---- vector types, arithmetic helpers CUDA's device code has ---- */

typedef struct { float x, y; } __attribute__((aligned(8))) float2;
typedef struct { float x, y, z; } float3;
typedef struct { float x, y, z, w; } __attribute__((aligned(16))) float4;
typedef struct { double x, y; } __attribute__((aligned(16))) double2;
typedef struct { int x, y; } __attribute__((aligned(8))) int2;
typedef struct { int x, y, z; } int3;
typedef struct { int x, y, z, w; } __attribute__((aligned(16))) int4;
typedef struct { unsigned int x, y; } __attribute__((aligned(8))) uint2;
typedef struct { unsigned int x, y, z, w; } __attribute__((aligned(16))) uint4;
static inline float2 make_float2(float x, float y) { return (float2){x, y}; }
static inline float3 make_float3(float x, float y, float z) { return (float3){x, y, z}; }
static inline float4 make_float4(float x, float y, float z, float w) { return (float4){x, y, z, w}; }
static inline double2 make_double2(double x, double y) { return (double2){x, y}; }
static inline int2 make_int2(int x, int y) { return (int2){x, y}; }
static inline int3 make_int3(int x, int y, int z) { return (int3){x, y, z}; }
static inline int4 make_int4(int x, int y, int z, int w) { return (int4){x, y, z, w}; }
static inline uint2 make_uint2(unsigned int x, unsigned int y) { return (uint2){x, y}; }
static inline uint3 make_uint3(unsigned int x, unsigned int y, unsigned int z) { return (uint3){x, y, z}; }
static inline uint4 make_uint4(unsigned int x, unsigned int y, unsigned int z, unsigned int w) { return (uint4){x, y, z, w}; }

/* CUDA's device code has min and max for every arithmetic type; defined
 * here unless the program says UVM_CUDA_NO_MINMAX (or has its own). */
#if !defined(UVM_CUDA_NO_MINMAX) && !defined(min) && !defined(max)
#define min(a, b) ({ __typeof__(a) uvm__a_ = (a); __typeof__(b) uvm__b_ = (b); uvm__b_ < uvm__a_ ? uvm__b_ : uvm__a_; })
#define max(a, b) ({ __typeof__(a) uvm__a_ = (a); __typeof__(b) uvm__b_ = (b); uvm__a_ < uvm__b_ ? uvm__b_ : uvm__a_; })
#endif
/* The fast single-precision intrinsics, as the functions they stand for. */
#define __fdividef(a, b) ((a) / (b))
#define __expf(x) expf(x)
#define __logf(x) logf(x)
#define __sinf(x) sinf(x)
#define __cosf(x) cosf(x)
#define __powf(x, y) powf(x, y)
#define __saturatef(x) fminf(fmaxf((x), 0.0f), 1.0f)
#define __fmaf_rn(a, b, c) fmaf(a, b, c)
#define __fmul_rn(a, b) ((a) * (b))
#define __fadd_rn(a, b) ((a) + (b))
/* 24-bit multiplications: the low 32 bits of the product of a's and b's
 * low 24 bits (sign-extended for __mul24), as CUDA's. */
static inline int __mul24(int a, int b) { return (int)((long long)((int)((unsigned)a << 8) >> 8) * ((int)((unsigned)b << 8) >> 8)); }
static inline unsigned int __umul24(unsigned int a, unsigned int b) { return (a & 0xffffffu) * (b & 0xffffffu); }
static inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
static inline double rsqrt(double x) { return 1.0 / sqrt(x); }

/* ---- the runtime's C++ forms ---- */

/* The calling convention of host functions and stream callbacks: the
 * platform's own on Linux. */
#define CUDART_CB

/* CUDA's C++ header lets the allocation calls take a T ** for any T (and
 * cudaMallocManaged's flags default to cudaMemAttachGlobal); these do the
 * same, so that cudaMalloc(&p, n) ports as uvmMalloc(&p, n). */
#define uvmMalloc(devPtr, size) uvmMalloc((void **)(devPtr), (size))
#define uvmMallocHost(ptr, size) uvmMallocHost((void **)(ptr), (size))
#define uvmHostAlloc(pHost, size, flags) uvmHostAlloc((void **)(pHost), (size), (flags))
#define uvmMallocManaged(devPtr, ...) UVM__MALLOC_MANAGED((void **)(devPtr), __VA_ARGS__, uvmMemAttachGlobal, 0)
#define UVM__MALLOC_MANAGED(devPtr, size, flags, ...) uvmMallocManaged(devPtr, size, flags)
#define uvmMallocPitch(devPtr, pitch, width, height) uvmMallocPitch((void **)(devPtr), (pitch), (width), (height))
#define uvmHostGetDevicePointer(pDevice, pHost, flags) uvmHostGetDevicePointer((void **)(pDevice), (pHost), (flags))

/* ---- symbols: __managed__ and __constant__ variables ---- */

/* uvmMemcpyToSymbol(symbol, src, count[, offset[, kind]]) copies into
 * the variable symbol (itself, not its address, as in CUDA), and
 * uvmMemcpyFromSymbol(dst, symbol, count[, offset[, kind]]) out of it;
 * the Async forms take offset, kind and stream. */
#define uvmMemcpyToSymbol(symbol, src, ...) UVM__TO_SYMBOL(&(symbol), (src), __VA_ARGS__, 0, uvmMemcpyDefault, 0)
#define UVM__TO_SYMBOL(sym, src, count, offset, kind, ...) uvmMemcpy((char *)(sym) + (offset), (src), (count), (kind))
#define uvmMemcpyFromSymbol(dst, symbol, ...) UVM__FROM_SYMBOL((dst), &(symbol), __VA_ARGS__, 0, uvmMemcpyDefault, 0)
#define UVM__FROM_SYMBOL(dst, sym, count, offset, kind, ...) uvmMemcpy((dst), (const char *)(sym) + (offset), (count), (kind))
#define uvmMemcpyToSymbolAsync(symbol, src, count, offset, kind, stream) \
	uvmMemcpyAsync((char *)&(symbol) + (offset), (src), (count), (kind), (stream))
#define uvmMemcpyFromSymbolAsync(dst, symbol, count, offset, kind, stream) \
	uvmMemcpyAsync((dst), (const char *)&(symbol) + (offset), (count), (kind), (stream))
#define uvmGetSymbolAddress(devPtr, symbol) (*(devPtr) = (void *)&(symbol), uvmSuccess)
#define uvmGetSymbolSize(size, symbol) (*(size) = sizeof(symbol), uvmSuccess)

/* ---- launches ---- */

/* uvmLaunchKernelGGL(kernel, grid, block, sharedMem, stream, args...)
 * is kernel<<<grid, block, sharedMem, stream>>>(args...) on the current
 * device (uvmSetDevice), and returns what uvmLaunchGrid returns (a
 * failure is also the thread's last error, as a failed <<<>>> is).
 * uvmLaunchCooperativeKernelGGL is the same through
 * uvmLaunchCooperativeKernel. grid and block are dim3 values or numbers
 * (a number n is dim3(n)); kernel names a function (not a pointer to
 * one); the arguments, up to 24, are copied at the launch, as CUDA copies
 * them, into a struct of their types (arrays become pointers), and the
 * kernel is called with them, so the usual conversions to its parameter
 * types apply and a wrong count fails to compile. */
#define uvmLaunchKernelGGL(kernel, grid, block, sharedMem, stream, ...) \
	UVM__LAUNCH(uvmLaunchGrid, kernel, grid, block, sharedMem, stream, ##__VA_ARGS__)
#define uvmLaunchCooperativeKernelGGL(kernel, grid, block, sharedMem, stream, ...) \
	UVM__LAUNCH(uvmLaunchCooperativeKernel, kernel, grid, block, sharedMem, stream, ##__VA_ARGS__)

/* Each launch defines a nested function named after the kernel (so that
 * a crash report names it) that takes the copied arguments out of the
 * launch's parameters and calls the kernel. It refers to nothing of the
 * function around it, so GCC needs no trampoline (and no executable
 * stack) to take its address. */
#define UVM__LAUNCH(launch, kernel, grid, block, shared, stream, ...)                                                  \
	({                                                                                                            \
		_Static_assert(__builtin_types_compatible_p(__typeof__(kernel), __typeof__(*(kernel))),               \
			       "uvmLaunchKernelGGL: " #kernel " must name a kernel function, not a pointer to one");         \
		struct uvm__args {                                                                                    \
			UVM__FIELDS(__VA_ARGS__)                                                                      \
		} uvm__args_ = {__VA_ARGS__};                                                                         \
		void kernel##__uvm_grid(const void *uvm__p)                                                           \
		{                                                                                                     \
			struct uvm__args *uvm__q = (struct uvm__args *)uvm__p;                                        \
			(void)uvm__q;                                                                                 \
			kernel(UVM__CALL(__VA_ARGS__));                                                               \
		}                                                                                                     \
		int uvm__device_ = 0;                                                                                 \
		uvmGetDevice(&uvm__device_);                                                                          \
		launch(uvm__device_, (stream), UVM__DIM3_OF(grid), UVM__DIM3_OF(block), (shared), kernel##__uvm_grid, \
		       &uvm__args_, sizeof uvm__args_);                                                               \
	})

static inline uvmDim3 uvm__dim3_of_number(unsigned long long n) { return (uvmDim3){(unsigned)n, 1, 1}; }
static inline uvmDim3 uvm__dim3_of_dim3(uvmDim3 d) { return d; }
#define UVM__DIM3_OF(x) _Generic((x), uvmDim3: uvm__dim3_of_dim3, default: uvm__dim3_of_number)(x)

/* The argument list's struct fields and the call's arguments, for up to
 * 24 arguments: a field uvm__aN per argument, of its type after the
 * usual conversions (the comma operator's). */
#define UVM__FIELD(i, x) __typeof__(((void)0, (x))) uvm__a##i;
#define UVM__ARG(i, x) uvm__q->uvm__a##i
#define UVM__CAT(a, b) UVM__CAT_(a, b)
#define UVM__CAT_(a, b) a##b
#define UVM__FIELDS(...) UVM__CAT(UVM__FIELDS_, UVM__COUNT(_, ##__VA_ARGS__))(__VA_ARGS__)
#define UVM__CALL(...) UVM__CAT(UVM__CALL_, UVM__COUNT(_, ##__VA_ARGS__))(__VA_ARGS__)
#define UVM__COUNT(...) UVM__COUNT_(__VA_ARGS__, 25, 24, 23, 22, 21, 20, 19, 18, 17, 16, 15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1)
#define UVM__COUNT_(_1, _2, _3, _4, _5, _6, _7, _8, _9, _10, _11, _12, _13, _14, _15, _16, _17, _18, _19, _20, _21, _22, _23, _24, _25, n, ...) n
#define UVM__FIELDS_1(...)
#define UVM__CALL_1(...)
#define UVM__FIELDS_2(...) UVM__EACH_1(UVM__FIELD, __VA_ARGS__)
#define UVM__CALL_2(...) UVM__LIST_1(UVM__ARG, __VA_ARGS__)
#define UVM__FIELDS_3(...) UVM__EACH_2(UVM__FIELD, __VA_ARGS__)
#define UVM__CALL_3(...) UVM__LIST_2(UVM__ARG, __VA_ARGS__)
#define UVM__FIELDS_4(...) UVM__EACH_3(UVM__FIELD, __VA_ARGS__)
#define UVM__CALL_4(...) UVM__LIST_3(UVM__ARG, __VA_ARGS__)
#define UVM__FIELDS_5(...) UVM__EACH_4(UVM__FIELD, __VA_ARGS__)
#define UVM__CALL_5(...) UVM__LIST_4(UVM__ARG, __VA_ARGS__)
#define UVM__FIELDS_6(...) UVM__EACH_5(UVM__FIELD, __VA_ARGS__)
#define UVM__CALL_6(...) UVM__LIST_5(UVM__ARG, __VA_ARGS__)
#define UVM__FIELDS_7(...) UVM__EACH_6(UVM__FIELD, __VA_ARGS__)
#define UVM__CALL_7(...) UVM__LIST_6(UVM__ARG, __VA_ARGS__)
#define UVM__FIELDS_8(...) UVM__EACH_7(UVM__FIELD, __VA_ARGS__)
#define UVM__CALL_8(...) UVM__LIST_7(UVM__ARG, __VA_ARGS__)
#define UVM__FIELDS_9(...) UVM__EACH_8(UVM__FIELD, __VA_ARGS__)
#define UVM__CALL_9(...) UVM__LIST_8(UVM__ARG, __VA_ARGS__)
#define UVM__FIELDS_10(...) UVM__EACH_9(UVM__FIELD, __VA_ARGS__)
#define UVM__CALL_10(...) UVM__LIST_9(UVM__ARG, __VA_ARGS__)
#define UVM__FIELDS_11(...) UVM__EACH_10(UVM__FIELD, __VA_ARGS__)
#define UVM__CALL_11(...) UVM__LIST_10(UVM__ARG, __VA_ARGS__)
#define UVM__FIELDS_12(...) UVM__EACH_11(UVM__FIELD, __VA_ARGS__)
#define UVM__CALL_12(...) UVM__LIST_11(UVM__ARG, __VA_ARGS__)
#define UVM__FIELDS_13(...) UVM__EACH_12(UVM__FIELD, __VA_ARGS__)
#define UVM__CALL_13(...) UVM__LIST_12(UVM__ARG, __VA_ARGS__)
#define UVM__FIELDS_14(...) UVM__EACH_13(UVM__FIELD, __VA_ARGS__)
#define UVM__CALL_14(...) UVM__LIST_13(UVM__ARG, __VA_ARGS__)
#define UVM__FIELDS_15(...) UVM__EACH_14(UVM__FIELD, __VA_ARGS__)
#define UVM__CALL_15(...) UVM__LIST_14(UVM__ARG, __VA_ARGS__)
#define UVM__FIELDS_16(...) UVM__EACH_15(UVM__FIELD, __VA_ARGS__)
#define UVM__CALL_16(...) UVM__LIST_15(UVM__ARG, __VA_ARGS__)
#define UVM__FIELDS_17(...) UVM__EACH_16(UVM__FIELD, __VA_ARGS__)
#define UVM__CALL_17(...) UVM__LIST_16(UVM__ARG, __VA_ARGS__)
#define UVM__FIELDS_18(...) UVM__EACH_17(UVM__FIELD, __VA_ARGS__)
#define UVM__CALL_18(...) UVM__LIST_17(UVM__ARG, __VA_ARGS__)
#define UVM__FIELDS_19(...) UVM__EACH_18(UVM__FIELD, __VA_ARGS__)
#define UVM__CALL_19(...) UVM__LIST_18(UVM__ARG, __VA_ARGS__)
#define UVM__FIELDS_20(...) UVM__EACH_19(UVM__FIELD, __VA_ARGS__)
#define UVM__CALL_20(...) UVM__LIST_19(UVM__ARG, __VA_ARGS__)
#define UVM__FIELDS_21(...) UVM__EACH_20(UVM__FIELD, __VA_ARGS__)
#define UVM__CALL_21(...) UVM__LIST_20(UVM__ARG, __VA_ARGS__)
#define UVM__FIELDS_22(...) UVM__EACH_21(UVM__FIELD, __VA_ARGS__)
#define UVM__CALL_22(...) UVM__LIST_21(UVM__ARG, __VA_ARGS__)
#define UVM__FIELDS_23(...) UVM__EACH_22(UVM__FIELD, __VA_ARGS__)
#define UVM__CALL_23(...) UVM__LIST_22(UVM__ARG, __VA_ARGS__)
#define UVM__FIELDS_24(...) UVM__EACH_23(UVM__FIELD, __VA_ARGS__)
#define UVM__CALL_24(...) UVM__LIST_23(UVM__ARG, __VA_ARGS__)
#define UVM__FIELDS_25(...) UVM__EACH_24(UVM__FIELD, __VA_ARGS__)
#define UVM__CALL_25(...) UVM__LIST_24(UVM__ARG, __VA_ARGS__)
#define UVM__EACH_1(m, x) m(1, x)
#define UVM__EACH_2(m, x, ...) m(2, x) UVM__EACH_1(m, __VA_ARGS__)
#define UVM__EACH_3(m, x, ...) m(3, x) UVM__EACH_2(m, __VA_ARGS__)
#define UVM__EACH_4(m, x, ...) m(4, x) UVM__EACH_3(m, __VA_ARGS__)
#define UVM__EACH_5(m, x, ...) m(5, x) UVM__EACH_4(m, __VA_ARGS__)
#define UVM__EACH_6(m, x, ...) m(6, x) UVM__EACH_5(m, __VA_ARGS__)
#define UVM__EACH_7(m, x, ...) m(7, x) UVM__EACH_6(m, __VA_ARGS__)
#define UVM__EACH_8(m, x, ...) m(8, x) UVM__EACH_7(m, __VA_ARGS__)
#define UVM__EACH_9(m, x, ...) m(9, x) UVM__EACH_8(m, __VA_ARGS__)
#define UVM__EACH_10(m, x, ...) m(10, x) UVM__EACH_9(m, __VA_ARGS__)
#define UVM__EACH_11(m, x, ...) m(11, x) UVM__EACH_10(m, __VA_ARGS__)
#define UVM__EACH_12(m, x, ...) m(12, x) UVM__EACH_11(m, __VA_ARGS__)
#define UVM__EACH_13(m, x, ...) m(13, x) UVM__EACH_12(m, __VA_ARGS__)
#define UVM__EACH_14(m, x, ...) m(14, x) UVM__EACH_13(m, __VA_ARGS__)
#define UVM__EACH_15(m, x, ...) m(15, x) UVM__EACH_14(m, __VA_ARGS__)
#define UVM__EACH_16(m, x, ...) m(16, x) UVM__EACH_15(m, __VA_ARGS__)
#define UVM__EACH_17(m, x, ...) m(17, x) UVM__EACH_16(m, __VA_ARGS__)
#define UVM__EACH_18(m, x, ...) m(18, x) UVM__EACH_17(m, __VA_ARGS__)
#define UVM__EACH_19(m, x, ...) m(19, x) UVM__EACH_18(m, __VA_ARGS__)
#define UVM__EACH_20(m, x, ...) m(20, x) UVM__EACH_19(m, __VA_ARGS__)
#define UVM__EACH_21(m, x, ...) m(21, x) UVM__EACH_20(m, __VA_ARGS__)
#define UVM__EACH_22(m, x, ...) m(22, x) UVM__EACH_21(m, __VA_ARGS__)
#define UVM__EACH_23(m, x, ...) m(23, x) UVM__EACH_22(m, __VA_ARGS__)
#define UVM__EACH_24(m, x, ...) m(24, x) UVM__EACH_23(m, __VA_ARGS__)
#define UVM__LIST_1(m, x) m(1, x)
#define UVM__LIST_2(m, x, ...) m(2, x), UVM__LIST_1(m, __VA_ARGS__)
#define UVM__LIST_3(m, x, ...) m(3, x), UVM__LIST_2(m, __VA_ARGS__)
#define UVM__LIST_4(m, x, ...) m(4, x), UVM__LIST_3(m, __VA_ARGS__)
#define UVM__LIST_5(m, x, ...) m(5, x), UVM__LIST_4(m, __VA_ARGS__)
#define UVM__LIST_6(m, x, ...) m(6, x), UVM__LIST_5(m, __VA_ARGS__)
#define UVM__LIST_7(m, x, ...) m(7, x), UVM__LIST_6(m, __VA_ARGS__)
#define UVM__LIST_8(m, x, ...) m(8, x), UVM__LIST_7(m, __VA_ARGS__)
#define UVM__LIST_9(m, x, ...) m(9, x), UVM__LIST_8(m, __VA_ARGS__)
#define UVM__LIST_10(m, x, ...) m(10, x), UVM__LIST_9(m, __VA_ARGS__)
#define UVM__LIST_11(m, x, ...) m(11, x), UVM__LIST_10(m, __VA_ARGS__)
#define UVM__LIST_12(m, x, ...) m(12, x), UVM__LIST_11(m, __VA_ARGS__)
#define UVM__LIST_13(m, x, ...) m(13, x), UVM__LIST_12(m, __VA_ARGS__)
#define UVM__LIST_14(m, x, ...) m(14, x), UVM__LIST_13(m, __VA_ARGS__)
#define UVM__LIST_15(m, x, ...) m(15, x), UVM__LIST_14(m, __VA_ARGS__)
#define UVM__LIST_16(m, x, ...) m(16, x), UVM__LIST_15(m, __VA_ARGS__)
#define UVM__LIST_17(m, x, ...) m(17, x), UVM__LIST_16(m, __VA_ARGS__)
#define UVM__LIST_18(m, x, ...) m(18, x), UVM__LIST_17(m, __VA_ARGS__)
#define UVM__LIST_19(m, x, ...) m(19, x), UVM__LIST_18(m, __VA_ARGS__)
#define UVM__LIST_20(m, x, ...) m(20, x), UVM__LIST_19(m, __VA_ARGS__)
#define UVM__LIST_21(m, x, ...) m(21, x), UVM__LIST_20(m, __VA_ARGS__)
#define UVM__LIST_22(m, x, ...) m(22, x), UVM__LIST_21(m, __VA_ARGS__)
#define UVM__LIST_23(m, x, ...) m(23, x), UVM__LIST_22(m, __VA_ARGS__)
#define UVM__LIST_24(m, x, ...) m(24, x), UVM__LIST_23(m, __VA_ARGS__)

#endif /* UVM_CUDA_H */
