/*
 * session.c: the connection to the fault server, the table of
 * allocations, and what a fork does to them; the calling thread's
 * current device and which devices the session has.
 *
 * A process has one session: a SOCK_SEQPACKET connection over which it
 * handed the server its userfaultfd and its host file (a memfd whose page
 * at offset o holds the page of address o). Managed ranges live in the
 * managed window, the same 16 TiB the Go runtime uses, so that device
 * processes can map every range at the client's address.
 */
#include "internal.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/userfaultfd.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <unistd.h>


extern char **environ;

#ifndef UVM_BINDIR
#define UVM_BINDIR "/usr/local/bin"
#endif

/* The session, its state, and the mutex that connects it once. A fork's
 * child starts with no session (its parent's belongs to the parent). */
static struct uvm_session session;
static pthread_mutex_t init_mu = PTHREAD_MUTEX_INITIALIZER;
static enum { NOT_CONNECTED, CONNECTED, FAILED } state;
static uvmError_t init_err;
static char init_msg[480];

/* The allocations, sorted by address; allocs_mu guards them. */
static pthread_rwlock_t allocs_mu = PTHREAD_RWLOCK_INITIALIZER;
static struct uvm_alloc *allocs;
static size_t nallocs, allocs_cap;

__thread bool uvm__in_device_fork;

static void init_fail(uvmError_t err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void init_fail(uvmError_t err, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(init_msg, sizeof init_msg, fmt, ap);
	va_end(ap);
	init_err = err;
}

int uvm__open_userfaultfd(void)
{
	int fd = syscall(SYS_userfaultfd, O_CLOEXEC);
	if (fd >= 0)
		return fd;
	int sys_errno = errno;
	int dev = open("/dev/userfaultfd", O_RDWR | O_CLOEXEC);
	if (dev >= 0) {
		fd = ioctl(dev, USERFAULTFD_IOC_NEW, O_CLOEXEC);
		close(dev);
		if (fd >= 0)
			return fd;
	}
	errno = sys_errno;
	return -1;
}

/* find_uvm_binary finds the `uvm` binary a private server runs from. */
static bool find_uvm_binary(char *out, size_t cap)
{
	const char *env = getenv("UVM_BIN");
	if (env && *env) {
		snprintf(out, cap, "%s", env);
		return access(out, X_OK) == 0;
	}
	snprintf(out, cap, "%s/uvm", UVM_BINDIR);
	if (access(out, X_OK) == 0)
		return true;
	const char *path = getenv("PATH");
	while (path && *path) {
		const char *end = strchr(path, ':');
		size_t n = end ? (size_t)(end - path) : strlen(path);
		if (n > 0 && n < cap - 5) {
			snprintf(out, cap, "%.*s/uvm", (int)n, path);
			if (access(out, X_OK) == 0)
				return true;
		}
		path = end ? end + 1 : NULL;
	}
	return false;
}

/* start_private_server starts `uvm` as this process's own server, with
 * one end of a socket pair as its fd 3 (uvm/spawn.go runPrivateServer).
 * posix_spawn runs no fork handlers, and the server gets its own process
 * group so that a Ctrl-C meant for the program does not kill it first. */
static int start_private_server(pid_t *pid)
{
	char bin[4096];
	if (!find_uvm_binary(bin, sizeof bin)) {
		const char *env = getenv("UVM_BIN");
		if (env && *env)
			init_fail(uvmErrorInitializationError, "UVM_BIN=%s is not an executable file (%s); want the path of the uvm binary", env, strerror(errno));
		else
			init_fail(uvmErrorInitializationError,
				  "no fault server: none listens on the daemon socket, and no uvm binary to start a private one was found (looked in UVM_BIN, %s and PATH); "
				  "run `uvm serve`, or set UVM_BIN",
				  UVM_BINDIR);
		return -1;
	}
	int sv[2];
	if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) < 0) {
		init_fail(uvmErrorInitializationError, "socketpair: %s", strerror(errno));
		return -1;
	}
	size_t n = 0;
	while (environ[n])
		n++;
	char **envp = uvm__sys_calloc(n + 2, sizeof *envp);
	if (!envp) {
		close(sv[0]);
		close(sv[1]);
		init_fail(uvmErrorMemoryAllocation, "no memory for the server's environment");
		return -1;
	}
	size_t k = 0;
	for (size_t i = 0; i < n; i++) {
		/* The server is not a program to interpose on. */
		if (strncmp(environ[i], "LD_PRELOAD=", 11) == 0 || strncmp(environ[i], "SOFTUVM_", 8) == 0)
			continue;
		envp[k++] = environ[i];
	}
	envp[k++] = "SOFTUVM_ROLE=server";
	envp[k] = NULL;
	posix_spawn_file_actions_t fa;
	posix_spawnattr_t attr;
	posix_spawn_file_actions_init(&fa);
	posix_spawn_file_actions_adddup2(&fa, sv[1], 3);
	posix_spawnattr_init(&attr);
	posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP);
	posix_spawnattr_setpgroup(&attr, 0);
	char *argv[] = {"softuvm-server", NULL};
	int err = posix_spawn(pid, bin, &fa, &attr, argv, envp);
	posix_spawn_file_actions_destroy(&fa);
	posix_spawnattr_destroy(&attr);
	uvm__sys_free(envp);
	close(sv[1]);
	if (err != 0) {
		close(sv[0]);
		init_fail(uvmErrorInitializationError, "start a private fault server from %s: %s", bin, strerror(err));
		return -1;
	}
	return sv[0];
}

static int dial(const char *path)
{
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	if (strlen(path) >= sizeof sa.sun_path) {
		errno = ENAMETOOLONG;
		return -1;
	}
	strcpy(sa.sun_path, path);
	int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -1;
	if (connect(fd, (struct sockaddr *)&sa, sizeof sa) < 0) {
		int e = errno;
		close(fd);
		errno = e;
		return -1;
	}
	return fd;
}

/* default_socket_path is uvm/config.go DefaultSocketPath. */
static void default_socket_path(char *out, size_t cap, bool *explicit)
{
	const char *env = getenv("UVM_SOCKET");
	*explicit = env && *env;
	if (*explicit) {
		snprintf(out, cap, "%s", env);
		return;
	}
	const char *xdg = getenv("XDG_RUNTIME_DIR");
	if (xdg && *xdg)
		snprintf(out, cap, "%s/softuvm/uvm.sock", xdg);
	else if (geteuid() == 0)
		snprintf(out, cap, "/run/softuvm/uvm.sock");
	else {
		const char *tmp = getenv("TMPDIR");
		snprintf(out, cap, "%s/softuvm-%d/uvm.sock", tmp && *tmp ? tmp : "/tmp", (int)geteuid());
	}
}

static int connect_server(struct uvm_session *s)
{
	const char *mode = getenv("UVM_SERVER");
	if (!mode || !*mode)
		mode = "auto";
	if (strcmp(mode, "auto") && strcmp(mode, "private") && strcmp(mode, "daemon")) {
		init_fail(uvmErrorInitializationError, "UVM_SERVER=%s: want auto, private or daemon", mode);
		return -1;
	}
	char path[4096];
	bool explicit;
	default_socket_path(path, sizeof path, &explicit);
	if (strcmp(mode, "private") != 0) {
		int fd = dial(path);
		if (fd >= 0)
			return fd;
		if (strcmp(mode, "daemon") == 0 || explicit) {
			init_fail(uvmErrorInitializationError, "no fault server at %s (%s); start one with `uvm serve`, or set UVM_SERVER=private", path, strerror(errno));
			return -1;
		}
	}
	return start_private_server(&s->private_pid);
}

/* coherence_wanted reads UVM_COHERENCE: the model this process asks for
 * (UVM_COHERENCE_DEFAULT: the server's), or -1 with the error recorded. */
static int coherence_wanted(void)
{
	const char *v = getenv("UVM_COHERENCE");
	if (!v || !*v)
		return UVM_COHERENCE_DEFAULT;
	if (!strcmp(v, "fault"))
		return UVM_COHERENCE_FAULT;
	if (!strcmp(v, "launch"))
		return UVM_COHERENCE_LAUNCH;
	init_fail(uvmErrorInitializationError, "UVM_COHERENCE=%s: want fault or launch", v);
	return -1;
}

/* hello hands the server this process's userfaultfd and host file. */
static bool hello(struct uvm_session *s, int uffd)
{
	uint8_t buf[64], reply[4096];
	struct uvm_msg m = {.buf = buf, .cap = sizeof buf};
	int want = coherence_wanted();
	if (want < 0)
		return false;
	uvm__encode_hello(&m, 0, (uint32_t)getpid(), (uint8_t)want);
	int fds[2] = {uffd, s->host_fd};
	struct uvm_reader r;
	int rfds[2], nrfds = 0;
	uvmError_t err = uvm__request(s, &m, fds, 2, reply, sizeof reply, &r, rfds, 2, &nrfds, "hello");
	if (err != uvmSuccess) {
		/* A server that refused the configuration said why, with its
		 * code; one that hung up, or answered what this library cannot
		 * read, is no server to initialize with. */
		bool foreign = err == uvmErrorUnknown;
		init_fail(err == uvmErrorServerGone || foreign ? uvmErrorInitializationError : err, "%s%s", uvmGetLastErrorMessage(),
			  foreign ? " (is it a softuvm server of another version?)" : "");
		return false;
	}
	s->server_pid = (pid_t)uvm__get_u32(&r);
	s->id = uvm__get_u64(&r);
	uvm__get_u64(&r); /* features */
	uint32_t n = uvm__get_u32(&r);
	if (n > UVM_MAX_DEVICES) {
		init_fail(uvmErrorInitializationError, "the server reports %u devices; this library handles at most %d", n, UVM_MAX_DEVICES);
		return false;
	}
	for (uint32_t i = 0; i < n; i++) {
		uint32_t len;
		s->devices[i].capacity = uvm__get_u64(&r);
		uvm__get_bytes(&r, &len); /* backend */
		s->devices[i].node = uvm__get_i32(&r);
		s->devices[i].workers = (int)uvm__get_u32(&r);
	}
	s->coherence = uvm__get_u8(&r);
	if (r.err || nrfds > 1) {
		for (int i = 0; i < nrfds; i++)
			close(rfds[i]);
		if (r.err)
			init_fail(uvmErrorInitializationError, "the server's hello reply is truncated (is it a softuvm server of another version?)");
		else
			init_fail(uvmErrorInitializationError, "the server's hello reply carries %d descriptors, want at most 1 (a host file)", nrfds);
		return false;
	}
	if (nrfds == 1) {
		/* The server made a host file of large folios in place of the
		 * memfd (a client cannot mount the tmpfs they need); nothing
		 * is mapped from the memfd yet. */
		close(s->host_fd);
		s->host_fd = rfds[0];
	}
	s->ndevices = (int)n;
	return true;
}

static void connect_session(void)
{
	struct uvm_session *s = &session;
	memset(s, 0, sizeof *s);
	s->conn = s->host_fd = -1;
	pthread_mutex_init(&s->req_mu, NULL);
	pthread_mutex_init(&s->files_mu, NULL);
	for (int i = 0; i < UVM_MAX_DEVICES; i++)
		s->files[i].fd = -1;
	s->rbuf = uvm__sys_mmap(NULL, UVM_MAX_MESSAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (s->rbuf == MAP_FAILED) {
		s->rbuf = NULL;
		init_fail(uvmErrorMemoryAllocation, "map the reply buffer: %s", strerror(errno));
		state = FAILED;
		return;
	}
	s->host_fd = memfd_create("softuvm-host", MFD_CLOEXEC);
	if (s->host_fd < 0 || ftruncate(s->host_fd, (off_t)UVM_FILE_SIZE) < 0) {
		init_fail(uvmErrorInitializationError, "create the host file: %s", strerror(errno));
		goto fail;
	}
	int uffd = uvm__open_userfaultfd();
	if (uffd < 0) {
		init_fail(uvmErrorInitializationError, "userfaultfd: %s (as root, or with vm.unprivileged_userfaultfd=1 or access to /dev/userfaultfd)", strerror(errno));
		goto fail;
	}
	s->conn = connect_server(s);
	if (s->conn < 0) {
		close(uffd);
		goto fail;
	}
	/* The server owns the userfaultfd from here on; this process keeps
	 * no copy, so it never resolves its own faults by accident. */
	bool ok = hello(s, uffd);
	close(uffd);
	if (!ok)
		goto fail;
	state = CONNECTED;
	return;
fail:
	if (s->conn >= 0)
		close(s->conn);
	if (s->host_fd >= 0)
		close(s->host_fd);
	s->conn = s->host_fd = -1;
	state = FAILED;
}

/* Why every call fails, once the program's managed variables could not
 * be made managed memory (uvm__session_refuse). */
static const char *refusal;

void uvm__session_refuse(const char *why)
{
	const char *none = NULL;
	__atomic_compare_exchange_n(&refusal, &none, why, false, __ATOMIC_RELEASE, __ATOMIC_RELAXED);
}

struct uvm_session *uvm__session(uvmError_t *err)
{
	if (uvm__device_process >= 0) {
		/* A device process is a fork of the program: its copy of the
		 * session is the program's, and its locks may be held forever
		 * by threads that do not exist here. */
		if (err)
			*err = uvmErrorNotSupported;
		uvm__fail(uvmErrorNotSupported, "the libuvm host API is not available in a kernel (device %d's process)", uvm__device_process);
		return NULL;
	}
	pthread_mutex_lock(&init_mu);
	if (state == NOT_CONNECTED)
		connect_session();
	pthread_mutex_unlock(&init_mu);
	const char *why = __atomic_load_n(&refusal, __ATOMIC_ACQUIRE);
	if (state == CONNECTED && why) {
		if (err)
			*err = uvmErrorNotSupported;
		uvm__fail(uvmErrorNotSupported, "%s", why);
		return NULL;
	}
	if (state == CONNECTED)
		return &session;
	if (err)
		*err = init_err;
	uvm__fail(init_err, "%s", init_msg);
	return NULL;
}

uint32_t uvm__next_seq(struct uvm_session *s) { return __atomic_add_fetch(&s->seq, 1, __ATOMIC_RELAXED); }

uvmError_t uvm__request(struct uvm_session *s, struct uvm_msg *req, const int *fds, int nfds, uint8_t *out, size_t cap,
			struct uvm_reader *reply, int *rfds, int maxrfds, int *nrfds, const char *what)
{
	if (nrfds)
		*nrfds = 0;
	if (req->overflow)
		return uvm__fail(uvmErrorInvalidValue, "%s: the request does not fit in a message", what);
	pthread_mutex_lock(&s->req_mu);
	if (s->gone) {
		pthread_mutex_unlock(&s->req_mu);
		return uvm__fail(uvmErrorServerGone, "%s: the fault server (pid %d) exited; managed memory that was not on the host is lost", what, (int)s->server_pid);
	}
	uint32_t seq = uvm__next_seq(s);
	memcpy(req->buf + 8, &seq, 4);
	uint16_t typ;
	memcpy(&typ, req->buf + 6, 2);
	int e = uvm__send(s->conn, req->buf, req->len, fds, nfds);
	ssize_t n;
	for (;;) {
		n = e ? -e : uvm__recv(s->conn, s->rbuf, UVM_MAX_MESSAGE, rfds, maxrfds, nrfds);
		if (n <= 0)
			break;
		struct uvm_header nh;
		struct uvm_reader nr;
		if (!uvm__parse_header(s->rbuf, (size_t)n, &nh, &nr) || (nh.type != UVM_MSG_RESTARTED && nh.seq == seq))
			break;
		if (rfds && nrfds) {
			for (int i = 0; i < *nrfds; i++)
				close(rfds[i]);
			*nrfds = 0;
		}
		if (nh.type != UVM_MSG_RESTARTED)
			continue; /* answers a request sent twice across a restart */
		/* A new server took over from a dead one, which may have read
		 * this request and never answered: send it again, marked so that
		 * a server that has it already drops the copy. */
		s->server_pid = (pid_t)uvm__get_u32(&nr);
		s->restarts++;
		uint32_t retried = UVM_WIRE_RETRIED;
		memcpy(req->buf + 12, &retried, 4);
		e = uvm__send(s->conn, req->buf, req->len, fds, nfds);
	}
	if (n <= 0) {
		s->gone = true;
		pthread_mutex_unlock(&s->req_mu);
		return uvm__fail(uvmErrorServerGone, "%s: the fault server (pid %d) exited; managed memory that was not on the host is lost", what, (int)s->server_pid);
	}
	struct uvm_header h;
	struct uvm_reader r;
	uvmError_t err = uvmSuccess;
	if (!uvm__parse_header(s->rbuf, (size_t)n, &h, &r) || h.type != typ || h.seq != seq)
		err = uvm__fail(uvmErrorUnknown, "%s: the server's reply is malformed or answers another request", what);
	else if (h.status != UVM_WIRE_OK) {
		uint32_t len;
		const uint8_t *msg = uvm__get_bytes(&r, &len);
		err = uvm__fail(uvm__from_wire(h.status), "%s: %.*s", what, (int)len, msg ? (const char *)msg : "");
	} else if (r.n > cap)
		err = uvm__fail(uvmErrorUnknown, "%s: a reply of %zu bytes does not fit the %zu-byte buffer", what, r.n, cap);
	else {
		memcpy(out, r.p, r.n);
		reply->p = out;
		reply->n = r.n;
		reply->err = false;
	}
	pthread_mutex_unlock(&s->req_mu);
	if (err != uvmSuccess && rfds && nrfds) {
		for (int i = 0; i < *nrfds; i++)
			close(rfds[i]);
		*nrfds = 0;
	}
	return err;
}

/* ---- the allocation table ---- */

/* index_of returns the first allocation whose end is above p. allocs_mu
 * is held. */
static size_t index_of(uintptr_t p)
{
	size_t lo = 0, hi = nallocs;
	while (lo < hi) {
		size_t mid = (lo + hi) / 2;
		if (allocs[mid].addr + allocs[mid].reserved <= p)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo;
}

bool uvm__alloc_lookup(uintptr_t p, struct uvm_alloc *out)
{
	bool found = false;
	if (uvm__device_process >= 0)
		return false; /* the table is the program's, its lock maybe held forever */
	pthread_rwlock_rdlock(&allocs_mu);
	size_t i = index_of(p);
	if (i < nallocs && !allocs[i].pending && allocs[i].addr <= p && p < allocs[i].addr + allocs[i].length) {
		*out = allocs[i];
		found = true;
	} else if (!uvm__in_window(p)) {
		for (size_t i = 0; i < nallocs && !found; i++) {
			const struct uvm_alloc *a = &allocs[i];
			if (a->host_alias && !a->pending && a->host_alias <= p && p < a->host_alias + a->length) {
				*out = *a;
				found = true;
			}
		}
	}
	pthread_rwlock_unlock(&allocs_mu);
	return found;
}

bool uvm__alias_overlap(uintptr_t p, size_t n, struct uvm_alloc *out)
{
	bool found = false;
	pthread_rwlock_rdlock(&allocs_mu);
	for (size_t i = 0; i < nallocs && !found; i++) {
		const struct uvm_alloc *a = &allocs[i];
		if (a->host_alias && a->host_alias < p + n && p < a->host_alias + a->length) {
			*out = *a;
			found = true;
		}
	}
	pthread_rwlock_unlock(&allocs_mu);
	return found;
}

uint8_t *uvm__alloc_shadow(const struct uvm_alloc *a, int fd)
{
	if (a->shadow)
		return a->shadow;
	/* Mapped outside the lock; a thread that lost the race to map it
	 * first unmaps its own. MADV_DONTFORK, as the range itself: a
	 * child's write through it would land in the parent's device memory. */
	void *m = uvm__sys_mmap(NULL, a->length, PROT_READ | PROT_WRITE, MAP_SHARED, fd, (off_t)a->addr);
	if (m == MAP_FAILED)
		return NULL;
	/* Location files may take large folios: no mapping of one may let
	 * khugepaged collapse it, which would fill holes with zeros that read
	 * as data (docs/architecture.md, "Large folios"). */
	madvise(m, a->length, MADV_NOHUGEPAGE);
	if (madvise(m, a->length, MADV_DONTFORK) < 0) {
		int e = errno;
		uvm__sys_munmap(m, a->length);
		errno = e;
		return NULL;
	}
	uint8_t *got = NULL;
	pthread_rwlock_wrlock(&allocs_mu);
	size_t i = index_of(a->addr);
	/* The buffer id tells a new allocation at the same address (the
	 * old one freed meanwhile) from a. */
	if (i < nallocs && allocs[i].addr == a->addr && allocs[i].buffer_id == a->buffer_id && !allocs[i].pending && !allocs[i].forked) {
		if (!allocs[i].shadow)
			allocs[i].shadow = m;
		got = allocs[i].shadow;
	}
	pthread_rwlock_unlock(&allocs_mu);
	if (got != m)
		uvm__sys_munmap(m, a->length);
	if (!got)
		errno = ESTALE;
	return got;
}

void uvm__alloc_set_alias(uintptr_t addr, uintptr_t alias)
{
	pthread_rwlock_wrlock(&allocs_mu);
	size_t i = index_of(addr);
	if (i < nallocs && allocs[i].addr == addr)
		allocs[i].host_alias = alias;
	pthread_rwlock_unlock(&allocs_mu);
}

size_t uvm__managed_size(const void *p)
{
	struct uvm_alloc a;
	if (!uvm__in_window((uintptr_t)p) || !uvm__alloc_lookup((uintptr_t)p, &a) || a.addr != (uintptr_t)p)
		return 0;
	return a.length;
}

/* insert_pending takes reserved bytes of the window for an allocation in
 * progress: the first gap between allocations where the kernel agrees the
 * address space is free. Returns the address, or 0. */
static uintptr_t insert_pending(size_t reserved)
{
	uintptr_t addr = 0;
	pthread_rwlock_wrlock(&allocs_mu);
	if (nallocs == allocs_cap) {
		size_t cap = allocs_cap ? 2 * allocs_cap : 64;
		struct uvm_alloc *grown = uvm__sys_realloc(allocs, cap * sizeof *allocs);
		if (!grown)
			goto out;
		allocs = grown, allocs_cap = cap;
	}
	/* Adopted program memory (uvm__adopt) lies below the window. */
	uintptr_t start = UVM_WINDOW_START;
	size_t i = index_of(UVM_WINDOW_START);
	for (;;) {
		uintptr_t end = i < nallocs ? allocs[i].addr : UVM_WINDOW_START + UVM_WINDOW_SIZE;
		while (start + reserved <= end) {
			void *got = uvm__sys_mmap((void *)start, reserved, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED_NOREPLACE, -1, 0);
			if (got == (void *)start) {
				addr = start;
				goto found;
			}
			if (got != MAP_FAILED)
				uvm__sys_munmap(got, reserved);
			else if (errno != EEXIST)
				goto out;
			start += UVM_BLOCK_SIZE; /* something else lives there */
		}
		if (i == nallocs)
			goto out;
		start = allocs[i].addr + allocs[i].reserved;
		i++;
	}
found:
	memmove(&allocs[i + 1], &allocs[i], (nallocs - i) * sizeof *allocs);
	memset(&allocs[i], 0, sizeof allocs[i]);
	allocs[i].addr = addr;
	allocs[i].reserved = reserved;
	allocs[i].pending = true;
	nallocs++;
out:
	pthread_rwlock_unlock(&allocs_mu);
	return addr;
}

/* remove_at drops the entry at addr; allocs_mu is held for writing. */
static void remove_at_locked(uintptr_t addr)
{
	size_t i = index_of(addr);
	if (i < nallocs && allocs[i].addr == addr) {
		memmove(&allocs[i], &allocs[i + 1], (nallocs - i - 1) * sizeof *allocs);
		nallocs--;
	}
}

static void drop_pending(uintptr_t addr, size_t reserved)
{
	uvm__sys_munmap((void *)addr, reserved);
	pthread_rwlock_wrlock(&allocs_mu);
	remove_at_locked(addr);
	pthread_rwlock_unlock(&allocs_mu);
}

static size_t round_up(size_t n, size_t to) { return (n + to - 1) & ~(to - 1); }

/* register_range asks the server to manage [addr, addr+length), mapped
 * from the host file, as memory of kind; *id is its buffer id. */
static uvmError_t register_range(struct uvm_session *s, uintptr_t addr, size_t length, size_t size, unsigned flags, int kind, int device,
				 const char *what, uint64_t *id)
{
	uint8_t buf[128], reply[64];
	struct uvm_msg m = {.buf = buf, .cap = sizeof buf};
	uvm__encode_alloc(&m, 0, addr, length, size, flags, (uint8_t)kind, device);
	struct uvm_reader r;
	uvmError_t err = uvm__request(s, &m, NULL, 0, reply, sizeof reply, &r, NULL, 0, NULL, what);
	if (err == uvmSuccess)
		*id = uvm__get_u64(&r);
	return err;
}

uvmError_t uvm__allocate(size_t size, int kind, int device, unsigned flags, uvmError_t (*prepare)(uintptr_t, size_t, void *),
			 void *arg, struct uvm_alloc *out)
{
	uvmError_t err;
	struct uvm_session *s = uvm__session(&err);
	if (!s)
		return err;
	size_t length = round_up(size, UVM_PAGE_SIZE), reserved = round_up(length, UVM_BLOCK_SIZE);
	uintptr_t addr = insert_pending(reserved);
	if (!addr)
		return uvm__fail(uvmErrorMemoryAllocation, "no %zu bytes of free address space left in the managed window %#lx+%#lx", reserved,
				 UVM_WINDOW_START, UVM_WINDOW_SIZE);
	/* The host file's offset equals the address: every location file of
	 * the range is laid out the same way. The range stays out of forks:
	 * a child gets a private copy (atfork_child), never the shared file. */
	if (uvm__sys_mmap((void *)addr, length, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, s->host_fd, (off_t)addr) == MAP_FAILED ||
	    madvise((void *)addr, length, MADV_NOHUGEPAGE) < 0 || madvise((void *)addr, reserved, MADV_DONTFORK) < 0) {
		int e = errno;
		drop_pending(addr, reserved);
		return uvm__fail(uvmErrorMemoryAllocation, "map the host file at %#lx: %s", addr, strerror(e));
	}
	if (prepare && (err = prepare(addr, length, arg)) != uvmSuccess) {
		fallocate(s->host_fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, (off_t)addr, (off_t)length);
		drop_pending(addr, reserved);
		return err;
	}
	uint64_t id;
	err = register_range(s, addr, length, size, flags, kind, device, "allocate", &id);
	if (err != uvmSuccess) {
		fallocate(s->host_fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, (off_t)addr, (off_t)length);
		drop_pending(addr, reserved);
		return err;
	}
	struct uvm_alloc a = {.addr = addr, .size = size, .length = length, .reserved = reserved, .buffer_id = id,
			      .kind = kind, .device = device, .flags = flags};
	pthread_rwlock_wrlock(&allocs_mu);
	size_t i = index_of(addr);
	allocs[i] = a;
	pthread_rwlock_unlock(&allocs_mu);
	if (out)
		*out = a;
	return uvmSuccess;
}

uvmError_t uvm__adopt(uintptr_t addr, size_t length)
{
	uvmError_t err;
	if (addr % UVM_PAGE_SIZE || length % UVM_PAGE_SIZE || length == 0 || addr + length > UVM_WINDOW_START)
		return uvm__fail(uvmErrorInvalidValue, "adopt %#lx+%zu: want page-aligned memory below the managed window", addr, length);
	struct uvm_session *s = uvm__session(&err);
	if (!s)
		return err;
	/* The contents wait in a copy while the host file takes the range
	 * over and the server registers it; nothing else runs (the caller
	 * makes sure), so nothing sees the zeros in between. */
	void *copy = uvm__sys_mmap(NULL, length, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (copy == MAP_FAILED)
		return uvm__fail(uvmErrorMemoryAllocation, "adopt %#lx+%zu: %s", addr, length, strerror(errno));
	memcpy(copy, (void *)addr, length);
	pthread_rwlock_wrlock(&allocs_mu);
	size_t i = index_of(addr);
	bool taken = i < nallocs && allocs[i].addr < addr + length;
	bool room = nallocs < allocs_cap;
	if (!taken && !room) {
		size_t cap = allocs_cap ? 2 * allocs_cap : 64;
		struct uvm_alloc *grown = uvm__sys_realloc(allocs, cap * sizeof *allocs);
		if (grown)
			allocs = grown, allocs_cap = cap, room = true;
	}
	if (taken || !room) {
		pthread_rwlock_unlock(&allocs_mu);
		uvm__sys_munmap(copy, length);
		return uvm__fail(taken ? uvmErrorInvalidValue : uvmErrorMemoryAllocation, "adopt %#lx+%zu: %s", addr, length,
				 taken ? "it overlaps memory of the runtime" : "no memory for the allocation table");
	}
	memmove(&allocs[i + 1], &allocs[i], (nallocs - i) * sizeof *allocs);
	allocs[i] = (struct uvm_alloc){.addr = addr, .size = length, .length = length, .reserved = length, .kind = UVM_KIND_MANAGED,
				       .device = uvmCpuDeviceId, .flags = uvmMemAttachGlobal, .pending = true};
	nallocs++;
	pthread_rwlock_unlock(&allocs_mu);
	if (uvm__sys_mmap((void *)addr, length, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, s->host_fd, (off_t)addr) == MAP_FAILED) {
		/* MAP_FIXED failed before replacing anything: the memory is the
		 * program's as before. */
		int e = errno;
		pthread_rwlock_wrlock(&allocs_mu);
		remove_at_locked(addr);
		pthread_rwlock_unlock(&allocs_mu);
		uvm__sys_munmap(copy, length);
		return uvm__fail(uvmErrorMemoryAllocation, "adopt %#lx+%zu: map the host file: %s", addr, length, strerror(e));
	}
	madvise((void *)addr, length, MADV_DONTFORK);
	madvise((void *)addr, length, MADV_NOHUGEPAGE); /* khugepaged would fill holes: see devproc.c */
	uint64_t id;
	err = register_range(s, addr, length, length, uvmMemAttachGlobal, UVM_KIND_MANAGED, uvmCpuDeviceId, "adopt", &id);
	pthread_rwlock_wrlock(&allocs_mu);
	i = index_of(addr);
	if (err == uvmSuccess) {
		allocs[i].buffer_id = id;
		allocs[i].pending = false;
	} else
		remove_at_locked(addr);
	pthread_rwlock_unlock(&allocs_mu);
	if (err != uvmSuccess) {
		/* Give the program its private memory with the contents back. */
		uvm__sys_mremap(copy, length, length, MREMAP_MAYMOVE | MREMAP_FIXED, (void *)addr);
		return err;
	}
	/* The contents go back through the registered range, so that the
	 * server sees every page it holds (a page written into the file
	 * behind its back would be taken for a hole). Pages of zeros stay
	 * holes, as untouched managed memory is. */
	static const uint8_t zero[UVM_PAGE_SIZE];
	for (size_t off = 0; off < length; off += UVM_PAGE_SIZE)
		if (memcmp((uint8_t *)copy + off, zero, UVM_PAGE_SIZE) != 0)
			memcpy((uint8_t *)addr + off, (uint8_t *)copy + off, UVM_PAGE_SIZE);
	uvm__sys_munmap(copy, length);
	return uvmSuccess;
}

static const char *kind_name(const struct uvm_alloc *a)
{
	if (a->host_alias)
		return "registered host memory";
	switch (a->kind) {
	case UVM_KIND_MANAGED:
		return "managed memory";
	case UVM_KIND_PINNED_HOST:
		return "pinned host memory";
	}
	return "device memory";
}

uvmError_t uvm__release(uintptr_t addr, unsigned kinds_mask, const char *what)
{
	pthread_rwlock_wrlock(&allocs_mu);
	size_t i = index_of(addr);
	if (i == nallocs || allocs[i].pending || addr < allocs[i].addr || addr >= allocs[i].addr + allocs[i].length) {
		pthread_rwlock_unlock(&allocs_mu);
		return uvm__fail(uvmErrorInvalidValue, "%s %p: not memory of this runtime (never allocated by it, or already freed)", what, (void *)addr);
	}
	struct uvm_alloc a = allocs[i];
	if (a.addr != addr) {
		pthread_rwlock_unlock(&allocs_mu);
		return uvm__fail(uvmErrorInvalidValue, "%s %p: not the start of an allocation (it lies %zu bytes into the one at %p)", what, (void *)addr,
				 (size_t)(addr - a.addr), (void *)a.addr);
	}
	if (!(kinds_mask & (1u << a.kind)) || (a.host_alias && !(kinds_mask & (1u << 3)))) {
		pthread_rwlock_unlock(&allocs_mu);
		const char *use = a.host_alias ? "uvmHostUnregister" : a.kind == UVM_KIND_PINNED_HOST ? "uvmFreeHost" : "uvmFree";
		return uvm__fail(uvmErrorInvalidValue, "%s %p: it is %s; release it with %s", what, (void *)addr, kind_name(&a), use);
	}
	remove_at_locked(addr);
	pthread_rwlock_unlock(&allocs_mu);
	/* Before the server frees: the device file's pages at addr may be
	 * another allocation's next, which this mapping must not reach. */
	if (a.shadow)
		uvm__sys_munmap(a.shadow, a.length);
	if (a.forked) {
		/* A fork's private copy: no server knows it. */
		uvm__sys_munmap((void *)a.addr, a.reserved);
		return uvmSuccess;
	}
	uvmError_t err;
	struct uvm_session *s = uvm__session(&err);
	if (!s)
		return err;
	/* The server frees first, while the range is still mapped: a thread
	 * blocked in a fault on it is woken into SIGBUS rather than left
	 * waiting. */
	uint8_t buf[32], reply[16];
	struct uvm_msg m = {.buf = buf, .cap = sizeof buf};
	uvm__encode_free(&m, 0, addr);
	struct uvm_reader r;
	err = uvm__request(s, &m, NULL, 0, reply, sizeof reply, &r, NULL, 0, NULL, what);
	uvm__sys_munmap((void *)a.addr, a.reserved);
	return err;
}

/* ---- fork ----
 *
 * Managed ranges are MADV_DONTFORK: a child must not share the parent's
 * host file (its writes would show in the parent) nor its userfaultfd.
 * So the parent, before the fork, copies every range it can read into a
 * snapshot file (reading through the range, so pages anywhere fault in
 * as usual), and the child maps the snapshot privately at the same
 * addresses: a copy-on-write copy, as fork gives ordinary memory. Device
 * memory, which the host cannot read, stays unreachable in the child. The
 * child has no session; the next call of the library makes one. */

struct fork_copy {
	uintptr_t addr, alias;
	size_t length, reserved;
	size_t copied; /* bytes of it in the snapshot; the rest reads as zeros */
	off_t offset;  /* in the snapshot; -1: not readable by the host */
};

size_t (*uvm__fork_used)(uintptr_t addr, size_t length);

static int snapshot_fd = -1;
static struct fork_copy *fork_copies;
static size_t nfork_copies;
static bool fork_locked;

static bool write_all(int fd, const void *p, size_t n, off_t off)
{
	while (n > 0) {
		ssize_t k = pwrite(fd, p, n, off);
		if (k < 0 && errno == EINTR)
			continue;
		if (k <= 0)
			return false;
		p = (const char *)p + k, n -= (size_t)k, off += k;
	}
	return true;
}

static void atfork_prepare(void)
{
	/* A device process's copies of these locks are the program's, and
	 * may be held by threads that do not exist there: a kernel that
	 * forks must not wait for them. */
	if (uvm__in_device_fork || uvm__device_process >= 0)
		return;
	pthread_mutex_lock(&init_mu);
	pthread_rwlock_wrlock(&allocs_mu);
	fork_locked = true;
	if (state != CONNECTED || nallocs == 0)
		return;
	fork_copies = uvm__sys_calloc(nallocs, sizeof *fork_copies);
	snapshot_fd = memfd_create("softuvm-fork-snapshot", MFD_CLOEXEC);
	if (!fork_copies || snapshot_fd < 0) {
		fprintf(stderr, "softuvm: fork: cannot copy managed memory for the child (%s); the child will find it unmapped\n", strerror(errno));
		return;
	}
	off_t off = 0;
	for (size_t i = 0; i < nallocs; i++) {
		const struct uvm_alloc *a = &allocs[i];
		if (a->forked)
			continue; /* ordinary memory this process got from a fork: the child inherits it as such */
		struct fork_copy *c = &fork_copies[nfork_copies++];
		*c = (struct fork_copy){.addr = a->addr, .alias = a->host_alias, .length = a->length, .reserved = a->reserved, .offset = -1};
		if (a->pending || a->kind == UVM_KIND_DEVICE)
			continue;
		c->copied = a->length;
		if (uvm__fork_used && !a->host_alias && a->kind == UVM_KIND_MANAGED) {
			size_t used = uvm__fork_used(a->addr, a->length);
			c->copied = used < a->length ? used : a->length;
		}
		if (!write_all(snapshot_fd, (const void *)a->addr, c->copied, off)) {
			fprintf(stderr, "softuvm: fork: copy %zu bytes of managed memory at %p for the child: %s; the child will find it unmapped\n",
				a->length, (void *)a->addr, strerror(errno));
			continue;
		}
		c->offset = off;
		off += (off_t)c->copied;
	}
}

static void fork_cleanup(void)
{
	if (snapshot_fd >= 0)
		close(snapshot_fd);
	snapshot_fd = -1;
	uvm__sys_free(fork_copies);
	fork_copies = NULL;
	nfork_copies = 0;
}

static void atfork_parent(void)
{
	if (!fork_locked)
		return;
	fork_locked = false;
	fork_cleanup();
	pthread_rwlock_unlock(&allocs_mu);
	pthread_mutex_unlock(&init_mu);
}

static void atfork_child(void)
{
	if (!fork_locked)
		return; /* a device process: device.c sets it up */
	fork_locked = false;
	for (size_t i = 0; i < nfork_copies; i++) {
		const struct fork_copy *c = &fork_copies[i];
		if (c->alias) {
			/* Registered memory: the program's own pages again, a copy. */
			void *tmp = c->offset < 0 ? MAP_FAILED
					  : uvm__sys_mmap(NULL, c->length, PROT_READ | PROT_WRITE, MAP_PRIVATE, snapshot_fd, c->offset);
			if (tmp != MAP_FAILED)
				uvm__sys_mremap(tmp, c->length, c->length, MREMAP_MAYMOVE | MREMAP_FIXED, (void *)c->alias);
			continue;
		}
		if (c->offset < 0) {
			uvm__sys_mmap((void *)c->addr, c->reserved, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
			continue;
		}
		if (c->copied > 0)
			uvm__sys_mmap((void *)c->addr, c->copied, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_FIXED, snapshot_fd, c->offset);
		if (c->copied < c->length)
			uvm__sys_mmap((void *)(c->addr + c->copied), c->length - c->copied, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1,
			     0);
	}
	/* What is left in the table are the child's copies: freeing one
	 * unmaps it. Registrations are ordinary memory again. */
	size_t k = 0;
	for (size_t i = 0; i < nallocs; i++) {
		if (allocs[i].pending || allocs[i].host_alias)
			continue;
		allocs[k] = allocs[i];
		allocs[k].forked = true;
		allocs[k].shadow = NULL; /* MADV_DONTFORK: not mapped here */
		k++;
	}
	nallocs = k;
	fork_cleanup();
	if (state == CONNECTED) {
		close(session.conn);
		close(session.host_fd);
		if (session.rbuf)
			uvm__sys_munmap(session.rbuf, UVM_MAX_MESSAGE);
		/* The parent's device files: this process's next session asks
		 * for its own. */
		for (int i = 0; i < UVM_MAX_DEVICES; i++)
			if (session.files[i].fd >= 0)
				close(session.files[i].fd);
	}
	state = NOT_CONNECTED;
	pthread_rwlock_init(&allocs_mu, NULL);
	pthread_mutex_init(&init_mu, NULL);
}

/* The handlers are installed when the library is loaded, before any
 * thread of the program could fork with a session half made. */
UVM_CORE_CONSTRUCTOR static void install_fork_handlers(void) { pthread_atfork(atfork_prepare, atfork_parent, atfork_child); }

/* ---- devices: the current one, and which exist ---- */

static __thread int current_device;

int uvm__current_device(void) { return current_device; }

uvmError_t uvm__check_device(int d, const char *what, struct uvm_session **sp)
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
		return uvm__refuse_in_device("uvmGetDeviceCount");
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
		return uvm__refuse_in_device("uvmSetDevice");
	uvmError_t err = uvm__check_device(device, "uvmSetDevice:", NULL);
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
