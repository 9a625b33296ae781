/* The launch coherence model's client side (docs/architecture.md, "The
 * launch coherence model"): the library tells the server when a kernel is
 * about to start, so that it hands the kernel's managed memory to the
 * device and refuses the CPU's touches, and when streams have finished,
 * so that the CPU may touch that memory again. Under the fault model both
 * hooks do nothing. */
#include "internal.h"

static uvmError_t coherence_request(struct uvm_msg *m, const char *what)
{
	uvmError_t err;
	struct uvm_session *s = uvm__session(&err);
	if (!s)
		return err;
	uint8_t reply[256];
	struct uvm_reader r;
	return uvm__request(s, m, NULL, 0, reply, sizeof reply, &r, NULL, 0, NULL, what);
}

bool uvm__launch_model(void)
{
	uvmError_t err;
	struct uvm_session *s = uvm__session(&err);
	return s && s->coherence == UVM_COHERENCE_LAUNCH;
}

uvmError_t uvm__coherence_before_launch(int device, uint32_t stream, const char *kernel)
{
	if (!uvm__launch_model())
		return uvmSuccess;
	uint8_t buf[512];
	struct uvm_msg m = {.buf = buf, .cap = sizeof buf};
	uvm__encode_launch_begin(&m, 0, device, stream, kernel);
	return coherence_request(&m, "launch: hand the kernel its managed memory");
}

uvmError_t uvm__coherence_after_sync(int device, uint32_t stream)
{
	if (!uvm__launch_model())
		return uvmSuccess;
	uint8_t buf[64];
	struct uvm_msg m = {.buf = buf, .cap = sizeof buf};
	uvm__encode_streams_idle(&m, 0, device, stream);
	return coherence_request(&m, "synchronize: give the CPU back its managed memory");
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
	uint8_t buf[64];
	struct uvm_msg m = {.buf = buf, .cap = sizeof buf};
	uvm__encode_stream_attach(&m, 0, a->addr, a->flags, a->device, a->id);
	return coherence_request(&m, "uvmStreamAttachMemAsync");
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
