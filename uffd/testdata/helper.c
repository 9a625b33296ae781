// Test helper for package uffd: a client process that creates a
// userfaultfd, registers anonymous memory, hands the fd to the Go test over
// fd 3 (a SOCK_SEQPACKET socket, SCM_RIGHTS) and then generates events or
// faults that the test reads and serves with the package.
//
// Each message on the socket is one line "word key=value ...". The helper
// announces an operation before doing it, because the operation blocks
// until the test has read the event it produces.
//
//   helper events   FORK, REMAP, REMOVE, a page fault, UNMAP
//   helper faults N N read faults, one page after the other
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/userfaultfd.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#define SOCK 3

static long ps;

static void die(const char *what) {
	fprintf(stderr, "helper: %s: %s\n", what, strerror(errno));
	exit(2);
}

static void sendf(const char *fmt, ...) {
	char buf[512];
	va_list ap;
	va_start(ap, fmt);
	int n = vsnprintf(buf, sizeof buf, fmt, ap);
	va_end(ap);
	if (send(SOCK, buf, n, 0) != n)
		die("send");
}

static void wait_go(void) {
	char c;
	if (recv(SOCK, &c, 1, 0) != 1)
		die("waiting for the test");
}

// make_uffd creates a userfaultfd with the given features, registers
// [addr, addr+len) for missing faults, sends the fd to the test with an
// "init" message and closes its own copy: from then on the test's fd is
// the only one.
static void make_uffd(uint64_t features, char *addr, size_t len) {
	int fd = syscall(SYS_userfaultfd, O_CLOEXEC | O_NONBLOCK);
	if (fd < 0)
		die("userfaultfd");
	struct uffdio_api api = {.api = UFFD_API, .features = features};
	if (ioctl(fd, UFFDIO_API, &api))
		die("UFFDIO_API");
	struct uffdio_register reg = {
		.range = {.start = (uintptr_t)addr, .len = len},
		.mode = UFFDIO_REGISTER_MODE_MISSING,
	};
	if (ioctl(fd, UFFDIO_REGISTER, &reg))
		die("UFFDIO_REGISTER");

	char buf[512];
	int n = snprintf(buf, sizeof buf,
			 "init features=%llu ioctls=%llu range_ioctls=%llu addr=%lu len=%zu pid=%d",
			 (unsigned long long)features, (unsigned long long)api.ioctls,
			 (unsigned long long)reg.ioctls, (unsigned long)addr, len, getpid());
	struct iovec iov = {.iov_base = buf, .iov_len = n};
	union {
		char buf[CMSG_SPACE(sizeof(int))];
		struct cmsghdr align;
	} u;
	struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.buf, .msg_controllen = sizeof u.buf};
	struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
	c->cmsg_level = SOL_SOCKET;
	c->cmsg_type = SCM_RIGHTS;
	c->cmsg_len = CMSG_LEN(sizeof(int));
	memcpy(CMSG_DATA(c), &fd, sizeof(int));
	if (sendmsg(SOCK, &msg, 0) != n)
		die("sendmsg");
	close(fd);
}

static char *map_anon(size_t len, int prot) {
	char *p = mmap(NULL, len, prot, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (p == MAP_FAILED)
		die("mmap");
	return p;
}

static int events(void) {
	size_t len = 4 * ps;
	char *a = map_anon(len, PROT_READ | PROT_WRITE);
	make_uffd(UFFD_FEATURE_EVENT_FORK | UFFD_FEATURE_EVENT_REMAP | UFFD_FEATURE_EVENT_REMOVE |
			  UFFD_FEATURE_EVENT_UNMAP | UFFD_FEATURE_THREAD_ID,
		  a, len);
	wait_go();

	// FORK: the child inherits the registration on a new userfaultfd
	// that the test receives in the event; its first write to a[0]
	// faults there. The test fills the page with 'F'.
	sendf("fork");
	pid_t pid = fork();
	if (pid < 0)
		die("fork");
	if (pid == 0) {
		volatile char *p = a;
		p[0] = 'c';
		_exit(p[0] == 'c' && p[1] == 'F' ? 0 : 3);
	}
	sendf("forked pid=%d", pid);
	int st;
	if (waitpid(pid, &st, 0) != pid)
		die("waitpid");
	sendf("child status=%d", WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st));

	// REMAP: move the registered range onto a reserved one.
	char *b = map_anon(len, PROT_NONE);
	sendf("remap from=%lu to=%lu len=%zu", (unsigned long)a, (unsigned long)b, len);
	if (mremap(a, len, len, MREMAP_MAYMOVE | MREMAP_FIXED, b) != b)
		die("mremap");

	// REMOVE: zap the first half.
	sendf("remove start=%lu end=%lu", (unsigned long)b, (unsigned long)(b + 2 * ps));
	if (madvise(b, 2 * ps, MADV_DONTNEED))
		die("madvise");

	// A user-mode write fault in the moved range, 100 bytes into page 2;
	// the test fills the page with 'P'.
	volatile char *p = b + 2 * ps;
	sendf("fault addr=%lu tid=%ld", (unsigned long)(p + 100), (long)syscall(SYS_gettid));
	p[100] = 'x';
	sendf("faulted ok=%d", p[0] == 'P' && p[100] == 'x' && p[101] == 'P');

	// UNMAP
	sendf("unmap start=%lu end=%lu", (unsigned long)b, (unsigned long)(b + len));
	if (munmap(b, len))
		die("munmap");
	sendf("done");
	return 0;
}

static int faults(long n) {
	size_t len = n * ps;
	char *a = map_anon(len, PROT_READ | PROT_WRITE);
	make_uffd(UFFD_FEATURE_THREAD_ID, a, len);
	wait_go();
	unsigned long sum = 0;
	for (long i = 0; i < n; i++)
		sum += ((volatile char *)a)[i * ps + 1];
	sendf("done sum=%lu", sum);
	return 0;
}

int main(int argc, char **argv) {
	ps = sysconf(_SC_PAGESIZE);
	if (argc >= 2 && strcmp(argv[1], "events") == 0)
		return events();
	if (argc >= 3 && strcmp(argv[1], "faults") == 0)
		return faults(atol(argv[2]));
	fprintf(stderr, "usage: helper events | helper faults N\n");
	return 2;
}
