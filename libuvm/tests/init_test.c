/*
 * init_test.c: what a program sees when no fault server can be had. Each
 * case runs in a child of its own, since the first call connects (or
 * fails to) once per process.
 */
#define _GNU_SOURCE
#include <stdlib.h>
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

int main(void)
{
	CHECK(run_case(no_daemon, "UVM_SERVER", "daemon", "UVM_SOCKET", "/nonexistent/uvm.sock") == 0);
	CHECK(run_case(no_daemon, "UVM_SERVER", "auto", "UVM_SOCKET", "/nonexistent/uvm.sock") == 0);
	CHECK(run_case(bad_binary, "UVM_SERVER", "private", "UVM_BIN", "/nonexistent/uvm") == 0);
	CHECK(run_case(bad_mode, "UVM_SERVER", "sometimes", NULL, NULL) == 0);
	CHECK(run_case(bad_config, "UVM_DEVICES", "many", NULL, NULL) == 0);
	CHECK(run_case(works, NULL, NULL, NULL, NULL) == 0);
	return check_done("init_test");
}
