/*
 * props.c: device attributes and properties, memory information, peer
 * access, and the attributes of a pointer: what a program asks about
 * devices and memory rather than does with them.
 */
#include "internal.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <unistd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

int uvm__concurrent_managed_access(void) { return !uvm__launch_model(); }

/* ---- device properties and attributes ---- */

_Static_assert(sizeof(uvmDeviceProp) == 560, "uvmDeviceProp changed size: new fields must come out of reserved");

/* read_small reads up to cap-1 bytes of a small kernel file (no stdio:
 * it allocates) into buf, NUL-terminated; false if it cannot. */
static bool read_small(const char *path, char *buf, size_t cap)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return false;
	size_t n = 0;
	for (;;) {
		ssize_t k = read(fd, buf + n, cap - 1 - n);
		if (k <= 0)
			break;
		n += (size_t)k;
		if (n == cap - 1)
			break;
	}
	close(fd);
	buf[n] = '\0';
	return n > 0;
}

/* What the properties say of the machine (uvm/machine.go reads the same
 * files): the first CPU's clock in kHz, its unified L2 cache, the first
 * NUMA node. Read once. */
static int clock_khz, l2_bytes, first_node = -1;
static pthread_once_t machine_once = PTHREAD_ONCE_INIT;

static void read_machine(void)
{
	char b[8192];
	if (read_small("/sys/devices/system/cpu/cpu0/cpufreq/cpuinfo_max_freq", b, sizeof b))
		clock_khz = atoi(b);
	else if (read_small("/proc/cpuinfo", b, sizeof b)) {
		for (char *line = b; line && !clock_khz; line = strchr(line, '\n') ? strchr(line, '\n') + 1 : NULL) {
			if (strncmp(line, "cpu MHz", 7) != 0)
				continue;
			char *colon = strchr(line, ':');
			if (colon)
				clock_khz = (int)(strtod(colon + 1, NULL) * 1000);
		}
	}
	for (int i = 0; i < 8; i++) {
		char path[96], level[16], type[32], size[32];
		snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu0/cache/index%d/level", i);
		if (!read_small(path, level, sizeof level))
			continue;
		snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu0/cache/index%d/type", i);
		read_small(path, type, sizeof type);
		snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu0/cache/index%d/size", i);
		if (atoi(level) != 2 || strncmp(type, "Unified", 7) != 0 || !read_small(path, size, sizeof size))
			continue;
		char *end;
		long v = strtol(size, &end, 10);
		l2_bytes = (int)(*end == 'K' ? v << 10 : *end == 'M' ? v << 20 : v);
		break;
	}
	if (read_small("/sys/devices/system/node/online", b, sizeof b) && b[0] >= '0' && b[0] <= '9')
		first_node = atoi(b);
}

/* fill_props describes device (checked) of session s. */
static void fill_props(uvmDeviceProp *prop, struct uvm_session *s, int device)
{
	pthread_once(&machine_once, read_machine);
	const struct uvm_device_info *info = &s->devices[device];
	memset(prop, 0, sizeof *prop);
	snprintf(prop->name, sizeof prop->name, "softuvm CPU device %d", device);
	prop->totalGlobalMem = info->capacity;
	prop->multiProcessorCount = info->workers;
	prop->canMapHostMemory = 1;
	prop->unifiedAddressing = 1;
	prop->managedMemory = 1;
	prop->concurrentManagedAccess = uvm__concurrent_managed_access();
	prop->pageableMemoryAccess = 0;
	prop->concurrentKernels = 1;
	prop->integrated = 1;
	prop->texturePitchAlignment = 512;
	prop->sharedMemPerBlock = UVM_MAX_SHARED_MEMORY_PER_BLOCK;
	prop->sharedMemPerBlockOptin = UVM_MAX_SHARED_MEMORY_PER_BLOCK;
	prop->sharedMemPerMultiprocessor = UVM_SHARED_MEMORY_PER_MULTIPROCESSOR;
	prop->totalConstMem = 64 << 10;
	prop->memPitch = INT_MAX;
	prop->major = UVM_COMPUTE_CAPABILITY_MAJOR;
	prop->minor = UVM_COMPUTE_CAPABILITY_MINOR;
	prop->clockRate = clock_khz;
	prop->computeMode = 0;
	prop->cooperativeLaunch = 1;
	prop->warpSize = UVM_WARP_SIZE;
	prop->maxThreadsPerBlock = UVM_MAX_THREADS_PER_BLOCK;
	prop->maxThreadsDim[0] = UVM_MAX_BLOCK_DIM_X;
	prop->maxThreadsDim[1] = UVM_MAX_BLOCK_DIM_Y;
	prop->maxThreadsDim[2] = UVM_MAX_BLOCK_DIM_Z;
	prop->maxGridSize[0] = (int)UVM_MAX_GRID_DIM_X;
	prop->maxGridSize[1] = UVM_MAX_GRID_DIM_Y;
	prop->maxGridSize[2] = UVM_MAX_GRID_DIM_Z;
	prop->maxThreadsPerMultiProcessor = UVM_MAX_THREADS_PER_MULTIPROCESSOR;
	prop->maxBlocksPerMultiProcessor = UVM_MAX_BLOCKS_PER_MULTIPROCESSOR;
	prop->regsPerBlock = prop->regsPerMultiprocessor = 65536;
	prop->l2CacheSize = l2_bytes;
	prop->asyncEngineCount = 2;
	prop->deviceOverlap = 1;
	prop->hostNativeAtomicSupported = 1;
	prop->singleToDoublePrecisionPerfRatio = 2;
	prop->computePreemptionSupported = 1;
	prop->globalL1CacheSupported = prop->localL1CacheSupported = 1;
	prop->hostRegisterSupported = 1;
	prop->numaNode = info->node;
	prop->hostNumaId = info->node >= 0 ? info->node : first_node;
}

uvmError_t uvmGetDeviceProperties(uvmDeviceProp *prop, int device)
{
	if (uvm__device_process >= 0)
		return uvm__refuse_in_device("uvmGetDeviceProperties");
	if (!prop)
		return uvm__fail(uvmErrorInvalidValue, "uvmGetDeviceProperties: prop is NULL; want a pointer to a uvmDeviceProp");
	struct uvm_session *s = NULL;
	uvmError_t err = uvm__check_device(device, "uvmGetDeviceProperties: properties of", &s);
	if (err)
		return err;
	fill_props(prop, s, device);
	return uvm__ok();
}

/* is_texture_attr: CUDA's texture and surface limits (TextureAlignment,
 * MaxTexture*, MaxSurface*, SurfaceAlignment). */
static bool is_texture_attr(int a) { return a == 14 || (a >= 21 && a <= 30) || (a >= 42 && a <= 74 && a != 50 && a != 51) || a == 77; }

uvmError_t uvmDeviceGetAttribute(int *value, uvmDeviceAttr attr, int device)
{
	if (uvm__device_process >= 0)
		return uvm__refuse_in_device("uvmDeviceGetAttribute");
	if (!value)
		return uvm__fail(uvmErrorInvalidValue, "uvmDeviceGetAttribute: value is NULL; want a pointer to an int");
	struct uvm_session *s = NULL;
	uvmError_t err = uvm__check_device(device, "uvmDeviceGetAttribute: attribute of", &s);
	if (err)
		return err;
	uvmDeviceProp p;
	fill_props(&p, s, device);
	int v;
	switch (attr) {
	case uvmDevAttrMaxThreadsPerBlock: v = p.maxThreadsPerBlock; break;
	case uvmDevAttrMaxBlockDimX: v = p.maxThreadsDim[0]; break;
	case uvmDevAttrMaxBlockDimY: v = p.maxThreadsDim[1]; break;
	case uvmDevAttrMaxBlockDimZ: v = p.maxThreadsDim[2]; break;
	case uvmDevAttrMaxGridDimX: v = p.maxGridSize[0]; break;
	case uvmDevAttrMaxGridDimY: v = p.maxGridSize[1]; break;
	case uvmDevAttrMaxGridDimZ: v = p.maxGridSize[2]; break;
	case uvmDevAttrMaxSharedMemoryPerBlock: v = (int)p.sharedMemPerBlock; break;
	case uvmDevAttrTotalConstantMemory: v = (int)p.totalConstMem; break;
	case uvmDevAttrWarpSize: v = p.warpSize; break;
	case uvmDevAttrMaxPitch: v = (int)p.memPitch; break;
	case uvmDevAttrMaxRegistersPerBlock: v = p.regsPerBlock; break;
	case uvmDevAttrClockRate: v = p.clockRate; break;
	case uvmDevAttrGpuOverlap: v = p.deviceOverlap; break;
	case uvmDevAttrMultiProcessorCount: v = p.multiProcessorCount; break;
	case uvmDevAttrKernelExecTimeout: v = p.kernelExecTimeoutEnabled; break;
	case uvmDevAttrIntegrated: v = p.integrated; break;
	case uvmDevAttrCanMapHostMemory: v = p.canMapHostMemory; break;
	case uvmDevAttrComputeMode: v = p.computeMode; break;
	case uvmDevAttrConcurrentKernels: v = p.concurrentKernels; break;
	case uvmDevAttrEccEnabled: v = p.ECCEnabled; break;
	case uvmDevAttrL2CacheSize: v = p.l2CacheSize; break;
	case uvmDevAttrMaxThreadsPerMultiProcessor: v = p.maxThreadsPerMultiProcessor; break;
	case uvmDevAttrAsyncEngineCount: v = p.asyncEngineCount; break;
	case uvmDevAttrUnifiedAddressing: v = p.unifiedAddressing; break;
	case uvmDevAttrTexturePitchAlignment: v = (int)p.texturePitchAlignment; break;
	case uvmDevAttrComputeCapabilityMajor: v = p.major; break;
	case uvmDevAttrComputeCapabilityMinor: v = p.minor; break;
	case uvmDevAttrStreamPrioritiesSupported: v = p.streamPrioritiesSupported; break;
	case uvmDevAttrGlobalL1CacheSupported: v = p.globalL1CacheSupported; break;
	case uvmDevAttrLocalL1CacheSupported: v = p.localL1CacheSupported; break;
	case uvmDevAttrMaxSharedMemoryPerMultiprocessor: v = (int)p.sharedMemPerMultiprocessor; break;
	case uvmDevAttrMaxRegistersPerMultiprocessor: v = p.regsPerMultiprocessor; break;
	case uvmDevAttrManagedMemory: v = p.managedMemory; break;
	case uvmDevAttrHostNativeAtomicSupported: v = p.hostNativeAtomicSupported; break;
	case uvmDevAttrSingleToDoublePrecisionPerfRatio: v = p.singleToDoublePrecisionPerfRatio; break;
	case uvmDevAttrPageableMemoryAccess: v = p.pageableMemoryAccess; break;
	case uvmDevAttrConcurrentManagedAccess: v = p.concurrentManagedAccess; break;
	case uvmDevAttrComputePreemptionSupported: v = p.computePreemptionSupported; break;
	case uvmDevAttrCanUseHostPointerForRegisteredMem: v = p.canUseHostPointerForRegisteredMem; break;
	case uvmDevAttrCooperativeLaunch: v = p.cooperativeLaunch; break;
	case uvmDevAttrCooperativeMultiDeviceLaunch: v = p.cooperativeMultiDeviceLaunch; break;
	case uvmDevAttrMaxSharedMemoryPerBlockOptin: v = (int)p.sharedMemPerBlockOptin; break;
	case uvmDevAttrHostRegisterSupported: v = p.hostRegisterSupported; break;
	case uvmDevAttrPageableMemoryAccessUsesHostPageTables: v = p.pageableMemoryAccessUsesHostPageTables; break;
	case uvmDevAttrDirectManagedMemAccessFromHost: v = p.directManagedMemAccessFromHost; break;
	case uvmDevAttrMaxBlocksPerMultiprocessor: v = p.maxBlocksPerMultiProcessor; break;
	case uvmDevAttrReservedSharedMemoryPerBlock: v = (int)p.reservedSharedMemPerBlock; break;
	case uvmDevAttrMemoryPoolsSupported: v = p.memoryPoolsSupported; break;
	case uvmDevAttrNumaConfig: v = p.numaNode >= 0; break;
	case uvmDevAttrNumaId: v = p.numaNode; break;
	case uvmDevAttrHostNumaId: v = p.hostNumaId; break;
	case uvmDevAttrArenaCapacityMiB: v = p.totalGlobalMem >> 20 > INT_MAX ? INT_MAX : (int)(p.totalGlobalMem >> 20); break;
	case uvmDevAttrPciBusId:
	case uvmDevAttrPciDeviceId:
	case uvmDevAttrPciDomainId:
	case uvmDevAttrTccDriver:
	case uvmDevAttrIsMultiGpuBoard:
	case uvmDevAttrMultiGpuBoardGroupID:
	case uvmDevAttrCanFlushRemoteWrites: v = 0; break;
	default:
		if (is_texture_attr((int)attr))
			return uvm__fail(uvmErrorNotSupported, "uvmDeviceGetAttribute: device attribute %d is a texture or surface limit: a CPU device emulates no textures",
					 (int)attr);
		return uvm__fail(uvmErrorInvalidValue,
				 "uvmDeviceGetAttribute: device attribute %d: not one of cudaDeviceAttr's with a meaning here (uvm.h's uvmDeviceAttr lists them)",
				 (int)attr);
	}
	*value = v;
	return uvm__ok();
}

/* ---- memory information ----
 *
 * The server's info document (a JSON object, the reply to msgInfo, as
 * `uvm info` prints it) lists each device's arena: {"device":N, ...,
 * "capacity_bytes":C, ..., "used_bytes":U, ...}. A small reader walks
 * it: nothing here may call malloc. */

struct json {
	const char *p, *end;
};

static void json_ws(struct json *j)
{
	while (j->p < j->end && (*j->p == ' ' || *j->p == '\t' || *j->p == '\n' || *j->p == '\r'))
		j->p++;
}

static bool json_peek(struct json *j, char c)
{
	json_ws(j);
	return j->p < j->end && *j->p == c;
}

/* json_string reads a string; *s and *n are its raw contents. */
static bool json_string(struct json *j, const char **s, size_t *n)
{
	if (!json_peek(j, '"'))
		return false;
	const char *start = ++j->p;
	while (j->p < j->end && *j->p != '"')
		j->p += *j->p == '\\' ? 2 : 1;
	if (j->p >= j->end)
		return false;
	*s = start;
	*n = (size_t)(j->p - start);
	j->p++;
	return true;
}

static bool json_number(struct json *j, long long *v)
{
	json_ws(j);
	char b[32];
	size_t n = 0;
	while (j->p < j->end && n < sizeof b - 1 && (*j->p == '-' || (*j->p >= '0' && *j->p <= '9')))
		b[n++] = *j->p++;
	b[n] = '\0';
	if (!n)
		return false;
	*v = strtoll(b, NULL, 10);
	return true;
}

static bool json_skip(struct json *j, int depth)
{
	const char *s;
	size_t n;
	json_ws(j);
	if (j->p >= j->end || depth > 64)
		return false;
	char c = *j->p;
	if (c == '"')
		return json_string(j, &s, &n);
	if (c != '{' && c != '[') { /* a number, true, false, null */
		while (j->p < j->end && *j->p != ',' && *j->p != '}' && *j->p != ']' && *j->p != ' ' && *j->p != '\n')
			j->p++;
		return true;
	}
	char close = c == '{' ? '}' : ']';
	j->p++;
	if (json_peek(j, close)) {
		j->p++;
		return true;
	}
	for (;;) {
		if (c == '{') {
			if (!json_string(j, &s, &n) || !json_peek(j, ':'))
				return false;
			j->p++;
		}
		if (!json_skip(j, depth + 1))
			return false;
		if (json_peek(j, ',')) {
			j->p++;
			continue;
		}
		if (json_peek(j, close)) {
			j->p++;
			return true;
		}
		return false;
	}
}

static bool key_is(const char *s, size_t n, const char *want) { return n == strlen(want) && memcmp(s, want, n) == 0; }

/* arena_of finds device d's arena in the info document. */
static bool arena_of(const char *doc, size_t len, int d, long long *capacity, long long *used)
{
	struct json j = {doc, doc + len};
	const char *s;
	size_t n;
	if (!json_peek(&j, '{'))
		return false;
	j.p++;
	while (json_string(&j, &s, &n) && json_peek(&j, ':')) {
		j.p++;
		if (!key_is(s, n, "devices")) {
			if (!json_skip(&j, 1))
				return false;
		} else {
			if (!json_peek(&j, '['))
				return false;
			j.p++;
			while (json_peek(&j, '{')) {
				j.p++;
				long long dev = -1, cap = -1, u = -1, v = 0;
				while (json_string(&j, &s, &n) && json_peek(&j, ':')) {
					j.p++;
					bool number = key_is(s, n, "device") || key_is(s, n, "capacity_bytes") || key_is(s, n, "used_bytes");
					if (number && !json_number(&j, &v))
						return false;
					if (!number && !json_skip(&j, 2))
						return false;
					if (key_is(s, n, "device"))
						dev = v;
					else if (key_is(s, n, "capacity_bytes"))
						cap = v;
					else if (key_is(s, n, "used_bytes"))
						u = v;
					if (json_peek(&j, ','))
						j.p++;
				}
				if (!json_peek(&j, '}'))
					return false;
				j.p++;
				if (dev == d && cap >= 0 && u >= 0) {
					*capacity = cap;
					*used = u;
					return true;
				}
				if (json_peek(&j, ','))
					j.p++;
			}
			return false;
		}
		if (json_peek(&j, ','))
			j.p++;
	}
	return false;
}

uvmError_t uvmMemGetInfo(size_t *free, size_t *total)
{
	if (uvm__device_process >= 0)
		return uvm__refuse_in_device("uvmMemGetInfo");
	if (!free || !total)
		return uvm__fail(uvmErrorInvalidValue, "uvmMemGetInfo: %s is NULL; want pointers to two size_t", !free ? "free" : "total");
	int dev = uvm__current_device();
	struct uvm_session *s = NULL;
	uvmError_t err = uvm__check_device(dev, "uvmMemGetInfo: memory of", &s);
	if (err)
		return err;
	uint8_t *reply = uvm__sys_mmap(NULL, UVM_MAX_MESSAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (reply == MAP_FAILED)
		return uvm__fail(uvmErrorMemoryAllocation, "uvmMemGetInfo: map a buffer for the server's answer: %s", strerror(errno));
	uint8_t q[UVM_WIRE_HEADER];
	struct uvm_msg m = {.buf = q, .cap = sizeof q};
	uvm__msg_start(&m, UVM_MSG_INFO, 0, 0);
	struct uvm_reader r;
	if (!(err = uvm__request(s, &m, NULL, 0, reply, UVM_MAX_MESSAGE, &r, NULL, 0, NULL, "uvmMemGetInfo: info"))) {
		uint32_t len = 0;
		const uint8_t *doc = uvm__get_bytes(&r, &len);
		long long cap = 0, used = 0;
		if (!doc || !arena_of((const char *)doc, len, dev, &cap, &used)) {
			err = uvm__fail(uvmErrorUnknown, "uvmMemGetInfo: the server's info names no arena of device %d", dev);
		} else {
			*total = (size_t)cap;
			*free = used < cap ? (size_t)(cap - used) : 0;
		}
	}
	uvm__sys_munmap(reply, UVM_MAX_MESSAGE);
	return err ? err : uvm__ok();
}

/* ---- peer access ----
 *
 * The server keeps the table (a device's process maps a peer's device
 * memory only while its access is enabled) and answers whether the access
 * was on before; the client keeps nothing, so that it agrees with the
 * server across restarts of device processes. */

void uvm__encode_peer_access(struct uvm_msg *m, uint32_t seq, int32_t device, int32_t peer, bool enable, uint32_t flags)
{
	uvm__msg_start(m, UVM_MSG_PEER_ACCESS, seq, 0);
	uvm__put_i32(m, device);
	uvm__put_i32(m, peer);
	uvm__put_u8(m, enable ? 1 : 0);
	uvm__put_u32(m, flags);
}

uvmError_t uvmDeviceCanAccessPeer(int *canAccessPeer, int device, int peerDevice)
{
	if (uvm__device_process >= 0)
		return uvm__refuse_in_device("uvmDeviceCanAccessPeer");
	if (!canAccessPeer)
		return uvm__fail(uvmErrorInvalidValue, "uvmDeviceCanAccessPeer: canAccessPeer is NULL; want a pointer to an int");
	uvmError_t err;
	if ((err = uvm__check_device(device, "uvmDeviceCanAccessPeer: access of", NULL)) ||
	    (err = uvm__check_device(peerDevice, "uvmDeviceCanAccessPeer: access to", NULL)))
		return err;
	/* Every device is a process of this host: each can map another's
	 * memory. A device needs no access to itself. */
	*canAccessPeer = device != peerDevice;
	return uvm__ok();
}

static uvmError_t peer_access(int peer, bool enable, unsigned flags)
{
	const char *fn = enable ? "uvmDeviceEnablePeerAccess" : "uvmDeviceDisablePeerAccess";
	if (uvm__device_process >= 0)
		return uvm__refuse_in_device(fn);
	int dev = uvm__current_device();
	char what[96];
	struct uvm_session *s = NULL;
	snprintf(what, sizeof what, "%s: access of", fn);
	uvmError_t err = uvm__check_device(dev, what, &s);
	if (err)
		return err;
	snprintf(what, sizeof what, "%s: access of device %d to", fn, dev);
	if ((err = uvm__check_device(peer, what, NULL)))
		return err;
	if (peer == dev)
		return uvm__fail(uvmErrorInvalidDevice, "%s: device %d is the current device, which always reaches its own memory; want another device", fn, peer);
	if (flags)
		return uvm__fail(uvmErrorInvalidValue, "%s to device %d: flags %#x: want 0", fn, peer, flags);
	uint8_t q[64], reply[16];
	struct uvm_msg m = {.buf = q, .cap = sizeof q};
	uvm__encode_peer_access(&m, 0, dev, peer, enable, flags);
	struct uvm_reader r;
	if ((err = uvm__request(s, &m, NULL, 0, reply, sizeof reply, &r, NULL, 0, NULL, fn)))
		return err;
	uint8_t was = uvm__get_u8(&r);
	if (r.err || r.n || was > 1)
		return uvm__fail(uvmErrorUnknown, "%s: the server's answer is malformed", fn);
	if (enable && was)
		return uvm__fail(uvmErrorPeerAccessAlreadyEnabled, "%s: device %d's access to device %d's memory is enabled already", fn, dev, peer);
	if (!enable && !was)
		return uvm__fail(uvmErrorPeerAccessNotEnabled, "%s: device %d's access to device %d's memory is not enabled", fn, dev, peer);
	return uvm__ok();
}

uvmError_t uvmDeviceEnablePeerAccess(int peerDevice, unsigned int flags) { return peer_access(peerDevice, true, flags); }

uvmError_t uvmDeviceDisablePeerAccess(int peerDevice) { return peer_access(peerDevice, false, 0); }

/* ---- pointer attributes ---- */

/* What uvmPointerSetAttribute recorded, per allocation: its address and
 * buffer id (an address is reused, a buffer id never). */
struct ptr_attr {
	uintptr_t addr;
	uint64_t buffer_id;
	unsigned sync_memops;
};

static pthread_mutex_t attrs_mu = PTHREAD_MUTEX_INITIALIZER;
static struct ptr_attr *attrs;
static size_t nattrs, attrs_cap;

static bool sync_memops_of(const struct uvm_alloc *a)
{
	bool v = false;
	pthread_mutex_lock(&attrs_mu);
	for (size_t i = 0; i < nattrs; i++)
		if (attrs[i].addr == a->addr && attrs[i].buffer_id == a->buffer_id)
			v = attrs[i].sync_memops;
	pthread_mutex_unlock(&attrs_mu);
	return v;
}

void uvm__forget_pointer_attributes(uintptr_t addr)
{
	pthread_mutex_lock(&attrs_mu);
	for (size_t i = 0; i < nattrs;)
		if (attrs[i].addr == addr)
			attrs[i] = attrs[--nattrs];
		else
			i++;
	pthread_mutex_unlock(&attrs_mu);
}

/* pointer_alloc finds the allocation holding ptr, and where in it ptr is
 * (its offset from the allocation's start, the program's alias for
 * registered memory). */
static uvmError_t pointer_alloc(const char *what, const void *ptr, struct uvm_alloc *a, uintptr_t *base, size_t *size)
{
	uintptr_t p = (uintptr_t)ptr;
	if (!ptr || !uvm__alloc_lookup(p, a) || a->forked)
		return uvm__fail(uvmErrorInvalidValue, "%s %p: not memory of the library (uvmMallocManaged, uvmMalloc, uvmHostAlloc, uvmHostRegister)", what,
				 ptr);
	bool alias = a->host_alias && !uvm__in_window(p);
	*base = alias ? a->host_alias : a->addr;
	*size = alias ? a->length : a->size;
	return uvmSuccess;
}

uvmError_t uvmPointerGetAttribute(void *data, uvmPointerAttribute attribute, const void *ptr)
{
	if (!data)
		return uvm__fail(uvmErrorInvalidValue, "uvmPointerGetAttribute: data is NULL");
	struct uvm_alloc a;
	uintptr_t base = 0;
	size_t size = 0;
	uvmError_t err = pointer_alloc("uvmPointerGetAttribute:", ptr, &a, &base, &size);
	if (err)
		return err;
	uintptr_t p = (uintptr_t)ptr, in_window = a.addr + (p - base);
	switch (attribute) {
	case uvmPointerAttributeDevicePointer:
		*(void **)data = (void *)in_window;
		return uvm__ok();
	case uvmPointerAttributeHostPointer:
		if (a.kind == UVM_KIND_DEVICE)
			return uvm__fail(uvmErrorInvalidValue, "uvmPointerGetAttribute %p: device memory has no host pointer", ptr);
		*(void **)data = (void *)(a.host_alias ? a.host_alias + (in_window - a.addr) : p);
		return uvm__ok();
	case uvmPointerAttributeSyncMemops:
		*(unsigned *)data = sync_memops_of(&a);
		return uvm__ok();
	case uvmPointerAttributeBufferId:
		*(unsigned long long *)data = a.buffer_id;
		return uvm__ok();
	case uvmPointerAttributeIsManaged:
		*(unsigned *)data = a.kind == UVM_KIND_MANAGED;
		return uvm__ok();
	case uvmPointerAttributeDeviceOrdinal:
		*(int *)data = a.kind == UVM_KIND_PINNED_HOST ? uvmCpuDeviceId : a.device;
		return uvm__ok();
	case uvmPointerAttributeRangeStartAddr:
		*(void **)data = (void *)base;
		return uvm__ok();
	case uvmPointerAttributeRangeSize:
		*(size_t *)data = size;
		return uvm__ok();
	case uvmPointerAttributeMapped:
		*(unsigned *)data = 1;
		return uvm__ok();
	}
	return uvm__fail(uvmErrorInvalidValue,
			 "uvmPointerGetAttribute: attribute %d: want DevicePointer (3), HostPointer (4), SyncMemops (6), BufferId (7), IsManaged (8), "
			 "DeviceOrdinal (9), RangeStartAddr (11), RangeSize (12) or Mapped (13)",
			 (int)attribute);
}

uvmError_t uvmPointerSetAttribute(const void *value, uvmPointerAttribute attribute, const void *ptr)
{
	if (attribute != uvmPointerAttributeSyncMemops)
		return uvm__fail(uvmErrorInvalidValue, "uvmPointerSetAttribute: attribute %d: only uvmPointerAttributeSyncMemops (%d) can be set", (int)attribute,
				 uvmPointerAttributeSyncMemops);
	if (!value)
		return uvm__fail(uvmErrorInvalidValue, "uvmPointerSetAttribute: value is NULL; want a pointer to an unsigned int, 0 or 1");
	unsigned v = *(const unsigned *)value;
	if (v > 1)
		return uvm__fail(uvmErrorInvalidValue, "uvmPointerSetAttribute: sync memops %u: want 0 or 1", v);
	struct uvm_alloc a;
	uintptr_t base = 0;
	size_t size = 0;
	uvmError_t err = pointer_alloc("uvmPointerSetAttribute:", ptr, &a, &base, &size);
	if (err)
		return err;
	pthread_mutex_lock(&attrs_mu);
	size_t i = 0;
	while (i < nattrs && !(attrs[i].addr == a.addr && attrs[i].buffer_id == a.buffer_id))
		i++;
	if (i == nattrs) {
		if (nattrs == attrs_cap) {
			size_t cap = attrs_cap ? 2 * attrs_cap : 16;
			struct ptr_attr *grown = uvm__sys_realloc(attrs, cap * sizeof *grown);
			if (!grown) {
				pthread_mutex_unlock(&attrs_mu);
				return uvm__fail(uvmErrorMemoryAllocation, "uvmPointerSetAttribute: no memory to record it");
			}
			attrs = grown;
			attrs_cap = cap;
		}
		attrs[nattrs++] = (struct ptr_attr){.addr = a.addr, .buffer_id = a.buffer_id};
	}
	attrs[i].sync_memops = v;
	pthread_mutex_unlock(&attrs_mu);
	return uvm__ok();
}

uvmError_t uvmMemGetAddressRange(void **base, size_t *size, void *ptr)
{
	struct uvm_alloc a;
	uintptr_t b = 0;
	size_t n = 0;
	uvmError_t err = pointer_alloc("uvmMemGetAddressRange:", ptr, &a, &b, &n);
	if (err)
		return err;
	if (base)
		*base = (void *)b;
	if (size)
		*size = n;
	return uvm__ok();
}
