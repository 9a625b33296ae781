// uvm-cfloor: the floor under softuvm's fault path. A minimal userfaultfd
// handler written in C, in the same process as the faulting thread, serving
// 4 KiB first-touch faults on a MAP_SHARED memfd mapping (the same kind of
// memory, registration and resolving ioctl as the softuvm server) with
// UFFDIO_ZEROPAGE. `uvm bench faults` runs it in the same run as its own
// measurement and reports the ratio.
//
// usage: uvm-cfloor [-p percpu|single] [-n pages] [-r runs]
//   percpu: one handler thread per online CPU, each pinned to its CPU, all
//           blocked in read(2) on the userfaultfd (softuvm's placement)
//   single: one unpinned handler thread
// The faulting thread is never pinned. Output: one JSON object with the
// median over runs of each run's p50 and p99, in microseconds.
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/userfaultfd.h>
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define PAGE 4096UL

static int uffd = -1;

static void die(const char *what) {
	fprintf(stderr, "uvm-cfloor: %s: %s\n", what, strerror(errno));
	exit(1);
}

static double now_us(void) {
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}

struct handler_arg {
	int cpu; // -1: unpinned
};

static void *handler(void *p) {
	struct handler_arg *a = p;
	if (a->cpu >= 0) {
		cpu_set_t set;
		CPU_ZERO(&set);
		CPU_SET(a->cpu, &set);
		if (sched_setaffinity(0, sizeof set, &set))
			die("sched_setaffinity");
	}
	for (;;) {
		struct uffd_msg msg;
		ssize_t n = read(uffd, &msg, sizeof msg);
		if (n != sizeof msg) {
			if (n < 0 && (errno == EAGAIN || errno == EINTR))
				continue;
			if (n < 0 && errno == EBADF)
				return NULL;
			die("read userfaultfd");
		}
		if (msg.event != UFFD_EVENT_PAGEFAULT)
			continue;
		struct uffdio_zeropage z = {.range = {msg.arg.pagefault.address & ~(PAGE - 1), PAGE}};
		if (ioctl(uffd, UFFDIO_ZEROPAGE, &z) && errno != EEXIST)
			die("UFFDIO_ZEROPAGE");
	}
}

static int cmp(const void *a, const void *b) {
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
	const char *placement = "percpu";
	long pages = 4096, runs = 7;
	for (int i = 1; i + 1 < argc; i += 2) {
		if (!strcmp(argv[i], "-p"))
			placement = argv[i + 1];
		else if (!strcmp(argv[i], "-n"))
			pages = atol(argv[i + 1]);
		else if (!strcmp(argv[i], "-r"))
			runs = atol(argv[i + 1]);
		else {
			fprintf(stderr, "usage: uvm-cfloor [-p percpu|single] [-n pages] [-r runs]\n");
			return 2;
		}
	}
	if (strcmp(placement, "percpu") && strcmp(placement, "single")) {
		fprintf(stderr, "uvm-cfloor: placement %s: want percpu or single\n", placement);
		return 2;
	}
	if (pages < 100 || runs < 1) {
		fprintf(stderr, "uvm-cfloor: want at least 100 pages and 1 run\n");
		return 2;
	}
	uffd = syscall(SYS_userfaultfd, O_CLOEXEC);
	if (uffd < 0)
		die("userfaultfd");
	struct uffdio_api api = {.api = UFFD_API, .features = UFFD_FEATURE_MISSING_SHMEM | UFFD_FEATURE_WP_HUGETLBFS_SHMEM};
	if (ioctl(uffd, UFFDIO_API, &api))
		die("UFFDIO_API");

	long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
	int nthreads = strcmp(placement, "single") ? (int)ncpu : 1;
	struct handler_arg *args = calloc(nthreads, sizeof *args);
	for (int i = 0; i < nthreads; i++) {
		pthread_t t;
		args[i].cpu = nthreads == 1 ? -1 : i;
		if (pthread_create(&t, NULL, handler, &args[i]))
			die("pthread_create");
		pthread_detach(t);
	}

	size_t len = pages * PAGE;
	double *lat = calloc(pages, sizeof *lat), *p50 = calloc(runs, sizeof *p50), *p99 = calloc(runs, sizeof *p99);
	for (long r = 0; r < runs + 1; r++) { // run 0 warms up
		int fd = memfd_create("cfloor", MFD_CLOEXEC);
		if (fd < 0 || ftruncate(fd, len))
			die("memfd");
		char *m = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
		if (m == MAP_FAILED)
			die("mmap");
		struct uffdio_register reg = {.range = {(uintptr_t)m, len}, .mode = UFFDIO_REGISTER_MODE_MISSING | UFFDIO_REGISTER_MODE_WP};
		if (ioctl(uffd, UFFDIO_REGISTER, &reg))
			die("UFFDIO_REGISTER");
		for (long i = 0; i < pages; i++) {
			double t0 = now_us();
			m[i * PAGE] = 1;
			lat[i] = now_us() - t0;
		}
		qsort(lat, pages, sizeof *lat, cmp);
		if (r > 0) {
			p50[r - 1] = lat[pages / 2];
			p99[r - 1] = lat[pages * 99 / 100];
		}
		munmap(m, len);
		close(fd);
	}
	qsort(p50, runs, sizeof *p50, cmp);
	qsort(p99, runs, sizeof *p99, cmp);
	printf("{\"placement\":\"%s\",\"handlers\":%d,\"pages\":%ld,\"runs\":%ld,\"p50_us\":%.2f,\"p99_us\":%.2f}\n",
	       placement, nthreads, pages, runs, p50[runs / 2], p99[runs / 2]);
	return 0;
}
