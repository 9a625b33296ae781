/*
 * managed.c: managed variables, globals declared UVM_MANAGED (uvm.h) or
 * __managed__ / __constant__ (uvm_cuda.h), as CUDA's __managed__
 * variables: one copy, visible to the host and every device.
 *
 * Such a variable lives in the program's own image, in the section
 * uvm_managed, which uvm.h makes start on a page and which the section
 * uvm_managed_end, a page-aligned byte, follows (both once per program,
 * whatever the number of files: COMDAT groups). So the pages from the
 * section's start up to the byte hold managed variables and nothing else.
 * A constructor uvm.h puts in every file that includes it (each module,
 * program or shared library, sees its own section) calls
 * uvm__register_managed before main, while the program has one thread;
 * the library checks that those pages are the section's alone, then
 * adopts them as uvm__adopt does the static arrays of a program under
 * `uvm run`: a managed allocation over the variables, their contents
 * (initializers included) kept, at the same addresses. Code keeps
 * addressing them directly: there is no indirection to pay.
 *
 * If it cannot (no fault server, or a linker that put other data on those
 * pages), the variables stay ordinary memory, which a kernel would see
 * as it was when its device's process started: rather than let a program
 * compute with that, every call of the library then fails, saying why
 * (uvm__session_refuse).
 */
#include "internal.h"

#include <elf.h>
#include <errno.h>
#include <fcntl.h>
#include <link.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* The first failure, which every call reports; registration runs before
 * main, on one thread. */
static char failure[512];
static bool failed;

static void fail_managed(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void fail_managed(const char *fmt, ...)
{
	char msg[sizeof failure];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof msg, fmt, ap);
	va_end(ap);
	fprintf(stderr, "softuvm: %s\n", msg);
	if (!failed) {
		failed = true;
		memcpy(failure, msg, sizeof failure);
		uvm__session_refuse(failure);
	}
}

/* The module (program or shared library) that holds an address. */
struct module_of {
	uintptr_t addr;
	const char *name; /* "" for the program */
	uintptr_t bias;
	bool found;
};

static int find_module(struct dl_phdr_info *info, size_t size, void *arg)
{
	(void)size;
	struct module_of *m = arg;
	for (int i = 0; i < info->dlpi_phnum; i++) {
		const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
		uintptr_t lo = info->dlpi_addr + ph->p_vaddr;
		if (ph->p_type == PT_LOAD && m->addr >= lo && m->addr - lo < ph->p_memsz) {
			m->name = info->dlpi_name;
			m->bias = info->dlpi_addr;
			m->found = true;
			return 1;
		}
	}
	return 0;
}

/* alone_on_pages checks, from the ELF section headers of the module's
 * file, that no allocated section but uvm_managed has a byte in
 * [lo, hi) (page-aligned, loaded addresses). NULL if so, else why not, in
 * msg. */
static const char *alone_on_pages(uintptr_t lo, uintptr_t hi, char *msg, size_t cap)
{
	struct module_of m = {.addr = lo};
	dl_iterate_phdr(find_module, &m);
	if (!m.found) {
		snprintf(msg, cap, "no loaded module holds them");
		return msg;
	}
	const char *path = m.name && m.name[0] ? m.name : "/proc/self/exe";
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	struct stat st;
	if (fd < 0 || fstat(fd, &st) < 0) {
		snprintf(msg, cap, "read %s, to check what else lies on their pages: %s", path, strerror(errno));
		if (fd >= 0)
			close(fd);
		return msg;
	}
	const uint8_t *f = uvm__sys_mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
	close(fd);
	if (f == MAP_FAILED) {
		snprintf(msg, cap, "map %s: %s", path, strerror(errno));
		return msg;
	}
	const char *bad = NULL;
	const ElfW(Ehdr) *eh = (const void *)f;
	size_t n = (size_t)st.st_size;
	if (n < sizeof *eh || memcmp(eh->e_ident, ELFMAG, SELFMAG) != 0 || eh->e_shentsize != sizeof(ElfW(Shdr)) || eh->e_shoff > n ||
	    (size_t)eh->e_shnum * sizeof(ElfW(Shdr)) > n - eh->e_shoff || eh->e_shstrndx >= eh->e_shnum) {
		snprintf(msg, cap, "%s has no section headers to check what else lies on their pages", path);
		bad = msg;
		goto out;
	}
	const ElfW(Shdr) *sh = (const void *)(f + eh->e_shoff);
	const ElfW(Shdr) *names = &sh[eh->e_shstrndx];
	for (size_t i = 0; i < eh->e_shnum && !bad; i++) {
		if (!(sh[i].sh_flags & SHF_ALLOC) || sh[i].sh_size == 0)
			continue;
		uintptr_t s = m.bias + sh[i].sh_addr, e = s + sh[i].sh_size;
		if (e <= lo || s >= hi)
			continue;
		const char *name = "?";
		if (names->sh_offset < n && sh[i].sh_name < names->sh_size && names->sh_offset + sh[i].sh_name < n)
			name = (const char *)f + names->sh_offset + sh[i].sh_name;
		if (strncmp(name, "uvm_managed", sizeof "uvm_managed") != 0) {
			snprintf(msg, cap, "section %.40s of %s lies on their pages too (%#lx+%zu): the linker did not put uvm_managed_end right after them",
				 name, path, (unsigned long)s, (size_t)sh[i].sh_size);
			bad = msg;
		}
	}
out:
	uvm__sys_munmap((void *)f, n);
	return bad;
}

void uvm__register_managed(char *start, char *stop, char *end)
{
	static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
	static uintptr_t done[16]; /* modules registered: every file of one calls with the same start */
	static int ndone;
	if (!start || stop <= start || uvm__device_process >= 0)
		return;
	uintptr_t lo = (uintptr_t)start, hi = ((uintptr_t)stop + UVM_PAGE_SIZE - 1) & ~(uintptr_t)(UVM_PAGE_SIZE - 1);
	pthread_mutex_lock(&mu);
	for (int i = 0; i < ndone; i++)
		if (done[i] == lo)
			goto out;
	if (ndone < (int)(sizeof done / sizeof done[0]))
		done[ndone++] = lo;
	char msg[384];
	const char *why = NULL;
	if (lo % UVM_PAGE_SIZE)
		why = "their section does not start on a page (uvm.h makes it: is it included where they are declared?)";
	else if ((uintptr_t)end != hi)
		why = "the page-aligned byte of uvm_managed_end does not follow them (another linker's layout?)";
	else
		why = alone_on_pages(lo, hi, msg, sizeof msg);
	if (why) {
		fail_managed("the managed variables at %p+%zu cannot be made managed memory: %s; every call fails rather than let kernels see "
			     "a stale copy of them",
			     (void *)start, (size_t)(stop - start), why);
		goto out;
	}
	uvmError_t err = uvm__adopt(lo, hi - lo);
	if (err)
		fail_managed("the managed variables at %p+%zu cannot be made managed memory: %s; every call fails rather than let kernels see "
			     "a stale copy of them",
			     (void *)start, (size_t)(stop - start), uvmGetLastErrorMessage());
out:
	pthread_mutex_unlock(&mu);
}
