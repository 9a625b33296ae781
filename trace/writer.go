package trace

import (
	"bufio"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"sync"
	"time"
)

// Header describes a trace: what was recorded, where and how.
type Header struct {
	// Started is the wall-clock time of Time 0.
	Started time.Time `json:"started"`
	// PageSize is the size of a page (4096).
	PageSize int `json:"page_size"`
	// Devices is how many devices the server had.
	Devices int `json:"devices"`
	// Command is the program recorded, where one was (uvm trace record,
	// uvm run --trace).
	Command []string `json:"command,omitempty"`
	// Policies names the server's policies by kind: "prefetch",
	// "eviction", "thrashing", "access".
	Policies map[string]string `json:"policies,omitempty"`
	// HostBudget is the server's host budget in bytes (0: none), and
	// DeviceBytes each device's capacity.
	HostBudget  int64 `json:"host_budget,omitempty"`
	DeviceBytes int64 `json:"device_bytes,omitempty"`
	// Scope is "server" (every client of the server) or "session" (one
	// client, UVM_TRACE).
	Scope string `json:"scope,omitempty"`
	// AccessPeriod is the access mode's round (0: off), and AccessSample
	// the bytes of each view it arms a round (KindArm, KindAccess).
	AccessPeriod time.Duration `json:"access_period_ns,omitempty"`
	AccessSample int64         `json:"access_sample_bytes,omitempty"`
	// LargeFolios reports that the location files took 2 MiB folios, so
	// that blocks moved whole (and the host view registered MINOR
	// faults under the fault coherence model): the lab's replay
	// (package lab) imitates the server's whole-block moves from it.
	LargeFolios bool `json:"large_folios,omitempty"`
	// Host is the machine's name, and Kernel its release.
	Host   string `json:"host,omitempty"`
	Kernel string `json:"kernel,omitempty"`
}

// Recorder writes a trace. Emit encodes an event into memory under a
// short lock and returns; a background writer writes what accumulated.
// If the writer falls more than maxPending bytes behind, events are
// dropped and counted (the trace's end says how many), so that
// recording never holds up a fault.
type Recorder struct {
	start time.Time // Time 0, with the monotonic clock

	mu      sync.Mutex // guards the fields below; held only to encode
	buf     []byte     // records not yet handed to the writer
	prev    time.Duration
	events  uint64
	dropped uint64
	closed  bool

	kick     chan struct{}
	done     chan struct{}
	out      *bufio.Writer
	file     io.Closer // nil when the caller owns the writer
	errMu    sync.Mutex
	writeErr error
	written  int64
}

// flushAt is how much the writer is woken for; maxPending how much may
// wait for it before events are dropped.
const (
	flushAt    = 256 << 10
	maxPending = 64 << 20
)

// Create creates (or truncates) the file path and starts recording to
// it.
func Create(path string, h Header) (*Recorder, error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o644)
	if err != nil {
		return nil, fmt.Errorf("trace: %w", err)
	}
	r, err := newRecorder(f, f, h)
	if err != nil {
		f.Close()
		return nil, err
	}
	return r, nil
}

// NewRecorder starts recording to w, which the Recorder does not close.
func NewRecorder(w io.Writer, h Header) (*Recorder, error) { return newRecorder(w, nil, h) }

func newRecorder(w io.Writer, c io.Closer, h Header) (*Recorder, error) {
	r := &Recorder{start: time.Now(), kick: make(chan struct{}, 1), done: make(chan struct{}),
		out: bufio.NewWriterSize(w, 1<<20), file: c}
	h.Started = r.start
	if h.PageSize == 0 {
		h.PageSize = PageSize
	}
	js, err := json.Marshal(h)
	if err != nil {
		return nil, fmt.Errorf("trace header: %w", err)
	}
	hdr := append([]byte(magic), binary.AppendUvarint(nil, Version)...)
	hdr = binary.AppendUvarint(hdr, uint64(len(js)))
	hdr = append(hdr, js...)
	if _, err := r.out.Write(hdr); err != nil {
		return nil, fmt.Errorf("trace: %w", err)
	}
	go r.writer()
	return r, nil
}

// Since is the trace time of t.
func (r *Recorder) Since(t time.Time) time.Duration { return t.Sub(r.start) }

// Now is the trace time now.
func (r *Recorder) Now() time.Duration { return time.Since(r.start) }

// Emit records e. A zero e.Time means now.
func (r *Recorder) Emit(e *Event) {
	if e.Time == 0 {
		e.Time = r.Now()
	}
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		return
	}
	if len(r.buf) >= maxPending {
		r.dropped++
		r.mu.Unlock()
		return
	}
	r.buf = appendEvent(r.buf, e, r.prev, 0)
	r.prev = e.Time
	r.events++
	wake := len(r.buf) >= flushAt
	r.mu.Unlock()
	if wake {
		select {
		case r.kick <- struct{}{}:
		default:
		}
	}
}

// Counts returns the events recorded and dropped so far.
func (r *Recorder) Counts() (events, dropped uint64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.events, r.dropped
}

// Written is the bytes written to the file so far.
func (r *Recorder) Written() int64 {
	r.errMu.Lock()
	defer r.errMu.Unlock()
	return r.written
}

// writer writes what Emit gathered: when woken, and every 100 ms so that
// a trace being recorded can be read while it grows.
func (r *Recorder) writer() {
	defer close(r.done)
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	var spare []byte
	for {
		select {
		case <-r.kick:
		case <-tick.C:
		}
		r.mu.Lock()
		batch := r.buf
		r.buf = spare[:0]
		closed := r.closed
		if closed {
			batch = appendEvent(batch, &Event{Kind: kindEnd, Time: r.prev}, r.prev, r.dropped)
		}
		r.mu.Unlock()
		r.write(batch)
		if !closed {
			r.write(nil) // flush the bufio layer too
		}
		spare = batch
		if closed {
			return
		}
	}
}

// write writes batch and flushes; the first error sticks.
func (r *Recorder) write(batch []byte) {
	r.errMu.Lock()
	defer r.errMu.Unlock()
	if r.writeErr != nil {
		return
	}
	if _, err := r.out.Write(batch); err != nil {
		r.writeErr = err
		return
	}
	if err := r.out.Flush(); err != nil {
		r.writeErr = err
		return
	}
	r.written += int64(len(batch))
}

// Close writes what is left and the end record, and closes the file
// Create made. Events emitted after Close are ignored.
func (r *Recorder) Close() error {
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		return nil
	}
	r.closed = true
	r.mu.Unlock()
	select {
	case r.kick <- struct{}{}:
	default:
	}
	<-r.done
	r.errMu.Lock()
	err := r.writeErr
	r.errMu.Unlock()
	if r.file != nil {
		if cerr := r.file.Close(); err == nil {
			err = cerr
		}
	}
	if err != nil {
		return fmt.Errorf("trace: %w", err)
	}
	return nil
}
