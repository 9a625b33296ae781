/*
 * device.c: device processes, the program's side (uvm/device.go): their
 * start, their sockets, launches and synchronizes as messages, deaths, a
 * device's failure, and how synchronizes wait (uvmSetDeviceFlags). The
 * device's side is devproc.c; streams, their order and the synchronize
 * calls are stream.c's, which calls this file (libuvm/layers.go); the
 * current device and which devices exist are session.c's, attributes
 * props.c's.
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
 * or launch (a failed write, or waitpid). That, a kernel's error in a
 * synchronize's answer, and a launch that could not be written fail the
 * device, as a kernel fault does a CUDA context: every synchronize
 * reports uvmErrorLaunchFailure, naming the kernel, and no launch is
 * written, until uvmDeviceReset. The next launch after it forks a new
 * process, which maps the device's file again: the data the dead one
 * held is in the server's file, nothing is lost.
 *
 * Streams, their queues of host-side work and launches are stream.c's;
 * this file writes launches and synchronizes on a device's sockets.
 *
 * Locks: a device's mu serializes its process's life (starts, deaths,
 * restarts), the writes on its sockets and guards its fields; it is
 * never held while waiting for a device. Each stream's socket has a
 * sync_mu held across one synchronize's round trip (write the sync, read
 * the answer), so that streams are waited for at the same time and a
 * launch on one stream never waits for another's kernels. A thread
 * holds one sync_mu, or several taken in the order of their stream ids
 * (uvmDeviceSynchronize), before a device's mu; stream.c's queue locks
 * come between the two. A socket is freed when its last user lets go;
 * a death shuts every socket of the process down, which wakes its
 * waiters. All come before the session's locks (uvm__request).
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
/* A synchronize's answer carries the errors of a stream's kernels, at
 * most what devproc.c's send_reply sends. */
#define REPLY_BUF_SIZE 4160
/* How long a new device process may take to map the session's ranges. */
#define UP_TIMEOUT_MS 30000
/* How long a process whose sockets closed may take to finish dying. */
#define REAP_TIMEOUT_MS 2000
/* How long to retry a start the server refuses because the dead
 * process's view is still attached (it notices the death on its own). */
#define RESTART_RETRY_MS 2000

/* ---- device processes ---- */

/* A stream's socket in the running process, shared by those who use it:
 * freed (and closed) when the last lets go. */
struct stream_sock {
	uint32_t id;
	int fd;
	unsigned refs;   /* d->mu */
	bool dead;       /* d->mu: out of the table (its process died, or the stream ended) */
	uint64_t sent;   /* d->mu: launches written on it */
	uint64_t synced; /* d->mu: of those, how many a synchronize saw finished */
	/* One synchronize at a time: its sync, then its answer. */
	pthread_mutex_t sync_mu;
	uint32_t sync_seq;        /* sync_mu */
	uint8_t buf[REPLY_BUF_SIZE]; /* sync_mu */
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
	pid_t pid;   /* the process, 0 while none runs (read atomically by uvm__wait_mode) */
	int control; /* opens streams in it; -1 while none runs */
	struct stream_sock **socks; /* the streams opened in it; stream 0 first */
	size_t nsocks, socks_cap;
	uint32_t next_stream; /* the last stream id given out (atomic) */
	uint32_t seq;
	unsigned flags; /* uvmSetDeviceFlags (atomic) */
	/* Errors of destroyed streams not yet reported by a synchronize. */
	uvmError_t pending;
	char pending_msg[1024];
	/* The device's failure: a launch that failed (a kernel's crash or
	 * error, the death of the process, a launch that could not be
	 * written), reported by every synchronize until a reset. */
	uvmError_t failed;
	char failed_msg[1024];
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
	const uint8_t *b = uvm__sys_mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
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
	uvm__sys_munmap((void *)b, size);
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
		/* uvm_cuda.h's launches run kernel K through a nested function
		 * K__uvm_grid(.N): the kernel is K. */
		char *grid = strstr(name, "__uvm_grid");
		if (grid && (grid[10] == '\0' || grid[10] == '.'))
			*grid = '\0';
		if (delta)
			snprintf(out, cap, "%s+%#lx (%#lx)", name, (unsigned long)delta, (unsigned long)k);
		else
			snprintf(out, cap, "%s (%#lx)", name, (unsigned long)k);
		return;
	}
	snprintf(out, cap, "%#lx", (unsigned long)k);
}

/* ---- deaths and failures ---- */

/* append adds msg (n bytes) to the message buf (cap bytes, used so
 * far), after "; ", as far as it fits. */
static void append(char *buf, size_t cap, const char *msg, size_t n)
{
	size_t used = strlen(buf);
	if (used && used + 2 < cap) {
		memcpy(buf + used, "; ", 2);
		used += 2;
	}
	if (n > cap - 1 - used)
		n = cap - 1 - used;
	memcpy(buf + used, msg, n);
	buf[used + n] = '\0';
}

/* fail_locked records a failure of the device (the first one's code
 * stays; the messages of later ones are added, as far as they fit).
 * d->mu is held. */
static void fail_locked(struct uvm_device *d, uvmError_t code, const char *msg, size_t n)
{
	if (!d->failed)
		d->failed_msg[0] = '\0';
	append(d->failed_msg, sizeof d->failed_msg, msg, n);
	if (!d->failed)
		d->failed = code ? code : uvmErrorLaunchFailure;
}

void uvm__device_fail(int index, uvmError_t code, const char *msg)
{
	struct uvm_device *d = &devices[index];
	pthread_mutex_lock(&d->mu);
	fail_locked(d, code, msg, strlen(msg));
	pthread_mutex_unlock(&d->mu);
}

uvmError_t uvm__device_failure(int index, struct uvm_errs *e)
{
	if (index < 0 || index >= UVM_MAX_DEVICES)
		return uvmSuccess;
	struct uvm_device *d = &devices[index];
	pthread_mutex_lock(&d->mu);
	uvmError_t code = d->failed;
	if (code && e)
		uvm__errs_add(e, code, d->failed_msg, strlen(d->failed_msg));
	pthread_mutex_unlock(&d->mu);
	return code;
}

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

/* sock_new makes a socket's record, with one reference (the table's). */
static struct stream_sock *sock_new(uint32_t id, int fd)
{
	struct stream_sock *k = uvm__sys_calloc(1, sizeof *k);
	if (!k)
		return NULL;
	k->id = id;
	k->fd = fd;
	k->refs = 1;
	pthread_mutex_init(&k->sync_mu, NULL);
	return k;
}

/* sock_unref lets go of k, closing it after its last user. d->mu is
 * held. */
static void sock_unref(struct stream_sock *k)
{
	if (--k->refs)
		return;
	close(k->fd);
	pthread_mutex_destroy(&k->sync_mu);
	uvm__sys_free(k);
}

/* close_conns closes the control and stream sockets. A socket someone
 * waits on is shut down, which wakes them, and closed by the last of
 * them. d->mu is held. */
static void close_conns(struct uvm_device *d)
{
	for (size_t i = 0; i < d->nsocks; i++) {
		struct stream_sock *k = d->socks[i];
		k->dead = true;
		if (k->refs > 1)
			shutdown(k->fd, SHUT_RDWR);
		sock_unref(k);
	}
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
	char how[128], what[512], name[160];
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
		if (c.grid_dim.x && c.grid_dim.y && c.block_dim.x && c.block_dim.y) {
			uvmDim3 b = c.grid_dim, t = c.block_dim;
			snprintf(what, sizeof what, "while kernel %.100s was running on stream %u: its thread (%u,%u,%u) of block (%u,%u,%u) (a grid (%u,%u,%u) of "
				 "blocks (%u,%u,%u)) %.150s",
				 name, c.stream, c.tid % t.x, c.tid / t.x % t.y, c.tid / (t.x * t.y), (unsigned)(c.block % b.x),
				 (unsigned)(c.block / b.x % b.y), (unsigned)(c.block / ((uint64_t)b.x * b.y)), b.x, b.y, b.z, t.x, t.y, t.z, detail);
		} else
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
	snprintf(msg, sizeof msg,
		 "device %d: its process (pid %d) %s %s; the device's memory is intact, and after uvmDeviceReset the next launch starts a new process",
		 index, (int)d->pid, how, what);
	fail_locked(d, uvmErrorLaunchFailure, msg, strlen(msg));
	close_conns(d);
	__atomic_store_n(&d->pid, 0, __ATOMIC_RELAXED);
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
	struct stream_sock *k0 = sock_new(0, st0[0]);
	if (!k0) {
		close(server), close(ctl[0]), close(ctl[1]), close(st0[0]), close(st0[1]);
		return uvm__fail(uvmErrorMemoryAllocation, "start device %d's process: no memory for its default stream", index);
	}

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
		close(ctl[0]);
		sock_unref(k0);
		return uvm__fail(uvmErrorInitializationError, "start device %d's process: fork: %s", index, strerror(fork_errno));
	}

	/* It says device-up once every range is mapped, or why it could
	 * not. */
	uint8_t ub[2048];
	ssize_t n = recv_within(ctl[0], ub, sizeof ub, UP_TIMEOUT_MS);
	struct uvm_header h;
	struct uvm_reader ur;
	if (n > 0 && uvm__parse_header(ub, (size_t)n, &h, &ur) && h.type == UVM_MSG_DEVICE_UP && h.status == UVM_WIRE_OK) {
		__atomic_store_n(&d->pid, pid, __ATOMIC_RELAXED);
		d->control = ctl[0];
		d->socks[0] = k0;
		d->nsocks = 1;
		return uvmSuccess;
	}
	close(ctl[0]);
	sock_unref(k0);
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
static uvmError_t ensure_running(struct uvm_session *s, struct uvm_device *d, int index, const char *what)
{
	if (d->pid > 0) {
		int status = 0;
		pid_t r = waitpid(d->pid, &status, WNOHANG);
		if (r == 0 || (r < 0 && errno == EINTR))
			return uvmSuccess;
		/* Dead since the last look: the device has failed, and the
		 * launch with it. */
		died(d, index, true, r == d->pid, status);
		return uvm__fail(d->failed, "%s on device %d: %s", what, index, d->failed_msg);
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

/* stream_sock_of returns the socket of stream id in the running process,
 * opening the stream there on first use (if open). d->mu is held. */
static uvmError_t stream_sock_of(struct uvm_device *d, int index, uint32_t id, bool open, struct stream_sock **out)
{
	*out = NULL;
	for (size_t i = 0; i < d->nsocks; i++)
		if (d->socks[i]->id == id) {
			*out = d->socks[i];
			return uvmSuccess;
		}
	if (!open)
		return uvmSuccess;
	if (d->nsocks == d->socks_cap) {
		struct stream_sock **grown = uvm__sys_realloc(d->socks, 2 * d->socks_cap * sizeof *grown);
		if (!grown)
			return uvm__fail(uvmErrorMemoryAllocation, "open stream %u on device %d: no memory for the stream table", id, index);
		d->socks = grown;
		d->socks_cap *= 2;
	}
	int sv[2];
	if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) < 0)
		return uvm__fail(uvmErrorUnknown, "open stream %u on device %d: socketpair: %s", id, index, strerror(errno));
	struct stream_sock *k = sock_new(id, sv[0]);
	if (!k) {
		close(sv[0]), close(sv[1]);
		return uvm__fail(uvmErrorMemoryAllocation, "open stream %u on device %d: no memory for its socket", id, index);
	}
	uint8_t b[32];
	struct uvm_msg m = {.buf = b, .cap = sizeof b};
	uvm__encode_stream(&m, UVM_MSG_STREAM_OPEN, ++d->seq, id);
	int e = uvm__send(d->control, m.buf, m.len, &sv[1], 1);
	close(sv[1]);
	if (e) {
		sock_unref(k);
		died(d, index, false, false, 0);
		return uvm__fail(uvmErrorLaunchFailure, "open stream %u on device %d (%s): %s", id, index, strerror(e), d->failed_msg);
	}
	d->socks[d->nsocks++] = k;
	*out = k;
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

/* ---- errors for the next synchronize ---- */

/* add_pending adds an error for the device's next synchronize (the first
 * one's code stays), as far as the message fits. d->mu is held. */
static void add_pending(struct uvm_device *d, uvmError_t code, const char *msg, size_t n)
{
	if (!d->pending)
		d->pending_msg[0] = '\0';
	append(d->pending_msg, sizeof d->pending_msg, msg, n);
	if (!d->pending)
		d->pending = code;
}

static void take_pending(struct uvm_device *d, struct uvm_errs *e)
{
	if (d->pending) {
		uvm__errs_add(e, d->pending, d->pending_msg, strlen(d->pending_msg));
		d->pending = uvmSuccess;
		d->pending_msg[0] = '\0';
	}
}

void uvm__device_add_pending(int index, const struct uvm_errs *e)
{
	if (!e->code)
		return;
	struct uvm_device *d = &devices[index];
	pthread_mutex_lock(&d->mu);
	add_pending(d, e->code, e->msg, e->len);
	pthread_mutex_unlock(&d->mu);
}

/* ---- how synchronizes wait ---- */

static int allowed_cpus(void)
{
	static int n;
	int v = __atomic_load_n(&n, __ATOMIC_RELAXED);
	if (v)
		return v;
	cpu_set_t set;
	v = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : (int)sysconf(_SC_NPROCESSORS_ONLN);
	if (v < 1)
		v = 1;
	__atomic_store_n(&n, v, __ATOMIC_RELAXED);
	return v;
}

enum uvm_wait uvm__wait_mode(int device)
{
	unsigned f = device >= 0 && device < UVM_MAX_DEVICES ? __atomic_load_n(&devices[device].flags, __ATOMIC_RELAXED) : 0;
	switch (f & uvmDeviceScheduleMask) {
	case uvmDeviceScheduleSpin:
		return UVM_WAIT_SPIN;
	case uvmDeviceScheduleYield:
		return UVM_WAIT_YIELD;
	case uvmDeviceScheduleBlockingSync:
		return UVM_WAIT_BLOCK;
	}
	/* Auto, after CUDA's: spin while every device process, the waiting
	 * thread and the fault server (which serves the kernels' faults) can
	 * have a CPU each, else sleep: on two CPUs a spinning client and
	 * device starved the server (as the Go side found). */
	int active = 0;
	for (int i = 0; i < UVM_MAX_DEVICES; i++)
		active += __atomic_load_n(&devices[i].pid, __ATOMIC_RELAXED) > 0;
	return active + 2 < allowed_cpus() ? UVM_WAIT_SPIN : UVM_WAIT_BLOCK;
}

void uvm__wait_pause(enum uvm_wait how)
{
	if (how == UVM_WAIT_YIELD) {
		sched_yield();
		return;
	}
#if defined(__x86_64__) || defined(__i386__)
	__builtin_ia32_pause();
#elif defined(__aarch64__)
	__asm__ __volatile__("yield");
#endif
}

/* recv_reply reads one answer on fd, as uvm__recv does, waiting as how
 * says: a blocking read, or reads that do not block, polled. */
static ssize_t recv_reply(int fd, uint8_t *buf, size_t cap, enum uvm_wait how)
{
	if (how == UVM_WAIT_BLOCK)
		return uvm__recv(fd, buf, cap, NULL, 0, NULL);
	for (;;) {
		ssize_t n = recv(fd, buf, cap, MSG_DONTWAIT | MSG_TRUNC);
		if (n >= 0)
			return (size_t)n > cap ? -EMSGSIZE : n;
		if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
			return -errno;
		uvm__wait_pause(how);
	}
}

uvmError_t uvmSetDeviceFlags(unsigned int flags)
{
	if (uvm__device_process >= 0)
		return uvm__refuse_in_device("uvmSetDeviceFlags");
	if (flags & ~uvmDeviceMask)
		return uvm__fail(uvmErrorInvalidValue,
				 "uvmSetDeviceFlags: flags %#x: unknown bits %#x; want one of uvmDeviceScheduleAuto (0), uvmDeviceScheduleSpin (%#x), "
				 "uvmDeviceScheduleYield (%#x) or uvmDeviceScheduleBlockingSync (%#x), with uvmDeviceMapHost (%#x) and "
				 "uvmDeviceLmemResizeToMax (%#x)",
				 flags, flags & ~uvmDeviceMask, uvmDeviceScheduleSpin, uvmDeviceScheduleYield, uvmDeviceScheduleBlockingSync,
				 uvmDeviceMapHost, uvmDeviceLmemResizeToMax);
	unsigned sched = flags & uvmDeviceScheduleMask;
	if (sched & (sched - 1))
		return uvm__fail(uvmErrorInvalidValue, "uvmSetDeviceFlags: flags %#x: %#x names several ways to wait; want at most one of uvmDeviceScheduleSpin (%#x), "
				 "uvmDeviceScheduleYield (%#x) and uvmDeviceScheduleBlockingSync (%#x)",
				 flags, sched, uvmDeviceScheduleSpin, uvmDeviceScheduleYield, uvmDeviceScheduleBlockingSync);
	int dev = uvm__current_device();
	uvmError_t err = uvm__check_device(dev, "uvmSetDeviceFlags:", NULL);
	if (err)
		return err;
	__atomic_store_n(&devices[dev].flags, flags, __ATOMIC_RELAXED);
	return uvm__ok();
}

uvmError_t uvmGetDeviceFlags(unsigned int *flags)
{
	if (uvm__device_process >= 0)
		return uvm__refuse_in_device("uvmGetDeviceFlags");
	if (!flags)
		return uvm__fail(uvmErrorInvalidValue, "uvmGetDeviceFlags: flags is NULL; want a pointer to an unsigned int");
	int dev = uvm__current_device();
	uvmError_t err = uvm__check_device(dev, "uvmGetDeviceFlags:", NULL);
	if (err)
		return err;
	*flags = __atomic_load_n(&devices[dev].flags, __ATOMIC_RELAXED);
	return uvm__ok();
}

/* ---- synchronizes ---- */

struct sync_one {
	struct stream_sock *k;
	uint64_t covered; /* launches written before the sync */
	bool sent;        /* a sync went, and its answer came */
};

/* sort_by_stream orders p by stream id (insertion sort: glibc's qsort
 * may call malloc). */
static void sort_by_stream(struct sync_one *p, size_t n)
{
	for (size_t i = 1; i < n; i++)
		for (size_t j = i; j > 0 && p[j - 1].k->id > p[j].k->id; j--) {
			struct sync_one t = p[j];
			p[j] = p[j - 1];
			p[j - 1] = t;
		}
}

void uvm__device_sync(int index, uint32_t stream, enum uvm_wait how, bool take, struct uvm_errs *out, pthread_mutex_t *out_mu)
{
	struct uvm_device *d = &devices[index];
	struct uvm_errs e = {0};
	struct sync_one few[8], *p = few;
	size_t n = 0;

	/* The sockets, each held while it is used. */
	pthread_mutex_lock(&d->mu);
	size_t want = stream == UVM_ALL_STREAMS ? d->nsocks : 1;
	if (want > sizeof few / sizeof few[0] && !(p = uvm__sys_calloc(want, sizeof *p))) {
		pthread_mutex_unlock(&d->mu);
		char msg[96];
		int len = snprintf(msg, sizeof msg, "synchronize device %d: no memory to wait for %zu streams", index, want);
		uvm__errs_add(&e, uvmErrorMemoryAllocation, msg, (size_t)len);
		goto merge;
	}
	for (size_t i = 0; i < d->nsocks && n < want; i++) {
		struct stream_sock *k = d->socks[i];
		if (stream != UVM_ALL_STREAMS && k->id != stream)
			continue;
		k->refs++;
		p[n++] = (struct sync_one){.k = k};
	}
	pthread_mutex_unlock(&d->mu);
	sort_by_stream(p, n);
	for (size_t i = 0; i < n; i++)
		pthread_mutex_lock(&p[i].k->sync_mu);

	/* Every stream is asked first, then every answer read: the streams
	 * drain at the same time. */
	pthread_mutex_lock(&d->mu);
	if (take)
		take_pending(d, &e);
	for (size_t i = 0; i < n; i++) {
		struct stream_sock *k = p[i].k;
		if (k->dead)
			continue; /* its process died: the death is pending */
		uint8_t b[32];
		struct uvm_msg m = {.buf = b, .cap = sizeof b};
		k->sync_seq = ++d->seq;
		uvm__encode_stream(&m, UVM_MSG_SYNC, k->sync_seq, k->id);
		if (uvm__send(k->fd, m.buf, m.len, NULL, 0)) {
			died(d, index, false, false, 0); /* every socket is dead now */
			break;
		}
		p[i].sent = true;
		p[i].covered = k->sent;
	}
	pthread_mutex_unlock(&d->mu);
	for (size_t i = 0; i < n; i++) {
		struct stream_sock *k = p[i].k;
		if (!p[i].sent)
			continue;
		ssize_t got = recv_reply(k->fd, k->buf, sizeof k->buf, how);
		if (got == 0 || (got < 0 && got != -EMSGSIZE)) {
			/* The process died (or died() shut the socket down). */
			p[i].sent = false;
			pthread_mutex_lock(&d->mu);
			if (!k->dead)
				died(d, index, false, false, 0);
			pthread_mutex_unlock(&d->mu);
			continue;
		}
		struct uvm_header h;
		struct uvm_reader r;
		if (got < 0 || !uvm__parse_header(k->buf, (size_t)got, &h, &r) || h.type != UVM_MSG_SYNC || h.seq != k->sync_seq) {
			char msg[128];
			int len = snprintf(msg, sizeof msg, "device %d stream %u: a malformed answer to synchronize", index, k->id);
			uvm__errs_add(&e, uvmErrorUnknown, msg, (size_t)len);
			p[i].sent = false;
		} else if (h.status != UVM_WIRE_OK) {
			/* A kernel's error fails the device. */
			uint32_t len;
			const uint8_t *msg = uvm__get_bytes(&r, &len);
			pthread_mutex_lock(&d->mu);
			fail_locked(d, uvm__from_wire(h.status), msg ? (const char *)msg : "", msg ? len : 0);
			pthread_mutex_unlock(&d->mu);
		}
	}
	pthread_mutex_lock(&d->mu);
	for (size_t i = 0; i < n; i++)
		if (p[i].sent && !p[i].k->dead && p[i].covered > p[i].k->synced)
			p[i].k->synced = p[i].covered;
	if (take)
		take_pending(d, &e);
	forget_launches(d, stream);
	pthread_mutex_unlock(&d->mu);

merge:
	/* While the streams are still held: a synchronize waiting for them
	 * finds these errors where they go. */
	if (out_mu)
		pthread_mutex_lock(out_mu);
	uvm__errs_move(out, &e);
	if (out_mu)
		pthread_mutex_unlock(out_mu);
	for (size_t i = n; i-- > 0;)
		pthread_mutex_unlock(&p[i].k->sync_mu);
	if (n) {
		pthread_mutex_lock(&d->mu);
		for (size_t i = 0; i < n; i++)
			sock_unref(p[i].k);
		pthread_mutex_unlock(&d->mu);
	}
	if (p != few)
		uvm__sys_free(p);
}

bool uvm__device_stream_idle(int index, uint32_t stream)
{
	struct uvm_device *d = &devices[index];
	struct stream_sock *k = NULL;
	pthread_mutex_lock(&d->mu);
	stream_sock_of(d, index, stream, false, &k);
	bool idle = !k || k->sent == k->synced;
	pthread_mutex_unlock(&d->mu);
	return idle;
}

uint32_t uvm__device_new_stream(int index) { return __atomic_add_fetch(&devices[index].next_stream, 1, __ATOMIC_RELAXED); }

void uvm__device_stream_end(int index, uint32_t stream)
{
	struct uvm_device *d = &devices[index];
	pthread_mutex_lock(&d->mu);
	for (size_t i = 0; i < d->nsocks; i++) {
		struct stream_sock *k = d->socks[i];
		if (k->id != stream)
			continue;
		/* The process runs what is queued, then ends the stream. A
		 * failed write is a death the next synchronize finds. */
		uint8_t b[32];
		struct uvm_msg m = {.buf = b, .cap = sizeof b};
		uvm__encode_stream(&m, UVM_MSG_STREAM_DESTROY, ++d->seq, stream);
		uvm__send(k->fd, m.buf, m.len, NULL, 0);
		k->dead = true;
		d->socks[i] = d->socks[--d->nsocks];
		sock_unref(k);
		break;
	}
	forget_launches(d, stream);
	pthread_mutex_unlock(&d->mu);
}

void uvm__device_reset(int index)
{
	struct uvm_device *d = &devices[index];
	pthread_mutex_lock(&d->mu);
	if (d->pid > 0) {
		/* Its control connection's end makes it exit, whatever its
		 * kernels are doing. */
		pid_t pid = d->pid;
		int status;
		close_conns(d);
		reap(pid, &status, REAP_TIMEOUT_MS);
		__atomic_store_n(&d->pid, 0, __ATOMIC_RELAXED);
	}
	d->pending = uvmSuccess;
	d->pending_msg[0] = '\0';
	d->failed = uvmSuccess;
	d->failed_msg[0] = '\0';
	d->noutstanding = 0;
	d->more_outstanding = 0;
	__atomic_store_n(&d->flags, 0, __ATOMIC_RELAXED);
	pthread_mutex_unlock(&d->mu);
}

/* ---- launches ---- */

void uvm__device_kernel_name(uintptr_t kernel, char *out, size_t cap) { snprintf(out, cap, "c:0x%lx", (unsigned long)kernel); }

uvmError_t uvm__device_launch(int index, uint32_t stream, uintptr_t kernel, const struct uvm_launch_shape *shape, const void *params,
			      size_t paramsSize, int cpu)
{
	struct uvm_session *s = NULL;
	const char *what = shape->grid ? (shape->flags & UVM_GRID_COOPERATIVE ? "uvmLaunchCooperativeKernel" : "uvmLaunchGrid") : "uvmLaunchKernel";
	char on[64];
	snprintf(on, sizeof on, "%s on", what);
	uvmError_t err = uvm__check_device(index, on, &s);
	if (err)
		return err;
	struct uvm_device *d = &devices[index];
	pthread_mutex_lock(&d->mu);
	struct stream_sock *k = NULL;
	if (d->failed) {
		err = uvm__fail(d->failed, "%s on device %d: it failed earlier (uvmDeviceReset clears that): %s", what, index, d->failed_msg);
		goto out;
	}
	if ((err = ensure_running(s, d, index, what)) || (err = stream_sock_of(d, index, stream, true, &k)))
		goto out;
	note_launch(d, stream, kernel);

	/* The params are copied into the message now, as CUDA copies
	 * kernel arguments. */
	uint8_t b[UVM_LAUNCH_GRID_MESSAGE_MAX];
	struct uvm_msg m = {.buf = b, .cap = sizeof b};
	if (shape->grid)
		uvm__encode_launch_grid(&m, ++d->seq, stream, shape->grid_dim, shape->block_dim, shape->shared, shape->stack, shape->flags, kernel,
					params, paramsSize, cpu);
	else
		uvm__encode_launch(&m, ++d->seq, stream, shape->nthreads, kernel, params, paramsSize, cpu);
	if (uvm__send(k->fd, m.buf, m.len, NULL, 0))
		died(d, index, false, false, 0); /* reported by the next synchronize */
	else
		k->sent++;
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
		/* Closed, never shut down: the sockets are the parent's too. */
		for (size_t j = 0; j < d->nsocks; j++) {
			close(d->socks[j]->fd);
			uvm__sys_free(d->socks[j]);
		}
		d->nsocks = 0;
		if (d->control >= 0)
			close(d->control);
		d->control = -1;
		d->pid = 0;
		d->pending = uvmSuccess;
		d->failed = uvmSuccess;
		d->noutstanding = 0;
		d->more_outstanding = 0;
	}
}

UVM_CORE_CONSTRUCTOR static void install_device_fork_handler(void) { pthread_atfork(NULL, NULL, atfork_child); }
