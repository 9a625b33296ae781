/*
 * profiler.c: uvmProfilerStart and uvmProfilerStop, CUDA's profiler API,
 * which start and stop a trace of this process's managed memory as
 * `uvm trace` records one: every fault, migration, prefetch, eviction,
 * allocation and free, and the kernels launched, in the file format
 * docs/traces.md describes (`uvm trace summary|export|plot FILE` read
 * it). The file is $UVM_TRACE if set (made absolute against the working
 * directory), else PROGRAM.uvmtrace in the working directory, as `uvm
 * trace record` names it; a later start after a stop records to FILE.2,
 * FILE.3 and on. Under UVM_TRACE the session records from its start
 * already: uvmProfilerStart changes nothing until a uvmProfilerStop has
 * ended that recording. The server writes the file (trace-control).
 */
#include "internal.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

extern char *program_invocation_short_name;

static uvmError_t trace_control(const char *what, uint8_t op, const char *path)
{
	if (uvm__device_process >= 0)
		return uvm__refuse_in_device(what);
	uvmError_t err;
	struct uvm_session *s = uvm__session(&err);
	if (!s)
		return err;
	uint8_t buf[PATH_MAX + 64], reply[512];
	struct uvm_msg m = {.buf = buf, .cap = sizeof buf};
	uvm__encode_trace_control(&m, 0, op, path);
	struct uvm_reader r;
	return uvm__request(s, &m, NULL, 0, reply, sizeof reply, &r, NULL, 0, NULL, what);
}

uvmError_t uvmProfilerStart(void)
{
	char path[PATH_MAX], cwd[PATH_MAX];
	const char *env = getenv("UVM_TRACE");
	const char *name = env && *env ? env : NULL;
	char fallback[NAME_MAX + 16];
	if (!name) {
		snprintf(fallback, sizeof fallback, "%s.uvmtrace", program_invocation_short_name);
		name = fallback;
	}
	if (name[0] == '/')
		snprintf(path, sizeof path, "%s", name);
	else if (!getcwd(cwd, sizeof cwd))
		return uvm__fail(uvmErrorUnknown, "uvmProfilerStart: the working directory, where %s goes: %s", name, strerror(errno));
	else if ((size_t)snprintf(path, sizeof path, "%s/%s", cwd, name) >= sizeof path)
		return uvm__fail(uvmErrorInvalidValue, "uvmProfilerStart: the trace's path %s/%s is too long", cwd, name);
	return trace_control("uvmProfilerStart", UVM_TRACE_START, path);
}

uvmError_t uvmProfilerStop(void) { return trace_control("uvmProfilerStop", UVM_TRACE_STOP, ""); }
