/* The launch coherence model's client side (docs/architecture.md, "The
 * launch coherence model"): the library tells the server when a kernel is
 * about to start, so that it hands the kernel's managed memory to the
 * device and refuses the CPU's touches, when streams have finished, so
 * that the CPU may touch that memory again, and when an attachment takes
 * effect (uvmStreamAttachMemAsync, in memory.c, calls it in stream
 * order). Under the fault model the launch and synchronize hooks do
 * nothing. */
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

uvmError_t uvm__coherence_attach(uint64_t addr, unsigned flags, int device, uint32_t stream)
{
	uint8_t buf[64];
	struct uvm_msg m = {.buf = buf, .cap = sizeof buf};
	uvm__encode_stream_attach(&m, 0, addr, flags, device, stream);
	return coherence_request(&m, "uvmStreamAttachMemAsync");
}
