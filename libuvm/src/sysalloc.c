/* sysalloc.c: glibc's allocator by its own names, and the memory system
 * calls. libuvm-preload.so replaces malloc and friends, mmap, munmap and
 * mremap; the library itself must never reach the replacements, or a
 * managed allocation would recurse into itself (and the preload library,
 * which is above it, would be called from below). */
#include "internal.h"

#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

extern void *__libc_malloc(size_t n);
extern void *__libc_calloc(size_t k, size_t n);
extern void *__libc_realloc(void *p, size_t n);
extern void __libc_free(void *p);

void *uvm__sys_malloc(size_t n) { return __libc_malloc(n); }
void *uvm__sys_calloc(size_t k, size_t n) { return __libc_calloc(k, n); }
void *uvm__sys_realloc(void *p, size_t n) { return __libc_realloc(p, n); }
void uvm__sys_free(void *p) { __libc_free(p); }

void *uvm__sys_mmap(void *addr, size_t len, int prot, int flags, int fd, off_t off)
{
	return (void *)syscall(SYS_mmap, addr, len, prot, flags, fd, off);
}

int uvm__sys_munmap(void *addr, size_t len) { return (int)syscall(SYS_munmap, addr, len); }

void *uvm__sys_mremap(void *old, size_t old_len, size_t new_len, int flags, void *new_addr)
{
	return (void *)syscall(SYS_mremap, old, old_len, new_len, flags, new_addr);
}

int64_t uvm__slot_take(void *slots, size_t elem, uint32_t *n, uint32_t *cap, uint32_t **free_slots, uint32_t *nfree, bool *fresh)
{
	*fresh = false;
	if (*nfree > 0)
		return (*free_slots)[--*nfree];
	if (*n == *cap) {
		uint32_t grow = *cap ? 2 * *cap : 16;
		void *table; /* the caller's pointer is typed: copy it, do not alias it */
		memcpy(&table, slots, sizeof table);
		void *grown = grow < *cap || grow > (1u << 30) ? NULL : uvm__sys_realloc(table, grow * elem);
		uint32_t *grown_free = grown ? uvm__sys_realloc(*free_slots, grow * sizeof **free_slots) : NULL;
		if (grown)
			memcpy(slots, &grown, sizeof grown);
		if (grown_free)
			*free_slots = grown_free;
		if (!grown || !grown_free)
			return -1;
		*cap = grow;
	}
	*fresh = true;
	return (*n)++;
}
