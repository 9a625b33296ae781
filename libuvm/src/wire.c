/* wire.c: the binary protocol of uvm/protocol.go, and datagrams with
 * descriptors. Every field is little-endian; x86-64 and arm64 Linux are,
 * so fields are copied as they lie. */
#include "internal.h"

#include <errno.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>


#define WIRE_MAGIC 0x4d565553u /* "SUVM" */
#define WIRE_VERSION 1

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
	uvm__put_u32(m, WIRE_MAGIC);
	uvm__put_u16(m, WIRE_VERSION);
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
	if (magic != WIRE_MAGIC || version != WIRE_VERSION)
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
