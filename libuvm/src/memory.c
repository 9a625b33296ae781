/*
 * memory.c: managed, device and pinned host memory; prefetch, advice,
 * attributes, copies. Each function checks its arguments here, with a
 * message naming the bad value, before the server sees anything; the
 * server checks again and its message is passed on.
 */
#include "internal.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#if defined(__x86_64__)
#include <emmintrin.h>

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23 /* Linux 5.14 */
#endif
#endif

#define KIND_BIT(k) (1u << (k))
#define REGISTERED_BIT (1u << 3)

/* session_or_fail returns the session, or NULL with the error in *err. */
static struct uvm_session *session_or_fail(uvmError_t *err) { return uvm__session(err); }

static int device_of_new_managed(struct uvm_session *s) { return s->ndevices > 0 ? uvm__current_device() : uvmCpuDeviceId; }

static uvmError_t check_size(const char *what, size_t size)
{
	if (size == 0)
		return uvm__fail(uvmErrorInvalidValue, "%s of 0 bytes: want at least 1 byte", what);
	if (size > UVM_MAX_ALLOCATION)
		return uvm__fail(uvmErrorInvalidValue, "%s of %zu bytes: the limit is %lu (64 TiB)", what, size, UVM_MAX_ALLOCATION);
	return uvmSuccess;
}

uvmError_t uvmMallocManaged(void **devPtr, size_t size, unsigned int flags)
{
	if (!devPtr)
		return uvm__fail(uvmErrorInvalidValue, "uvmMallocManaged: devPtr is NULL; want the address of a pointer to set");
	*devPtr = NULL;
	uvmError_t err = check_size("uvmMallocManaged", size);
	if (err)
		return err;
	if (flags != uvmMemAttachGlobal && flags != uvmMemAttachHost)
		return uvm__fail(uvmErrorInvalidValue, "uvmMallocManaged: flags %#x: want uvmMemAttachGlobal (%#x) or uvmMemAttachHost (%#x)", flags,
				 uvmMemAttachGlobal, uvmMemAttachHost);
	struct uvm_session *s = session_or_fail(&err);
	if (!s)
		return err;
	struct uvm_alloc a;
	if ((err = uvm__allocate(size, UVM_KIND_MANAGED, device_of_new_managed(s), flags, NULL, NULL, &a)))
		return err;
	*devPtr = (void *)a.addr;
	return uvmSuccess;
}

uvmError_t uvm__managed_alloc(void **p, size_t size)
{
	return uvmMallocManaged(p, size, uvmMemAttachGlobal);
}

uvmError_t uvmMalloc(void **devPtr, size_t size)
{
	if (!devPtr)
		return uvm__fail(uvmErrorInvalidValue, "uvmMalloc: devPtr is NULL; want the address of a pointer to set");
	*devPtr = NULL;
	uvmError_t err = check_size("uvmMalloc", size);
	if (err)
		return err;
	struct uvm_session *s = session_or_fail(&err);
	if (!s)
		return err;
	int d = uvm__current_device();
	if (d < 0 || d >= s->ndevices)
		return uvm__fail(uvmErrorInvalidDevice, "uvmMalloc on device %d: there are %d devices", d, s->ndevices);
	struct uvm_alloc a;
	if ((err = uvm__allocate(size, UVM_KIND_DEVICE, d, 0, NULL, NULL, &a)))
		return err;
	*devPtr = (void *)a.addr;
	return uvmSuccess;
}

uvmError_t uvmFree(void *devPtr)
{
	if (!devPtr)
		return uvmSuccess; /* as cudaFree(NULL) */
	uvmError_t err = uvm__refuse_in_host_fn("uvmFree");
	if (err)
		return err;
	uvm__streams_sync_all();
	struct uvm_alloc a;
	bool known = uvm__alloc_lookup((uintptr_t)devPtr, &a);
	err = uvm__release((uintptr_t)devPtr, KIND_BIT(UVM_KIND_MANAGED) | KIND_BIT(UVM_KIND_DEVICE), "uvmFree");
	if (!err)
		uvm__forget_pointer_attributes((uintptr_t)devPtr);
	if (!err && known)
		uvm__locations_forget(a.addr, a.length);
	return err;
}

uvmError_t uvmMallocPitch(void **devPtr, size_t *pitch, size_t width, size_t height)
{
	if (!devPtr || !pitch)
		return uvm__fail(uvmErrorInvalidValue, "uvmMallocPitch: %s is NULL; want the address of a %s to set", !devPtr ? "devPtr" : "pitch",
				 !devPtr ? "pointer" : "size_t");
	*devPtr = NULL;
	if (width == 0 || height == 0)
		return uvm__fail(uvmErrorInvalidValue, "uvmMallocPitch of %zu rows of %zu bytes: want at least one row of one byte", height, width);
	/* Rows start at multiples of 512 bytes (texturePitchAlignment). */
	if (width > SIZE_MAX - 511)
		return uvm__fail(uvmErrorInvalidValue, "uvmMallocPitch: width %zu is too large", width);
	size_t p = (width + 511) & ~(size_t)511;
	if (height > SIZE_MAX / p)
		return uvm__fail(uvmErrorInvalidValue, "uvmMallocPitch of %zu rows of %zu bytes: the size overflows", height, p);
	uvmError_t err = uvmMalloc(devPtr, p * height);
	if (err)
		return err;
	*pitch = p;
	return uvmSuccess;
}

/* pin_host fills a pinned allocation's host pages before the server
 * learns of it: pinned memory exists from the start, as cudaHostAlloc's.
 * Faulted in through the range's own mapping (MADV_NOHUGEPAGE), so that
 * they are 4 KiB pages of exactly the range: fallocate into a host file
 * of large folios would allocate the whole 2 MiB around it, and the pages
 * past the range would then be present without the server knowing. */
static uvmError_t pin_host(uintptr_t addr, size_t length, void *arg)
{
	struct uvm_session *s = arg;
	if (madvise((void *)addr, length, MADV_POPULATE_WRITE) == 0)
		return uvmSuccess;
	if (errno == EINVAL && fallocate(s->host_fd, 0, (off_t)addr, (off_t)length) == 0)
		return uvmSuccess; /* a kernel before 5.14, without MADV_POPULATE_WRITE */
	return uvm__fail(uvmErrorMemoryAllocation, "pin %zu bytes of host memory: %s", length, strerror(errno));
}

uvmError_t uvmHostAlloc(void **pHost, size_t size, unsigned int flags)
{
	const unsigned known = uvmHostAllocPortable | uvmHostAllocMapped | uvmHostAllocWriteCombined;
	if (!pHost)
		return uvm__fail(uvmErrorInvalidValue, "uvmHostAlloc: pHost is NULL; want the address of a pointer to set");
	*pHost = NULL;
	if (flags & ~known)
		return uvm__fail(uvmErrorInvalidValue,
				 "uvmHostAlloc: flags %#x: want a combination of uvmHostAllocPortable (%#x), uvmHostAllocMapped (%#x) and uvmHostAllocWriteCombined (%#x)",
				 flags, uvmHostAllocPortable, uvmHostAllocMapped, uvmHostAllocWriteCombined);
	uvmError_t err = check_size("uvmHostAlloc", size);
	if (err)
		return err;
	struct uvm_session *s = session_or_fail(&err);
	if (!s)
		return err;
	struct uvm_alloc a;
	if ((err = uvm__allocate(size, UVM_KIND_PINNED_HOST, uvmCpuDeviceId, flags, pin_host, s, &a)))
		return err;
	*pHost = (void *)a.addr;
	return uvmSuccess;
}

uvmError_t uvmMallocHost(void **ptr, size_t size) { return uvmHostAlloc(ptr, size, uvmHostAllocDefault); }

uvmError_t uvmFreeHost(void *ptr)
{
	struct uvm_alloc a;
	if (!ptr)
		return uvmSuccess;
	if (!uvm__in_window((uintptr_t)ptr) && uvm__alloc_lookup((uintptr_t)ptr, &a))
		return uvm__fail(uvmErrorInvalidValue, "uvmFreeHost %p: it is registered host memory; release it with uvmHostUnregister", ptr);
	uvmError_t err = uvm__refuse_in_host_fn("uvmFreeHost");
	if (err)
		return err;
	uvm__streams_sync_all();
	err = uvm__release((uintptr_t)ptr, KIND_BIT(UVM_KIND_PINNED_HOST), "uvmFreeHost");
	if (!err)
		uvm__forget_pointer_attributes((uintptr_t)ptr);
	return err;
}

uvmError_t uvmHostGetDevicePointer(void **pDevice, void *pHost, unsigned int flags)
{
	struct uvm_alloc a;
	if (!pDevice)
		return uvm__fail(uvmErrorInvalidValue, "uvmHostGetDevicePointer: pDevice is NULL; want the address of a pointer to set");
	*pDevice = NULL;
	if (flags != 0)
		return uvm__fail(uvmErrorInvalidValue, "uvmHostGetDevicePointer: flags %#x: want 0", flags);
	uintptr_t p = (uintptr_t)pHost;
	if (!pHost || !uvm__alloc_lookup(p, &a) || a.kind != UVM_KIND_PINNED_HOST)
		return uvm__fail(uvmErrorInvalidValue, "uvmHostGetDevicePointer %p: not memory from uvmHostAlloc or uvmHostRegister", pHost);
	*pDevice = (void *)(a.host_alias && !uvm__in_window(p) ? a.addr + (p - a.host_alias) : p);
	return uvmSuccess;
}

/* copy_in fills a registration's pinned allocation with the program's
 * bytes. */
static uvmError_t copy_in(uintptr_t addr, size_t length, void *arg)
{
	memcpy((void *)addr, arg, length);
	return uvmSuccess;
}

uvmError_t uvmHostRegister(void *ptr, size_t size, unsigned int flags)
{
	const unsigned known = uvmHostRegisterPortable | uvmHostRegisterMapped;
	uintptr_t p = (uintptr_t)ptr;
	if (!ptr)
		return uvm__fail(uvmErrorInvalidValue, "uvmHostRegister: ptr is NULL");
	if (flags & ~known)
		return uvm__fail(uvmErrorInvalidValue, "uvmHostRegister: flags %#x: want a combination of uvmHostRegisterPortable (%#x) and uvmHostRegisterMapped (%#x)",
				 flags, uvmHostRegisterPortable, uvmHostRegisterMapped);
	uvmError_t err = check_size("uvmHostRegister", size);
	if (err)
		return err;
	if (p % UVM_PAGE_SIZE || size % UVM_PAGE_SIZE)
		return uvm__fail(uvmErrorInvalidValue, "uvmHostRegister %p+%zu: address and size must be multiples of the page size (%lu)", ptr, size, UVM_PAGE_SIZE);
	if (p + size > UVM_WINDOW_START && p < UVM_WINDOW_START + UVM_WINDOW_SIZE)
		return uvm__fail(uvmErrorInvalidValue, "uvmHostRegister %p+%zu: the range is in the runtime's own window; it is already managed, pinned or device memory", ptr, size);
	if (msync(ptr, size, MS_ASYNC) < 0)
		return uvm__fail(uvmErrorInvalidValue, "uvmHostRegister %p+%zu: part of the range is not mapped memory", ptr, size);
	struct uvm_alloc other;
	if (uvm__alias_overlap(p, size, &other))
		return uvm__fail(uvmErrorInvalidValue, "uvmHostRegister %p+%zu: overlaps the registration at %p+%zu", ptr, size, (void *)other.host_alias, other.length);
	struct uvm_session *s = session_or_fail(&err);
	if (!s)
		return err;
	/* The contents go to a pinned allocation, and then the program's
	 * pages become an alias of it. Nothing may write the range meanwhile. */
	struct uvm_alloc a;
	if ((err = uvm__allocate(size, UVM_KIND_PINNED_HOST, uvmCpuDeviceId, flags, copy_in, ptr, &a)))
		return err;
	if (uvm__sys_mmap(ptr, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, s->host_fd, (off_t)a.addr) == MAP_FAILED) {
		int e = errno;
		uvm__release(a.addr, KIND_BIT(UVM_KIND_PINNED_HOST), "uvmHostRegister");
		return uvm__fail(uvmErrorMemoryAllocation, "uvmHostRegister %p+%zu: map the pinned pages: %s", ptr, size, strerror(e));
	}
	/* Location files may take large folios: no mapping of one may let
	 * khugepaged collapse it, which would fill holes with zeros that read
	 * as data (docs/architecture.md, "Large folios"). */
	madvise(ptr, size, MADV_NOHUGEPAGE);
	uvm__alloc_set_alias(a.addr, p);
	return uvmSuccess;
}

uvmError_t uvmHostUnregister(void *ptr)
{
	struct uvm_alloc a;
	uintptr_t p = (uintptr_t)ptr;
	if (!ptr)
		return uvm__fail(uvmErrorInvalidValue, "uvmHostUnregister: ptr is NULL");
	if (uvm__in_window(p) || !uvm__alloc_lookup(p, &a) || a.host_alias != p)
		return uvm__fail(uvmErrorInvalidValue, "uvmHostUnregister %p: not the start of registered host memory", ptr);
	uvmError_t err = uvm__refuse_in_host_fn("uvmHostUnregister");
	if (err)
		return err;
	uvm__streams_sync_all();
	/* The program gets ordinary memory back with the same contents: a
	 * private copy moved over the alias in one step. */
	void *copy = uvm__sys_mmap(NULL, a.length, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (copy == MAP_FAILED)
		return uvm__fail(uvmErrorMemoryAllocation, "uvmHostUnregister %p: %s", ptr, strerror(errno));
	memcpy(copy, ptr, a.length);
	if (uvm__sys_mremap(copy, a.length, a.length, MREMAP_MAYMOVE | MREMAP_FIXED, ptr) == MAP_FAILED) {
		int e = errno;
		uvm__sys_munmap(copy, a.length);
		return uvm__fail(uvmErrorUnknown, "uvmHostUnregister %p: move the copy back: %s", ptr, strerror(e));
	}
	err = uvm__release(a.addr, KIND_BIT(UVM_KIND_PINNED_HOST) | REGISTERED_BIT, "uvmHostUnregister");
	if (!err)
		uvm__forget_pointer_attributes(a.addr);
	return err;
}

static uvmError_t check_processor(struct uvm_session *s, const char *what, int d)
{
	if (d == uvmCpuDeviceId || (d >= 0 && d < s->ndevices))
		return uvmSuccess;
	if (s->ndevices == 0)
		return uvm__fail(uvmErrorInvalidDevice, "%s device %d: there are no devices; want uvmCpuDeviceId (-1)", what, d);
	return uvm__fail(uvmErrorInvalidDevice, "%s device %d: want uvmCpuDeviceId (-1) or a device from 0 to %d", what, d, s->ndevices - 1);
}

struct prefetch_args {
	uint64_t start, length;
	int dst;
};

static uvmError_t run_prefetch(void *arg)
{
	const struct prefetch_args *a = arg;
	uvmError_t err = uvm__prefetch_now(a->start, a->length, a->dst, "uvmMemPrefetchAsync");
	if (!err)
		uvm__locations_prefetched(a->start, a->length, -1); /* no host node: location.c */
	return err;
}

uvmError_t uvmMemPrefetchAsync(const void *devPtr, size_t count, int dstDevice, uvmStream_t stream)
{
	uvmError_t err;
	struct uvm_session *s = session_or_fail(&err);
	if (!s)
		return err;
	struct prefetch_args a = {.dst = dstDevice};
	if ((err = uvm__managed_range("uvmMemPrefetchAsync", devPtr, count, &a.start, &a.length)))
		return err;
	if ((err = check_processor(s, "uvmMemPrefetchAsync to", dstDevice)))
		return err;
	if ((err = uvm__refuse_prefetch("uvmMemPrefetchAsync", dstDevice)))
		return err;
	/* In stream order: after the work queued before it, kernels
	 * included. */
	return uvm__stream_enqueue_host(stream, "uvmMemPrefetchAsync", run_prefetch, &a, sizeof a);
}

/* discard_inside narrows [start, start+length), page-rounded outward by
 * uvm__page_range, to the whole pages inside [ptr, ptr+count): a page the
 * range shares with bytes outside it keeps its contents. It says whether
 * any page is left. */
static bool discard_inside(const void *ptr, size_t count, uint64_t *start, uint64_t *length)
{
	uint64_t p = (uintptr_t)ptr, lo = (p + UVM_PAGE_SIZE - 1) & ~(uint64_t)(UVM_PAGE_SIZE - 1), hi = (p + count) & ~(uint64_t)(UVM_PAGE_SIZE - 1);
	if (hi <= lo)
		return false;
	*start = lo;
	*length = hi - lo;
	return true;
}

struct discard_args {
	uint64_t start, length;
};

static uvmError_t run_discard(void *arg)
{
	const struct discard_args *a = arg;
	return uvm__discard(a->start, a->length, "uvmMemDiscard");
}

UVM_HIDDEN uvmError_t uvm__discard(uint64_t start, uint64_t length, const char *what)
{
	uvmError_t err;
	struct uvm_session *s = session_or_fail(&err);
	if (!s)
		return err;
	uint8_t buf[64], reply[64];
	struct uvm_msg m = {.buf = buf, .cap = sizeof buf};
	uvm__encode_discard(&m, 0, start, length);
	struct uvm_reader r;
	return uvm__request(s, &m, NULL, 0, reply, sizeof reply, &r, NULL, 0, NULL, what);
}

uvmError_t uvmMemDiscard(const void *devPtr, size_t count)
{
	struct discard_args a;
	uvmError_t err = uvm__managed_range("uvmMemDiscard", devPtr, count, &a.start, &a.length);
	if (err)
		return err;
	if (!discard_inside(devPtr, count, &a.start, &a.length))
		return uvmSuccess; /* no whole page inside */
	return run_discard(&a);
}

uvmError_t uvmMemDiscardAsync(const void *devPtr, size_t count, uvmStream_t stream)
{
	struct discard_args a;
	uvmError_t err = uvm__managed_range("uvmMemDiscardAsync", devPtr, count, &a.start, &a.length);
	if (err)
		return err;
	if (!discard_inside(devPtr, count, &a.start, &a.length))
		return uvmSuccess;
	/* In stream order: kernels queued before it finish writing first. */
	return uvm__stream_enqueue_host(stream, "uvmMemDiscardAsync", run_discard, &a, sizeof a);
}

/* An attachment queued on a stream. */
struct attach_args {
	uint64_t addr;
	unsigned flags;
	int device;
	uint32_t id;
};

static uvmError_t run_attach(void *arg)
{
	const struct attach_args *a = arg;
	return uvm__coherence_attach(a->addr, a->flags, a->device, a->id);
}

uvmError_t uvmStreamAttachMemAsync(uvmStream_t stream, void *devPtr, size_t length, unsigned int flags)
{
	const char *what = "uvmStreamAttachMemAsync";
	uintptr_t p = (uintptr_t)devPtr;
	struct uvm_alloc alloc;
	if (!devPtr || !uvm__alloc_lookup(p, &alloc) || alloc.kind != UVM_KIND_MANAGED)
		return uvm__fail(uvmErrorInvalidValue, "%s: %p is not managed memory (want a pointer uvmMallocManaged returned)", what, devPtr);
	if (p != alloc.addr)
		return uvm__fail(uvmErrorInvalidValue, "%s: %p is inside the allocation at %p, which is attached whole: pass its start", what, devPtr,
				 (void *)alloc.addr);
	if (length != 0 && length != alloc.size)
		return uvm__fail(uvmErrorInvalidValue, "%s: length %zu: want 0 or the allocation's size, %zu", what, length, alloc.size);
	switch (flags) {
	case uvmMemAttachGlobal:
	case uvmMemAttachHost:
		break;
	case uvmMemAttachSingle:
		if (!stream || stream == uvmStreamLegacy)
			return uvm__fail(uvmErrorInvalidValue, "%s: uvmMemAttachSingle with the legacy default stream: want a stream uvmStreamCreate made", what);
		break;
	default:
		return uvm__fail(uvmErrorInvalidValue, "%s: flags %#x: want uvmMemAttachGlobal (%#x), uvmMemAttachHost (%#x) or uvmMemAttachSingle (%#x)", what,
				 flags, uvmMemAttachGlobal, uvmMemAttachHost, uvmMemAttachSingle);
	}
	struct attach_args args = {.addr = alloc.addr, .flags = flags, .device = -1, .id = 0};
	if (stream) {
		uvmError_t err = uvm__stream_ids(stream, what, &args.device, &args.id);
		if (err)
			return err;
	}
	/* In stream order: it takes effect once the work queued on the
	 * stream before it has finished, as CUDA's. */
	return uvm__stream_order_host(stream, what, run_attach, &args, sizeof args);
}

uvmError_t uvmMemAdvise(const void *devPtr, size_t count, uvmMemoryAdvise advice, int device)
{
	if (advice < uvmMemAdviseSetReadMostly || advice > uvmMemAdviseUnsetAccessedBy)
		return uvm__fail(uvmErrorInvalidValue, "uvmMemAdvise: advice %d: want one of uvmMemAdviseSetReadMostly (1) to uvmMemAdviseUnsetAccessedBy (6)", (int)advice);
	uvmError_t err;
	struct uvm_session *s = session_or_fail(&err);
	if (!s)
		return err;
	bool uses_device = advice != uvmMemAdviseSetReadMostly && advice != uvmMemAdviseUnsetReadMostly;
	if (uses_device && (err = check_processor(s, "uvmMemAdvise for", device)))
		return err;
	if (!uses_device)
		device = uvmCpuDeviceId; /* ignored, as cudaMemAdvise ignores it */
	if ((err = uvm__refuse_advice("uvmMemAdvise", advice, device)))
		return err;
	uint64_t start, length;
	if ((err = uvm__managed_range("uvmMemAdvise", devPtr, count, &start, &length)) ||
	    (err = uvm__advise_now(start, length, advice, device, "uvmMemAdvise")))
		return err;
	return uvm__locations_advised(start, length, advice, -1, "uvmMemAdvise of"); /* no host node: location.c */
}

/* The attributes of a range, as the server answers them, and the
 * locations' types and ids (location.c adds the host's NUMA nodes). */
struct range_attrs {
	int read_mostly, preferred, last_prefetch;
	uint32_t naccessed;
	int accessed[UVM_MAX_DEVICES + 1];
	int preferred_type, preferred_id, last_prefetch_type, last_prefetch_id;
};

static uvmError_t check_range_attr(const char *what, void *data, size_t dataSize, uvmMemRangeAttribute attribute)
{
	if (!data)
		return uvm__fail(uvmErrorInvalidValue, "%s: data is NULL", what);
	if (attribute < uvmMemRangeAttributeReadMostly || attribute > uvmMemRangeAttributeLastPrefetchLocationId)
		return uvm__fail(uvmErrorInvalidValue, "%s: attribute %d: want 1 (read-mostly) to 8 (last prefetch location id)", what, (int)attribute);
	if (attribute == uvmMemRangeAttributeAccessedBy ? (dataSize == 0 || dataSize % 4) : dataSize != 4)
		return uvm__fail(uvmErrorInvalidValue, "%s: dataSize %zu: want %s", what, dataSize,
				 attribute == uvmMemRangeAttributeAccessedBy ? "a nonzero multiple of 4 (an int per device)" : "4 (one int)");
	return uvmSuccess;
}

static uvmError_t fetch_range_attrs(const char *what, const void *devPtr, size_t count, struct range_attrs *ra)
{
	uvmError_t err;
	struct uvm_session *s = session_or_fail(&err);
	if (!s)
		return err;
	struct uvm_alloc a;
	uint64_t start, length;
	if ((err = uvm__page_range(what, devPtr, count, &a, &start, &length)))
		return err;
	uint8_t buf[64], reply[512];
	struct uvm_msg m = {.buf = buf, .cap = sizeof buf};
	uvm__encode_range_attrs(&m, 0, start, length);
	struct uvm_reader r;
	if ((err = uvm__request(s, &m, NULL, 0, reply, sizeof reply, &r, NULL, 0, NULL, what)))
		return err;
	ra->read_mostly = uvm__get_u8(&r);
	ra->preferred = uvm__get_i32(&r);
	ra->last_prefetch = uvm__get_i32(&r);
	uint32_t n = uvm__get_u32(&r);
	ra->naccessed = 0;
	for (uint32_t i = 0; i < n && !r.err; i++) {
		int d = uvm__get_i32(&r);
		if (ra->naccessed < sizeof ra->accessed / sizeof ra->accessed[0])
			ra->accessed[ra->naccessed++] = d;
	}
	if (r.err)
		return uvm__fail(uvmErrorUnknown, "%s: the server's reply is truncated", what);
	uvm__location_of(false, ra->preferred, start, length, &ra->preferred_type, &ra->preferred_id);
	uvm__location_of(true, ra->last_prefetch, start, length, &ra->last_prefetch_type, &ra->last_prefetch_id);
	return uvmSuccess;
}

static void put_range_attr(void *data, size_t dataSize, uvmMemRangeAttribute attribute, const struct range_attrs *ra)
{
	int *out = data;
	switch (attribute) {
	case uvmMemRangeAttributeReadMostly:
		*out = ra->read_mostly;
		break;
	case uvmMemRangeAttributePreferredLocation:
		*out = ra->preferred;
		break;
	case uvmMemRangeAttributeLastPrefetchLocation:
		*out = ra->last_prefetch;
		break;
	case uvmMemRangeAttributePreferredLocationType:
		*out = ra->preferred_type;
		break;
	case uvmMemRangeAttributePreferredLocationId:
		*out = ra->preferred_id;
		break;
	case uvmMemRangeAttributeLastPrefetchLocationType:
		*out = ra->last_prefetch_type;
		break;
	case uvmMemRangeAttributeLastPrefetchLocationId:
		*out = ra->last_prefetch_id;
		break;
	case uvmMemRangeAttributeAccessedBy:
		/* As CUDA: the devices, then uvmInvalidDeviceId to the end. */
		for (size_t i = 0; i < dataSize / 4; i++)
			out[i] = i < ra->naccessed ? ra->accessed[i] : uvmInvalidDeviceId;
		break;
	}
}

uvmError_t uvmMemRangeGetAttribute(void *data, size_t dataSize, uvmMemRangeAttribute attribute, const void *devPtr, size_t count)
{
	uvmError_t err = check_range_attr("uvmMemRangeGetAttribute", data, dataSize, attribute);
	if (err)
		return err;
	struct range_attrs ra;
	if ((err = fetch_range_attrs("uvmMemRangeGetAttribute", devPtr, count, &ra)))
		return err;
	put_range_attr(data, dataSize, attribute, &ra);
	return uvmSuccess;
}

uvmError_t uvmMemRangeGetAttributes(void **data, size_t *dataSizes, uvmMemRangeAttribute *attrs, size_t numAttributes, const void *devPtr,
				    size_t count)
{
	if (!data || !dataSizes || !attrs)
		return uvm__fail(uvmErrorInvalidValue, "uvmMemRangeGetAttributes: %s is NULL", !data ? "data" : !dataSizes ? "dataSizes" : "attrs");
	if (numAttributes == 0)
		return uvm__fail(uvmErrorInvalidValue, "uvmMemRangeGetAttributes: numAttributes is 0; want at least one attribute");
	for (size_t i = 0; i < numAttributes; i++) {
		char what[64];
		snprintf(what, sizeof what, "uvmMemRangeGetAttributes: attribute %zu", i);
		uvmError_t err = check_range_attr(what, data[i], dataSizes[i], attrs[i]);
		if (err)
			return err;
	}
	/* One question to the server for all of them. */
	struct range_attrs ra;
	uvmError_t err = fetch_range_attrs("uvmMemRangeGetAttributes", devPtr, count, &ra);
	if (err)
		return err;
	for (size_t i = 0; i < numAttributes; i++)
		put_range_attr(data[i], dataSizes[i], attrs[i], &ra);
	return uvmSuccess;
}

uvmError_t uvmPointerGetAttributes(uvmPointerAttributes *attributes, const void *ptr)
{
	if (!attributes)
		return uvm__fail(uvmErrorInvalidValue, "uvmPointerGetAttributes: attributes is NULL");
	uintptr_t p = (uintptr_t)ptr;
	struct uvm_alloc a;
	/* As CUDA 11 and later: memory the runtime does not know is not an
	 * error, it is "unregistered". */
	*attributes = (uvmPointerAttributes){.type = uvmMemoryTypeUnregistered, .device = uvmInvalidDeviceId};
	if (!ptr || !uvm__alloc_lookup(p, &a) || a.forked)
		return uvmSuccess;
	bool alias = a.host_alias && !uvm__in_window(p);
	uintptr_t in_window = alias ? a.addr + (p - a.host_alias) : p;
	switch (a.kind) {
	case UVM_KIND_MANAGED:
		attributes->type = uvmMemoryTypeManaged;
		attributes->device = a.device;
		attributes->devicePointer = attributes->hostPointer = (void *)p;
		break;
	case UVM_KIND_PINNED_HOST:
		attributes->type = uvmMemoryTypeHost;
		attributes->device = uvmCpuDeviceId;
		attributes->devicePointer = (void *)in_window;
		attributes->hostPointer = (void *)(a.host_alias ? a.host_alias + (in_window - a.addr) : p);
		break;
	default:
		attributes->type = uvmMemoryTypeDevice;
		attributes->device = a.device;
		attributes->devicePointer = (void *)p;
		attributes->hostPointer = NULL;
	}
	return uvmSuccess;
}

/* ---- copies ----
 *
 * Copies run in this process, as the Go client's: ordinary, managed
 * and pinned memory are in its address space, and device memory is
 * reached through its allocation's shadow, a shared mapping of the
 * session's file of the device (msgDeviceFile), the pages that device
 * processes map at the device memory's addresses. The server gets one
 * note afterwards of which device memory was written. Its copy
 * calibration, which comes with the file, says from what size a copy is
 * shared among threads, and from what size stores into device memory
 * bypass the caches. */

/* Large copies are split in chunks of this size, which their threads take
 * in turn. */
#define COPY_CHUNK (1ul << 20)
/* The most threads a copy runs on, as the server's limit. */
#define MAX_COPY_PRODUCERS 1024

/* A side of a copy: memory of the library (kind, flags) or not. */
struct side {
	uintptr_t p;
	bool ours;
	int kind;
	unsigned flags;
	bool registered;
	struct uvm_alloc a; /* ours: the allocation */
};

static bool side_device(const struct side *s) { return s->ours && s->kind == UVM_KIND_DEVICE; }
static bool side_write_combined(const struct side *s) { return s->ours && s->kind == UVM_KIND_PINNED_HOST && (s->flags & uvmHostAllocWriteCombined); }

static const char *side_name(const struct side *s)
{
	if (!s->ours)
		return "ordinary host memory";
	if (s->registered)
		return "registered host memory";
	switch (s->kind) {
	case UVM_KIND_MANAGED:
		return "managed memory";
	case UVM_KIND_PINNED_HOST:
		return "pinned host memory";
	}
	return "device memory";
}

static uvmError_t side_of(const char *what, const char *which, const void *ptr, size_t n, struct side *out)
{
	uintptr_t p = (uintptr_t)ptr;
	struct uvm_alloc a;
	*out = (struct side){.p = p};
	if (!ptr)
		return uvm__fail(uvmErrorInvalidValue, "%s: the %s is NULL", what, which);
	if (uvm__alloc_lookup(p, &a) && !a.forked) {
		bool alias = a.host_alias && !uvm__in_window(p);
		uintptr_t base = alias ? a.host_alias : a.addr;
		size_t limit = alias ? a.length : a.size;
		if (n > base + limit - p)
			return uvm__fail(uvmErrorInvalidValue, "%s: the %s %p+%zu runs past the end of the allocation %p+%zu", what, which, ptr, n, (void *)base, limit);
		*out = (struct side){.p = p, .ours = true, .kind = a.kind, .flags = a.flags, .registered = a.host_alias != 0, .a = a};
		return uvmSuccess;
	}
	/* Ordinary memory: refuse what is not mapped rather than crash. */
	uintptr_t start = p & ~(UVM_PAGE_SIZE - 1);
	if (msync((void *)start, p + n - start, MS_ASYNC) < 0)
		return uvm__fail(uvmErrorInvalidValue, "%s: the %s %p+%zu is not mapped memory", what, which, ptr, n);
	return uvmSuccess;
}

/* copy_nt copies with non-temporal stores where it can, as writes into
 * write-combined memory, and large writes into device memory that the
 * host will not read back, should be made. */
static void copy_nt(void *dst, const void *src, size_t n)
{
#if defined(__x86_64__)
	uint8_t *d = dst;
	const uint8_t *s = src;
	size_t head = (16 - ((uintptr_t)d & 15)) & 15;
	if (head > n)
		head = n;
	memcpy(d, s, head);
	d += head, s += head, n -= head;
	for (; n >= 16; n -= 16, d += 16, s += 16)
		_mm_stream_si128((__m128i *)d, _mm_loadu_si128((const __m128i *)s));
	memcpy(d, s, n);
	_mm_sfence();
#else
	memcpy(dst, src, n);
#endif
}

/* fill_nt is memset with non-temporal stores, as copy_nt. */
static void fill_nt(void *dst, uint8_t value, size_t n)
{
#if defined(__x86_64__)
	uint8_t *d = dst;
	size_t head = (16 - ((uintptr_t)d & 15)) & 15;
	if (head > n)
		head = n;
	memset(d, value, head);
	d += head, n -= head;
	__m128i v = _mm_set1_epi8((char)value);
	for (; n >= 16; n -= 16, d += 16)
		_mm_stream_si128((__m128i *)d, v);
	memset(d, value, n);
	_mm_sfence();
#else
	memset(dst, value, n);
#endif
}

/* device_file returns in *out the session's file of device d and the copy
 * parameters that come with it, asking the server once. */
static uvmError_t device_file(struct uvm_session *s, int d, const char *what, struct uvm_device_file *out)
{
	if (d < 0 || d >= s->ndevices)
		return uvm__fail(uvmErrorInvalidDevice, "%s: device memory of device %d: there are %d devices", what, d, s->ndevices);
	struct uvm_device_file *f = &s->files[d];
	uvmError_t err = uvmSuccess;
	pthread_mutex_lock(&s->files_mu);
	if (f->fd < 0) {
		uint8_t qb[32], rb[64];
		struct uvm_msg m = {.buf = qb, .cap = sizeof qb};
		uvm__encode_processor(&m, UVM_MSG_DEVICE_FILE, 0, d);
		struct uvm_reader r;
		int fd = -1, nfds = 0;
		if ((err = uvm__request(s, &m, NULL, 0, rb, sizeof rb, &r, &fd, 1, &nfds, what)))
			goto out;
		uint64_t producers = uvm__get_u64(&r), nt = uvm__get_u64(&r), direct = uvm__get_u64(&r);
		if (r.err)
			err = uvm__fail(uvmErrorUnknown, "%s: the server's reply with device %d's file is truncated", what, d);
		else if (nfds != 1)
			err = uvm__fail(uvmErrorUnknown, "%s: device %d's file came with %d descriptors, want 1", what, d, nfds);
		else if (producers < 1 || producers > MAX_COPY_PRODUCERS)
			err = uvm__fail(uvmErrorUnknown, "%s: the server says to copy on %llu threads; want 1 to %d", what, (unsigned long long)producers,
					MAX_COPY_PRODUCERS);
		if (err) {
			if (nfds > 0)
				close(fd);
			goto out;
		}
		*f = (struct uvm_device_file){.fd = fd, .producers = (unsigned)producers, .non_temporal_above = nt, .direct_below = direct};
	}
	*out = *f;
out:
	pthread_mutex_unlock(&s->files_mu);
	return err;
}

/* reach returns in *out where this process reaches the side's bytes: the
 * memory itself, or for device memory its allocation's shadow, with the
 * device's file in *f. */
static uvmError_t reach(struct uvm_session *s, const struct side *sd, const char *what, struct uvm_device_file *f, uint8_t **out)
{
	*out = (uint8_t *)sd->p;
	if (!side_device(sd))
		return uvmSuccess;
	uvmError_t err = device_file(s, sd->a.device, what, f);
	if (err)
		return err;
	uint8_t *shadow = uvm__alloc_shadow(&sd->a, f->fd);
	if (!shadow)
		return uvm__fail(errno == ESTALE ? uvmErrorInvalidValue : uvmErrorMemoryAllocation, "%s: map device %d's memory %p+%zu: %s", what,
				 sd->a.device, (void *)sd->a.addr, sd->a.length, errno == ESTALE ? "it was freed meanwhile" : strerror(errno));
	*out = shadow + (sd->p - sd->a.addr);
	return uvmSuccess;
}

/* A copy (src set) or fill (src NULL: value) of n bytes, which its threads
 * take COPY_CHUNK by COPY_CHUNK. */
struct copy_job {
	uint8_t *dst;
	const uint8_t *src;
	size_t n;
	uint8_t value;
	bool nt;     /* non-temporal stores */
	size_t next; /* the next chunk to take, atomically */
};

static void copy_span(const struct copy_job *j, size_t off, size_t n)
{
	if (j->src && j->nt)
		copy_nt(j->dst + off, j->src + off, n);
	else if (j->src)
		memcpy(j->dst + off, j->src + off, n);
	else if (j->nt)
		fill_nt(j->dst + off, j->value, n);
	else
		memset(j->dst + off, j->value, n);
}

static void *copy_worker(void *arg)
{
	struct copy_job *j = arg;
	for (;;) {
		size_t off = __atomic_fetch_add(&j->next, 1, __ATOMIC_RELAXED) * COPY_CHUNK;
		if (off >= j->n)
			return NULL;
		copy_span(j, off, j->n - off < COPY_CHUNK ? j->n - off : COPY_CHUNK);
	}
}

/* run_copy runs j, on the calling thread alone under the file's
 * direct-path size, else on its producers: the calling thread and threads
 * started for this copy and joined before it returns. A copy that large
 * takes milliseconds, against tens of microseconds to start a thread,
 * and so no thread outlives a copy: none is left for a fork's child, the
 * program's exit or a new session to find. */
static void run_copy(struct copy_job *j, const struct uvm_device_file *f)
{
	size_t chunks = (j->n + COPY_CHUNK - 1) / COPY_CHUNK;
	size_t extra = f->producers - 1;
	if (j->n < f->direct_below || extra == 0 || chunks < 2) {
		copy_span(j, 0, j->n);
		return;
	}
	if (extra > chunks - 1)
		extra = chunks - 1;
	pthread_t t[extra];
	/* Signals are for the program's own threads to take. */
	sigset_t all, old;
	sigfillset(&all);
	pthread_sigmask(SIG_SETMASK, &all, &old);
	size_t started = 0;
	while (started < extra && pthread_create(&t[started], NULL, copy_worker, j) == 0)
		started++; /* fewer threads than asked for copy it all the same */
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	copy_worker(j);
	for (size_t i = 0; i < started; i++)
		pthread_join(t[i], NULL);
}

/* device_written tells the server that n bytes of device memory at dst
 * were written through a shadow, so that it records the pages as
 * populated (internal/wire/memcpy.go DeviceWritten). */
static uvmError_t device_written(struct uvm_session *s, uintptr_t dst, size_t n, const char *what)
{
	uint8_t buf[64], reply[16];
	struct uvm_msg m = {.buf = buf, .cap = sizeof buf};
	uvm__encode_device_written(&m, 0, dst, n);
	struct uvm_reader r;
	return uvm__request(s, &m, NULL, 0, reply, sizeof reply, &r, NULL, 0, NULL, what);
}

static uvmError_t check_kind(const char *what, uvmMemcpyKind kind, const struct side *d, const struct side *sr)
{
	static const char *const names[] = {"uvmMemcpyHostToHost", "uvmMemcpyHostToDevice", "uvmMemcpyDeviceToHost", "uvmMemcpyDeviceToDevice"};
	if (kind == uvmMemcpyDefault)
		return uvmSuccess;
	bool src_host = kind == uvmMemcpyHostToHost || kind == uvmMemcpyHostToDevice;
	bool dst_host = kind == uvmMemcpyHostToHost || kind == uvmMemcpyDeviceToHost;
	const struct side *bad = NULL;
	const char *which = NULL, *want = NULL;
	if (src_host && side_device(sr))
		bad = sr, which = "source", want = "reachable from the host";
	else if (!src_host && !sr->ours)
		bad = sr, which = "source", want = "reachable from a device";
	else if (dst_host && side_device(d))
		bad = d, which = "destination", want = "reachable from the host";
	else if (!dst_host && !d->ours)
		bad = d, which = "destination", want = "reachable from a device";
	if (!bad)
		return uvmSuccess;
	return uvm__fail(uvmErrorInvalidValue, "%s %s: the %s %p is %s, which is not %s; use uvmMemcpyDefault to let the pointers decide", what, names[kind], which,
			 (void *)bad->p, side_name(bad), want);
}

/* memcpy_check checks a copy's arguments (count > 0), as uvmMemcpy does
 * before copying. */
static uvmError_t memcpy_check(const char *what, void *dst, const void *src, size_t count, uvmMemcpyKind kind, struct side *d, struct side *sr)
{
	uvmError_t err;
	if ((err = side_of(what, "destination", dst, count, d)) || (err = side_of(what, "source", src, count, sr)))
		return err;
	if ((err = check_kind(what, kind, d, sr)))
		return err;
	if ((uintptr_t)dst < (uintptr_t)src + count && (uintptr_t)src < (uintptr_t)dst + count)
		return uvm__fail(uvmErrorInvalidValue, "%s %p <- %p of %zu bytes: the ranges overlap", what, dst, src, count);
	return uvmSuccess;
}

static uvmError_t check_memcpy_kind(const char *what, uvmMemcpyKind kind)
{
	if ((int)kind < uvmMemcpyHostToHost || kind > uvmMemcpyDefault)
		return uvm__fail(uvmErrorInvalidValue, "%s: kind %d: want uvmMemcpyHostToHost (0) to uvmMemcpyDefault (4)", what, (int)kind);
	return uvmSuccess;
}

/* copy_now copies as uvmMemcpy does, checked already (d, sr), without
 * waiting for any stream: the stream's worker runs the Async forms in
 * their turn. */
static uvmError_t copy_now(const char *what, void *dst, const void *src, size_t count, const struct side *d, const struct side *sr)
{
	if (!side_device(d) && !side_device(sr)) {
		if (side_write_combined(d))
			copy_nt(dst, src, count);
		else
			memcpy(dst, src, count);
		return uvmSuccess;
	}
	uvmError_t err;
	struct uvm_session *s = session_or_fail(&err);
	if (!s)
		return err;
	/* Either file's parameters will do: they are the machine's. */
	struct uvm_device_file fd = {.fd = -1}, fs = {.fd = -1};
	uint8_t *to, *from;
	if ((err = reach(s, d, what, &fd, &to)) || (err = reach(s, sr, what, &fs, &from)))
		return err;
	const struct uvm_device_file *f = side_device(d) ? &fd : &fs;
	bool nt = side_write_combined(d) || (side_device(d) && f->non_temporal_above && count >= f->non_temporal_above);
	struct copy_job j = {.dst = to, .src = from, .n = count, .nt = nt};
	run_copy(&j, f);
	return side_device(d) ? device_written(s, (uintptr_t)dst, count, what) : uvmSuccess;
}

/* other_device is the device of a side that is another device's device
 * memory than the current one's, -1 if none: a synchronous copy waits
 * for its legacy stream too. */
static int other_device(const struct side *a, const struct side *b)
{
	int cur = uvm__current_device();
	if (side_device(a) && a->a.device != cur)
		return a->a.device;
	if (b && side_device(b) && b->a.device != cur)
		return b->a.device;
	return -1;
}

/* memcpy_on is uvmMemcpy issued on stream (NULL: the legacy default
 * stream): after the work before it, as CUDA's synchronous copy. */
static uvmError_t memcpy_on(uvmStream_t stream, const char *what, void *dst, const void *src, size_t count, uvmMemcpyKind kind)
{
	uvmError_t err = check_memcpy_kind(what, kind);
	if (err)
		return err;
	if (count == 0)
		return uvmSuccess;
	struct side d, sr;
	if ((err = memcpy_check(what, dst, src, count, kind, &d, &sr)))
		return err;
	if ((err = uvm__stream_sync_before(stream, uvm__current_device(), other_device(&d, &sr), what)))
		return err;
	return copy_now(what, dst, src, count, &d, &sr);
}

uvmError_t uvmMemcpy(void *dst, const void *src, size_t count, uvmMemcpyKind kind)
{
	return memcpy_on(NULL, "uvmMemcpy", dst, src, count, kind);
}

uvmError_t uvmMemcpy_ptds(void *dst, const void *src, size_t count, uvmMemcpyKind kind)
{
	return memcpy_on(uvmStreamPerThread, "uvmMemcpy", dst, src, count, kind);
}

/* A copy or fill queued on a stream: it runs as the synchronous call
 * would, on the stream's worker. */
struct copy_args {
	void *dst;
	const void *src;
	size_t count;
	uvmMemcpyKind kind;
	int value;
	const char *what;
};

static uvmError_t run_memcpy(void *arg)
{
	const struct copy_args *a = arg;
	struct side d, sr;
	uvmError_t err = memcpy_check(a->what, a->dst, a->src, a->count, a->kind, &d, &sr);
	return err ? err : copy_now(a->what, a->dst, a->src, a->count, &d, &sr);
}

static uvmError_t fill_now(const char *what, void *devPtr, int value, size_t count, const struct side *d);

static uvmError_t run_memset(void *arg)
{
	const struct copy_args *a = arg;
	struct side d;
	uvmError_t err = side_of(a->what, "destination", a->dst, a->count, &d);
	return err ? err : fill_now(a->what, a->dst, a->value, a->count, &d);
}

uvmError_t uvmMemcpyAsync(void *dst, const void *src, size_t count, uvmMemcpyKind kind, uvmStream_t stream)
{
	uvmError_t err = check_memcpy_kind("uvmMemcpyAsync", kind);
	if (err)
		return err;
	int device;
	if (stream && (err = uvm__stream_device(stream, "uvmMemcpyAsync on", &device)))
		return err;
	if (count == 0)
		return uvmSuccess;
	struct side d, sr;
	if ((err = memcpy_check("uvmMemcpyAsync", dst, src, count, kind, &d, &sr)))
		return err;
	struct copy_args a = {.dst = dst, .src = src, .count = count, .kind = kind, .what = "uvmMemcpyAsync"};
	return uvm__stream_enqueue_host(stream, "uvmMemcpyAsync", run_memcpy, &a, sizeof a);
}

static uvmError_t fill_now(const char *what, void *devPtr, int value, size_t count, const struct side *d)
{
	if (!side_device(d)) {
		if (side_write_combined(d))
			fill_nt(devPtr, (uint8_t)value, count);
		else
			memset(devPtr, value, count);
		return uvmSuccess;
	}
	uvmError_t err;
	struct uvm_session *s = session_or_fail(&err);
	if (!s)
		return err;
	struct uvm_device_file f;
	uint8_t *to;
	if ((err = reach(s, d, what, &f, &to)))
		return err;
	struct copy_job j = {.dst = to, .n = count, .value = (uint8_t)value, .nt = f.non_temporal_above && count >= f.non_temporal_above};
	run_copy(&j, &f);
	return device_written(s, (uintptr_t)devPtr, count, what);
}

/* memset_on is uvmMemset issued on stream, as memcpy_on. */
static uvmError_t memset_on(uvmStream_t stream, void *devPtr, int value, size_t count)
{
	if (count == 0)
		return uvmSuccess;
	struct side d;
	uvmError_t err;
	if ((err = side_of("uvmMemset", "destination", devPtr, count, &d)))
		return err;
	if ((err = uvm__stream_sync_before(stream, uvm__current_device(), other_device(&d, NULL), "uvmMemset")))
		return err;
	return fill_now("uvmMemset", devPtr, value, count, &d);
}

uvmError_t uvmMemset(void *devPtr, int value, size_t count) { return memset_on(NULL, devPtr, value, count); }

uvmError_t uvmMemset_ptds(void *devPtr, int value, size_t count) { return memset_on(uvmStreamPerThread, devPtr, value, count); }

uvmError_t uvmMemsetAsync(void *devPtr, int value, size_t count, uvmStream_t stream)
{
	uvmError_t err;
	int device;
	if (stream && (err = uvm__stream_device(stream, "uvmMemsetAsync on", &device)))
		return err;
	if (count == 0)
		return uvmSuccess;
	struct side d;
	if ((err = side_of("uvmMemsetAsync", "destination", devPtr, count, &d)))
		return err;
	struct copy_args a = {.dst = devPtr, .count = count, .value = value, .what = "uvmMemsetAsync"};
	return uvm__stream_enqueue_host(stream, "uvmMemsetAsync", run_memset, &a, sizeof a);
}

uvmError_t uvm__copy_box(const char *what, void *dst, size_t dpitch, size_t dheight, const void *src, size_t spitch, size_t sheight, size_t width,
			 size_t height, size_t depth, int value, uvmMemcpyKind kind, bool synchronous, uvmStream_t stream)
{
	if (width == 0 || height == 0 || depth == 0)
		return uvmSuccess;
	/* The spans from the first row's first byte to the last row's last
	 * byte, which the box lies in: each must lie in one allocation (or in
	 * ordinary memory), and the two must not overlap. */
	size_t dspan = (depth - 1) * dpitch * dheight + (height - 1) * dpitch + width;
	size_t sspan = src ? (depth - 1) * spitch * sheight + (height - 1) * spitch + width : 0;
	struct side d, sr = {0};
	uvmError_t err;
	if ((err = side_of(what, "destination", dst, dspan, &d)))
		return err;
	if (src) {
		if ((err = side_of(what, "source", src, sspan, &sr)) || (err = check_kind(what, kind, &d, &sr)))
			return err;
		if ((uintptr_t)dst < (uintptr_t)src + sspan && (uintptr_t)src < (uintptr_t)dst + dspan)
			return uvm__fail(uvmErrorInvalidValue, "%s %p <- %p: the spans of %zu and %zu bytes overlap", what, dst, src, dspan, sspan);
	}
	/* The synchronous forms are issued on stream, as uvmMemcpy is: after
	 * the work before them. */
	if (synchronous && (err = uvm__stream_sync_before(stream, uvm__current_device(), other_device(&d, src ? &sr : NULL), what)))
		return err;
	uint8_t *to = dst;
	const uint8_t *from = src;
	struct uvm_session *s = NULL;
	struct uvm_device_file fd = {.fd = -1}, fs = {.fd = -1};
	if (side_device(&d) || (src && side_device(&sr))) {
		if (!(s = session_or_fail(&err)))
			return err;
		uint8_t *f8;
		if ((err = reach(s, &d, what, &fd, &to)))
			return err;
		if (src && (err = reach(s, &sr, what, &fs, &f8)))
			return err;
		if (src)
			from = f8;
	}
	bool nt = side_write_combined(&d);
	for (size_t z = 0; z < depth; z++)
		for (size_t y = 0; y < height; y++) {
			uint8_t *row = to + z * dpitch * dheight + y * dpitch;
			if (src && nt)
				copy_nt(row, from + z * spitch * sheight + y * spitch, width);
			else if (src)
				memcpy(row, from + z * spitch * sheight + y * spitch, width);
			else if (nt)
				fill_nt(row, (uint8_t)value, width);
			else
				memset(row, value, width);
		}
	return side_device(&d) ? device_written(s, (uintptr_t)dst, dspan, what) : uvmSuccess;
}

/* peer_check checks a peer copy's devices and pointers: each pointer is
 * memory a device reaches (device memory of the device named for it, or
 * managed or pinned host memory, which every device reaches). */
static uvmError_t peer_check(const char *what, void *dst, int dstDevice, const void *src, int srcDevice, size_t count)
{
	uvmError_t err;
	char w[96];
	snprintf(w, sizeof w, "%s: the destination on", what);
	if ((err = uvm__check_device(dstDevice, w, NULL)))
		return err;
	snprintf(w, sizeof w, "%s: the source on", what);
	if ((err = uvm__check_device(srcDevice, w, NULL)))
		return err;
	if (count == 0)
		return uvmSuccess;
	struct side d, sr;
	if ((err = memcpy_check(what, dst, src, count, uvmMemcpyDefault, &d, &sr)))
		return err;
	const struct side *sides[2] = {&d, &sr};
	const int devs[2] = {dstDevice, srcDevice};
	static const char *const which[2] = {"destination", "source"};
	for (int i = 0; i < 2; i++) {
		if (!sides[i]->ours)
			return uvm__fail(uvmErrorInvalidValue, "%s: the %s %p is ordinary host memory, which no device reaches; want device, managed or pinned memory",
					 what, which[i], (void *)sides[i]->p);
		if (side_device(sides[i]) && sides[i]->a.device != devs[i])
			return uvm__fail(uvmErrorInvalidValue, "%s: the %s %p is device memory of device %d, not of device %d", what, which[i],
					 (void *)sides[i]->p, sides[i]->a.device, devs[i]);
	}
	return uvmSuccess;
}

/* memcpy_peer_on is uvmMemcpyPeer issued on stream (of srcDevice; NULL:
 * the legacy stream), and on dstDevice's legacy stream, as
 * cudaMemcpyPeer: after the work before it on both. */
static uvmError_t memcpy_peer_on(uvmStream_t stream, void *dst, int dstDevice, const void *src, int srcDevice, size_t count)
{
	uvmError_t err = peer_check("uvmMemcpyPeer", dst, dstDevice, src, srcDevice, count);
	if (err || count == 0)
		return err;
	struct side d, sr;
	if ((err = memcpy_check("uvmMemcpyPeer", dst, src, count, uvmMemcpyDefault, &d, &sr)))
		return err;
	if ((err = uvm__stream_sync_before(stream, srcDevice, dstDevice, "uvmMemcpyPeer")))
		return err;
	return copy_now("uvmMemcpyPeer", dst, src, count, &d, &sr);
}

uvmError_t uvmMemcpyPeer(void *dst, int dstDevice, const void *src, int srcDevice, size_t count)
{
	return memcpy_peer_on(NULL, dst, dstDevice, src, srcDevice, count);
}

uvmError_t uvmMemcpyPeer_ptds(void *dst, int dstDevice, const void *src, int srcDevice, size_t count)
{
	return memcpy_peer_on(uvmStreamPerThread, dst, dstDevice, src, srcDevice, count);
}

uvmError_t uvmMemcpyPeerAsync(void *dst, int dstDevice, const void *src, int srcDevice, size_t count, uvmStream_t stream)
{
	int device;
	uvmError_t err;
	if (stream && (err = uvm__stream_device(stream, "uvmMemcpyPeerAsync on", &device)))
		return err;
	if ((err = peer_check("uvmMemcpyPeerAsync", dst, dstDevice, src, srcDevice, count)) || count == 0)
		return err;
	struct copy_args a = {.dst = dst, .src = src, .count = count, .kind = uvmMemcpyDefault, .what = "uvmMemcpyPeerAsync"};
	return uvm__stream_enqueue_host(stream, "uvmMemcpyPeerAsync", run_memcpy, &a, sizeof a);
}
