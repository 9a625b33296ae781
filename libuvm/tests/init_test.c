/*
 * init_test.c: what a program sees when no fault server can be had, each
 * way initialization can fail (every init_fail of session.c's connect
 * path that a test can provoke; not a failing memfd_create, socketpair or
 * reply-buffer mmap, short of exhausting memory). Each case runs in a
 * child of its own, since the first call connects (or fails to) once per
 * process.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"

/* run_case runs f in a child with the environment changes applied, and
 * returns its exit status. */
static int run_case(int (*f)(void), const char *k1, const char *v1, const char *k2, const char *v2)
{
	pid_t pid = fork();
	if (pid == 0) {
		if (k1)
			setenv(k1, v1, 1);
		if (k2)
			setenv(k2, v2, 1);
		_exit(f());
	}
	int status = 0;
	if (waitpid(pid, &status, 0) != pid || !WIFEXITED(status))
		return -1;
	return WEXITSTATUS(status);
}

/* expect_init_error: every call fails with uvmErrorInitializationError
 * and the same explanation, which names what was tried. */
static int no_daemon(void)
{
	void *p;
	int n;
	if (uvmMallocManaged(&p, 4096, uvmMemAttachGlobal) != uvmErrorInitializationError)
		return 1;
	if (!strstr(uvmGetLastErrorMessage(), "/nonexistent/uvm.sock") || !strstr(uvmGetLastErrorMessage(), "uvm serve"))
		return 2;
	if (uvmGetDeviceCount(&n) != uvmErrorInitializationError)
		return 3;
	return 0;
}

static int bad_binary(void)
{
	void *p;
	if (uvmMallocManaged(&p, 4096, uvmMemAttachGlobal) != uvmErrorInitializationError)
		return 1;
	if (!strstr(uvmGetLastErrorMessage(), "UVM_BIN=/nonexistent/uvm"))
		return 2;
	return 0;
}

static int bad_mode(void)
{
	void *p;
	if (uvmMallocManaged(&p, 4096, uvmMemAttachGlobal) != uvmErrorInitializationError)
		return 1;
	if (!strstr(uvmGetLastErrorMessage(), "UVM_SERVER=sometimes"))
		return 2;
	return 0;
}

/* A server that refuses its configuration says why through the hello. */
static int bad_config(void)
{
	void *p;
	if (uvmMallocManaged(&p, 4096, uvmMemAttachGlobal) != uvmErrorInvalidValue)
		return 1;
	if (!strstr(uvmGetLastErrorMessage(), "UVM_DEVICES"))
		return 2;
	return 0;
}

static int works(void)
{
	int n = -1;
	if (uvmGetDeviceCount(&n) != uvmSuccess || n != 2)
		return 1;
	return 0;
}

/* init_fails: the first call fails with want and a message holding
 * every one of the words, and so does the next call (initialization is
 * tried once). */
static int init_fails(uvmError_t want, const char *w1, const char *w2)
{
	void *p;
	int n;
	uvmError_t got = uvmMallocManaged(&p, 4096, uvmMemAttachGlobal);
	const char *msg = uvmGetLastErrorMessage();
	if (got != want || (w1 && !strstr(msg, w1)) || (w2 && !strstr(msg, w2))) {
		fprintf(stderr, "init: got %s \"%s\", want %s with \"%s\" and \"%s\"\n", uvmGetErrorName(got), msg, uvmGetErrorName(want),
			w1 ? w1 : "", w2 ? w2 : "");
		return 1;
	}
	if (uvmGetDeviceCount(&n) != want)
		return 2;
	return 0;
}

/* An executable file that is not a program: the spawn fails. */
static int not_a_program(void)
{
	char path[] = "/tmp/uvm-init-test-XXXXXX";
	int fd = mkstemp(path);
	if (fd < 0 || write(fd, "\x7f" "ELF garbage", 12) != 12 || fchmod(fd, 0755) < 0)
		return 10;
	close(fd);
	setenv("UVM_SERVER", "private", 1);
	setenv("UVM_BIN", path, 1);
	int rc = init_fails(uvmErrorInitializationError, "start a private fault server from", "Exec format error");
	unlink(path);
	return rc;
}

/* A program that is not a fault server: it exits without a word. */
static int not_a_server(void) { return init_fails(uvmErrorInitializationError, "hello", "exited"); }

/* No userfaultfd for this user: the library says how to get one. */
static int no_userfaultfd(void)
{
	if (geteuid() != 0)
		return 0; /* the case needs a user to drop to */
	FILE *f = fopen("/proc/sys/vm/unprivileged_userfaultfd", "r");
	int everybody = f && fgetc(f) == '1';
	if (f)
		fclose(f);
	if (everybody)
		return 0; /* this machine lets every user have one */
	if (setgid(65534) < 0 || setuid(65534) < 0)
		return 10;
	int fd = open("/dev/userfaultfd", O_RDWR);
	if (fd >= 0) {
		close(fd);
		return 0; /* this machine lets everybody have one */
	}
	return init_fails(uvmErrorInitializationError, "userfaultfd:", "vm.unprivileged_userfaultfd=1");
}

/* No file descriptor left for the host file. */
static int out_of_descriptors(void)
{
	int top = dup(0);
	if (top < 0)
		return 10;
	close(top);
	struct rlimit rl = {.rlim_cur = (rlim_t)top, .rlim_max = (rlim_t)top};
	if (setrlimit(RLIMIT_NOFILE, &rl) < 0)
		return 11;
	return init_fails(uvmErrorInitializationError, "create the host file", "Too many open files");
}

/* A socket path longer than a socket address holds. */
static int long_socket_path(void)
{
	char path[200];
	memset(path, 'x', sizeof path - 1);
	path[0] = '/';
	path[sizeof path - 1] = 0;
	setenv("UVM_SERVER", "daemon", 1);
	setenv("UVM_SOCKET", path, 1);
	return init_fails(uvmErrorInitializationError, "File name too long", "uvm serve");
}

/* listening_socket binds a socket at a fresh path and listens on it if
 * listen_too; it returns the socket and sets UVM_SOCKET to the path. */
static int listening_socket(char *path, size_t cap, int listen_too)
{
	snprintf(path, cap, "/tmp/uvm-init-test-%d.sock", (int)getpid());
	unlink(path);
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	snprintf(sa.sun_path, sizeof sa.sun_path, "%s", path);
	int fd = socket(AF_UNIX, SOCK_SEQPACKET, 0);
	if (fd < 0 || bind(fd, (struct sockaddr *)&sa, sizeof sa) < 0 || (listen_too && listen(fd, 1) < 0))
		return -1;
	setenv("UVM_SERVER", "daemon", 1);
	setenv("UVM_SOCKET", path, 1);
	return fd;
}

/* A socket file nobody listens on: the connection is refused. */
static int refused(void)
{
	char path[108];
	int fd = listening_socket(path, sizeof path, 0);
	if (fd < 0)
		return 10;
	int rc = init_fails(uvmErrorInitializationError, "Connection refused", "uvm serve");
	unlink(path);
	return rc;
}

enum fake { FAKE_HANG_UP, FAKE_TRUNCATED, FAKE_TOO_MANY_DEVICES, FAKE_OTHER_VERSION };

/* fake_server answers the hello on a listening socket the way kind says,
 * as a server that is not a softuvm server of this version might. */
static void fake_server(int lfd, enum fake kind)
{
	int c = accept(lfd, NULL, NULL);
	if (c < 0)
		_exit(1);
	uint8_t req[256], cbuf[CMSG_SPACE(4 * sizeof(int))];
	struct iovec iov = {.iov_base = req, .iov_len = sizeof req};
	struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = cbuf, .msg_controllen = sizeof cbuf};
	ssize_t n = recvmsg(c, &mh, 0);
	if (n < 16 || kind == FAKE_HANG_UP)
		_exit(0);
	uint8_t reply[64] = {0};
	memcpy(reply, req, 12); /* magic, version, type and sequence: status 0 */
	size_t len = 16;
	if (kind == FAKE_TRUNCATED)
		len += 4; /* a pid, and nothing of the rest */
	else if (kind == FAKE_TOO_MANY_DEVICES) {
		uint32_t devices = 40;
		memcpy(reply + 16 + 4 + 8 + 8, &devices, 4);
		len += 4 + 8 + 8 + 4;
	} else {
		reply[4] = 9; /* wire version 9 */
		len += 4 + 8 + 8 + 4;
	}
	if (send(c, reply, len, 0) < 0)
		_exit(1);
	/* Until the client hangs up. */
	while (recv(c, req, sizeof req, 0) > 0)
		;
	_exit(0);
}

static int against_fake(enum fake kind, uvmError_t want, const char *w1, const char *w2)
{
	char path[108];
	int lfd = listening_socket(path, sizeof path, 1);
	if (lfd < 0)
		return 10;
	pid_t pid = fork();
	if (pid == 0)
		fake_server(lfd, kind);
	close(lfd);
	int rc = init_fails(want, w1, w2);
	int status;
	waitpid(pid, &status, 0);
	unlink(path);
	return rc;
}

static int hangs_up(void) { return against_fake(FAKE_HANG_UP, uvmErrorInitializationError, "hello", "exited"); }
static int truncated_hello(void) { return against_fake(FAKE_TRUNCATED, uvmErrorInitializationError, "hello reply is truncated", "another version"); }
static int too_many_devices(void) { return against_fake(FAKE_TOO_MANY_DEVICES, uvmErrorInitializationError, "reports 40 devices", "at most 31"); }
static int other_version(void) { return against_fake(FAKE_OTHER_VERSION, uvmErrorInitializationError, "hello", "malformed"); }

int main(void)
{
	CHECK(run_case(no_daemon, "UVM_SERVER", "daemon", "UVM_SOCKET", "/nonexistent/uvm.sock") == 0);
	CHECK(run_case(no_daemon, "UVM_SERVER", "auto", "UVM_SOCKET", "/nonexistent/uvm.sock") == 0);
	CHECK(run_case(bad_binary, "UVM_SERVER", "private", "UVM_BIN", "/nonexistent/uvm") == 0);
	CHECK(run_case(bad_mode, "UVM_SERVER", "sometimes", NULL, NULL) == 0);
	CHECK(run_case(bad_config, "UVM_DEVICES", "many", NULL, NULL) == 0);
	CHECK(run_case(not_a_program, NULL, NULL, NULL, NULL) == 0);
	CHECK(run_case(not_a_server, "UVM_SERVER", "private", "UVM_BIN", "/bin/true") == 0);
	CHECK(run_case(no_userfaultfd, NULL, NULL, NULL, NULL) == 0);
	CHECK(run_case(out_of_descriptors, "UVM_SERVER", "private", NULL, NULL) == 0);
	CHECK(run_case(long_socket_path, NULL, NULL, NULL, NULL) == 0);
	CHECK(run_case(refused, NULL, NULL, NULL, NULL) == 0);
	CHECK(run_case(hangs_up, NULL, NULL, NULL, NULL) == 0);
	CHECK(run_case(truncated_hello, NULL, NULL, NULL, NULL) == 0);
	CHECK(run_case(too_many_devices, NULL, NULL, NULL, NULL) == 0);
	CHECK(run_case(other_version, NULL, NULL, NULL, NULL) == 0);
	CHECK(run_case(works, NULL, NULL, NULL, NULL) == 0);
	return check_done("init_test");
}
