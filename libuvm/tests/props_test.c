/*
 * props_test.c: device properties, memory information, pitched
 * allocations, range and pointer attributes, and peer access. Run by
 * integration/libuvm_test.go with a private server, 2 devices of 2
 * workers and 64 MiB arenas.
 */
#define _GNU_SOURCE
#include <stdbool.h>
#include <stdint.h>
#include <sys/mman.h>

#include "check.h"

#define MiB (1ul << 20)
#define NDEVICES 2
#define ARENA (64 * MiB)

/* machine_clock_khz: the CPU clock as the properties say it, read here
 * with stdio: cpufreq's maximum, else /proc/cpuinfo's first "cpu MHz". */
static int machine_clock_khz(void)
{
	int khz = 0;
	FILE *f = fopen("/sys/devices/system/cpu/cpu0/cpufreq/cpuinfo_max_freq", "r");
	if (f) {
		if (fscanf(f, "%d", &khz) != 1)
			khz = 0;
		fclose(f);
		return khz;
	}
	f = fopen("/proc/cpuinfo", "r");
	char line[256];
	double mhz;
	while (f && fgets(line, sizeof line, f))
		if (sscanf(line, "cpu MHz : %lf", &mhz) == 1) {
			khz = (int)(mhz * 1000);
			break;
		}
	if (f)
		fclose(f);
	return khz;
}

/* machine_l2: the unified L2 cache of cpu0, from sysfs. */
static int machine_l2(void)
{
	for (int i = 0; i < 8; i++) {
		char path[96], type[32] = "";
		int level = 0, kb = 0;
		snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu0/cache/index%d/level", i);
		FILE *f = fopen(path, "r");
		if (!f)
			continue;
		if (fscanf(f, "%d", &level) != 1)
			level = 0;
		fclose(f);
		snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu0/cache/index%d/type", i);
		if ((f = fopen(path, "r"))) {
			if (fscanf(f, "%31s", type) != 1)
				type[0] = '\0';
			fclose(f);
		}
		snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu0/cache/index%d/size", i);
		if (level == 2 && strcmp(type, "Unified") == 0 && (f = fopen(path, "r"))) {
			if (fscanf(f, "%dK", &kb) != 1)
				kb = 0;
			fclose(f);
			return kb << 10;
		}
	}
	return 0;
}

static void test_device_properties(void)
{
	uvmDeviceProp p;
	for (int d = 0; d < NDEVICES; d++) {
		memset(&p, 0xee, sizeof p);
		CHECK_OK(uvmGetDeviceProperties(&p, d));
		char want[64];
		snprintf(want, sizeof want, "softuvm CPU device %d", d);
		CHECK(strcmp(p.name, want) == 0);
		CHECK(p.totalGlobalMem == ARENA);
		CHECK(p.multiProcessorCount == 2);
		CHECK(p.canMapHostMemory == 1 && p.unifiedAddressing == 1 && p.managedMemory == 1);
		CHECK(p.concurrentManagedAccess == 1 && p.pageableMemoryAccess == 0);
		CHECK(p.concurrentKernels == 1 && p.integrated == 1);
		CHECK(p.texturePitchAlignment == 512);
		CHECK(p.major == 6 && p.minor == 0);
		CHECK(p.clockRate == machine_clock_khz());
		CHECK(p.l2CacheSize == machine_l2());
		CHECK(p.cooperativeLaunch == 1 && p.pageableMemoryAccessUsesHostPageTables == 0 && p.computeMode == 0);
		CHECK(p.warpSize == 1 && p.maxThreadsPerBlock == 1024);
		CHECK(p.maxThreadsDim[0] == 1024 && p.maxThreadsDim[1] == 1024 && p.maxThreadsDim[2] == 64);
		CHECK(p.maxGridSize[0] == 2147483647 && p.maxGridSize[1] == 65535 && p.maxGridSize[2] == 65535);
		CHECK(p.sharedMemPerBlock == 49152 && p.sharedMemPerBlockOptin == 49152 && p.sharedMemPerMultiprocessor == 32 * 49152);
		CHECK(p.maxThreadsPerMultiProcessor == 2048 && p.maxBlocksPerMultiProcessor == 32);
		CHECK(p.numaNode == -1 && p.hostNumaId == 0); /* memfd arenas on a machine with node 0 */
		CHECK(p.reserved[0] == 0 && p.reserved[15] == 0);
		/* Every attribute, its value written out here. */
		static const struct {
			uvmDeviceAttr attr;
			int want;
		} attrs[] = {
			{uvmDevAttrMaxThreadsPerBlock, 1024}, {uvmDevAttrMaxBlockDimX, 1024}, {uvmDevAttrMaxBlockDimY, 1024},
			{uvmDevAttrMaxBlockDimZ, 64}, {uvmDevAttrMaxGridDimX, 2147483647}, {uvmDevAttrMaxGridDimY, 65535},
			{uvmDevAttrMaxGridDimZ, 65535}, {uvmDevAttrMaxSharedMemoryPerBlock, 49152}, {uvmDevAttrTotalConstantMemory, 65536},
			{uvmDevAttrWarpSize, 1}, {uvmDevAttrMaxPitch, 2147483647}, {uvmDevAttrMaxRegistersPerBlock, 65536},
			{uvmDevAttrGpuOverlap, 1}, {uvmDevAttrMultiProcessorCount, 2}, {uvmDevAttrKernelExecTimeout, 0},
			{uvmDevAttrIntegrated, 1}, {uvmDevAttrCanMapHostMemory, 1}, {uvmDevAttrComputeMode, 0},
			{uvmDevAttrConcurrentKernels, 1}, {uvmDevAttrEccEnabled, 0}, {uvmDevAttrPciBusId, 0}, {uvmDevAttrPciDeviceId, 0},
			{uvmDevAttrTccDriver, 0}, {uvmDevAttrMaxThreadsPerMultiProcessor, 2048}, {uvmDevAttrAsyncEngineCount, 2},
			{uvmDevAttrUnifiedAddressing, 1}, {uvmDevAttrPciDomainId, 0}, {uvmDevAttrTexturePitchAlignment, 512},
			{uvmDevAttrComputeCapabilityMajor, 6}, {uvmDevAttrComputeCapabilityMinor, 0}, {uvmDevAttrStreamPrioritiesSupported, 0},
			{uvmDevAttrGlobalL1CacheSupported, 1}, {uvmDevAttrLocalL1CacheSupported, 1},
			{uvmDevAttrMaxSharedMemoryPerMultiprocessor, 1572864}, {uvmDevAttrMaxRegistersPerMultiprocessor, 65536},
			{uvmDevAttrManagedMemory, 1}, {uvmDevAttrIsMultiGpuBoard, 0}, {uvmDevAttrMultiGpuBoardGroupID, 0},
			{uvmDevAttrHostNativeAtomicSupported, 1}, {uvmDevAttrSingleToDoublePrecisionPerfRatio, 2},
			{uvmDevAttrPageableMemoryAccess, 0}, {uvmDevAttrConcurrentManagedAccess, 1}, {uvmDevAttrComputePreemptionSupported, 1},
			{uvmDevAttrCanUseHostPointerForRegisteredMem, 0}, {uvmDevAttrCooperativeLaunch, 1},
			{uvmDevAttrCooperativeMultiDeviceLaunch, 0}, {uvmDevAttrMaxSharedMemoryPerBlockOptin, 49152},
			{uvmDevAttrCanFlushRemoteWrites, 0}, {uvmDevAttrHostRegisterSupported, 1},
			{uvmDevAttrPageableMemoryAccessUsesHostPageTables, 0}, {uvmDevAttrDirectManagedMemAccessFromHost, 0},
			{uvmDevAttrMaxBlocksPerMultiprocessor, 32}, {uvmDevAttrReservedSharedMemoryPerBlock, 0},
			{uvmDevAttrMemoryPoolsSupported, 0}, {uvmDevAttrNumaConfig, 0}, {uvmDevAttrNumaId, -1}, {uvmDevAttrHostNumaId, 0},
			{uvmDevAttrArenaCapacityMiB, 64},
		};
		for (size_t i = 0; i < sizeof attrs / sizeof attrs[0]; i++) {
			int v = -12345;
			CHECK_OK(uvmDeviceGetAttribute(&v, attrs[i].attr, d));
			if (v != attrs[i].want)
				fprintf(stderr, "device %d attribute %d: %d, want %d\n", d, (int)attrs[i].attr, v, attrs[i].want);
			CHECK(v == attrs[i].want);
		}
		int v = -1;
		CHECK_OK(uvmDeviceGetAttribute(&v, uvmDevAttrClockRate, d));
		CHECK(v == machine_clock_khz() && v > 0);
		CHECK_OK(uvmDeviceGetAttribute(&v, uvmDevAttrL2CacheSize, d));
		CHECK(v == machine_l2());
		CHECK_ERR(uvmDeviceGetAttribute(&v, (uvmDeviceAttr)22, d), uvmErrorNotSupported); /* MaxTexture2DWidth */
		CHECK(strstr(uvmGetLastErrorMessage(), "textures") != NULL);
		CHECK_ERR(uvmDeviceGetAttribute(&v, (uvmDeviceAttr)36, d), uvmErrorInvalidValue); /* MemoryClockRate */
		uvmGetLastError();
	}
	CHECK_ERR(uvmGetDeviceProperties(NULL, 0), uvmErrorInvalidValue);
	CHECK_ERR(uvmGetDeviceProperties(&p, NDEVICES), uvmErrorInvalidDevice);
	CHECK_ERR(uvmGetDeviceProperties(&p, -1), uvmErrorInvalidDevice);
}

static void test_mem_get_info(void)
{
	size_t free0 = 0, total0 = 0, free1 = 0, total1 = 0;
	CHECK_ERR(uvmMemGetInfo(NULL, &total0), uvmErrorInvalidValue);
	CHECK_ERR(uvmMemGetInfo(&free0, NULL), uvmErrorInvalidValue);
	CHECK_OK(uvmMemGetInfo(&free0, &total0));
	CHECK(total0 == ARENA);
	CHECK(free0 <= total0);
	/* Device memory takes its arena at once. */
	void *d;
	CHECK_OK(uvmMalloc(&d, 8 * MiB));
	CHECK_OK(uvmMemGetInfo(&free1, &total1));
	CHECK(total1 == ARENA);
	CHECK(free0 - free1 == 8 * MiB);
	if (free0 - free1 != 8 * MiB)
		fprintf(stderr, "free before %zu, after 8 MiB of device memory %zu\n", free0, free1);
	/* The current device's: device 1's arena did not change. */
	size_t free_other = 0, total_other = 0;
	CHECK_OK(uvmSetDevice(1));
	CHECK_OK(uvmMemGetInfo(&free_other, &total_other));
	CHECK_OK(uvmSetDevice(0));
	CHECK(total_other == ARENA && free_other == ARENA);
	CHECK_OK(uvmFree(d));
	CHECK_OK(uvmMemGetInfo(&free1, &total1));
	CHECK(free1 == free0);
}

static void test_malloc_pitch(void)
{
	static const struct {
		size_t width, pitch;
	} cases[] = {{1, 512}, {100, 512}, {512, 512}, {513, 1024}, {4000, 4096}};
	for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
		void *p = NULL;
		size_t pitch = 0;
		CHECK_OK(uvmMallocPitch(&p, &pitch, cases[i].width, 10));
		CHECK(pitch == cases[i].pitch);
		uvmPointerAttributes at;
		CHECK_OK(uvmPointerGetAttributes(&at, p));
		CHECK(at.type == uvmMemoryTypeDevice && at.device == 0);
		size_t size = 0;
		CHECK_OK(uvmMemGetAddressRange(NULL, &size, p));
		CHECK(size == pitch * 10);
		CHECK_OK(uvmMemset(p, 1, pitch * 10)); /* all of it is there */
		CHECK_OK(uvmFree(p));
	}
	void *p = (void *)1;
	size_t pitch = 7;
	CHECK_ERR(uvmMallocPitch(NULL, &pitch, 10, 10), uvmErrorInvalidValue);
	CHECK_ERR(uvmMallocPitch(&p, NULL, 10, 10), uvmErrorInvalidValue);
	CHECK_ERR(uvmMallocPitch(&p, &pitch, 0, 10), uvmErrorInvalidValue);
	CHECK(p == NULL);
	CHECK_ERR(uvmMallocPitch(&p, &pitch, 10, 0), uvmErrorInvalidValue);
	CHECK_ERR(uvmMallocPitch(&p, &pitch, SIZE_MAX - 10, 2), uvmErrorInvalidValue);
	CHECK_ERR(uvmMallocPitch(&p, &pitch, 1 << 20, SIZE_MAX / 1000), uvmErrorInvalidValue);
	CHECK_ERR(uvmMallocPitch(&p, &pitch, 1 << 20, 1000), uvmErrorMemoryAllocation); /* 1000 MiB: over the arena */
}

static void test_range_attributes(void)
{
	size_t n = 4 * MiB;
	unsigned char *m;
	CHECK_OK(uvmMallocManaged((void **)&m, n, uvmMemAttachGlobal));
	if (!m)
		return;
	memset(m, 3, n);
	CHECK_OK(uvmMemAdvise(m, n, uvmMemAdviseSetReadMostly, 0));
	CHECK_OK(uvmMemAdvise(m, n, uvmMemAdviseSetPreferredLocation, 1));
	CHECK_OK(uvmMemAdvise(m, n, uvmMemAdviseSetAccessedBy, 0));
	CHECK_OK(uvmMemPrefetchAsync(m, n, 1, NULL));
	CHECK_OK(uvmDeviceSynchronize());
	int read_mostly = -1, preferred = -1, last = -1, accessed[3] = {-1, -1, -1};
	void *data[4] = {&read_mostly, &preferred, &last, accessed};
	size_t sizes[4] = {4, 4, 4, sizeof accessed};
	uvmMemRangeAttribute attrs[4] = {uvmMemRangeAttributeReadMostly, uvmMemRangeAttributePreferredLocation,
					 uvmMemRangeAttributeLastPrefetchLocation, uvmMemRangeAttributeAccessedBy};
	CHECK_OK(uvmMemRangeGetAttributes(data, sizes, attrs, 4, m, n));
	CHECK(read_mostly == 1 && preferred == 1 && last == 1);
	CHECK(accessed[0] == 0 && accessed[1] == uvmInvalidDeviceId && accessed[2] == uvmInvalidDeviceId);
	/* As one attribute at a time. */
	int one = -1;
	CHECK_OK(uvmMemRangeGetAttribute(&one, 4, uvmMemRangeAttributePreferredLocation, m, n));
	CHECK(one == preferred);
	CHECK_OK(uvmMemRangeGetAttributes(data + 2, sizes + 2, attrs + 2, 1, m + 4096, 4096));
	CHECK(last == 1);

	CHECK_ERR(uvmMemRangeGetAttributes(NULL, sizes, attrs, 4, m, n), uvmErrorInvalidValue);
	CHECK_ERR(uvmMemRangeGetAttributes(data, NULL, attrs, 4, m, n), uvmErrorInvalidValue);
	CHECK_ERR(uvmMemRangeGetAttributes(data, sizes, NULL, 4, m, n), uvmErrorInvalidValue);
	CHECK_ERR(uvmMemRangeGetAttributes(data, sizes, attrs, 0, m, n), uvmErrorInvalidValue);
	size_t bad_sizes[4] = {4, 4, 8, sizeof accessed};
	CHECK_ERR(uvmMemRangeGetAttributes(data, bad_sizes, attrs, 4, m, n), uvmErrorInvalidValue);
	CHECK(strstr(uvmGetLastErrorMessage(), "attribute 2") != NULL);
	uvmMemRangeAttribute bad_attrs[2] = {uvmMemRangeAttributeReadMostly, (uvmMemRangeAttribute)9};
	CHECK_ERR(uvmMemRangeGetAttributes(data, sizes, bad_attrs, 2, m, n), uvmErrorInvalidValue);
	void *null_data[1] = {NULL};
	CHECK_ERR(uvmMemRangeGetAttributes(null_data, sizes, attrs, 1, m, n), uvmErrorInvalidValue);
	CHECK_ERR(uvmMemRangeGetAttributes(data, sizes, attrs, 4, m, n + 8192), uvmErrorInvalidValue);
	int local = 0;
	CHECK_ERR(uvmMemRangeGetAttributes(data, sizes, attrs, 4, &local, 4), uvmErrorInvalidValue);
	CHECK_OK(uvmFree(m));
}

static void test_pointer_attributes(void)
{
	unsigned char *m, *h, *d;
	CHECK_OK(uvmMallocManaged((void **)&m, 3 * MiB + 5, uvmMemAttachGlobal));
	CHECK_OK(uvmHostAlloc((void **)&h, MiB, uvmHostAllocMapped));
	CHECK_OK(uvmSetDevice(1));
	CHECK_OK(uvmMalloc((void **)&d, MiB));
	CHECK_OK(uvmSetDevice(0));
	size_t reg_len = 2 * 4096;
	unsigned char *reg = mmap(NULL, reg_len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (!m || !h || !d || reg == MAP_FAILED)
		return;
	CHECK_OK(uvmHostRegister(reg, reg_len, uvmHostRegisterMapped));

	/* Sync memops: recorded, read back, per allocation. */
	unsigned v = 7, one = 1, zero = 0, two = 2;
	CHECK_OK(uvmPointerGetAttribute(&v, uvmPointerAttributeSyncMemops, m + 100));
	CHECK(v == 0);
	CHECK_OK(uvmPointerSetAttribute(&one, uvmPointerAttributeSyncMemops, m + 5000));
	CHECK_OK(uvmPointerGetAttribute(&v, uvmPointerAttributeSyncMemops, m));
	CHECK(v == 1);
	CHECK_OK(uvmPointerGetAttribute(&v, uvmPointerAttributeSyncMemops, h));
	CHECK(v == 0);
	CHECK_OK(uvmPointerSetAttribute(&one, uvmPointerAttributeSyncMemops, d));
	CHECK_OK(uvmPointerSetAttribute(&zero, uvmPointerAttributeSyncMemops, m));
	CHECK_OK(uvmPointerGetAttribute(&v, uvmPointerAttributeSyncMemops, m));
	CHECK(v == 0);
	CHECK_OK(uvmPointerGetAttribute(&v, uvmPointerAttributeSyncMemops, d + 10));
	CHECK(v == 1);
	CHECK_OK(uvmPointerSetAttribute(&one, uvmPointerAttributeSyncMemops, reg + 4096));
	CHECK_OK(uvmPointerGetAttribute(&v, uvmPointerAttributeSyncMemops, reg));
	CHECK(v == 1);
	CHECK_ERR(uvmPointerSetAttribute(&two, uvmPointerAttributeSyncMemops, m), uvmErrorInvalidValue);
	CHECK_ERR(uvmPointerSetAttribute(NULL, uvmPointerAttributeSyncMemops, m), uvmErrorInvalidValue);
	CHECK_ERR(uvmPointerSetAttribute(&one, uvmPointerAttributeIsManaged, m), uvmErrorInvalidValue);
	CHECK(strstr(uvmGetLastErrorMessage(), "only") != NULL);
	int local = 0;
	CHECK_ERR(uvmPointerSetAttribute(&one, uvmPointerAttributeSyncMemops, &local), uvmErrorInvalidValue);
	CHECK_ERR(uvmPointerGetAttribute(&v, uvmPointerAttributeSyncMemops, &local), uvmErrorInvalidValue);
	CHECK_ERR(uvmPointerGetAttribute(&v, uvmPointerAttributeSyncMemops, NULL), uvmErrorInvalidValue);
	CHECK_ERR(uvmPointerGetAttribute(NULL, uvmPointerAttributeSyncMemops, m), uvmErrorInvalidValue);
	CHECK_ERR(uvmPointerGetAttribute(&v, (uvmPointerAttribute)5, m), uvmErrorInvalidValue);

	/* The others. */
	void *p = NULL;
	size_t size = 0;
	unsigned u = 9;
	int dev = 9;
	unsigned long long id = 0, id2 = 0;
	CHECK_OK(uvmPointerGetAttribute(&p, uvmPointerAttributeRangeStartAddr, m + 12345));
	CHECK(p == m);
	CHECK_OK(uvmPointerGetAttribute(&size, uvmPointerAttributeRangeSize, m + 12345));
	CHECK(size == 3 * MiB + 5);
	CHECK_OK(uvmPointerGetAttribute(&u, uvmPointerAttributeIsManaged, m));
	CHECK(u == 1);
	CHECK_OK(uvmPointerGetAttribute(&u, uvmPointerAttributeIsManaged, d));
	CHECK(u == 0);
	CHECK_OK(uvmPointerGetAttribute(&dev, uvmPointerAttributeDeviceOrdinal, d));
	CHECK(dev == 1);
	CHECK_OK(uvmPointerGetAttribute(&dev, uvmPointerAttributeDeviceOrdinal, h));
	CHECK(dev == uvmCpuDeviceId);
	CHECK_OK(uvmPointerGetAttribute(&u, uvmPointerAttributeMapped, h));
	CHECK(u == 1);
	CHECK_OK(uvmPointerGetAttribute(&p, uvmPointerAttributeDevicePointer, d + 1));
	CHECK(p == d + 1);
	CHECK_ERR(uvmPointerGetAttribute(&p, uvmPointerAttributeHostPointer, d), uvmErrorInvalidValue);
	CHECK_OK(uvmPointerGetAttribute(&p, uvmPointerAttributeHostPointer, m + 3));
	CHECK(p == m + 3);
	void *dreg = NULL;
	CHECK_OK(uvmHostGetDevicePointer(&dreg, reg, 0));
	CHECK_OK(uvmPointerGetAttribute(&p, uvmPointerAttributeDevicePointer, reg + 8));
	CHECK(p == (unsigned char *)dreg + 8);
	CHECK_OK(uvmPointerGetAttribute(&p, uvmPointerAttributeHostPointer, (unsigned char *)dreg + 8));
	CHECK(p == reg + 8);
	CHECK_OK(uvmPointerGetAttribute(&p, uvmPointerAttributeRangeStartAddr, reg + 4097));
	CHECK(p == reg);
	CHECK_OK(uvmPointerGetAttribute(&id, uvmPointerAttributeBufferId, m));
	CHECK_OK(uvmPointerGetAttribute(&id2, uvmPointerAttributeBufferId, h));
	CHECK(id != 0 && id != id2);

	/* uvmMemGetAddressRange. */
	void *base = NULL;
	size = 0;
	CHECK_OK(uvmMemGetAddressRange(&base, &size, m + MiB));
	CHECK(base == m && size == 3 * MiB + 5);
	CHECK_OK(uvmMemGetAddressRange(&base, NULL, d + 100));
	CHECK(base == d);
	CHECK_OK(uvmMemGetAddressRange(NULL, &size, reg + 100));
	CHECK(size == reg_len);
	CHECK_ERR(uvmMemGetAddressRange(&base, &size, &local), uvmErrorInvalidValue);
	CHECK_ERR(uvmMemGetAddressRange(&base, &size, NULL), uvmErrorInvalidValue);

	/* A new allocation at a freed one's address starts afresh. */
	CHECK_OK(uvmPointerSetAttribute(&one, uvmPointerAttributeSyncMemops, m));
	CHECK_OK(uvmFree(m));
	CHECK_ERR(uvmPointerGetAttribute(&v, uvmPointerAttributeSyncMemops, m), uvmErrorInvalidValue);
	unsigned char *m2;
	CHECK_OK(uvmMallocManaged((void **)&m2, 3 * MiB + 5, uvmMemAttachGlobal));
	CHECK_OK(uvmPointerGetAttribute(&v, uvmPointerAttributeSyncMemops, m2));
	CHECK(v == 0);
	CHECK_OK(uvmFree(m2));
	CHECK_OK(uvmHostUnregister(reg));
	munmap(reg, reg_len);
	CHECK_OK(uvmFreeHost(h));
	CHECK_OK(uvmFree(d));
}

/* ---- peer access ---- */

struct touch_params {
	volatile int *p;
};

static void touch(unsigned tid, unsigned nthreads, const void *params)
{
	(void)tid, (void)nthreads;
	const struct touch_params *t = params;
	*t->p += 1;
}

static void test_peer_access(void)
{
	int can = -1;
	CHECK_OK(uvmDeviceCanAccessPeer(&can, 0, 1));
	CHECK(can == 1);
	CHECK_OK(uvmDeviceCanAccessPeer(&can, 1, 0));
	CHECK(can == 1);
	CHECK_OK(uvmDeviceCanAccessPeer(&can, 1, 1));
	CHECK(can == 0);
	CHECK_ERR(uvmDeviceCanAccessPeer(NULL, 0, 1), uvmErrorInvalidValue);
	CHECK_ERR(uvmDeviceCanAccessPeer(&can, 0, 2), uvmErrorInvalidDevice);
	CHECK_ERR(uvmDeviceCanAccessPeer(&can, -1, 0), uvmErrorInvalidDevice);

	CHECK_ERR(uvmDeviceEnablePeerAccess(0, 0), uvmErrorInvalidDevice); /* the current device itself */
	CHECK_ERR(uvmDeviceEnablePeerAccess(2, 0), uvmErrorInvalidDevice);
	CHECK_ERR(uvmDeviceEnablePeerAccess(1, 1), uvmErrorInvalidValue);
	CHECK_ERR(uvmDeviceDisablePeerAccess(1), uvmErrorPeerAccessNotEnabled);
	CHECK_ERR(uvmDeviceDisablePeerAccess(-3), uvmErrorInvalidDevice);

	/* Device 1's memory: device 0's kernels reach it only while device
	 * 0's access to device 1 is enabled. (The access is changed while
	 * no device process is dying: the server, which maps the memory in
	 * the process, may not have noticed the death yet.) */
	int *d1;
	CHECK_OK(uvmSetDevice(1));
	CHECK_OK(uvmMalloc((void **)&d1, 4096));
	CHECK_OK(uvmMemset(d1, 0, 4096));
	CHECK_OK(uvmSetDevice(0));
	if (!d1)
		return;
	struct touch_params t = {.p = d1};
	CHECK_OK(uvmDeviceEnablePeerAccess(1, 0));
	CHECK_ERR(uvmDeviceEnablePeerAccess(1, 0), uvmErrorPeerAccessAlreadyEnabled);
	CHECK(strstr(uvmGetLastErrorMessage(), "enabled already") != NULL);
	CHECK_OK(uvmLaunchKernel(0, NULL, 1, touch, &t, sizeof t));
	CHECK_OK(uvmLaunchKernel(0, NULL, 1, touch, &t, sizeof t));
	CHECK_OK(uvmDeviceSynchronize());
	int back = 0;
	CHECK_OK(uvmMemcpy(&back, d1, sizeof back, uvmMemcpyDeviceToHost));
	CHECK(back == 2);
	/* One way: device 1 has no access to device 0's memory for it. */
	CHECK_OK(uvmSetDevice(1));
	CHECK_ERR(uvmDeviceDisablePeerAccess(0), uvmErrorPeerAccessNotEnabled);
	CHECK_OK(uvmSetDevice(0));

	/* Disabled again: the touch crashes the kernel (last: the device's
	 * process dies of it). */
	CHECK_OK(uvmDeviceDisablePeerAccess(1));
	CHECK_ERR(uvmDeviceDisablePeerAccess(1), uvmErrorPeerAccessNotEnabled);
	CHECK_OK(uvmLaunchKernel(0, NULL, 1, touch, &t, sizeof t));
	CHECK_ERR(uvmDeviceSynchronize(), uvmErrorLaunchFailure);
	CHECK(strstr(uvmGetLastErrorMessage(), "touch") != NULL);
	/* A synchronous copy on the failed device copies nothing. */
	back = 0;
	CHECK_ERR(uvmMemcpy(&back, d1, sizeof back, uvmMemcpyDeviceToHost), uvmErrorLaunchFailure);
	CHECK(back == 0);
	CHECK_OK(uvmDeviceReset());
	CHECK_OK(uvmMemcpy(&back, d1, sizeof back, uvmMemcpyDeviceToHost));
	CHECK(back == 2);
	CHECK_OK(uvmFree(d1));
}

int main(void)
{
	test_device_properties();
	test_mem_get_info();
	test_malloc_pitch();
	test_range_attributes();
	test_pointer_attributes();
	test_peer_access();
	return check_done("props_test");
}
