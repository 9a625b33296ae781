package lab

import (
	"errors"
	"io"
	"time"

	"github.com/softuvm/softuvm/trace"
)

// A trace's events are in the order they were handed to its writer, not
// quite in time order: a fault is written when it has been served, with
// the time it was read, after the moves it made and after faults of
// other threads read later and served sooner. The server took its
// decisions in about the order the faults were read, so a replay serves
// them in time order: reorder holds events back until none read later
// can come before them.

// reorderWindow is how late an event may come: longer than any fault's
// service (a fault that waited for a whole-block eviction: a few ms;
// throttled ones: naps of 500 us, up to 20 of them).
const reorderWindow = time.Second

// reorder is a source that yields src's events in time order (those of
// equal times in file order). The events held are nearly in order
// already, so each is inserted by a walk back from the newest: a step or
// two.
type reorder struct {
	src    source
	held   []*trace.Event // by time, then arrival; held[head:] are live
	head   int
	free   []*trace.Event // recycled, so that holding one allocates nothing
	newest time.Duration
	done   bool
	err    error
}

func (r *reorder) Header() trace.Header { return r.src.Header() }

func (r *reorder) Next(e *trace.Event) error {
	for !r.done && (r.head == len(r.held) || r.held[r.head].Time > r.newest-reorderWindow) {
		var next *trace.Event
		if n := len(r.free); n > 0 {
			next, r.free = r.free[n-1], r.free[:n-1]
		} else {
			next = new(trace.Event)
		}
		if err := r.src.Next(next); err != nil {
			r.done = true
			if !errors.Is(err, io.EOF) {
				r.err = err
			}
			break
		}
		r.newest = max(r.newest, next.Time)
		r.insert(next)
	}
	if r.head == len(r.held) {
		if r.err != nil {
			return r.err
		}
		return io.EOF
	}
	p := r.held[r.head]
	r.held[r.head] = nil
	r.head++
	*e = *p
	r.free = append(r.free, p)
	if r.head > 4096 && r.head*2 > len(r.held) {
		n := copy(r.held, r.held[r.head:])
		r.held = r.held[:n]
		r.head = 0
	}
	return nil
}

// insert puts e after every held event of its time or earlier.
func (r *reorder) insert(e *trace.Event) {
	r.held = append(r.held, e)
	i := len(r.held) - 1
	for i > r.head && r.held[i-1].Time > e.Time {
		r.held[i] = r.held[i-1]
		i--
	}
	r.held[i] = e
}
