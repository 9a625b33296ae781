/*
 * internal.h: what libuvm's source files share. Nothing here is API.
 *
 * Rules every file follows:
 *  - Never call malloc/calloc/realloc/free: libuvm-preload.so replaces
 *    them, and a call from inside the library would recurse into the
 *    managed allocator. Use uvm__sys_malloc and friends (glibc's own
 *    allocator, reached by its __libc_ names), or mmap.
 *  - Report every failure through uvm__fail, which records the thread's
 *    last error and message and returns the code.
 *  - Lock order: a device's mu, then streams_mu (device.c), before any
 *    session lock; init_mu, then allocs_mu (the fork handlers hold both
 *    across a fork); files_mu, then req_mu. allocs_mu is never held
 *    across a request to the server.
 */
#ifndef UVM_INTERNAL_H
#define UVM_INTERNAL_H

#define _GNU_SOURCE
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#pragma GCC visibility push(default)
#include "uvm.h"
#pragma GCC visibility pop

#define UVM_HIDDEN __attribute__((visibility("hidden")))

/* Layout shared with the Go runtime (uvm/devproc.go, uvm/memcpy.go). */
#define UVM_PAGE_SIZE 4096ul
#define UVM_BLOCK_SIZE (2ul << 20)
#define UVM_WINDOW_START 0x600000000000ul
#define UVM_WINDOW_SIZE 0x100000000000ul /* 16 TiB */
#define UVM_FILE_SIZE (1ul << 47)
#define UVM_MAX_ALLOCATION (1ul << 46)
#define UVM_MAX_DEVICES 31
#define UVM_MAX_MESSAGE (1u << 20)

static inline bool uvm__in_window(uintptr_t p)
{
	return p >= UVM_WINDOW_START && p < UVM_WINDOW_START + UVM_WINDOW_SIZE;
}

/* ---- errors (error.c) ---- */

/* uvm__fail records err and a printf-style message as the calling
 * thread's last error and returns err. */
UVM_HIDDEN uvmError_t uvm__fail(uvmError_t err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* uvm__ok returns uvmSuccess (the last error is left as it is, as CUDA
 * leaves it). */
static inline uvmError_t uvm__ok(void) { return uvmSuccess; }
/* uvm__from_wire maps a server status code (uvm/errors.go) to a code. */
UVM_HIDDEN uvmError_t uvm__from_wire(uint32_t status);

/* ---- glibc's allocator, never the interposed one (sysalloc.c) ---- */

UVM_HIDDEN void *uvm__sys_malloc(size_t n);
UVM_HIDDEN void *uvm__sys_calloc(size_t k, size_t n);
UVM_HIDDEN void *uvm__sys_realloc(void *p, size_t n);
UVM_HIDDEN void uvm__sys_free(void *p);

/* ---- the wire protocol (wire.c), as uvm/protocol.go ---- */

enum uvm_msg_type {
	UVM_MSG_HELLO = 1,
	UVM_MSG_ALLOC,
	UVM_MSG_FREE,
	UVM_MSG_PREFETCH,
	UVM_MSG_RANGE_ATTRS,
	UVM_MSG_STATS,
	UVM_MSG_INFO,
	UVM_MSG_DEVICE_CONNECT,
	UVM_MSG_DEVICE_HELLO,
	UVM_MSG_DEVICE_READY,
	UVM_MSG_DEVICE_MAP,
	UVM_MSG_DEVICE_UNMAP,
	UVM_MSG_LAUNCH,
	UVM_MSG_SYNC,
	UVM_MSG_STREAM_DESTROY,
	UVM_MSG_DEVICE_UP,
	UVM_MSG_ADVISE,
	UVM_MSG_DEVICE_COPY,
	UVM_MSG_STREAM_OPEN,
	UVM_MSG_DEVICE_FILE,
	UVM_MSG_DEVICE_HINTS,
	UVM_MSG_RESTARTED, /* server -> client, unsolicited: a new server took over */
	UVM_MSG_REPLACE,
};

/* The status of a request sent again after a restart notice: the new
 * server drops it when it had read the first copy. */
#define UVM_WIRE_RETRIED 1u

/* Server status codes (uvm/errors.go errorCode). */
enum uvm_wire_status {
	UVM_WIRE_OK = 0,
	UVM_WIRE_INVALID_VALUE,
	UVM_WIRE_MEMORY_ALLOCATION,
	UVM_WIRE_INVALID_DEVICE,
	UVM_WIRE_INITIALIZATION,
	UVM_WIRE_NOT_SUPPORTED,
	UVM_WIRE_INTERNAL,
	UVM_WIRE_LAUNCH_FAILURE,
};

/* Memory kinds (uvm/types.go rangeKind). */
enum uvm_kind { UVM_KIND_MANAGED = 0, UVM_KIND_PINNED_HOST = 1, UVM_KIND_DEVICE = 2 };

#define UVM_WIRE_HEADER 16

/* A message being built; buf has room for cap bytes. Writes past cap
 * set overflow instead. */
struct uvm_msg {
	uint8_t *buf;
	size_t len, cap;
	bool overflow;
};

/* uvm__msg_start writes a request header of type typ into m (buf and cap
 * set by the caller). */
UVM_HIDDEN void uvm__msg_start(struct uvm_msg *m, uint16_t typ, uint32_t seq, uint32_t status);
UVM_HIDDEN void uvm__put_u8(struct uvm_msg *m, uint8_t v);
UVM_HIDDEN void uvm__put_u16(struct uvm_msg *m, uint16_t v);
UVM_HIDDEN void uvm__put_u32(struct uvm_msg *m, uint32_t v);
UVM_HIDDEN void uvm__put_u64(struct uvm_msg *m, uint64_t v);
UVM_HIDDEN void uvm__put_i32(struct uvm_msg *m, int32_t v);
/* A length-prefixed string or byte string. */
UVM_HIDDEN void uvm__put_bytes(struct uvm_msg *m, const void *p, size_t n);
UVM_HIDDEN void uvm__put_str(struct uvm_msg *m, const char *s);

/* A message being read; the first short read sets err and later reads
 * return zeros. */
struct uvm_reader {
	const uint8_t *p;
	size_t n;
	bool err;
};

struct uvm_header {
	uint16_t type;
	uint32_t seq;
	uint32_t status;
};

/* uvm__parse_header checks magic and version; the reader gets the
 * payload. Returns false for a malformed message. */
UVM_HIDDEN bool uvm__parse_header(const uint8_t *b, size_t n, struct uvm_header *h, struct uvm_reader *r);
UVM_HIDDEN uint8_t uvm__get_u8(struct uvm_reader *r);
UVM_HIDDEN uint16_t uvm__get_u16(struct uvm_reader *r);
UVM_HIDDEN uint32_t uvm__get_u32(struct uvm_reader *r);
UVM_HIDDEN uint64_t uvm__get_u64(struct uvm_reader *r);
UVM_HIDDEN int32_t uvm__get_i32(struct uvm_reader *r);
/* uvm__get_bytes returns a pointer into the message and its length. */
UVM_HIDDEN const uint8_t *uvm__get_bytes(struct uvm_reader *r, uint32_t *len);

/* uvm__send sends one datagram with up to 8 descriptors. Returns 0 or an
 * errno value. Retries EINTR. */
UVM_HIDDEN int uvm__send(int sock, const void *b, size_t n, const int *fds, int nfds);
/* uvm__recv receives one datagram into buf (cap bytes) and up to maxfds
 * descriptors (received close-on-exec). Returns its length, 0 at end of
 * file, or -errno. *nfds is set to the number received. Retries EINTR. */
UVM_HIDDEN ssize_t uvm__recv(int sock, void *buf, size_t cap, int *fds, int maxfds, int *nfds);

/* ---- the session (session.c) ---- */

struct uvm_device_info {
	uint64_t capacity;
	int workers;
};

/* A device's file in this session (msgDeviceFile): device memory at
 * address a is at offset a. Copies map it per allocation (the shadow)
 * and copy in and out themselves, with the server's copy parameters. */
struct uvm_device_file {
	int fd;                      /* -1 until a copy asks for it */
	unsigned producers;          /* threads a large copy runs on, >= 1 */
	uint64_t non_temporal_above; /* non-temporal stores from this size into device memory; 0: never */
	uint64_t direct_below;       /* copies under this size run on the calling thread alone */
};

struct uvm_session {
	int conn;    /* SOCK_SEQPACKET to the server, close-on-exec */
	int host_fd; /* this process's host file: offset == address */
	pid_t server_pid;
	pid_t private_pid; /* a private server this process started, or 0 */
	uint64_t id;
	int ndevices;
	struct uvm_device_info devices[UVM_MAX_DEVICES];

	/* req_mu serializes requests on conn; seq and rbuf are its. */
	pthread_mutex_t req_mu;
	uint32_t seq;
	uint8_t *rbuf; /* UVM_MAX_MESSAGE bytes, mmap'ed */
	bool gone;     /* the server went away */
	uint32_t restarts; /* restart notices read */

	/* files_mu guards files, each asked for at a copy's first need. */
	pthread_mutex_t files_mu;
	struct uvm_device_file files[UVM_MAX_DEVICES];
};

/* uvm__session returns the process's session, connecting on first use.
 * On failure it returns NULL with the last error set; call it as
 *   struct uvm_session *s = uvm__session(); if (!s) return uvmGetLastError-ish...
 * use uvm__session_err to get the code. */
UVM_HIDDEN struct uvm_session *uvm__session(uvmError_t *err);
/* uvm__open_userfaultfd opens a blocking, close-on-exec userfaultfd (the
 * system call, else /dev/userfaultfd), not handshaken: the server does
 * that. Returns -1 with errno set. */
UVM_HIDDEN int uvm__open_userfaultfd(void);

/* uvm__request sends req (with fds) and waits for the reply, which is
 * copied into out (cap bytes) and read through *reply. Descriptors the
 * reply carries go to rfds (up to maxrfds; *nrfds set), owned by the
 * caller. A reply with an error status is turned into that error (its
 * message recorded). what names the operation for messages. */
UVM_HIDDEN uvmError_t uvm__request(struct uvm_session *s, struct uvm_msg *req, const int *fds, int nfds,
				   uint8_t *out, size_t cap, struct uvm_reader *reply,
				   int *rfds, int maxrfds, int *nrfds, const char *what);
UVM_HIDDEN uint32_t uvm__next_seq(struct uvm_session *s);

/* ---- allocations (session.c) ---- */

struct uvm_alloc {
	uintptr_t addr;     /* start, 2 MiB aligned */
	size_t size;        /* as asked */
	size_t length;      /* size rounded up to pages: what is mapped */
	size_t reserved;    /* length rounded up to 2 MiB: what is reserved */
	uint64_t buffer_id;
	int kind;           /* enum uvm_kind */
	int device;         /* device memory's device; managed: the current device at allocation */
	unsigned flags;
	uintptr_t host_alias; /* uvmHostRegister: the program's own address */
	uint8_t *shadow;    /* device memory: its device file mapped over [addr, addr+length), or NULL until a copy needs it */
	bool forked;        /* a private copy made in a forked child: no server knows it */
	bool pending;       /* being allocated: its address is taken, nothing else is known yet */
};

/* uvm__alloc_lookup copies the allocation holding p (addr <= p <
 * addr+length, or host_alias <= p < host_alias+length for registered
 * memory) into *out. Returns false if p is not the library's. */
UVM_HIDDEN bool uvm__alloc_lookup(uintptr_t p, struct uvm_alloc *out);

/* uvm__alias_overlap reports whether [p, p+n) overlaps a registration
 * (uvmHostRegister), and copies the first into *out. */
UVM_HIDDEN bool uvm__alias_overlap(uintptr_t p, size_t n, struct uvm_alloc *out);
/* uvm__alloc_shadow returns a's shadow (a looked up by the caller, of
 * device memory), mapping device file fd on first use. NULL with errno
 * set if it cannot be mapped, ESTALE if a is no longer allocated. */
UVM_HIDDEN uint8_t *uvm__alloc_shadow(const struct uvm_alloc *a, int fd);
/* uvm__alloc_set_alias records that the pinned allocation at addr is the
 * registration of the program's memory at alias. */
UVM_HIDDEN void uvm__alloc_set_alias(uintptr_t addr, uintptr_t alias);

/* uvm__allocate reserves address space in the window, maps the host file
 * there, and registers it with the server as kind (device for device
 * memory). prepare, if not NULL, runs on the mapping before the server
 * learns of it (pinned memory fills itself there). */
UVM_HIDDEN uvmError_t uvm__allocate(size_t size, int kind, int device, unsigned flags,
				    uvmError_t (*prepare)(uintptr_t addr, size_t length, void *arg), void *arg,
				    struct uvm_alloc *out);
/* uvm__release frees the allocation starting at addr, of one of the kinds
 * in kinds_mask (1 << kind); what names the call for messages. */
UVM_HIDDEN uvmError_t uvm__release(uintptr_t addr, unsigned kinds_mask, const char *what);

/* ---- for libuvm-preload.so (preload/preload.c) ---- */

/* uvm__managed_alloc allocates managed memory for the interposed
 * allocator: 2 MiB aligned, AttachGlobal. */
UVM_HIDDEN uvmError_t uvm__managed_alloc(void **p, size_t size);
/* uvm__managed_size returns the usable size (the page-rounded length) of
 * the allocation of any kind that starts at p in the managed window, 0 if
 * there is none; uvm__alloc_lookup tells the kinds apart. */
UVM_HIDDEN size_t uvm__managed_size(const void *p);
/* uvm__adopt makes the program's own memory at [addr, addr+length)
 * (page-aligned, below the managed window) managed, contents kept: the
 * host file is mapped over it. Nothing else may touch the range
 * meanwhile. The preload library adopts a program's large static arrays
 * this way, before main. The range is never freed. */
UVM_HIDDEN uvmError_t uvm__adopt(uintptr_t addr, size_t length);

/* ---- devices (device.c) ---- */

/* uvm__current_device is the calling thread's current device. */
UVM_HIDDEN int uvm__current_device(void);
/* uvm__stream_wait waits for stream's queued work (NULL: the current
 * device's default stream), for the Async calls that run in stream order. */
UVM_HIDDEN uvmError_t uvm__stream_wait(uvmStream_t stream, const char *what);
/* uvm__in_device_fork is true in the thread that forks a device process
 * (and so in that process): fork handlers leave such a fork alone. */
UVM_HIDDEN extern __thread bool uvm__in_device_fork;
/* uvm__device_process is -1 in the program and the device's index in a
 * device process (devproc.c), in every thread of it. There the session
 * is a stale copy whose mutexes other threads of the parent may have
 * held at the fork: the host API must refuse (a kernel calling it) and
 * the preload's allocator must use glibc's. */
UVM_HIDDEN extern int uvm__device_process;
/* uvm__device_main is the whole life of a device process, in the child
 * of the fork that device.c makes: server is the socket of its device
 * hello (from msgDeviceConnect), control and stream0 the process's ends
 * of the control connection and of the default stream. It never
 * returns. */
UVM_HIDDEN void uvm__device_main(int device, int workers, int server, int control, int stream0) __attribute__((noreturn));

#endif /* UVM_INTERNAL_H */
