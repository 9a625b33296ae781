/*
 * uvm.h: softuvm's C API, CUDA-style unified memory for CPU devices.
 *
 * Names mirror the CUDA runtime's with the `uvm` prefix: uvmMallocManaged
 * is cudaMallocManaged, uvmMemAdvise is cudaMemAdvise, and so on. The
 * numeric values of error codes and enums are CUDA's where CUDA has the
 * same thing, so code ported from CUDA keeps its meaning.
 *
 * The library talks to a softuvm fault server: the one named by
 * UVM_SOCKET, else the daemon at the default socket (`uvm serve`), else a
 * private server it starts from the `uvm` binary (UVM_BIN, the install
 * prefix's bin/uvm, or PATH). UVM_SERVER=private|daemon forces a choice.
 * The first call of any function connects.
 *
 * Every function is safe to call from several threads and reports misuse
 * through its return value, never by aborting. uvmGetLastErrorMessage
 * says what went wrong in words (the value, and what was expected).
 *
 * Link with `$(pkg-config --cflags --libs uvm)`.
 */
#ifndef UVM_H
#define UVM_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define UVM_VERSION_MAJOR 0
#define UVM_VERSION_MINOR 4

/* Error codes, with cudaError_t's values. */
typedef enum uvmError {
	uvmSuccess = 0,
	uvmErrorInvalidValue = 1,         /* a bad argument: null, zero size, out of range, foreign pointer */
	uvmErrorMemoryAllocation = 2,     /* address space, host memory or a device arena ran out */
	uvmErrorInitializationError = 3,  /* no fault server could be reached or started */
	uvmErrorInvalidDevice = 101,      /* a device index that does not exist */
	uvmErrorLaunchFailure = 719,      /* a kernel crashed, or its device process died */
	uvmErrorNotSupported = 801,       /* this kernel or build cannot do it */
	uvmErrorServerGone = 900,         /* the fault server exited; non-host data is lost */
	uvmErrorUnknown = 999             /* a bug, or an unexpected system error */
} uvmError_t;

/* The host as a processor, as cudaCpuDeviceId. */
#define uvmCpuDeviceId (-1)
/* No single processor, as cudaInvalidDeviceId. */
#define uvmInvalidDeviceId (-2)

/* uvmMallocManaged flags, as cudaMemAttachGlobal and cudaMemAttachHost. */
#define uvmMemAttachGlobal 0x01u
#define uvmMemAttachHost 0x02u

/* uvmHostAlloc flags, as cudaHostAlloc's. */
#define uvmHostAllocDefault 0x00u
#define uvmHostAllocPortable 0x01u
#define uvmHostAllocMapped 0x02u
#define uvmHostAllocWriteCombined 0x04u

/* uvmHostRegister flags, as cudaHostRegister's. */
#define uvmHostRegisterDefault 0x00u
#define uvmHostRegisterPortable 0x01u
#define uvmHostRegisterMapped 0x02u

/* A stream of work on one device; NULL is the device's default stream. */
typedef struct uvmStream *uvmStream_t;

typedef enum uvmMemoryAdvise {
	uvmMemAdviseSetReadMostly = 1,
	uvmMemAdviseUnsetReadMostly = 2,
	uvmMemAdviseSetPreferredLocation = 3,
	uvmMemAdviseUnsetPreferredLocation = 4,
	uvmMemAdviseSetAccessedBy = 5,
	uvmMemAdviseUnsetAccessedBy = 6
} uvmMemoryAdvise;

typedef enum uvmMemRangeAttribute {
	uvmMemRangeAttributeReadMostly = 1,           /* int: 1 if the whole range is read-mostly */
	uvmMemRangeAttributePreferredLocation = 2,    /* int: a device, uvmCpuDeviceId or uvmInvalidDeviceId */
	uvmMemRangeAttributeAccessedBy = 3,           /* int[]: devices, padded with uvmInvalidDeviceId */
	uvmMemRangeAttributeLastPrefetchLocation = 4  /* int: as PreferredLocation */
} uvmMemRangeAttribute;

typedef enum uvmMemoryType {
	uvmMemoryTypeUnregistered = 0,
	uvmMemoryTypeHost = 1,    /* pinned host memory: uvmHostAlloc, uvmHostRegister */
	uvmMemoryTypeDevice = 2,  /* device memory: uvmMalloc */
	uvmMemoryTypeManaged = 3  /* managed memory: uvmMallocManaged */
} uvmMemoryType;

typedef struct uvmPointerAttributes {
	enum uvmMemoryType type;
	int device;           /* the device the memory belongs to, uvmCpuDeviceId for host memory */
	void *devicePointer;  /* where kernels reach it (NULL if they cannot) */
	void *hostPointer;    /* where the host reaches it (NULL for device memory) */
} uvmPointerAttributes;

typedef enum uvmMemcpyKind {
	uvmMemcpyHostToHost = 0,
	uvmMemcpyHostToDevice = 1,
	uvmMemcpyDeviceToHost = 2,
	uvmMemcpyDeviceToDevice = 3,
	uvmMemcpyDefault = 4  /* inferred from the pointers */
} uvmMemcpyKind;

typedef enum uvmDeviceAttr {
	uvmDevAttrMultiProcessorCount = 16,       /* the device's worker threads */
	uvmDevAttrCanMapHostMemory = 19,          /* 1 */
	uvmDevAttrPageableMemoryAccess = 88,      /* 0: kernels reach managed memory only */
	uvmDevAttrConcurrentManagedAccess = 89,   /* 1 */
	uvmDevAttrArenaCapacityMiB = 1000         /* the device's memory, in MiB */
} uvmDeviceAttr;

/* A kernel: thread tid of nthreads, with a copy of the launch's params. */
typedef void (*uvmKernel_t)(unsigned tid, unsigned nthreads, const void *params);

/* The largest params block a launch takes, in bytes. */
#define uvmMaxKernelParams 4096

/* Errors. */
const char *uvmGetErrorString(uvmError_t err);
const char *uvmGetErrorName(uvmError_t err);
/* The calling thread's last error, which is then reset to uvmSuccess. */
uvmError_t uvmGetLastError(void);
/* The calling thread's last error, left as it is. */
uvmError_t uvmPeekAtLastError(void);
/* What the calling thread's last failing call said, in words ("" if none). */
const char *uvmGetLastErrorMessage(void);

/* Managed, device and pinned host memory. */
uvmError_t uvmMallocManaged(void **devPtr, size_t size, unsigned int flags);
uvmError_t uvmMalloc(void **devPtr, size_t size);
uvmError_t uvmFree(void *devPtr);
uvmError_t uvmHostAlloc(void **pHost, size_t size, unsigned int flags);
uvmError_t uvmMallocHost(void **ptr, size_t size);
uvmError_t uvmFreeHost(void *ptr);
uvmError_t uvmHostGetDevicePointer(void **pDevice, void *pHost, unsigned int flags);
uvmError_t uvmHostRegister(void *ptr, size_t size, unsigned int flags);
uvmError_t uvmHostUnregister(void *ptr);

/* Migration, advice and attributes. */
uvmError_t uvmMemPrefetchAsync(const void *devPtr, size_t count, int dstDevice, uvmStream_t stream);
uvmError_t uvmMemAdvise(const void *devPtr, size_t count, uvmMemoryAdvise advice, int device);
uvmError_t uvmMemRangeGetAttribute(void *data, size_t dataSize, uvmMemRangeAttribute attribute, const void *devPtr, size_t count);
uvmError_t uvmPointerGetAttributes(uvmPointerAttributes *attributes, const void *ptr);

/* Copies. uvmMemcpyAsync and uvmMemsetAsync run after the stream's
 * queued work and return when the copy is done. Copies into, out of and
 * between device memory run in the calling process; large ones are
 * shared with threads started for the copy, with every signal blocked,
 * and joined before it returns. */
uvmError_t uvmMemcpy(void *dst, const void *src, size_t count, uvmMemcpyKind kind);
uvmError_t uvmMemcpyAsync(void *dst, const void *src, size_t count, uvmMemcpyKind kind, uvmStream_t stream);
uvmError_t uvmMemset(void *devPtr, int value, size_t count);
uvmError_t uvmMemsetAsync(void *devPtr, int value, size_t count, uvmStream_t stream);

/* Devices and streams. The current device is per thread, 0 at first. */
uvmError_t uvmGetDeviceCount(int *count);
uvmError_t uvmSetDevice(int device);
uvmError_t uvmGetDevice(int *device);
uvmError_t uvmDeviceGetAttribute(int *value, uvmDeviceAttr attr, int device);
uvmError_t uvmDeviceSynchronize(void);
uvmError_t uvmStreamCreate(uvmStream_t *stream);
uvmError_t uvmStreamDestroy(uvmStream_t stream);
uvmError_t uvmStreamSynchronize(uvmStream_t stream);

/*
 * uvmLaunchKernel runs kernel on device with nthreads threads, after the
 * work queued on stream (NULL: the device's default stream), and returns
 * at once. The kernel is an ordinary function of the program; it runs on
 * the device's worker threads, in the device's process (a fork of this
 * one), and sees managed, device and mapped host memory at the same
 * pointers. Other memory it sees as it was when the device's process
 * started, as a GPU kernel cannot see host memory. params (paramsSize
 * bytes, at most uvmMaxKernelParams) are copied now, as CUDA copies
 * kernel arguments. A kernel that crashes is reported by the next
 * synchronize as uvmErrorLaunchFailure; the device starts afresh at the
 * next launch.
 */
uvmError_t uvmLaunchKernel(int device, uvmStream_t stream, unsigned nthreads, uvmKernel_t kernel, const void *params, size_t paramsSize);

#ifdef __cplusplus
}
#endif

#endif /* UVM_H */
