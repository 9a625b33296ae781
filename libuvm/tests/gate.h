/*
 * gate.h: what the C tests of ordering share: kernels that wait for a
 * flag in pinned host memory, so that ordering is checked without
 * sleeping. A kernel that must still be running waits for the flag,
 * which the test sets once it has seen what it wanted to see (a call
 * that returned, data not written yet); the kernel gives up after a
 * while and says so, so a broken library fails the test rather than
 * hangs it. Include after check.h.
 */
#ifndef UVM_GATE_H
#define UVM_GATE_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <time.h>

#define MiB (1ul << 20)
/* How long a kernel waits for its flag before it gives up. */
#define FLAG_TIMEOUT_S 20

static __attribute__((unused)) double now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

/* gate: waits until *flag is set (or gives up, setting *gave_up), then
 * fills out[0..n) with value + i, if out. */
struct gate_params {
	volatile int *flag;
	int *gave_up;
	uint32_t *out;
	uint32_t n, value;
};

static __attribute__((unused)) void gate(unsigned tid, unsigned nthreads, const void *params)
{
	const struct gate_params *p = params;
	if (tid == 0) {
		double deadline = now_ms() + FLAG_TIMEOUT_S * 1e3;
		while (!__atomic_load_n(p->flag, __ATOMIC_ACQUIRE)) {
			if (now_ms() > deadline) {
				__atomic_store_n(p->gave_up, 1, __ATOMIC_RELEASE);
				break;
			}
			nanosleep(&(struct timespec){.tv_nsec = 100000}, NULL);
		}
	}
	if (!p->out)
		return;
	for (uint32_t i = tid; i < p->n; i += nthreads)
		p->out[i] = p->value + i;
}

/* copy_kernel: dst[i] = src[i]. */
struct copy_params {
	const uint32_t *src;
	uint32_t *dst;
	uint32_t n;
};

static __attribute__((unused)) void copy_kernel(unsigned tid, unsigned nthreads, const void *params)
{
	const struct copy_params *p = params;
	for (uint32_t i = tid; i < p->n; i += nthreads)
		p->dst[i] = p->src[i];
}

/* nap: sleeps *params milliseconds. */
static __attribute__((unused)) void nap(unsigned tid, unsigned nthreads, const void *params)
{
	(void)tid, (void)nthreads;
	unsigned ms = *(const unsigned *)params;
	struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000};
	while (nanosleep(&ts, &ts) != 0)
		;
}

static __attribute__((unused)) void null_deref(unsigned tid, unsigned nthreads, const void *params)
{
	(void)tid, (void)nthreads, (void)params;
	*(volatile int *)NULL = 1;
}

/* ---- helpers ---- */

/* A flag in pinned host memory, which kernels of every device see. */
struct flag {
	int *p; /* p[0]: the flag, p[1]: a kernel gave up */
};

static __attribute__((unused)) struct flag flag_new(void)
{
	struct flag f = {NULL};
	CHECK_OK(uvmHostAlloc((void **)&f.p, 4096, uvmHostAllocMapped));
	if (f.p)
		f.p[0] = f.p[1] = 0;
	return f;
}

static __attribute__((unused)) void flag_set(struct flag f) { __atomic_store_n(&f.p[0], 1, __ATOMIC_RELEASE); }

static __attribute__((unused)) struct gate_params gate_of(struct flag f, uint32_t *out, uint32_t n, uint32_t value)
{
	return (struct gate_params){.flag = f.p, .gave_up = &f.p[1], .out = out, .n = n, .value = value};
}

static __attribute__((unused)) bool filled(const uint32_t *a, uint32_t n, uint32_t value)
{
	for (uint32_t i = 0; i < n; i++)
		if (a[i] != value + i) {
			fprintf(stderr, "element %u is %u, want %u\n", i, a[i], value + i);
			return false;
		}
	return true;
}

static __attribute__((unused)) bool all_bytes(const void *p, size_t n, unsigned char v)
{
	const unsigned char *b = p;
	for (size_t i = 0; i < n; i++)
		if (b[i] != v) {
			fprintf(stderr, "byte %zu is %#x, want %#x\n", i, b[i], v);
			return false;
		}
	return true;
}

/* A thread that launches a gated kernel on stream (of device 0), filling
 * out[0..n) with value + i, says so, then synchronizes the stream: a
 * stream the test's own thread must not wait for. */
struct gated_thread {
	struct flag f;
	uvmStream_t stream;
	uint32_t *out;
	uint32_t n, value;
	bool launched;
	pthread_mutex_t mu;
	pthread_cond_t cv;
	int failures;
};

static __attribute__((unused)) void *gated_thread_main(void *arg)
{
	struct gated_thread *t = arg;
	struct gate_params g = gate_of(t->f, t->out, t->n, t->value);
	t->failures += uvmLaunchKernel(0, t->stream, 1, gate, &g, sizeof g) != uvmSuccess;
	pthread_mutex_lock(&t->mu);
	t->launched = true;
	pthread_cond_broadcast(&t->cv);
	pthread_mutex_unlock(&t->mu);
	t->failures += uvmStreamSynchronize(t->stream) != uvmSuccess;
	return NULL;
}

/* gated_thread_start starts t and returns once its kernel is launched. */
static __attribute__((unused)) bool gated_thread_start(struct gated_thread *t, pthread_t *th)
{
	pthread_mutex_init(&t->mu, NULL);
	pthread_cond_init(&t->cv, NULL);
	if (pthread_create(th, NULL, gated_thread_main, t) != 0)
		return false;
	pthread_mutex_lock(&t->mu);
	while (!t->launched)
		pthread_cond_wait(&t->cv, &t->mu);
	pthread_mutex_unlock(&t->mu);
	return true;
}

#endif
