/*
 * device.c: devices, streams and launches, the program's side
 * (uvm/device.go). The device's side is devproc.c.
 *
 * Each device runs kernels in a process of its own, forked from the
 * program at the device's first launch so that the program's function
 * pointers are valid there. Launches and synchronizations go to it
 * directly, not through the fault server: each stream is a
 * SOCK_SEQPACKET socket of its own, opened in the process over its
 * control connection (msgStreamOpen, with the socket). A launch is one
 * message and no reply; a synchronize writes msgSync on each stream it
 * waits for and reads the answer, which carries the errors of the
 * stream's kernels since the last one.
 *
 * A device process that dies (a kernel crashed in it, or someone killed
 * it) is found out by the next synchronize (the end of file on a stream)
 * or launch (a failed write, or waitpid), and reported by the next
 * synchronize as uvmErrorLaunchFailure, naming the kernel. The next
 * launch forks a new process, which maps the device's file again: the
 * data it held is in the server's file, nothing is lost.
 *
 * Locks: a device's mu serializes its use (launches, synchronizations,
 * restarts) and guards its fields; streams_mu guards the stream table and
 * is taken inside a device's mu, never around it. Both come before the
 * session's locks (uvm__request).
 */
#include "internal.h"

#include <elf.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <link.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

_Static_assert(sizeof(uintptr_t) == 8, "stream handles pack a slot and a generation into a pointer: 64-bit Linux only");

/* Distinct (kernel, stream) pairs a death report names; more are
 * counted. */
#define MAX_OUTSTANDING 8
/* A synchronize's answer carries the errors of a stream's kernels. */
#define REPLY_BUF_SIZE (64u << 10)
/* How long a new device process may take to map the session's ranges. */
#define UP_TIMEOUT_MS 30000
/* How long a process whose sockets closed may take to finish dying. */
#define REAP_TIMEOUT_MS 2000
/* How long to retry a start the server refuses because the dead
 * process's view is still attached (it notices the death on its own). */
#define RESTART_RETRY_MS 2000

/* ---- the current device ---- */

static __thread int current_device;

int uvm__current_device(void) { return current_device; }

static uvmError_t refuse_in_device(const char *fn)
{
	return uvm__fail(uvmErrorNotSupported, "%s called in device %d's process (by a kernel): kernels cannot use the host API", fn,
			 uvm__device_process);
}

/* get_session returns the session in *sp and checks that device d is one
 * of its devices; what says what was being done, for the message. */
static uvmError_t get_device(int d, const char *what, struct uvm_session **sp)
{
	uvmError_t err;
	struct uvm_session *s = uvm__session(&err);
	if (!s)
		return err;
	if (sp)
		*sp = s;
	if (d >= 0 && d < s->ndevices)
		return uvmSuccess;
	if (s->ndevices == 0)
		return uvm__fail(uvmErrorInvalidDevice, "%s device %d: there are no devices (the server was started with UVM_DEVICES=0)", what, d);
	if (s->ndevices == 1)
		return uvm__fail(uvmErrorInvalidDevice, "%s device %d: want device 0, the only one", what, d);
	return uvm__fail(uvmErrorInvalidDevice, "%s device %d: want a device from 0 to %d", what, d, s->ndevices - 1);
}

uvmError_t uvmGetDeviceCount(int *count)
{
	if (uvm__device_process >= 0)
		return refuse_in_device("uvmGetDeviceCount");
	if (!count)
		return uvm__fail(uvmErrorInvalidValue, "uvmGetDeviceCount: count is NULL; want a pointer to an int");
	uvmError_t err;
	struct uvm_session *s = uvm__session(&err);
	if (!s)
		return err;
	*count = s->ndevices;
	return uvm__ok();
}

uvmError_t uvmSetDevice(int device)
{
	if (uvm__device_process >= 0)
		return refuse_in_device("uvmSetDevice");
	uvmError_t err = get_device(device, "uvmSetDevice:", NULL);
	if (err)
		return err;
	current_device = device;
	return uvm__ok();
}

uvmError_t uvmGetDevice(int *device)
{
	if (!device)
		return uvm__fail(uvmErrorInvalidValue, "uvmGetDevice: device is NULL; want a pointer to an int");
	*device = current_device;
	return uvm__ok();
}

uvmError_t uvmDeviceGetAttribute(int *value, uvmDeviceAttr attr, int device)
{
	if (uvm__device_process >= 0)
		return refuse_in_device("uvmDeviceGetAttribute");
	if (!value)
		return uvm__fail(uvmErrorInvalidValue, "uvmDeviceGetAttribute: value is NULL; want a pointer to an int");
	struct uvm_session *s = NULL;
	uvmError_t err = get_device(device, "uvmDeviceGetAttribute: attribute of", &s);
	if (err)
		return err;
	const struct uvm_device_info *info = &s->devices[device];
	switch (attr) {
	case uvmDevAttrMultiProcessorCount:
		*value = info->workers;
		return uvm__ok();
	case uvmDevAttrCanMapHostMemory:
	case uvmDevAttrConcurrentManagedAccess:
		*value = 1;
		return uvm__ok();
	case uvmDevAttrPageableMemoryAccess:
		*value = 0;
		return uvm__ok();
	case uvmDevAttrArenaCapacityMiB:
		*value = info->capacity >> 20 > INT_MAX ? INT_MAX : (int)(info->capacity >> 20);
		return uvm__ok();
	}
	return uvm__fail(uvmErrorInvalidValue,
			 "uvmDeviceGetAttribute: device attribute %d: want uvmDevAttrMultiProcessorCount (%d), uvmDevAttrCanMapHostMemory (%d), "
			 "uvmDevAttrPageableMemoryAccess (%d), uvmDevAttrConcurrentManagedAccess (%d) or uvmDevAttrArenaCapacityMiB (%d)",
			 (int)attr, uvmDevAttrMultiProcessorCount, uvmDevAttrCanMapHostMemory, uvmDevAttrPageableMemoryAccess,
			 uvmDevAttrConcurrentManagedAccess, uvmDevAttrArenaCapacityMiB);
}

/* ---- device processes ---- */

/* A stream's socket in the running process. */
struct stream_sock {
	uint32_t id;
	int fd;
	uint32_t sync_seq; /* the synchronize in flight on it */
	bool waiting;
};

/* A kernel launched since its stream's last synchronize: what a death
 * interrupted. */
struct outstanding {
	uintptr_t kernel;
	uint32_t stream;
};

/* The program's handle on one device's process. */
struct uvm_device {
	pthread_mutex_t mu;
	pid_t pid;   /* the process, 0 while none runs */
	int control; /* opens streams in it; -1 while none runs */
	struct stream_sock *socks; /* the streams opened in it; stream 0 first */
	size_t nsocks, socks_cap;
	uint32_t next_stream; /* the last stream id given out (atomic) */
	uint32_t seq;
	uint8_t *buf; /* REPLY_BUF_SIZE, for synchronize's answers */
	/* A death not yet reported by a synchronize. */
	uvmError_t pending;
	char pending_msg[1024];
	struct outstanding outstanding[MAX_OUTSTANDING];
	size_t noutstanding;
	uint64_t more_outstanding; /* launches beyond those listed */
};

static struct uvm_device devices[UVM_MAX_DEVICES] = {
	[0 ... UVM_MAX_DEVICES - 1] = {.mu = PTHREAD_MUTEX_INITIALIZER, .control = -1},
};

/* ---- naming kernels ---- */

struct object_find {
	uintptr_t addr, bias;
	char path[PATH_MAX];
	bool found;
};

static int find_object(struct dl_phdr_info *info, size_t size, void *arg)
{
	(void)size;
	struct object_find *f = arg;
	for (int i = 0; i < info->dlpi_phnum; i++) {
		const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
		uintptr_t start = info->dlpi_addr + ph->p_vaddr;
		if (ph->p_type == PT_LOAD && f->addr >= start && f->addr - start < ph->p_memsz) {
			f->bias = info->dlpi_addr;
			/* The program itself has no name here. */
			snprintf(f->path, sizeof f->path, "%s", info->dlpi_name && info->dlpi_name[0] ? info->dlpi_name : "/proc/self/exe");
			f->found = true;
			return 1;
		}
	}
	return 0;
}

/* symbol_of finds the function that holds offset off of the ELF file at
 * path (its full symbol table, else its dynamic one), and how far into
 * it off lies. */
static bool symbol_of(const char *path, uintptr_t off, char *name, size_t cap, uintptr_t *delta)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return false;
	struct stat st;
	if (fstat(fd, &st) < 0 || st.st_size < (off_t)sizeof(ElfW(Ehdr))) {
		close(fd);
		return false;
	}
	size_t size = (size_t)st.st_size;
	const uint8_t *b = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
	close(fd);
	if (b == MAP_FAILED)
		return false;
	bool found = false;
	const ElfW(Ehdr) *eh = (const void *)b;
	if (memcmp(eh->e_ident, ELFMAG, SELFMAG) != 0 || eh->e_ident[EI_CLASS] != ELFCLASS64 || eh->e_shentsize != sizeof(ElfW(Shdr)) ||
	    eh->e_shoff > size || eh->e_shnum > (size - eh->e_shoff) / sizeof(ElfW(Shdr)))
		goto out;
	const ElfW(Shdr) *sh = (const void *)(b + eh->e_shoff);
	for (int pass = 0; pass < 2 && !found; pass++) {
		unsigned want = pass == 0 ? SHT_SYMTAB : SHT_DYNSYM;
		for (unsigned i = 0; i < eh->e_shnum && !found; i++) {
			if (sh[i].sh_type != want || sh[i].sh_link >= eh->e_shnum || sh[i].sh_entsize != sizeof(ElfW(Sym)))
				continue;
			const ElfW(Shdr) *strs = &sh[sh[i].sh_link];
			if (sh[i].sh_offset > size || sh[i].sh_size > size - sh[i].sh_offset || strs->sh_offset > size ||
			    strs->sh_size > size - strs->sh_offset)
				continue;
			const ElfW(Sym) *syms = (const void *)(b + sh[i].sh_offset);
			const char *str = (const char *)(b + strs->sh_offset);
			const ElfW(Sym) *best = NULL;
			for (size_t k = 0; k < sh[i].sh_size / sizeof(ElfW(Sym)); k++) {
				const ElfW(Sym) *y = &syms[k];
				unsigned type = ELF64_ST_TYPE(y->st_info);
				if ((type != STT_FUNC && type != STT_GNU_IFUNC) || y->st_shndx == SHN_UNDEF || y->st_name >= strs->sh_size)
					continue;
				if (off < y->st_value || off - y->st_value >= (y->st_size ? y->st_size : 1))
					continue;
				if (!best || y->st_value > best->st_value)
					best = y;
			}
			if (best) {
				size_t len = strnlen(str + best->st_name, strs->sh_size - best->st_name);
				snprintf(name, cap, "%.*s", (int)len, str + best->st_name);
				*delta = off - best->st_value;
				found = len > 0;
			}
		}
	}
out:
	munmap((void *)b, size);
	return found;
}

/* describe_kernel names a kernel for messages: "name (0xaddress)", or
 * the address alone in a stripped program. */
static void describe_kernel(uintptr_t k, char *out, size_t cap)
{
	struct object_find f = {.addr = k};
	char name[128];
	uintptr_t delta = 0;
	if (dl_iterate_phdr(find_object, &f) && f.found && symbol_of(f.path, k - f.bias, name, sizeof name, &delta)) {
		if (delta)
			snprintf(out, cap, "%s+%#lx (%#lx)", name, (unsigned long)delta, (unsigned long)k);
		else
			snprintf(out, cap, "%s (%#lx)", name, (unsigned long)k);
		return;
	}
	snprintf(out, cap, "%#lx", (unsigned long)k);
}

/* ---- deaths ---- */

/* reap collects the exit status of device process pid, which is dying
 * (its sockets closed); one that does not die within ms milliseconds is
 * killed. Returns false when the status went elsewhere: SIGCHLD is
 * ignored, or the program's own waitpid(-1) took it. Only ever by pid: the
 * program's other children are its business. It kills only a pid that
 * waitpid has just said is a live child, never one that may have been
 * reaped and reused. */
static bool reap(pid_t pid, int *status, int ms)
{
	for (int waited = 0;; waited++) {
		pid_t r = waitpid(pid, status, WNOHANG);
		if (r == pid)
			return true;
		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0)
			return false;
		if (waited >= ms) {
			kill(pid, SIGKILL);
			do
				r = waitpid(pid, status, 0);
			while (r < 0 && errno == EINTR);
			return r == pid;
		}
		nanosleep(&(struct timespec){.tv_nsec = 1000000}, NULL);
	}
}

static void describe_end(bool known, int status, char *out, size_t cap)
{
	if (!known) {
		snprintf(out, cap, "exited (its exit status went elsewhere: SIGCHLD is ignored, or the program's waitpid took it)");
	} else if (WIFSIGNALED(status)) {
		int sig = WTERMSIG(status);
		const char *d = sigdescr_np(sig);
		char desc[64];
		snprintf(desc, sizeof desc, "%s", d ? d : "unknown signal");
		if (desc[0] >= 'A' && desc[0] <= 'Z')
			desc[0] = (char)(desc[0] - 'A' + 'a'); /* as Go names signals */
		snprintf(out, cap, "was killed by signal %d (%s)", sig, desc);
	} else {
		snprintf(out, cap, "exited with status %d", WEXITSTATUS(status));
	}
}

/* describe_crash says what a crashing kernel thread did, from the signal
 * devproc.c's handler caught. */
static void describe_crash(int sig, int code, uint64_t addr, char *out, size_t cap)
{
	const char *why = "";
	switch (sig) {
	case SIGSEGV:
		why = code == SEGV_MAPERR   ? "nothing is mapped there in the device: kernels reach managed, device and mapped host memory"
		      : code == SEGV_ACCERR ? "the mapping does not allow that access"
					    : "a segmentation fault";
		snprintf(out, cap, "touched address %#lx (%s)", (unsigned long)addr, why);
		return;
	case SIGBUS:
		why = code == BUS_ADRALN ? "misaligned" : code == BUS_ADRERR ? "beyond the end of its file" : "a poisoned page: the fault server is gone or could not serve it";
		snprintf(out, cap, "touched address %#lx (%s)", (unsigned long)addr, why);
		return;
	case SIGFPE:
		why = code == FPE_INTDIV ? "an integer division by zero" : code == FPE_INTOVF ? "an integer overflow" : "an arithmetic exception";
		snprintf(out, cap, "raised %s at instruction %#lx", why, (unsigned long)addr);
		return;
	case SIGILL:
		snprintf(out, cap, "executed an illegal instruction at %#lx", (unsigned long)addr);
		return;
	case SIGTRAP:
		snprintf(out, cap, "hit a trap or breakpoint at %#lx", (unsigned long)addr);
		return;
	case SIGABRT:
		snprintf(out, cap, "called abort()");
		return;
	}
	snprintf(out, cap, "got signal %d", sig);
}

/* close_conns closes the control and stream sockets. d->mu is held. */
static void close_conns(struct uvm_device *d)
{
	for (size_t i = 0; i < d->nsocks; i++)
		close(d->socks[i].fd);
	d->nsocks = 0;
	if (d->control >= 0)
		close(d->control);
	d->control = -1;
}

/* died records that device index's process went away, naming what it was
 * running, for the next synchronize, and closes its sockets. It reaps the
 * process unless the caller did (reaped; then known says whether status
 * is its wait status). d->mu is held. The error that revealed the death
 * (an end of file, a broken pipe) says nothing the exit status does not. */
static void died(struct uvm_device *d, int index, bool reaped, bool known, int status)
{
	if (!reaped)
		known = reap(d->pid, &status, REAP_TIMEOUT_MS);
	char how[128], what[320], name[160];
	describe_end(known, status, how, sizeof how);

	/* The crash handler's report, if a kernel crashed: queued on the
	 * control socket before the process died, and still readable. */
	uint8_t rb[128];
	ssize_t got = d->control >= 0 ? recv(d->control, rb, sizeof rb, MSG_DONTWAIT) : -1;
	struct uvm_header h;
	struct uvm_reader r;
	bool crash = got > 0 && uvm__parse_header(rb, (size_t)got, &h, &r) && h.type == UVM_MSG_LAUNCH && h.status == UVM_WIRE_LAUNCH_FAILURE;
	struct uvm_crash c;
	if (crash && (crash = uvm__decode_crash(&r, &c))) {
		char detail[160];
		describe_kernel((uintptr_t)c.kernel, name, sizeof name);
		describe_crash(c.sig, c.code, c.addr, detail, sizeof detail);
		snprintf(what, sizeof what, "while kernel %.100s was running on stream %u: its thread %u of %u %.150s", name, c.stream, c.tid,
			 c.nthreads, detail);
	}
	if (!crash) {
		if (d->noutstanding == 0) {
			snprintf(what, sizeof what, "with no kernel running");
		} else {
			size_t len = (size_t)snprintf(what, sizeof what, "while %s ", d->noutstanding + d->more_outstanding > 1 ? "kernels" : "kernel");
			for (size_t i = 0; i < d->noutstanding && len < sizeof what; i++) {
				describe_kernel(d->outstanding[i].kernel, name, sizeof name);
				len += (size_t)snprintf(what + len, sizeof what - len, "%s%s (stream %u)", i ? ", " : "", name, d->outstanding[i].stream);
			}
			if (len < sizeof what && d->more_outstanding)
				len += (size_t)snprintf(what + len, sizeof what - len, " and %lu more", (unsigned long)d->more_outstanding);
			if (len < sizeof what)
				snprintf(what + len, sizeof what - len, " %s running or queued", d->noutstanding + d->more_outstanding > 1 ? "were" : "was");
		}
	}
	char msg[sizeof how + sizeof what + 128];
	snprintf(msg, sizeof msg, "device %d: its process (pid %d) %s %s; the device's memory is intact and the next launch starts a new process",
		 index, (int)d->pid, how, what);
	/* A second death before a synchronize (a restart that died too) is
	 * appended, as far as it fits. */
	size_t used = d->pending ? strlen(d->pending_msg) : 0;
	if (used && used + 2 < sizeof d->pending_msg) {
		memcpy(d->pending_msg + used, "; ", 2);
		used += 2;
	}
	size_t n = strlen(msg);
	if (n > sizeof d->pending_msg - 1 - used)
		n = sizeof d->pending_msg - 1 - used;
	memcpy(d->pending_msg + used, msg, n);
	d->pending_msg[used + n] = '\0';
	d->pending = uvmErrorLaunchFailure;
	close_conns(d);
	d->pid = 0;
}

/* ---- starting a device process ---- */

/* recv_within receives one message on sock within ms milliseconds;
 * -ETIMEDOUT if none came. */
static ssize_t recv_within(int sock, void *buf, size_t cap, int ms)
{
	struct timespec start, now;
	clock_gettime(CLOCK_MONOTONIC, &start);
	for (;;) {
		clock_gettime(CLOCK_MONOTONIC, &now);
		long left = ms - ((now.tv_sec - start.tv_sec) * 1000 + (now.tv_nsec - start.tv_nsec) / 1000000);
		if (left <= 0)
			return -ETIMEDOUT;
		struct pollfd p = {.fd = sock, .events = POLLIN};
		int k = poll(&p, 1, (int)left);
		if (k < 0 && errno != EINTR)
			return -errno;
		if (k > 0)
			return uvm__recv(sock, buf, cap, NULL, 0, NULL);
	}
}

/* start_process forks device index's process and waits until it has
 * mapped the session's ranges. *retry says the server still had the
 * previous process's view: worth trying again shortly. d->mu is held. */
static uvmError_t start_process(struct uvm_session *s, struct uvm_device *d, int index, bool *retry)
{
	*retry = false;
	if (!d->buf && !(d->buf = uvm__sys_malloc(REPLY_BUF_SIZE)))
		return uvm__fail(uvmErrorMemoryAllocation, "start device %d's process: no memory for its reply buffer", index);
	if (!d->socks) {
		d->socks = uvm__sys_calloc(4, sizeof *d->socks);
		if (!d->socks)
			return uvm__fail(uvmErrorMemoryAllocation, "start device %d's process: no memory for its stream table", index);
		d->socks_cap = 4;
	}
	/* The server makes the socket the process says hello on. */
	uint8_t qb[32], rb[16];
	struct uvm_msg m = {.buf = qb, .cap = sizeof qb};
	uvm__encode_processor(&m, UVM_MSG_DEVICE_CONNECT, 0, index);
	struct uvm_reader r;
	int server = -1, nfds = 0;
	uvmError_t err = uvm__request(s, &m, NULL, 0, rb, sizeof rb, &r, &server, 1, &nfds, "start a device process: device connect");
	if (err)
		return err;
	if (nfds != 1)
		return uvm__fail(uvmErrorUnknown, "start device %d's process: the server's device connection came with %d descriptors, want 1", index,
				 nfds);
	int ctl[2], st0[2];
	if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, ctl) < 0) {
		int e = errno;
		close(server);
		return uvm__fail(uvmErrorInitializationError, "start device %d's process: socketpair: %s", index, strerror(e));
	}
	if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, st0) < 0) {
		int e = errno;
		close(server), close(ctl[0]), close(ctl[1]);
		return uvm__fail(uvmErrorInitializationError, "start device %d's process: socketpair: %s", index, strerror(e));
	}
	int workers = s->devices[index].workers > 0 ? s->devices[index].workers : 1;

	/* The session's fork handlers would copy managed memory for the
	 * child, which a device process maps from the server instead. */
	uvm__in_device_fork = true;
	pid_t pid = fork();
	if (pid == 0)
		uvm__device_main(index, workers, server, ctl[1], st0[1]);
	int fork_errno = errno;
	uvm__in_device_fork = false;
	close(server), close(ctl[1]), close(st0[1]);
	if (pid < 0) {
		close(ctl[0]), close(st0[0]);
		return uvm__fail(uvmErrorInitializationError, "start device %d's process: fork: %s", index, strerror(fork_errno));
	}

	/* It says device-up once every range is mapped, or why it could
	 * not. */
	uint8_t ub[2048];
	ssize_t n = recv_within(ctl[0], ub, sizeof ub, UP_TIMEOUT_MS);
	struct uvm_header h;
	struct uvm_reader ur;
	if (n > 0 && uvm__parse_header(ub, (size_t)n, &h, &ur) && h.type == UVM_MSG_DEVICE_UP && h.status == UVM_WIRE_OK) {
		d->pid = pid;
		d->control = ctl[0];
		d->socks[0] = (struct stream_sock){.id = 0, .fd = st0[0]};
		d->nsocks = 1;
		return uvmSuccess;
	}
	close(ctl[0]), close(st0[0]);
	int status = 0;
	bool known = reap(pid, &status, n == -ETIMEDOUT ? 0 : REAP_TIMEOUT_MS);
	char how[128];
	describe_end(known, status, how, sizeof how);
	if (n == -ETIMEDOUT)
		return uvm__fail(uvmErrorInitializationError, "start device %d's process (pid %d): it did not map the session's memory within %d s",
				 index, (int)pid, UP_TIMEOUT_MS / 1000);
	if (n > 0 && uvm__parse_header(ub, (size_t)n, &h, &ur) && h.type == UVM_MSG_DEVICE_UP) {
		uint32_t len;
		const uint8_t *msg = uvm__get_bytes(&ur, &len);
		if (!msg)
			len = 0;
		*retry = len && memmem(msg, len, "already has a process", 21) != NULL;
		uvmError_t code = uvm__from_wire(h.status);
		return uvm__fail(code == uvmErrorUnknown ? uvmErrorInitializationError : code, "start device %d's process (pid %d): %.*s", index,
				 (int)pid, (int)len, msg ? (const char *)msg : "");
	}
	return uvm__fail(uvmErrorInitializationError, "start device %d's process (pid %d): it %s before it was up", index, (int)pid, how);
}

/* ensure_running starts device index's process if none runs. d->mu is
 * held. */
static uvmError_t ensure_running(struct uvm_session *s, struct uvm_device *d, int index)
{
	if (d->pid > 0) {
		int status = 0;
		pid_t r = waitpid(d->pid, &status, WNOHANG);
		if (r == 0 || (r < 0 && errno == EINTR))
			return uvmSuccess;
		/* Dead since the last look: reported by the next synchronize. */
		died(d, index, true, r == d->pid, status);
	}
	struct timespec start, now;
	clock_gettime(CLOCK_MONOTONIC, &start);
	for (;;) {
		bool retry;
		uvmError_t err = start_process(s, d, index, &retry);
		if (!err || !retry)
			return err;
		clock_gettime(CLOCK_MONOTONIC, &now);
		if ((now.tv_sec - start.tv_sec) * 1000 + (now.tv_nsec - start.tv_nsec) / 1000000 > RESTART_RETRY_MS)
			return err;
		nanosleep(&(struct timespec){.tv_nsec = 2000000}, NULL);
	}
}

/* stream_fd returns the socket of stream id in the running process,
 * opening the stream there on first use. d->mu is held. */
static uvmError_t stream_fd(struct uvm_device *d, int index, uint32_t id, int *fd)
{
	for (size_t i = 0; i < d->nsocks; i++)
		if (d->socks[i].id == id) {
			*fd = d->socks[i].fd;
			return uvmSuccess;
		}
	if (d->nsocks == d->socks_cap) {
		struct stream_sock *grown = uvm__sys_realloc(d->socks, 2 * d->socks_cap * sizeof *grown);
		if (!grown)
			return uvm__fail(uvmErrorMemoryAllocation, "open stream %u on device %d: no memory for the stream table", id, index);
		d->socks = grown;
		d->socks_cap *= 2;
	}
	int sv[2];
	if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) < 0)
		return uvm__fail(uvmErrorUnknown, "open stream %u on device %d: socketpair: %s", id, index, strerror(errno));
	uint8_t b[32];
	struct uvm_msg m = {.buf = b, .cap = sizeof b};
	uvm__encode_stream(&m, UVM_MSG_STREAM_OPEN, ++d->seq, id);
	int e = uvm__send(d->control, m.buf, m.len, &sv[1], 1);
	close(sv[1]);
	if (e) {
		close(sv[0]);
		died(d, index, false, false, 0);
		return uvm__fail(uvmErrorLaunchFailure, "open stream %u on device %d: its process is gone (%s)", id, index, strerror(e));
	}
	d->socks[d->nsocks++] = (struct stream_sock){.id = id, .fd = sv[0]};
	*fd = sv[0];
	return uvmSuccess;
}

static void note_launch(struct uvm_device *d, uint32_t stream, uintptr_t kernel)
{
	for (size_t i = 0; i < d->noutstanding; i++)
		if (d->outstanding[i].kernel == kernel && d->outstanding[i].stream == stream)
			return;
	if (d->noutstanding < MAX_OUTSTANDING)
		d->outstanding[d->noutstanding++] = (struct outstanding){.kernel = kernel, .stream = stream};
	else
		d->more_outstanding++;
}

static void forget_launches(struct uvm_device *d, uint32_t stream)
{
	if (stream == UVM_ALL_STREAMS) {
		d->noutstanding = 0;
		d->more_outstanding = 0;
		return;
	}
	size_t k = 0;
	for (size_t i = 0; i < d->noutstanding; i++)
		if (d->outstanding[i].stream != stream)
			d->outstanding[k++] = d->outstanding[i];
	d->noutstanding = k;
}

/* ---- errors gathered by a synchronize ---- */

struct errs {
	uvmError_t code; /* the first one's */
	char msg[1024];
	size_t len;
};

static void errs_add(struct errs *e, uvmError_t code, const char *msg, size_t n)
{
	if (!e->code)
		e->code = code;
	if (e->len + 3 >= sizeof e->msg)
		return;
	int k = snprintf(e->msg + e->len, sizeof e->msg - e->len, "%s%.*s", e->len ? "; " : "", (int)n, msg);
	if (k > 0)
		e->len = e->len + (size_t)k < sizeof e->msg ? e->len + (size_t)k : sizeof e->msg - 1;
}

static void take_pending(struct uvm_device *d, struct errs *e)
{
	if (d->pending) {
		errs_add(e, d->pending, d->pending_msg, strlen(d->pending_msg));
		d->pending = uvmSuccess;
		d->pending_msg[0] = '\0';
	}
}

/* sync_locked waits for stream (or UVM_ALL_STREAMS) of device index and
 * returns its kernels' errors and any death not reported yet. d->mu is
 * held. */
static uvmError_t sync_locked(struct uvm_device *d, int index, uint32_t stream)
{
	struct errs e = {0};
	take_pending(d, &e);
	/* Every stream is asked first, then every answer read: the streams
	 * drain at the same time. */
	for (size_t i = 0; i < d->nsocks; i++) {
		struct stream_sock *k = &d->socks[i];
		k->waiting = false;
		if (stream != UVM_ALL_STREAMS && k->id != stream)
			continue;
		uint8_t b[32];
		struct uvm_msg m = {.buf = b, .cap = sizeof b};
		k->sync_seq = ++d->seq;
		uvm__encode_stream(&m, UVM_MSG_SYNC, k->sync_seq, k->id);
		if (uvm__send(k->fd, m.buf, m.len, NULL, 0)) {
			died(d, index, false, false, 0);
			break;
		}
		k->waiting = true;
	}
	for (size_t i = 0; i < d->nsocks; i++) { /* died() empties the table */
		struct stream_sock *k = &d->socks[i];
		if (!k->waiting)
			continue;
		k->waiting = false;
		ssize_t n = uvm__recv(k->fd, d->buf, REPLY_BUF_SIZE, NULL, 0, NULL);
		if (n == 0 || (n < 0 && n != -EMSGSIZE)) {
			died(d, index, false, false, 0);
			break;
		}
		struct uvm_header h;
		struct uvm_reader r;
		if (n < 0 || !uvm__parse_header(d->buf, (size_t)n, &h, &r) || h.type != UVM_MSG_SYNC || h.seq != k->sync_seq) {
			char msg[128];
			int len = snprintf(msg, sizeof msg, "device %d stream %u: a malformed answer to synchronize", index, k->id);
			errs_add(&e, uvmErrorUnknown, msg, (size_t)len);
		} else if (h.status != UVM_WIRE_OK) {
			uint32_t len;
			const uint8_t *msg = uvm__get_bytes(&r, &len);
			errs_add(&e, uvm__from_wire(h.status), msg ? (const char *)msg : "", msg ? len : 0);
		}
	}
	take_pending(d, &e);
	forget_launches(d, stream);
	if (e.code)
		return uvm__fail(e.code, "%s", e.msg);
	return uvm__ok();
}

/* ---- streams ----
 *
 * A uvmStream_t is a handle, never a pointer: the slot of the stream in
 * a table and the slot's generation. A slot is reused after
 * uvmStreamDestroy with the next generation, so a destroyed stream's
 * handle is recognized as such forever (a slot whose generation would
 * wrap is retired), and a handle that is no stream at all is found out
 * without touching memory it points to. */

struct stream_slot {
	uint32_t gen;
	bool live;
	int device;
	uint32_t id; /* in the device's process */
};

static pthread_mutex_t streams_mu = PTHREAD_MUTEX_INITIALIZER;
static struct stream_slot *slots;
static uint32_t nslots, slots_cap;
static uint32_t *free_slots; /* slots_cap entries */
static uint32_t nfree;

static uvmStream_t stream_handle(uint32_t slot, uint32_t gen) { return (uvmStream_t)(uintptr_t)((uint64_t)gen << 32 | (slot + 1)); }

/* stream_find copies out the live stream st. */
static uvmError_t stream_find(uvmStream_t st, const char *what, struct stream_slot *out)
{
	uint64_t v = (uintptr_t)st;
	uint32_t slot = (uint32_t)v - 1, gen = (uint32_t)(v >> 32);
	uvmError_t err = uvmSuccess;
	pthread_mutex_lock(&streams_mu);
	if ((uint32_t)v == 0 || slot >= nslots || gen == 0 || gen > slots[slot].gen)
		err = uvm__fail(uvmErrorInvalidValue, "%s stream %p: not a stream (uvmStreamCreate makes them; NULL is the default stream)", what,
				(void *)st);
	else if (gen < slots[slot].gen || !slots[slot].live)
		err = uvm__fail(uvmErrorInvalidValue, "%s stream %p: it was destroyed by uvmStreamDestroy", what, (void *)st);
	else
		*out = slots[slot];
	pthread_mutex_unlock(&streams_mu);
	return err;
}

uvmError_t uvmStreamCreate(uvmStream_t *stream)
{
	if (uvm__device_process >= 0)
		return refuse_in_device("uvmStreamCreate");
	if (!stream)
		return uvm__fail(uvmErrorInvalidValue, "uvmStreamCreate: stream is NULL; want a pointer to a uvmStream_t");
	int dev = current_device;
	uvmError_t err = get_device(dev, "uvmStreamCreate: stream on", NULL);
	if (err)
		return err;
	pthread_mutex_lock(&streams_mu);
	uint32_t slot;
	if (nfree > 0) {
		slot = free_slots[--nfree];
	} else {
		if (nslots == slots_cap) {
			uint32_t cap = slots_cap ? 2 * slots_cap : 16;
			struct stream_slot *grown = cap < slots_cap || cap > (1u << 30) ? NULL : uvm__sys_realloc(slots, cap * sizeof *slots);
			uint32_t *grown_free = grown ? uvm__sys_realloc(free_slots, cap * sizeof *free_slots) : NULL;
			if (grown)
				slots = grown;
			if (grown_free)
				free_slots = grown_free;
			if (!grown || !grown_free) {
				pthread_mutex_unlock(&streams_mu);
				return uvm__fail(uvmErrorMemoryAllocation, "uvmStreamCreate: no memory for stream %u", nslots);
			}
			slots_cap = cap;
		}
		slot = nslots++;
		slots[slot].gen = 1;
	}
	slots[slot].live = true;
	slots[slot].device = dev;
	slots[slot].id = __atomic_add_fetch(&devices[dev].next_stream, 1, __ATOMIC_RELAXED);
	*stream = stream_handle(slot, slots[slot].gen);
	pthread_mutex_unlock(&streams_mu);
	return uvm__ok();
}

uvmError_t uvmStreamDestroy(uvmStream_t stream)
{
	if (uvm__device_process >= 0)
		return refuse_in_device("uvmStreamDestroy");
	if (!stream)
		return uvm__fail(uvmErrorInvalidValue, "uvmStreamDestroy: stream is NULL, the default stream, which cannot be destroyed");
	struct stream_slot info;
	uvmError_t err = stream_find(stream, "uvmStreamDestroy:", &info);
	if (err)
		return err;
	struct uvm_device *d = &devices[info.device];
	pthread_mutex_lock(&d->mu);
	/* Again under the device's lock: a launch holding it saw the stream
	 * alive, and must not open it in the process after this. */
	if ((err = stream_find(stream, "uvmStreamDestroy:", &info))) {
		pthread_mutex_unlock(&d->mu);
		return err;
	}
	uint32_t slot = (uint32_t)(uintptr_t)stream - 1;
	pthread_mutex_lock(&streams_mu);
	slots[slot].live = false;
	if (slots[slot].gen < UINT32_MAX) {
		slots[slot].gen++;
		free_slots[nfree++] = slot;
	}
	pthread_mutex_unlock(&streams_mu);
	for (size_t i = 0; i < d->nsocks; i++) {
		if (d->socks[i].id != info.id)
			continue;
		/* The process runs what is queued, then ends the stream. A
		 * failed write is a death the next synchronize finds. */
		uint8_t b[32];
		struct uvm_msg m = {.buf = b, .cap = sizeof b};
		uvm__encode_stream(&m, UVM_MSG_STREAM_DESTROY, ++d->seq, info.id);
		uvm__send(d->socks[i].fd, m.buf, m.len, NULL, 0);
		close(d->socks[i].fd);
		d->socks[i] = d->socks[--d->nsocks];
		break;
	}
	pthread_mutex_unlock(&d->mu);
	return uvm__ok();
}

/* sync_stream waits for stream (NULL: the current device's default
 * stream). */
static uvmError_t sync_stream(uvmStream_t stream, const char *what)
{
	struct stream_slot info = {.device = current_device, .id = 0};
	uvmError_t err;
	if (!stream)
		err = get_device(info.device, what, NULL);
	else
		err = stream_find(stream, what, &info);
	if (err)
		return err;
	struct uvm_device *d = &devices[info.device];
	pthread_mutex_lock(&d->mu);
	if (stream && (err = stream_find(stream, what, &info))) {
		pthread_mutex_unlock(&d->mu);
		return err;
	}
	err = sync_locked(d, info.device, info.id);
	pthread_mutex_unlock(&d->mu);
	return err;
}

uvmError_t uvmStreamSynchronize(uvmStream_t stream)
{
	if (uvm__device_process >= 0)
		return refuse_in_device("uvmStreamSynchronize");
	return sync_stream(stream, "uvmStreamSynchronize:");
}

uvmError_t uvm__stream_wait(uvmStream_t stream, const char *what)
{
	if (uvm__device_process >= 0)
		return refuse_in_device(what);
	char w[96];
	snprintf(w, sizeof w, "%s:", what);
	return sync_stream(stream, w);
}

uvmError_t uvmDeviceSynchronize(void)
{
	if (uvm__device_process >= 0)
		return refuse_in_device("uvmDeviceSynchronize");
	int dev = current_device;
	uvmError_t err = get_device(dev, "uvmDeviceSynchronize:", NULL);
	if (err)
		return err;
	struct uvm_device *d = &devices[dev];
	pthread_mutex_lock(&d->mu);
	err = sync_locked(d, dev, UVM_ALL_STREAMS);
	pthread_mutex_unlock(&d->mu);
	return err;
}

/* ---- launches ---- */

uvmError_t uvmLaunchKernel(int device, uvmStream_t stream, unsigned nthreads, uvmKernel_t kernel, const void *params, size_t paramsSize)
{
	if (uvm__device_process >= 0)
		return refuse_in_device("uvmLaunchKernel");
	if (!kernel)
		return uvm__fail(uvmErrorInvalidValue, "uvmLaunchKernel on device %d: the kernel is NULL; want a function of the program", device);
	if (nthreads == 0 || nthreads > UVM_MAX_LAUNCH_THREADS)
		return uvm__fail(uvmErrorInvalidValue, "uvmLaunchKernel on device %d with %u threads: want 1 to %u", device, nthreads, UVM_MAX_LAUNCH_THREADS);
	if (paramsSize > uvmMaxKernelParams)
		return uvm__fail(uvmErrorInvalidValue, "uvmLaunchKernel on device %d with %zu bytes of parameters: at most %d (uvmMaxKernelParams)",
				 device, paramsSize, uvmMaxKernelParams);
	if (!params && paramsSize)
		return uvm__fail(uvmErrorInvalidValue, "uvmLaunchKernel on device %d: params is NULL with paramsSize %zu; want both or neither", device,
				 paramsSize);
	struct uvm_session *s = NULL;
	uvmError_t err = get_device(device, "uvmLaunchKernel on", &s);
	if (err)
		return err;
	struct stream_slot info = {.device = device, .id = 0};
	if (stream) {
		if ((err = stream_find(stream, "uvmLaunchKernel on", &info)))
			return err;
		if (info.device != device)
			return uvm__fail(uvmErrorInvalidValue, "uvmLaunchKernel on device %d with stream %p of device %d: a stream runs work on its own device only",
					 device, (void *)stream, info.device);
	}
	struct uvm_device *d = &devices[device];
	pthread_mutex_lock(&d->mu);
	if (stream && (err = stream_find(stream, "uvmLaunchKernel on", &info)))
		goto out;
	if ((err = ensure_running(s, d, device)))
		goto out;
	int fd = -1;
	if ((err = stream_fd(d, device, info.id, &fd)))
		goto out;
	note_launch(d, info.id, (uintptr_t)kernel);

	/* The params are copied into the message now, as CUDA copies
	 * kernel arguments. The device's stream thread follows the
	 * launching thread's CPU. */
	uint8_t b[UVM_LAUNCH_MESSAGE_MAX];
	struct uvm_msg m = {.buf = b, .cap = sizeof b};
	uvm__encode_launch(&m, ++d->seq, info.id, nthreads, (uintptr_t)kernel, params, paramsSize, sched_getcpu());
	if (uvm__send(fd, m.buf, m.len, NULL, 0))
		died(d, device, false, false, 0); /* reported by the next synchronize */
out:
	pthread_mutex_unlock(&d->mu);
	return err ? err : uvm__ok();
}

/* ---- fork ----
 *
 * An ordinary fork's child is not the parent of the device processes,
 * and its copies of their sockets would keep them alive after the parent
 * exits. It closes them and starts afresh: its first launch forks
 * devices of its own (its session is new too, session.c). The parent's
 * streams are not the child's. The locks are made anew, as the parent's
 * other threads may have held them. A device fork leaves all this to
 * uvm__device_main, which closes every descriptor. */
static void atfork_child(void)
{
	if (uvm__in_device_fork)
		return;
	for (int i = 0; i < UVM_MAX_DEVICES; i++) {
		struct uvm_device *d = &devices[i];
		pthread_mutex_init(&d->mu, NULL);
		close_conns(d);
		d->pid = 0;
		d->pending = uvmSuccess;
		d->noutstanding = 0;
		d->more_outstanding = 0;
	}
	pthread_mutex_init(&streams_mu, NULL);
	for (uint32_t i = 0; i < nslots; i++)
		slots[i].live = false;
	nfree = 0; /* the parent's slots are not reused here: stale handles stay invalid */
}

__attribute__((constructor)) static void install_device_fork_handler(void) { pthread_atfork(NULL, NULL, atfork_child); }
