/*
 * preload.c: libuvm-preload.so, the allocator `uvm run` puts under
 * unmodified programs (LD_PRELOAD).
 *
 * It replaces the C allocator (malloc and its family) and anonymous
 * mmap: requests of at least a threshold (UVM_MIN_SIZE bytes, default
 * 1 MiB) become managed memory, 2 MiB aligned, whose pages the fault
 * server moves between host memory and the devices; smaller ones go to
 * glibc's own allocator through its __libc_ names (dlsym(RTLD_NEXT,
 * "malloc") would recurse: dlsym itself allocates).
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

/* managed returns n bytes of managed memory, or NULL (counted) when the
 * request should go to the system allocator instead. */
static void *managed(size_t n)
{
	if (in_core)
		return NULL;
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
		atomic_fetch_add_explicit(&n_managed, 1, memory_order_relaxed);
		atomic_fetch_add_explicit(&managed_bytes, n, memory_order_relaxed);
		return p;
	}
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

/* ---- the C allocator ---- */

EXPORT void *malloc(size_t n)
{
	if (wants_managed(n, 1)) {
		void *p = managed(n);
		if (p)
			return p;
	}
	return __libc_malloc(n);
}

EXPORT void *calloc(size_t k, size_t n)
{
	size_t total;
	if (__builtin_mul_overflow(k, n, &total)) {
		errno = ENOMEM;
		return NULL;
	}
	if (wants_managed(total, 1)) {
		void *p = managed(total); /* fresh managed memory reads as zeros */
		if (p)
			return p;
	}
	return __libc_calloc(k, n);
}

EXPORT void free(void *p)
{
	if (!p)
		return;
	if (!uvm__in_window((uintptr_t)p)) {
		__libc_free(p);
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
	if (uvm__in_window((uintptr_t)p))
		return live_size(p);
	return system_usable_size(p);
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
	void *q = n >= threshold() ? managed(n) : NULL;
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
	if (wants_managed(n, align)) {
		void *p = managed(n);
		if (p)
			return p;
	}
	return __libc_memalign(align, n);
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

static void find_text(void)
{
	Dl_info info;
	if (!dladdr((void *)&find_text, &info) || !info.dli_fbase)
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
		text_start = lo, text_end = hi;
}

static bool from_library(const void *caller)
{
	pthread_once(&text_once, find_text);
	return (uintptr_t)caller >= text_start && (uintptr_t)caller < text_end;
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

__attribute__((constructor)) static void preload_init(void)
{
	pthread_atfork(before_fork, parent_after_fork, child_after_fork);
	/* Otherwise no connection here: the library stays inert until a
	 * large allocation (or a large static array). */
	adopt_statics();
}

__attribute__((destructor)) static void preload_report(void)
{
	const char *env = getenv("UVM_PRELOAD_STATS");
	if (!env || strcmp(env, "1") != 0)
		return;
	say("%llu managed allocations (%llu bytes), %llu freed, %llu served by the system allocator instead, threshold %zu bytes",
	    (unsigned long long)n_managed, (unsigned long long)managed_bytes, (unsigned long long)n_managed_freed, (unsigned long long)n_fallback,
	    threshold());
}
