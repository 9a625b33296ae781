/*
 * event.c: events, as CUDA's. An event is recorded on a stream
 * (stream.c): the record completes when the work queued on the stream
 * before it has finished, and takes the time of that moment
 * (CLOCK_MONOTONIC). Records are numbered: an event's state is its last
 * record's, and a wait (uvmStreamWaitEvent, uvmEventSynchronize) waits
 * for the record that was last when it was made.
 *
 * A uvmEvent_t is a handle, as a uvmStream_t is: a slot and its
 * generation, so that a destroyed or made-up event is refused rather
 * than touched. The event itself lives on while queued work refers to it.
 *
 * Locks: events_mu guards the table; an event's mu its state, taken
 * after a stream queue's mu.
 */
#include "internal.h"

#include <sched.h>
#include <signal.h>
#include <string.h>
#include <time.h>

struct uvm_event {
	pthread_mutex_t mu;
	pthread_cond_t cv; /* completed advanced */
	unsigned flags;
	unsigned refs;      /* atomic: the handle, queued records and waits, callers */
	uint64_t recorded;  /* mu: records made */
	uint64_t completed; /* the last record complete: written under mu, read atomically */
	uint64_t ns;        /* mu: when it completed */
	int device;         /* mu: the device of the last record's stream */
};

struct event_slot {
	uint32_t gen;
	bool live;
	struct uvm_event *ev; /* holds a reference while live */
};

static pthread_mutex_t events_mu = PTHREAD_MUTEX_INITIALIZER;
static struct event_slot *slots;
static uint32_t nslots, slots_cap;
static uint32_t *free_slots;
static uint32_t nfree;

static uvmEvent_t event_handle(uint32_t slot, uint32_t gen) { return (uvmEvent_t)(uintptr_t)((uint64_t)gen << 32 | (slot + 1)); }

void uvm__event_ref(struct uvm_event *ev) { __atomic_add_fetch(&ev->refs, 1, __ATOMIC_RELAXED); }

void uvm__event_unref(struct uvm_event *ev)
{
	if (__atomic_sub_fetch(&ev->refs, 1, __ATOMIC_ACQ_REL) > 0)
		return;
	pthread_cond_destroy(&ev->cv);
	pthread_mutex_destroy(&ev->mu);
	uvm__sys_free(ev);
}

/* check_slot says what is wrong with handle e. events_mu is held. */
static uvmError_t check_slot(uvmEvent_t e, const char *what, uint32_t *slot_out)
{
	uint64_t v = (uintptr_t)e;
	uint32_t slot = (uint32_t)v - 1, gen = (uint32_t)(v >> 32);
	if (!e)
		return uvm__fail(uvmErrorInvalidResourceHandle, "%s event NULL: want an event from uvmEventCreate", what);
	if ((uint32_t)v == 0 || slot >= nslots || gen == 0 || gen > slots[slot].gen)
		return uvm__fail(uvmErrorInvalidResourceHandle, "%s event %p: not an event (uvmEventCreate makes them)", what, (void *)e);
	if (gen < slots[slot].gen || !slots[slot].live)
		return uvm__fail(uvmErrorInvalidResourceHandle, "%s event %p: it was destroyed by uvmEventDestroy", what, (void *)e);
	*slot_out = slot;
	return uvmSuccess;
}

/* event_get returns event e, held: uvm__event_unref lets it go. */
static uvmError_t event_get(uvmEvent_t e, const char *what, struct uvm_event **out)
{
	uint32_t slot;
	pthread_mutex_lock(&events_mu);
	uvmError_t err = check_slot(e, what, &slot);
	if (!err) {
		*out = slots[slot].ev;
		uvm__event_ref(*out);
	}
	pthread_mutex_unlock(&events_mu);
	return err;
}

static uint64_t now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

uint64_t uvm__event_new_record(struct uvm_event *ev, int device)
{
	pthread_mutex_lock(&ev->mu);
	uint64_t gen = ++ev->recorded;
	ev->device = device;
	pthread_mutex_unlock(&ev->mu);
	return gen;
}

void uvm__event_complete(struct uvm_event *ev, uint64_t gen)
{
	uint64_t t = now_ns();
	pthread_mutex_lock(&ev->mu);
	/* Records on different streams may complete out of order: the state
	 * is the last one's. */
	if (gen > ev->completed) {
		ev->ns = t;
		__atomic_store_n(&ev->completed, gen, __ATOMIC_RELEASE);
		pthread_cond_broadcast(&ev->cv);
	}
	pthread_mutex_unlock(&ev->mu);
}

void uvm__event_wait(struct uvm_event *ev, uint64_t gen)
{
	pthread_mutex_lock(&ev->mu);
	while (ev->completed < gen)
		pthread_cond_wait(&ev->cv, &ev->mu);
	pthread_mutex_unlock(&ev->mu);
}

uvmError_t uvmEventCreateWithFlags(uvmEvent_t *event, unsigned int flags)
{
	if (uvm__device_process >= 0)
		return uvm__refuse_in_device("uvmEventCreateWithFlags");
	if (!event)
		return uvm__fail(uvmErrorInvalidValue, "uvmEventCreateWithFlags: event is NULL; want a pointer to a uvmEvent_t");
	const unsigned known = uvmEventBlockingSync | uvmEventDisableTiming | uvmEventInterprocess;
	if (flags & ~known)
		return uvm__fail(uvmErrorInvalidValue,
				 "uvmEventCreateWithFlags: flags %#x: want a combination of uvmEventBlockingSync (%#x), uvmEventDisableTiming (%#x) and "
				 "uvmEventInterprocess (%#x)",
				 flags, uvmEventBlockingSync, uvmEventDisableTiming, uvmEventInterprocess);
	if ((flags & uvmEventInterprocess) && !(flags & uvmEventDisableTiming))
		return uvm__fail(uvmErrorInvalidValue, "uvmEventCreateWithFlags: flags %#x: uvmEventInterprocess needs uvmEventDisableTiming, as CUDA's", flags);
	if (flags & uvmEventInterprocess)
		return uvm__fail(uvmErrorNotSupported, "uvmEventCreateWithFlags: flags %#x: interprocess events are not supported", flags);
	struct uvm_event *ev = uvm__sys_calloc(1, sizeof *ev);
	if (!ev)
		return uvm__fail(uvmErrorMemoryAllocation, "uvmEventCreateWithFlags: no memory for an event");
	pthread_mutex_init(&ev->mu, NULL);
	pthread_cond_init(&ev->cv, NULL);
	ev->flags = flags;
	ev->refs = 1; /* the handle's */
	ev->device = uvm__current_device();
	pthread_mutex_lock(&events_mu);
	bool fresh;
	int64_t taken = uvm__slot_take(&slots, sizeof *slots, &nslots, &slots_cap, &free_slots, &nfree, &fresh);
	if (taken < 0) {
		pthread_mutex_unlock(&events_mu);
		uvm__event_unref(ev);
		return uvm__fail(uvmErrorMemoryAllocation, "uvmEventCreateWithFlags: no memory for event %u", nslots);
	}
	uint32_t slot = (uint32_t)taken;
	if (fresh)
		slots[slot].gen = 1;
	slots[slot].live = true;
	slots[slot].ev = ev;
	*event = event_handle(slot, slots[slot].gen);
	pthread_mutex_unlock(&events_mu);
	return uvm__ok();
}

uvmError_t uvmEventCreate(uvmEvent_t *event)
{
	if (uvm__device_process >= 0)
		return uvm__refuse_in_device("uvmEventCreate");
	return uvmEventCreateWithFlags(event, uvmEventDefault);
}

uvmError_t uvmEventDestroy(uvmEvent_t event)
{
	if (uvm__device_process >= 0)
		return uvm__refuse_in_device("uvmEventDestroy");
	uint32_t slot;
	pthread_mutex_lock(&events_mu);
	uvmError_t err = check_slot(event, "uvmEventDestroy:", &slot);
	struct uvm_event *ev = NULL;
	if (!err) {
		ev = slots[slot].ev;
		slots[slot].live = false;
		slots[slot].ev = NULL;
		if (slots[slot].gen < UINT32_MAX) {
			slots[slot].gen++;
			free_slots[nfree++] = slot;
		}
	}
	pthread_mutex_unlock(&events_mu);
	if (err)
		return err;
	/* A record still queued completes, unseen, and lets it go. */
	uvm__event_unref(ev);
	return uvm__ok();
}

uvmError_t uvmEventRecord(uvmEvent_t event, uvmStream_t stream)
{
	if (uvm__device_process >= 0)
		return uvm__refuse_in_device("uvmEventRecord");
	struct uvm_event *ev;
	uvmError_t err = event_get(event, "uvmEventRecord:", &ev);
	if (err)
		return err;
	err = uvm__stream_record(stream, ev, "uvmEventRecord on");
	uvm__event_unref(ev);
	return err ? err : uvm__ok();
}

uvmError_t uvmEventQuery(uvmEvent_t event)
{
	if (uvm__device_process >= 0)
		return uvm__refuse_in_device("uvmEventQuery");
	struct uvm_event *ev;
	uvmError_t err = event_get(event, "uvmEventQuery:", &ev);
	if (err)
		return err;
	pthread_mutex_lock(&ev->mu);
	uint64_t recorded = ev->recorded, completed = ev->completed;
	pthread_mutex_unlock(&ev->mu);
	uvm__event_unref(ev);
	if (completed < recorded)
		return uvm__not_ready("uvmEventQuery: event %p: the work before its record (%lu) is still running", (void *)event,
				      (unsigned long)recorded);
	return uvm__ok();
}

uvmError_t uvmEventSynchronize(uvmEvent_t event)
{
	if (uvm__device_process >= 0)
		return uvm__refuse_in_device("uvmEventSynchronize");
	struct uvm_event *ev;
	uvmError_t err = event_get(event, "uvmEventSynchronize:", &ev);
	if (err)
		return err;
	pthread_mutex_lock(&ev->mu);
	uint64_t target = ev->recorded;
	int device = ev->device;
	pthread_mutex_unlock(&ev->mu);
	enum uvm_wait how = ev->flags & uvmEventBlockingSync ? UVM_WAIT_BLOCK : uvm__wait_mode(device);
	if (how == UVM_WAIT_BLOCK)
		uvm__event_wait(ev, target);
	else
		while (__atomic_load_n(&ev->completed, __ATOMIC_ACQUIRE) < target)
			uvm__wait_pause(how);
	uvm__event_unref(ev);
	return uvm__ok();
}

uvmError_t uvmEventElapsedTime(float *ms, uvmEvent_t start, uvmEvent_t end)
{
	if (uvm__device_process >= 0)
		return uvm__refuse_in_device("uvmEventElapsedTime");
	if (!ms)
		return uvm__fail(uvmErrorInvalidValue, "uvmEventElapsedTime: ms is NULL; want a pointer to a float");
	struct uvm_event *ev[2];
	uvmError_t err = event_get(start, "uvmEventElapsedTime: start", &ev[0]);
	if (err)
		return err;
	if ((err = event_get(end, "uvmEventElapsedTime: end", &ev[1]))) {
		uvm__event_unref(ev[0]);
		return err;
	}
	static const char *const names[] = {"start", "end"};
	uvmEvent_t handles[2] = {start, end};
	uint64_t ns[2] = {0, 0};
	for (int i = 0; i < 2 && !err; i++) {
		pthread_mutex_lock(&ev[i]->mu);
		uint64_t recorded = ev[i]->recorded;
		ns[i] = ev[i]->ns;
		pthread_mutex_unlock(&ev[i]->mu);
		if (ev[i]->flags & uvmEventDisableTiming)
			err = uvm__fail(uvmErrorInvalidResourceHandle, "uvmEventElapsedTime: the %s event %p was created with uvmEventDisableTiming", names[i],
					(void *)handles[i]);
		else if (recorded == 0)
			err = uvm__fail(uvmErrorInvalidResourceHandle, "uvmEventElapsedTime: the %s event %p was never recorded", names[i], (void *)handles[i]);
	}
	for (int i = 0; i < 2 && !err; i++) {
		pthread_mutex_lock(&ev[i]->mu);
		bool pending = ev[i]->completed < ev[i]->recorded;
		pthread_mutex_unlock(&ev[i]->mu);
		if (pending)
			err = uvm__not_ready("uvmEventElapsedTime: the %s event %p has not completed", names[i], (void *)handles[i]);
	}
	uvm__event_unref(ev[0]);
	uvm__event_unref(ev[1]);
	if (err)
		return err;
	*ms = (float)(((double)ns[1] - (double)ns[0]) / 1e6);
	return uvm__ok();
}

uvmError_t uvmStreamWaitEvent(uvmStream_t stream, uvmEvent_t event, unsigned int flags)
{
	if (uvm__device_process >= 0)
		return uvm__refuse_in_device("uvmStreamWaitEvent");
	if (flags != 0)
		return uvm__fail(uvmErrorInvalidValue, "uvmStreamWaitEvent: flags %#x: want 0", flags);
	struct uvm_event *ev;
	uvmError_t err = event_get(event, "uvmStreamWaitEvent:", &ev);
	if (err)
		return err;
	pthread_mutex_lock(&ev->mu);
	uint64_t gen = ev->recorded;
	bool done = ev->completed >= gen;
	pthread_mutex_unlock(&ev->mu);
	int device;
	if (done) /* nothing to wait for; the stream must still be one */
		err = uvm__stream_device(stream, "uvmStreamWaitEvent on", &device);
	else
		err = uvm__stream_wait_event(stream, ev, gen, "uvmStreamWaitEvent on");
	uvm__event_unref(ev);
	return err ? err : uvm__ok();
}

/* A fork's child has none of the workers that would complete the
 * parent's records: they count as complete there, and the locks are made
 * anew. */
static void atfork_child(void)
{
	if (uvm__in_device_fork)
		return;
	pthread_mutex_init(&events_mu, NULL);
	for (uint32_t i = 0; i < nslots; i++) {
		struct uvm_event *ev = slots[i].ev;
		if (!slots[i].live || !ev)
			continue;
		pthread_mutex_init(&ev->mu, NULL);
		pthread_cond_init(&ev->cv, NULL);
		if (ev->completed < ev->recorded) {
			ev->completed = ev->recorded;
			ev->ns = now_ns();
		}
	}
}

UVM_CORE_CONSTRUCTOR static void install_event_fork_handler(void) { pthread_atfork(NULL, NULL, atfork_child); }
