/*
 * devproc.c: a device process of a C program, the other half of device.c.
 *
 * A device is a process of its own because a process has one page table:
 * the device's accesses to managed memory must fault where the host's do
 * not. The Go runtime re-executes the program (uvm/devproc.go) and finds
 * kernels by name; a C program's kernels are function pointers, which
 * only a fork of the program understands. So device.c forks the program
 * at the device's first launch, and the child runs uvm__device_main:
 *
 *  - it becomes a process of its own: every descriptor but its three
 *    sockets and stdio closed (a copy of another device's socket would
 *    hide that device's death from the client), default signal actions,
 *    its own process group (a Ctrl-C meant for the program reaches the
 *    device only through its client's death), and the managed window
 *    reserved: the client's ranges are MADV_DONTFORK, so the child starts
 *    with none of them;
 *  - it says hello to the fault server with a userfaultfd of its own and
 *    maps what the server says (each run of a processor's file at offset
 *    == address), registered MISSING|WP, as the Go device does;
 *  - it serves the server's map and unmap requests on one thread, each
 *    stream (one SOCK_SEQPACKET socket from the client) on a thread of
 *    its own, and spreads wide launches over pinned worker threads;
 *  - when its client's session is traced, the server's first message is
 *    a device-trace notice with a socket of its own, on which the process
 *    reports the kernels it runs and the synchronizations it answers
 *    (internal/wire/devicetrace.go, as the Go device's report.go).
 *
 * A kernel that crashes kills the process, as it would kill the program.
 * Before it dies, the signal handler tells the client which kernel,
 * thread and address it was; the client reports that at the next
 * synchronize and forks a new process at the next launch. The data is in
 * the device's file, which the server owns, so nothing is lost.
 *
 * The child was forked from a thread of a program whose other threads may
 * have held any lock at that instant. It never touches the session (whose
 * mutexes may be held forever) and it exits with _exit, never exit: the
 * program's atexit handlers and stdio buffers belong to the program.
 * glibc's allocator and stdio reset their locks in a fork's child.
 */
#include "internal.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/userfaultfd.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdio_ext.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

int uvm__device_process = -1;

/* The alternate signal stack of a kernel thread: a kernel that overflows
 * its stack must still be reported. Far more than a signal frame takes,
 * even with AMX state. */
#define ALT_STACK_SIZE (64u << 10)
/* A stream's receive buffer: a launch is at most a header, a short
 * kernel name and uvmMaxKernelParams bytes. */
#define STREAM_BUF_SIZE (16u << 10)

/* The process's state, written before any thread but the main one
 * exists and read-only afterwards. */
static int dev_index;
static int server_sock = -1;
static int control_sock = -1;
static int uffd = -1;
static int files[UVM_MAX_DEVICES + 1]; /* files[d + 1]: processor d's file (the CPU is -1) */
static int nfiles;
static uint8_t *server_buf; /* UVM_MAX_MESSAGE bytes, mmap'ed */

/* ---- reports of a traced session ---- */

/* The report socket, when the session is traced (set by attach before
 * any other thread exists); -1 otherwise, and every launch and
 * synchronization then pays one test. Records are batched: a batch goes
 * when it holds UVM_MAX_REPORT_RECORDS, REPORT_DELAY_NS after its first
 * record (report_main), when a stream ends and when the process ends
 * (the server waits for that at the session's end), so that a loop of
 * short launches and synchronizes pays a send per 32 of them. A send
 * never waits: a full socket drops the batch and the next report counts
 * it lost; a server gone ends the reports. */
#define REPORT_DELAY_NS 5000000l
static int report_sock = -1;
static pthread_mutex_t report_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t report_cv = PTHREAD_COND_INITIALIZER; /* a batch was started */
static uint8_t report_buf[UVM_REPORT_MESSAGE_MAX];
static struct uvm_msg report_msg = {.buf = report_buf, .cap = sizeof report_buf};
static uint32_t report_n, report_lost; /* guarded by report_mu, with report_msg */
static bool report_dead;

static uint64_t monotonic_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* report_send_locked sends the batch without waiting and empties it.
 * report_mu is held. */
static void report_send_locked(void)
{
	uvm__report_finish(&report_msg, report_lost, report_n);
	ssize_t k;
	do
		k = send(report_sock, report_msg.buf, report_msg.len, MSG_NOSIGNAL | MSG_DONTWAIT);
	while (k < 0 && errno == EINTR);
	if (k >= 0)
		report_lost = 0;
	else if (errno == EAGAIN || errno == EWOULDBLOCK || errno == ENOBUFS)
		report_lost += report_n;
	else
		report_dead = true; /* the server is gone: no one reads the socket */
	report_n = 0;
	uvm__report_start(&report_msg);
}

static void report_add(uint8_t kind, uint32_t stream, uint32_t threads, uint64_t start, uint64_t end, const uint8_t *name, uint32_t name_len)
{
	pthread_mutex_lock(&report_mu);
	if (!report_dead) {
		if (report_msg.len == 0)
			uvm__report_start(&report_msg);
		uvm__report_add(&report_msg, kind, stream, threads, start, end, name, name_len);
		if (++report_n >= UVM_MAX_REPORT_RECORDS)
			report_send_locked();
		else if (report_n == 1)
			pthread_cond_signal(&report_cv);
	}
	pthread_mutex_unlock(&report_mu);
}

/* report_main sends each batch that does not fill REPORT_DELAY_NS after
 * it started. */
static void *report_main(void *arg)
{
	(void)arg;
	pthread_mutex_lock(&report_mu);
	while (!report_dead) {
		if (report_n == 0) {
			pthread_cond_wait(&report_cv, &report_mu);
			continue;
		}
		pthread_mutex_unlock(&report_mu);
		nanosleep(&(struct timespec){.tv_nsec = REPORT_DELAY_NS}, NULL);
		pthread_mutex_lock(&report_mu);
		if (!report_dead && report_n > 0)
			report_send_locked();
	}
	pthread_mutex_unlock(&report_mu);
	return NULL;
}

/* report_flush sends what the batch holds. */
static void report_flush(void)
{
	if (report_sock < 0)
		return;
	pthread_mutex_lock(&report_mu);
	if (!report_dead && report_n > 0)
		report_send_locked();
	pthread_mutex_unlock(&report_mu);
}

/* ---- messages ---- */

/* send_reply answers the request (typ, seq) with status and, if status
 * is not OK, msg. */
static void send_reply(int sock, uint16_t typ, uint32_t seq, uint32_t status, const char *msg)
{
	uint8_t buf[4096];
	struct uvm_msg m = {.buf = buf, .cap = sizeof buf};
	uvm__encode_reply(&m, typ, seq, status, msg);
	uvm__send(sock, m.buf, m.len, NULL, 0);
}

/* setup_fail tells the client why the process could not come up (as the
 * reply to the device-up it waits for) and ends the process. */
static void setup_fail(uint32_t status, const char *fmt, ...) __attribute__((format(printf, 2, 3), noreturn));
static void setup_fail(uint32_t status, const char *fmt, ...)
{
	char msg[1024];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof msg, fmt, ap);
	va_end(ap);
	send_reply(control_sock, UVM_MSG_DEVICE_UP, 0, status, msg);
	_exit(1);
}

/* ---- becoming a process of its own ---- */

static void close_fd_range(unsigned lo, unsigned hi)
{
	if (lo > hi)
		return;
	if (syscall(SYS_close_range, lo, hi, 0) == 0)
		return;
	/* Kernels before 5.9 have no close_range. */
	unsigned top = 65536;
	struct rlimit rl;
	if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur < top)
		top = (unsigned)rl.rlim_cur;
	for (unsigned fd = lo; fd <= hi && fd < top; fd++)
		close((int)fd);
}

/* close_other_fds closes every descriptor but stdio and keep[]. */
static void close_other_fds(const int *keep, int nkeep)
{
	int k[8] = {0, 1, 2};
	int n = 3;
	for (int i = 0; i < nkeep; i++)
		k[n++] = keep[i];
	for (int i = 1; i < n; i++) /* insertion sort: a handful of numbers */
		for (int j = i; j > 0 && k[j - 1] > k[j]; j--) {
			int t = k[j];
			k[j] = k[j - 1];
			k[j - 1] = t;
		}
	unsigned lo = 0;
	for (int i = 0; i < n; i++) {
		if ((unsigned)k[i] < lo)
			continue; /* a duplicate */
		if ((unsigned)k[i] > lo)
			close_fd_range(lo, (unsigned)k[i] - 1);
		lo = (unsigned)k[i] + 1;
	}
	close_fd_range(lo, ~0u);
}

/* reset_signals gives every signal the program handles its default
 * action, as exec would (ignored ones stay ignored), and unblocks them
 * all: the program's handlers make no sense in a device. */
static void reset_signals(void)
{
	for (int sig = 1; sig < NSIG; sig++) {
		struct sigaction sa;
		if (sig == SIGKILL || sig == SIGSTOP || sigaction(sig, NULL, &sa) < 0)
			continue; /* glibc's own signals refuse sigaction */
		if (!(sa.sa_flags & SA_SIGINFO) && (sa.sa_handler == SIG_IGN || sa.sa_handler == SIG_DFL))
			continue;
		memset(&sa, 0, sizeof sa);
		sa.sa_handler = SIG_DFL;
		sigaction(sig, &sa, NULL);
	}
	sigset_t none;
	sigemptyset(&none);
	pthread_sigmask(SIG_SETMASK, &none, NULL);
}

/* ---- mappings ---- */

/* check_run validates a run the server asks for; returns NULL or what is
 * wrong with it, in msg. A run lies in the managed window or below it:
 * there, in the program's own image, are the managed variables the
 * program adopted (managed.c), which this fork of it has not (they are
 * MADV_DONTFORK): the run maps over the hole. */
static const char *check_run(uint64_t addr, uint64_t length, int32_t file, char *msg, size_t cap)
{
	if (addr % UVM_PAGE_SIZE || length % UVM_PAGE_SIZE || length == 0)
		snprintf(msg, cap, "range %#lx+%lu: want a nonempty, page-aligned range", (unsigned long)addr, (unsigned long)length);
	else if (addr == 0 || length > UVM_WINDOW_START + UVM_WINDOW_SIZE || addr > UVM_WINDOW_START + UVM_WINDOW_SIZE - length)
		snprintf(msg, cap, "range %#lx+%lu lies past the managed window %#lx+%#lx", (unsigned long)addr, (unsigned long)length,
			 UVM_WINDOW_START, UVM_WINDOW_SIZE);
	else if (file < -1 || file + 1 >= nfiles) {
		/* files holds the CPU's and one per device, once attached */
		int ndevices = nfiles > 0 ? nfiles - 1 : 0;
		if (file == -1)
			snprintf(msg, cap, "map cpu: this session has %d devices", ndevices);
		else
			snprintf(msg, cap, "map device %d: this session has %d devices", (int)file, ndevices);
	}
	else
		return NULL;
	return msg;
}

/* minor_remote: the server counts accesses in user space, so mappings of
 * other processors' files are registered for MINOR faults too, and a hint
 * fault (see drop_mappings) reaches it (uvm/devproc.go modeFor). */
static bool minor_remote;

/* minor_own: the device's arena takes large folios, so mappings of its
 * own file are registered for MINOR faults too: the server maps a block
 * written there whole with one UFFDIO_CONTINUE, where the kernel would
 * take a minor fault a page (internal/server/continue.go). */
static bool minor_own;

static int uffd_register(uintptr_t addr, size_t length, int32_t file)
{
	struct uffdio_register r = {.range = {.start = addr, .len = length}, .mode = UFFDIO_REGISTER_MODE_MISSING | UFFDIO_REGISTER_MODE_WP};
	if (file == dev_index ? minor_own : minor_remote)
		r.mode |= UFFDIO_REGISTER_MODE_MINOR;
	return ioctl(uffd, UFFDIO_REGISTER, &r);
}

/* map_fixed maps processor file's file over [addr, addr+length) at offset
 * addr and registers it, while no kernel runs (the initial layout): no
 * thread can touch the run between the two. DONTFORK keeps the shared
 * file out of any fork a kernel makes, as in the client. */
static const char *map_fixed(uint64_t addr, uint64_t length, int32_t file, char *msg, size_t cap)
{
	if (check_run(addr, length, file, msg, cap))
		return msg;
	void *at = (void *)(uintptr_t)addr;
	if (uvm__sys_mmap(at, length, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, files[file + 1], (off_t)addr) == MAP_FAILED)
		snprintf(msg, cap, "map processor %d's file over %#lx+%lu: %s", (int)file, (unsigned long)addr, (unsigned long)length, strerror(errno));
	else if (madvise(at, length, MADV_NOHUGEPAGE) < 0)
		snprintf(msg, cap, "keep %#lx+%lu from khugepaged: %s", (unsigned long)addr, (unsigned long)length, strerror(errno));
	else if (uffd_register(addr, length, file) < 0)
		snprintf(msg, cap, "register %#lx+%lu with the userfaultfd: %s", (unsigned long)addr, (unsigned long)length, strerror(errno));
	else if (madvise(at, length, MADV_DONTFORK) < 0)
		snprintf(msg, cap, "dontfork %#lx+%lu: %s", (unsigned long)addr, (unsigned long)length, strerror(errno));
	else
		return NULL;
	return msg;
}

/* map_over maps processor file's file over [addr, addr+length) while
 * kernels may run (uvm/devproc.go mapFile): the new mapping is made at a
 * scratch address, registered and write-protected where wp says (bit i:
 * page i), and only then moved over the old one, so that no thread sees
 * it unregistered (a hole would fill with zeros) or writable where it
 * must not be (a read-duplicated page). The move keeps the protection
 * because the server asked for remap events. The caller checked the run. */
static const char *map_over(uint64_t addr, uint64_t length, int32_t file, const uint64_t wp[UVM_PAGE_MASK_WORDS], char *msg, size_t cap)
{
	bool any = false;
	for (int i = 0; i < UVM_PAGE_MASK_WORDS; i++)
		any |= wp[i] != 0;
	void *scratch = uvm__sys_mmap(NULL, length, PROT_READ | PROT_WRITE, MAP_SHARED, files[file + 1], (off_t)addr);
	if (scratch == MAP_FAILED) {
		snprintf(msg, cap, "map processor %d's file at %#lx+%lu: %s", (int)file, (unsigned long)addr, (unsigned long)length, strerror(errno));
		return msg;
	}
	/* Location files may take large folios: no mapping of one may let
	 * khugepaged collapse it, which would fill holes with zeros that read
	 * as data (docs/architecture.md, "Large folios"). */
	madvise(scratch, length, MADV_NOHUGEPAGE);
	uintptr_t s = (uintptr_t)scratch;
	if (uffd_register(s, length, file) < 0) {
		snprintf(msg, cap, "register the new mapping of %#lx+%lu: %s", (unsigned long)addr, (unsigned long)length, strerror(errno));
		goto fail;
	}
	size_t npages = length / UVM_PAGE_SIZE;
	for (size_t p = 0; p < npages && any;) {
		if (!(wp[p / 64] >> (p % 64) & 1)) {
			p++;
			continue;
		}
		size_t q = p + 1;
		while (q < npages && (wp[q / 64] >> (q % 64) & 1))
			q++;
		struct uffdio_writeprotect w = {.range = {.start = s + p * UVM_PAGE_SIZE, .len = (q - p) * UVM_PAGE_SIZE},
						.mode = UFFDIO_WRITEPROTECT_MODE_WP};
		if (ioctl(uffd, UFFDIO_WRITEPROTECT, &w) < 0) {
			snprintf(msg, cap, "write-protect pages %zu to %zu of %#lx: %s", p, q, (unsigned long)addr, strerror(errno));
			goto fail;
		}
		p = q;
	}
	if (uvm__sys_mremap(scratch, length, length, MREMAP_MAYMOVE | MREMAP_FIXED, (void *)(uintptr_t)addr) == MAP_FAILED) {
		snprintf(msg, cap, "move the new mapping over %#lx+%lu: %s", (unsigned long)addr, (unsigned long)length, strerror(errno));
		goto fail;
	}
	if (madvise((void *)(uintptr_t)addr, length, MADV_DONTFORK) < 0) {
		snprintf(msg, cap, "dontfork %#lx+%lu: %s", (unsigned long)addr, (unsigned long)length, strerror(errno));
		return msg;
	}
	return NULL;
fail:;
	int e = errno; /* for the caller, which tells ENOMEM apart */
	uvm__sys_munmap(scratch, length);
	errno = e;
	return msg;
}

/* unmap returns a freed range to the window's reservation, so that
 * nothing else is placed there (devmem.ReturnToReservation). The caller
 * checked the run. */
static const char *unmap(uint64_t addr, uint64_t length, char *msg, size_t cap)
{
	if (uvm__sys_mmap((void *)(uintptr_t)addr, length, PROT_NONE, MAP_FIXED | MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0) == MAP_FAILED) {
		snprintf(msg, cap, "unmap %#lx+%lu: %s", (unsigned long)addr, (unsigned long)length, strerror(errno));
		return msg;
	}
	return NULL;
}

/* drop_mappings drops the page-table entries of the runs a hint request
 * names (uvm/devproc.go dropMappings): the pages stay in their files, so
 * the next access is a minor fault the access counters see. */
static const char *drop_mappings(struct uvm_reader *r, char *msg, size_t cap, uint32_t *status)
{
	uint32_t runs = uvm__get_u32(r);
	for (uint32_t i = 0; i < runs && !r->err; i++) {
		uint64_t addr = uvm__get_u64(r), length = uvm__get_u64(r);
		if (r->err)
			break;
		if (check_run(addr, length, 0, msg, cap))
			return msg;
		if (madvise((void *)(uintptr_t)addr, length, MADV_DONTNEED) < 0) {
			snprintf(msg, cap, "drop the mappings of %#lx+%lu: %s", (unsigned long)addr, (unsigned long)length, strerror(errno));
			*status = UVM_WIRE_INTERNAL;
			return msg;
		}
	}
	if (r->err || r->n)
		return "device-hints request: truncated or with trailing bytes";
	return NULL;
}

/* attach hands the server this process's userfaultfd, maps the layout it
 * answers with, and says it is ready (uvm/devproc.go attachToServer). */
static void attach(void)
{
	uffd = uvm__open_userfaultfd();
	if (uffd < 0)
		setup_fail(UVM_WIRE_INITIALIZATION, "userfaultfd: %s (as root, or with vm.unprivileged_userfaultfd=1 or access to /dev/userfaultfd)", strerror(errno));
	uint8_t hb[64];
	struct uvm_msg m = {.buf = hb, .cap = sizeof hb};
	uvm__encode_device_hello(&m, 1, (uint32_t)dev_index, (uint32_t)getpid());
	int e = uvm__send(server_sock, m.buf, m.len, &uffd, 1);
	if (e)
		setup_fail(UVM_WIRE_INITIALIZATION, "send the device hello to the fault server: %s", strerror(e));

	int nfds = 0;
	ssize_t n = uvm__recv(server_sock, server_buf, UVM_MAX_MESSAGE, files, UVM_MAX_DEVICES + 1, &nfds);
	struct uvm_header h;
	struct uvm_reader r;
	if (n > 0 && uvm__parse_header(server_buf, (size_t)n, &h, &r) && h.type == UVM_MSG_DEVICE_TRACE) {
		/* The session is traced: the notice comes first, with the
		 * socket to report on; the hello's reply follows. */
		uint32_t flags = uvm__get_u32(&r);
		if (r.err || r.n != 0 || nfds != 1 || (flags & ~UVM_TRACE_LAUNCHES))
			setup_fail(UVM_WIRE_INTERNAL, "the fault server's device-trace notice is malformed (%d descriptors)", nfds);
		if (flags & UVM_TRACE_LAUNCHES)
			report_sock = files[0];
		else
			close(files[0]);
		n = uvm__recv(server_sock, server_buf, UVM_MAX_MESSAGE, files, UVM_MAX_DEVICES + 1, &nfds);
	}
	nfiles = nfds;
	if (n <= 0)
		setup_fail(UVM_WIRE_INITIALIZATION, "the fault server did not answer the device hello (%s)",
			   n == 0 ? "it closed the connection" : strerror((int)-n));
	if (!uvm__parse_header(server_buf, (size_t)n, &h, &r) || h.type != UVM_MSG_DEVICE_HELLO || h.seq != 1)
		setup_fail(UVM_WIRE_INTERNAL, "the fault server's answer to the device hello is malformed");
	if (h.status != UVM_WIRE_OK) {
		uint32_t len;
		const uint8_t *p = uvm__get_bytes(&r, &len);
		setup_fail(h.status, "the fault server refused the device: %.*s", (int)len, p ? (const char *)p : "");
	}
	if (nfiles < dev_index + 2)
		setup_fail(UVM_WIRE_INTERNAL, "the device hello reply came with %d files, want one per processor (at least %d)",
			   nfiles, dev_index + 2);

	/* No kernel runs yet, so nothing touches a run between its mapping
	 * and its registration. Later runs map over earlier ones (remote
	 * mappings over the device's own file). The flags after the runs
	 * say how to register them, and how many runs follow in
	 * device-layout messages (a long layout comes in pieces). */
	char msg[512];
	uint32_t runs = uvm__get_u32(&r);
	struct uvm_reader first_run = r;
	for (uint32_t i = 0; i < runs && !r.err; i++) {
		uvm__get_u64(&r);
		uvm__get_u64(&r);
		uvm__get_i32(&r);
	}
	minor_remote = uvm__get_u8(&r) == 1;
	minor_own = uvm__get_u8(&r) == 1;
	uint32_t more = uvm__get_u32(&r);
	if (r.err || r.n != 0)
		setup_fail(UVM_WIRE_INTERNAL, "the layout in the device hello reply is truncated or has trailing bytes");
	r = first_run;
	for (;;) {
		for (uint32_t i = 0; i < runs; i++) {
			uint64_t addr = uvm__get_u64(&r), length = uvm__get_u64(&r);
			int32_t file = uvm__get_i32(&r);
			if (map_fixed(addr, length, file, msg, sizeof msg))
				setup_fail(UVM_WIRE_INTERNAL, "%s", msg);
		}
		if (more == 0)
			break;
		int extra[8], nextra = 0;
		n = uvm__recv(server_sock, server_buf, UVM_MAX_MESSAGE, extra, 8, &nextra);
		for (int i = 0; i < nextra; i++)
			close(extra[i]);
		if (n <= 0)
			setup_fail(UVM_WIRE_INITIALIZATION, "the fault server sent %u runs of the layout fewer than it announced (%s)", more,
				   n == 0 ? "it closed the connection" : strerror((int)-n));
		if (!uvm__parse_header(server_buf, (size_t)n, &h, &r))
			setup_fail(UVM_WIRE_INTERNAL, "the fault server sent a malformed message where %u runs of the layout were due", more);
		if (h.type != UVM_MSG_DEVICE_LAYOUT)
			setup_fail(UVM_WIRE_INTERNAL, "the fault server sent a message of type %u where %u runs of the layout were due", h.type, more);
		runs = uvm__get_u32(&r);
		/* A run: address, length, file. */
		if (r.err || runs == 0 || runs > more || r.n != (size_t)runs * (8 + 8 + 4))
			setup_fail(UVM_WIRE_INTERNAL, "a device-layout message of %u runs is malformed (%u were due)", runs, more);
		more -= runs;
	}

	uvm__msg_start(&m, UVM_MSG_DEVICE_READY, 2, 0);
	e = uvm__send(server_sock, m.buf, m.len, NULL, 0);
	n = e ? -e : uvm__recv(server_sock, server_buf, UVM_MAX_MESSAGE, NULL, 0, NULL);
	if (n <= 0)
		setup_fail(UVM_WIRE_INITIALIZATION, "the fault server did not answer device-ready (%s)",
			   n == 0 ? "it closed the connection" : strerror((int)-n));
	if (!uvm__parse_header(server_buf, (size_t)n, &h, &r) || h.type != UVM_MSG_DEVICE_READY || h.seq != 2)
		setup_fail(UVM_WIRE_INTERNAL, "the fault server's answer to device-ready is malformed");
	if (h.status != UVM_WIRE_OK) {
		uint32_t len;
		const uint8_t *p = uvm__get_bytes(&r, &len);
		setup_fail(h.status, "device-ready: %.*s", (int)len, p ? (const char *)p : "");
	}
}

/* serve_server answers the server's requests to map and unmap ranges.
 * When the server goes away the device's memory is gone, and so is the
 * process. */
static void *serve_server(void *arg)
{
	(void)arg;
	for (;;) {
		int fds[8], nfds = 0;
		ssize_t n = uvm__recv(server_sock, server_buf, UVM_MAX_MESSAGE, fds, 8, &nfds);
		for (int i = 0; i < nfds; i++)
			close(fds[i]);
		if (n == 0 || (n < 0 && n != -EMSGSIZE)) {
			/* When the program exits, its private server follows it:
			 * that is no news if the client is gone too. */
			struct pollfd p = {.fd = control_sock, .events = POLLIN | POLLRDHUP};
			if (!(poll(&p, 1, 100) == 1 && (p.revents & (POLLHUP | POLLRDHUP))))
				fprintf(stderr, "softuvm device %d process %d: the fault server went away (%s); exiting\n", dev_index, (int)getpid(),
					n == 0 ? "end of file" : strerror((int)-n));
			report_flush(); /* a session's end hangs up, then waits for this */
			fflush(stdout);
			_exit(1);
		}
		struct uvm_header h;
		struct uvm_reader r;
		char msg[512];
		const char *err = NULL;
		if (n < 0 || !uvm__parse_header(server_buf, (size_t)n, &h, &r)) {
			fprintf(stderr, "softuvm device %d process %d: a malformed message from the fault server; ignored\n", dev_index, (int)getpid());
			continue;
		}
		/* A request the server should not have sent is a bad value; a
		 * system call that fails on a good one is internal. */
		uint32_t status = UVM_WIRE_INVALID_VALUE;
		if (h.type == UVM_MSG_DEVICE_MAP) {
			uint64_t addr = uvm__get_u64(&r), length = uvm__get_u64(&r);
			int32_t file = uvm__get_i32(&r);
			uint64_t wp[UVM_PAGE_MASK_WORDS], any = 0;
			for (int i = 0; i < UVM_PAGE_MASK_WORDS; i++)
				any |= wp[i] = uvm__get_u64(&r);
			if (r.err || r.n)
				err = "device-map request: truncated or with trailing bytes";
			else if (any && length > UVM_BLOCK_SIZE) {
				snprintf(msg, sizeof msg, "map of %lu bytes with write-protected pages: at most one block (%lu bytes)",
					 (unsigned long)length, UVM_BLOCK_SIZE);
				err = msg;
			} else if (!(err = check_run(addr, length, file, msg, sizeof msg)) && (err = map_over(addr, length, file, wp, msg, sizeof msg)))
				/* Out of mappings (vm.max_map_count) is no fault of
				 * the process: the server maps its own file instead. */
				status = errno == ENOMEM ? UVM_WIRE_MEMORY_ALLOCATION : UVM_WIRE_INTERNAL;
		} else if (h.type == UVM_MSG_DEVICE_UNMAP) {
			uint64_t addr = uvm__get_u64(&r), length = uvm__get_u64(&r);
			if (r.err || r.n)
				err = "device-unmap request: truncated or with trailing bytes";
			else if (!(err = check_run(addr, length, 0, msg, sizeof msg)) && (err = unmap(addr, length, msg, sizeof msg)))
				status = UVM_WIRE_INTERNAL;
		} else if (h.type == UVM_MSG_DEVICE_HINTS) {
			err = drop_mappings(&r, msg, sizeof msg, &status);
		} else if (h.type == UVM_MSG_DEVICE_TRACE) {
			continue; /* read at attach only; a later one, which no server sends, asks for no reply */
		} else {
			snprintf(msg, sizeof msg, "message type %u is not a request the server sends a device", h.type);
			err = msg;
		}
		send_reply(server_sock, h.type, h.seq, err ? status : UVM_WIRE_OK, err);
	}
	return NULL;
}

/* ---- kernels ---- */

static int crash_reported, crash_sent;

/* on_crash reports a crashing kernel to the client and lets the signal
 * kill the process. A device process cannot go on after a kernel's wild
 * write: it might have hit the runtime's own memory. Only
 * async-signal-safe calls here: the message is built by hand, and send,
 * nanosleep, sigaction and raise are safe. The first crashing thread
 * reports; one that crashes meanwhile (every block of a grid may) waits
 * until the report is sent, up to a second, rather than kill the process
 * under it. */
static void on_crash(int sig, siginfo_t *si, void *uc)
{
	(void)uc;
	const struct uvm_running *running = &uvm__running;
	if (running->active && !__atomic_exchange_n(&crash_reported, 1, __ATOMIC_SEQ_CST)) {
		/* A failed launch as the launch's reply, which launches
		 * otherwise never get: kernel, stream, thread, thread count,
		 * signal, si_code, address, and a grid's block and shape. */
		uint8_t b[128];
		struct uvm_msg m = {.buf = b, .cap = sizeof b};
		struct uvm_crash c = {.kernel = running->kernel, .stream = running->stream, .tid = running->tid, .nthreads = running->nthreads,
				      .block = running->block, .grid_dim = running->grid_dim, .block_dim = running->block_dim,
				      .sig = sig, .code = si->si_code, .addr = (uint64_t)(uintptr_t)si->si_addr};
		uvm__encode_crash(&m, &c);
		send(control_sock, b, m.len, MSG_NOSIGNAL | MSG_DONTWAIT);
		__atomic_store_n(&crash_sent, 1, __ATOMIC_SEQ_CST);
	} else {
		for (int i = 0; i < 1000 && __atomic_load_n(&crash_reported, __ATOMIC_SEQ_CST) && !__atomic_load_n(&crash_sent, __ATOMIC_SEQ_CST); i++)
			nanosleep(&(struct timespec){.tv_nsec = 1000000}, NULL);
	}
	/* The default action, then the signal again: delivered when the
	 * handler returns (a faulting instruction would fault again anyway;
	 * abort's signal would not). */
	struct sigaction dfl;
	memset(&dfl, 0, sizeof dfl);
	dfl.sa_handler = SIG_DFL;
	sigaction(sig, &dfl, NULL);
	raise(sig);
}

static void install_crash_handlers(void)
{
	static const int sigs[] = {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT, SIGTRAP, SIGSYS};
	for (size_t i = 0; i < sizeof sigs / sizeof sigs[0]; i++) {
		struct sigaction sa;
		memset(&sa, 0, sizeof sa);
		sa.sa_sigaction = on_crash;
		sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
		sigemptyset(&sa.sa_mask);
		sigaction(sigs[i], &sa, NULL);
	}
}

/* kernel_thread_start gives a thread that runs kernels an alternate
 * signal stack (a kernel that overflows its stack is still reported).
 * Returns the stack, for kernel_thread_end. */
static void *kernel_thread_start(void)
{
	void *p = uvm__sys_mmap(NULL, ALT_STACK_SIZE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (p == MAP_FAILED)
		return NULL; /* the crash is still fatal, only not reported as precisely */
	stack_t ss = {.ss_sp = p, .ss_size = ALT_STACK_SIZE};
	sigaltstack(&ss, NULL);
	return p;
}

static void kernel_thread_end(void *altstack)
{
	if (!altstack)
		return;
	stack_t ss = {.ss_flags = SS_DISABLE};
	sigaltstack(&ss, NULL);
	uvm__sys_munmap(altstack, ALT_STACK_SIZE);
}

static void run_threads(uvmKernel_t fn, uintptr_t kernel, uint32_t stream, unsigned first, unsigned outer, unsigned n, const void *params)
{
	uvm__running.kernel = kernel;
	uvm__running.stream = stream;
	uvm__running.nthreads = n;
	uvm__running.grid_dim = (uvmDim3){0, 0, 0};
	uvm__running.active = true;
	for (unsigned tid = first; tid < outer; tid++) {
		uvm__running.tid = tid;
		/* The handler runs on this thread: the compiler must not sink
		 * the stores past the call (it cannot, but say so). */
		__atomic_signal_fence(__ATOMIC_SEQ_CST);
		fn(tid, n, params);
	}
	uvm__running.active = false;
}

/* pin_to pins the calling thread to one CPU; best effort: an unpinned
 * thread still works. */
static void pin_to(int cpu)
{
	cpu_set_t set;
	CPU_ZERO(&set);
	CPU_SET(cpu, &set);
	sched_setaffinity(0, sizeof set, &set);
}

/* Worker threads run the chunks of launches wider than one thread, each
 * pinned to one CPU: a device's threads stay put, as a GPU's do, and the
 * fault server serves their faults on the CPUs they take them. */
struct launch_wait {
	pthread_mutex_t mu;
	pthread_cond_t cv;
	unsigned remaining;
};

struct chunk {
	struct chunk *next;
	struct uvm_grid *grid; /* a grid's blocks to run (then the fields up to params are unused) */
	const char *err;       /* what went wrong running them */
	uvmKernel_t fn;
	uintptr_t kernel;
	uint32_t stream;
	unsigned first, outer, n;
	const void *params;
	struct launch_wait *wait;
};

struct worker {
	pthread_mutex_t mu;
	pthread_cond_t cv;
	struct chunk *head, *tail;
	int cpu;
};

static struct worker *workers;
static unsigned nworkers;

static void *worker_main(void *arg)
{
	struct worker *w = arg;
	if (w->cpu >= 0)
		pin_to(w->cpu);
	kernel_thread_start();
	for (;;) {
		pthread_mutex_lock(&w->mu);
		while (!w->head)
			pthread_cond_wait(&w->cv, &w->mu);
		struct chunk *c = w->head;
		w->head = c->next;
		if (!w->head)
			w->tail = NULL;
		pthread_mutex_unlock(&w->mu);
		if (c->grid)
			c->err = uvm__grid_work(c->grid);
		else
			run_threads(c->fn, c->kernel, c->stream, c->first, c->outer, c->n, c->params);
		/* Under the mutex: the launching thread may free the wait as
		 * soon as it sees zero. */
		struct launch_wait *lw = c->wait;
		pthread_mutex_lock(&lw->mu);
		if (--lw->remaining == 0)
			pthread_cond_signal(&lw->cv);
		pthread_mutex_unlock(&lw->mu);
	}
	return NULL;
}

/* nth_allowed_cpu returns the i-th CPU (modulo their count) this process
 * may run on, or -1. */
static int nth_allowed_cpu(unsigned i)
{
	cpu_set_t set;
	if (sched_getaffinity(0, sizeof set, &set) < 0)
		return -1;
	int count = CPU_COUNT(&set);
	if (count == 0)
		return -1;
	unsigned want = i % (unsigned)count;
	for (int cpu = 0; cpu < CPU_SETSIZE; cpu++)
		if (CPU_ISSET(cpu, &set) && want-- == 0)
			return cpu;
	return -1;
}

static void start_workers(unsigned n)
{
	workers = uvm__sys_calloc(n, sizeof *workers);
	if (!workers)
		setup_fail(UVM_WIRE_MEMORY_ALLOCATION, "no memory for %u workers", n);
	for (unsigned i = 0; i < n; i++) {
		struct worker *w = &workers[i];
		pthread_mutex_init(&w->mu, NULL);
		pthread_cond_init(&w->cv, NULL);
		w->cpu = nth_allowed_cpu(i);
		pthread_t t;
		int e = pthread_create(&t, NULL, worker_main, w);
		if (e)
			setup_fail(UVM_WIRE_INITIALIZATION, "start worker %u of %u: %s", i, n, strerror(e));
		pthread_detach(t);
	}
	nworkers = n;
}

/* ---- streams ---- */

struct stream {
	int sock;
	uint32_t id;
	uint8_t *buf;    /* STREAM_BUF_SIZE */
	uint8_t *params; /* uvmMaxKernelParams, page-aligned */
	struct chunk *chunks;
	/* The errors since the last synchronize: the first one's status,
	 * and every message. */
	uint32_t err_status;
	char errs[2048];
	size_t errs_len;
};

static void stream_error(struct stream *st, uint32_t status, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void stream_error(struct stream *st, uint32_t status, const char *fmt, ...)
{
	if (st->err_status == UVM_WIRE_OK)
		st->err_status = status;
	else if (st->errs_len + 2 < sizeof st->errs)
		st->errs_len += (size_t)snprintf(st->errs + st->errs_len, sizeof st->errs - st->errs_len, "; ");
	if (st->errs_len + 1 >= sizeof st->errs)
		return;
	va_list ap;
	va_start(ap, fmt);
	int k = vsnprintf(st->errs + st->errs_len, sizeof st->errs - st->errs_len, fmt, ap);
	va_end(ap);
	if (k > 0)
		st->errs_len = st->errs_len + (size_t)k < sizeof st->errs ? st->errs_len + (size_t)k : sizeof st->errs - 1;
}

/* parse_kernel reads a C kernel's name, "c:0x<hex>": the function's
 * address in the program, which is this process's too. */
static bool parse_kernel(const uint8_t *name, uint32_t len, uintptr_t *out)
{
	if (len < 5 || len > 4 + 2 * sizeof(uintptr_t) || memcmp(name, "c:0x", 4) != 0)
		return false;
	uintptr_t v = 0;
	for (uint32_t i = 4; i < len; i++) {
		int c = name[i], d;
		if (c >= '0' && c <= '9')
			d = c - '0';
		else if (c >= 'a' && c <= 'f')
			d = c - 'a' + 10;
		else if (c >= 'A' && c <= 'F')
			d = c - 'A' + 10;
		else
			return false;
		v = v << 4 | (uintptr_t)d;
	}
	*out = v;
	return v != 0;
}

/* follow_launcher moves the calling stream thread to the launching
 * thread's CPU, cpu (-1: anywhere). The synchronize that follows a launch
 * waits there, and a wake-up on the same CPU is several times cheaper
 * than one across CPUs. */
static void follow_launcher(int32_t cpu)
{
	static __thread int pinned = -1;
	if (cpu >= 0 && cpu < CPU_SETSIZE && cpu != pinned) {
		pin_to(cpu);
		pinned = cpu;
	} else if (cpu < 0 && pinned >= 0) {
		/* A launcher that spins as it waits keeps its CPU: the thread
		 * goes where the scheduler puts it (the kernel intersects the
		 * mask with the cpuset). */
		cpu_set_t all;
		memset(&all, 0xff, sizeof all);
		sched_setaffinity(0, sizeof all, &all);
		pinned = -1;
	}
}

/* dispatch runs st's first parts chunks, filled in but for their wait,
 * chunk i on worker i, and waits for them all. */
static void dispatch(struct stream *st, unsigned parts)
{
	struct launch_wait lw = {.remaining = parts};
	pthread_mutex_init(&lw.mu, NULL);
	pthread_cond_init(&lw.cv, NULL);
	for (unsigned i = 0; i < parts; i++) {
		struct chunk *c = &st->chunks[i];
		c->wait = &lw;
		c->next = NULL;
		struct worker *w = &workers[i];
		pthread_mutex_lock(&w->mu);
		if (w->tail)
			w->tail->next = c;
		else
			w->head = c;
		w->tail = c;
		pthread_cond_signal(&w->cv);
		pthread_mutex_unlock(&w->mu);
	}
	pthread_mutex_lock(&lw.mu);
	while (lw.remaining)
		pthread_cond_wait(&lw.cv, &lw.mu);
	pthread_mutex_unlock(&lw.mu);
	pthread_cond_destroy(&lw.cv);
	pthread_mutex_destroy(&lw.mu);
}

/* launch runs one kernel to completion. One thread, or a device with one
 * worker, runs on the stream's thread: there is no one to share with,
 * and a hand-off would cost a wake-up. */
static void launch(struct stream *st, struct uvm_reader *r)
{
	uint32_t stream = uvm__get_u32(r), n = uvm__get_u32(r), name_len, params_len;
	const uint8_t *name = uvm__get_bytes(r, &name_len);
	const uint8_t *params = uvm__get_bytes(r, &params_len);
	int32_t cpu = uvm__get_i32(r);
	uintptr_t kernel;
	if (r->err || r->n != 0) {
		stream_error(st, UVM_WIRE_INVALID_VALUE, "device %d stream %u: a launch message truncated or with trailing bytes", dev_index, st->id);
		return;
	}
	if (n == 0 || n > UVM_MAX_LAUNCH_THREADS || params_len > uvmMaxKernelParams) {
		stream_error(st, UVM_WIRE_INVALID_VALUE, "device %d stream %u: launch of %u threads with %u bytes of parameters: want 1 to %u threads and at most %d bytes",
			     dev_index, st->id, n, params_len, UVM_MAX_LAUNCH_THREADS, uvmMaxKernelParams);
		return;
	}
	if (!parse_kernel(name, name_len, &kernel)) {
		stream_error(st, UVM_WIRE_LAUNCH_FAILURE, "device %d: kernel %.*s is not a C kernel (want c:0x<address>)", dev_index,
			     (int)(name_len > 64 ? 64 : name_len), name ? (const char *)name : "");
		return;
	}
	follow_launcher(cpu);
	/* The message puts params at an odd offset; a kernel may cast them to
	 * a struct of doubles or vectors, so it gets them page-aligned. */
	if (params_len)
		memcpy(st->params, params, params_len);
	/* A launch without params gets NULL, never the last launch's. */
	const void *kparams = params_len ? st->params : NULL;
	uvmKernel_t fn = (uvmKernel_t)kernel;
	unsigned parts = n < nworkers ? n : nworkers;
	uint64_t started = report_sock >= 0 ? monotonic_ns() : 0;
	if (parts <= 1) {
		run_threads(fn, kernel, stream, 0, n, n, kparams);
	} else {
		for (unsigned i = 0; i < parts; i++)
			st->chunks[i] = (struct chunk){.fn = fn, .kernel = kernel, .stream = stream, .n = n, .params = kparams,
						       .first = (unsigned)((uint64_t)i * n / parts), .outer = (unsigned)((uint64_t)(i + 1) * n / parts)};
		dispatch(st, parts);
	}
	if (report_sock >= 0)
		report_add(UVM_REPORT_LAUNCH, st->id, n, started, monotonic_ns(), name, name_len);
}

/* A cooperative grid's block on a thread of its own. */
struct coop_block {
	struct uvm_grid *g;
	uint64_t index;
	int cpu;
	const char *err;
};

static void *coop_block_main(void *arg)
{
	struct coop_block *cb = arg;
	if (cb->cpu >= 0)
		pin_to(cb->cpu);
	void *altstack = kernel_thread_start();
	cb->err = uvm__grid_run_block(cb->g, cb->index);
	uvm__grid_thread_end();
	kernel_thread_end(altstack);
	return NULL;
}

/* run_cooperative runs every block of g at once, each on a thread of its
 * own pinned to a worker's CPU in turn. A block whose thread cannot start
 * is counted out of the grid's barrier (the others do not wait for it)
 * and the launch fails. */
static void run_cooperative(struct stream *st, struct uvm_grid *g)
{
	struct coop_block *cbs = uvm__sys_calloc(g->blocks, sizeof *cbs);
	pthread_t *ts = uvm__sys_calloc(g->blocks, sizeof *ts);
	uint64_t started = 0;
	const char *err = NULL;
	int e = 0;
	if (!cbs || !ts)
		err = "no memory for the blocks' threads";
	for (uint64_t i = 0; !err && i < g->blocks; i++) {
		cbs[i] = (struct coop_block){.g = g, .index = i, .cpu = workers[i % nworkers].cpu};
		pthread_attr_t attr;
		pthread_attr_init(&attr);
		pthread_attr_setstacksize(&attr, 1u << 20);
		if ((e = pthread_create(&ts[i], &attr, coop_block_main, &cbs[i])))
			err = "a block's thread could not start";
		else
			started++;
		pthread_attr_destroy(&attr);
	}
	for (uint64_t i = started; i < g->blocks; i++)
		uvm__grid_block_done(g);
	for (uint64_t i = 0; i < started; i++) {
		pthread_join(ts[i], NULL);
		if (cbs[i].err && !err)
			err = cbs[i].err;
	}
	if (err)
		stream_error(st, UVM_WIRE_LAUNCH_FAILURE, "device %d stream %u: cooperative grid of %llu blocks: %s (%llu of them started)%s%s", dev_index,
			     st->id, (unsigned long long)g->blocks, err, (unsigned long long)started, e ? ": " : "", e ? strerror(e) : "");
	uvm__sys_free(cbs);
	uvm__sys_free(ts);
}

/* launch_grid runs one grid launch to completion (block.c runs the
 * blocks): a block at a time on each worker, as many workers as blocks,
 * or on the stream's thread for one block or one worker; a cooperative
 * grid's blocks all at once. */
static void launch_grid(struct stream *st, struct uvm_reader *r)
{
	struct uvm_launch_grid lg;
	uintptr_t kernel;
	char msg[384];
	if (!uvm__decode_launch_grid(r, &lg)) {
		stream_error(st, UVM_WIRE_INVALID_VALUE, "device %d stream %u: a launch-grid message truncated or with trailing bytes", dev_index, st->id);
		return;
	}
	if (uvm__grid_check(lg.grid, lg.block, lg.shared, lg.stack, msg, sizeof msg) || lg.params_len > uvmMaxKernelParams ||
	    (lg.flags & ~UVM_GRID_COOPERATIVE)) {
		stream_error(st, UVM_WIRE_INVALID_VALUE, "device %d stream %u: launch-grid of %u bytes of parameters, flags %#x: %s", dev_index, st->id,
			     lg.params_len, lg.flags, uvm__grid_check(lg.grid, lg.block, lg.shared, lg.stack, msg, sizeof msg) ? msg : "bad parameters or flags");
		return;
	}
	if (!parse_kernel(lg.name, lg.name_len, &kernel)) {
		stream_error(st, UVM_WIRE_LAUNCH_FAILURE, "device %d: kernel %.*s is not a C kernel (want c:0x<address>)", dev_index,
			     (int)(lg.name_len > 64 ? 64 : lg.name_len), lg.name ? (const char *)lg.name : "");
		return;
	}
	follow_launcher(lg.cpu);
	if (lg.params_len)
		memcpy(st->params, lg.params, lg.params_len);
	uint64_t blocks = (uint64_t)lg.grid.x * lg.grid.y * lg.grid.z;
	unsigned threads = lg.block.x * lg.block.y * lg.block.z;
	uint64_t total = blocks * threads;
	struct uvm_grid g = {.fn = (uvmGridKernel_t)kernel, .params = lg.params_len ? st->params : NULL, .kernel = kernel, .device = dev_index, .stream = lg.stream,
			     .grid = lg.grid, .block = lg.block, .blocks = blocks, .threads = threads,
			     .stack = lg.stack,
			     .cooperative = lg.flags & UVM_GRID_COOPERATIVE, .alive = blocks};
	pthread_mutex_init(&g.mu, NULL);
	pthread_cond_init(&g.cv, NULL);
	uint64_t started = report_sock >= 0 ? monotonic_ns() : 0;
	const char *err = NULL;
	if (g.cooperative) {
		run_cooperative(st, &g);
	} else {
		unsigned parts = blocks < nworkers ? (unsigned)blocks : nworkers;
		if (parts <= 1) {
			err = uvm__grid_work(&g);
		} else {
			for (unsigned i = 0; i < parts; i++)
				st->chunks[i] = (struct chunk){.grid = &g};
			dispatch(st, parts);
			for (unsigned i = 0; i < parts && !err; i++)
				err = st->chunks[i].err;
		}
	}
	if (err)
		stream_error(st, UVM_WIRE_LAUNCH_FAILURE, "device %d stream %u: grid of %llu blocks: %s", dev_index, st->id, (unsigned long long)blocks, err);
	pthread_cond_destroy(&g.cv);
	pthread_mutex_destroy(&g.mu);
	if (report_sock >= 0)
		report_add(UVM_REPORT_LAUNCH, st->id, total > UVM_MAX_LAUNCH_THREADS ? UVM_MAX_LAUNCH_THREADS : (uint32_t)total, started, monotonic_ns(),
			   lg.name, lg.name_len);
}

/* serve_stream runs one stream: its launches in order, and answers its
 * synchronizations with the errors since the last one. */
static void *serve_stream(void *arg)
{
	struct stream *st = arg;
	void *altstack = kernel_thread_start();
	for (;;) {
		ssize_t n = uvm__recv(st->sock, st->buf, STREAM_BUF_SIZE, NULL, 0, NULL);
		if (n == 0 || (n < 0 && n != -EMSGSIZE))
			break; /* the client closed the stream, or went away */
		uint64_t took = report_sock >= 0 ? monotonic_ns() : 0; /* when a traced stream took the message up */
		struct uvm_header h;
		struct uvm_reader r;
		if (n < 0 || !uvm__parse_header(st->buf, (size_t)n, &h, &r)) {
			stream_error(st, UVM_WIRE_INVALID_VALUE, "device %d stream %u: a malformed message (%zd bytes)", dev_index, st->id, n);
			continue;
		}
		if (h.type == UVM_MSG_LAUNCH) {
			launch(st, &r);
			continue;
		}
		if (h.type == UVM_MSG_LAUNCH_GRID) {
			launch_grid(st, &r);
			continue;
		}
		if (h.type == UVM_MSG_STREAM_DESTROY)
			break; /* what was queued before it has run */
		if (h.type != UVM_MSG_SYNC) {
			stream_error(st, UVM_WIRE_INVALID_VALUE, "device %d stream %u: message type %u is not a request a client sends a stream",
				     dev_index, st->id, h.type);
			continue;
		}
		/* What kernels printed shows by the time the synchronize
		 * returns, as CUDA's device printf does. */
		fflush(stdout);
		st->errs[st->errs_len] = '\0';
		if (report_sock >= 0)
			report_add(UVM_REPORT_SYNC, st->id, 0, took, monotonic_ns(), (const uint8_t *)"", 0);
		send_reply(st->sock, h.type, h.seq, st->err_status, st->errs);
		st->err_status = UVM_WIRE_OK;
		st->errs_len = 0;
	}
	report_flush(); /* the stream's kernels since its last synchronize */
	close(st->sock);
	uvm__grid_thread_end();
	kernel_thread_end(altstack);
	uvm__sys_munmap(st->buf, STREAM_BUF_SIZE);
	uvm__sys_munmap(st->params, uvmMaxKernelParams);
	uvm__sys_free(st->chunks);
	uvm__sys_free(st);
	return NULL;
}

/* start_stream serves stream id on sock, on a thread of its own. */
static bool start_stream(uint32_t id, int sock)
{
	struct stream *st = uvm__sys_calloc(1, sizeof *st);
	if (!st)
		return false;
	st->sock = sock;
	st->id = id;
	st->buf = uvm__sys_mmap(NULL, STREAM_BUF_SIZE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	st->params = uvm__sys_mmap(NULL, uvmMaxKernelParams, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	st->chunks = uvm__sys_calloc(nworkers ? nworkers : 1, sizeof *st->chunks);
	pthread_t t;
	if (st->buf == MAP_FAILED || st->params == MAP_FAILED || !st->chunks || pthread_create(&t, NULL, serve_stream, st) != 0) {
		if (st->buf != MAP_FAILED)
			uvm__sys_munmap(st->buf, STREAM_BUF_SIZE);
		if (st->params != MAP_FAILED)
			uvm__sys_munmap(st->params, uvmMaxKernelParams);
		uvm__sys_free(st->chunks);
		uvm__sys_free(st);
		return false;
	}
	pthread_detach(t);
	return true;
}

/* serve_control accepts the client's new streams until the client goes
 * away; then the process ends: it exists for its client. */
static void serve_control(void) __attribute__((noreturn));
static void serve_control(void)
{
	uint8_t buf[256];
	for (;;) {
		int fd = -1, nfds = 0;
		ssize_t n = uvm__recv(control_sock, buf, sizeof buf, &fd, 1, &nfds);
		if (n == 0 || (n < 0 && n != -EMSGSIZE)) {
			report_flush(); /* the client is gone, and the process ends with it */
			fflush(stdout);
			_exit(0);
		}
		struct uvm_header h;
		struct uvm_reader r;
		bool ok = n > 0 && uvm__parse_header(buf, (size_t)n, &h, &r) && h.type == UVM_MSG_STREAM_OPEN && nfds == 1;
		uint32_t id = ok ? uvm__get_u32(&r) : 0;
		if (!ok || r.err) {
			fprintf(stderr, "softuvm device %d process %d: a control message that is not a stream-open with one socket; ignored\n", dev_index,
				(int)getpid());
			if (nfds)
				close(fd);
			continue;
		}
		if (!start_stream(id, fd)) {
			/* The client would wait forever on a stream nobody serves:
			 * dying is the failure it can see, and report. */
			fprintf(stderr, "softuvm device %d process %d: no memory or thread for stream %u; exiting\n", dev_index, (int)getpid(), id);
			fflush(stdout);
			_exit(1);
		}
	}
}

void uvm__device_main(int device, int nwork, int server, int control, int stream0)
{
	uvm__device_process = device;
	dev_index = device;
	server_sock = server;
	control_sock = control;
	int keep[] = {server, control, stream0};
	close_other_fds(keep, 3);
	reset_signals();
	/* The fork copied the launching thread's CPU affinity, which the
	 * program may have narrowed; the device's threads choose their own
	 * CPUs among all it may use (the kernel intersects this mask with
	 * the cpuset). */
	cpu_set_t all;
	memset(&all, 0xff, sizeof all);
	sched_setaffinity(0, sizeof all, &all);
	setpgid(0, 0);
	char name[16];
	snprintf(name, sizeof name, "uvm-device-%d", device);
	prctl(PR_SET_NAME, name);
	/* Output the program buffered before the fork is the program's to
	 * write, not this copy's. */
	__fpurge(stdout);
	__fpurge(stderr);

	/* The window is where the client's ranges live: this process maps
	 * them at the same addresses. The client's own are MADV_DONTFORK, so
	 * what the fork left here is at most a reservation in progress: map
	 * over it rather than fail. */
	if (uvm__sys_mmap((void *)UVM_WINDOW_START, UVM_WINDOW_SIZE, PROT_NONE, MAP_FIXED | MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0) == MAP_FAILED)
		setup_fail(UVM_WIRE_INITIALIZATION, "reserve the managed window %#lx+%#lx: %s", UVM_WINDOW_START, UVM_WINDOW_SIZE,
			   strerror(errno));
	server_buf = uvm__sys_mmap(NULL, UVM_MAX_MESSAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (server_buf == MAP_FAILED)
		setup_fail(UVM_WIRE_MEMORY_ALLOCATION, "map a message buffer: %s", strerror(errno));

	attach();
	install_crash_handlers();
	start_workers(nwork > 0 ? (unsigned)nwork : 1);
	pthread_t t;
	int e = pthread_create(&t, NULL, serve_server, NULL);
	if (e)
		setup_fail(UVM_WIRE_INITIALIZATION, "start the thread that serves the fault server: %s", strerror(e));
	pthread_detach(t);
	if (report_sock >= 0) {
		if ((e = pthread_create(&t, NULL, report_main, NULL)))
			setup_fail(UVM_WIRE_INITIALIZATION, "start the thread that sends launch reports: %s", strerror(e));
		pthread_detach(t);
	}
	if (!start_stream(0, stream0))
		setup_fail(UVM_WIRE_INITIALIZATION, "start the default stream's thread");
	send_reply(control_sock, UVM_MSG_DEVICE_UP, 0, UVM_WIRE_OK, NULL);
	serve_control();
}
