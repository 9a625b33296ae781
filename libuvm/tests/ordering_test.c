/*
 * ordering_test.c: CUDA's order between streams and calls. The legacy
 * default stream with blocking and non-blocking streams; synchronous
 * copies, fills and frees; events on the legacy stream and their times;
 * per-thread default streams; host functions in stream order; stream
 * queries; and a failed launch, reported by everything after it. Run by
 * integration/libuvm_test.go with a private server, 2 devices of 2
 * workers and 64 MiB arenas.
 *
 * A rule that says "waits" is checked with a kernel that takes a while
 * (it naps, then writes): what comes after must see all it wrote. A
 * rule that says "does not wait" is checked with a kernel gated on a
 * flag (gate.h) that the test sets only after the call returned: a
 * call that waited would leave the kernel to give up, which fails the
 * test rather than hangs it.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <sched.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <unistd.h>

#include "check.h"
#include "gate.h"

/* How long a slow kernel naps before it writes: far longer than a call
 * that does not wait takes to come back. */
#define SLOW_MS 40

/* slow_fill: naps SLOW_MS, then out[i] = value + i. */
struct fill_params {
	uint32_t *out;
	uint32_t n, value;
};

static void slow_fill(unsigned tid, unsigned nthreads, const void *params)
{
	const struct fill_params *p = params;
	struct timespec ts = {.tv_sec = 0, .tv_nsec = SLOW_MS * 1000000L};
	while (nanosleep(&ts, &ts) != 0)
		;
	for (uint32_t i = tid; i < p->n; i += nthreads)
		p->out[i] = p->value + i;
}

static const uint32_t N = 64 * 1024;

/* zeroed_managed returns N zeroed uint32_t of managed memory. */
static uint32_t *zeroed_managed(void)
{
	uint32_t *p = NULL;
	CHECK_OK(uvmMallocManaged((void **)&p, N * sizeof *p, uvmMemAttachGlobal));
	if (p)
		memset(p, 0, N * sizeof *p);
	return p;
}

/* A kernel, then a synchronous copy of what it writes: the copy is
 * issued on the legacy default stream, which waits for the kernel on
 * the legacy stream itself and on a blocking stream; uvmMemset waits
 * the same way, and uvmMemcpyPeer for the legacy streams of both its
 * devices. */
static void test_sync_copy_reads_kernel_result(void)
{
	uint32_t *dev, *host = malloc(N * sizeof *host);
	CHECK_OK(uvmMalloc((void **)&dev, N * sizeof *dev));
	uvmStream_t blocking;
	CHECK_OK(uvmStreamCreate(&blocking));
	uvmStream_t streams[2] = {NULL, blocking};
	for (int i = 0; i < 2 && dev && host; i++) {
		struct fill_params p = {.out = dev, .n = N, .value = 100 + (uint32_t)i};
		memset(host, 0, N * sizeof *host);
		CHECK_OK(uvmLaunchKernel(0, streams[i], 2, slow_fill, &p, sizeof p));
		CHECK_OK(uvmMemcpy(host, dev, N * sizeof *host, uvmMemcpyDeviceToHost));
		CHECK(filled(host, N, p.value));
	}
	/* uvmMemset after a kernel writing the same memory: the fill lands
	 * last. */
	struct fill_params p = {.out = dev, .n = N, .value = 7};
	CHECK_OK(uvmLaunchKernel(0, blocking, 2, slow_fill, &p, sizeof p));
	CHECK_OK(uvmMemset(dev, 0x5a, N * sizeof *dev));
	CHECK_OK(uvmMemcpy(host, dev, N * sizeof *host, uvmMemcpyDeviceToHost));
	CHECK(all_bytes(host, N * sizeof *host, 0x5a));

	/* uvmMemcpyPeer: after device 1's kernel that writes its source,
	 * and device 0's kernel that writes its destination. */
	uint32_t *dev1 = NULL;
	CHECK_OK(uvmSetDevice(1));
	CHECK_OK(uvmMalloc((void **)&dev1, N * sizeof *dev1));
	CHECK_OK(uvmSetDevice(0));
	if (dev1) {
		struct fill_params src = {.out = dev1, .n = N, .value = 900}, dst = {.out = dev, .n = N, .value = 1};
		CHECK_OK(uvmLaunchKernel(1, NULL, 2, slow_fill, &src, sizeof src));
		CHECK_OK(uvmLaunchKernel(0, NULL, 2, slow_fill, &dst, sizeof dst));
		CHECK_OK(uvmMemcpyPeer(dev, 0, dev1, 1, N * sizeof *dev));
		CHECK_OK(uvmMemcpy(host, dev, N * sizeof *host, uvmMemcpyDeviceToHost));
		CHECK(filled(host, N, 900));
		CHECK_OK(uvmFree(dev1));
	}
	CHECK_OK(uvmDeviceSynchronize());
	CHECK_OK(uvmStreamDestroy(blocking));
	CHECK_OK(uvmFree(dev));
	free(host);
}

/* A synchronous copy does not wait for a non-blocking stream: its kernel
 * waits for a flag the test sets after the copy returned. */
static void test_sync_copy_skips_nonblocking(void)
{
	struct flag f = flag_new();
	uvmStream_t nb;
	CHECK_OK(uvmStreamCreateWithFlags(&nb, uvmStreamNonBlocking));
	unsigned flags = 9;
	CHECK_OK(uvmStreamGetFlags(nb, &flags));
	CHECK(flags == uvmStreamNonBlocking);
	uint32_t *a = zeroed_managed(), b[4] = {1, 2, 3, 4};
	if (!f.p || !a)
		return;
	struct gate_params g = gate_of(f, a, N, 50);
	CHECK_OK(uvmLaunchKernel(0, nb, 1, gate, &g, sizeof g));
	uint32_t *dev;
	CHECK_OK(uvmMalloc((void **)&dev, sizeof b));
	CHECK_OK(uvmMemcpy(dev, b, sizeof b, uvmMemcpyHostToDevice));
	CHECK_OK(uvmMemset(dev, 0, sizeof b));
	CHECK_OK(uvmStreamSynchronize(NULL)); /* the legacy stream: the blocking streams, not this one */
	CHECK(uvmStreamQuery(nb) == uvmErrorNotReady);
	flag_set(f);
	CHECK_OK(uvmStreamSynchronize(nb));
	CHECK(f.p[1] == 0); /* the kernel did not give up */
	CHECK(filled(a, N, 50));
	CHECK_OK(uvmStreamQuery(nb));
	CHECK_OK(uvmStreamDestroy(nb));
	CHECK_OK(uvmFree(dev));
	CHECK_OK(uvmFree(a));
	CHECK_OK(uvmFreeHost(f.p));
}

/* Work on the legacy stream waits for the blocking streams' work before
 * it, and work on a blocking stream after it waits for it; a
 * non-blocking stream does neither. */
static void test_legacy_order_between_kernels(void)
{
	uvmStream_t s1, nb;
	CHECK_OK(uvmStreamCreate(&s1));
	CHECK_OK(uvmStreamCreateWithFlags(&nb, uvmStreamNonBlocking));
	uint32_t *a = zeroed_managed(), *b = zeroed_managed(), *c = zeroed_managed();
	struct flag f = flag_new();
	if (!a || !b || !c || !f.p)
		return;
	/* s1 writes a slowly; the legacy stream copies a to b. */
	struct fill_params fa = {.out = a, .n = N, .value = 10};
	struct copy_params ab = {.src = a, .dst = b, .n = N};
	CHECK_OK(uvmLaunchKernel(0, s1, 2, slow_fill, &fa, sizeof fa));
	CHECK_OK(uvmLaunchKernel(0, NULL, 2, copy_kernel, &ab, sizeof ab));
	/* The legacy stream writes c slowly; s1 then copies c to a. */
	struct fill_params fc = {.out = c, .n = N, .value = 20};
	struct copy_params ca = {.src = c, .dst = a, .n = N};
	CHECK_OK(uvmLaunchKernel(0, NULL, 2, slow_fill, &fc, sizeof fc));
	CHECK_OK(uvmLaunchKernel(0, s1, 2, copy_kernel, &ca, sizeof ca));
	CHECK_OK(uvmStreamSynchronize(s1));
	CHECK(filled(b, N, 10));
	CHECK(filled(a, N, 20));

	/* The legacy stream waits for a gated kernel of its own; the
	 * non-blocking stream's work runs meanwhile. */
	struct gate_params g = gate_of(f, NULL, 0, 0);
	CHECK_OK(uvmLaunchKernel(0, NULL, 1, gate, &g, sizeof g));
	struct fill_params fb = {.out = b, .n = N, .value = 30};
	CHECK_OK(uvmLaunchKernel(0, nb, 2, slow_fill, &fb, sizeof fb));
	CHECK_OK(uvmStreamSynchronize(nb));
	CHECK(filled(b, N, 30));
	CHECK(uvmStreamQuery(NULL) == uvmErrorNotReady);
	flag_set(f);
	CHECK_OK(uvmDeviceSynchronize());
	CHECK(f.p[1] == 0);
	CHECK_OK(uvmStreamQuery(NULL));
	CHECK_OK(uvmStreamDestroy(s1));
	CHECK_OK(uvmStreamDestroy(nb));
	CHECK_OK(uvmFree(a));
	CHECK_OK(uvmFree(b));
	CHECK_OK(uvmFree(c));
	CHECK_OK(uvmFreeHost(f.p));
}

/* An event recorded on the legacy stream completes after the work of
 * every blocking stream before it, and not after a non-blocking
 * stream's; its time is when that work finished. */
static void test_event_on_legacy_stream(void)
{
	uvmStream_t s[3], nb;
	for (int i = 0; i < 3; i++)
		CHECK_OK(uvmStreamCreate(&s[i]));
	CHECK_OK(uvmStreamCreateWithFlags(&nb, uvmStreamNonBlocking));
	struct flag f = flag_new();
	uint32_t *out[3];
	for (int i = 0; i < 3; i++)
		out[i] = zeroed_managed();
	if (!f.p || !out[0] || !out[1] || !out[2])
		return;
	uvmEvent_t start, stop;
	CHECK_OK(uvmEventCreate(&start));
	CHECK_OK(uvmEventCreate(&stop));
	struct gate_params g = gate_of(f, NULL, 0, 0);
	CHECK_OK(uvmLaunchKernel(0, nb, 1, gate, &g, sizeof g));
	CHECK_OK(uvmEventRecord(start, NULL));
	struct fill_params p[3];
	for (int i = 0; i < 3; i++) {
		p[i] = (struct fill_params){.out = out[i], .n = N, .value = 1000 * (uint32_t)i};
		CHECK_OK(uvmLaunchKernel(0, s[i], 2, slow_fill, &p[i], sizeof p[i]));
	}
	CHECK_OK(uvmEventRecord(stop, NULL));
	CHECK_OK(uvmEventSynchronize(stop));
	for (int i = 0; i < 3; i++)
		CHECK(filled(out[i], N, p[i].value));
	CHECK_OK(uvmEventQuery(stop));
	float ms = 0;
	CHECK_OK(uvmEventElapsedTime(&ms, start, stop));
	CHECK(ms >= SLOW_MS); /* the kernels napped that long at least */
	/* The non-blocking stream's kernel is still gated. */
	CHECK(uvmStreamQuery(nb) == uvmErrorNotReady);
	flag_set(f);
	CHECK_OK(uvmStreamSynchronize(nb));
	CHECK(f.p[1] == 0);
	for (int i = 0; i < 3; i++)
		CHECK_OK(uvmStreamDestroy(s[i]));
	CHECK_OK(uvmStreamDestroy(nb));
	CHECK_OK(uvmEventDestroy(start));
	CHECK_OK(uvmEventDestroy(stop));
	for (int i = 0; i < 3; i++)
		CHECK_OK(uvmFree(out[i]));
	CHECK_OK(uvmFreeHost(f.p));
}

/* ---- per-thread default streams ---- */

/* A thread's default stream does not wait for another thread's, and is
 * ordered with the legacy stream both ways. */
static void test_per_thread_streams(void)
{
	struct gated_thread t = {.f = flag_new(), .stream = uvmStreamPerThread, .out = zeroed_managed(), .n = N, .value = 77};
	uint32_t *a = zeroed_managed(), *b = zeroed_managed();
	if (!t.f.p || !t.out || !a || !b)
		return;
	pthread_t th;
	if (!gated_thread_start(&t, &th)) {
		CHECK(!"pthread_create");
		return;
	}
	/* This thread's own default stream runs and synchronizes while the
	 * other thread's kernel is gated. */
	struct fill_params fa = {.out = a, .n = N, .value = 5};
	CHECK_OK(uvmLaunchKernel(0, uvmStreamPerThread, 2, slow_fill, &fa, sizeof fa));
	CHECK_OK(uvmStreamSynchronize(uvmStreamPerThread));
	CHECK(filled(a, N, 5));
	CHECK(uvmMemcpy_ptds(b, a, N * sizeof *a, uvmMemcpyDefault) == uvmSuccess);
	CHECK(filled(b, N, 5));
	unsigned flags = 9;
	CHECK_OK(uvmStreamGetFlags(uvmStreamPerThread, &flags));
	CHECK(flags == uvmStreamDefault);
	CHECK_ERR(uvmStreamDestroy(uvmStreamPerThread), uvmErrorInvalidValue);
	flag_set(t.f);
	pthread_join(th, NULL);
	CHECK(t.failures == 0);
	CHECK(t.f.p[1] == 0);
	CHECK(filled(t.out, N, 77));

	/* Ordered with the legacy stream, both ways. */
	memset(b, 0, N * sizeof *b);
	struct fill_params fb = {.out = a, .n = N, .value = 8};
	struct copy_params ab = {.src = a, .dst = b, .n = N};
	CHECK_OK(uvmLaunchKernel(0, uvmStreamPerThread, 2, slow_fill, &fb, sizeof fb));
	CHECK_OK(uvmLaunchKernel(0, NULL, 2, copy_kernel, &ab, sizeof ab));
	CHECK_OK(uvmStreamSynchronize(NULL));
	CHECK(filled(b, N, 8));
	struct fill_params fc = {.out = a, .n = N, .value = 9};
	CHECK_OK(uvmLaunchKernel(0, NULL, 2, slow_fill, &fc, sizeof fc));
	CHECK_OK(uvmLaunchKernel(0, uvmStreamPerThread, 2, copy_kernel, &ab, sizeof ab));
	CHECK_OK(uvmStreamSynchronize(uvmStreamPerThread));
	CHECK(filled(b, N, 9));

	/* Its synchronize waits for its own work, not for legacy work
	 * queued after it. */
	struct flag f = flag_new();
	struct fill_params fd = {.out = b, .n = N, .value = 12};
	struct gate_params g = gate_of(f, NULL, 0, 0);
	CHECK_OK(uvmLaunchKernel(0, uvmStreamPerThread, 2, slow_fill, &fd, sizeof fd));
	CHECK_OK(uvmLaunchKernel(0, NULL, 1, gate, &g, sizeof g));
	CHECK_OK(uvmStreamSynchronize(uvmStreamPerThread));
	CHECK(filled(b, N, 12));
	CHECK(uvmStreamQuery(NULL) == uvmErrorNotReady);
	flag_set(f);
	CHECK_OK(uvmStreamSynchronize(NULL));
	CHECK(f.p[1] == 0);
	CHECK_OK(uvmFreeHost(f.p));
	CHECK_OK(uvmFree(a));
	CHECK_OK(uvmFree(b));
	CHECK_OK(uvmFree(t.out));
	CHECK_OK(uvmFreeHost(t.f.p));
}

/* ---- frees ---- */

/* A free waits for the kernels that may use the memory, on every stream
 * (a non-blocking one too), as cudaFree: the kernels finished before it
 * returned, and none crashed on freed memory. */
static void test_free_waits_for_kernels(void)
{
	uvmStream_t nb;
	CHECK_OK(uvmStreamCreateWithFlags(&nb, uvmStreamNonBlocking));
	uint32_t *a = zeroed_managed(), *b = zeroed_managed();
	if (!a || !b)
		return;
	struct fill_params fa = {.out = a, .n = N, .value = 3}, fb = {.out = b, .n = N, .value = 4};
	CHECK_OK(uvmLaunchKernel(0, NULL, 2, slow_fill, &fa, sizeof fa));
	CHECK_OK(uvmLaunchKernel(0, nb, 2, slow_fill, &fb, sizeof fb));
	CHECK_OK(uvmFree(a));
	/* b's kernel had finished by then too, and wrote all of b. */
	CHECK(filled(b, N, 4));
	CHECK_OK(uvmFree(b));
	CHECK_OK(uvmDeviceSynchronize());
	CHECK_OK(uvmStreamDestroy(nb));
}

/* ---- host functions ---- */

struct host_check {
	uint32_t *before; /* written by the kernel before the function */
	uint32_t *after;  /* the function writes it; the kernel after copies it */
	int saw_before;   /* 1: the kernel before had written all of before */
	int api;          /* what an API call from the function returned */
	int calls;
	uvmStream_t handle;
	uvmError_t status;
};

static void host_fn(void *data)
{
	struct host_check *h = data;
	h->saw_before = filled(h->before, N, 60);
	for (uint32_t i = 0; i < N; i++)
		h->after[i] = 70 + i;
	h->api = uvmStreamSynchronize(NULL);
	h->calls++;
}

static void callback(uvmStream_t stream, uvmError_t status, void *data)
{
	struct host_check *h = data;
	h->handle = stream;
	h->status = status;
	h->calls++;
}

/* A host function runs once the work before it finished, and the work
 * after it waits for it: on a created stream and on the legacy one. It
 * may not call the API. A callback gets its stream and status. */
static void test_host_function_between_work(void)
{
	uvmStream_t s;
	CHECK_OK(uvmStreamCreate(&s));
	uvmStream_t streams[2] = {s, NULL};
	for (int i = 0; i < 2; i++) {
		struct host_check h = {.before = zeroed_managed(), .after = zeroed_managed()};
		uint32_t *copy = zeroed_managed();
		if (!h.before || !h.after || !copy)
			return;
		struct fill_params fb = {.out = h.before, .n = N, .value = 60};
		struct copy_params ac = {.src = h.after, .dst = copy, .n = N};
		CHECK_OK(uvmLaunchKernel(0, streams[i], 2, slow_fill, &fb, sizeof fb));
		CHECK_OK(uvmLaunchHostFunc(streams[i], host_fn, &h));
		CHECK_OK(uvmLaunchKernel(0, streams[i], 2, copy_kernel, &ac, sizeof ac));
		CHECK_OK(uvmStreamAddCallback(streams[i], callback, &h, 0));
		CHECK_OK(uvmStreamSynchronize(streams[i]));
		CHECK(h.calls == 2);
		CHECK(h.saw_before == 1);
		CHECK(h.api == uvmErrorNotPermitted);
		CHECK(filled(copy, N, 70));
		CHECK(h.handle == streams[i]);
		CHECK(h.status == uvmSuccess);
		CHECK_OK(uvmFree(h.before));
		CHECK_OK(uvmFree(h.after));
		CHECK_OK(uvmFree(copy));
	}
	CHECK_ERR(uvmLaunchHostFunc(s, NULL, NULL), uvmErrorInvalidValue);
	CHECK_ERR(uvmStreamAddCallback(s, callback, NULL, 1), uvmErrorInvalidValue);
	CHECK_OK(uvmStreamDestroy(s));
}

/* ---- a failed launch ---- */

/* proc_state reads the state letter and parent of process pid, and
 * whether it is named comm. */
static bool proc_state(int pid, char *state, int *ppid, const char *comm)
{
	char path[64], buf[256], name[64] = "";
	snprintf(path, sizeof path, "/proc/%d/stat", pid);
	FILE *f = fopen(path, "r");
	if (!f)
		return false;
	bool ok = fgets(buf, sizeof buf, f) && sscanf(buf, "%*d (%63[^)]) %c %d", name, state, ppid) == 3 && strcmp(name, comm) == 0;
	fclose(f);
	return ok;
}

/* dead says whether process pid has exited with every thread: a zombie
 * of one thread, its descriptors closed, which the library reaps. */
static bool dead(int pid)
{
	char path[64], line[128];
	snprintf(path, sizeof path, "/proc/%d/status", pid);
	FILE *f = fopen(path, "r");
	if (!f)
		return true;
	bool zombie = false, one = false;
	while (fgets(line, sizeof line, f)) {
		zombie |= strncmp(line, "State:\tZ", 8) == 0;
		one |= strcmp(line, "Threads:\t1\n") == 0;
	}
	fclose(f);
	return zombie && one;
}

/* kill_device_process kills device 0's process, as someone outside
 * might, and waits until it is dead. */
static int kill_device_process(void)
{
	int victim = 0, killed = 0;
	DIR *d = opendir("/proc");
	struct dirent *e;
	while (d && (e = readdir(d))) {
		char state;
		int pid = atoi(e->d_name), ppid;
		if (pid > 0 && proc_state(pid, &state, &ppid, "uvm-device-0") && ppid == getpid() && state != 'Z') {
			victim = pid;
			killed += kill(pid, SIGKILL) == 0;
		}
	}
	if (d)
		closedir(d);
	while (victim && !dead(victim))
		sched_yield();
	return killed;
}

/* A kernel that crashes fails its device: every later synchronize of
 * its stream, of the device's other streams and of the device, and every
 * event recorded after it, reports the crash; new work is refused; a
 * reset clears it all. */
static void test_failed_launch_is_sticky(void)
{
	uvmStream_t s, other;
	CHECK_OK(uvmStreamCreate(&s));
	CHECK_OK(uvmStreamCreateWithFlags(&other, uvmStreamNonBlocking));
	uvmEvent_t before, after;
	CHECK_OK(uvmEventCreate(&before));
	CHECK_OK(uvmEventCreate(&after));
	CHECK_OK(uvmEventRecord(before, s));
	CHECK_OK(uvmEventSynchronize(before));
	CHECK_OK(uvmLaunchKernel(0, s, 1, null_deref, NULL, 0));
	CHECK_OK(uvmEventRecord(after, s)); /* the crash is not known yet */
	CHECK_ERR(uvmEventSynchronize(after), uvmErrorLaunchFailure);
	CHECK(strstr(uvmGetLastErrorMessage(), "null_deref") != NULL);
	for (int round = 0; round < 2; round++) {
		CHECK_ERR(uvmEventSynchronize(after), uvmErrorLaunchFailure);
		CHECK_ERR(uvmEventQuery(after), uvmErrorLaunchFailure);
		CHECK_ERR(uvmEventSynchronize(before), uvmErrorLaunchFailure);
		CHECK_ERR(uvmStreamSynchronize(s), uvmErrorLaunchFailure);
		CHECK(strstr(uvmGetLastErrorMessage(), "null_deref") != NULL);
		CHECK_ERR(uvmStreamSynchronize(other), uvmErrorLaunchFailure);
		CHECK_ERR(uvmStreamSynchronize(NULL), uvmErrorLaunchFailure);
		CHECK_ERR(uvmDeviceSynchronize(), uvmErrorLaunchFailure);
		CHECK_ERR(uvmStreamQuery(s), uvmErrorLaunchFailure);
	}
	float ms;
	CHECK_ERR(uvmEventElapsedTime(&ms, before, after), uvmErrorLaunchFailure);
	CHECK_ERR(uvmLaunchKernel(0, other, 1, nap, &(unsigned){1}, sizeof(unsigned)), uvmErrorLaunchFailure);
	CHECK_ERR(uvmEventRecord(after, NULL), uvmErrorLaunchFailure);
	struct host_check h = {0};
	CHECK_ERR(uvmStreamAddCallback(s, callback, &h, 0), uvmErrorLaunchFailure);
	/* Device 1 does not notice. */
	CHECK_OK(uvmSetDevice(1));
	CHECK_OK(uvmLaunchKernel(1, NULL, 1, nap, &(unsigned){1}, sizeof(unsigned)));
	CHECK_OK(uvmDeviceSynchronize());
	CHECK_OK(uvmSetDevice(0));

	CHECK_OK(uvmDeviceReset());
	CHECK_OK(uvmDeviceSynchronize());
	CHECK_OK(uvmEventSynchronize(after));
	CHECK_OK(uvmStreamCreate(&s));
	CHECK_OK(uvmLaunchKernel(0, s, 1, nap, &(unsigned){1}, sizeof(unsigned)));
	CHECK_OK(uvmEventRecord(after, s));
	CHECK_OK(uvmEventSynchronize(after));

	/* A launch that fails at the call (the device's process was killed:
	 * the launch finds it dead) fails the device too: an event recorded
	 * before it reports that, and one recorded after it is refused. The
	 * launch goes on a new stream, with nothing queued that would take it
	 * to a thread of the stream's (the failure would then come back from
	 * the next synchronize). */
	CHECK(kill_device_process() == 1);
	CHECK_OK(uvmStreamCreateWithFlags(&other, uvmStreamNonBlocking));
	CHECK_ERR(uvmLaunchKernel(0, other, 1, nap, &(unsigned){1}, sizeof(unsigned)), uvmErrorLaunchFailure);
	CHECK(strstr(uvmGetLastErrorMessage(), "killed by signal 9") != NULL);
	CHECK_ERR(uvmEventSynchronize(after), uvmErrorLaunchFailure);
	CHECK_ERR(uvmEventRecord(after, s), uvmErrorLaunchFailure);
	CHECK_ERR(uvmEventSynchronize(after), uvmErrorLaunchFailure);
	CHECK_ERR(uvmStreamSynchronize(s), uvmErrorLaunchFailure);
	CHECK_ERR(uvmDeviceSynchronize(), uvmErrorLaunchFailure);
	CHECK_OK(uvmDeviceReset());
	CHECK_OK(uvmEventDestroy(before));
	CHECK_OK(uvmEventDestroy(after));
}

/* A callback after a crash gets the device's failure as its status. */
static void test_callback_status_after_crash(void)
{
	uvmStream_t s;
	CHECK_OK(uvmStreamCreate(&s));
	struct host_check h = {0};
	CHECK_OK(uvmLaunchKernel(0, s, 1, null_deref, NULL, 0));
	CHECK_OK(uvmStreamAddCallback(s, callback, &h, 0));
	CHECK_ERR(uvmStreamSynchronize(s), uvmErrorLaunchFailure);
	CHECK(h.calls == 1);
	CHECK(h.status == uvmErrorLaunchFailure);
	CHECK_OK(uvmDeviceReset());
}

int main(void)
{
	test_sync_copy_reads_kernel_result();
	test_sync_copy_skips_nonblocking();
	test_legacy_order_between_kernels();
	test_event_on_legacy_stream();
	test_per_thread_streams();
	test_free_waits_for_kernels();
	test_host_function_between_work();
	test_failed_launch_is_sticky();
	test_callback_status_after_crash();
	return check_done("ordering_test");
}
