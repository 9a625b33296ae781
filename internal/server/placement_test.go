package server

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

// TestPlacementParksAndWakes drives the placement logic with the faults
// of a thread that moves between CPUs.
func TestPlacementParksAndWakes(t *testing.T) {
	mk := func(cpu int) *handler { return &handler{cpu: cpu, unpark: make(chan struct{}, 1)} }
	h0, h1 := mk(0), mk(1)
	p := newPlacement([]*handler{h0, h1})
	now := time.Now()
	h0.lastLocal.Store(now.UnixNano())
	h1.lastLocal.Store(now.UnixNano())
	at := func(tid uint32, cpu int, t time.Time) {
		p.threads[tid] = seenCPU{cpu: cpu, at: t}
	}
	// Thread 7 faults on CPU 0 and h0 serves it: nothing changes.
	at(7, 0, now)
	p.served(h0, 0, 7, now)
	assert.False(t, p.parkIfIdle(h0, now))
	// Much later h1 serves a fault of thread 7 (still on CPU 0): h1 has
	// had no fault of its own for longer than parkAfter, so it parks.
	later := now.Add(2 * parkAfter)
	at(7, 0, later)
	p.served(h1, 0, 7, later)
	assert.True(t, p.parkIfIdle(h1, later))
	assert.True(t, h1.parked)
	assert.Equal(t, 1, p.waiting)
	assert.False(t, p.parkIfIdle(h1, later), "a parked handler parks once")
	assert.Equal(t, 1, p.waiting)
	// Thread 7 moves to CPU 1; h0 serves its fault there and wakes h1;
	// h0 itself has a recent local fault, so it keeps waiting.
	at(7, 1, later)
	h0.lastLocal.Store(later.UnixNano())
	p.served(h0, 0, 7, later)
	assert.False(t, p.parkIfIdle(h0, later))
	assert.False(t, h1.parked)
	assert.Equal(t, 2, p.waiting)
	// Another fault from CPU 1 before h1 ran: h1 is already awake, no
	// second wake is queued.
	p.served(h0, 0, 7, later)
	assert.Equal(t, 2, p.waiting)
	select {
	case <-h1.unpark:
	default:
		t.Fatal("h1 was not woken")
	}
	assert.Empty(t, h1.unpark, "one park, one wake")
	// The last waiting handler never parks.
	evenLater := later.Add(3 * parkAfter)
	at(7, 1, evenLater)
	p.served(h0, 0, 7, evenLater)
	assert.True(t, p.parkIfIdle(h0, evenLater))
	at(7, 0, evenLater)
	p.served(h1, 0, 7, evenLater)
	assert.False(t, p.parkIfIdle(h1, evenLater), "h1 is the only one waiting")
}

// TestPlacementWakeNeverBlocks: a wake for a handler whose unpark
// channel is already full returns. A send that blocked there held the
// placement's lock against every handler of the view: under a fork
// stress, each of a program's faults then waited for ever.
func TestPlacementWakeNeverBlocks(t *testing.T) {
	h0 := &handler{cpu: 0, unpark: make(chan struct{}, 1)}
	h1 := &handler{cpu: 1, unpark: make(chan struct{}, 1)}
	p := newPlacement([]*handler{h0, h1})
	now := time.Now()
	p.threads[7] = seenCPU{cpu: 1, at: now}
	h1.parked, p.waiting = true, 1
	h1.unpark <- struct{}{}
	done := make(chan struct{})
	go func() {
		p.served(h0, 0, 7, now)
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("waking a handler with a full unpark channel blocked")
	}
	assert.False(t, h1.parked)
	assert.Equal(t, 2, p.waiting)
}
