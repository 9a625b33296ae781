/*
 * stream.c: streams, launches, and the host-side work queued on a stream
 * (prefetches, copies, fills, event records and waits), in stream order
 * with its kernels. device.c writes the launches and synchronizes.
 *
 * Each stream (a device's default stream included) has a queue. While it
 * is empty, a launch is written to the device's process at once, by the
 * launching thread: a launch costs one message, as it did before streams
 * had queues. Host-side work is queued, and a thread of the stream's own
 * (its worker) starts to run the queue: before each host operation it
 * waits for the stream's kernels written so far (a synchronize of that
 * stream, whose errors it keeps for the stream's next synchronize), then
 * runs it; a launch made while the queue is not empty is queued behind
 * it, and the worker writes it in its turn. The worker ends when the
 * queue is empty, and launches go straight to the device again. Errors
 * of queued work go to the stream's next synchronize, as CUDA reports
 * asynchronous errors.
 *
 * Each queued operation has a ticket; a synchronize waits for the
 * tickets given out before it, then for the kernels (device.c), then
 * returns the errors of both, and calls the coherence hook.
 *
 * Locks: streams_mu guards the handle table and each device's list of
 * streams; a queue's mu guards the queue. A queue's mu is taken before a
 * device's mu (device.c) and after a stream socket's sync_mu, never
 * with streams_mu held; streams_mu is taken inside a queue's mu only to
 * start a worker. A queue is freed when its handle is destroyed and its
 * worker and waiters are done with it.
 */
#include "internal.h"

#include <errno.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>

/* ---- queues ---- */

enum op_kind {
	OP_LAUNCH, /* a kernel */
	OP_HOST,   /* a function of memory.c: a prefetch, copy or fill */
	OP_RECORD, /* an event record */
	OP_WAIT,   /* wait for an event's record */
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
		} host;
		struct {
			struct uvm_event *ev;
			uint64_t gen;
		} ev;
	} u;
	/* The launch's params or the host operation's argument. */
	_Alignas(16) unsigned char data[];
};

struct queue {
	pthread_mutex_t mu;
	pthread_cond_t cv; /* done advanced, or the worker ended */
	int device;
	uint32_t id; /* in the device's process */
	bool is_default;
	unsigned refs;      /* atomic: the handle, the worker, waiters */
	bool ended;         /* mu: destroyed, nothing more is queued */
	struct op *head, *tail; /* mu */
	uint64_t queued;    /* mu: tickets given out */
	uint64_t done;      /* the last ticket run: written under mu, read atomically */
	bool worker;        /* mu: a worker runs the queue (it is not empty, or it runs the last op) */
	struct uvm_errs errs; /* mu: errors for the next synchronize */
	struct queue *next; /* in its device's list (streams_mu) */
};

static pthread_mutex_t streams_mu = PTHREAD_MUTEX_INITIALIZER;
static struct queue defaults[UVM_MAX_DEVICES];
/* Workers running, of every stream (atomic): when none runs, nothing is
 * queued anywhere. */
static unsigned workers;
static struct queue *device_streams[UVM_MAX_DEVICES]; /* streams_mu: every created stream's queue */

static void queue_init(struct queue *q, int device, uint32_t id, bool is_default)
{
	memset(q, 0, sizeof *q);
	pthread_mutex_init(&q->mu, NULL);
	pthread_cond_init(&q->cv, NULL);
	q->device = device;
	q->id = id;
	q->is_default = is_default;
}

UVM_CORE_CONSTRUCTOR static void init_default_queues(void)
{
	for (int i = 0; i < UVM_MAX_DEVICES; i++)
		queue_init(&defaults[i], i, 0, true);
}

static void queue_hold(struct queue *q)
{
	if (!q->is_default)
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

static void queue_put(struct queue *q)
{
	if (q->is_default || __atomic_sub_fetch(&q->refs, 1, __ATOMIC_ACQ_REL) > 0)
		return;
	pthread_mutex_lock(&streams_mu);
	for (struct queue **p = &device_streams[q->device]; *p; p = &(*p)->next)
		if (*p == q) {
			*p = q->next;
			break;
		}
	pthread_mutex_unlock(&streams_mu);
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
	if (op->kind == OP_RECORD || op->kind == OP_WAIT)
		uvm__event_unref(op->u.ev.ev);
	uvm__sys_free(op);
}

static void add_last_error(struct uvm_errs *e, uvmError_t err)
{
	const char *msg = uvmGetLastErrorMessage();
	uvm__errs_add(e, err, msg, strlen(msg));
}

/* launch_now writes a launch on q's stream, after the coherence hook. */
static uvmError_t launch_now(struct queue *q, uintptr_t kernel, const struct uvm_launch_shape *shape, const void *params, size_t n, int cpu)
{
	char name[UVM_KERNEL_NAME_MAX];
	uvm__device_kernel_name(kernel, name, sizeof name);
	uvmError_t err = uvm__coherence_before_launch(q->device, q->id, name);
	if (err)
		return err;
	return uvm__device_launch(q->device, q->id, kernel, shape, params, n, cpu);
}

/* settle waits for the kernels written on q's stream, if any may still
 * run: their errors go to q's, for its next synchronize. The worker's
 * waits block: it has nothing else to do. */
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

static void run_op(struct queue *q, struct op *op, struct uvm_errs *e)
{
	uvmError_t err;
	switch (op->kind) {
	case OP_LAUNCH:
		if ((err = launch_now(q, op->u.launch.kernel, &op->u.launch.shape, op->u.launch.n ? op->data : NULL, op->u.launch.n,
				      op->u.launch.cpu)))
			add_last_error(e, err);
		return;
	case OP_HOST:
		settle(q, e);
		if ((err = op->u.host.fn(op->data)))
			add_last_error(e, err);
		return;
	case OP_RECORD:
		settle(q, e);
		uvm__event_complete(op->u.ev.ev, op->u.ev.gen);
		return;
	case OP_WAIT:
		uvm__event_wait(op->u.ev.ev, op->u.ev.gen);
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

/* drain_wait waits (how) until q has run what was queued on it before
 * the call. */
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

/* ---- handles ----
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
		return uvm__fail(uvmErrorInvalidValue, "%s stream %p: not a stream (uvmStreamCreate makes them; NULL is the default stream)", what,
				 (void *)st);
	if (gen < slots[slot].gen || !slots[slot].live)
		return uvm__fail(uvmErrorInvalidValue, "%s stream %p: it was destroyed by uvmStreamDestroy", what, (void *)st);
	*slot_out = slot;
	return uvmSuccess;
}

/* queue_get returns stream's queue (NULL: the current device's default
 * stream's), held: queue_put lets it go. */
static uvmError_t queue_get(uvmStream_t st, const char *what, struct queue **out)
{
	if (!st) {
		int dev = uvm__current_device();
		uvmError_t err = uvm__check_device(dev, what, NULL);
		if (err)
			return err;
		*out = &defaults[dev];
		return uvmSuccess;
	}
	uint32_t slot;
	pthread_mutex_lock(&streams_mu);
	uvmError_t err = check_slot(st, what, &slot);
	if (!err) {
		*out = slots[slot].q;
		queue_hold(*out);
	}
	pthread_mutex_unlock(&streams_mu);
	return err;
}

static uvmError_t ended(uvmStream_t st, const char *what)
{
	return uvm__fail(uvmErrorInvalidValue, "%s stream %p: it was destroyed by uvmStreamDestroy", what, (void *)st);
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

uvmError_t uvmStreamCreate(uvmStream_t *stream)
{
	if (uvm__device_process >= 0)
		return uvm__refuse_in_device("uvmStreamCreate");
	if (!stream)
		return uvm__fail(uvmErrorInvalidValue, "uvmStreamCreate: stream is NULL; want a pointer to a uvmStream_t");
	int dev = uvm__current_device();
	uvmError_t err = uvm__check_device(dev, "uvmStreamCreate: stream on", NULL);
	if (err)
		return err;
	struct queue *q = uvm__sys_malloc(sizeof *q);
	if (!q)
		return uvm__fail(uvmErrorMemoryAllocation, "uvmStreamCreate: no memory for a stream");
	queue_init(q, dev, uvm__device_new_stream(dev), false);
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

uvmError_t uvmStreamDestroy(uvmStream_t stream)
{
	if (uvm__device_process >= 0)
		return uvm__refuse_in_device("uvmStreamDestroy");
	if (!stream)
		return uvm__fail(uvmErrorInvalidValue, "uvmStreamDestroy: stream is NULL, the default stream, which cannot be destroyed");
	struct op *op = op_new(OP_END, 0);
	uint32_t slot;
	pthread_mutex_lock(&streams_mu);
	uvmError_t err = check_slot(stream, "uvmStreamDestroy:", &slot);
	struct queue *q = err ? NULL : kill_slot(slot);
	pthread_mutex_unlock(&streams_mu);
	if (err) {
		uvm__sys_free(op);
		return err;
	}
	/* As CUDA's: the call returns at once, and what was queued still
	 * runs, then the stream ends. */
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
	uvm__sys_free(op);
	queue_put(q);
	return uvm__ok();
}

/* sync_queue waits for q's queued work and kernels, and returns their
 * errors. */
static uvmError_t sync_queue(struct queue *q, enum uvm_wait how)
{
	struct uvm_errs e = {0};
	drain_wait(q, queued_now(q), how);
	uvm__device_sync(q->device, q->id, how, true, &e, NULL);
	pthread_mutex_lock(&q->mu);
	uvm__errs_move(&e, &q->errs);
	pthread_mutex_unlock(&q->mu);
	uvmError_t err = uvm__coherence_after_sync(q->device, q->id);
	if (err)
		add_last_error(&e, err);
	return uvm__errs_result(&e);
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

uvmError_t uvm__stream_wait(uvmStream_t stream, const char *what)
{
	if (uvm__device_process >= 0)
		return uvm__refuse_in_device(what);
	char w[96];
	snprintf(w, sizeof w, "%s:", what);
	struct queue *q;
	uvmError_t err = queue_get(stream, w, &q);
	if (err)
		return err;
	err = sync_queue(q, uvm__wait_mode(q->device));
	queue_put(q);
	return err;
}

/* device_queues returns every queue of device d, held, the default
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

void uvm__streams_drain(int d)
{
	size_t n = 0;
	struct queue **qs = device_queues(d, &n);
	if (!qs)
		return;
	for (size_t i = 0; i < n; i++)
		drain_wait(qs[i], queued_now(qs[i]), UVM_WAIT_BLOCK);
	put_queues(qs, n);
}

void uvm__streams_drain_all(void)
{
	if (!__atomic_load_n(&workers, __ATOMIC_ACQUIRE))
		return;
	uvmError_t err;
	struct uvm_session *s = uvm__session(&err);
	for (int d = 0; s && d < s->ndevices; d++)
		uvm__streams_drain(d);
}

uvmError_t uvmDeviceSynchronize(void)
{
	if (uvm__device_process >= 0)
		return uvm__refuse_in_device("uvmDeviceSynchronize");
	int dev = uvm__current_device();
	uvmError_t err = uvm__check_device(dev, "uvmDeviceSynchronize:", NULL);
	if (err)
		return err;
	enum uvm_wait how = uvm__wait_mode(dev);
	size_t n = 0;
	struct queue **qs = device_queues(dev, &n);
	if (!qs)
		return uvm__fail(uvmErrorMemoryAllocation, "uvmDeviceSynchronize: no memory to list device %d's streams", dev);
	/* What every stream had queued at the call, then their kernels. */
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
	struct uvm_errs e = {0};
	uvm__device_sync(dev, UVM_ALL_STREAMS, how, true, &e, NULL);
	for (size_t i = 0; i < n; i++) {
		pthread_mutex_lock(&qs[i]->mu);
		uvm__errs_move(&e, &qs[i]->errs);
		pthread_mutex_unlock(&qs[i]->mu);
	}
	put_queues(qs, n);
	if ((err = uvm__coherence_after_sync(dev, UVM_ALL_STREAMS)))
		add_last_error(&e, err);
	err = uvm__errs_result(&e);
	return err ? err : uvm__ok();
}

uvmError_t uvmDeviceReset(void)
{
	if (uvm__device_process >= 0)
		return uvm__refuse_in_device("uvmDeviceReset");
	int dev = uvm__current_device();
	uvmError_t err = uvm__check_device(dev, "uvmDeviceReset:", NULL);
	if (err)
		return err;
	/* Queued work runs first: it may hold events others wait for. */
	uvm__streams_drain(dev);
	/* The device's streams die with its process. */
	pthread_mutex_lock(&streams_mu);
	size_t n = 0;
	for (uint32_t i = 0; i < nslots; i++)
		n += slots[i].live && slots[i].q->device == dev;
	struct queue **qs = n ? uvm__sys_malloc(n * sizeof *qs) : NULL;
	size_t k = 0;
	for (uint32_t i = 0; i < nslots && (qs || !n); i++)
		if (slots[i].live && slots[i].q->device == dev)
			qs[k++] = kill_slot(i);
	pthread_mutex_unlock(&streams_mu);
	if (n && !qs)
		return uvm__fail(uvmErrorMemoryAllocation, "uvmDeviceReset: no memory to list device %d's streams", dev);
	for (size_t i = 0; i < k; i++) {
		pthread_mutex_lock(&qs[i]->mu);
		qs[i]->ended = true;
		pthread_mutex_unlock(&qs[i]->mu);
		queue_put(qs[i]);
	}
	uvm__sys_free(qs);
	uvm__device_reset(dev);
	pthread_mutex_lock(&defaults[dev].mu);
	defaults[dev].errs = (struct uvm_errs){0};
	pthread_mutex_unlock(&defaults[dev].mu);
	return uvm__ok();
}

/* ---- launches ---- */

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
	uvmError_t err = uvm__check_device(device, on, NULL);
	if (err)
		return err;
	struct queue *q = &defaults[device];
	if (stream) {
		if ((err = queue_get(stream, on, &q)))
			return err;
		if (q->device != device) {
			int other = q->device;
			queue_put(q);
			return uvm__fail(uvmErrorInvalidValue, "%s on device %d with stream %p of device %d: a stream runs work on its own device only",
					 what, device, (void *)stream, other);
		}
	}
	/* The device's stream thread follows a launching thread that will
	 * sleep in its synchronize (a wake-up on the same CPU is cheaper);
	 * one that spins keeps its CPU to itself. */
	int cpu = uvm__wait_mode(device) == UVM_WAIT_BLOCK ? sched_getcpu() : -1;
	pthread_mutex_lock(&q->mu);
	wait_room(q);
	if (q->ended) {
		err = ended(stream, on);
	} else if (!q->worker) {
		err = launch_now(q, kernel, shape, params, paramsSize, cpu);
	} else {
		/* Behind host work: queued, with a copy of the params, as CUDA
		 * copies kernel arguments at the launch. */
		struct op *op = op_new(OP_LAUNCH, paramsSize);
		if (!op) {
			err = uvm__fail(uvmErrorMemoryAllocation, "%s on device %d: no memory to queue the launch", what, device);
		} else {
			op->u.launch.kernel = kernel;
			op->u.launch.shape = *shape;
			op->u.launch.cpu = cpu;
			op->u.launch.n = paramsSize;
			if (paramsSize)
				memcpy(op->data, params, paramsSize);
			enqueue(q, op);
		}
	}
	pthread_mutex_unlock(&q->mu);
	queue_put(q);
	return err ? err : uvm__ok();
}

/* ---- host work and events ---- */

/* submit queues op on q (held; submit lets it go), once the queue has
 * room, or frees it if the stream has ended. */
static uvmError_t submit(struct queue *q, uvmStream_t stream, struct op *op, const char *what)
{
	uvmError_t err = uvmSuccess;
	pthread_mutex_lock(&q->mu);
	wait_room(q);
	if (q->ended) {
		err = ended(stream, what);
		op_free(op);
	} else {
		enqueue(q, op);
	}
	pthread_mutex_unlock(&q->mu);
	queue_put(q);
	return err;
}

uvmError_t uvm__stream_enqueue_host(uvmStream_t stream, const char *what, uvmError_t (*fn)(void *arg), const void *arg, size_t size)
{
	if (uvm__device_process >= 0)
		return uvm__refuse_in_device(what);
	uvmError_t err;
	if (!stream) {
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
	memcpy(op->data, arg, size);
	return submit(q, stream, op, w);
}

uvmError_t uvm__stream_record(uvmStream_t stream, struct uvm_event *ev, const char *what)
{
	struct queue *q;
	uvmError_t err = queue_get(stream, what, &q);
	if (err)
		return err;
	struct op *op = op_new(OP_RECORD, 0);
	if (!op) {
		queue_put(q);
		return uvm__fail(uvmErrorMemoryAllocation, "%s no memory to queue the record", what);
	}
	pthread_mutex_lock(&q->mu);
	wait_room(q);
	if (q->ended) {
		err = ended(stream, what);
		uvm__sys_free(op);
	} else {
		uint64_t gen = uvm__event_new_record(ev, q->device);
		if (!q->worker && uvm__device_stream_idle(q->device, q->id)) {
			/* Nothing queued, no kernel running: complete now. */
			uvm__event_complete(ev, gen);
			uvm__sys_free(op);
		} else {
			uvm__event_ref(ev);
			op->u.ev.ev = ev;
			op->u.ev.gen = gen;
			enqueue(q, op);
		}
	}
	pthread_mutex_unlock(&q->mu);
	queue_put(q);
	return err;
}

uvmError_t uvm__stream_wait_event(uvmStream_t stream, struct uvm_event *ev, uint64_t gen, const char *what)
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
	uvm__event_ref(ev);
	op->u.ev.ev = ev;
	op->u.ev.gen = gen;
	return submit(q, stream, op, what);
}

/* ---- fork ----
 *
 * A fork's child has none of the parent's workers, and the parent's
 * streams are not its own: their handles die (stale ones stay invalid),
 * the default streams start empty, and the locks are made anew, as the
 * parent's other threads may have held them. The queued work is the
 * parent's: left, not run. A device fork leaves all this alone. */
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
		device_streams[i] = NULL;
		queue_init(&defaults[i], i, 0, true);
	}
	workers = 0;
}

UVM_CORE_CONSTRUCTOR static void install_stream_fork_handler(void) { pthread_atfork(NULL, NULL, atfork_child); }

/* uvm__stream_ids names stream's device and its id on the wire (0: the
 * default stream), for uvmStreamAttachMemAsync. */
uvmError_t uvm__stream_ids(uvmStream_t stream, const char *what, int *device, uint32_t *id)
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
