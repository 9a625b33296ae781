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
#define UVM_VERSION_MINOR 5

/* Error codes, with cudaError_t's values. */
typedef enum uvmError {
	uvmSuccess = 0,
	uvmErrorInvalidValue = 1,         /* a bad argument: null, zero size, out of range, foreign pointer */
	uvmErrorMemoryAllocation = 2,     /* address space, host memory or a device arena ran out */
	uvmErrorInitializationError = 3,  /* no fault server could be reached or started */
	uvmErrorInvalidConfiguration = 9, /* a grid or block of a shape past the device's limits */
	uvmErrorInvalidPitchValue = 12,   /* a 2D or 3D copy's pitch smaller than its width */
	uvmErrorInvalidDevice = 101,      /* a device index that does not exist */
	uvmErrorUnsupportedLimit = 215,   /* uvmDeviceSetLimit of a limit with no meaning here */
	uvmErrorInvalidResourceHandle = 400, /* an event that is not one, destroyed, or unfit for the call */
	uvmErrorNotReady = 600,           /* not an error: the work is not finished yet (never the last error) */
	uvmErrorPeerAccessAlreadyEnabled = 704, /* uvmDeviceEnablePeerAccess twice */
	uvmErrorPeerAccessNotEnabled = 705, /* uvmDeviceDisablePeerAccess of a peer never enabled */
	uvmErrorLaunchFailure = 719,      /* a launch failed (its kernel crashed, its device process died or could not start): the device stays failed until uvmDeviceReset */
	uvmErrorCooperativeLaunchTooLarge = 720, /* a cooperative grid of more blocks than are resident at once */
	uvmErrorNotPermitted = 800,       /* a host function (uvmLaunchHostFunc) called the API */
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
/* uvmStreamAttachMemAsync's flag, as cudaMemAttachSingle: only the
 * launches of one stream take the memory from the CPU. */
#define uvmMemAttachSingle 0x04u

/* uvmHostAlloc flags, as cudaHostAlloc's. */
#define uvmHostAllocDefault 0x00u
#define uvmHostAllocPortable 0x01u
#define uvmHostAllocMapped 0x02u
#define uvmHostAllocWriteCombined 0x04u

/* uvmHostRegister flags, as cudaHostRegister's. */
#define uvmHostRegisterDefault 0x00u
#define uvmHostRegisterPortable 0x01u
#define uvmHostRegisterMapped 0x02u

/*
 * A stream of work on one device. NULL (and uvmStreamLegacy) is the
 * current device's legacy default stream, as CUDA's: work queued on it
 * waits for the work queued before it on every blocking stream of the
 * device, and work queued later on a blocking stream waits for it.
 * Streams are blocking unless made with uvmStreamNonBlocking, which never
 * waits for the legacy stream nor it for them. uvmStreamPerThread is the
 * calling thread's own default stream of the current device, made at its
 * first use and ended with the thread: blocking, so ordered with the
 * legacy stream, and with no other stream. A translation unit that
 * defines UVM_API_PER_THREAD_DEFAULT_STREAM before it includes uvm.h
 * (CUDA's CUDA_API_PER_THREAD_DEFAULT_STREAM, nvcc's --default-stream
 * per-thread) means uvmStreamPerThread wherever it passes NULL, and its
 * synchronous copies and fills are issued on it.
 */
typedef struct uvmStream *uvmStream_t;
#define uvmStreamLegacy ((uvmStream_t)0x1)
#define uvmStreamPerThread ((uvmStream_t)0x2)

/* uvmStreamCreateWithFlags flags, as cudaStreamCreateWithFlags's. */
#define uvmStreamDefault 0x00u
#define uvmStreamNonBlocking 0x01u

/* An event: a point in a stream's work (a handle, never a pointer). */
typedef struct uvmEvent *uvmEvent_t;

/* uvmEventCreateWithFlags flags, as cudaEventCreateWithFlags's. */
#define uvmEventDefault 0x00u
#define uvmEventBlockingSync 0x01u  /* uvmEventSynchronize blocks instead of following the device's flags */
#define uvmEventDisableTiming 0x02u /* no time is taken: uvmEventElapsedTime refuses it */
#define uvmEventInterprocess 0x04u  /* not supported */

/* uvmSetDeviceFlags flags, as cudaSetDeviceFlags's: how a synchronize
 * waits (one of the first four), and two accepted for compatibility. */
#define uvmDeviceScheduleAuto 0x00u         /* spin while each running device process, the waiting thread and the fault server have a CPU, else sleep as BlockingSync */
#define uvmDeviceScheduleSpin 0x01u         /* poll without sleeping */
#define uvmDeviceScheduleYield 0x02u        /* poll, yielding the CPU between polls */
#define uvmDeviceScheduleBlockingSync 0x04u /* sleep in the kernel until the work is done */
#define uvmDeviceBlockingSync 0x04u         /* the old name of uvmDeviceScheduleBlockingSync */
#define uvmDeviceScheduleMask 0x07u
#define uvmDeviceMapHost 0x08u              /* accepted: host memory is always mapped */
#define uvmDeviceLmemResizeToMax 0x10u      /* accepted: nothing to resize */
#define uvmDeviceMask 0x1fu

typedef enum uvmMemoryAdvise {
	uvmMemAdviseSetReadMostly = 1,
	uvmMemAdviseUnsetReadMostly = 2,
	uvmMemAdviseSetPreferredLocation = 3,
	uvmMemAdviseUnsetPreferredLocation = 4,
	uvmMemAdviseSetAccessedBy = 5,
	uvmMemAdviseUnsetAccessedBy = 6
} uvmMemoryAdvise;

/* A location of memory, as cudaMemLocation: a device (id: its index), the
 * host (id ignored), one of the host's NUMA nodes (id: the node, as
 * /sys/devices/system/node numbers them and uvmDevAttrHostNumaId says
 * which is nearest a device), or the node nearest the calling thread's
 * CPU (id ignored). */
typedef enum uvmMemLocationType {
	uvmMemLocationTypeInvalid = 0,
	uvmMemLocationTypeDevice = 1,
	uvmMemLocationTypeHost = 2,
	uvmMemLocationTypeHostNuma = 3,
	uvmMemLocationTypeHostNumaCurrent = 4
} uvmMemLocationType;

typedef struct uvmMemLocation {
	uvmMemLocationType type;
	int id;
} uvmMemLocation;

/* Range attributes, with cudaMemRangeAttribute's values; each is an int
 * (AccessedBy an array of them), for the whole range: a location only
 * where every page agrees. */
typedef enum uvmMemRangeAttribute {
	uvmMemRangeAttributeReadMostly = 1,           /* 1 if the whole range is read-mostly */
	uvmMemRangeAttributePreferredLocation = 2,    /* a device, uvmCpuDeviceId or uvmInvalidDeviceId */
	uvmMemRangeAttributeAccessedBy = 3,           /* int[]: devices, padded with uvmInvalidDeviceId */
	uvmMemRangeAttributeLastPrefetchLocation = 4, /* as PreferredLocation, the last prefetch's target as requested */
	uvmMemRangeAttributePreferredLocationType = 5, /* a uvmMemLocationType: Device, Host, HostNuma, or Invalid if the pages disagree or prefer none */
	uvmMemRangeAttributePreferredLocationId = 6,   /* the device for Device, the node for HostNuma; else uvmCpuDeviceId (Host) or uvmInvalidDeviceId */
	uvmMemRangeAttributeLastPrefetchLocationType = 7, /* as PreferredLocationType, of the last prefetch */
	uvmMemRangeAttributeLastPrefetchLocationId = 8    /* as PreferredLocationId */
} uvmMemRangeAttribute;

typedef enum uvmMemoryType {
	uvmMemoryTypeUnregistered = 0,
	uvmMemoryTypeHost = 1,    /* pinned host memory: uvmHostAlloc, uvmHostRegister */
	uvmMemoryTypeDevice = 2,  /* device memory: uvmMalloc */
	uvmMemoryTypeManaged = 3  /* managed memory: uvmMallocManaged */
} uvmMemoryType;

/* Attributes uvmPointerGetAttribute reads (as CUpointer_attribute, the
 * driver API's, with its values). Only uvmPointerAttributeSyncMemops can
 * be set. */
typedef enum uvmPointerAttribute {
	uvmPointerAttributeDevicePointer = 3,  /* void *: where kernels reach it, NULL if they cannot */
	uvmPointerAttributeHostPointer = 4,    /* void *: where the host reaches it (device memory: uvmErrorInvalidValue) */
	uvmPointerAttributeSyncMemops = 6,     /* unsigned: as last set, 0 at first (copies are always synchronous here) */
	uvmPointerAttributeBufferId = 7,       /* unsigned long long: the allocation's id, never reused */
	uvmPointerAttributeIsManaged = 8,      /* unsigned: 1 for managed memory */
	uvmPointerAttributeDeviceOrdinal = 9,  /* int: its device, uvmCpuDeviceId for host memory */
	uvmPointerAttributeRangeStartAddr = 11, /* void *: the allocation's start */
	uvmPointerAttributeRangeSize = 12,     /* size_t: the allocation's size */
	uvmPointerAttributeMapped = 13         /* unsigned: 1 (every allocation is mapped) */
} uvmPointerAttribute;

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

/* Device attributes, with cudaDeviceAttr's values: uvmDevAttrX is
 * cudaDevAttrX. Each is the uvmDeviceProp field of the same meaning,
 * which says its value and why; 0 or 1 for a yes or no. CUDA's texture
 * and surface attributes are uvmErrorNotSupported (a CPU device emulates
 * no textures); others without a meaning here, uvmErrorInvalidValue. */
typedef enum uvmDeviceAttr {
	uvmDevAttrMaxThreadsPerBlock = 1,
	uvmDevAttrMaxBlockDimX = 2,
	uvmDevAttrMaxBlockDimY = 3,
	uvmDevAttrMaxBlockDimZ = 4,
	uvmDevAttrMaxGridDimX = 5,
	uvmDevAttrMaxGridDimY = 6,
	uvmDevAttrMaxGridDimZ = 7,
	uvmDevAttrMaxSharedMemoryPerBlock = 8,
	uvmDevAttrTotalConstantMemory = 9,
	uvmDevAttrWarpSize = 10,
	uvmDevAttrMaxPitch = 11,
	uvmDevAttrMaxRegistersPerBlock = 12,
	uvmDevAttrClockRate = 13,
	uvmDevAttrGpuOverlap = 15,            /* 1: copies run while kernels do */
	uvmDevAttrMultiProcessorCount = 16,
	uvmDevAttrKernelExecTimeout = 17,
	uvmDevAttrIntegrated = 18,
	uvmDevAttrCanMapHostMemory = 19,
	uvmDevAttrComputeMode = 20,
	uvmDevAttrConcurrentKernels = 31,
	uvmDevAttrEccEnabled = 32,
	uvmDevAttrPciBusId = 33,              /* 0: no PCI device */
	uvmDevAttrPciDeviceId = 34,           /* 0 */
	uvmDevAttrTccDriver = 35,             /* 0 */
	uvmDevAttrL2CacheSize = 38,
	uvmDevAttrMaxThreadsPerMultiProcessor = 39,
	uvmDevAttrAsyncEngineCount = 40,
	uvmDevAttrUnifiedAddressing = 41,
	uvmDevAttrPciDomainId = 50,           /* 0 */
	uvmDevAttrTexturePitchAlignment = 51,
	uvmDevAttrComputeCapabilityMajor = 75,
	uvmDevAttrComputeCapabilityMinor = 76,
	uvmDevAttrStreamPrioritiesSupported = 78,
	uvmDevAttrGlobalL1CacheSupported = 79,
	uvmDevAttrLocalL1CacheSupported = 80,
	uvmDevAttrMaxSharedMemoryPerMultiprocessor = 81,
	uvmDevAttrMaxRegistersPerMultiprocessor = 82,
	uvmDevAttrManagedMemory = 83,
	uvmDevAttrIsMultiGpuBoard = 84,       /* 0 */
	uvmDevAttrMultiGpuBoardGroupID = 85,  /* 0 */
	uvmDevAttrHostNativeAtomicSupported = 86,
	uvmDevAttrSingleToDoublePrecisionPerfRatio = 87,
	uvmDevAttrPageableMemoryAccess = 88,
	uvmDevAttrConcurrentManagedAccess = 89, /* 1 under the fault coherence model; 0 under the launch model (UVM_COHERENCE=launch) */
	uvmDevAttrComputePreemptionSupported = 90,
	uvmDevAttrCanUseHostPointerForRegisteredMem = 91,
	uvmDevAttrCooperativeLaunch = 95,
	uvmDevAttrCooperativeMultiDeviceLaunch = 96, /* 0: a cooperative launch is of one device */
	uvmDevAttrMaxSharedMemoryPerBlockOptin = 97,
	uvmDevAttrCanFlushRemoteWrites = 98,  /* 0 */
	uvmDevAttrHostRegisterSupported = 99,
	uvmDevAttrPageableMemoryAccessUsesHostPageTables = 100,
	uvmDevAttrDirectManagedMemAccessFromHost = 101,
	uvmDevAttrMaxBlocksPerMultiprocessor = 106,
	uvmDevAttrReservedSharedMemoryPerBlock = 111, /* 0: the runtime keeps none of a block's shared memory */
	uvmDevAttrMemoryPoolsSupported = 115,
	uvmDevAttrNumaConfig = 130,           /* 1 (cudaDeviceNumaConfigNumaNode) for an arena bound to a node, else 0 */
	uvmDevAttrNumaId = 131,               /* numaNode */
	uvmDevAttrHostNumaId = 134,           /* hostNumaId */
	uvmDevAttrArenaCapacityMiB = 1000     /* softuvm's: the device's memory, in MiB */
} uvmDeviceAttr;

/* Compute modes, with cudaComputeMode's values: a device's computeMode
 * (uvmDevAttrComputeMode) is always uvmComputeModeDefault; the others are
 * named for the programs that check for them. */
typedef enum uvmComputeMode {
	uvmComputeModeDefault = 0,
	uvmComputeModeExclusive = 1,
	uvmComputeModeProhibited = 2,
	uvmComputeModeExclusiveProcess = 3
} uvmComputeMode;

/* A device's properties: the fields of cudaDeviceProp that mean
 * something for a device that is a process on the host's CPUs, under
 * the same names. Where a figure is a GPU's limit a CPU does not have
 * (registers, constant memory), it is CUDA's, so that a program's check
 * of it passes, and it says so. The struct keeps its size across
 * versions: new fields come out of reserved. */
typedef struct uvmDeviceProp {
	char name[256];               /* "softuvm CPU device N" */
	size_t totalGlobalMem;        /* the device's arena, in bytes */
	int multiProcessorCount;      /* the device's worker threads: a launch's threads, or a grid's blocks, are spread over them */
	int canMapHostMemory;         /* 1 */
	int unifiedAddressing;        /* 1: one address space for the host and every device */
	int managedMemory;            /* 1 */
	int concurrentManagedAccess;  /* 1 under the fault coherence model (the host may touch managed memory as kernels run); 0 under the launch model */
	int pageableMemoryAccess;     /* 0: kernels reach managed, device and mapped host memory only */
	int concurrentKernels;        /* 1: streams run at the same time */
	int integrated;               /* 1: the device's memory is the host's */
	size_t texturePitchAlignment; /* 512, the pitch uvmMallocPitch rounds to */
	/* Grid launches' limits, CUDA's at compute capability 6.0: */
	size_t sharedMemPerBlock;          /* 48 KiB */
	size_t sharedMemPerBlockOptin;     /* 48 KiB: nothing to opt into */
	size_t sharedMemPerMultiprocessor; /* 32 times 48 KiB: never the tighter bound on residency */
	size_t totalConstMem;              /* CUDA's 64 KiB: __constant__ variables are managed memory, with no limit of their own */
	size_t memPitch;                   /* CUDA's 2^31-1, the largest pitch of a 2D copy */
	size_t reservedSharedMemPerBlock;  /* 0 */
	int major, minor;             /* 6.0: Pascal's feature level (managed memory on demand, concurrent access,
				       * cooperative launches), less warp intrinsics and textures; not Volta's
				       * independent thread scheduling */
	int clockRate;                /* the CPU's clock in kHz: its cpufreq maximum, else /proc/cpuinfo's, else 0 */
	int computeMode;              /* 0 (default): any number of programs may use the device */
	int cooperativeLaunch;        /* 1: uvmLaunchCooperativeKernel, uvmGridSync */
	int cooperativeMultiDeviceLaunch; /* 0 */
	int pageableMemoryAccessUsesHostPageTables; /* 0: a device process has page tables of its own */
	int warpSize;                 /* 1: no two threads of a block run in lock step */
	int maxThreadsPerBlock;       /* 1024 */
	int maxThreadsDim[3];         /* 1024, 1024, 64 */
	int maxGridSize[3];           /* 2^31-1, 65535, 65535 */
	int maxThreadsPerMultiProcessor; /* 2048: what a worker keeps resident */
	int maxBlocksPerMultiProcessor;  /* 32 */
	int regsPerBlock, regsPerMultiprocessor; /* CUDA's 65536: registers limit nothing on a CPU */
	int l2CacheSize;              /* the CPU's unified level-2 cache, in bytes (0 if sysfs does not say) */
	int asyncEngineCount;         /* 2: copies both ways overlap each other and kernels */
	int deviceOverlap;            /* 1 */
	int kernelExecTimeoutEnabled; /* 0: no watchdog */
	int ECCEnabled;               /* 0 */
	int hostNativeAtomicSupported; /* 1: host and kernel atomics on one managed word are the CPU's own */
	int singleToDoublePrecisionPerfRatio; /* 2: vector units hold half as many doubles */
	int computePreemptionSupported; /* 1: kernels are threads the kernel preempts */
	int canUseHostPointerForRegisteredMem; /* 0: registered memory is reached at uvmHostGetDevicePointer's address */
	int directManagedMemAccessFromHost;    /* 0: the host's touch migrates a device's page */
	int globalL1CacheSupported, localL1CacheSupported; /* 1 */
	int streamPrioritiesSupported; /* 0 */
	int hostRegisterSupported;    /* 1 */
	int memoryPoolsSupported;     /* 0: no uvmMallocAsync */
	int numaNode;                 /* the NUMA node the device's memory is bound to, -1 if none */
	int hostNumaId;               /* the host node nearest the device: numaNode if bound, else the machine's first, -1 without NUMA */
	int reserved[16];             /* zero; room for more fields */
} uvmDeviceProp;

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

/*
 * Managed variables, as CUDA's __managed__: a global declared
 *
 *     UVM_MANAGED float table[1024] = {1, 2, 3};
 *
 * is managed memory, one copy that the host and every device's kernels
 * read and write at &table, as memory from uvmMallocManaged (prefetch,
 * advice and attributes apply to it). It works in any program linked
 * with libuvm, under `uvm run` or not: such globals go in a section of
 * their own, which this header makes start on a page and end before a
 * page of nothing else (on GNU ld and the linkers that place sections as
 * it does), and a constructor this header puts in each file hands it to
 * the library before main, which makes those pages managed memory with
 * their contents kept (connecting to the fault server then). If it
 * cannot, it says why on standard error and every call of the library
 * fails with uvmErrorNotSupported and that message, rather than let
 * kernels read a stale copy. Limits: globals only (a section holds no
 * locals); not const (a read-only global cannot share the section); in a
 * shared library, its own section, handed over when it is loaded.
 */
#define UVM_MANAGED __attribute__((section("uvm_managed")))
/* Called by the constructor below, once per module; not for programs. */
void uvm__register_managed(char *start, char *stop, char *end);
#if !defined(UVM_INTERNAL)
__asm__(".pushsection uvm_managed,\"awG\",@progbits,uvm__managed_begin,comdat\n.balign 4096\n.popsection\n"
	".pushsection uvm_managed_end,\"awG\",@progbits,uvm__managed_end,comdat\n.balign 4096\n.byte 0\n.popsection\n");
extern char __start_uvm_managed[] __attribute__((weak, visibility("hidden")));
extern char __stop_uvm_managed[] __attribute__((weak, visibility("hidden")));
extern char __start_uvm_managed_end[] __attribute__((weak, visibility("hidden")));
__attribute__((constructor(250), used)) static void uvm__managed_init(void)
{
	if (&__start_uvm_managed[0] != &__stop_uvm_managed[0])
		uvm__register_managed(__start_uvm_managed, __stop_uvm_managed, __start_uvm_managed_end);
}
#endif

/* Migration, advice and attributes. Under the launch coherence model
 * (concurrentManagedAccess 0) uvmMemPrefetchAsync is refused, and so is
 * uvmMemAdvise's preferred location or accessed-by naming a device, with
 * uvmErrorInvalidDevice, as CUDA refuses them on such a device. */
uvmError_t uvmMemPrefetchAsync(const void *devPtr, size_t count, int dstDevice, uvmStream_t stream);
/* Attaches the managed allocation at devPtr (length 0 or its size) to the
 * host, every stream or stream alone (uvmMemAttachGlobal, Host, Single),
 * as cudaStreamAttachMemAsync: in stream order, once the work queued on
 * stream before it has finished. Under the launch coherence model
 * (UVM_COHERENCE=launch) it says which launches hand the memory to their
 * device and which synchronize gives it back: once it takes effect,
 * memory attached to the host is the CPU's whatever kernels run, and
 * memory attached to one stream is the CPU's while that stream has no
 * kernel running. Under the fault model it changes nothing. */
uvmError_t uvmStreamAttachMemAsync(uvmStream_t stream, void *devPtr, size_t length, unsigned int flags);
uvmError_t uvmMemAdvise(const void *devPtr, size_t count, uvmMemoryAdvise advice, int device);
/*
 * The location forms, as cudaMemPrefetchAsync_v2 and cudaMemAdvise_v2
 * (CUDA 12.2): a device, the host, a host NUMA node or the node nearest
 * the calling thread (uvmMemLocation). flags: 0. For a host NUMA node the
 * library gives the range's host pages the policy that prefers the node
 * (mbind MPOL_PREFERRED: pages coming to the host are allocated there)
 * and a prefetch moves those already on the host there first; a
 * preferred location elsewhere, or none, puts the default policy back.
 * The range attributes *Type and *Id report the node. A node that does
 * not exist: uvmErrorInvalidValue; a device that does not:
 * uvmErrorInvalidDevice. ReadMostly ignores the location, AccessedBy
 * takes a device or the host (a node is the host).
 */
uvmError_t uvmMemPrefetchAsync_v2(const void *devPtr, size_t count, uvmMemLocation location, unsigned int flags, uvmStream_t stream);
uvmError_t uvmMemAdvise_v2(const void *devPtr, size_t count, uvmMemoryAdvise advice, uvmMemLocation location);
/* Discards the contents of the whole pages inside [devPtr, devPtr+count)
 * of a managed allocation, as cudaMemDiscardBatchAsync does for one range:
 * every copy, on the host and on devices, is dropped without being copied,
 * and the next touch of each page, by any processor, reads zeros. A page
 * the range shares with bytes outside it is kept. The pages take no memory
 * until touched again. uvmMemDiscard returns when they are gone;
 * uvmMemDiscardAsync drops them in stream order, after the work queued
 * before it (kernels included). */
uvmError_t uvmMemDiscard(const void *devPtr, size_t count);
uvmError_t uvmMemDiscardAsync(const void *devPtr, size_t count, uvmStream_t stream);
uvmError_t uvmMemRangeGetAttribute(void *data, size_t dataSize, uvmMemRangeAttribute attribute, const void *devPtr, size_t count);
/* Several attributes of one range at once: data[i] (dataSizes[i] bytes)
 * gets attrs[i], as uvmMemRangeGetAttribute would. */
uvmError_t uvmMemRangeGetAttributes(void **data, size_t *dataSizes, uvmMemRangeAttribute *attrs, size_t numAttributes, const void *devPtr,
				    size_t count);
uvmError_t uvmPointerGetAttributes(uvmPointerAttributes *attributes, const void *ptr);
/* One attribute of the allocation holding ptr (see uvmPointerAttribute). */
uvmError_t uvmPointerGetAttribute(void *data, uvmPointerAttribute attribute, const void *ptr);
/* Sets uvmPointerAttributeSyncMemops (*(const unsigned *)value, 0 or 1). */
uvmError_t uvmPointerSetAttribute(const void *value, uvmPointerAttribute attribute, const void *ptr);
/* The start and size of the allocation holding ptr; either may be NULL. */
uvmError_t uvmMemGetAddressRange(void **base, size_t *size, void *ptr);
/* The current device's free and total memory (its arena), in bytes. */
uvmError_t uvmMemGetInfo(size_t *free, size_t *total);
/* Device memory for height rows of width bytes, each row *pitch bytes
 * (width rounded up to 512). */
uvmError_t uvmMallocPitch(void **devPtr, size_t *pitch, size_t width, size_t height);

/* Copies. uvmMemcpy and uvmMemset are issued on the legacy default
 * stream, as CUDA's synchronous forms are: they wait for the work queued
 * before them there and on every blocking stream of the current device
 * (a kernel, then a synchronous copy of its output, reads what the kernel
 * wrote), then copy and return when the bytes are there. If that device
 * has failed they copy nothing and return its failure. uvmMemcpyPeer
 * does the same on the legacy streams of both devices, as cudaMemcpyPeer.
 * The Async calls (and uvmMemPrefetchAsync) check their arguments, queue
 * the work on the stream and return at once; it runs in stream order
 * with the stream's kernels, and its errors are returned by the stream's
 * next synchronize (a stream holds at most 1024 queued operations; a
 * call that would queue more waits for room). Memory given to them must
 * stay valid until then. uvmFree, uvmFreeHost and uvmHostUnregister first
 * wait for every stream of every device, kernels included, as cudaFree
 * synchronizes; the allocation calls do not synchronize. Copies into,
 * out of and between device memory run in the calling process (an Async
 * one on a thread of the stream's); large ones are shared with threads
 * started for the copy, with every signal blocked, and joined before it
 * ends. */
uvmError_t uvmMemcpy(void *dst, const void *src, size_t count, uvmMemcpyKind kind);
uvmError_t uvmMemcpyAsync(void *dst, const void *src, size_t count, uvmMemcpyKind kind, uvmStream_t stream);
uvmError_t uvmMemset(void *devPtr, int value, size_t count);
uvmError_t uvmMemsetAsync(void *devPtr, int value, size_t count, uvmStream_t stream);
/*
 * 2D and 3D copies and fills, as cudaMemcpy2D, cudaMemset2D,
 * cudaMemcpy3D, cudaMemset3D: rows of width bytes, each pitch bytes after
 * the last (a 3D box's slices ysize rows apart). With unified addressing
 * every pointer says what memory it is, as for uvmMemcpy (kind is checked
 * as uvmMemcpy checks it; uvmMemcpyDefault lets the pointers decide), and
 * there are no CUDA arrays: a 3D copy is between pitched pointers. A
 * pitch less than the width, or past uvmDevAttrMaxPitch:
 * uvmErrorInvalidPitchValue. The rows of each side must lie in one
 * allocation (or in ordinary memory) and the two spans must not overlap.
 * The synchronous forms return when the copy is done; the Async ones run
 * in stream order, as uvmMemcpyAsync.
 */
uvmError_t uvmMemcpy2D(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width, size_t height, uvmMemcpyKind kind);
uvmError_t uvmMemcpy2DAsync(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width, size_t height, uvmMemcpyKind kind,
			    uvmStream_t stream);
uvmError_t uvmMemset2D(void *devPtr, size_t pitch, int value, size_t width, size_t height);
uvmError_t uvmMemset2DAsync(void *devPtr, size_t pitch, int value, size_t width, size_t height, uvmStream_t stream);

/* A pitched pointer: rows of xsize bytes at ptr, pitch apart, slices of
 * ysize rows (as cudaPitchedPtr); an extent in bytes, rows and slices;
 * a position in bytes, rows and slices. */
typedef struct uvmPitchedPtr {
	void *ptr;
	size_t pitch, xsize, ysize;
} uvmPitchedPtr;
typedef struct uvmExtent {
	size_t width, height, depth;
} uvmExtent;
typedef struct uvmPos {
	size_t x, y, z;
} uvmPos;
static inline uvmPitchedPtr make_uvmPitchedPtr(void *d, size_t p, size_t xsz, size_t ysz) { return (uvmPitchedPtr){d, p, xsz, ysz}; }
static inline uvmExtent make_uvmExtent(size_t w, size_t h, size_t d) { return (uvmExtent){w, h, d}; }
static inline uvmPos make_uvmPos(size_t x, size_t y, size_t z) { return (uvmPos){x, y, z}; }
/* A 3D copy's parameters, as cudaMemcpy3DParms: extent from srcPos of
 * srcPtr to dstPos of dstPtr. srcArray and dstArray must be NULL (they
 * are there so that code setting them to 0 compiles). */
typedef struct uvmMemcpy3DParms {
	void *srcArray;
	uvmPos srcPos;
	uvmPitchedPtr srcPtr;
	void *dstArray;
	uvmPos dstPos;
	uvmPitchedPtr dstPtr;
	uvmExtent extent;
	uvmMemcpyKind kind;
} uvmMemcpy3DParms;
uvmError_t uvmMemcpy3D(const uvmMemcpy3DParms *p);
uvmError_t uvmMemcpy3DAsync(const uvmMemcpy3DParms *p, uvmStream_t stream);
uvmError_t uvmMemset3D(uvmPitchedPtr pitchedDevPtr, int value, uvmExtent extent);
uvmError_t uvmMemset3DAsync(uvmPitchedPtr pitchedDevPtr, int value, uvmExtent extent, uvmStream_t stream);
/* Device memory for extent.depth slices of extent.height rows of
 * extent.width bytes, each row pitch bytes (the width rounded up to 512,
 * as uvmMallocPitch): xsize is the width, ysize the height. */
uvmError_t uvmMalloc3D(uvmPitchedPtr *pitchedDevPtr, uvmExtent extent);

/* A copy between memory of two devices (each pointer device memory of
 * its device, or memory every device reaches: managed, pinned). */
uvmError_t uvmMemcpyPeer(void *dst, int dstDevice, const void *src, int srcDevice, size_t count);
uvmError_t uvmMemcpyPeerAsync(void *dst, int dstDevice, const void *src, int srcDevice, size_t count, uvmStream_t stream);
/* The synchronous forms issued on the calling thread's per-thread
 * default stream (UVM_API_PER_THREAD_DEFAULT_STREAM names them): they
 * wait for that stream and the legacy one, not for the other streams. */
uvmError_t uvmMemcpy_ptds(void *dst, const void *src, size_t count, uvmMemcpyKind kind);
uvmError_t uvmMemset_ptds(void *devPtr, int value, size_t count);
uvmError_t uvmMemcpyPeer_ptds(void *dst, int dstDevice, const void *src, int srcDevice, size_t count);
uvmError_t uvmMemcpy2D_ptds(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width, size_t height, uvmMemcpyKind kind);
uvmError_t uvmMemset2D_ptds(void *devPtr, size_t pitch, int value, size_t width, size_t height);
uvmError_t uvmMemcpy3D_ptds(const uvmMemcpy3DParms *p);
uvmError_t uvmMemset3D_ptds(uvmPitchedPtr pitchedDevPtr, int value, uvmExtent extent);

/* Devices and streams. The current device is per thread, 0 at first. */
uvmError_t uvmGetDeviceCount(int *count);
uvmError_t uvmSetDevice(int device);
uvmError_t uvmGetDevice(int *device);
uvmError_t uvmDeviceGetAttribute(int *value, uvmDeviceAttr attr, int device);
uvmError_t uvmGetDeviceProperties(uvmDeviceProp *prop, int device);
/* Waits for every stream of the current device; returns their errors
 * and the device's failure. */
uvmError_t uvmDeviceSynchronize(void);
/* The old name of uvmDeviceSynchronize, as cudaThreadSynchronize. */
uvmError_t uvmThreadSynchronize(void);
/* Waits for the current device's queued work, then ends its process
 * (kernels still running are cut short), destroys its streams, and
 * forgets its errors, its failure and its flags: the device works
 * again. Memory and peer access stay. */
uvmError_t uvmDeviceReset(void);
/* How the current device's synchronizes wait (uvmDeviceSchedule*). */
uvmError_t uvmSetDeviceFlags(unsigned int flags);
uvmError_t uvmGetDeviceFlags(unsigned int *flags);
/* Peers: every device can reach every other's memory once enabled. */
uvmError_t uvmDeviceCanAccessPeer(int *canAccessPeer, int device, int peerDevice);
uvmError_t uvmDeviceEnablePeerAccess(int peerDevice, unsigned int flags);
uvmError_t uvmDeviceDisablePeerAccess(int peerDevice);
/* A blocking stream on the current device. */
uvmError_t uvmStreamCreate(uvmStream_t *stream);
/* flags: uvmStreamDefault (blocking) or uvmStreamNonBlocking. */
uvmError_t uvmStreamCreateWithFlags(uvmStream_t *stream, unsigned int flags);
/* Streams have one priority here (the range is [0, 0]); as CUDA's, a
 * priority outside the range is taken as the nearest in it. */
uvmError_t uvmStreamCreateWithPriority(uvmStream_t *stream, unsigned int flags, int priority);
uvmError_t uvmDeviceGetStreamPriorityRange(int *leastPriority, int *greatestPriority);
uvmError_t uvmStreamGetFlags(uvmStream_t stream, unsigned int *flags);
uvmError_t uvmStreamGetPriority(uvmStream_t stream, int *priority);
/* Destroys the handle at once; work queued on the stream still runs.
 * The default streams cannot be destroyed. */
uvmError_t uvmStreamDestroy(uvmStream_t stream);
/* Waits for the work queued on stream; returns its errors and its
 * device's failure. For the legacy stream (NULL), that is the work of
 * every blocking stream too. */
uvmError_t uvmStreamSynchronize(uvmStream_t stream);
/* uvmSuccess if the work queued on stream has finished (as
 * uvmStreamSynchronize would wait for), else uvmErrorNotReady (not an
 * error), or the device's failure. */
uvmError_t uvmStreamQuery(uvmStream_t stream);
/* Later work on stream waits until event's last record (at this call)
 * has completed; the caller does not wait. flags: 0. */
uvmError_t uvmStreamWaitEvent(uvmStream_t stream, uvmEvent_t event, unsigned int flags);

/* Host functions in stream order, as cudaLaunchHostFunc and
 * cudaStreamAddCallback: fn runs on a thread of the stream's once the
 * work queued before it has finished (for unified memory the stream is
 * then idle: a kernel's output is there to read), and the work queued
 * after it waits until it returns. It must not call this API (the call
 * fails with uvmErrorNotPermitted), nor wait for work that is not
 * before it. A callback gets the stream as given, and uvmSuccess or the
 * error of the work before it (the device's failure, else that of an
 * operation queued before it that no synchronize has reported yet).
 * flags: 0. */
typedef void (*uvmHostFn_t)(void *userData);
typedef void (*uvmStreamCallback_t)(uvmStream_t stream, uvmError_t status, void *userData);
uvmError_t uvmLaunchHostFunc(uvmStream_t stream, uvmHostFn_t fn, void *userData);
uvmError_t uvmStreamAddCallback(uvmStream_t stream, uvmStreamCallback_t callback, void *userData, unsigned int flags);

/*
 * The profiler API, as cudaProfilerStart and cudaProfilerStop: start and
 * stop a trace of this process's managed memory, as `uvm trace record`
 * records one (every fault, migration, prefetch, eviction, allocation and
 * free, and the kernels of device processes started while it records),
 * which `uvm trace summary|export|plot FILE` read. The file is $UVM_TRACE
 * if set, else PROGRAM.uvmtrace in the working directory; each later
 * start after a stop records to FILE.2, FILE.3 and on. Under UVM_TRACE the
 * process records from its first call already. Starting while recording,
 * or stopping while not, is no error (as CUDA's since 5.0). The server
 * writes the file: a daemon needs the right to.
 */
uvmError_t uvmProfilerStart(void);
uvmError_t uvmProfilerStop(void);

/* Events. An event completes when the work queued on its stream before
 * uvmEventRecord has finished (on the legacy stream: the work of every
 * blocking stream too), and takes the time of that moment. Once the
 * device of its last record has failed, uvmEventQuery,
 * uvmEventSynchronize and uvmEventElapsedTime return that failure. */
uvmError_t uvmEventCreate(uvmEvent_t *event);
uvmError_t uvmEventCreateWithFlags(uvmEvent_t *event, unsigned int flags);
uvmError_t uvmEventRecord(uvmEvent_t event, uvmStream_t stream);
/* uvmSuccess if the last record completed (or there was none), else
 * uvmErrorNotReady. */
uvmError_t uvmEventQuery(uvmEvent_t event);
uvmError_t uvmEventSynchronize(uvmEvent_t event);
/* Milliseconds from start's completion to end's. */
uvmError_t uvmEventElapsedTime(float *ms, uvmEvent_t start, uvmEvent_t end);
uvmError_t uvmEventDestroy(uvmEvent_t event);

/*
 * uvmLaunchKernel runs kernel on device with nthreads threads, after the
 * work queued on stream (NULL: the device's legacy default stream;
 * uvmStreamPerThread: the thread's default stream of device), and
 * returns at once. The kernel is an ordinary function of the program; it
 * runs on the device's worker threads, in the device's process (a fork
 * of this one), and sees managed, device and mapped host memory at the
 * same pointers. Other memory it sees as it was when the device's
 * process started, as a GPU kernel cannot see host memory. params
 * (paramsSize bytes, at most uvmMaxKernelParams) are copied now, as CUDA
 * copies kernel arguments. A launch that fails (the kernel crashes, the
 * device's process dies or cannot start) fails the device, as a kernel
 * fault does a CUDA context: every later synchronize of the device or of
 * any of its streams, and the events of the device, return
 * uvmErrorLaunchFailure with what happened; launches and other work on
 * it are refused with it, until uvmDeviceReset, after which the next
 * launch starts a new process (the device's memory is intact).
 */
uvmError_t uvmLaunchKernel(int device, uvmStream_t stream, unsigned nthreads, uvmKernel_t kernel, const void *params, size_t paramsSize);

/*
 * Grids: CUDA's launch. uvmLaunchGrid runs kernel as gridDim blocks of
 * blockDim threads each, as kernel<<<gridDim, blockDim, sharedMem,
 * stream>>>: on device, after the work queued on stream (NULL: the
 * device's default stream; otherwise a stream of device), returning at
 * once; params are copied as uvmLaunchKernel copies them. In the kernel,
 * uvmThreadIdx, uvmBlockIdx, uvmBlockDim and uvmGridDim say where the
 * running thread is (uvm_cuda.h names them threadIdx, blockIdx, blockDim
 * and gridDim, as CUDA does).
 *
 * The limits are CUDA's at compute capability 6.0, as the device's
 * attributes report them: at most 1024 threads in a block, (1024, 1024,
 * 64) in each dimension, (2^31-1, 65535, 65535) blocks, and sharedMem at
 * most 48 KiB; past them, or a dimension of 0: uvmErrorInvalidConfiguration,
 * naming the value and the limit.
 *
 * How it runs: the blocks are shared out among the device's workers (a
 * block at a time each); a block's threads take turns on its worker, the
 * first on the worker's own stack, the others, once a thread waits at a
 * barrier, as fibers on stacks of their own (uvmDeviceSetLimit's
 * uvmLimitStackSize, 64 KiB by default). A block of any size runs, and
 * its threads may wait for each other at uvmSyncThreads; a block whose
 * threads never wait costs a loop over them. No two threads of a block
 * run at once, so a thread that spins waiting for another thread of its
 * block (without a barrier) never lets it run: that kernel hangs.
 */
typedef struct uvmDim3 {
	unsigned int x, y, z;
} uvmDim3;

/* Where a grid kernel's thread is. The library sets it for each thread as
 * it runs; a kernel reads it through the macros below (uvm_cuda.h's
 * threadIdx, ...), which make it read-only. */
typedef struct uvmGridCoords {
	uvmDim3 threadIdx, blockIdx, blockDim, gridDim;
} uvmGridCoords;
extern __thread uvmGridCoords uvm__coords;
#define uvmThreadIdx (*(const uvmDim3 *)&uvm__coords.threadIdx)
#define uvmBlockIdx (*(const uvmDim3 *)&uvm__coords.blockIdx)
#define uvmBlockDim (*(const uvmDim3 *)&uvm__coords.blockDim)
#define uvmGridDim (*(const uvmDim3 *)&uvm__coords.gridDim)

/* A grid kernel: every thread of every block calls it with a copy of the
 * launch's params. */
typedef void (*uvmGridKernel_t)(const void *params);

uvmError_t uvmLaunchGrid(int device, uvmStream_t stream, uvmDim3 gridDim, uvmDim3 blockDim, size_t sharedMem, uvmGridKernel_t kernel,
			 const void *params, size_t paramsSize);
/* As uvmLaunchGrid, with every block resident at once (each on a thread
 * of its own), so that uvmGridSync may wait for all of them, as
 * cudaLaunchCooperativeKernel. A grid of more blocks than
 * uvmOccupancyMaxActiveBlocksPerMultiprocessor times the device's
 * multiprocessor count (its workers) is refused with
 * uvmErrorCooperativeLaunchTooLarge, naming both. */
uvmError_t uvmLaunchCooperativeKernel(int device, uvmStream_t stream, uvmDim3 gridDim, uvmDim3 blockDim, size_t sharedMem,
				      uvmGridKernel_t kernel, const void *params, size_t paramsSize);
/* How many blocks of blockSize threads with dynamicSMemSize bytes of
 * shared memory one worker keeps resident: min(32, 2048 / blockSize),
 * shared memory never the tighter bound (a worker has 32 times 48 KiB);
 * 0 for a block past the limits. kernel: any kernel (its registers limit
 * nothing here), not NULL. */
uvmError_t uvmOccupancyMaxActiveBlocksPerMultiprocessor(int *numBlocks, const void *kernel, int blockSize, size_t dynamicSMemSize);

/* The block size that keeps the most threads of kernel resident on the
 * current device (the largest such block up to blockSizeLimit, or 1024
 * without one: 1024 itself then), and the smallest grid that fills the device
 * with such blocks (uvmOccupancyMaxActiveBlocksPerMultiprocessor times
 * its multiprocessors, the device's workers), as
 * cudaOccupancyMaxPotentialBlockSize. blockSizeLimit: 0 or past 1024
 * for none.
 * dynamicSMemSize: each block's dynamic shared memory, at most 48 KiB. */
uvmError_t uvmOccupancyMaxPotentialBlockSize(int *minGridSize, int *blockSize, const void *kernel, size_t dynamicSMemSize, int blockSizeLimit);

/* In a grid kernel only (elsewhere they print why and abort, which in a
 * device process is a kernel crash the next synchronize reports):
 *  - uvmSyncThreads: waits until every thread of the block still running
 *    has reached it (__syncthreads); a thread that returned no longer
 *    counts;
 *  - uvmSyncThreadsCount, And, Or: the same, and how many of the threads
 *    passed a nonzero predicate, whether all did, whether any did;
 *  - uvmGridSync: waits until every thread of every block of a
 *    cooperative launch still running has reached it (grid.sync()); in a
 *    launch that is not cooperative it aborts;
 *  - uvmDynamicShared: the block's sharedMem bytes of shared memory
 *    (extern __shared__), 64-byte aligned, the same for every thread of a
 *    block and another for every block running at the same time. */
void uvmSyncThreads(void);
int uvmSyncThreadsCount(int predicate);
int uvmSyncThreadsAnd(int predicate);
int uvmSyncThreadsOr(int predicate);
void uvmGridSync(void);
void *uvmDynamicShared(void);

/* Limits, as cudaLimit: only the stack of a grid kernel's threads. */
typedef enum uvmLimit {
	uvmLimitStackSize = 0 /* bytes of each thread's stack after a block's first: 16 KiB to 64 MiB, 64 KiB at first */
} uvmLimit;
/* For the current device's later launches. Other limits:
 * uvmErrorUnsupportedLimit. */
uvmError_t uvmDeviceSetLimit(uvmLimit limit, size_t value);
uvmError_t uvmDeviceGetLimit(size_t *value, uvmLimit limit);

#ifdef UVM_API_PER_THREAD_DEFAULT_STREAM
/* NULL means the calling thread's default stream in this translation
 * unit, as CUDA_API_PER_THREAD_DEFAULT_STREAM makes it mean in CUDA's;
 * the functions keep their names and addresses. */
static inline uvmStream_t uvm__per_thread(uvmStream_t stream) { return stream ? stream : uvmStreamPerThread; }
#define uvmLaunchKernel(device, stream, ...) uvmLaunchKernel(device, uvm__per_thread(stream), __VA_ARGS__)
#define uvmLaunchGrid(device, stream, ...) uvmLaunchGrid(device, uvm__per_thread(stream), __VA_ARGS__)
#define uvmLaunchCooperativeKernel(device, stream, ...) uvmLaunchCooperativeKernel(device, uvm__per_thread(stream), __VA_ARGS__)
#define uvmMemPrefetchAsync(devPtr, count, dstDevice, stream) uvmMemPrefetchAsync(devPtr, count, dstDevice, uvm__per_thread(stream))
#define uvmMemPrefetchAsync_v2(devPtr, count, location, flags, stream) uvmMemPrefetchAsync_v2(devPtr, count, location, flags, uvm__per_thread(stream))
#define uvmStreamAttachMemAsync(stream, ...) uvmStreamAttachMemAsync(uvm__per_thread(stream), __VA_ARGS__)
#define uvmMemDiscardAsync(devPtr, count, stream) uvmMemDiscardAsync(devPtr, count, uvm__per_thread(stream))
#define uvmMemcpyAsync(dst, src, count, kind, stream) uvmMemcpyAsync(dst, src, count, kind, uvm__per_thread(stream))
#define uvmMemsetAsync(devPtr, value, count, stream) uvmMemsetAsync(devPtr, value, count, uvm__per_thread(stream))
#define uvmMemcpy2DAsync(dst, dpitch, src, spitch, width, height, kind, stream) \
	uvmMemcpy2DAsync(dst, dpitch, src, spitch, width, height, kind, uvm__per_thread(stream))
#define uvmMemset2DAsync(devPtr, pitch, value, width, height, stream) uvmMemset2DAsync(devPtr, pitch, value, width, height, uvm__per_thread(stream))
#define uvmMemcpy3DAsync(p, stream) uvmMemcpy3DAsync(p, uvm__per_thread(stream))
#define uvmMemset3DAsync(pitchedDevPtr, value, extent, stream) uvmMemset3DAsync(pitchedDevPtr, value, extent, uvm__per_thread(stream))
#define uvmMemcpyPeerAsync(dst, dstDevice, src, srcDevice, count, stream) \
	uvmMemcpyPeerAsync(dst, dstDevice, src, srcDevice, count, uvm__per_thread(stream))
#define uvmStreamSynchronize(stream) uvmStreamSynchronize(uvm__per_thread(stream))
#define uvmStreamQuery(stream) uvmStreamQuery(uvm__per_thread(stream))
#define uvmStreamWaitEvent(stream, ...) uvmStreamWaitEvent(uvm__per_thread(stream), __VA_ARGS__)
#define uvmStreamGetFlags(stream, flags) uvmStreamGetFlags(uvm__per_thread(stream), flags)
#define uvmStreamGetPriority(stream, priority) uvmStreamGetPriority(uvm__per_thread(stream), priority)
#define uvmEventRecord(event, stream) uvmEventRecord(event, uvm__per_thread(stream))
#define uvmLaunchHostFunc(stream, ...) uvmLaunchHostFunc(uvm__per_thread(stream), __VA_ARGS__)
#define uvmStreamAddCallback(stream, ...) uvmStreamAddCallback(uvm__per_thread(stream), __VA_ARGS__)
#define uvmMemcpy uvmMemcpy_ptds
#define uvmMemset uvmMemset_ptds
#define uvmMemcpyPeer uvmMemcpyPeer_ptds
#define uvmMemcpy2D uvmMemcpy2D_ptds
#define uvmMemset2D uvmMemset2D_ptds
#define uvmMemcpy3D uvmMemcpy3D_ptds
#define uvmMemset3D uvmMemset3D_ptds
#endif

#ifdef __cplusplus
}
#endif

#endif /* UVM_H */
