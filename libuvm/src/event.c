/*
 * event.c: events, as CUDA's. An event is recorded on a stream
 * (stream.c): a record is a mark in the stream's order, which completes
 * when the work queued on the stream before it has finished, and takes
 * the time of that moment (CLOCK_MONOTONIC). An event's state is its
 * last record's; a wait (uvmStreamWaitEvent, uvmEventSynchronize) waits
 * for the record that was last when it was made. A record on the legacy
 * default stream comes after the work of every blocking stream of its
 * device, as any work queued there does.
 *
 * An event whose device failed (a launch that failed, before or after
 * the record: device.c) reports that failure from uvmEventQuery,
 * uvmEventSynchronize and uvmEventElapsedTime, as CUDA reports a sticky
 * error from every call: never success for work that failed.
 *
 * A uvmEvent_t is a handle, as a uvmStream_t is: a slot and its
 * generation, so that a destroyed or made-up event is refused rather
 * than touched. The event itself lives on while queued work refers to
 * its record.
 *
 * Locks: events_mu guards the table; an event's mu its record, taken
 * after a stream queue's mu.
 */
#include "internal.h"

#include <string.h>

struct uvm_event {
	pthread_mutex_t mu;
	unsigned flags;
	unsigned refs;          /* atomic: the handle, callers */
	struct uvm_mark *rec;   /* mu: the last record, held; NULL before the first */
	int device;             /* mu: the device of the last record's stream (at first, the current device) */
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

static void event_ref(struct uvm_event *ev) { __atomic_add_fetch(&ev->refs, 1, __ATOMIC_RELAXED); }

static void event_unref(struct uvm_event *ev)
{
	if (__atomic_sub_fetch(&ev->refs, 1, __ATOMIC_ACQ_REL) > 0)
		return;
	uvm__mark_put(ev->rec);
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
		event_ref(*out);
	}
	pthread_mutex_unlock(&events_mu);
	return err;
}

/* last_record returns ev's last record, held (NULL if none), and its
 * device. */
static struct uvm_mark *last_record(struct uvm_event *ev, int *device)
{
	pthread_mutex_lock(&ev->mu);
	struct uvm_mark *m = ev->rec;
	if (m)
		uvm__mark_hold(m);
	*device = ev->device;
	pthread_mutex_unlock(&ev->mu);
	return m;
}

/* failed returns the failure of device d, if it failed, as what's. */
static uvmError_t failed(int d, const char *what, uvmEvent_t event)
{
	struct uvm_errs e = {0};
	uvmError_t code = uvm__device_failure(d, &e);
	if (!code)
		return uvmSuccess;
	return uvm__fail(code, "%s event %p: device %d failed (uvmDeviceReset clears that): %.*s", what, (void *)event, d, (int)e.len, e.msg);
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
	ev->flags = flags;
	ev->refs = 1; /* the handle's */
	ev->device = uvm__current_device();
	pthread_mutex_lock(&events_mu);
	bool fresh;
	int64_t taken = uvm__slot_take(&slots, sizeof *slots, &nslots, &slots_cap, &free_slots, &nfree, &fresh);
	if (taken < 0) {
		pthread_mutex_unlock(&events_mu);
		event_unref(ev);
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
	event_unref(ev);
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
	struct uvm_mark *m;
	if (!(err = uvm__stream_record(stream, "uvmEventRecord on", &m))) {
		pthread_mutex_lock(&ev->mu);
		uvm__mark_put(ev->rec);
		ev->rec = m;
		ev->device = uvm__mark_device(m);
		pthread_mutex_unlock(&ev->mu);
	}
	event_unref(ev);
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
	int device;
	struct uvm_mark *m = last_record(ev, &device);
	event_unref(ev);
	bool pending = m && !uvm__mark_done(m);
	uvm__mark_put(m);
	if ((err = failed(device, "uvmEventQuery:", event)))
		return err;
	if (pending)
		return uvm__not_ready("uvmEventQuery: event %p: the work before its last record is still running", (void *)event);
	return uvm__ok();
}

uvmError_t uvmEventSynchronize(uvmEvent_t event)
{
	if (uvm__device_process >= 0)
		return uvm__refuse_in_device("uvmEventSynchronize");
	uvmError_t err = uvm__refuse_in_host_fn("uvmEventSynchronize");
	if (err)
		return err;
	struct uvm_event *ev;
	if ((err = event_get(event, "uvmEventSynchronize:", &ev)))
		return err;
	int device;
	struct uvm_mark *m = last_record(ev, &device);
	enum uvm_wait how = ev->flags & uvmEventBlockingSync ? UVM_WAIT_BLOCK : uvm__wait_mode(device);
	event_unref(ev);
	if (m) {
		uvm__mark_wait(m, how);
		uvm__mark_put(m);
	}
	err = failed(device, "uvmEventSynchronize:", event);
	return err ? err : uvm__ok();
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
		event_unref(ev[0]);
		return err;
	}
	static const char *const names[] = {"start", "end"};
	uvmEvent_t handles[2] = {start, end};
	struct uvm_mark *m[2];
	int device[2];
	for (int i = 0; i < 2; i++)
		m[i] = last_record(ev[i], &device[i]);
	for (int i = 0; i < 2 && !err; i++) {
		if (ev[i]->flags & uvmEventDisableTiming)
			err = uvm__fail(uvmErrorInvalidResourceHandle, "uvmEventElapsedTime: the %s event %p was created with uvmEventDisableTiming", names[i],
					(void *)handles[i]);
		else if (!m[i])
			err = uvm__fail(uvmErrorInvalidResourceHandle, "uvmEventElapsedTime: the %s event %p was never recorded", names[i], (void *)handles[i]);
	}
	for (int i = 0; i < 2 && !err; i++)
		err = failed(device[i], "uvmEventElapsedTime:", handles[i]);
	for (int i = 0; i < 2 && !err; i++)
		if (!uvm__mark_done(m[i]))
			err = uvm__not_ready("uvmEventElapsedTime: the %s event %p has not completed", names[i], (void *)handles[i]);
	if (!err)
		*ms = (float)(((double)uvm__mark_ns(m[1]) - (double)uvm__mark_ns(m[0])) / 1e6);
	for (int i = 0; i < 2; i++) {
		uvm__mark_put(m[i]);
		event_unref(ev[i]);
	}
	return err ? err : uvm__ok();
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
	int device;
	struct uvm_mark *m = last_record(ev, &device);
	event_unref(ev);
	if (!m || uvm__mark_done(m)) /* nothing to wait for; the stream must still be one */
		err = uvm__stream_device(stream, "uvmStreamWaitEvent on", &device);
	else
		err = uvm__stream_wait_mark(stream, m, "uvmStreamWaitEvent on");
	uvm__mark_put(m);
	return err ? err : uvm__ok();
}

/* A fork's child has none of the workers that would complete the
 * parent's records: they count as complete there (stream.c), and the
 * locks are made anew. */
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
		if (ev->rec)
			uvm__mark_forked(ev->rec);
	}
}

UVM_CORE_CONSTRUCTOR static void install_event_fork_handler(void) { pthread_atfork(NULL, NULL, atfork_child); }
