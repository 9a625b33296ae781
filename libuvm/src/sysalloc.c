/* sysalloc.c: glibc's allocator by its own names. libuvm-preload.so
 * replaces malloc and friends; the library itself must never reach the
 * replacement, or a managed allocation would recurse into itself. */
#include "internal.h"

extern void *__libc_malloc(size_t n);
extern void *__libc_calloc(size_t k, size_t n);
extern void *__libc_realloc(void *p, size_t n);
extern void __libc_free(void *p);

void *uvm__sys_malloc(size_t n) { return __libc_malloc(n); }
void *uvm__sys_calloc(size_t k, size_t n) { return __libc_calloc(k, n); }
void *uvm__sys_realloc(void *p, size_t n) { return __libc_realloc(p, n); }
void uvm__sys_free(void *p) { __libc_free(p); }
