/*
 * jemalloc_abi.h: the part of jemalloc 5's interface the managed heap of
 * libuvm-preload.so uses, declared here rather than taken from
 * <jemalloc/jemalloc.h>.
 *
 * Building the preload library then needs a C compiler and nothing else:
 * jemalloc is loaded with dlopen when a program runs (libjemalloc.so.2,
 * Debian's libjemalloc2), never linked, and its version is checked then
 * (je_supported: major version 5). What is declared here is ABI that
 * jemalloc 5.0 through 5.3 share: the extent hooks (jemalloc_typedefs.h,
 * struct extent_hooks_s, unchanged since 5.0 introduced it), the mallocx
 * flag encodings (MALLOCX_ZERO, MALLOCX_ALIGN, MALLOCX_ARENA) and the
 * signatures of mallocx, rallocx, dallocx, sallocx and mallctl. Names
 * carry a je_ prefix so that a file may include jemalloc's header beside
 * this one: libuvm's TestJemallocABIMatchesHeader does, where the header
 * is installed, and checks every size, offset, type and flag against it.
 */
#ifndef UVM_JEMALLOC_ABI_H
#define UVM_JEMALLOC_ABI_H

#include <limits.h>
#include <stdbool.h>
#include <stddef.h>
#include <strings.h>

typedef struct je_extent_hooks je_extent_hooks_t;

/* The hooks jemalloc calls for an arena's extents; the order of the
 * members is the ABI. */
typedef void *(je_extent_alloc_t)(je_extent_hooks_t *, void *new_addr, size_t size, size_t alignment, bool *zero, bool *commit,
				  unsigned arena_ind);
typedef bool(je_extent_dalloc_t)(je_extent_hooks_t *, void *addr, size_t size, bool committed, unsigned arena_ind);
typedef void(je_extent_destroy_t)(je_extent_hooks_t *, void *addr, size_t size, bool committed, unsigned arena_ind);
typedef bool(je_extent_commit_t)(je_extent_hooks_t *, void *addr, size_t size, size_t offset, size_t length, unsigned arena_ind);
typedef bool(je_extent_decommit_t)(je_extent_hooks_t *, void *addr, size_t size, size_t offset, size_t length, unsigned arena_ind);
typedef bool(je_extent_purge_t)(je_extent_hooks_t *, void *addr, size_t size, size_t offset, size_t length, unsigned arena_ind);
typedef bool(je_extent_split_t)(je_extent_hooks_t *, void *addr, size_t size, size_t size_a, size_t size_b, bool committed,
				unsigned arena_ind);
typedef bool(je_extent_merge_t)(je_extent_hooks_t *, void *addr_a, size_t size_a, void *addr_b, size_t size_b, bool committed,
				unsigned arena_ind);

struct je_extent_hooks {
	je_extent_alloc_t *alloc;
	je_extent_dalloc_t *dalloc;
	je_extent_destroy_t *destroy;
	je_extent_commit_t *commit;
	je_extent_decommit_t *decommit;
	je_extent_purge_t *purge_lazy;
	je_extent_purge_t *purge_forced;
	je_extent_split_t *split;
	je_extent_merge_t *merge;
};

/* mallocx's flags. */
#define JE_MALLOCX_ZERO ((int)0x40)
#define JE_MALLOCX_ARENA(a) ((((int)(a)) + 1) << 20)

/* JE_MALLOCX_ALIGN is MALLOCX_ALIGN for a power of two: its base-2
 * logarithm, as jemalloc encodes it on 64-bit machines (ffs - 1). */
static inline int JE_MALLOCX_ALIGN(size_t a)
{
	return a < (size_t)INT_MAX ? ffs((int)a) - 1 : ffs((int)(a >> 32)) + 31;
}

/* The functions the heap looks up with dlsym. */
typedef void *(je_mallocx_t)(size_t size, int flags);
typedef void *(je_rallocx_t)(void *ptr, size_t size, int flags);
typedef void(je_dallocx_t)(void *ptr, int flags);
typedef size_t(je_sallocx_t)(const void *ptr, int flags);
typedef int(je_mallctl_t)(const char *name, void *oldp, size_t *oldlenp, void *newp, size_t newlen);

/* JE_LIBRARY is what the heap loads where UVM_JEMALLOC names nothing
 * else: jemalloc's shared library by its soname (5.x keep soname 2). */
#define JE_LIBRARY "libjemalloc.so.2"

/* je_supported says whether jemalloc's "version" mallctl names a version
 * whose ABI is the one above: 5.x. */
static inline bool je_supported(const char *version) { return version && version[0] == '5' && version[1] == '.'; }

#endif
