/* wire.c: the binary protocol of internal/wire/protocol.go, the messages
 * libuvm sends, and datagrams with descriptors. Every field is little-endian; x86-64 and arm64 Linux are,
 * so fields are copied as they lie. */
#include "internal.h"

#include <errno.h>
#include <string.h>
#include <sys/socket.h>
#include <stdio.h>
#include <unistd.h>

static void put(struct uvm_msg *m, const void *p, size_t n)
{
	if (m->overflow || m->cap - m->len < n) {
		m->overflow = true;
		return;
	}
	memcpy(m->buf + m->len, p, n);
	m->len += n;
}

void uvm__msg_start(struct uvm_msg *m, uint16_t typ, uint32_t seq, uint32_t status)
{
	m->len = 0;
	m->overflow = false;
	uvm__put_u32(m, UVM_WIRE_MAGIC);
	uvm__put_u16(m, UVM_WIRE_VERSION);
	uvm__put_u16(m, typ);
	uvm__put_u32(m, seq);
	uvm__put_u32(m, status);
}

void uvm__put_u8(struct uvm_msg *m, uint8_t v) { put(m, &v, 1); }
void uvm__put_u16(struct uvm_msg *m, uint16_t v) { put(m, &v, 2); }
void uvm__put_u32(struct uvm_msg *m, uint32_t v) { put(m, &v, 4); }
void uvm__put_u64(struct uvm_msg *m, uint64_t v) { put(m, &v, 8); }
void uvm__put_i32(struct uvm_msg *m, int32_t v) { put(m, &v, 4); }

void uvm__put_bytes(struct uvm_msg *m, const void *p, size_t n)
{
	uvm__put_u32(m, (uint32_t)n);
	put(m, p, n);
}

void uvm__put_str(struct uvm_msg *m, const char *s) { uvm__put_bytes(m, s, strlen(s)); }

bool uvm__parse_header(const uint8_t *b, size_t n, struct uvm_header *h, struct uvm_reader *r)
{
	uint32_t magic;
	uint16_t version;
	if (n < UVM_WIRE_HEADER)
		return false;
	memcpy(&magic, b, 4);
	memcpy(&version, b + 4, 2);
	if (magic != UVM_WIRE_MAGIC || version != UVM_WIRE_VERSION)
		return false;
	memcpy(&h->type, b + 6, 2);
	memcpy(&h->seq, b + 8, 4);
	memcpy(&h->status, b + 12, 4);
	r->p = b + UVM_WIRE_HEADER;
	r->n = n - UVM_WIRE_HEADER;
	r->err = false;
	return true;
}

static const uint8_t *take(struct uvm_reader *r, size_t n)
{
	if (r->err || r->n < n) {
		r->err = true;
		return NULL;
	}
	const uint8_t *p = r->p;
	r->p += n;
	r->n -= n;
	return p;
}

#define GETTER(name, type)                                   \
	type name(struct uvm_reader *r)                      \
	{                                                    \
		type v = 0;                                  \
		const uint8_t *p = take(r, sizeof v);        \
		if (p)                                       \
			memcpy(&v, p, sizeof v);             \
		return v;                                    \
	}

GETTER(uvm__get_u8, uint8_t)
GETTER(uvm__get_u16, uint16_t)
GETTER(uvm__get_u32, uint32_t)
GETTER(uvm__get_u64, uint64_t)
GETTER(uvm__get_i32, int32_t)

const uint8_t *uvm__get_bytes(struct uvm_reader *r, uint32_t *len)
{
	*len = uvm__get_u32(r);
	const uint8_t *p = take(r, *len);
	if (!p)
		*len = 0;
	return p;
}

/* ---- the messages libuvm sends, as the Encode functions of
 * internal/wire/protocol.go write them (libuvm/tests/wire_golden_test.c
 * checks each against the same golden bytes as the Go side) ---- */

void uvm__encode_hello(struct uvm_msg *m, uint32_t seq, uint32_t pid, uint8_t coherence)
{
	uvm__msg_start(m, UVM_MSG_HELLO, seq, 0);
	uvm__put_u8(m, UVM_ROLE_CLIENT);
	uvm__put_u32(m, pid);
	uvm__put_u64(m, 0); /* the server's default features */
	uvm__put_u8(m, coherence);
}

void uvm__encode_stream_attach(struct uvm_msg *m, uint32_t seq, uint64_t addr, uint32_t flags, int32_t device, uint32_t stream)
{
	uvm__msg_start(m, UVM_MSG_STREAM_ATTACH, seq, 0);
	uvm__put_u64(m, addr);
	uvm__put_u32(m, flags);
	uvm__put_i32(m, device);
	uvm__put_u32(m, stream);
}

void uvm__encode_launch_begin(struct uvm_msg *m, uint32_t seq, int32_t device, uint32_t stream, const char *kernel)
{
	uvm__msg_start(m, UVM_MSG_LAUNCH_BEGIN, seq, 0);
	uvm__put_i32(m, device);
	uvm__put_u32(m, stream);
	uvm__put_str(m, kernel);
}

void uvm__encode_streams_idle(struct uvm_msg *m, uint32_t seq, int32_t device, uint32_t stream)
{
	uvm__msg_start(m, UVM_MSG_STREAMS_IDLE, seq, 0);
	uvm__put_i32(m, device);
	uvm__put_u32(m, stream);
}

void uvm__encode_alloc(struct uvm_msg *m, uint32_t seq, uint64_t addr, uint64_t length, uint64_t size, uint32_t flags, uint8_t kind,
		       int32_t device)
{
	uvm__msg_start(m, UVM_MSG_ALLOC, seq, 0);
	uvm__put_u64(m, addr);
	uvm__put_u64(m, length);
	uvm__put_u64(m, size);
	uvm__put_u32(m, flags);
	uvm__put_u8(m, 0);  /* prefetch-use tracking: the server's default */
	uvm__put_str(m, ""); /* prefetch policy: the server's default */
	uvm__put_u8(m, kind);
	uvm__put_i32(m, device);
}

void uvm__encode_free(struct uvm_msg *m, uint32_t seq, uint64_t addr)
{
	uvm__msg_start(m, UVM_MSG_FREE, seq, 0);
	uvm__put_u64(m, addr);
}

void uvm__encode_range_attrs(struct uvm_msg *m, uint32_t seq, uint64_t addr, uint64_t length)
{
	uvm__msg_start(m, UVM_MSG_RANGE_ATTRIBUTES, seq, 0);
	uvm__put_u64(m, addr);
	uvm__put_u64(m, length);
}

void uvm__encode_prefetch(struct uvm_msg *m, uint32_t seq, uint64_t addr, uint64_t length, int32_t dst)
{
	uvm__msg_start(m, UVM_MSG_PREFETCH, seq, 0);
	uvm__put_u64(m, addr);
	uvm__put_u64(m, length);
	uvm__put_i32(m, dst);
}

void uvm__encode_discard(struct uvm_msg *m, uint32_t seq, uint64_t addr, uint64_t length)
{
	uvm__msg_start(m, UVM_MSG_DISCARD, seq, 0);
	uvm__put_u64(m, addr);
	uvm__put_u64(m, length);
}

void uvm__encode_advise(struct uvm_msg *m, uint32_t seq, uint64_t addr, uint64_t length, uint8_t advice, int32_t device)
{
	uvm__msg_start(m, UVM_MSG_ADVISE, seq, 0);
	uvm__put_u64(m, addr);
	uvm__put_u64(m, length);
	uvm__put_u8(m, advice);
	uvm__put_i32(m, device);
}

void uvm__encode_device_written(struct uvm_msg *m, uint32_t seq, uint64_t dst, uint64_t length)
{
	uvm__msg_start(m, UVM_MSG_DEVICE_COPY, seq, 0);
	uvm__put_u8(m, UVM_DEVICE_WRITTEN);
	uvm__put_u64(m, dst);
	uvm__put_u64(m, 0); /* source: none */
	uvm__put_u64(m, length);
	uvm__put_u8(m, 0); /* value: none */
}

void uvm__encode_processor(struct uvm_msg *m, uint16_t typ, uint32_t seq, int32_t processor)
{
	uvm__msg_start(m, typ, seq, 0);
	uvm__put_i32(m, processor);
}

void uvm__encode_stream(struct uvm_msg *m, uint16_t typ, uint32_t seq, uint32_t stream)
{
	uvm__msg_start(m, typ, seq, 0);
	uvm__put_u32(m, stream);
}

void uvm__encode_launch(struct uvm_msg *m, uint32_t seq, uint32_t stream, uint32_t nthreads, uintptr_t kernel, const void *params,
			size_t n, int32_t cpu)
{
	/* The kernel goes by its address: the device process is a fork of
	 * this one, where it means the same function. */
	char name[UVM_KERNEL_NAME_MAX];
	snprintf(name, sizeof name, "c:0x%lx", (unsigned long)kernel);
	uvm__msg_start(m, UVM_MSG_LAUNCH, seq, 0);
	uvm__put_u32(m, stream);
	uvm__put_u32(m, nthreads);
	uvm__put_str(m, name);
	uvm__put_bytes(m, params, n);
	uvm__put_i32(m, cpu);
}

void uvm__encode_launch_grid(struct uvm_msg *m, uint32_t seq, uint32_t stream, uvmDim3 grid, uvmDim3 block, uint32_t shared, uint32_t stack,
			     uint32_t flags, uintptr_t kernel, const void *params, size_t n, int32_t cpu)
{
	char name[UVM_KERNEL_NAME_MAX];
	snprintf(name, sizeof name, "c:0x%lx", (unsigned long)kernel);
	uvm__msg_start(m, UVM_MSG_LAUNCH_GRID, seq, 0);
	uvm__put_u32(m, stream);
	uvm__put_u32(m, grid.x);
	uvm__put_u32(m, grid.y);
	uvm__put_u32(m, grid.z);
	uvm__put_u32(m, block.x);
	uvm__put_u32(m, block.y);
	uvm__put_u32(m, block.z);
	uvm__put_u32(m, shared);
	uvm__put_u32(m, stack);
	uvm__put_u32(m, flags);
	uvm__put_str(m, name);
	uvm__put_bytes(m, params, n);
	uvm__put_i32(m, cpu);
}

bool uvm__decode_launch_grid(struct uvm_reader *r, struct uvm_launch_grid *lg)
{
	lg->stream = uvm__get_u32(r);
	lg->grid.x = uvm__get_u32(r);
	lg->grid.y = uvm__get_u32(r);
	lg->grid.z = uvm__get_u32(r);
	lg->block.x = uvm__get_u32(r);
	lg->block.y = uvm__get_u32(r);
	lg->block.z = uvm__get_u32(r);
	lg->shared = uvm__get_u32(r);
	lg->stack = uvm__get_u32(r);
	lg->flags = uvm__get_u32(r);
	lg->name = uvm__get_bytes(r, &lg->name_len);
	lg->params = uvm__get_bytes(r, &lg->params_len);
	lg->cpu = uvm__get_i32(r);
	return !r->err && r->n == 0;
}

void uvm__encode_trace_control(struct uvm_msg *m, uint32_t seq, uint8_t op, const char *path)
{
	uvm__msg_start(m, UVM_MSG_TRACE_CONTROL, seq, 0);
	uvm__put_u8(m, op);
	uvm__put_str(m, path);
}

void uvm__encode_device_hello(struct uvm_msg *m, uint32_t seq, uint32_t device, uint32_t pid)
{
	uvm__msg_start(m, UVM_MSG_DEVICE_HELLO, seq, 0);
	uvm__put_u32(m, device);
	uvm__put_u32(m, pid);
}

void uvm__encode_reply(struct uvm_msg *m, uint16_t typ, uint32_t seq, uint32_t status, const char *msg)
{
	uvm__msg_start(m, typ, seq, status);
	if (status == UVM_WIRE_OK)
		return;
	size_t n = strlen(msg), room = m->cap > UVM_WIRE_HEADER + 4 ? m->cap - UVM_WIRE_HEADER - 4 : 0;
	uvm__put_bytes(m, msg, n < room ? n : room);
}

void uvm__encode_crash(struct uvm_msg *m, const struct uvm_crash *c)
{
	uvm__msg_start(m, UVM_MSG_LAUNCH, 0, UVM_WIRE_LAUNCH_FAILURE);
	uvm__put_u64(m, c->kernel);
	uvm__put_u32(m, c->stream);
	uvm__put_u32(m, c->tid);
	uvm__put_u32(m, c->nthreads);
	uvm__put_i32(m, c->sig);
	uvm__put_i32(m, c->code);
	uvm__put_u64(m, c->addr);
	uvm__put_u64(m, c->block);
	uvm__put_u32(m, c->grid_dim.x);
	uvm__put_u32(m, c->grid_dim.y);
	uvm__put_u32(m, c->grid_dim.z);
	uvm__put_u32(m, c->block_dim.x);
	uvm__put_u32(m, c->block_dim.y);
	uvm__put_u32(m, c->block_dim.z);
}

bool uvm__decode_crash(struct uvm_reader *r, struct uvm_crash *c)
{
	c->kernel = uvm__get_u64(r);
	c->stream = uvm__get_u32(r);
	c->tid = uvm__get_u32(r);
	c->nthreads = uvm__get_u32(r);
	c->sig = uvm__get_i32(r);
	c->code = uvm__get_i32(r);
	c->addr = uvm__get_u64(r);
	c->block = uvm__get_u64(r);
	c->grid_dim.x = uvm__get_u32(r);
	c->grid_dim.y = uvm__get_u32(r);
	c->grid_dim.z = uvm__get_u32(r);
	c->block_dim.x = uvm__get_u32(r);
	c->block_dim.y = uvm__get_u32(r);
	c->block_dim.z = uvm__get_u32(r);
	return !r->err && r->n == 0;
}

void uvm__report_start(struct uvm_msg *m)
{
	uvm__msg_start(m, UVM_MSG_DEVICE_REPORT, 0, 0);
	uvm__put_u32(m, 0); /* lost and */
	uvm__put_u32(m, 0); /* record counts: uvm__report_finish */
}

void uvm__report_add(struct uvm_msg *m, uint8_t kind, uint32_t stream, uint32_t threads, uint64_t start, uint64_t end, const uint8_t *name,
		     uint32_t name_len)
{
	if (name_len > UVM_MAX_REPORT_NAME) /* C kernels' names are short; cut on a UTF-8 boundary anyway */
		for (name_len = UVM_MAX_REPORT_NAME; name_len > 0 && (name[name_len] & 0xc0) == 0x80; name_len--)
			;
	uvm__put_u8(m, kind);
	uvm__put_u32(m, stream);
	uvm__put_u32(m, threads);
	uvm__put_u64(m, start);
	uvm__put_u64(m, end);
	uvm__put_bytes(m, name, name_len);
}

void uvm__report_finish(struct uvm_msg *m, uint32_t lost, uint32_t count)
{
	if (m->overflow || m->len < UVM_WIRE_HEADER + 8)
		return;
	memcpy(m->buf + UVM_WIRE_HEADER, &lost, 4);
	memcpy(m->buf + UVM_WIRE_HEADER + 4, &count, 4);
}

int uvm__send(int sock, const void *b, size_t n, const int *fds, int nfds)
{
	struct iovec iov = {.iov_base = (void *)b, .iov_len = n};
	union {
		char buf[CMSG_SPACE(8 * sizeof(int))];
		struct cmsghdr align;
	} control;
	struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1};
	if (nfds > 8)
		return EINVAL;
	if (nfds > 0) {
		memset(&control, 0, sizeof control);
		msg.msg_control = control.buf;
		msg.msg_controllen = CMSG_SPACE(nfds * sizeof(int));
		struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
		c->cmsg_level = SOL_SOCKET;
		c->cmsg_type = SCM_RIGHTS;
		c->cmsg_len = CMSG_LEN(nfds * sizeof(int));
		memcpy(CMSG_DATA(c), fds, nfds * sizeof(int));
	}
	for (;;) {
		ssize_t k = sendmsg(sock, &msg, MSG_NOSIGNAL);
		if (k >= 0)
			return 0;
		if (errno != EINTR)
			return errno;
	}
}

ssize_t uvm__recv(int sock, void *buf, size_t cap, int *fds, int maxfds, int *nfds)
{
	struct iovec iov = {.iov_base = buf, .iov_len = cap};
	union {
		char buf[CMSG_SPACE(64 * sizeof(int))];
		struct cmsghdr align;
	} control;
	struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = control.buf, .msg_controllen = sizeof control.buf};
	ssize_t k;
	if (nfds)
		*nfds = 0;
	do
		k = recvmsg(sock, &msg, MSG_CMSG_CLOEXEC);
	while (k < 0 && errno == EINTR);
	if (k < 0)
		return -errno;
	for (struct cmsghdr *c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c)) {
		if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
			continue;
		int n = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
		int *got = (int *)CMSG_DATA(c);
		for (int i = 0; i < n; i++) {
			if (fds && nfds && *nfds < maxfds)
				fds[(*nfds)++] = got[i];
			else
				close(got[i]); /* more than the caller wanted */
		}
	}
	if (msg.msg_flags & MSG_TRUNC)
		return -EMSGSIZE;
	return k;
}
