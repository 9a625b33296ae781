package uvm

import (
	"fmt"
	"sync"
	"sync/atomic"
)

// Event flags, as cudaEventCreateWithFlags's.
const (
	// EventDefault: an event with timing, whose synchronize waits as the
	// device flags say (SetDeviceFlags).
	EventDefault = 0x0
	// EventBlockingSync: EventSynchronize sleeps until the event
	// completes, whatever the device flags say.
	EventBlockingSync = 0x1
	// EventDisableTiming: the event records no time, and
	// EventElapsedTime refuses it.
	EventDisableTiming = 0x2
	// EventInterprocess: an event other processes may open. Not
	// supported: events live in the client library of one process.
	EventInterprocess = 0x4

	eventFlagsKnown = EventBlockingSync | EventDisableTiming | EventInterprocess
)

// Event marks a point in a stream, as a CUDA event: EventRecord places
// it after the work queued on a stream so far, and it completes when
// that work has finished, at a time EventElapsedTime compares. Other
// streams may wait for it (StreamWaitEvent), and the host may ask about
// it (EventQuery) or wait for it (EventSynchronize). Its methods are safe
// for concurrent use.
type Event struct {
	s     *Session
	id    uint64
	flags uint32

	mu        sync.Mutex
	destroyed bool
	// rec is the last record's marker: nil while never recorded. A
	// marker is done once the work before it has run, and keeps when.
	rec *marker
}

// EventCreate makes an event, as cudaEventCreateWithFlags: flags combine
// EventDefault, EventBlockingSync and EventDisableTiming.
// EventInterprocess is not supported (ErrNotSupported), and, as in CUDA,
// needs EventDisableTiming (ErrInvalidValue without it).
func (s *Session) EventCreate(flags uint32) (*Event, error) {
	if unknown := flags &^ eventFlagsKnown; unknown != 0 {
		return nil, fmt.Errorf("%w: event flags %#x: unknown bits %#x; want a combination of EventBlockingSync (%#x), EventDisableTiming (%#x) and EventInterprocess (%#x)",
			ErrInvalidValue, flags, unknown, EventBlockingSync, EventDisableTiming, EventInterprocess)
	}
	if flags&EventInterprocess != 0 {
		if flags&EventDisableTiming == 0 {
			return nil, fmt.Errorf("%w: event flags %#x: EventInterprocess needs EventDisableTiming (%#x) too", ErrInvalidValue, flags, EventDisableTiming)
		}
		return nil, fmt.Errorf("%w: event flags %#x: EventInterprocess: events live in one process's client library, and no other process can open them", ErrNotSupported, flags)
	}
	return &Event{s: s, id: eventIDs.Add(1), flags: flags}, nil
}

// Flags returns the flags the event was created with.
func (ev *Event) Flags() uint32 { return ev.flags }

// check returns ev's last record, or an error if ev is nil, another
// session's, or destroyed.
func (s *Session) checkEvent(ev *Event, what string) (*marker, error) {
	if ev == nil {
		return nil, fmt.Errorf("%w: %s a nil event: want one EventCreate made", ErrInvalidResourceHandle, what)
	}
	if ev.s != s {
		return nil, fmt.Errorf("%w: %s %v: the event belongs to another session", ErrInvalidResourceHandle, what, ev)
	}
	ev.mu.Lock()
	defer ev.mu.Unlock()
	if ev.destroyed {
		return nil, fmt.Errorf("%w: %s %v: the event was destroyed (EventDestroy)", ErrInvalidResourceHandle, what, ev)
	}
	return ev.rec, nil
}

// EventRecord records ev on st, as cudaEventRecord: the event completes
// once the work queued on st before it has finished (on a default
// stream, the legacy stream, the work of every blocking stream of the
// device too, and its time is then when all that finished), and a new
// record replaces the last one for later calls. It returns at once. st
// must not be nil: DefaultStream(d) is device d's default stream.
func (s *Session) EventRecord(ev *Event, st *Stream) error {
	if _, err := s.checkEvent(ev, "record"); err != nil {
		return err
	}
	if st == nil {
		return fmt.Errorf("%w: record %v on a nil stream: no device is named; pass a stream, or DefaultStream(device)", ErrInvalidValue, ev)
	}
	dp, err := s.streamProc(st, "record an event on")
	if err != nil {
		return err
	}
	defer dp.mu.Unlock()
	ss := dp.state(st.id)
	if err := dp.submittable(ss, "record "+ev.String()+" on"); err != nil {
		return err
	}
	dp.orderLocked(ss)
	m := newMarker(ss)
	m.timed = ev.flags&EventDisableTiming == 0
	ev.mu.Lock()
	destroyed := ev.destroyed
	if !destroyed {
		ev.rec = m
	}
	ev.mu.Unlock()
	if destroyed {
		return fmt.Errorf("%w: record %v: the event was destroyed (EventDestroy)", ErrInvalidResourceHandle, ev)
	}
	dp.recordLocked(ss, m)
	return nil
}

// EventQuery says whether ev has completed, as cudaEventQuery: nil once
// the work before its last record has finished, or if it was never
// recorded; ErrNotReady while that work runs. Once the device of its
// last record has failed (a launch that failed, before or after the
// record), it reports the failure (ErrLaunchFailure), as CUDA reports a
// sticky error: never success for work that failed.
func (s *Session) EventQuery(ev *Event) error {
	m, err := s.checkEvent(ev, "query")
	if err != nil || m == nil {
		return err
	}
	if err := m.failure(ev); err != nil {
		return err
	}
	if !m.isDone() {
		return fmt.Errorf("%w: %v has not completed: the work queued on %v before its record still runs", ErrNotReady, ev, m.ss)
	}
	return m.err
}

// EventSynchronize waits until ev completes, as cudaEventSynchronize: at
// once if it was never recorded. It waits as the device flags' schedule
// says, or in a blocking wait if the event has EventBlockingSync. Errors
// of queued operations come back from the stream's synchronize, not from
// here; the device's failure (a launch that failed, before or after the
// record) comes back from here too (ErrLaunchFailure).
func (s *Session) EventSynchronize(ev *Event) error {
	m, err := s.checkEvent(ev, "synchronize")
	if err != nil || m == nil {
		return err
	}
	dp := m.ss.dp
	mode := dp.waitMode()
	if ev.flags&EventBlockingSync != 0 {
		mode = waitBlock
	}
	dp.await(m, mode)
	if err := m.failure(ev); err != nil {
		return err
	}
	return m.err
}

// failure returns the failure of the device of m's stream, if it failed,
// as ev's.
func (m *marker) failure(ev *Event) error {
	dp := m.ss.dp
	dp.mu.Lock()
	defer dp.mu.Unlock()
	return dp.refuseFailed(ev.String() + " recorded on")
}

// EventElapsedTime returns the milliseconds from start's completion to
// end's, as cudaEventElapsedTime. Both must have completed (ErrNotReady
// otherwise), been recorded, and have timing (ErrInvalidResourceHandle
// otherwise). An event's time is when the work before its record
// finished: the device's stream thread reads the clock then (a record
// behind kernels launches a built-in kernel that stores the time), and
// a record with nothing before it takes the time it is recorded.
func (s *Session) EventElapsedTime(start, end *Event) (float32, error) {
	ms, err := s.eventTime(start, "start")
	if err != nil {
		return 0, err
	}
	me, err := s.eventTime(end, "end")
	if err != nil {
		return 0, err
	}
	return float32(me.ns-ms.ns) / 1e6, nil
}

// eventTime returns an event's completed record, for EventElapsedTime.
func (s *Session) eventTime(ev *Event, which string) (*marker, error) {
	m, err := s.checkEvent(ev, "elapsed time of the "+which+" event,")
	switch {
	case err != nil:
		return nil, err
	case ev.flags&EventDisableTiming != 0:
		return nil, fmt.Errorf("%w: elapsed time: the %s event %v was created with EventDisableTiming", ErrInvalidResourceHandle, which, ev)
	case m == nil:
		return nil, fmt.Errorf("%w: elapsed time: the %s event %v was never recorded", ErrInvalidResourceHandle, which, ev)
	}
	if err := m.failure(ev); err != nil {
		return nil, err
	}
	switch {
	case !m.isDone():
		return nil, fmt.Errorf("%w: elapsed time: the %s event %v has not completed", ErrNotReady, which, ev)
	case m.err != nil:
		return nil, m.err
	}
	return m, nil
}

// StreamWaitEvent makes the work queued on st from now on wait until ev
// completes, as cudaStreamWaitEvent: across streams and devices, without
// blocking the caller. It waits for ev's last record at the time of the
// call; an event never recorded is no wait. flags must be 0. st must not
// be nil: DefaultStream(d) is device d's default stream.
func (s *Session) StreamWaitEvent(st *Stream, ev *Event, flags uint32) error {
	m, err := s.checkEvent(ev, "wait for")
	if err != nil {
		return err
	}
	if flags != 0 {
		return fmt.Errorf("%w: wait for %v with flags %#x: want 0", ErrInvalidValue, ev, flags)
	}
	if st == nil {
		return fmt.Errorf("%w: wait for %v on a nil stream: no device is named; pass a stream, or DefaultStream(device)", ErrInvalidValue, ev)
	}
	dp, err := s.streamProc(st, "wait for an event on")
	if err != nil {
		return err
	}
	defer dp.mu.Unlock()
	ss := dp.state(st.id)
	if err := dp.submittable(ss, "wait for "+ev.String()+" on"); err != nil {
		return err
	}
	if m == nil || m.isDone() {
		return nil
	}
	dp.orderLocked(ss)
	dp.enqueueLocked(ss, &streamOp{kind: opWait, m: m})
	return nil
}

// EventDestroy destroys ev, as cudaEventDestroy: a record in flight
// still completes for the streams waiting on it, and any later use of
// ev is an error (ErrInvalidResourceHandle).
func (s *Session) EventDestroy(ev *Event) error {
	if _, err := s.checkEvent(ev, "destroy"); err != nil {
		return err
	}
	ev.mu.Lock()
	defer ev.mu.Unlock()
	if ev.destroyed {
		return fmt.Errorf("%w: destroy %v: the event was destroyed already", ErrInvalidResourceHandle, ev)
	}
	ev.destroyed = true
	return nil
}

// eventIDs numbers events, for messages.
var eventIDs atomic.Uint64

func (ev *Event) String() string { return fmt.Sprintf("event %d", ev.id) }
