/*
 * preload.c: libuvm-preload.so, the allocator `uvm run` puts under
 * unmodified programs (LD_PRELOAD).
 *
 * It replaces the C allocator (malloc and its family) and anonymous
 * mmap: requests of at least a threshold (UVM_MIN_SIZE bytes, default
 * 1 MiB) become managed allocations of their own, 2 MiB aligned, whose
 * pages the fault server moves between host memory and the devices.
 * Smaller ones go to the heap (UVM_HEAP): "managed", the default,
 * serves them from jemalloc arenas whose every extent is carved from
 * managed memory (see "the managed heap" below), jemalloc being loaded
 * when the program starts (jemalloc_abi.h: building needs no jemalloc);
 * "system" sends them to glibc's own allocator through its __libc_ names
 * (dlsym(RTLD_NEXT, "malloc") would recurse: dlsym itself allocates).
 *
 * The library is inert until the first large request: nothing connects
 * in a constructor, so a program that never allocates much never talks
 * to a server. If managed memory cannot be had (no server, a device
 * process, an arena out of room), the request goes to the system
 * allocator: silently and counted when the server refuses one request,
 * with one warning line when managed memory cannot be had at all.
 *
 * Recursion: anything that runs inside the library while it serves a
 * managed request (the core's own mmap calls, glibc functions it calls
 * that allocate) must reach the system, never the managed allocator. A
 * thread flag covers the calls this file makes into the core; mmap,
 * munmap and mremap also pass straight through when called from this
 * library's own code (the core maps its buffers, fork copies and
 * reservations outside any call of ours, e.g. in its fork handlers).
 *
 * Misuse mirrors glibc: free() of a pointer in the managed window that is
 * not the start of a live managed allocation (a double free, an interior
 * pointer) prints a line naming the pointer and aborts, as glibc aborts
 * on a double free.
 */
#include "internal.h"

#include <dlfcn.h>
#include <elf.h>
#include <errno.h>
#include <link.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "jemalloc_abi.h"

#define EXPORT __attribute__((visibility("default")))
#define DEFAULT_MIN_SIZE (1ul << 20)

/* glibc's allocator under its own names: these never reach this file. */
extern void *__libc_malloc(size_t n);
extern void *__libc_calloc(size_t k, size_t n);
extern void *__libc_realloc(void *p, size_t n);
extern void __libc_free(void *p);
extern void *__libc_memalign(size_t align, size_t n);

/* ---- state: a threshold, an on/off switch, counters ---- */

enum { STATE_UNSET, STATE_READY };
enum { MODE_ON, MODE_OFF_NO_SERVER, MODE_OFF_DEVICE };

static _Atomic int config_state = STATE_UNSET;
static _Atomic size_t min_size = DEFAULT_MIN_SIZE;
static _Atomic int mode = MODE_ON;
static atomic_flag warned = ATOMIC_FLAG_INIT;

/* Counters, reported at exit with UVM_PRELOAD_STATS=1. */
static _Atomic uint64_t n_managed, managed_bytes, n_fallback, n_managed_freed;

/* in_core is set while this thread runs inside the core on the
 * allocator's behalf: whatever allocates meanwhile gets system memory.
 * initial-exec: a preloaded library's TLS is static, and the default
 * model's __tls_get_addr may itself call malloc. */
static __thread bool in_core __attribute__((tls_model("initial-exec")));

/* say writes one line to standard error without stdio (which allocates). */
__attribute__((format(printf, 1, 2))) static void say(const char *fmt, ...)
{
	char buf[512];
	int n = snprintf(buf, sizeof buf, "libuvm-preload[%d]: ", (int)getpid());
	va_list ap;
	va_start(ap, fmt);
	int k = vsnprintf(buf + n, sizeof buf - (size_t)n - 1, fmt, ap);
	va_end(ap);
	if (k < 0)
		k = 0;
	size_t len = (size_t)n + ((size_t)k < sizeof buf - (size_t)n - 1 ? (size_t)k : sizeof buf - (size_t)n - 2);
	buf[len++] = '\n';
	int saved = errno;
	while (len > 0) {
		ssize_t w = write(2, buf, len);
		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0)
			break;
		memmove(buf, buf + w, len - (size_t)w);
		len -= (size_t)w;
	}
	errno = saved;
}

/* parse_size reads a byte count: digits and an optional unit (K, KiB,
 * KB, M, MiB, MB, G, GiB, GB, B), as `uvm run --min-size` takes them.
 * Returns false for anything else, zero included. */
static bool parse_size(const char *s, size_t *out)
{
	while (*s == ' ' || *s == '\t')
		s++;
	if (*s < '0' || *s > '9')
		return false;
	unsigned long long v = 0;
	for (; *s >= '0' && *s <= '9'; s++) {
		if (v > (~0ull - 9) / 10)
			return false;
		v = v * 10 + (unsigned)(*s - '0');
	}
	while (*s == ' ')
		s++;
	static const struct {
		const char *name;
		unsigned long long mult;
	} units[] = {
		{"", 1},		{"B", 1},		  {"K", 1ull << 10},   {"KiB", 1ull << 10}, {"KB", 1000},
		{"M", 1ull << 20},	{"MiB", 1ull << 20},	  {"MB", 1000000},     {"G", 1ull << 30},   {"GiB", 1ull << 30},
		{"GB", 1000000000ull},
	};
	size_t end = strlen(s);
	while (end > 0 && (s[end - 1] == ' ' || s[end - 1] == '\t'))
		end--;
	for (size_t i = 0; i < sizeof units / sizeof units[0]; i++) {
		if (strlen(units[i].name) == end && strncmp(s, units[i].name, end) == 0) {
			if (v == 0 || v > UVM_MAX_ALLOCATION / units[i].mult)
				return false;
			*out = (size_t)(v * units[i].mult);
			return true;
		}
	}
	return false;
}

extern char **environ;

/* threshold is the smallest request that becomes managed memory. It reads
 * UVM_MIN_SIZE once the environment exists (glibc allocates before it
 * does, while starting up). */
static size_t threshold(void)
{
	if (atomic_load_explicit(&config_state, memory_order_acquire) == STATE_READY)
		return atomic_load_explicit(&min_size, memory_order_relaxed);
	if (!environ)
		return DEFAULT_MIN_SIZE;
	size_t v = DEFAULT_MIN_SIZE;
	const char *env = getenv("UVM_MIN_SIZE");
	bool bad = env && *env && !parse_size(env, &v);
	if (bad)
		v = DEFAULT_MIN_SIZE;
	int expect = STATE_UNSET;
	atomic_store_explicit(&min_size, v, memory_order_relaxed);
	if (atomic_compare_exchange_strong(&config_state, &expect, STATE_READY) && bad)
		say("UVM_MIN_SIZE=\"%s\": want a positive number of bytes such as 1048576, 64KiB or 1MiB; using the default of %lu bytes (1 MiB)", env,
		    DEFAULT_MIN_SIZE);
	return v;
}

/* turn_off stops making managed memory for the rest of the process and
 * says why, once. */
static void turn_off(int why, uvmError_t err)
{
	atomic_store(&mode, why);
	if (atomic_flag_test_and_set(&warned))
		return;
	if (why == MODE_OFF_DEVICE)
		say("this is a device process: large allocations use the system allocator here");
	else
		say("no managed memory (%s: %s): large allocations use the system allocator from now on", uvmGetErrorName(err),
		    uvmGetLastErrorMessage());
}

static void *managed_memory(size_t n, bool count);

/* managed returns n bytes of managed memory, or NULL (counted) when the
 * request should go to the system allocator instead. */
static void *managed(size_t n)
{
	if (in_core)
		return NULL;
	return managed_memory(n, true);
}

/* managed_chunk returns a chunk of n bytes of managed memory for the
 * managed heap, or NULL. It runs in jemalloc's hooks, where in_core may
 * be set by nobody but this file. */
static void *managed_chunk(size_t n)
{
	bool was = in_core;
	void *p = managed_memory(n, false);
	in_core = was;
	return p;
}

/* managed_memory makes a managed allocation of n bytes; count says
 * whether it is one of the program's (counted) or a heap chunk. */
static void *managed_memory(size_t n, bool count)
{
	int m = atomic_load_explicit(&mode, memory_order_relaxed);
	if (m != MODE_ON) {
		atomic_fetch_add_explicit(&n_fallback, 1, memory_order_relaxed);
		if (m == MODE_OFF_DEVICE)
			turn_off(m, uvmSuccess); /* says so once */
		return NULL;
	}
	int saved = errno;
	void *p = NULL;
	in_core = true;
	uvmError_t err = uvm__managed_alloc(&p, n);
	in_core = false;
	if (err == uvmSuccess) {
		errno = saved;
		if (count) {
			atomic_fetch_add_explicit(&n_managed, 1, memory_order_relaxed);
			atomic_fetch_add_explicit(&managed_bytes, n, memory_order_relaxed);
		}
		return p;
	}
	if (count)
		atomic_fetch_add_explicit(&n_fallback, 1, memory_order_relaxed);
	if (err == uvmErrorInitializationError || err == uvmErrorServerGone || err == uvmErrorNotSupported)
		turn_off(MODE_OFF_NO_SERVER, err);
	errno = saved;
	return NULL;
}

/* wants_managed says whether an n-byte request aligned to align goes to
 * managed memory. Managed allocations are 2 MiB aligned. */
static inline bool wants_managed(size_t n, size_t align)
{
	return n >= threshold() && align <= UVM_BLOCK_SIZE && !in_core;
}

/* live_size is the usable size of the managed allocation that starts at
 * p, 0 if there is none. */
static size_t live_size(const void *p)
{
	bool was = in_core;
	in_core = true;
	size_t n = uvm__managed_size(p);
	in_core = was;
	return n;
}

/* misuse reports a pointer in the managed window that is not the start of
 * a live managed allocation, and aborts as glibc does on a double free. */
__attribute__((noreturn)) static void misuse(const char *call, const void *p)
{
	struct uvm_alloc a;
	in_core = true;
	bool inside = uvm__alloc_lookup((uintptr_t)p, &a);
	in_core = false;
	if (inside && a.addr == (uintptr_t)p && a.kind != UVM_KIND_MANAGED) {
		const char *what = a.host_alias ? "registered host memory" : a.kind == UVM_KIND_DEVICE ? "device memory" : "pinned host memory";
		const char *use = a.host_alias ? "uvmHostUnregister" : a.kind == UVM_KIND_DEVICE ? "uvmFree" : "uvmFreeHost";
		say("%s(%p): double free or free of a pointer that is not the start of a managed allocation: it is %s from the C API; release it with %s",
		    call, p, what, use);
	} else if (inside)
		say("%s(%p): double free or free of a pointer that is not the start of a managed allocation: it lies %zu bytes into the managed allocation at %p of %zu bytes",
		    call, p, (size_t)((uintptr_t)p - a.addr), (void *)a.addr, a.size);
	else
		say("%s(%p): double free or free of a pointer that is not the start of a managed allocation: no live allocation holds it (already freed?)", call, p);
	abort();
}

/* release frees the managed allocation at p, which live_size found. */
static void release(const char *call, void *p)
{
	in_core = true;
	uvmError_t err = uvm__release((uintptr_t)p, 1u << UVM_KIND_MANAGED, call);
	in_core = false;
	if (err == uvmErrorInvalidValue)
		misuse(call, p); /* another thread freed it first */
	if (err != uvmSuccess) {
		/* The server is gone: the range is unmapped here all the same. */
		static atomic_flag once = ATOMIC_FLAG_INIT;
		if (!atomic_flag_test_and_set(&once))
			say("%s(%p): %s", call, p, uvmGetLastErrorMessage());
		return;
	}
	atomic_fetch_add_explicit(&n_managed_freed, 1, memory_order_relaxed);
}

/* ---- the managed heap ----
 *
 * Programs allocate mostly in small pieces (an awk's cells, a database's
 * pages, an interpreter's objects): a managed allocation of its own for
 * each would cost 2 MiB of address space and a server round trip apiece.
 * Instead the requests below the threshold go to jemalloc, a real
 * allocator (size classes, thread caches, arenas per CPU), whose extent
 * hooks hand it every extent it asks for: carved, in address order, from
 * chunks of managed memory that grow geometrically (64 MiB, doubling to
 * 1 GiB). So the whole heap is managed, each chunk one managed range.
 *
 * jemalloc was chosen over mimalloc (2.0 in Debian 12) because its hooks
 * are called for every extent of every arena as the heap grows: mimalloc
 * takes a fixed region up front (mi_manage_os_memory) and maps from the
 * system once that is full. memkind's fixed kinds are jemalloc with a
 * fixed region too.
 *
 * Chunks are never returned: jemalloc keeps what it frees (dalloc opts
 * out) and reuses it. What it frees it purges after a short decay
 * (HEAP_DIRTY_DECAY_MS; jemalloc's MALLOC_CONF dirty_decay_ms overrides
 * it): its forced purge hook asks the server to discard the pages
 * (uvm__discard), so that freed memory takes no room under the host
 * budget and eviction never copies it, and they read as zeros after.
 * Without it a program's garbage was evicted and brought back like live
 * data, and its managed footprint outgrew its peak. Fresh chunk memory
 * reads as zeros, so extents are handed out zeroed.
 *
 * free() tells the three kinds of pointer apart by address: outside the
 * managed window they are glibc's; inside, a chunk's are jemalloc's, the
 * rest are managed allocations of their own. The chunk table only grows,
 * and is read without a lock: an entry is written before the count that
 * publishes it.
 *
 * Lock order: jemalloc's own locks, then heap_mu (the hooks run under
 * jemalloc's arena locks), then the core's (a chunk is a managed
 * allocation). The core allocates from glibc (in_core) while serving. */

enum { HEAP_SYSTEM, HEAP_MANAGED };
static _Atomic int heap_kind = -1; /* -1: UVM_HEAP not read yet */

/* heap says where requests below the threshold go, reading UVM_HEAP
 * once the environment exists. */
static int heap(void)
{
	int k = atomic_load_explicit(&heap_kind, memory_order_acquire);
	if (k >= 0)
		return k;
	if (!environ)
		return HEAP_SYSTEM;
	k = HEAP_MANAGED;
	const char *env = getenv("UVM_HEAP");
	bool bad = env && *env && strcmp(env, "managed") != 0 && strcmp(env, "system") != 0;
	if (env && strcmp(env, "system") == 0)
		k = HEAP_SYSTEM;
	int expect = -1;
	if (atomic_compare_exchange_strong(&heap_kind, &expect, k)) {
		if (bad)
			say("UVM_HEAP=\"%s\": want \"managed\" or \"system\"; using \"%s\"", env, k == HEAP_MANAGED ? "managed" : "system");
	}
	return atomic_load(&heap_kind);
}

/* jemalloc's, once it is loaded (before the program has threads): its
 * own mappings (metadata, and anything outside the managed heap's hooks)
 * stay ordinary memory too. */
static uintptr_t je_text_start, je_text_end;

static void text_of(const void *fn, uintptr_t *start, uintptr_t *end);
static void *sys_mmap(void *addr, size_t len, int prot, int flags, int fd, off_t off);

#define MAX_CHUNKS 256
#define HEAP_DIRTY_DECAY_MS 1000
#define FIRST_CHUNK (64ul << 20)
#define LARGEST_CHUNK (1ul << 30)

/* used: how much of the chunk was ever handed out (guarded by heap_mu).
 * A fork copies only that much for the child; the rest reads as zeros.
 * live: a bit per 8 bytes (jemalloc's smallest alignment), set for each
 * address malloc returned and not yet freed. jemalloc as Debian builds
 * it does not notice a double free (it would hand the object out twice),
 * where glibc aborts: the bits make a double free, or a free of a pointer
 * malloc never returned, abort here too. Ordinary memory, reserved with
 * the chunk (1/64 of its size) and touched only where the heap is. */
static struct {
	uintptr_t start, end, used;
	_Atomic uint64_t *live;
} chunks[MAX_CHUNKS];
static _Atomic int nchunks;
/* Counters, reported with the others. */
static _Atomic uint64_t chunk_bytes, n_purges, purged_bytes;

/* chunk_of returns the index of the chunk holding p, -1 if none. */
static inline int chunk_of(uintptr_t p)
{
	int n = atomic_load_explicit(&nchunks, memory_order_acquire);
	for (int i = n - 1; i >= 0; i--) /* the newest is the largest */
		if (p >= chunks[i].start && p < chunks[i].end)
			return i;
	return -1;
}

/* heap_owns says whether p lies in a chunk of the managed heap. */
static inline bool heap_owns(uintptr_t p) { return chunk_of(p) >= 0; }

/* heap_mark records that malloc returned p, which lies in chunk i. */
static void heap_mark(int i, uintptr_t p)
{
	size_t g = (p - chunks[i].start) / 8;
	atomic_fetch_or_explicit(&chunks[i].live[g / 64], 1ull << (g % 64), memory_order_relaxed);
}

/* heap_unmark records that p, in chunk i, is freed, and says whether it
 * was live. */
static bool heap_unmark(int i, uintptr_t p)
{
	if (p % 8 != 0)
		return false;
	size_t g = (p - chunks[i].start) / 8;
	uint64_t bit = 1ull << (g % 64);
	return atomic_fetch_and_explicit(&chunks[i].live[g / 64], ~bit, memory_order_relaxed) & bit;
}

/* heap_misuse reports a free of heap memory that is not live, and aborts
 * as glibc does on a double free. */
__attribute__((noreturn)) static void heap_misuse(const char *call, const void *p)
{
	say("%s(%p): double free, or a pointer that malloc did not return (in the managed heap)", call, p);
	abort();
}

static pthread_mutex_t heap_mu = PTHREAD_MUTEX_INITIALIZER;
static uintptr_t bump, bump_start, bump_end; /* the last chunk's; guarded by heap_mu */
static size_t next_chunk = FIRST_CHUNK; /* guarded by heap_mu */

static uintptr_t align_up(uintptr_t p, size_t a) { return (p + a - 1) & ~(uintptr_t)(a - 1); }

static void *heap_extent_alloc(je_extent_hooks_t *h, void *new_addr, size_t size, size_t alignment, bool *zero, bool *commit, unsigned arena)
{
	(void)h, (void)arena;
	if (alignment < UVM_PAGE_SIZE)
		alignment = UVM_PAGE_SIZE;
	pthread_mutex_lock(&heap_mu);
	uintptr_t p = align_up(bump, alignment);
	if (new_addr && (uintptr_t)new_addr != p)
		goto fail; /* growing an extent in place: only at the bump pointer */
	if (!bump || p + size > bump_end || p + size < p) {
		if (new_addr)
			goto fail;
		size_t n = next_chunk;
		if (size > SIZE_MAX - alignment - UVM_BLOCK_SIZE)
			goto fail;
		size_t want = (size + alignment + UVM_BLOCK_SIZE - 1) & ~(UVM_BLOCK_SIZE - 1);
		if (want > n)
			n = want;
		if (atomic_load_explicit(&nchunks, memory_order_relaxed) == MAX_CHUNKS)
			goto fail;
		void *live = sys_mmap(NULL, n / 64, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
		if (live == MAP_FAILED)
			goto fail;
		void *c = managed_chunk(n);
		if (!c) {
			syscall(SYS_munmap, live, n / 64);
			goto fail;
		}
		int i = atomic_load_explicit(&nchunks, memory_order_relaxed);
		chunks[i].live = live;
		chunks[i].start = (uintptr_t)c;
		chunks[i].end = (uintptr_t)c + n;
		atomic_store_explicit(&nchunks, i + 1, memory_order_release);
		atomic_fetch_add_explicit(&chunk_bytes, n, memory_order_relaxed);
		/* What is left of the old chunk stays unused: address space,
		 * never touched, costs nothing. */
		bump = bump_start = (uintptr_t)c;
		bump_end = bump + n;
		if (next_chunk < LARGEST_CHUNK)
			next_chunk *= 2;
		p = align_up(bump, alignment);
	}
	bump = p + size;
	chunks[atomic_load_explicit(&nchunks, memory_order_relaxed) - 1].used = bump - bump_start;
	pthread_mutex_unlock(&heap_mu);
	*zero = true; /* never handed out before: fresh managed memory */
	*commit = true;
	return (void *)p;
fail:
	pthread_mutex_unlock(&heap_mu);
	return NULL;
}

/* Returning true opts out: jemalloc keeps the extent and reuses it. */
static bool heap_extent_dalloc(je_extent_hooks_t *h, void *addr, size_t size, bool committed, unsigned arena)
{
	(void)h, (void)addr, (void)size, (void)committed, (void)arena;
	return true;
}

static void heap_extent_destroy(je_extent_hooks_t *h, void *addr, size_t size, bool committed, unsigned arena)
{
	(void)h, (void)addr, (void)size, (void)committed, (void)arena;
}

/* Managed memory is always committed: committing succeeds, decommitting
 * is refused (true), and jemalloc keeps the pages as they are. */
static bool heap_extent_commit(je_extent_hooks_t *h, void *addr, size_t size, size_t off, size_t len, unsigned arena)
{
	(void)h, (void)addr, (void)size, (void)off, (void)len, (void)arena;
	return false;
}

static bool heap_extent_decommit(je_extent_hooks_t *h, void *addr, size_t size, size_t off, size_t len, unsigned arena)
{
	(void)h, (void)addr, (void)size, (void)off, (void)len, (void)arena;
	return true;
}

static bool heap_extent_split(je_extent_hooks_t *h, void *addr, size_t size, size_t a, size_t b, bool committed, unsigned arena)
{
	(void)h, (void)addr, (void)size, (void)a, (void)b, (void)committed, (void)arena;
	return false;
}

/* Extents merge only within a chunk: two chunks may be neighbours in the
 * window, but each is a managed allocation of its own. */
static bool heap_extent_merge(je_extent_hooks_t *h, void *a, size_t na, void *b, size_t nb, bool committed, unsigned arena)
{
	(void)h, (void)na, (void)nb, (void)committed, (void)arena;
	int i = chunk_of((uintptr_t)a);
	return i < 0 || i != chunk_of((uintptr_t)b);
}

/* heap_extent_purge is the forced purge: the server drops every copy of
 * the pages, which then read as zeros (false: purged). Refused (true,
 * jemalloc keeps the bytes) where they are not managed memory of this
 * process: in a child of fork, whose chunks are copies in ordinary memory,
 * or with no server. */
static bool heap_extent_purge(je_extent_hooks_t *h, void *addr, size_t size, size_t off, size_t len, unsigned arena)
{
	(void)h, (void)size, (void)arena;
	uintptr_t p = (uintptr_t)addr + off;
	if (len == 0 || p % UVM_PAGE_SIZE != 0 || len % UVM_PAGE_SIZE != 0 || atomic_load_explicit(&mode, memory_order_relaxed) != MODE_ON)
		return true;
	bool was = in_core;
	in_core = true;
	struct uvm_alloc a;
	bool ours = uvm__alloc_lookup(p, &a) && !a.forked && a.kind == UVM_KIND_MANAGED && p + len <= a.addr + a.length;
	uvmError_t err = ours ? uvm__discard(p, len, "the managed heap's purge") : uvmErrorInvalidValue;
	in_core = was;
	if (err != uvmSuccess)
		return true;
	atomic_fetch_add_explicit(&n_purges, 1, memory_order_relaxed);
	atomic_fetch_add_explicit(&purged_bytes, len, memory_order_relaxed);
	return false;
}

static je_extent_hooks_t heap_hooks = {
	.alloc = heap_extent_alloc,
	.dalloc = heap_extent_dalloc,
	.destroy = heap_extent_destroy,
	.commit = heap_extent_commit,
	.decommit = heap_extent_decommit,
	.purge_forced = heap_extent_purge,
	.split = heap_extent_split,
	.merge = heap_extent_merge,
};

static void heap_before_fork(void) { pthread_mutex_lock(&heap_mu); }
static void heap_after_fork(void) { pthread_mutex_unlock(&heap_mu); }

/* heap_fork_used is the core's uvm__fork_used: how much of the managed
 * allocation at addr a fork must copy. Called with heap_mu held (the
 * core's prepare handler runs after heap_before_fork). */
static size_t heap_fork_used(uintptr_t addr, size_t length)
{
	int n = atomic_load_explicit(&nchunks, memory_order_relaxed);
	for (int i = 0; i < n; i++)
		if (chunks[i].start == addr)
			return (chunks[i].used + UVM_PAGE_SIZE - 1) & ~(size_t)(UVM_PAGE_SIZE - 1);
	return length;
}

/* jemalloc, loaded by je_open. */
static je_mallocx_t *jem_mallocx;
static je_rallocx_t *jem_rallocx;
static je_dallocx_t *jem_dallocx;
static je_sallocx_t *jem_sallocx;
static je_mallctl_t *jem_mallctl;

enum { JE_UNLOADED, JE_UNSET, JE_STARTING, JE_READY, JE_FAILED };
static _Atomic int je_state = JE_UNLOADED;

/* je_open loads jemalloc (UVM_JEMALLOC, a name for the loader or a path,
 * else libjemalloc.so.2) and looks up what the heap uses. It returns
 * jemalloc's version, or NULL with why it cannot be had and what would
 * fix that written into why and fix. in_core is set by the caller: what
 * the loader and jemalloc allocate as it starts is the system's. */
static const char *je_open(char *why, size_t nwhy, char *fix, size_t nfix)
{
	const char *name = getenv("UVM_JEMALLOC");
	if (!name || !*name)
		name = JE_LIBRARY;
	void *h = dlopen(name, RTLD_NOW | RTLD_LOCAL);
	if (!h) {
		const char *err = dlerror();
		snprintf(why, nwhy, "cannot load %s (%s)", name, err ? err : "no reason given");
		if (err && strstr(err, "static TLS"))
			snprintf(fix, nfix, "set GLIBC_TUNABLES=glibc.rtld.optional_static_tls=16384, as uvm run does, which makes room");
		else
			snprintf(fix, nfix, "install jemalloc: apt-get install libjemalloc2");
		return NULL;
	}
	jem_mallocx = (je_mallocx_t *)dlsym(h, "mallocx");
	jem_rallocx = (je_rallocx_t *)dlsym(h, "rallocx");
	jem_dallocx = (je_dallocx_t *)dlsym(h, "dallocx");
	jem_sallocx = (je_sallocx_t *)dlsym(h, "sallocx");
	jem_mallctl = (je_mallctl_t *)dlsym(h, "mallctl");
	if (!jem_mallocx || !jem_rallocx || !jem_dallocx || !jem_sallocx || !jem_mallctl) {
		snprintf(why, nwhy, "%s is not jemalloc: it lacks mallocx, rallocx, dallocx, sallocx or mallctl", name);
		snprintf(fix, nfix, "install jemalloc 5 (apt-get install libjemalloc2), or set UVM_JEMALLOC to its libjemalloc.so.2");
		return NULL;
	}
	const char *version = NULL;
	size_t sz = sizeof version;
	if (jem_mallctl("version", (void *)&version, &sz, NULL, 0) != 0 || !je_supported(version)) {
		snprintf(why, nwhy, "%s is jemalloc %s, whose extent hooks are not jemalloc 5's", name, version ? version : "of no known version");
		snprintf(fix, nfix, "install jemalloc 5 (apt-get install libjemalloc2), or set UVM_JEMALLOC to its libjemalloc.so.2");
		return NULL;
	}
	return version;
}

/* je_load loads jemalloc, from the constructor, when the heap is
 * managed. Loaded with dlopen, not linked: its constructor and fork
 * handlers must come after the core's, so that a fork takes jemalloc's
 * locks before the core copies managed memory for the child (prepare
 * handlers run last registered first), and a program that never asks for
 * the managed heap never has it in its address space. */
static void je_load(void)
{
	if (heap() != HEAP_MANAGED)
		return;
	pthread_atfork(heap_before_fork, heap_after_fork, heap_after_fork);
	char why[320], fix[160];
	in_core = true;
	const char *version = je_open(why, sizeof why, fix, sizeof fix);
	in_core = false;
	if (!version) {
		say("UVM_HEAP=managed: %s: allocations below the threshold use the system allocator (%s)", why, fix);
		atomic_store(&heap_kind, HEAP_SYSTEM);
		return;
	}
	text_of((void *)jem_mallocx, &je_text_start, &je_text_end);
	uvm__fork_used = heap_fork_used;
	atomic_store_explicit(&je_state, JE_UNSET, memory_order_release);
}

/* heap_probe answers UVM_PRELOAD_PROBE=heap, which `uvm run` (and `uvm
 * doctor`) set on a process started only to ask, before the program
 * runs, whether the managed heap can be had in this environment: one
 * line on standard output, "managed<TAB>VERSION" or
 * "system<TAB>WHY<TAB>FIX", then the process ends before its main. So
 * the loader that answers is the one the program gets, and `uvm run` can
 * say once, for every process of the run, what is missing. */
static void heap_probe(void)
{
	char why[320], fix[160], line[512];
	in_core = true;
	const char *version = je_open(why, sizeof why, fix, sizeof fix);
	int n = version ? snprintf(line, sizeof line, "managed\t%s\n", version) : snprintf(line, sizeof line, "system\t%s\t%s\n", why, fix);
	if (n > (int)sizeof line - 1)
		n = (int)sizeof line - 1;
	for (int off = 0; off < n;) {
		ssize_t w = write(1, line + off, (size_t)(n - off));
		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0)
			break;
		off += (int)w;
	}
	_exit(0);
}

/* The heap's arenas: jemalloc's own (automatic) arenas may hold memory
 * from before the hooks could be set (jemalloc starts when it is loaded),
 * so the heap makes arenas of its own, one per CPU, whose every extent
 * comes from the hooks, and names one in each request. Threads take them
 * in turn. */
#define MAX_HEAP_ARENAS 64
static unsigned heap_arenas[MAX_HEAP_ARENAS];
static unsigned nheap_arenas;
static _Atomic unsigned next_heap_arena;
static __thread int thread_heap_arena __attribute__((tls_model("initial-exec"))) = -1;

/* je_start makes the heap's arenas. Until it is done (and if it fails)
 * small requests go to glibc: jemalloc hands out nothing that did not
 * come from a chunk. */
static bool je_start(void)
{
	int s = atomic_load_explicit(&je_state, memory_order_acquire);
	if (s == JE_READY)
		return true;
	if (s != JE_UNSET)
		return false; /* not loaded, failed, or being started */
	int expect = JE_UNSET;
	if (!atomic_compare_exchange_strong(&je_state, &expect, JE_STARTING))
		return false; /* another thread is starting it: glibc meanwhile */
	/* Freed pages are purged (discarded) after a second, not jemalloc's
	 * ten: under a budget, every second they stay is room taken from
	 * live data. A purge is a server round trip per run of pages, which
	 * the decay spreads out. MALLOC_CONF's dirty_decay_ms wins. */
	const char *conf = getenv("MALLOC_CONF");
	if (!conf || !strstr(conf, "dirty_decay_ms")) {
		ssize_t decay = HEAP_DIRTY_DECAY_MS;
		jem_mallctl("arenas.dirty_decay_ms", NULL, NULL, &decay, sizeof decay);
	}
	long cpus = sysconf(_SC_NPROCESSORS_ONLN);
	unsigned want = cpus < 1 ? 1 : cpus > MAX_HEAP_ARENAS ? MAX_HEAP_ARENAS : (unsigned)cpus;
	je_extent_hooks_t *hooks = &heap_hooks;
	int err = 0;
	while (nheap_arenas < want) {
		unsigned ind;
		size_t sz = sizeof ind;
		if ((err = jem_mallctl("arenas.create", &ind, &sz, &hooks, sizeof hooks)) != 0)
			break;
		heap_arenas[nheap_arenas++] = ind;
	}
	if (nheap_arenas == 0) {
		say("jemalloc cannot make the managed heap's arenas (%s): allocations below the threshold use the system allocator", strerror(err));
		atomic_store(&je_state, JE_FAILED);
		return false;
	}
	atomic_store_explicit(&je_state, JE_READY, memory_order_release);
	return true;
}

/* heap_flags are mallocx's flags for this thread's arena. */
static int heap_flags(void)
{
	if (thread_heap_arena < 0)
		thread_heap_arena = (int)heap_arenas[atomic_fetch_add_explicit(&next_heap_arena, 1, memory_order_relaxed) % nheap_arenas];
	return JE_MALLOCX_ARENA((unsigned)thread_heap_arena);
}

/* small_alloc serves a request below the threshold from the managed heap,
 * or returns NULL for the system allocator to serve it. */
static void *small_alloc(size_t n, size_t align, bool zero)
{
	if (in_core || atomic_load_explicit(&mode, memory_order_relaxed) != MODE_ON || heap() != HEAP_MANAGED || !je_start())
		return NULL;
	int flags = heap_flags() | (zero ? JE_MALLOCX_ZERO : 0) | (align > 16 ? JE_MALLOCX_ALIGN(align) : 0);
	int saved = errno;
	void *p = jem_mallocx(n ? n : 1, flags);
	errno = saved;
	if (!p)
		return NULL;
	int i = chunk_of((uintptr_t)p);
	if (i < 0) {
		/* Never expected: every extent of the heap's arenas is a
		 * chunk's. Given back rather than have free() misroute it. */
		jem_dallocx(p, 0);
		return NULL;
	}
	heap_mark(i, (uintptr_t)p);
	return p;
}

/* small_free frees heap memory that heap_unmark found live. */
static void small_free(void *p) { jem_dallocx(p, 0); }
static size_t small_size(void *p) { return jem_sallocx(p, 0); }
/* A resize within the heap stays there: jemalloc's new extents, if it
 * needs any, come from the chunks too. */
static void *heap_rallocx(void *p, size_t n) { return jem_rallocx(p, n, heap_flags()); }

/* ---- the C allocator ---- */

EXPORT void *malloc(size_t n)
{
	void *p = wants_managed(n, 1) ? managed(n) : small_alloc(n, 1, false);
	return p ? p : __libc_malloc(n);
}

EXPORT void *calloc(size_t k, size_t n)
{
	size_t total;
	if (__builtin_mul_overflow(k, n, &total)) {
		errno = ENOMEM;
		return NULL;
	}
	/* Fresh managed memory reads as zeros. */
	void *p = wants_managed(total, 1) ? managed(total) : small_alloc(total, 1, true);
	return p ? p : __libc_calloc(k, n);
}

EXPORT void free(void *p)
{
	if (!p)
		return;
	if (!uvm__in_window((uintptr_t)p)) {
		__libc_free(p);
		return;
	}
	int i = chunk_of((uintptr_t)p);
	if (i >= 0) {
		if (!heap_unmark(i, (uintptr_t)p))
			heap_misuse("free", p);
		small_free(p);
		return;
	}
	if (live_size(p) == 0)
		misuse("free", p);
	release("free", p);
}

static size_t (*sys_usable_size)(void *);

/* system_usable_size is glibc's malloc_usable_size, which glibc exports
 * under no other name. dlsym is safe here: it may allocate, but never
 * calls malloc_usable_size or realloc. */
static size_t system_usable_size(void *p)
{
	size_t (*f)(void *) = __atomic_load_n(&sys_usable_size, __ATOMIC_ACQUIRE);
	if (!f) {
		f = (size_t (*)(void *))dlsym(RTLD_NEXT, "malloc_usable_size");
		if (!f)
			return 0;
		__atomic_store_n(&sys_usable_size, f, __ATOMIC_RELEASE);
	}
	return f(p);
}

EXPORT size_t malloc_usable_size(void *p)
{
	if (!p)
		return 0;
	if (heap_owns((uintptr_t)p))
		return small_size(p);
	if (uvm__in_window((uintptr_t)p))
		return live_size(p);
	return system_usable_size(p);
}

/* heap_realloc resizes p, from chunk i of the managed heap: within the
 * heap while the size stays below the threshold, else to a managed
 * allocation of its own (or wherever memory can be had). */
static void *heap_realloc(int i, void *p, size_t n)
{
	if (!heap_unmark(i, (uintptr_t)p))
		heap_misuse("realloc", p);
	if (n == 0) {
		small_free(p); /* as glibc: realloc(p, 0) frees p and returns NULL */
		return NULL;
	}
	size_t old = small_size(p);
	if (!wants_managed(n, 1)) {
		int saved = errno;
		void *q = in_core ? NULL : heap_rallocx(p, n);
		errno = saved;
		if (q) {
			heap_mark(chunk_of((uintptr_t)q), (uintptr_t)q);
			return q;
		}
	}
	void *q = wants_managed(n, 1) ? managed(n) : NULL;
	if (!q)
		q = __libc_malloc(n);
	if (!q) {
		heap_mark(i, (uintptr_t)p);
		return NULL; /* p is left as it was, as realloc leaves it */
	}
	memcpy(q, p, old < n ? old : n);
	small_free(p);
	return q;
}

EXPORT void *realloc(void *p, size_t n)
{
	if (!p)
		return malloc(n);
	if (!uvm__in_window((uintptr_t)p)) {
		if (n == 0 || !wants_managed(n, 1))
			return __libc_realloc(p, n);
		/* Small to managed: a copy. */
		void *q = managed(n);
		if (!q)
			return __libc_realloc(p, n);
		size_t old = system_usable_size(p);
		memcpy(q, p, old < n ? old : n);
		__libc_free(p);
		return q;
	}
	int i = chunk_of((uintptr_t)p);
	if (i >= 0)
		return heap_realloc(i, p, n);
	size_t old = live_size(p);
	if (old == 0)
		misuse("realloc", p);
	if (n == 0) {
		/* As glibc: realloc(p, 0) frees p and returns NULL. */
		release("realloc", p);
		return NULL;
	}
	if (n <= old && n >= threshold())
		return p; /* shrinking, or growing within the last page: in place */
	void *q = n >= threshold() ? managed(n) : small_alloc(n, 1, false);
	if (!q)
		q = __libc_malloc(n);
	if (!q)
		return NULL; /* p is left as it was, as realloc leaves it */
	memcpy(q, p, old < n ? old : n);
	release("realloc", p);
	return q;
}

EXPORT void *reallocarray(void *p, size_t k, size_t n)
{
	size_t total;
	if (__builtin_mul_overflow(k, n, &total)) {
		errno = ENOMEM;
		return NULL;
	}
	return realloc(p, total);
}

static bool power_of_two(size_t a) { return a != 0 && (a & (a - 1)) == 0; }

/* aligned returns n bytes aligned to align (a power of two). */
static void *aligned(size_t align, size_t n)
{
	void *p = wants_managed(n, align) ? managed(n) : small_alloc(n, align, false);
	return p ? p : __libc_memalign(align, n);
}

EXPORT int posix_memalign(void **out, size_t align, size_t n)
{
	if (!power_of_two(align) || align % sizeof(void *) != 0)
		return EINVAL;
	int saved = errno;
	void *p = aligned(align, n);
	if (!p) {
		errno = saved;
		return ENOMEM;
	}
	*out = p;
	return 0;
}

static void *(*sys_aligned_alloc)(size_t, size_t);

EXPORT void *aligned_alloc(size_t align, size_t n)
{
	if (!power_of_two(align)) {
		/* What glibc does with such an alignment depends on its
		 * version: up to 2.37 aligned_alloc is memalign, which rounds
		 * it up; 2.38 and later fail with EINVAL. Ask glibc's own (dlsym
		 * as for malloc_usable_size: it may allocate, never calls
		 * aligned_alloc). */
		void *(*f)(size_t, size_t) = __atomic_load_n(&sys_aligned_alloc, __ATOMIC_ACQUIRE);
		if (!f) {
			f = (void *(*)(size_t, size_t))dlsym(RTLD_NEXT, "aligned_alloc");
			if (!f) {
				errno = EINVAL;
				return NULL;
			}
			__atomic_store_n(&sys_aligned_alloc, f, __ATOMIC_RELEASE);
		}
		return f(align, n);
	}
	return aligned(align, n);
}

EXPORT void *memalign(size_t align, size_t n)
{
	/* As glibc: an alignment that is not a power of two is rounded up. */
	if (align > UVM_BLOCK_SIZE || !power_of_two(align))
		return __libc_memalign(align, n);
	return aligned(align, n);
}

EXPORT void *valloc(size_t n) { return aligned((size_t)sysconf(_SC_PAGESIZE), n); }

EXPORT void *pvalloc(size_t n)
{
	size_t page = (size_t)sysconf(_SC_PAGESIZE), rounded;
	if (__builtin_add_overflow(n, page - 1, &rounded)) {
		errno = ENOMEM;
		return NULL;
	}
	rounded &= ~(page - 1);
	return aligned(page, rounded ? rounded : page);
}

/* ---- mmap, munmap, mremap ---- */

/* The executable part of this library: calls from there (the core) pass
 * straight to the kernel. */
static uintptr_t text_start, text_end;
static pthread_once_t text_once = PTHREAD_ONCE_INIT;

/* text_of finds the executable part of the object holding fn. */
static void text_of(const void *fn, uintptr_t *start, uintptr_t *end)
{
	Dl_info info;
	if (!dladdr(fn, &info) || !info.dli_fbase)
		return;
	const ElfW(Ehdr) *eh = info.dli_fbase;
	const ElfW(Phdr) *ph = (const ElfW(Phdr) *)((const char *)eh + eh->e_phoff);
	uintptr_t base = (uintptr_t)info.dli_fbase, lo = UINTPTR_MAX, hi = 0;
	for (int i = 0; i < eh->e_phnum; i++) {
		if (ph[i].p_type == PT_LOAD && (ph[i].p_flags & PF_X)) {
			/* A shared object's addresses are relative to its base. */
			uintptr_t s = base + ph[i].p_vaddr, e = s + ph[i].p_memsz;
			lo = s < lo ? s : lo;
			hi = e > hi ? e : hi;
		}
	}
	if (lo < hi)
		*start = lo, *end = hi;
}

static void find_text(void) { text_of((void *)&find_text, &text_start, &text_end); }

static bool from_library(const void *caller)
{
	pthread_once(&text_once, find_text);
	uintptr_t c = (uintptr_t)caller;
	return (c >= text_start && c < text_end) || (c >= je_text_start && c < je_text_end);
}

static void *sys_mmap(void *addr, size_t len, int prot, int flags, int fd, off_t off)
{
	long r = syscall(SYS_mmap, addr, len, prot, flags, fd, off);
	return (void *)r; /* syscall() returns -1 with errno set: MAP_FAILED */
}

/* Tails of managed allocations the program unmapped (munmap or an
 * mremap that shrank): the allocation keeps its pages, and a later munmap
 * of what is left frees it. Rare, so a small table under a lock. */
#define MAX_TRIMMED 256
static struct {
	uintptr_t addr;
	size_t length;
} trimmed[MAX_TRIMMED];
static pthread_mutex_t trimmed_mu = PTHREAD_MUTEX_INITIALIZER;

/* mapped_length is how much of the allocation at addr (length bytes) the
 * program still has mapped. */
static size_t mapped_length(uintptr_t addr, size_t length)
{
	size_t n = length;
	pthread_mutex_lock(&trimmed_mu);
	for (int i = 0; i < MAX_TRIMMED; i++)
		if (trimmed[i].addr == addr)
			n = trimmed[i].length;
	pthread_mutex_unlock(&trimmed_mu);
	return n;
}

/* set_mapped_length records that only length bytes of the allocation at
 * addr stay mapped (length 0: forget it). */
static void set_mapped_length(uintptr_t addr, size_t length)
{
	pthread_mutex_lock(&trimmed_mu);
	int slot = -1;
	for (int i = 0; i < MAX_TRIMMED; i++) {
		if (trimmed[i].addr == addr) {
			slot = i;
			break;
		}
		if (slot < 0 && trimmed[i].addr == 0)
			slot = i;
	}
	if (slot >= 0) {
		trimmed[slot].addr = length ? addr : 0;
		trimmed[slot].length = length;
	}
	pthread_mutex_unlock(&trimmed_mu);
}

/* Flags an anonymous mapping may have and still become managed memory:
 * thread stacks (MAP_STACK), huge pages, locked, growsdown and 32-bit
 * mappings keep their own semantics. */
#define MANAGEABLE_FLAGS (MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_POPULATE)

EXPORT void *mmap(void *addr, size_t len, int prot, int flags, int fd, off_t off)
{
	(void)addr; /* a hint: managed memory lives in its window */
	if ((flags & (MAP_PRIVATE | MAP_ANONYMOUS)) == (MAP_PRIVATE | MAP_ANONYMOUS) && !(flags & ~MANAGEABLE_FLAGS) &&
	    prot == (PROT_READ | PROT_WRITE) && wants_managed(len, 1) && !from_library(__builtin_return_address(0))) {
		void *p = managed(len);
		if (p) {
			set_mapped_length((uintptr_t)p, 0);
			return p;
		}
	}
	return sys_mmap(addr, len, prot, flags, fd, off);
}

EXPORT void *mmap64(void *addr, size_t len, int prot, int flags, int fd, off_t off) __attribute__((alias("mmap")));

/* managed_range finds the managed allocation holding p for munmap and
 * mremap; false if p is not managed memory of this process. */
static bool managed_range(const void *p, struct uvm_alloc *a)
{
	bool was = in_core;
	in_core = true;
	bool ok = uvm__alloc_lookup((uintptr_t)p, a) && a->kind == UVM_KIND_MANAGED && !a->host_alias;
	in_core = was;
	return ok;
}

static size_t page_round(size_t n) { return (n + UVM_PAGE_SIZE - 1) & ~(UVM_PAGE_SIZE - 1); }

EXPORT int munmap(void *addr, size_t len)
{
	struct uvm_alloc a;
	if (!uvm__in_window((uintptr_t)addr) || in_core || from_library(__builtin_return_address(0)) || !managed_range(addr, &a))
		return (int)syscall(SYS_munmap, addr, len);
	uintptr_t p = (uintptr_t)addr, end = p + page_round(len);
	size_t mapped = mapped_length(a.addr, a.length);
	if (p % UVM_PAGE_SIZE != 0 || len == 0) {
		errno = EINVAL;
		return -1;
	}
	if (p == a.addr && end >= a.addr + mapped) {
		set_mapped_length(a.addr, 0);
		release("munmap", addr);
		return 0;
	}
	if (p > a.addr && end >= a.addr + mapped) {
		/* The tail: the pages stay reserved with the allocation, which
		 * a munmap of the rest frees. */
		if (p < a.addr + mapped)
			set_mapped_length(a.addr, p - a.addr);
		return 0;
	}
	say("munmap(%p, %zu): unmapping the head or the middle of managed memory (the allocation at %p of %zu bytes) is not supported; unmap all of it, or a tail",
	    addr, len, (void *)a.addr, mapped);
	errno = EINVAL;
	return -1;
}

EXPORT void *mremap(void *old, size_t old_len, size_t new_len, int flags, ...)
{
	void *new_addr = NULL;
	if (flags & MREMAP_FIXED) {
		va_list ap;
		va_start(ap, flags);
		new_addr = va_arg(ap, void *);
		va_end(ap);
	}
	struct uvm_alloc a;
	if (!uvm__in_window((uintptr_t)old) || in_core || from_library(__builtin_return_address(0)) || !managed_range(old, &a))
		return (void *)syscall(SYS_mremap, old, old_len, new_len, flags, new_addr);
	size_t mapped = mapped_length(a.addr, a.length);
	if ((uintptr_t)old != a.addr || (flags & (MREMAP_FIXED | MREMAP_DONTUNMAP)) || new_len == 0) {
		say("mremap(%p, %zu, %zu, %#x): managed memory can only be resized from its start (%p), without MREMAP_FIXED or MREMAP_DONTUNMAP",
		    old, old_len, new_len, (unsigned)flags, (void *)a.addr);
		errno = EINVAL;
		return MAP_FAILED;
	}
	if (new_len > SIZE_MAX - (UVM_PAGE_SIZE - 1)) {
		/* page_round would wrap to 0 and "shrink" in place: the kernel
		 * refuses a length that overflows when rounded up. */
		errno = EINVAL;
		return MAP_FAILED;
	}
	if (page_round(new_len) <= mapped) {
		set_mapped_length(a.addr, page_round(new_len)); /* shrink in place */
		return old;
	}
	if (page_round(new_len) <= a.length) {
		set_mapped_length(a.addr, 0); /* grow back over a tail unmapped before */
		return old;
	}
	if (!(flags & MREMAP_MAYMOVE)) {
		errno = ENOMEM; /* as the kernel says when it cannot grow in place */
		return MAP_FAILED;
	}
	void *q = managed(new_len);
	if (!q) {
		q = sys_mmap(NULL, new_len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
		if (q == MAP_FAILED)
			return MAP_FAILED;
	}
	memcpy(q, old, mapped < old_len ? mapped : page_round(old_len));
	set_mapped_length(a.addr, 0);
	release("mremap", old);
	return q;
}

/* ---- processes ---- */

/* A fork that makes a device process (device.c) happens in a thread with
 * uvm__in_device_fork set, and the child starts in that thread: managed
 * memory is the client's business, not the device's. */
static void child_after_fork(void)
{
	pthread_mutex_unlock(&trimmed_mu);
	if (uvm__in_device_fork)
		atomic_store(&mode, MODE_OFF_DEVICE);
}

/* The trimmed table's lock is held across a fork, so that the child never
 * inherits it locked by a thread that does not exist there. It is a leaf
 * lock: nothing is called while holding it. */
static void before_fork(void) { pthread_mutex_lock(&trimmed_mu); }
static void parent_after_fork(void) { pthread_mutex_unlock(&trimmed_mu); }

/* ---- the program's static arrays ----
 *
 * Some programs keep their big buffers in static arrays (gzip's window
 * and buffers are 800 KB of .bss) and allocate nothing. Where the main
 * program's writable data segment holds at least the threshold, its
 * page-aligned part past RELRO (which the loader made read-only) becomes
 * managed memory, contents kept, before main runs: constructors run
 * before the program has threads, so nothing touches it meanwhile.
 * UVM_STATICS=0 (uvm run --statics=false) leaves it alone. */

struct statics_scan {
	uintptr_t start[4], end[4];
	int n;
};

static int find_statics(struct dl_phdr_info *info, size_t size, void *arg)
{
	(void)size;
	struct statics_scan *sc = arg;
	uintptr_t relro_start = 0, relro_end = 0;
	for (int i = 0; i < info->dlpi_phnum; i++) {
		const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
		if (ph->p_type == PT_GNU_RELRO) {
			relro_start = info->dlpi_addr + ph->p_vaddr;
			relro_end = relro_start + ph->p_memsz;
		}
	}
	for (int i = 0; i < info->dlpi_phnum && sc->n < 4; i++) {
		const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
		if (ph->p_type != PT_LOAD || !(ph->p_flags & PF_W))
			continue;
		uintptr_t lo = info->dlpi_addr + ph->p_vaddr, hi = lo + ph->p_memsz;
		if (relro_end > lo && relro_start < hi) {
			/* RELRO is read-only after relocation: only what follows
			 * it is the program's to write (lld may make a whole
			 * writable segment RELRO). */
			if (relro_end >= hi)
				continue;
			lo = relro_end;
		}
		lo = (lo + UVM_PAGE_SIZE - 1) & ~(UVM_PAGE_SIZE - 1);
		hi &= ~(UVM_PAGE_SIZE - 1);
		if (hi > lo) {
			sc->start[sc->n] = lo;
			sc->end[sc->n] = hi;
			sc->n++;
		}
	}
	return 1; /* the first object is the main program: stop there */
}

static void adopt_statics(void)
{
	const char *env = getenv("UVM_STATICS");
	if (!env || strcmp(env, "1") != 0)
		return; /* only under uvm run, which says so */
	struct statics_scan sc = {.n = 0};
	dl_iterate_phdr(find_statics, &sc);
	for (int i = 0; i < sc.n; i++) {
		size_t n = sc.end[i] - sc.start[i];
		if (n < threshold() || atomic_load(&mode) != MODE_ON)
			continue;
		in_core = true;
		uvmError_t err = uvm__adopt(sc.start[i], n);
		in_core = false;
		if (err == uvmSuccess) {
			atomic_fetch_add_explicit(&n_managed, 1, memory_order_relaxed);
			atomic_fetch_add_explicit(&managed_bytes, n, memory_order_relaxed);
		} else if (err == uvmErrorInitializationError || err == uvmErrorServerGone || err == uvmErrorNotSupported)
			turn_off(MODE_OFF_NO_SERVER, err);
		else
			say("the program's static data at %p+%zu stays ordinary memory: %s", (void *)sc.start[i], n, uvmGetLastErrorMessage());
	}
}

UVM_PRELOAD_CONSTRUCTOR static void preload_init(void)
{
	const char *probe = getenv("UVM_PRELOAD_PROBE");
	if (probe && strcmp(probe, "heap") == 0)
		heap_probe();
	pthread_atfork(before_fork, parent_after_fork, child_after_fork);
	je_load();
	/* Otherwise no connection here: the library stays inert until a
	 * large allocation (or a large static array). */
	adopt_statics();
}

__attribute__((destructor)) static void preload_report(void)
{
	const char *env = getenv("UVM_PRELOAD_STATS");
	if (!env || strcmp(env, "1") != 0)
		return;
	say("%llu managed allocations (%llu bytes), %llu freed, %llu served by the system allocator instead, threshold %zu bytes; "
	    "heap %s, %d chunks (%llu bytes), %llu purges discarded %llu bytes",
	    (unsigned long long)n_managed, (unsigned long long)managed_bytes, (unsigned long long)n_managed_freed, (unsigned long long)n_fallback,
	    threshold(), heap() == HEAP_MANAGED ? "managed" : "system", atomic_load(&nchunks), (unsigned long long)chunk_bytes,
	    (unsigned long long)n_purges, (unsigned long long)purged_bytes);
}
