/*
 * internal.h: what libuvm's source files share. Nothing here is API.
 *
 * The files call each other down the layers libuvm/layers.go lists
 * (`make lint` checks): wire and session at the bottom, then the launch
 * model's requests and the device process's side, the program's side of
 * device processes (device.c), streams and properties, memory and events,
 * and the preload library on top.
 *
 * Rules every file follows:
 *  - Never call malloc/calloc/realloc/free, mmap/munmap/mremap:
 *    libuvm-preload.so replaces them, and a call from inside the library
 *    would recurse into the managed allocator. Use uvm__sys_malloc and
 *    friends (glibc's own allocator, reached by its __libc_ names) and
 *    uvm__sys_mmap and friends (the system calls).
 *  - Report every failure through uvm__fail, which records the thread's
 *    last error and message and returns the code.
 *  - Lock order: a device's order_mu, streams_mu, a stream queue's mu
 *    (stream.c), then a device's mu (device.c), before any session lock; init_mu, then allocs_mu (the fork handlers hold both
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
#if !defined(__x86_64__) || defined(UVM_FIBER_UCONTEXT)
#include <ucontext.h>
#endif

/* The library's own files do not hand over managed variables (uvm.h's
 * constructor): they have none. */
#define UVM_INTERNAL
#pragma GCC visibility push(default)
#include "uvm.h"
#pragma GCC visibility pop

#define UVM_HIDDEN __attribute__((visibility("hidden")))

/* The library's own constructors run before the preload library's, by
 * priority, not by the order the objects happen to be linked in. Above
 * all for fork: the preload library's constructor loads jemalloc, whose
 * arenas live in managed memory, and managed memory is MADV_DONTFORK, so
 * a child has it only once session.c's child handler has mapped the
 * child's copy back. Child handlers run in the order they were
 * registered, so session.c must register before jemalloc does. (The
 * preload library built by `uvm run` linked preload.o first, and every
 * program under it that forked, bash among them, crashed in jemalloc's
 * child handler.) Priorities up to 100 are the C library's. */
#define UVM_CORE_CONSTRUCTOR __attribute__((constructor(200)))
#define UVM_PRELOAD_CONSTRUCTOR __attribute__((constructor(300)))

/* Every constant shared with the Go side (the wire protocol's codes, the
 * layout of memory) is generated from its Go definition. */
#include "wire_gen.h"

/* The API's own values travel on the wire as they are. */
_Static_assert(uvmCpuDeviceId == UVM_CPU && uvmInvalidDeviceId == UVM_INVALID_DEVICE, "uvm.h's processors are not the wire's");
_Static_assert(uvmMemAttachGlobal == UVM_ATTACH_GLOBAL && uvmMemAttachHost == UVM_ATTACH_HOST, "uvm.h's attachment flags are not the wire's");
_Static_assert(uvmMemAdviseSetReadMostly == UVM_ADVISE_SET_READ_MOSTLY &&
	       uvmMemAdviseUnsetReadMostly == UVM_ADVISE_UNSET_READ_MOSTLY &&
	       uvmMemAdviseSetPreferredLocation == UVM_ADVISE_SET_PREFERRED_LOCATION &&
	       uvmMemAdviseUnsetPreferredLocation == UVM_ADVISE_UNSET_PREFERRED_LOCATION &&
	       uvmMemAdviseSetAccessedBy == UVM_ADVISE_SET_ACCESSED_BY &&
	       uvmMemAdviseUnsetAccessedBy == UVM_ADVISE_UNSET_ACCESSED_BY,
	       "uvm.h's advice is not the wire's");
_Static_assert(uvmMaxKernelParams == UVM_MAX_KERNEL_PARAMS, "uvm.h's kernel parameter bound is not the wire's");

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
/* uvm__from_wire maps a server status code (enum uvm_wire_status) to a
 * code. */
UVM_HIDDEN uvmError_t uvm__from_wire(uint32_t status);
/* uvm__refuse_in_device refuses fn in a device process (called by a
 * kernel): its session is a stale copy. */
UVM_HIDDEN uvmError_t uvm__refuse_in_device(const char *fn);

/* ---- glibc's allocator, never the interposed one (sysalloc.c) ---- */

UVM_HIDDEN void *uvm__sys_malloc(size_t n);
UVM_HIDDEN void *uvm__sys_calloc(size_t k, size_t n);
UVM_HIDDEN void *uvm__sys_realloc(void *p, size_t n);
UVM_HIDDEN void uvm__sys_free(void *p);
/* mmap, munmap and mremap by the system call: the preload library
 * replaces the C library's (mremap takes its fifth argument always). */
UVM_HIDDEN void *uvm__sys_mmap(void *addr, size_t len, int prot, int flags, int fd, off_t off);
UVM_HIDDEN int uvm__sys_munmap(void *addr, size_t len);
UVM_HIDDEN void *uvm__sys_mremap(void *old, size_t old_len, size_t new_len, int flags, void *new_addr);
/* uvm__slot_take picks the slot of a new handle in a table of handle
 * slots (streams, events) of elem bytes each, slots the address of the
 * table's pointer: a freed one, else the next,
 * doubling the table and its free list when full. *fresh says a never
 * used slot was taken (its generation must start at 1). The caller holds
 * the table's lock. Returns -1, changing nothing, without memory. */
UVM_HIDDEN int64_t uvm__slot_take(void *slots, size_t elem, uint32_t *n, uint32_t *cap, uint32_t **free_slots, uint32_t *nfree,
				   bool *fresh);

/* ---- the wire protocol (wire.c), as internal/wire/protocol.go ---- */

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

/* The messages libuvm sends (wire.c), each as the Encode function of
 * internal/wire/protocol.go of the same name writes it: they start m
 * (buf and cap set by the caller) and fill it in. A session's request
 * goes with seq 0: uvm__request numbers it. */
UVM_HIDDEN void uvm__encode_hello(struct uvm_msg *m, uint32_t seq, uint32_t pid, uint8_t coherence);
/* The launch coherence model's requests (coherence.c). */
UVM_HIDDEN void uvm__encode_stream_attach(struct uvm_msg *m, uint32_t seq, uint64_t addr, uint32_t flags, int32_t device, uint32_t stream);
UVM_HIDDEN void uvm__encode_launch_begin(struct uvm_msg *m, uint32_t seq, int32_t device, uint32_t stream, const char *kernel);
UVM_HIDDEN void uvm__encode_streams_idle(struct uvm_msg *m, uint32_t seq, int32_t device, uint32_t stream);
UVM_HIDDEN void uvm__encode_alloc(struct uvm_msg *m, uint32_t seq, uint64_t addr, uint64_t length, uint64_t size, uint32_t flags, uint8_t kind,
				  int32_t device);
UVM_HIDDEN void uvm__encode_free(struct uvm_msg *m, uint32_t seq, uint64_t addr);
UVM_HIDDEN void uvm__encode_range_attrs(struct uvm_msg *m, uint32_t seq, uint64_t addr, uint64_t length);
UVM_HIDDEN void uvm__encode_prefetch(struct uvm_msg *m, uint32_t seq, uint64_t addr, uint64_t length, int32_t dst);
UVM_HIDDEN void uvm__encode_discard(struct uvm_msg *m, uint32_t seq, uint64_t addr, uint64_t length);
UVM_HIDDEN void uvm__encode_advise(struct uvm_msg *m, uint32_t seq, uint64_t addr, uint64_t length, uint8_t advice, int32_t device);
/* A device-copy request saying that device memory at [dst, dst+length)
 * was written through the client's mapping (EncodeDeviceCopy with
 * UVM_DEVICE_WRITTEN). */
UVM_HIDDEN void uvm__encode_device_written(struct uvm_msg *m, uint32_t seq, uint64_t dst, uint64_t length);
/* A request naming a processor: device-connect, device-file. */
UVM_HIDDEN void uvm__encode_processor(struct uvm_msg *m, uint16_t typ, uint32_t seq, int32_t processor);
/* A request naming a stream: stream-open, sync, stream-destroy
 * (EncodeStreamRequest). */
UVM_HIDDEN void uvm__encode_stream(struct uvm_msg *m, uint16_t typ, uint32_t seq, uint32_t stream);
/* A launch of the C kernel at address kernel, named "c:0x<hex>"; a
 * launch takes at most UVM_LAUNCH_MESSAGE_MAX bytes. */
#define UVM_KERNEL_NAME_MAX 24
#define UVM_LAUNCH_MESSAGE_MAX (UVM_WIRE_HEADER + 12 + UVM_KERNEL_NAME_MAX + 4 + uvmMaxKernelParams + 4)
/* A launch-grid message's bound: a launch's, and the shape's nine words. */
#define UVM_LAUNCH_GRID_MESSAGE_MAX (UVM_LAUNCH_MESSAGE_MAX + 9 * 4)
UVM_HIDDEN void uvm__encode_launch(struct uvm_msg *m, uint32_t seq, uint32_t stream, uint32_t nthreads, uintptr_t kernel, const void *params,
				   size_t n, int32_t cpu);
UVM_HIDDEN void uvm__encode_device_hello(struct uvm_msg *m, uint32_t seq, uint32_t device, uint32_t pid);
/* A reply with status, and msg if the status is not OK (EncodeEmptyReply,
 * EncodeError), msg cut to what fits. */
UVM_HIDDEN void uvm__encode_reply(struct uvm_msg *m, uint16_t typ, uint32_t seq, uint32_t status, const char *msg);

/* A kernel's crash, as a device process reports it to its client: a
 * launch "reply" with status UVM_WIRE_LAUNCH_FAILURE, which only libuvm
 * sends and reads (Go's device processes recover a kernel's fault and
 * report it at the next synchronize). Encoding it is async-signal-safe. */
struct uvm_crash {
	uint64_t kernel; /* the kernel's address */
	uint32_t stream, tid, nthreads;
	int32_t sig, code; /* the signal and its si_code */
	uint64_t addr;     /* si_addr */
	/* A grid launch's: the block (linear) the thread tid of which
	 * crashed, and the shape; grid_dim is zero for a (tid, nthreads)
	 * launch. */
	uint64_t block;
	uvmDim3 grid_dim, block_dim;
};
UVM_HIDDEN void uvm__encode_crash(struct uvm_msg *m, const struct uvm_crash *c);
/* uvm__decode_crash reads a crash report's payload; false if it is
 * truncated or has trailing bytes. */
UVM_HIDDEN bool uvm__decode_crash(struct uvm_reader *r, struct uvm_crash *c);

/* A device report (internal/wire/devicetrace.go): what a device process
 * of a traced session ran and answered, sent to the server on the socket
 * its device-trace notice carried. uvm__report_start begins one in m,
 * uvm__report_add appends a record (the name cut to UVM_MAX_REPORT_NAME
 * bytes; times are CLOCK_MONOTONIC nanoseconds), and uvm__report_finish
 * writes the lost and record counts. A report of UVM_MAX_REPORT_RECORDS
 * records takes at most UVM_REPORT_MESSAGE_MAX bytes. */
#define UVM_REPORT_RECORD_MAX (1 + 4 + 4 + 8 + 8 + 4 + UVM_MAX_REPORT_NAME)
#define UVM_REPORT_MESSAGE_MAX (UVM_WIRE_HEADER + 8 + UVM_MAX_REPORT_RECORDS * UVM_REPORT_RECORD_MAX)
UVM_HIDDEN void uvm__report_start(struct uvm_msg *m);
UVM_HIDDEN void uvm__report_add(struct uvm_msg *m, uint8_t kind, uint32_t stream, uint32_t threads, uint64_t start, uint64_t end,
				const uint8_t *name, uint32_t name_len);
UVM_HIDDEN void uvm__report_finish(struct uvm_msg *m, uint32_t lost, uint32_t count);

/* uvm__send sends one datagram with up to 8 descriptors. Returns 0 or an
 * errno value. Retries EINTR. */
UVM_HIDDEN int uvm__send(int sock, const void *b, size_t n, const int *fds, int nfds);
/* uvm__recv receives one datagram into buf (cap bytes) and up to maxfds
 * descriptors (received close-on-exec). Returns its length, 0 at end of
 * file, or -errno. *nfds is set to the number received. Retries EINTR. */
UVM_HIDDEN ssize_t uvm__recv(int sock, void *buf, size_t cap, int *fds, int maxfds, int *nfds);

/* A trace-control request (wire.EncodeTraceControl): start recording the
 * session's events to path, or stop (profiler.c). */
UVM_HIDDEN void uvm__encode_trace_control(struct uvm_msg *m, uint32_t seq, uint8_t op, const char *path);

/* ---- the session (session.c) ---- */

struct uvm_device_info {
	uint64_t capacity;
	int workers;
	int node; /* the NUMA node its arena is bound to, -1 if none */
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
	int coherence; /* UVM_COHERENCE_FAULT or UVM_COHERENCE_LAUNCH, as the server settled it */

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
/* uvm__session_refuse makes every later call that needs the session fail
 * with why (session.c): managed.c calls it when the program's managed
 * variables could not be made managed memory. why must outlive the
 * process; the first reason stays. */
UVM_HIDDEN void uvm__session_refuse(const char *why);

/* uvm__current_device is the calling thread's current device. */
UVM_HIDDEN int uvm__current_device(void);
/* uvm__check_device checks that d is a device of the session (whose
 * pointer goes to *sp if sp is not NULL); what starts the message. */
UVM_HIDDEN uvmError_t uvm__check_device(int d, const char *what, struct uvm_session **sp);

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
/* uvm__discard asks the server to drop every copy of the pages of
 * [start, start+length), page-aligned in one managed allocation: they read
 * as zeros from then on (uvmMemDiscard; the preload's heap purge). what
 * names the caller in errors. */
UVM_HIDDEN uvmError_t uvm__discard(uint64_t start, uint64_t length, const char *what);
/* uvm__fork_used, where set (by the preload library's managed heap),
 * says how much of the managed allocation at addr (length bytes) holds
 * anything: a fork copies that much for the child, which finds the rest
 * zeros. Called in the fork's prepare handler. */
UVM_HIDDEN extern size_t (*uvm__fork_used)(uintptr_t addr, size_t length);
/* uvm__adopt makes the program's own memory at [addr, addr+length)
 * (page-aligned, below the managed window) managed, contents kept: the
 * host file is mapped over it. Nothing else may touch the range
 * meanwhile. The preload library adopts a program's large static arrays
 * this way, before main. The range is never freed. */
UVM_HIDDEN uvmError_t uvm__adopt(uintptr_t addr, size_t length);

/* uvm__copy_box copies (src not NULL) or fills with value a box of depth
 * slices of height rows of width bytes: rows dpitch apart and slices
 * dpitch*dheight apart in dst (spitch, sheight in src), checking the
 * spans that hold it as uvmMemcpy checks a copy (memory.c; copy3d.c
 * checks the shape). synchronous: a synchronous call issued on stream
 * (NULL: the legacy default stream; uvmStreamPerThread), which first
 * waits for the work before it there, as uvmMemcpy does; otherwise the
 * caller runs in stream order already (a queued Async form). */
UVM_HIDDEN uvmError_t uvm__copy_box(const char *what, void *dst, size_t dpitch, size_t dheight, const void *src, size_t spitch, size_t sheight,
				    size_t width, size_t height, size_t depth, int value, uvmMemcpyKind kind, bool synchronous,
				    uvmStream_t stream);

/* ---- memory locations (location.c, which memory.c's prefetch, advice
 * and range attributes call) ---- */

/* uvm__page_range rounds [ptr, ptr+n) out to pages, as CUDA does for
 * prefetch and advice, and checks that it lies in one allocation of the
 * library, which it returns in *a; what names the call. */
UVM_HIDDEN uvmError_t uvm__page_range(const char *what, const void *ptr, size_t n, struct uvm_alloc *a, uint64_t *start, uint64_t *length);
/* uvm__managed_range is uvm__page_range for managed memory only. */
UVM_HIDDEN uvmError_t uvm__managed_range(const char *what, const void *ptr, size_t n, uint64_t *start, uint64_t *length);
/* Under the launch coherence model (concurrentManagedAccess 0) CUDA
 * refuses a prefetch, to any processor, and advice naming a device as the
 * preferred location or an accessor: uvm__refuse_prefetch and
 * uvm__refuse_advice refuse them so (uvmErrorInvalidDevice), what naming
 * the call, and return uvmSuccess otherwise. */
UVM_HIDDEN uvmError_t uvm__refuse_prefetch(const char *what, int processor);
UVM_HIDDEN uvmError_t uvm__refuse_advice(const char *what, uvmMemoryAdvise advice, int device);
/* uvm__prefetch_now and uvm__advise_now ask the server to prefetch
 * [start, start+length) to processor dst, or to take the advice for
 * device, and wait for the answer. */
UVM_HIDDEN uvmError_t uvm__prefetch_now(uint64_t start, uint64_t length, int dst, const char *what);
UVM_HIDDEN uvmError_t uvm__advise_now(uint64_t start, uint64_t length, uvmMemoryAdvise advice, int device, const char *what);
/* uvm__locations_prefetched records that [start, start+length) was last
 * prefetched to host node node (-1: not to a host node). */
UVM_HIDDEN void uvm__locations_prefetched(uint64_t start, uint64_t length, int node);
/* uvm__locations_preferred records that the range prefers host node node
 * (-1: none). */
UVM_HIDDEN void uvm__locations_preferred(uint64_t start, uint64_t length, int node);
/* uvm__locations_advised does the host node's part of advice taken by the
 * server: for a preferred location, node's policy (or the default's back)
 * and the record. */
UVM_HIDDEN uvmError_t uvm__locations_advised(uint64_t start, uint64_t length, uvmMemoryAdvise advice, int node, const char *what);
/* uvm__locations_forget forgets a freed allocation's records. */
UVM_HIDDEN void uvm__locations_forget(uint64_t start, uint64_t length);
/* uvm__location_of is the location type and id a range attribute gives
 * for processor (as the server answers the preferred or last prefetch
 * location: a device, uvmCpuDeviceId, or uvmInvalidDeviceId when the
 * pages disagree), the host's node added from the records. */
UVM_HIDDEN void uvm__location_of(bool prefetched, int processor, uint64_t start, uint64_t length, int *type, int *id);

/* ---- device processes (devproc.c, device.c) and the launch model's requests (coherence.c) ---- */

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

/* The launch coherence model (coherence.c). uvm__coherence_before_launch
 * runs in stream order just before a launch is written to the device's
 * process, and fails the launch if it fails; uvm__coherence_after_sync
 * runs once every launch queued on (device, stream) has finished
 * (stream UVM_ALL_STREAMS: every stream of the device). */
UVM_HIDDEN uvmError_t uvm__coherence_before_launch(int device, uint32_t stream, const char *kernel);
UVM_HIDDEN uvmError_t uvm__coherence_after_sync(int device, uint32_t stream);
/* uvm__coherence_attach tells the server that the managed allocation at
 * addr is attached (flags) to stream of device (-1, 0: none), as the
 * stream reaches the attachment (uvmStreamAttachMemAsync, memory.c). */
UVM_HIDDEN uvmError_t uvm__coherence_attach(uint64_t addr, unsigned flags, int device, uint32_t stream);
/* uvm__stream_ids names stream's device and its id on the wire (stream.c). */
UVM_HIDDEN uvmError_t uvm__stream_ids(uvmStream_t stream, const char *what, int *device, uint32_t *id);
/* uvm__launch_model reports whether the session runs the launch model. */
UVM_HIDDEN bool uvm__launch_model(void);

/* ---- streams, events, device flags and properties ----
 *
 * device.c owns the device processes and their sockets; stream.c the
 * stream handles, each stream's queue of work and the thread that runs
 * it; event.c the events; props.c properties, peers, memory info and
 * pointer attributes. */

/* uvm__not_ready records msg as the thread's last error message, leaves
 * its last error as it is (as CUDA never records uvmErrorNotReady), and
 * returns uvmErrorNotReady (error.c). */
UVM_HIDDEN uvmError_t uvm__not_ready(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* Errors gathered from several places for one synchronize: the first
 * one's code, and every message. */
struct uvm_errs {
	uvmError_t code;
	char msg[1024];
	size_t len;
};
UVM_HIDDEN void uvm__errs_add(struct uvm_errs *e, uvmError_t code, const char *msg, size_t n);
/* uvm__errs_move adds src's errors to dst and empties src. */
UVM_HIDDEN void uvm__errs_move(struct uvm_errs *dst, struct uvm_errs *src);
/* uvm__errs_result records e's errors as the last error and returns the
 * code (uvmSuccess if none). */
UVM_HIDDEN uvmError_t uvm__errs_result(const struct uvm_errs *e);

/* How a synchronize waits (uvmSetDeviceFlags). */
enum uvm_wait { UVM_WAIT_SPIN, UVM_WAIT_YIELD, UVM_WAIT_BLOCK };
/* uvm__wait_mode is how the program's threads wait for device's work. */
UVM_HIDDEN enum uvm_wait uvm__wait_mode(int device);
/* uvm__wait_pause is one turn of a spinning or yielding wait. */
UVM_HIDDEN void uvm__wait_pause(enum uvm_wait how);
/* uvm__device_new_stream gives out a stream id of device d. */
UVM_HIDDEN uint32_t uvm__device_new_stream(int d);
/* What a launch runs, besides its kernel and params: nthreads threads
 * (uvmLaunchKernel), or a grid (uvmLaunchGrid: grid.c). */
struct uvm_launch_shape {
	bool grid;
	unsigned nthreads;
	uvmDim3 grid_dim, block_dim;
	uint32_t shared, stack, flags; /* the launch-grid message's */
};
/* uvm__launch checks a launch's kernel, params and device, and submits it
 * on stream (NULL and uvmStreamLegacy: device's legacy default stream;
 * uvmStreamPerThread: the thread's) in stream order, as every launch is
 * (stream.c): after the work the legacy order makes it wait for, and
 * refused on a device that failed. what names the API call in errors. */
UVM_HIDDEN uvmError_t uvm__launch(int device, uvmStream_t stream, uintptr_t kernel, const struct uvm_launch_shape *shape, const void *params,
				  size_t paramsSize, const char *what);
/* uvm__device_launch writes a launch on stream of device d, starting the
 * device's process if none runs (device.c). cpu is the launching
 * thread's CPU, which the device's stream thread follows, or -1. */
UVM_HIDDEN uvmError_t uvm__device_launch(int d, uint32_t stream, uintptr_t kernel, const struct uvm_launch_shape *shape, const void *params,
					 size_t n, int cpu);
/* uvm__device_sync waits (how) for the kernels written on stream of
 * device d (UVM_ALL_STREAMS: every stream). A kernel that failed, or the
 * death of the process, fails the device (uvm__device_fail); other
 * errors (a malformed answer; with take_pending, those of destroyed
 * streams) go to *e, while the stream is still held, under e_mu if not
 * NULL, so that a synchronize after this one finds them there. */
UVM_HIDDEN void uvm__device_sync(int d, uint32_t stream, enum uvm_wait how, bool take_pending, struct uvm_errs *e, pthread_mutex_t *e_mu);
/* uvm__device_stream_idle says that no kernel written on stream of d
 * can still be running (none since its last synchronize). */
UVM_HIDDEN bool uvm__device_stream_idle(int d, uint32_t stream);
/* uvm__device_stream_end ends stream in d's process, after what was
 * written on it. */
UVM_HIDDEN void uvm__device_stream_end(int d, uint32_t stream);
/* uvm__device_add_pending adds errors for d's next synchronize. */
UVM_HIDDEN void uvm__device_add_pending(int d, const struct uvm_errs *e);
/* uvm__device_fail records that a launch on device d failed (code, and
 * msg), as it was written or as it ran: the device has failed, as a CUDA
 * context does on a kernel fault. Every later synchronize of it and of
 * its streams, and every event of it, reports the failure, and the
 * device takes no work, until uvmDeviceReset (uvm__device_reset). */
UVM_HIDDEN void uvm__device_fail(int d, uvmError_t code, const char *msg);
/* uvm__device_failure returns device d's failure (uvmSuccess if none),
 * adding its message to *e if e is not NULL. */
UVM_HIDDEN uvmError_t uvm__device_failure(int d, struct uvm_errs *e);
/* uvm__device_reset ends d's process, forgets its errors and flags. */
UVM_HIDDEN void uvm__device_reset(int d);
/* uvm__device_kernel_name names a kernel as launches do ("c:0x..."). */
UVM_HIDDEN void uvm__device_kernel_name(uintptr_t kernel, char *out, size_t cap);

/* The stream's queue (stream.c). stream NULL is the current device's
 * legacy default stream. uvm__stream_enqueue_host queues fn(arg) (a copy
 * of size bytes of it, 16-byte aligned) on stream, to run after the
 * stream's work queued before it, kernels included; its error goes to
 * the stream's next synchronize. With no device at all, fn runs now. */
UVM_HIDDEN uvmError_t uvm__stream_enqueue_host(uvmStream_t stream, const char *what, uvmError_t (*fn)(void *arg), const void *arg, size_t size);
/* uvm__stream_order_host is uvm__stream_enqueue_host for what must take
 * effect in stream order but costs little: on a stream with nothing in
 * flight it runs at once, on the calling thread, and returns fn's error
 * (uvmStreamAttachMemAsync: the next launch on any stream sees it). */
UVM_HIDDEN uvmError_t uvm__stream_order_host(uvmStream_t stream, const char *what, uvmError_t (*fn)(void *arg), const void *arg, size_t size);
/* uvm__stream_device says which device stream belongs to;
 * uvm__stream_lookup also its id in the device's process (0 for the
 * legacy default stream), as launches and synchronizes name it. */
UVM_HIDDEN uvmError_t uvm__stream_device(uvmStream_t stream, const char *what, int *device);
UVM_HIDDEN uvmError_t uvm__stream_lookup(uvmStream_t stream, const char *what, int *device, uint32_t *id);

/* uvm__stream_sync_before waits, as a synchronous call (a copy, a fill)
 * issued on stream does, for the work before it: stream (NULL and
 * uvmStreamLegacy: device's legacy default stream, with every blocking
 * stream of the device; uvmStreamPerThread: the thread's, with the
 * legacy one; device names the device of these handles), then likewise
 * device other's legacy stream (-1: none). Their errors stay for their
 * synchronizes; a device that failed fails the call (what names it),
 * which then must not run. */
UVM_HIDDEN uvmError_t uvm__stream_sync_before(uvmStream_t stream, int device, int other, const char *what);
/* uvm__streams_sync_all waits for every stream of every device, kernels
 * included, leaving their errors for their synchronizes: memory is not
 * freed under work that may use it, as cudaFree synchronizes. */
UVM_HIDDEN void uvm__streams_sync_all(void);
/* uvm__refuse_in_host_fn refuses fn when the calling thread runs the
 * program's host function (uvmErrorNotPermitted): the API may block on
 * the very stream that runs it. */
UVM_HIDDEN uvmError_t uvm__refuse_in_host_fn(const char *fn);
/* A mark (stream.c): a point in a stream's order, complete once the work
 * queued on the stream before it has finished, with the time it did.
 * Events are marks. */
struct uvm_mark;
UVM_HIDDEN void uvm__mark_hold(struct uvm_mark *m);
/* uvm__mark_put lets m go (NULL: nothing). */
UVM_HIDDEN void uvm__mark_put(struct uvm_mark *m);
UVM_HIDDEN bool uvm__mark_done(const struct uvm_mark *m);
UVM_HIDDEN void uvm__mark_wait(struct uvm_mark *m, enum uvm_wait how);
/* uvm__mark_ns is when m completed (CLOCK_MONOTONIC nanoseconds). */
UVM_HIDDEN uint64_t uvm__mark_ns(struct uvm_mark *m);
/* uvm__mark_device is the device of the stream m was placed on. */
UVM_HIDDEN int uvm__mark_device(const struct uvm_mark *m);
/* uvm__mark_forked makes m anew in a fork's child, complete: nothing
 * there would complete it. */
UVM_HIDDEN void uvm__mark_forked(struct uvm_mark *m);
/* uvm__stream_record places a new mark at stream's end (*out, held). */
UVM_HIDDEN uvmError_t uvm__stream_record(uvmStream_t stream, const char *what, struct uvm_mark **out);
/* uvm__stream_wait_mark makes later work on stream wait for m. */
UVM_HIDDEN uvmError_t uvm__stream_wait_mark(uvmStream_t stream, struct uvm_mark *m, const char *what);

/* ---- grids (grid.c: the client's side; block.c and fiber.c: the device's) ---- */

/* A launch-grid message (wire.LaunchGridRequest), as uvm__decode_launch_grid
 * reads it: name and params point into the message. */
struct uvm_launch_grid {
	uint32_t stream;
	uvmDim3 grid, block;
	uint32_t shared, stack, flags;
	const uint8_t *name;
	uint32_t name_len;
	const uint8_t *params;
	uint32_t params_len;
	int32_t cpu;
};
UVM_HIDDEN void uvm__encode_launch_grid(struct uvm_msg *m, uint32_t seq, uint32_t stream, uvmDim3 grid, uvmDim3 block, uint32_t shared,
					uint32_t stack, uint32_t flags, uintptr_t kernel, const void *params, size_t n, int32_t cpu);
/* uvm__decode_launch_grid reads a launch-grid message's payload; false if
 * it is truncated or has trailing bytes. */
UVM_HIDDEN bool uvm__decode_launch_grid(struct uvm_reader *r, struct uvm_launch_grid *lg);
/* uvm__grid_check checks a grid's shape, its shared memory and its stack
 * against the device's limits (core.CheckGrid); NULL if they fit, else
 * what is wrong, in msg. */
UVM_HIDDEN const char *uvm__grid_check(uvmDim3 grid, uvmDim3 block, uint64_t shared, uint64_t stack, char *msg, size_t cap);
/* uvm__max_active_blocks is how many blocks of the shape one worker keeps
 * resident (core.MaxActiveBlocksPerMultiprocessor). */
UVM_HIDDEN int uvm__max_active_blocks(uint64_t block_threads, uint64_t shared);

/* A user-level context (fiber.c): a stack of its own and, while it does
 * not run, what it needs to resume. */
struct uvm_fiber {
#if defined(__x86_64__) && !defined(UVM_FIBER_UCONTEXT)
	void *sp;
#else
	ucontext_t uc;
	void (*entry)(void *);
	void *arg;
#endif
	uint8_t *stack; /* below it, a guard page */
	size_t size;
};
/* uvm__fiber_stack gives f a stack of size bytes (rounded up to pages),
 * keeping the one it has if it is that size; 0 or an errno value. */
UVM_HIDDEN int uvm__fiber_stack(struct uvm_fiber *f, size_t size);
UVM_HIDDEN void uvm__fiber_free_stack(struct uvm_fiber *f);
/* uvm__fiber_make makes f (with a stack) start entry(arg) when first
 * switched to; entry never returns. */
UVM_HIDDEN void uvm__fiber_make(struct uvm_fiber *f, void (*entry)(void *), void *arg);
/* uvm__fiber_switch saves the running context in from (which needs no
 * stack of its own: it may be an OS thread's) and resumes to. */
UVM_HIDDEN void uvm__fiber_switch(struct uvm_fiber *from, struct uvm_fiber *to);

/* What a device process's thread runs, for the crash handler (devproc.c
 * and block.c set it). */
struct uvm_running {
	uintptr_t kernel;
	uint32_t stream, tid, nthreads;
	bool active;
	/* A grid launch's (struct uvm_crash); grid_dim zero otherwise. */
	uint64_t block;
	uvmDim3 grid_dim, block_dim;
};
UVM_HIDDEN extern __thread struct uvm_running uvm__running;

/* A grid launch as a device process runs it (block.c). devproc.c fills in
 * the launch, then runs uvm__grid_work on as many workers as there are
 * blocks (up to its workers), or, for a cooperative grid, each block on
 * an OS thread of its own with uvm__grid_run_block. */
struct uvm_grid {
	uvmGridKernel_t fn;
	const void *params;
	uintptr_t kernel;       /* its address, for crash reports */
	int device;             /* the device's index, for messages */
	uint32_t stream;
	uvmDim3 grid, block;
	uint64_t blocks;        /* in the grid */
	unsigned threads;       /* in a block */
	size_t stack;           /* of each thread but a block's first; 0: the default */
	bool cooperative;
	uint64_t next; /* atomic: the next block a worker takes */
	/* A cooperative grid's barrier: mu (a leaf) guards the rest. */
	pthread_mutex_t mu;
	pthread_cond_t cv;
	uint64_t alive;   /* blocks not finished */
	uint64_t arrived; /* blocks waiting at the barrier */
	uint64_t gen;     /* barriers passed */
};
/* uvm__grid_work runs blocks of g until none is left to take; NULL, or
 * what went wrong. */
UVM_HIDDEN const char *uvm__grid_work(struct uvm_grid *g);
/* uvm__grid_run_block runs block index of a cooperative grid. */
UVM_HIDDEN const char *uvm__grid_run_block(struct uvm_grid *g, uint64_t index);
/* uvm__grid_block_done counts a block of a cooperative grid out of its
 * barrier (finished, or never started). */
UVM_HIDDEN void uvm__grid_block_done(struct uvm_grid *g);
/* uvm__grid_barrier waits until every block of g still running arrives. */
UVM_HIDDEN void uvm__grid_barrier(struct uvm_grid *g);
/* uvm__grid_thread_end frees what the calling thread kept to run blocks. */
UVM_HIDDEN void uvm__grid_thread_end(void);

/* props.c: whether the host may touch managed memory while kernels run
 * (uvmDevAttrConcurrentManagedAccess). */
UVM_HIDDEN int uvm__concurrent_managed_access(void);
/* uvm__forget_pointer_attributes forgets what uvmPointerSetAttribute
 * recorded for the allocation at addr, which is being freed. */
UVM_HIDDEN void uvm__forget_pointer_attributes(uintptr_t addr);
/* A peer-access request (wire.EncodePeerAccess): enable or disable
 * device's access to peer's device memory (props.c). */
UVM_HIDDEN void uvm__encode_peer_access(struct uvm_msg *m, uint32_t seq, int32_t device, int32_t peer, bool enable, uint32_t flags);

#endif /* UVM_INTERNAL_H */
