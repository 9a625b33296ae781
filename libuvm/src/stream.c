/*
 * stream.c: streams, their order, launches, and the host-side work
 * queued on a stream (prefetches, copies, fills, attachments, host
 * functions, marks and waits), in stream order with its kernels.
 * device.c writes the launches and synchronizes.
 *
 * Each stream (a device's default stream included) has a queue. While it
 * is empty, a launch is written to the device's process at once, by the
 * launching thread: a launch costs one message. Host-side work is
 * queued, and a thread of the stream's own (its worker) starts to run
 * the queue: before each host operation it waits for the stream's
 * kernels written so far (a synchronize of that stream), then runs it; a
 * launch made while the queue is not empty is queued behind it, and the
 * worker writes it in its turn. The worker ends when the queue is empty,
 * and launches go straight to the device again. Errors of queued work go
 * to the stream's next synchronize, as CUDA reports asynchronous errors;
 * a launch that fails, as it is written or as it runs, fails its device
 * (device.c): every later synchronize and event reports it, until
 * uvmDeviceReset.
 *
 * Marks. A mark is a point in a stream's order: it completes, with the
 * time, once the work queued on the stream before it has finished.
 * Events are marks (event.c); so is the order between streams: an
 * operation that must wait for another stream's work waits for a mark
 * placed at that stream's end (OP_WAIT).
 *
 * The legacy default stream (NULL, uvmStreamLegacy; one per device, id
 * 0) is ordered with every blocking stream of its device, as CUDA's:
 * work queued on it first waits for a mark at the end of each blocking
 * stream with work in flight, and work queued on a blocking stream
 * first waits for a mark at the legacy stream's end, if it has work in
 * flight. Streams made with uvmStreamNonBlocking take no part. A
 * per-thread default stream (uvmStreamPerThread) is a blocking stream of
 * the calling thread's own, made at its first use and ended with the
 * thread. A stream with nothing in flight needs no mark, so a program
 * that uses one stream pays nothing for the order; a mark already
 * placed at a stream's end, or already waited for, serves again.
 *
 * Each queued operation has a ticket; a synchronize waits for the
 * tickets given out before it, then for the kernels (device.c), then
 * returns the errors of both, and calls the coherence hook.
 *
 * Locks, outermost first: a device's order_mu (the order between its
 * streams: gathering the marks a submission waits for, then submitting,
 * is one step, so that two threads submitting at once are ordered one
 * way or the other); streams_mu (the handle table and each device's list
 * of streams); a queue's mu (its queue and order state; one at a time,
 * never two); device.c's locks; a mark's mu. A worker takes no order_mu
 * and no streams_mu but to start another worker's queue reference. A
 * queue is freed when its handle is destroyed and its worker and waiters
 * are done with it.
 */
#include "internal.h"

#include <errno.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

/* ---- marks ---- */

struct uvm_mark {
	pthread_mutex_t mu;
	pthread_cond_t cv; /* done */
	unsigned refs;     /* atomic */
	int device;        /* of the stream it was placed on */
	bool done;         /* written under mu, read atomically */
	uint64_t ns;       /* mu: CLOCK_MONOTONIC when it completed */
};

static uint64_t now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static struct uvm_mark *mark_new(int device)
{
	struct uvm_mark *m = uvm__sys_calloc(1, sizeof *m);
	if (!m)
		return NULL;
	pthread_mutex_init(&m->mu, NULL);
	pthread_cond_init(&m->cv, NULL);
	m->refs = 1;
	m->device = device;
	return m;
}

void uvm__mark_hold(struct uvm_mark *m) { __atomic_add_fetch(&m->refs, 1, __ATOMIC_RELAXED); }

void uvm__mark_put(struct uvm_mark *m)
{
	if (!m || __atomic_sub_fetch(&m->refs, 1, __ATOMIC_ACQ_REL) > 0)
		return;
	pthread_cond_destroy(&m->cv);
	pthread_mutex_destroy(&m->mu);
	uvm__sys_free(m);
}

/* mark_complete completes m now. */
static void mark_complete(struct uvm_mark *m)
{
	uint64_t t = now_ns();
	pthread_mutex_lock(&m->mu);
	if (!m->done) {
		m->ns = t;
		__atomic_store_n(&m->done, true, __ATOMIC_RELEASE);
		pthread_cond_broadcast(&m->cv);
	}
	pthread_mutex_unlock(&m->mu);
}

bool uvm__mark_done(const struct uvm_mark *m) { return __atomic_load_n(&m->done, __ATOMIC_ACQUIRE); }

void uvm__mark_wait(struct uvm_mark *m, enum uvm_wait how)
{
	if (how != UVM_WAIT_BLOCK) {
		while (!uvm__mark_done(m))
			uvm__wait_pause(how);
		return;
	}
	pthread_mutex_lock(&m->mu);
	while (!m->done)
		pthread_cond_wait(&m->cv, &m->mu);
	pthread_mutex_unlock(&m->mu);
}

uint64_t uvm__mark_ns(struct uvm_mark *m)
{
	pthread_mutex_lock(&m->mu);
	uint64_t t = m->ns;
	pthread_mutex_unlock(&m->mu);
	return t;
}

int uvm__mark_device(const struct uvm_mark *m) { return m->device; }

void uvm__mark_forked(struct uvm_mark *m)
{
	pthread_mutex_init(&m->mu, NULL);
	pthread_cond_init(&m->cv, NULL);
	if (!m->done) {
		m->ns = now_ns();
		m->done = true;
	}
}

/* ---- queues ---- */

enum op_kind {
	OP_LAUNCH, /* a kernel */
	OP_HOST,   /* a function of the library: a prefetch, copy, fill or attachment */
	OP_USER,   /* the program's host function or callback */
	OP_MARK,   /* complete a mark (an event's record, another stream's wait) */
	OP_WAIT,   /* wait for a mark of another stream */
	OP_END,    /* the stream was destroyed: end it in the device's process */
};

struct op {
	struct op *next;
	enum op_kind kind;
	uint64_t ticket;
	union {
		struct {
			uintptr_t kernel;
			struct uvm_launch_shape shape;
			int cpu;
			size_t n;
		} launch;
		struct {
			uvmError_t (*fn)(void *arg);
			const char *what;
			bool now_if_idle; /* run at once on a stream with nothing in flight */
		} host;
		struct {
			uvmHostFn_t fn;                /* uvmLaunchHostFunc's, or */
			uvmStreamCallback_t callback; /* uvmStreamAddCallback's */
			void *data;
			uvmStream_t handle;
		} user;
		struct uvm_mark *mark; /* held by the op */
	} u;
	/* The launch's params or the host operation's argument. */
	_Alignas(16) unsigned char data[];
};

enum queue_kind {
	Q_LEGACY,     /* a device's legacy default stream, id 0 */
	Q_CREATED,    /* uvmStreamCreate's */
	Q_PER_THREAD, /* a thread's per-thread default stream */
};

struct queue {
	pthread_mutex_t mu;
	pthread_cond_t cv; /* done advanced, or the worker ended */
	int device;
	uint32_t id; /* in the device's process */
	enum queue_kind kind;
	unsigned flags; /* uvmStreamDefault or uvmStreamNonBlocking */
	int priority;
	unsigned refs;          /* atomic: the handle, the worker, waiters */
	bool ended;             /* mu: destroyed, nothing more is queued */
	struct op *head, *tail; /* mu */
	uint64_t queued;        /* mu: tickets given out */
	uint64_t done;          /* the last ticket run: written under mu, read atomically */
	bool worker;            /* mu: a worker runs the queue (it is not empty, or it runs the last op) */
	struct uvm_errs errs;   /* mu: errors for the next synchronize */
	/* The order between streams, all under mu. submitted counts the
	 * work submitted (launches written at once included); tail_mark is
	 * a mark at the end of that work while tail_at == submitted.
	 * waited is the legacy stream's mark this (blocking) stream waits
	 * for last; legacy_waits is this stream's mark the legacy stream
	 * waits for last. Each is held. */
	uint64_t submitted;
	struct uvm_mark *tail_mark;
	uint64_t tail_at;
	struct uvm_mark *waited;
	struct uvm_mark *legacy_waits;
	struct queue *next; /* in its device's list (streams_mu) */
};

static pthread_mutex_t streams_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_mutex_t order_mu[UVM_MAX_DEVICES] = {[0 ... UVM_MAX_DEVICES - 1] = PTHREAD_MUTEX_INITIALIZER};
static struct queue defaults[UVM_MAX_DEVICES];
/* Workers running, of every stream (atomic): when none runs, nothing is
 * queued anywhere. */
static unsigned workers;
/* streams_mu: every created and per-thread stream's queue. */
static struct queue *device_streams[UVM_MAX_DEVICES];

/* in_host_fn is set while a worker runs the program's host function,
 * which may not call the API (uvmErrorNotPermitted, as CUDA's): one that
 * waited for its own stream would never return. */
static __thread bool in_host_fn;

uvmError_t uvm__refuse_in_host_fn(const char *fn)
{
	if (!in_host_fn)
		return uvmSuccess;
	return uvm__fail(uvmErrorNotPermitted, "%s called in a host function (uvmLaunchHostFunc, uvmStreamAddCallback): it may not call the API, as CUDA's",
			 fn);
}

static void queue_init(struct queue *q, int device, uint32_t id, enum queue_kind kind, unsigned flags, int priority)
{
	memset(q, 0, sizeof *q);
	pthread_mutex_init(&q->mu, NULL);
	pthread_cond_init(&q->cv, NULL);
	q->device = device;
	q->id = id;
	q->kind = kind;
	q->flags = flags;
	q->priority = priority;
}

UVM_CORE_CONSTRUCTOR static void init_default_queues(void)
{
	for (int i = 0; i < UVM_MAX_DEVICES; i++)
		queue_init(&defaults[i], i, 0, Q_LEGACY, uvmStreamDefault, 0);
}

static bool blocking(const struct queue *q) { return !(q->flags & uvmStreamNonBlocking); }

static void queue_hold(struct queue *q)
{
	if (q->kind != Q_LEGACY)
		__atomic_add_fetch(&q->refs, 1, __ATOMIC_RELAXED);
}

/* queue_hold_live holds q unless its last reference is gone (it is being
 * freed). streams_mu is held. */
static bool queue_hold_live(struct queue *q)
{
	unsigned r = __atomic_load_n(&q->refs, __ATOMIC_RELAXED);
	while (r > 0)
		if (__atomic_compare_exchange_n(&q->refs, &r, r + 1, false, __ATOMIC_ACQUIRE, __ATOMIC_RELAXED))
			return true;
	return false;
}

/* forget_order lets go of q's order state. */
static void forget_order(struct queue *q)
{
	uvm__mark_put(q->tail_mark);
	uvm__mark_put(q->waited);
	uvm__mark_put(q->legacy_waits);
	q->tail_mark = q->waited = q->legacy_waits = NULL;
}

static void queue_put(struct queue *q)
{
	if (q->kind == Q_LEGACY || __atomic_sub_fetch(&q->refs, 1, __ATOMIC_ACQ_REL) > 0)
		return;
	pthread_mutex_lock(&streams_mu);
	for (struct queue **p = &device_streams[q->device]; *p; p = &(*p)->next)
		if (*p == q) {
			*p = q->next;
			break;
		}
	pthread_mutex_unlock(&streams_mu);
	forget_order(q);
	pthread_cond_destroy(&q->cv);
	pthread_mutex_destroy(&q->mu);
	uvm__sys_free(q);
}

static struct op *op_new(enum op_kind kind, size_t extra)
{
	struct op *op = uvm__sys_malloc(sizeof *op + extra);
	if (op) {
		memset(op, 0, sizeof *op);
		op->kind = kind;
	}
	return op;
}

static void op_free(struct op *op)
{
	if (op->kind == OP_MARK || op->kind == OP_WAIT)
		uvm__mark_put(op->u.mark);
	uvm__sys_free(op);
}

static void add_last_error(struct uvm_errs *e, uvmError_t err)
{
	const char *msg = uvmGetLastErrorMessage();
	uvm__errs_add(e, err, msg, strlen(msg));
}

/* launch_now writes a launch on q's stream, after the coherence hook. A
 * launch that cannot be written fails its device, as one that fails as
 * it runs does: the work after it must not report success. */
static uvmError_t launch_now(struct queue *q, uintptr_t kernel, const struct uvm_launch_shape *shape, const void *params, size_t n, int cpu)
{
	char name[UVM_KERNEL_NAME_MAX];
	uvm__device_kernel_name(kernel, name, sizeof name);
	uvmError_t err = uvm__coherence_before_launch(q->device, q->id, name);
	if (!err)
		err = uvm__device_launch(q->device, q->id, kernel, shape, params, n, cpu);
	if (err && !uvm__device_failure(q->device, NULL))
		uvm__device_fail(q->device, err, uvmGetLastErrorMessage());
	return err;
}

/* settle waits for the kernels written on q's stream, if any may still
 * run. The worker's waits block: it has nothing else to do. */
static void settle(struct queue *q, struct uvm_errs *e)
{
	if (uvm__device_stream_idle(q->device, q->id))
		return;
	uvm__device_sync(q->device, q->id, UVM_WAIT_BLOCK, false, &q->errs, &q->mu);
	uvmError_t err = uvm__coherence_after_sync(q->device, q->id);
	if (err)
		add_last_error(e, err);
}

/* end_stream ends q's stream in the device's process; errors no
 * synchronize of it can report any more go to the device's next. */
static void end_stream(struct queue *q)
{
	uvm__device_stream_end(q->device, q->id);
	struct uvm_errs e = {0};
	pthread_mutex_lock(&q->mu);
	uvm__errs_move(&e, &q->errs);
	pthread_mutex_unlock(&q->mu);
	uvm__device_add_pending(q->device, &e);
}

static void run_user(struct queue *q, struct op *op)
{
	in_host_fn = true;
	if (op->u.user.fn) {
		op->u.user.fn(op->u.user.data);
	} else {
		uvmError_t status = uvm__device_failure(q->device, NULL);
		if (!status) {
			pthread_mutex_lock(&q->mu);
			status = q->errs.code;
			pthread_mutex_unlock(&q->mu);
		}
		op->u.user.callback(op->u.user.handle, status, op->u.user.data);
	}
	in_host_fn = false;
}

static void run_op(struct queue *q, struct op *op, struct uvm_errs *e)
{
	uvmError_t err;
	switch (op->kind) {
	case OP_LAUNCH:
		/* Behind a failure the device takes no launch: the failure
		 * is what the next synchronize reports. */
		if (!uvm__device_failure(q->device, NULL))
			launch_now(q, op->u.launch.kernel, &op->u.launch.shape, op->u.launch.n ? op->data : NULL, op->u.launch.n, op->u.launch.cpu);
		return;
	case OP_HOST:
		settle(q, e);
		if ((err = op->u.host.fn(op->data)))
			add_last_error(e, err);
		return;
	case OP_USER:
		settle(q, e);
		run_user(q, op);
		return;
	case OP_MARK:
		settle(q, e);
		mark_complete(op->u.mark);
		return;
	case OP_WAIT:
		uvm__mark_wait(op->u.mark, UVM_WAIT_BLOCK);
		return;
	case OP_END:
		end_stream(q);
		return;
	}
}

/* run_queue runs q's operations until it is empty. q->mu is held, and
 * q->worker set. */
static void run_queue(struct queue *q)
{
	while (q->head) {
		struct op *op = q->head;
		q->head = op->next;
		if (!q->head)
			q->tail = NULL;
		pthread_mutex_unlock(&q->mu);
		struct uvm_errs e = {0};
		run_op(q, op, &e);
		pthread_mutex_lock(&q->mu);
		uvm__errs_move(&q->errs, &e);
		__atomic_store_n(&q->done, op->ticket, __ATOMIC_RELEASE);
		pthread_cond_broadcast(&q->cv);
		op_free(op);
	}
	q->worker = false;
	__atomic_sub_fetch(&workers, 1, __ATOMIC_RELEASE);
	pthread_cond_broadcast(&q->cv);
}

static void *worker_main(void *arg)
{
	struct queue *q = arg;
	pthread_mutex_lock(&q->mu);
	run_queue(q);
	pthread_mutex_unlock(&q->mu);
	queue_put(q);
	return NULL;
}

/* enqueue appends op to q and starts a worker if none runs. q->mu is
 * held. A worker that cannot be started is done without: the queue runs
 * on the calling thread. */
static void enqueue(struct queue *q, struct op *op)
{
	op->ticket = ++q->queued;
	op->next = NULL;
	if (q->tail)
		q->tail->next = op;
	else
		q->head = op;
	q->tail = op;
	if (q->worker)
		return;
	q->worker = true;
	__atomic_add_fetch(&workers, 1, __ATOMIC_ACQUIRE);
	queue_hold(q);
	pthread_attr_t attr;
	pthread_t t;
	pthread_attr_init(&attr);
	pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
	/* Signals are for the program's own threads to take. */
	sigset_t all, old;
	sigfillset(&all);
	pthread_sigmask(SIG_SETMASK, &all, &old);
	int e = pthread_create(&t, &attr, worker_main, q);
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	pthread_attr_destroy(&attr);
	if (e) {
		run_queue(q);
		queue_put(q);
	}
}

/* The most operations a queue holds: a thread that queues more waits
 * for room, as CUDA's launches wait when its queue is full, so that a
 * loop of Async calls cannot outrun its stream without bound. */
#define QUEUE_MAX 1024

/* wait_room waits until q has room for one more operation. q->mu is
 * held. */
static void wait_room(struct queue *q)
{
	while (q->worker && q->queued - q->done >= QUEUE_MAX)
		pthread_cond_wait(&q->cv, &q->mu);
}

/* drain_wait waits (how) until q has run what was queued on it up to
 * ticket target. */
static void drain_wait(struct queue *q, uint64_t target, enum uvm_wait how)
{
	if (how == UVM_WAIT_BLOCK) {
		pthread_mutex_lock(&q->mu);
		while (q->done < target)
			pthread_cond_wait(&q->cv, &q->mu);
		pthread_mutex_unlock(&q->mu);
		return;
	}
	while (__atomic_load_n(&q->done, __ATOMIC_ACQUIRE) < target)
		uvm__wait_pause(how);
}

static uint64_t queued_now(struct queue *q)
{
	pthread_mutex_lock(&q->mu);
	uint64_t t = q->queued;
	pthread_mutex_unlock(&q->mu);
	return t;
}

/* drain_queues waits (how) until each of qs has run what was queued on
 * it at the call (what it queues meanwhile is not waited for). */
static void drain_queues(struct queue **qs, size_t n, enum uvm_wait how)
{
	uint64_t few[16], *targets = n <= 16 ? few : uvm__sys_malloc(n * sizeof *targets);
	for (size_t i = 0; i < n; i++) {
		uint64_t t = queued_now(qs[i]);
		if (targets)
			targets[i] = t;
		else
			drain_wait(qs[i], t, how);
	}
	for (size_t i = 0; targets && i < n; i++)
		drain_wait(qs[i], targets[i], how);
	if (targets != few)
		uvm__sys_free(targets);
}

/* in_flight says whether q has work that may not have finished: queued
 * operations, or kernels written since its last synchronize. q->mu is
 * held. */
static bool in_flight(struct queue *q) { return q->worker || !uvm__device_stream_idle(q->device, q->id); }

/* place_mark returns a mark (held) that completes once the work
 * submitted on q so far has finished: the one already at its end, or a
 * new one queued; NULL in *out when nothing is in flight. q->mu is held. */
static uvmError_t place_mark(struct queue *q, struct uvm_mark **out)
{
	*out = NULL;
	if (q->tail_mark && q->tail_at == q->submitted) {
		uvm__mark_hold(q->tail_mark);
		*out = q->tail_mark;
		return uvmSuccess;
	}
	if (!in_flight(q))
		return uvmSuccess;
	struct uvm_mark *m = mark_new(q->device);
	struct op *op = m ? op_new(OP_MARK, 0) : NULL;
	if (!op) {
		uvm__mark_put(m);
		return uvm__fail(uvmErrorMemoryAllocation, "order stream %u of device %d: no memory for a mark", q->id, q->device);
	}
	op->u.mark = m; /* the op's reference */
	wait_room(q);
	enqueue(q, op);
	uvm__mark_put(q->tail_mark);
	uvm__mark_hold(m);
	q->tail_mark = m;
	q->tail_at = q->submitted;
	uvm__mark_hold(m);
	*out = m;
	return uvmSuccess;
}

/* ---- the order between a device's streams ---- */

/* device_queues returns every queue of device d, held, the legacy
 * stream's first; NULL if there is no memory for the list. */
static struct queue **device_queues(int d, size_t *n)
{
	pthread_mutex_lock(&streams_mu);
	size_t count = 1;
	for (struct queue *q = device_streams[d]; q; q = q->next)
		count++;
	struct queue **qs = uvm__sys_malloc(count * sizeof *qs);
	if (qs) {
		qs[0] = &defaults[d];
		*n = 1;
		for (struct queue *q = device_streams[d]; q; q = q->next)
			if (queue_hold_live(q))
				qs[(*n)++] = q;
	}
	pthread_mutex_unlock(&streams_mu);
	return qs;
}

static void put_queues(struct queue **qs, size_t n)
{
	for (size_t i = 0; i < n; i++)
		queue_put(qs[i]);
	uvm__sys_free(qs);
}

/* The marks a submission waits for, with the ops that will wait for
 * them, and for the legacy stream the blocking streams they belong to. */
struct deps {
	size_t n;
	struct uvm_mark **marks;
	struct op **waits;
	struct queue **of; /* held */
	struct queue **all;
	size_t nall;
};

static void deps_free(struct deps *d)
{
	for (size_t i = 0; i < d->n; i++) {
		uvm__mark_put(d->marks[i]);
		if (d->waits[i])
			uvm__sys_free(d->waits[i]);
	}
	if (d->all)
		put_queues(d->all, d->nall);
	uvm__sys_free(d->marks);
	uvm__sys_free(d->waits);
	uvm__sys_free(d->of);
	*d = (struct deps){0};
}

/* deps_add adds m (held), a mark of queue of, and an op to wait for it. */
static uvmError_t deps_add(struct deps *d, struct uvm_mark *m, struct queue *of)
{
	struct op *w = op_new(OP_WAIT, 0);
	if (!w) {
		uvm__mark_put(m);
		return uvm__fail(uvmErrorMemoryAllocation, "order the streams of device %d: no memory", m->device);
	}
	d->marks[d->n] = m;
	d->waits[d->n] = w;
	d->of[d->n] = of;
	d->n++;
	return uvmSuccess;
}

/* gather_deps finds what work submitted on q now must wait for: for the
 * legacy stream, the work in flight on every blocking stream of its
 * device; for a blocking stream, the legacy stream's; nothing for a
 * non-blocking one. order_mu of q's device is held. */
static uvmError_t gather_deps(struct queue *q, struct deps *d)
{
	*d = (struct deps){0};
	if (!blocking(q))
		return uvmSuccess;
	if (q->kind != Q_LEGACY) {
		struct queue *l = &defaults[q->device];
		struct uvm_mark *m;
		pthread_mutex_lock(&l->mu);
		uvmError_t err = place_mark(l, &m);
		pthread_mutex_unlock(&l->mu);
		if (err || !m)
			return err;
		d->marks = uvm__sys_malloc(sizeof *d->marks);
		d->waits = uvm__sys_malloc(sizeof *d->waits);
		d->of = uvm__sys_malloc(sizeof *d->of);
		if (!d->marks || !d->waits || !d->of) {
			uvm__mark_put(m);
			deps_free(d);
			return uvm__fail(uvmErrorMemoryAllocation, "order the streams of device %d: no memory", q->device);
		}
		return deps_add(d, m, l);
	}
	pthread_mutex_lock(&streams_mu);
	bool none = device_streams[q->device] == NULL;
	pthread_mutex_unlock(&streams_mu);
	if (none)
		return uvmSuccess;
	d->all = device_queues(q->device, &d->nall);
	d->marks = uvm__sys_malloc(d->nall * sizeof *d->marks);
	d->waits = uvm__sys_malloc(d->nall * sizeof *d->waits);
	d->of = uvm__sys_malloc(d->nall * sizeof *d->of);
	if (!d->all || !d->marks || !d->waits || !d->of) {
		deps_free(d);
		return uvm__fail(uvmErrorMemoryAllocation, "order the streams of device %d: no memory", q->device);
	}
	for (size_t i = 1; i < d->nall; i++) {
		struct queue *b = d->all[i];
		if (!blocking(b))
			continue;
		struct uvm_mark *m;
		pthread_mutex_lock(&b->mu);
		uvmError_t err = place_mark(b, &m);
		if (m && m == b->legacy_waits) { /* waited for already */
			uvm__mark_put(m);
			m = NULL;
		}
		pthread_mutex_unlock(&b->mu);
		if (!err && m)
			err = deps_add(d, m, b);
		if (err) {
			deps_free(d);
			return err;
		}
	}
	return uvmSuccess;
}

/* apply_deps queues d's waits on q, before the work being submitted.
 * q->mu is held. Returns whether any was queued. */
static bool apply_deps(struct queue *q, struct deps *d)
{
	bool any = false;
	for (size_t i = 0; i < d->n; i++) {
		struct uvm_mark *m = d->marks[i];
		if (q->kind != Q_LEGACY && m == q->waited)
			continue; /* this stream waits for it already */
		struct op *w = d->waits[i];
		d->waits[i] = NULL;
		uvm__mark_hold(m);
		w->u.mark = m;
		enqueue(q, w);
		any = true;
		if (q->kind != Q_LEGACY) {
			uvm__mark_put(q->waited);
			uvm__mark_hold(m);
			q->waited = m;
		}
	}
	return any;
}

/* note_legacy_waits records, on each blocking stream the legacy stream
 * now waits for, which of its marks that is: a mark waited for once
 * serves until the stream has new work. */
static void note_legacy_waits(struct deps *d)
{
	for (size_t i = 0; i < d->n; i++) {
		struct queue *b = d->of[i];
		if (b->kind == Q_LEGACY)
			continue;
		pthread_mutex_lock(&b->mu);
		uvm__mark_put(b->legacy_waits);
		uvm__mark_hold(d->marks[i]);
		b->legacy_waits = d->marks[i];
		pthread_mutex_unlock(&b->mu);
	}
}

/* ---- handles ----
 *
 * A uvmStream_t is a handle, never a pointer: the slot of the stream in
 * a table and the slot's generation. A slot is reused after
 * uvmStreamDestroy with the next generation, so a destroyed stream's
 * handle is recognized as such forever (a slot whose generation would
 * wrap is retired), and a handle that is no stream at all is found out
 * without touching memory it points to. NULL and uvmStreamLegacy (1) are
 * the current device's legacy default stream, uvmStreamPerThread (2) the
 * calling thread's per-thread default stream of the current device: a
 * slot handle has a generation of at least 1 in its high half. */

struct stream_slot {
	uint32_t gen;
	bool live;
	struct queue *q; /* holds a reference while live */
};

static struct stream_slot *slots;
static uint32_t nslots, slots_cap;
static uint32_t *free_slots; /* slots_cap entries */
static uint32_t nfree;

static uvmStream_t stream_handle(uint32_t slot, uint32_t gen) { return (uvmStream_t)(uintptr_t)((uint64_t)gen << 32 | (slot + 1)); }

/* check_slot says what is wrong with handle st. streams_mu is held. */
static uvmError_t check_slot(uvmStream_t st, const char *what, uint32_t *slot_out)
{
	uint64_t v = (uintptr_t)st;
	uint32_t slot = (uint32_t)v - 1, gen = (uint32_t)(v >> 32);
	if ((uint32_t)v == 0 || slot >= nslots || gen == 0 || gen > slots[slot].gen)
		return uvm__fail(uvmErrorInvalidValue,
				 "%s stream %p: not a stream (uvmStreamCreate makes them; NULL and uvmStreamLegacy are the legacy default stream, "
				 "uvmStreamPerThread the thread's)",
				 what, (void *)st);
	if (gen < slots[slot].gen || !slots[slot].live)
		return uvm__fail(uvmErrorInvalidValue, "%s stream %p: it was destroyed by uvmStreamDestroy or uvmDeviceReset", what, (void *)st);
	*slot_out = slot;
	return uvmSuccess;
}

/* The calling thread's per-thread default streams, one per device, made
 * at first use; the thread's end ends them (ptds_key's destructor). */
static __thread struct queue *per_thread[UVM_MAX_DEVICES];
static pthread_key_t ptds_key;
static pthread_once_t ptds_once = PTHREAD_ONCE_INIT;

static void end_queue(struct queue *q);

static void per_thread_exit(void *arg)
{
	(void)arg;
	for (int d = 0; d < UVM_MAX_DEVICES; d++)
		if (per_thread[d]) {
			end_queue(per_thread[d]);
			per_thread[d] = NULL;
		}
}

static void make_ptds_key(void) { pthread_key_create(&ptds_key, per_thread_exit); }

/* per_thread_queue returns the calling thread's per-thread default
 * stream of device d, held, making it if need be (again after a
 * uvmDeviceReset ended it). */
static uvmError_t per_thread_queue(int d, const char *what, struct queue **out)
{
	struct queue *q = per_thread[d];
	if (q) {
		pthread_mutex_lock(&q->mu);
		bool ended = q->ended;
		pthread_mutex_unlock(&q->mu);
		if (!ended) {
			queue_hold(q);
			*out = q;
			return uvmSuccess;
		}
		per_thread[d] = NULL;
		queue_put(q); /* the thread's reference */
	}
	pthread_once(&ptds_once, make_ptds_key);
	q = uvm__sys_malloc(sizeof *q);
	if (!q)
		return uvm__fail(uvmErrorMemoryAllocation, "%s the per-thread default stream of device %d: no memory for it", what, d);
	queue_init(q, d, uvm__device_new_stream(d), Q_PER_THREAD, uvmStreamDefault, 0);
	q->refs = 2; /* the thread's, and the caller's */
	pthread_mutex_lock(&streams_mu);
	q->next = device_streams[d];
	device_streams[d] = q;
	pthread_mutex_unlock(&streams_mu);
	per_thread[d] = q;
	pthread_setspecific(ptds_key, per_thread); /* any non-NULL value: the destructor runs */
	*out = q;
	return uvmSuccess;
}

/* queue_of returns the queue of handle st on device d (for NULL,
 * uvmStreamLegacy and uvmStreamPerThread; a created stream's own device
 * otherwise), held: queue_put lets it go. */
static uvmError_t queue_of(uvmStream_t st, int d, const char *what, struct queue **out)
{
	uvmError_t err;
	if (!st || st == uvmStreamLegacy || st == uvmStreamPerThread) {
		if ((err = uvm__check_device(d, what, NULL)))
			return err;
		if (st == uvmStreamPerThread)
			return per_thread_queue(d, what, out);
		*out = &defaults[d];
		return uvmSuccess;
	}
	uint32_t slot;
	pthread_mutex_lock(&streams_mu);
	err = check_slot(st, what, &slot);
	if (!err) {
		*out = slots[slot].q;
		queue_hold(*out);
	}
	pthread_mutex_unlock(&streams_mu);
	return err;
}

/* queue_get returns stream's queue (the special handles: the current
 * device's), held: queue_put lets it go. */
static uvmError_t queue_get(uvmStream_t st, const char *what, struct queue **out)
{
	uvmError_t err = uvm__refuse_in_host_fn(what);
	return err ? err : queue_of(st, uvm__current_device(), what, out);
}

static uvmError_t ended(uvmStream_t st, const char *what)
{
	return uvm__fail(uvmErrorInvalidValue, "%s stream %p: it was destroyed by uvmStreamDestroy or uvmDeviceReset", what, (void *)st);
}

/* refuse_failed refuses work on a failed device: its failure, as CUDA
 * refuses every call once a kernel fault corrupted its context. */
static uvmError_t refuse_failed(int d, const char *what)
{
	struct uvm_errs e = {0};
	uvmError_t code = uvm__device_failure(d, &e);
	if (!code)
		return uvmSuccess;
	return uvm__fail(code, "%s device %d: it failed earlier (uvmDeviceReset clears that): %.*s", what, d, (int)e.len, e.msg);
}

uvmError_t uvm__stream_lookup(uvmStream_t stream, const char *what, int *device, uint32_t *id)
{
	struct queue *q;
	uvmError_t err = queue_get(stream, what, &q);
	if (err)
		return err;
	*device = q->device;
	*id = q->id;
	queue_put(q);
	return uvmSuccess;
}

uvmError_t uvm__stream_device(uvmStream_t stream, const char *what, int *device)
{
	uint32_t id;
	return uvm__stream_lookup(stream, what, device, &id);
}

uvmError_t uvmStreamCreateWithPriority(uvmStream_t *stream, unsigned int flags, int priority)
{
	if (uvm__device_process >= 0)
		return uvm__refuse_in_device("uvmStreamCreateWithPriority");
	uvmError_t err = uvm__refuse_in_host_fn("uvmStreamCreate");
	if (err)
		return err;
	if (!stream)
		return uvm__fail(uvmErrorInvalidValue, "uvmStreamCreate: stream is NULL; want a pointer to a uvmStream_t");
	if (flags & ~uvmStreamNonBlocking)
		return uvm__fail(uvmErrorInvalidValue, "uvmStreamCreateWithFlags: flags %#x: want uvmStreamDefault (0) or uvmStreamNonBlocking (%#x)", flags,
				 uvmStreamNonBlocking);
	int dev = uvm__current_device();
	if ((err = uvm__check_device(dev, "uvmStreamCreate: stream on", NULL)))
		return err;
	/* One priority (uvmDeviceGetStreamPriorityRange): CUDA clamps what
	 * is outside the range to it. */
	(void)priority;
	struct queue *q = uvm__sys_malloc(sizeof *q);
	if (!q)
		return uvm__fail(uvmErrorMemoryAllocation, "uvmStreamCreate: no memory for a stream");
	queue_init(q, dev, uvm__device_new_stream(dev), Q_CREATED, flags, 0);
	q->refs = 1; /* the handle's */
	pthread_mutex_lock(&streams_mu);
	bool fresh;
	int64_t taken = uvm__slot_take(&slots, sizeof *slots, &nslots, &slots_cap, &free_slots, &nfree, &fresh);
	if (taken < 0) {
		pthread_mutex_unlock(&streams_mu);
		queue_put(q);
		return uvm__fail(uvmErrorMemoryAllocation, "uvmStreamCreate: no memory for stream %u", nslots);
	}
	uint32_t slot = (uint32_t)taken;
	if (fresh)
		slots[slot].gen = 1;
	slots[slot].live = true;
	slots[slot].q = q;
	q->next = device_streams[dev];
	device_streams[dev] = q;
	*stream = stream_handle(slot, slots[slot].gen);
	pthread_mutex_unlock(&streams_mu);
	return uvm__ok();
}

uvmError_t uvmStreamCreateWithFlags(uvmStream_t *stream, unsigned int flags)
{
	if (uvm__device_process >= 0)
		return uvm__refuse_in_device("uvmStreamCreateWithFlags");
	return uvmStreamCreateWithPriority(stream, flags, 0);
}

uvmError_t uvmStreamCreate(uvmStream_t *stream)
{
	if (uvm__device_process >= 0)
		return uvm__refuse_in_device("uvmStreamCreate");
	return uvmStreamCreateWithPriority(stream, uvmStreamDefault, 0);
}

uvmError_t uvmDeviceGetStreamPriorityRange(int *leastPriority, int *greatestPriority)
{
	/* Streams of a CPU device all run on the device's threads alike. */
	if (leastPriority)
		*leastPriority = 0;
	if (greatestPriority)
		*greatestPriority = 0;
	return uvm__ok();
}

uvmError_t uvmStreamGetFlags(uvmStream_t stream, unsigned int *flags)
{
	if (!flags)
		return uvm__fail(uvmErrorInvalidValue, "uvmStreamGetFlags: flags is NULL; want a pointer to an unsigned int");
	struct queue *q;
	uvmError_t err = queue_get(stream, "uvmStreamGetFlags:", &q);
	if (err)
		return err;
	*flags = q->flags;
	queue_put(q);
	return uvm__ok();
}

uvmError_t uvmStreamGetPriority(uvmStream_t stream, int *priority)
{
	if (!priority)
		return uvm__fail(uvmErrorInvalidValue, "uvmStreamGetPriority: priority is NULL; want a pointer to an int");
	struct queue *q;
	uvmError_t err = queue_get(stream, "uvmStreamGetPriority:", &q);
	if (err)
		return err;
	*priority = q->priority;
	queue_put(q);
	return uvm__ok();
}

/* kill_slot ends handle slot's life and returns its queue, with the
 * handle's reference. streams_mu is held. */
static struct queue *kill_slot(uint32_t slot)
{
	struct queue *q = slots[slot].q;
	slots[slot].live = false;
	slots[slot].q = NULL;
	if (slots[slot].gen < UINT32_MAX) {
		slots[slot].gen++;
		free_slots[nfree++] = slot;
	}
	return q;
}

/* end_queue ends a stream whose handle is gone, and lets the handle's
 * reference go: as CUDA's, what was queued still runs, then the stream
 * ends in the device's process. */
static void end_queue(struct queue *q)
{
	struct op *op = op_new(OP_END, 0);
	pthread_mutex_lock(&q->mu);
	q->ended = true;
	bool handed = false;
	if (q->worker && op) {
		enqueue(q, op);
		op = NULL;
		handed = true;
	}
	while (!handed && q->worker) /* no memory to queue the end: wait for the queue instead */
		pthread_cond_wait(&q->cv, &q->mu);
	pthread_mutex_unlock(&q->mu);
	if (!handed)
		end_stream(q);
	if (op)
		uvm__sys_free(op);
	queue_put(q);
}

uvmError_t uvmStreamDestroy(uvmStream_t stream)
{
	if (uvm__device_process >= 0)
		return uvm__refuse_in_device("uvmStreamDestroy");
	uvmError_t err = uvm__refuse_in_host_fn("uvmStreamDestroy");
	if (err)
		return err;
	if (!stream || stream == uvmStreamLegacy || stream == uvmStreamPerThread)
		return uvm__fail(uvmErrorInvalidValue, "uvmStreamDestroy: stream %p is a default stream, which cannot be destroyed", (void *)stream);
	uint32_t slot;
	pthread_mutex_lock(&streams_mu);
	err = check_slot(stream, "uvmStreamDestroy:", &slot);
	struct queue *q = err ? NULL : kill_slot(slot);
	pthread_mutex_unlock(&streams_mu);
	if (err)
		return err;
	end_queue(q);
	return uvm__ok();
}

/* ---- waiting for streams ---- */

/* order_set returns the queues a wait for q waits for, held: q, and for
 * the legacy stream every blocking stream of its device (work on the
 * legacy stream waits for theirs, so waiting for it is waiting for
 * them). as_work: the wait is for new work issued on q (a synchronous
 * copy), which on a per-thread stream waits for the legacy stream too;
 * a synchronize of a per-thread stream waits for its own work alone,
 * which waited for the legacy stream's as it was queued. */
static struct queue **order_set(struct queue *q, bool as_work, size_t *n)
{
	if (q->kind == Q_LEGACY) {
		struct queue **all = device_queues(q->device, n);
		if (!all)
			return NULL;
		size_t k = 1;
		for (size_t i = 1; i < *n; i++) {
			if (blocking(all[i]))
				all[k++] = all[i];
			else
				queue_put(all[i]);
		}
		*n = k;
		return all;
	}
	struct queue **qs = uvm__sys_malloc(2 * sizeof *qs);
	if (!qs)
		return NULL;
	queue_hold(q);
	qs[0] = q;
	*n = 1;
	if (q->kind == Q_PER_THREAD && as_work)
		qs[(*n)++] = &defaults[q->device];
	return qs;
}

/* host_wait waits (how) for what the queues qs had queued at the call,
 * then for their kernels, whose errors it leaves for the streams'
 * synchronizes; the coherence hook runs for each. Errors of the hook go
 * to *e. */
static void host_wait(struct queue **qs, size_t n, enum uvm_wait how, struct uvm_errs *e)
{
	drain_queues(qs, n, how);
	for (size_t i = 0; i < n; i++) {
		if (uvm__device_stream_idle(qs[i]->device, qs[i]->id))
			continue;
		uvm__device_sync(qs[i]->device, qs[i]->id, how, false, &qs[i]->errs, &qs[i]->mu);
		uvmError_t err = uvm__coherence_after_sync(qs[i]->device, qs[i]->id);
		if (err)
			add_last_error(e, err);
	}
}

/* sync_queue waits for q's queued work and kernels (for the legacy
 * stream, those of the blocking streams too), and returns q's errors and
 * its device's failure. */
static uvmError_t sync_queue(struct queue *q, enum uvm_wait how)
{
	struct uvm_errs e = {0};
	size_t n = 0;
	struct queue **qs = order_set(q, false, &n);
	if (!qs)
		return uvm__fail(uvmErrorMemoryAllocation, "synchronize stream %u of device %d: no memory to list the streams", q->id, q->device);
	/* q itself (qs[0]) as a synchronize always waited for it: one round
	 * trip, which finds a death no synchronize reported yet even when
	 * the stream is idle. */
	uint64_t target = queued_now(q);
	host_wait(qs + 1, n - 1, how, &e);
	put_queues(qs, n);
	drain_wait(q, target, how);
	uvm__device_sync(q->device, q->id, how, true, &e, NULL);
	pthread_mutex_lock(&q->mu);
	uvm__errs_move(&e, &q->errs);
	pthread_mutex_unlock(&q->mu);
	uvmError_t err = uvm__coherence_after_sync(q->device, q->id);
	if (err)
		add_last_error(&e, err);
	struct uvm_errs all = {0};
	uvm__device_failure(q->device, &all);
	uvm__errs_move(&all, &e);
	return uvm__errs_result(&all);
}

uvmError_t uvmStreamSynchronize(uvmStream_t stream)
{
	if (uvm__device_process >= 0)
		return uvm__refuse_in_device("uvmStreamSynchronize");
	struct queue *q;
	uvmError_t err = queue_get(stream, "uvmStreamSynchronize:", &q);
	if (err)
		return err;
	err = sync_queue(q, uvm__wait_mode(q->device));
	queue_put(q);
	return err ? err : uvm__ok();
}

uvmError_t uvmStreamQuery(uvmStream_t stream)
{
	if (uvm__device_process >= 0)
		return uvm__refuse_in_device("uvmStreamQuery");
	struct queue *q;
	uvmError_t err = queue_get(stream, "uvmStreamQuery:", &q);
	if (err)
		return err;
	if ((err = refuse_failed(q->device, "uvmStreamQuery: stream on"))) {
		queue_put(q);
		return err;
	}
	size_t n = 0;
	struct queue **qs = order_set(q, false, &n);
	if (!qs) {
		queue_put(q);
		return uvm__fail(uvmErrorMemoryAllocation, "uvmStreamQuery: no memory to list the streams");
	}
	/* A stream whose kernels may still run gets a mark at its end: its
	 * worker learns when they finish, and a later query says so. */
	bool busy = false;
	for (size_t i = 0; i < n && !err; i++) {
		pthread_mutex_lock(&qs[i]->mu);
		if (in_flight(qs[i])) {
			busy = true;
			struct uvm_mark *m = NULL;
			if (!qs[i]->worker)
				err = place_mark(qs[i], &m);
			uvm__mark_put(m);
		}
		pthread_mutex_unlock(&qs[i]->mu);
	}
	put_queues(qs, n);
	int d = q->device;
	uint32_t id = q->id;
	queue_put(q);
	if (err)
		return err;
	if (busy)
		return uvm__not_ready("uvmStreamQuery: stream %u of device %d has work that has not finished", id, d);
	return uvm__ok();
}

/* device_wait waits (how) for every stream of device d, and returns
 * their errors and the device's failure. */
static uvmError_t device_wait(int dev, enum uvm_wait how)
{
	size_t n = 0;
	struct queue **qs = device_queues(dev, &n);
	if (!qs)
		return uvm__fail(uvmErrorMemoryAllocation, "synchronize device %d: no memory to list its streams", dev);
	struct uvm_errs e = {0};
	drain_queues(qs, n, how);
	uvm__device_sync(dev, UVM_ALL_STREAMS, how, true, &e, NULL);
	for (size_t i = 0; i < n; i++) {
		pthread_mutex_lock(&qs[i]->mu);
		uvm__errs_move(&e, &qs[i]->errs);
		pthread_mutex_unlock(&qs[i]->mu);
	}
	put_queues(qs, n);
	uvmError_t err = uvm__coherence_after_sync(dev, UVM_ALL_STREAMS);
	if (err)
		add_last_error(&e, err);
	struct uvm_errs all = {0};
	uvm__device_failure(dev, &all);
	uvm__errs_move(&all, &e);
	return uvm__errs_result(&all);
}

uvmError_t uvmDeviceSynchronize(void)
{
	if (uvm__device_process >= 0)
		return uvm__refuse_in_device("uvmDeviceSynchronize");
	uvmError_t err = uvm__refuse_in_host_fn("uvmDeviceSynchronize");
	if (err)
		return err;
	int dev = uvm__current_device();
	if ((err = uvm__check_device(dev, "uvmDeviceSynchronize:", NULL)))
		return err;
	err = device_wait(dev, uvm__wait_mode(dev));
	return err ? err : uvm__ok();
}

uvmError_t uvmThreadSynchronize(void)
{
	if (uvm__device_process >= 0)
		return uvm__refuse_in_device("uvmThreadSynchronize");
	return uvmDeviceSynchronize();
}

uvmError_t uvm__stream_sync_before(uvmStream_t stream, int device, int other, const char *what)
{
	if (uvm__device_process >= 0)
		return uvm__refuse_in_device(what);
	uvmError_t err = uvm__refuse_in_host_fn(what);
	if (err)
		return err;
	struct uvm_session *s = uvm__session(&err);
	if (!s)
		return err;
	if (s->ndevices == 0)
		return uvmSuccess; /* no stream has work */
	char w[96];
	snprintf(w, sizeof w, "%s:", what);
	int devs[2] = {device, other};
	for (int i = 0; i < 2; i++) {
		if (devs[i] < 0 || (i == 1 && devs[1] == devs[0]))
			continue;
		struct queue *q;
		if ((err = queue_of(i == 0 ? stream : NULL, devs[i], w, &q)))
			return err;
		size_t n = 0;
		struct queue **qs = order_set(q, true, &n);
		queue_put(q);
		if (!qs)
			return uvm__fail(uvmErrorMemoryAllocation, "%s: no memory to list device %d's streams", what, devs[i]);
		struct uvm_errs e = {0};
		host_wait(qs, n, uvm__wait_mode(devs[i]), &e);
		put_queues(qs, n);
		if ((err = refuse_failed(devs[i], w)))
			return err;
		if (e.code)
			return uvm__errs_result(&e);
	}
	return uvmSuccess;
}

void uvm__streams_sync_all(void)
{
	uvmError_t err;
	struct uvm_session *s = uvm__session(&err);
	for (int d = 0; s && d < s->ndevices; d++) {
		size_t n = 0;
		struct queue **qs = device_queues(d, &n);
		if (!qs)
			continue;
		struct uvm_errs e = {0}; /* the coherence hook's: a free has none to report */
		host_wait(qs, n, UVM_WAIT_BLOCK, &e);
		put_queues(qs, n);
	}
}

uvmError_t uvmDeviceReset(void)
{
	if (uvm__device_process >= 0)
		return uvm__refuse_in_device("uvmDeviceReset");
	uvmError_t err = uvm__refuse_in_host_fn("uvmDeviceReset");
	if (err)
		return err;
	int dev = uvm__current_device();
	if ((err = uvm__check_device(dev, "uvmDeviceReset:", NULL)))
		return err;
	/* Queued work runs first: it may hold marks others wait for. */
	size_t n = 0;
	struct queue **all = device_queues(dev, &n);
	if (all)
		drain_queues(all, n, UVM_WAIT_BLOCK);
	/* The device's streams die with its process: created ones' handles
	 * become invalid, per-thread ones are made anew at their next use. */
	pthread_mutex_lock(&streams_mu);
	size_t k = 0;
	for (uint32_t i = 0; i < nslots; i++)
		k += slots[i].live && slots[i].q->device == dev;
	struct queue **qs = k ? uvm__sys_malloc(k * sizeof *qs) : NULL;
	k = 0;
	for (uint32_t i = 0; i < nslots && qs; i++)
		if (slots[i].live && slots[i].q->device == dev)
			qs[k++] = kill_slot(i);
	pthread_mutex_unlock(&streams_mu);
	for (size_t i = 0; all && i < n; i++) {
		pthread_mutex_lock(&all[i]->mu);
		if (all[i]->kind != Q_LEGACY)
			all[i]->ended = true;
		forget_order(all[i]);
		all[i]->submitted++;
		pthread_mutex_unlock(&all[i]->mu);
	}
	for (size_t i = 0; i < k; i++)
		queue_put(qs[i]);
	uvm__sys_free(qs);
	if (all)
		put_queues(all, n);
	uvm__device_reset(dev);
	pthread_mutex_lock(&defaults[dev].mu);
	defaults[dev].errs = (struct uvm_errs){0};
	pthread_mutex_unlock(&defaults[dev].mu);
	return uvm__ok();
}

/* ---- submitting work ---- */

/* submit queues op (NULL: a launch, written at once if nothing is ahead
 * of it) on q, held (submit lets it go), after the marks of other
 * streams the legacy order makes it wait for. For a launch, launch holds
 * what to write. */
struct launch_args {
	uintptr_t kernel;
	const struct uvm_launch_shape *shape;
	const void *params;
	size_t n;
	int cpu;
};

static uvmError_t submit(struct queue *q, uvmStream_t handle, struct op *op, const struct launch_args *launch, const char *what)
{
	uvmError_t err = refuse_failed(q->device, what);
	if (err) {
		if (op)
			op_free(op);
		queue_put(q);
		return err;
	}
	bool ordered = blocking(q);
	if (ordered)
		pthread_mutex_lock(&order_mu[q->device]);
	struct deps d = {0};
	if (ordered && (err = gather_deps(q, &d))) {
		pthread_mutex_unlock(&order_mu[q->device]);
		if (op)
			op_free(op);
		queue_put(q);
		return err;
	}
	pthread_mutex_lock(&q->mu);
	wait_room(q);
	if (q->ended) {
		err = ended(handle, what);
		if (op)
			op_free(op);
	} else {
		bool waits = apply_deps(q, &d);
		if (op && op->kind == OP_MARK && !waits && !in_flight(q)) {
			/* Nothing ahead of the mark: complete now, rather than
			 * start a worker to find that out. */
			mark_complete(op->u.mark);
			op_free(op);
		} else if (op && op->kind == OP_HOST && op->u.host.now_if_idle && !waits && !in_flight(q)) {
			/* The stream reaches it now: the caller sees it done. */
			err = op->u.host.fn(op->data);
			op_free(op);
		} else if (op) {
			enqueue(q, op);
		} else if (!waits && !q->worker) {
			err = launch_now(q, launch->kernel, launch->shape, launch->params, launch->n, launch->cpu);
		} else {
			/* Behind other work: queued, with a copy of the params,
			 * as CUDA copies kernel arguments at the launch. */
			struct op *l = op_new(OP_LAUNCH, launch->n);
			if (!l) {
				err = uvm__fail(uvmErrorMemoryAllocation, "%s device %d: no memory to queue the launch", what, q->device);
			} else {
				l->u.launch.kernel = launch->kernel;
				l->u.launch.shape = *launch->shape;
				l->u.launch.cpu = launch->cpu;
				l->u.launch.n = launch->n;
				if (launch->n)
					memcpy(l->data, launch->params, launch->n);
				enqueue(q, l);
			}
		}
		q->submitted++;
	}
	pthread_mutex_unlock(&q->mu);
	if (!err && q->kind == Q_LEGACY)
		note_legacy_waits(&d);
	if (ordered)
		pthread_mutex_unlock(&order_mu[q->device]);
	deps_free(&d);
	queue_put(q);
	return err;
}

uvmError_t uvmLaunchKernel(int device, uvmStream_t stream, unsigned nthreads, uvmKernel_t kernel, const void *params, size_t paramsSize)
{
	if (uvm__device_process >= 0)
		return uvm__refuse_in_device("uvmLaunchKernel");
	if (nthreads == 0 || nthreads > UVM_MAX_LAUNCH_THREADS)
		return uvm__fail(uvmErrorInvalidValue, "uvmLaunchKernel on device %d with %u threads: want 1 to %u", device, nthreads, UVM_MAX_LAUNCH_THREADS);
	struct uvm_launch_shape shape = {.nthreads = nthreads};
	return uvm__launch(device, stream, (uintptr_t)kernel, &shape, params, paramsSize, "uvmLaunchKernel");
}

uvmError_t uvm__launch(int device, uvmStream_t stream, uintptr_t kernel, const struct uvm_launch_shape *shape, const void *params, size_t paramsSize,
		       const char *what)
{
	uvmError_t err = uvm__refuse_in_host_fn(what);
	if (err)
		return err;
	if (!kernel)
		return uvm__fail(uvmErrorInvalidValue, "%s on device %d: the kernel is NULL; want a function of the program", what, device);
	if (paramsSize > uvmMaxKernelParams)
		return uvm__fail(uvmErrorInvalidValue, "%s on device %d with %zu bytes of parameters: at most %d (uvmMaxKernelParams)", what,
				 device, paramsSize, uvmMaxKernelParams);
	if (!params && paramsSize)
		return uvm__fail(uvmErrorInvalidValue, "%s on device %d: params is NULL with paramsSize %zu; want both or neither", what, device,
				 paramsSize);
	char on[64];
	snprintf(on, sizeof on, "%s on", what);
	struct queue *q;
	if ((err = queue_of(stream, device, on, &q)))
		return err;
	if (q->device != device) {
		int other = q->device;
		queue_put(q);
		return uvm__fail(uvmErrorInvalidValue, "%s on device %d with stream %p of device %d: a stream runs work on its own device only", what,
				 device, (void *)stream, other);
	}
	/* The device's stream thread follows a launching thread that will
	 * sleep in its synchronize (a wake-up on the same CPU is cheaper);
	 * one that spins keeps its CPU to itself. */
	struct launch_args a = {.kernel = kernel,
				.shape = shape,
				.params = params,
				.n = paramsSize,
				.cpu = uvm__wait_mode(device) == UVM_WAIT_BLOCK ? sched_getcpu() : -1};
	err = submit(q, stream, NULL, &a, on);
	return err ? err : uvm__ok();
}

/* ---- host work, host functions, marks ---- */

static uvmError_t enqueue_host(uvmStream_t stream, const char *what, uvmError_t (*fn)(void *arg), const void *arg, size_t size, bool now_if_idle);

uvmError_t uvm__stream_enqueue_host(uvmStream_t stream, const char *what, uvmError_t (*fn)(void *arg), const void *arg, size_t size)
{
	return enqueue_host(stream, what, fn, arg, size, false);
}

uvmError_t uvm__stream_order_host(uvmStream_t stream, const char *what, uvmError_t (*fn)(void *arg), const void *arg, size_t size)
{
	return enqueue_host(stream, what, fn, arg, size, true);
}

static uvmError_t enqueue_host(uvmStream_t stream, const char *what, uvmError_t (*fn)(void *arg), const void *arg, size_t size, bool now_if_idle)
{
	if (uvm__device_process >= 0)
		return uvm__refuse_in_device(what);
	uvmError_t err;
	if (!stream || stream == uvmStreamLegacy || stream == uvmStreamPerThread) {
		struct uvm_session *s = uvm__session(&err);
		if (!s)
			return err;
		if (s->ndevices == 0) /* no stream to queue it on: done now */
			return fn((void *)arg);
	}
	char w[96];
	snprintf(w, sizeof w, "%s:", what);
	struct queue *q;
	if ((err = queue_get(stream, w, &q)))
		return err;
	struct op *op = op_new(OP_HOST, size);
	if (!op) {
		queue_put(q);
		return uvm__fail(uvmErrorMemoryAllocation, "%s: no memory to queue it", what);
	}
	op->u.host.fn = fn;
	op->u.host.what = what;
	op->u.host.now_if_idle = now_if_idle;
	memcpy(op->data, arg, size);
	return submit(q, stream, op, NULL, w);
}

/* queue_user queues the program's host function or callback on stream. */
static uvmError_t queue_user(uvmStream_t stream, uvmHostFn_t fn, uvmStreamCallback_t callback, void *data, const char *what)
{
	if (uvm__device_process >= 0)
		return uvm__refuse_in_device(what);
	char w[96];
	snprintf(w, sizeof w, "%s:", what);
	if (!fn && !callback)
		return uvm__fail(uvmErrorInvalidValue, "%s the function is NULL; want a function of the program", w);
	struct queue *q;
	uvmError_t err = queue_get(stream, w, &q);
	if (err)
		return err;
	struct op *op = op_new(OP_USER, 0);
	if (!op) {
		queue_put(q);
		return uvm__fail(uvmErrorMemoryAllocation, "%s no memory to queue it", w);
	}
	op->u.user.fn = fn;
	op->u.user.callback = callback;
	op->u.user.data = data;
	op->u.user.handle = stream;
	err = submit(q, stream, op, NULL, w);
	return err ? err : uvm__ok();
}

uvmError_t uvmLaunchHostFunc(uvmStream_t stream, uvmHostFn_t fn, void *userData)
{
	return queue_user(stream, fn, NULL, userData, "uvmLaunchHostFunc");
}

uvmError_t uvmStreamAddCallback(uvmStream_t stream, uvmStreamCallback_t callback, void *userData, unsigned int flags)
{
	if (flags != 0)
		return uvm__fail(uvmErrorInvalidValue, "uvmStreamAddCallback: flags %#x: want 0", flags);
	return queue_user(stream, NULL, callback, userData, "uvmStreamAddCallback");
}

uvmError_t uvm__stream_record(uvmStream_t stream, const char *what, struct uvm_mark **out)
{
	struct queue *q;
	uvmError_t err = queue_get(stream, what, &q);
	if (err)
		return err;
	struct uvm_mark *m = mark_new(q->device);
	struct op *op = m ? op_new(OP_MARK, 0) : NULL;
	if (!op) {
		uvm__mark_put(m);
		queue_put(q);
		return uvm__fail(uvmErrorMemoryAllocation, "%s no memory for the record", what);
	}
	uvm__mark_hold(m);
	op->u.mark = m; /* the op's; the other is the caller's */
	if ((err = submit(q, stream, op, NULL, what))) {
		uvm__mark_put(m);
		return err;
	}
	*out = m;
	return uvmSuccess;
}

uvmError_t uvm__stream_wait_mark(uvmStream_t stream, struct uvm_mark *m, const char *what)
{
	struct queue *q;
	uvmError_t err = queue_get(stream, what, &q);
	if (err)
		return err;
	struct op *op = op_new(OP_WAIT, 0);
	if (!op) {
		queue_put(q);
		return uvm__fail(uvmErrorMemoryAllocation, "%s no memory to queue the wait", what);
	}
	uvm__mark_hold(m);
	op->u.mark = m;
	return submit(q, stream, op, NULL, what);
}

/* uvm__stream_ids names stream's device and its id on the wire (0: the
 * legacy default stream), for uvmStreamAttachMemAsync. */
uvmError_t uvm__stream_ids(uvmStream_t stream, const char *what, int *device, uint32_t *id)
{
	return uvm__stream_lookup(stream, what, device, id);
}

/* ---- fork ----
 *
 * A fork's child has none of the parent's workers, and the parent's
 * streams are not its own: their handles die (stale ones stay invalid),
 * the default streams start empty, and the locks are made anew, as the
 * parent's other threads may have held them. The queued work is the
 * parent's: left, not run; marks it would have completed count as
 * complete (event.c). A device fork leaves all this alone. */
static void atfork_child(void)
{
	if (uvm__in_device_fork)
		return;
	pthread_mutex_init(&streams_mu, NULL);
	for (uint32_t i = 0; i < nslots; i++) {
		slots[i].live = false;
		slots[i].q = NULL;
	}
	nfree = 0;
	for (int i = 0; i < UVM_MAX_DEVICES; i++) {
		pthread_mutex_init(&order_mu[i], NULL);
		device_streams[i] = NULL;
		per_thread[i] = NULL;
		queue_init(&defaults[i], i, 0, Q_LEGACY, uvmStreamDefault, 0);
	}
	workers = 0;
}

UVM_CORE_CONSTRUCTOR static void install_stream_fork_handler(void) { pthread_atfork(NULL, NULL, atfork_child); }
